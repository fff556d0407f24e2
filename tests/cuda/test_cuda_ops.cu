// test_cuda_ops: every CUDA op of src/ops/cuda against its CPU twin, table-driven.
//
//   test_cuda_ops [--perf] [--filter SUBSTR] [--list]
//
// --filter: cases whose name contains SUBSTR; "a|b" any of several; a leading '!' all the others (so that
// a device run can split the cases among processes).
//
// Each case draws fresh random inputs (seeded from the clock unless DEEPINFER_SEED is set), rounds
// them through the device storage type (bf16, e4m3, e2m1) before computing the reference on the CPU
// (CpuBackend, or a local reference for ops the model does inline), poisons every output with NaN
// bytes, surrounds every device buffer with guard bytes that must come back untouched, and compares
// with a per-op NMSE tolerance (or exactly, for integer outputs). --perf also times each case with CUDA
// events (warm-up, median of repeated batches) and prints GB/s and TFLOP/s against the H200 ceilings.
// The last line is "N passed, N failed"; the exit status is non-zero on any failure.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cpu/cpu_backend.h"
#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/graph_edges.h"
#include "ops/cuda/moe_grouped.h"
#include "ops/sample_math.h"

using namespace deepinfer;
namespace dc = deepinfer::cuda;
using bf16 = __nv_bfloat16;

namespace {

// ---- ceilings (measured on this H200; --perf re-measures copy and GEMM and prints both) ----
double g_hbm_gbs = 4270.0, g_bf16_tflops = 806.0, g_fp8_tflops = 1474.0;
bool g_perf = false;
std::string g_filter;
uint64_t g_seed = 0;

#define CK(x)                                                                                          \
  do {                                                                                                 \
    cudaError_t e_ = (x);                                                                              \
    if (e_ != cudaSuccess)                                                                             \
      throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_) + " @" + std::to_string(__LINE__)); \
  } while (0)

// ---- random numbers ----
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  float uni() { return (float)((next() >> 40) * (1.0 / 16777216.0)); }  // [0,1)
  float normal() {
    float u1 = std::max(uni(), 1e-7f), u2 = uni();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
  int range(int lo, int hi) { return lo + (int)(next() % (uint64_t)(hi - lo)); }  // [lo, hi)
};

std::vector<float> randn(Rng& r, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}
float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = __float2bfloat16_rn(v[i]);
  return o;
}
std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16r(x);
  return v;
}
float e4m3_val(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return (float)v;
}
uint8_t rand_e4m3(Rng& r) {
  for (;;) {
    uint8_t b = (uint8_t)r.next();
    if ((b & 0x7f) != 0x7f) return b;  // no NaN
  }
}
const float kE2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
float e8m0_val(uint8_t b) { return std::ldexp(1.0f, (int)b - 127); }

// Host copy of the activation quantization (reference for quant_act_fp8 and moe_quant_fp8): one 128-value block
// x → e4m3 bytes q (natural order), returns its scale sc = 2^ceil(log2(max(amax, 1e-4) / 448)).
float host_quant_block(const float* x, uint8_t* q) {
  float amax = 0;
  for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float r = std::max(amax, 1e-4f) / 448.0f;
  int e;
  const float mant = std::frexp(r, &e);  // r = mant · 2^e, mant ∈ [0.5, 1)
  const int ce = (mant == 0.5f) ? e - 1 : e;  // ceil(log2 r)
  const float inv = std::ldexp(1.0f, -ce);
  for (int i = 0; i < 128; ++i) q[i] = __nv_fp8_e4m3(std::min(std::max(x[i] * inv, -448.0f), 448.0f)).__x;
  return std::ldexp(1.0f, ce);
}
// x[M, K] → q[M, K], sc_t[K/128, M] (quant_act_fp8's layout)
void host_quant_act(const std::vector<float>& x, int64_t M, int64_t K, std::vector<uint8_t>& q, std::vector<float>& sc_t) {
  q.assign(M * K, 0);
  sc_t.assign((K / 128) * M, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kb = 0; kb < K / 128; ++kb) sc_t[kb * M + m] = host_quant_block(&x[m * K + kb * 128], &q[m * K + kb * 128]);
}

// ---- device buffers with guard regions ----
constexpr size_t kGuard = 4096;
constexpr uint8_t kGuardByte = 0xA5;
struct DBuf {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  std::string name;
  void* p() const { return base + kGuard; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(base + kGuard); }
};
struct Case;
thread_local std::vector<DBuf>* g_bufs = nullptr;

DBuf dalloc(size_t bytes, const char* name) {
  DBuf b;
  b.bytes = bytes;
  b.name = name;
  CK(cudaMalloc(&b.base, bytes + 2 * kGuard));
  CK(cudaMemset(b.base, kGuardByte, bytes + 2 * kGuard));
  g_bufs->push_back(b);
  return b;
}
template <class T>
DBuf dup(const std::vector<T>& v, const char* name) {
  DBuf b = dalloc(v.size() * sizeof(T), name);
  CK(cudaMemcpy(b.p(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
void poison(const DBuf& b) { CK(cudaMemset(b.p(), 0xFF, b.bytes)); }  // NaN for f32/bf16, −1 for ints
template <class T>
std::vector<T> down(const DBuf& b, size_t n) {
  std::vector<T> v(n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(v.data(), b.p(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
std::string check_guards() {
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> g(kGuard);
  for (auto& b : *g_bufs) {
    for (int side = 0; side < 2; ++side) {
      CK(cudaMemcpy(g.data(), side ? b.base + kGuard + b.bytes : b.base, kGuard, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kGuard; ++i)
        if (g[i] != kGuardByte) return "guard overwritten " + std::string(side ? "after " : "before ") + b.name;
    }
  }
  return "";
}

// ---- metrics ----
double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) return INFINITY;
      continue;
    }
    const double d = (double)got[i] - ref[i];
    if (std::isnan(d)) return NAN;
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

bool rows_bitwise_equal(const float* a, const float* b, int64_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

struct Result {
  bool pass = true;
  std::string detail;
  double us = 0, bytes = 0, flops = 0;
  double graph_us = 0, host_us = 0;  // where measured: per launch from a CUDA graph; host time of one call
  bool fp8 = false;
};
void expect_nmse(Result& r, const char* what, const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  const double e = nmse(got, ref);
  char buf[160];
  snprintf(buf, sizeof buf, "%s nmse=%.2e(tol %.0e) ", what, e, tol);
  r.detail += buf;
  if (!(e <= tol)) r.pass = false;
}
void expect_true(Result& r, bool ok, const std::string& what) {
  if (!ok) {
    r.pass = false;
    r.detail += "FAIL:" + what + " ";
  }
}

// ---- timing ----
double time_us(const std::function<void()>& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(a));
  f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms1 = 0;
  CK(cudaEventElapsedTime(&ms1, a, b));
  const int reps = std::max(1, std::min(50, (int)(0.5 / std::max(ms1, 1e-4f))));
  std::vector<float> t;
  for (int s = 0; s < 11; ++s) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f / reps);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Every default kernel→kernel edge of g made programmatic, as in the backend's step graphs (there only for
// edges into the project's kernels; here every kernel is one).
cudaError_t make_edges_programmatic(cudaGraph_t g) { return dc::graph_programmatic_edges(g, dc::graph_kernel_node); }

// n calls of f(st) captured into one graph (global mode: a call that may synchronize fails the capture).
// Null, with err set, when they cannot be captured. programmatic: kernel→kernel edges made programmatic.
cudaGraphExec_t capture_graph(const std::function<void(cudaStream_t)>& f, int n, cudaStream_t st, std::string& err,
                              bool programmatic = false) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  try {
    for (int i = 0; i < n; ++i) f(st);
  } catch (const std::exception& e) {
    err = std::string("capture: ") + e.what();
  }
  cudaError_t e = cudaStreamEndCapture(st, &g);
  if (err.empty() && e != cudaSuccess) err = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
  if (err.empty() && programmatic && (e = make_edges_programmatic(g)) != cudaSuccess)
    err = std::string("programmatic edges: ") + cudaGetErrorString(e);
  if (err.empty() && (e = cudaGraphInstantiate(&ge, g, 0)) != cudaSuccess)
    err = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
  if (g) cudaGraphDestroy(g);
  if (!err.empty() && ge) cudaGraphExecDestroy(ge), ge = nullptr;
  cudaGetLastError();
  return ge;
}

// f once from a graph, on a fresh non-blocking stream, after everything queued before it (the legacy
// stream's uploads and output poisoning would otherwise race the graph). False, with err, when f cannot
// be captured.
bool run_in_graph(const std::function<void(cudaStream_t)>& f, std::string& err, int n = 1, bool programmatic = false) {
  CK(cudaDeviceSynchronize());
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraphExec_t ge = capture_graph(f, n, st, err, programmatic);
  if (ge) {
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(ge);
  }
  cudaStreamDestroy(st);
  return ge != nullptr;
}

// Device time of a launch when it runs from a CUDA graph (as the model's decode steps will): n calls of
// f(stream) (the caller's rotation of inputs goes on across calls) captured once on a fresh stream, so
// the launchers' host work happens at capture only; the graph is replayed 11 times (after 2 warm-up
// replays), median replay / n. Throws when a launcher cannot be captured (synchronizes, allocates, …).
// programmatic: kernel→kernel edges made programmatic (the model's setting).
double time_graph_us(const std::function<void(cudaStream_t)>& f, int n, bool programmatic = false) {
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a = nullptr, b = nullptr;
  std::vector<float> t;
  std::string err;
  cudaGraphExec_t ge = capture_graph(f, n, st, err, programmatic);
  if (ge) {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    for (int s = 0; s < 11; ++s) {
      CK(cudaEventRecord(a, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms * 1000.0f / n);
    }
  }
  cudaGetLastError();
  if (a) cudaEventDestroy(a);
  if (b) cudaEventDestroy(b);
  if (ge) cudaGraphExecDestroy(ge);
  cudaStreamDestroy(st);
  if (!err.empty()) throw std::runtime_error(err);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Host time of one call of f (argument checks, planning, queries, the launch itself): 20 calls after a
// drained device, so the launch queue does not push back.
double host_us(const std::function<void()>& f) {
  CK(cudaDeviceSynchronize());
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) f();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / 20;
  CK(cudaDeviceSynchronize());
  return us;
}

CpuBackend& cpu() {
  static CpuBackend be(0);
  return be;
}
// y[M, N] = x[M, K] · w[N, K]ᵀ through the CPU twin's linear (its weight layout is the backend's own).
void cpu_linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  WeightPtr W = cpu().make_weight(w, N, K);
  cpu().linear(x, M, K, *W, y, N);
}
dc::GemmContext* lt() {
  static dc::GemmContext* c = dc::gemm_context_create();
  if (!c) throw std::runtime_error("cublasLt context");
  return c;
}

struct Case {
  std::string name;
  std::function<Result()> fn;
};
std::vector<Case>& cases() {
  static std::vector<Case> c;
  return c;
}
void add(const std::string& name, std::function<Result()> fn) { cases().push_back({name, std::move(fn)}); }

Rng rng_for(const std::string& name) {
  uint64_t h = g_seed;
  for (char c : name) h = h * 131 + (uint8_t)c;
  return Rng(h);
}

// =================================================================================================
// GEMMs
// =================================================================================================
enum class GemmKind { Bf16Lt, Bf16Own, Fp8Lt, Fp8Own, Fp4Bf16A, Fp4Fp8A };
const char* kind_name(GemmKind k) {
  switch (k) {
    case GemmKind::Bf16Lt: return "gemm_bf16_lt";
    case GemmKind::Bf16Own: return "gemm_dq_bf16";
    case GemmKind::Fp8Lt: return "gemm_fp8_block_lt";
    case GemmKind::Fp8Own: return "gemm_dq_fp8";
    case GemmKind::Fp4Bf16A: return "gemm_dq_fp4w_bf16a";
    case GemmKind::Fp4Fp8A: return "gemm_dq_fp4w_fp8a";
  }
  return "?";
}

Result gemm_case(GemmKind kind, int64_t M, int64_t N, int64_t K, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * K);
  std::vector<float> xref, wref(N * K);
  DBuf dx, dxs, dw, dws;
  int64_t ldws = 0;
  const bool fp8a = kind == GemmKind::Fp8Lt || kind == GemmKind::Fp8Own || kind == GemmKind::Fp4Fp8A;
  if (fp8a) {
    DBuf dxf = dup(x, "x_f32");
    dx = dalloc(M * K, "xq");
    dxs = dalloc((K / 128) * M * 4, "xs");
    CK(dc::quant_act_fp8(dxf.as<float>(), M, K, K, dx.as<uint8_t>(), dxs.as<float>(), 0));
    auto q = down<uint8_t>(dx, M * K);
    auto s = down<float>(dxs, (K / 128) * M);
    xref.resize(M * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xref[m * K + k] = e4m3_val(q[m * K + k]) * s[(k / 128) * M + m];
  } else {
    xref = round_bf16(x);
    dx = dup(to_bf16(x), "x_bf16");
  }
  if (kind == GemmKind::Bf16Lt || kind == GemmKind::Bf16Own) {
    std::vector<float> w = randn(r, N * K, 0.05f);
    wref = round_bf16(w);
    dw = dup(to_bf16(w), "w_bf16");
  } else if (kind == GemmKind::Fp8Lt || kind == GemmKind::Fp8Own) {
    ldws = ((K / 128 + 3) / 4) * 4;
    std::vector<uint8_t> wq(N * K);
    for (auto& b : wq) b = rand_e4m3(r);
    std::vector<float> ws(((N + 127) / 128) * ldws, 0.0f);
    for (int64_t nb = 0; nb < (N + 127) / 128; ++nb)
      for (int64_t kb = 0; kb < K / 128; ++kb) ws[nb * ldws + kb] = std::ldexp(1.0f, r.range(-12, -6));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) wref[n * K + k] = e4m3_val(wq[n * K + k]) * ws[(n / 128) * ldws + k / 128];
    dw = dup(wq, "w_e4m3");
    dws = dup(ws, "w_scale");
  } else {
    std::vector<uint8_t> wq(N * K / 2), ws(N * K / 32);
    for (auto& b : wq) b = (uint8_t)r.next();
    for (auto& b : ws) b = (uint8_t)r.range(118, 124);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = wq[n * (K / 2) + k / 2];
        wref[n * K + k] = kE2M1[(k & 1) ? byte >> 4 : byte & 0xF] * e8m0_val(ws[n * (K / 32) + k / 32]);
      }
    dw = dup(wq, "w_e2m1");
    dws = dup(ws, "w_e8m0");
  }
  const int64_t ldy = N + 8;  // a padded output row: the pad must stay untouched
  DBuf dy = dalloc(M * ldy * 4, "y");
  poison(dy);
  dc::WeightRef W{};
  if (kind == GemmKind::Bf16Own) W = {dc::WFmt::BF16, dw.p(), nullptr, 0};
  if (kind == GemmKind::Fp8Own) W = {dc::WFmt::FP8_B128, dw.p(), dws.p(), ldws};
  if (kind == GemmKind::Fp4Bf16A || kind == GemmKind::Fp4Fp8A) W = {dc::WFmt::FP4_B32, dw.p(), dws.p(), 0};
  auto launch = [&]() -> cudaError_t {
    switch (kind) {
      case GemmKind::Bf16Lt: return dc::gemm_bf16_lt(lt(), dx.as<bf16>(), M, K, K, dw.as<bf16>(), N, dy.as<float>(), ldy, 0);
      case GemmKind::Fp8Lt:
        return dc::gemm_fp8_block_lt(lt(), dx.as<uint8_t>(), dxs.as<float>(), M, K, dw.as<uint8_t>(), dws.as<float>(),
                                     ldws, N, dy.as<float>(), ldy, 0);
      case GemmKind::Bf16Own:
      case GemmKind::Fp4Bf16A: return dc::gemm_dq(dc::AFmt::BF16, dx.p(), nullptr, M, K, K, W, N, dy.as<float>(), ldy, 0);
      default: return dc::gemm_dq(dc::AFmt::FP8_V128, dx.p(), dxs.as<float>(), M, K, K, W, N, dy.as<float>(), ldy, 0);
    }
  };
  cudaError_t e = launch();
  if (e != cudaSuccess) {
    res.pass = false;
    res.detail = std::string("launch: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return res;
  }
  auto yg = down<float>(dy, M * ldy);
  std::vector<float> yref(M * N), yc(M * N);
  cpu_linear(xref.data(), M, K, wref.data(), N, yref.data());
  bool pad_ok = true;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) yc[m * N + n] = yg[m * ldy + n];
    for (int64_t n = N; n < ldy; ++n) {
      uint32_t u;
      memcpy(&u, &yg[m * ldy + n], 4);
      pad_ok &= (u == 0xFFFFFFFFu);
    }
  }
  expect_true(res, pad_ok, "row padding written");
  // bf16 output fallback of cuBLASLt FP8 loses 8 mantissa bits: looser bound then
  const double tol = (kind == GemmKind::Fp8Lt && dc::gemm_fp8_lt_used_bf16_out(lt())) ? 3e-5 : 1e-6;
  expect_nmse(res, "y", yc, yref, tol);
  if (kind == GemmKind::Fp8Lt && dc::gemm_fp8_lt_used_bf16_out(lt())) res.detail += "(lt bf16-out) ";
  if (kind == GemmKind::Fp8Lt && dc::gemm_fp8_lt_used_own_fallback(lt())) res.detail += "(own fallback used on this context) ";
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    const bool fp4w = kind == GemmKind::Fp4Bf16A || kind == GemmKind::Fp4Fp8A;
    const double wb = (kind == GemmKind::Bf16Lt || kind == GemmKind::Bf16Own) ? 2.0 : fp4w ? 0.5 + 1.0 / 32 : 1.0;
    res.bytes = N * K * wb + M * K * (fp8a ? 1.0 : 2.0) + M * N * 4.0;
    res.flops = 2.0 * M * N * K;
    res.fp8 = kind == GemmKind::Fp8Lt || kind == GemmKind::Fp8Own;
  }
  return res;
}

// Which scale layouts does cuBLASLt's block-scaled FP8 expect? Runs M = N = K = 512 (4 × 4 scale
// blocks, so no padding question) with the four combinations of {weight grid [nb][kb] | [kb][nb]} ×
// {activation scales [kb][m] | [m][kb]} and reports which reproduces the reference. The launcher's
// documented layout is the first; the case fails unless that one matches.
Result lt_fp8_layout_probe(const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t M = 512, N = 512, K = 512, nb = N / 128, kbn = K / 128;
  std::vector<uint8_t> xq(M * K), wq(N * K);
  for (auto& b : xq) b = rand_e4m3(r);
  for (auto& b : wq) b = rand_e4m3(r);
  std::vector<float> xs(M * kbn), ws(nb * kbn);  // logical xs[m][kb], ws[nb][kb]
  for (auto& v : xs) v = std::ldexp(1.0f, r.range(-6, 0));
  for (auto& v : ws) v = std::ldexp(1.0f, r.range(-6, 0));
  std::vector<float> xr(M * K), wr(N * K), yref(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xr[m * K + k] = e4m3_val(xq[m * K + k]) * xs[m * kbn + k / 128];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wr[n * K + k] = e4m3_val(wq[n * K + k]) * ws[(n / 128) * kbn + k / 128];
  cpu_linear(xr.data(), M, K, wr.data(), N, yref.data());
  DBuf dx = dup(xq, "xq"), dw = dup(wq, "wq"), dy = dalloc(M * N * 4, "y");
  std::string found;
  bool first_ok = false;
  for (int wl = 0; wl < 2; ++wl)
    for (int xl = 0; xl < 2; ++xl) {
      std::vector<float> wsl(nb * kbn), xsl(M * kbn);
      for (int64_t a = 0; a < nb; ++a)
        for (int64_t b = 0; b < kbn; ++b) wsl[wl ? b * nb + a : a * kbn + b] = ws[a * kbn + b];
      for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < kbn; ++b) xsl[xl ? m * kbn + b : b * M + m] = xs[m * kbn + b];
      DBuf dws = dup(wsl, "ws"), dxs = dup(xsl, "xs");
      poison(dy);
      cudaError_t e = dc::gemm_fp8_block_lt(lt(), dx.as<uint8_t>(), dxs.as<float>(), M, K, dw.as<uint8_t>(),
                                            dws.as<float>(), kbn, N, dy.as<float>(), N, 0);
      if (e != cudaSuccess) {
        found += std::string("[") + (wl ? "w:kb-major" : "w:nb-major") + "," + (xl ? "x:m-major" : "x:kb-major") +
                 " launch " + cudaGetErrorString(e) + "] ";
        cudaGetLastError();
        continue;
      }
      auto y = down<float>(dy, M * N);
      const double err = nmse(y, yref);
      char buf[120];
      snprintf(buf, sizeof buf, "[%s,%s nmse=%.1e] ", wl ? "w:kb-major" : "w:nb-major", xl ? "x:m-major" : "x:kb-major", err);
      found += buf;
      if (wl == 0 && xl == 0 && err < 3e-5) first_ok = true;
    }
  res.detail = found;
  expect_true(res, first_ok, "documented layout does not match");
  return res;
}

Result quant_case(int64_t M, int64_t K, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * K);
  for (int64_t i = 0; i < M * K; i += 977) x[i] *= 300.0f;  // a few large values: clamp and scale range
  for (int64_t i = 0; i < 128; ++i) x[i] = 0.0f;            // one all-zero group: the 1e-4 floor
  DBuf dx = dup(x, "x"), dq = dalloc(M * K, "q"), ds = dalloc((K / 128) * M * 4, "sc");
  poison(dq), poison(ds);
  CK(dc::quant_act_fp8(dx.as<float>(), M, K, K, dq.as<uint8_t>(), ds.as<float>(), 0));
  auto q = down<uint8_t>(dq, M * K);
  auto s = down<float>(ds, (K / 128) * M);
  std::vector<uint8_t> qr;
  std::vector<float> sr;
  host_quant_act(x, M, K, qr, sr);
  int64_t bad = 0;
  for (int64_t i = 0; i < M * K; ++i) bad += q[i] != qr[i];
  int64_t bads = 0;
  for (size_t i = 0; i < s.size(); ++i) bads += s[i] != sr[i];
  expect_true(res, bad == 0, std::to_string(bad) + " e4m3 bytes differ");
  expect_true(res, bads == 0, std::to_string(bads) + " scales differ");
  res.detail += "exact ";
  if (g_perf) {
    res.us = time_us([&] { dc::quant_act_fp8(dx.as<float>(), M, K, K, dq.as<uint8_t>(), ds.as<float>(), 0); });
    res.bytes = M * K * 5.0 + M * K / 128 * 4.0;
  }
  return res;
}

Result cvt_case(int64_t n, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, n);
  DBuf dx = dup(x, "x"), dy = dalloc(n * 2, "y");
  poison(dy);
  CK(dc::f32_to_bf16(dx.as<float>(), n, dy.as<bf16>(), 0));
  auto y = down<bf16>(dy, n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bf16 ref = __float2bfloat16_rn(x[i]);
    bad += memcmp(&ref, &y[i], 2) != 0;
  }
  expect_true(res, bad == 0, std::to_string(bad) + " differ");
  res.detail += "exact ";
  if (g_perf) {
    res.us = time_us([&] { dc::f32_to_bf16(dx.as<float>(), n, dy.as<bf16>(), 0); });
    res.bytes = n * 6.0;
  }
  return res;
}

// =================================================================================================
// Norm / RoPE / SwiGLU / pooling
// =================================================================================================
Result rms_case(int64_t M, int64_t D, int64_t ld, bool weight, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * ld, 3.0f), w = randn(r, D);
  DBuf dx = dup(x, "x"), dw = dup(w, "w"), dy = dalloc(M * ld * 4, "y"), dyb = dalloc(M * D * 2, "y_bf16");
  CK(cudaMemcpy(dy.p(), dx.p(), M * ld * 4, cudaMemcpyDeviceToDevice));  // pad columns keep x
  poison(dyb);
  // poison the written columns only
  for (int64_t m = 0; m < M; ++m) CK(cudaMemset(dy.as<float>() + m * ld, 0xFF, D * 4));
  CK(dc::rms_norm(dx.as<float>(), M, D, ld, weight ? dw.as<float>() : nullptr, 1e-6f, dy.as<float>(), dyb.as<bf16>(), 0));
  auto yg = down<float>(dy, M * ld);
  auto ybg = down<bf16>(dyb, M * D);
  std::vector<float> yr(x);
  cpu().rms_norm(x.data(), M, D, ld, weight ? w.data() : nullptr, 1e-6f, yr.data());
  expect_nmse(res, "y", yg, yr, 1e-11);
  std::vector<float> yb(M * D), ybr(M * D);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < D; ++i) yb[m * D + i] = __bfloat162float(ybg[m * D + i]), ybr[m * D + i] = yr[m * ld + i];
  expect_nmse(res, "y_bf16", yb, ybr, 2e-5);
  if (g_perf) {
    res.us = time_us([&] {
      dc::rms_norm(dx.as<float>(), M, D, ld, weight ? dw.as<float>() : nullptr, 1e-6f, dy.as<float>(), nullptr, 0);
    });
    res.bytes = M * D * 8.0;
  }
  return res;
}

Result rope_case(int64_t M, int heads, int hd, int rd, bool inverse, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t ld = (int64_t)heads * hd;
  std::vector<float> x = randn(r, M * ld);
  std::vector<int32_t> pos(M);
  for (auto& p : pos) p = r.range(0, 1 << 20);
  std::vector<float> inv(rd / 2);
  for (int i = 0; i < rd / 2; ++i) inv[i] = std::pow(160000.0f, -2.0f * i / rd);
  DBuf dx = dup(x, "x"), dp = dup(pos, "pos"), di = dup(inv, "inv_freq");
  CK(dc::rope(dx.as<float>(), M, ld, heads, hd, rd, dp.as<int32_t>(), di.as<float>(), inverse, 0));
  auto yg = down<float>(dx, M * ld);
  std::vector<float> yr(x);
  cpu().rope(yr.data(), M, ld, heads, hd, rd, pos.data(), inv.data(), inverse);
  expect_nmse(res, "x", yg, yr, 1e-11);
  if (g_perf) {
    res.us = time_us([&] { dc::rope(dx.as<float>(), M, ld, heads, hd, rd, dp.as<int32_t>(), di.as<float>(), inverse, 0); });
    res.bytes = M * heads * rd * 8.0;
  }
  return res;
}

// norm_rope (fuseattn): the attention block's q (per-head unweighted norm + rope), kv (weighted norm +
// rope, read at a column offset of the wider qkv rows, then scattered into a window buffer and a ring
// with −1 rows skipped) and, when hI > 0, the indexer's q (rope only) in one launch. Checked against the
// CPU twin (Backend::norm_rope's default: rms_norm, rope, copy_rows), bitwise against the unfused CUDA
// kernels it replaces (DEEPINFER_CUDA_OFF=fuseattn) and bitwise from a CUDA graph. Rows of the window and
// ring that no kv row targets must keep their bytes. --perf: graph time per call, fused vs the unfused
// launches (the launch chain a decode step saves).
Result norm_rope_case(int64_t M, int H, int d, int rd, int64_t ql, int hI, int dI, bool inverse, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t nqk = ql + d, Rw = 2 * M + 3, Rr = M + 5;  // window rows, ring rows (more than targeted)
  std::vector<float> q = randn(r, M * H * d, 3.0f), qkv = randn(r, M * nqk, 3.0f), w = randn(r, d);
  std::vector<float> iq = randn(r, std::max<int64_t>(1, M * hI * dI), 2.0f);
  std::vector<float> win = randn(r, Rw * d), ring = randn(r, Rr * d);
  std::vector<int32_t> pos(M), to_win(M), push(M);
  for (auto& p : pos) p = r.range(0, 1 << 20);
  // distinct destination rows, about one in five skipped (−1, a padded stand-in / a row not pushed)
  std::vector<int32_t> wr(Rw), rr(Rr);
  std::iota(wr.begin(), wr.end(), 0), std::iota(rr.begin(), rr.end(), 0);
  for (int64_t i = Rw - 1; i > 0; --i) std::swap(wr[i], wr[r.range(0, (int)i + 1)]);
  for (int64_t i = Rr - 1; i > 0; --i) std::swap(rr[i], rr[r.range(0, (int)i + 1)]);
  for (int64_t m = 0; m < M; ++m) {
    to_win[m] = r.range(0, 5) == 0 ? -1 : wr[m];
    push[m] = r.range(0, 5) == 0 ? -1 : rr[m];
  }
  std::vector<float> inv(rd / 2), inv2(rd / 2);
  for (int i = 0; i < rd / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rd), inv2[i] = std::pow(160000.0f, -2.0f * i / rd);
  DBuf dq = dup(q, "q"), dqkv = dup(qkv, "qkv"), dw = dup(w, "kv_norm"), diq = dup(iq, "iq"), dwin = dup(win, "win");
  DBuf dring = dup(ring, "ring"), dpos = dup(pos, "pos"), dtw = dup(to_win, "to_win"), dpu = dup(push, "push");
  DBuf dinv = dup(inv, "inv_freq"), dinv2 = dup(inv2, "inv_freq_idx");
  // the tensors, on given buffers (device or host)
  auto tensors = [&](float* pq, float* pqkv, const float* pw, float* piq, float* pwin, float* pring, const int32_t* ptw,
                     const int32_t* ppu, const float* pinv, const float* pinv2, Backend::NormRope* t) {
    t[0] = {}, t[1] = {}, t[2] = {};
    t[0].x = pq, t[0].ld = (int64_t)H * d, t[0].heads = H, t[0].head_dim = d, t[0].norm = true;
    t[0].rope_dim = rd, t[0].inv_freq = pinv;
    t[1].x = pqkv + ql, t[1].ld = nqk, t[1].head_dim = d, t[1].norm = true, t[1].w = pw, t[1].rope_dim = rd;
    t[1].inv_freq = pinv;
    t[1].out[0] = pwin, t[1].out_ld[0] = d, t[1].out_rows[0] = ptw;
    t[1].out[1] = pring, t[1].out_ld[1] = d, t[1].out_rows[1] = ppu;
    t[2].x = piq, t[2].ld = (int64_t)hI * dI, t[2].heads = hI, t[2].head_dim = dI, t[2].rope_dim = rd;
    t[2].inv_freq = pinv2;
    return hI > 0 ? 3 : 2;
  };
  Backend::NormRope bt[3];
  const int n = tensors(dq.as<float>(), dqkv.as<float>(), dw.as<float>(), diq.as<float>(), dwin.as<float>(),
                        dring.as<float>(), dtw.as<int32_t>(), dpu.as<int32_t>(), dinv.as<float>(), dinv2.as<float>(), bt);
  dc::NormRopeTensor ct[3];
  for (int i = 0; i < n; ++i) {
    const auto& a = bt[i];
    ct[i] = {a.x, a.ld, a.heads, a.head_dim, a.x_rows, a.rows, a.norm, a.w, a.rope_dim, a.inv_freq, {a.out[0], a.out[1]},
             {a.out_ld[0], a.out_ld[1]}, {a.out_rows[0], a.out_rows[1]}};
  }
  // the unfused launches (what CudaBackend runs with fuseattn off): rms_norm, rope, copy_rows per tensor
  auto unfused = [&](cudaStream_t st) {
    for (int i = 0; i < n; ++i) {
      const auto& a = bt[i];
      const int64_t width = (int64_t)a.heads * a.head_dim;
      if (a.norm) {
        if (a.ld == width) CK(dc::rms_norm(a.x, M * a.heads, a.head_dim, a.head_dim, a.w, 1e-6f, a.x, nullptr, st));
        else
          for (int h = 0; h < a.heads; ++h)
            CK(dc::rms_norm(a.x + (int64_t)h * a.head_dim, M, a.head_dim, a.ld, a.w, 1e-6f, a.x + (int64_t)h * a.head_dim,
                            nullptr, st));
      }
      if (a.rope_dim) CK(dc::rope(a.x, M, a.ld, a.heads, a.head_dim, a.rope_dim, dpos.as<int32_t>(), a.inv_freq, inverse, st));
      for (int k = 0; k < 2; ++k)
        if (a.out[k]) CK(dc::copy_rows(a.x, a.ld, nullptr, 0, 0, a.out[k], a.out_ld[k], a.out_rows[k], 0, 0, M, width, st));
    }
  };
  auto fused = [&](cudaStream_t st) { CK(dc::norm_rope(ct, n, M, dpos.as<int32_t>(), 1e-6f, inverse, st)); };
  auto reset = [&] {
    CK(cudaMemcpy(dq.p(), q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dqkv.p(), qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(diq.p(), iq.data(), iq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwin.p(), win.data(), win.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dring.p(), ring.data(), ring.size() * 4, cudaMemcpyHostToDevice));
  };
  auto grab = [&] {
    return std::vector<std::vector<float>>{down<float>(dq, q.size()), down<float>(dqkv, qkv.size()),
                                           down<float>(diq, iq.size()), down<float>(dwin, win.size()),
                                           down<float>(dring, ring.size())};
  };
  auto same_bits = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].size() != b[i].size() || !rows_bitwise_equal(a[i].data(), b[i].data(), (int64_t)a[i].size())) return false;
    return true;
  };
  fused(0);
  CK(cudaGetLastError());
  const auto got = grab();
  // CPU twin
  std::vector<float> rq(q), rqkv(qkv), riq(iq), rwin(win), rring(ring);
  Backend::NormRope ht[3];
  tensors(rq.data(), rqkv.data(), w.data(), riq.data(), rwin.data(), rring.data(), to_win.data(), push.data(),
          inv.data(), inv2.data(), ht);
  cpu().norm_rope(ht, n, M, pos.data(), 1e-6f, inverse);
  expect_nmse(res, "q", got[0], rq, 1e-11);
  expect_nmse(res, "qkv", got[1], rqkv, 1e-11);
  if (hI > 0) expect_nmse(res, "iq", got[2], riq, 1e-11);
  expect_nmse(res, "win", got[3], rwin, 1e-11);
  expect_nmse(res, "ring", got[4], rring, 1e-11);
  // bytes that nothing may write: q_lora columns of qkv, untargeted window / ring rows
  bool kept = true;
  for (int64_t m = 0; m < M; ++m) kept &= rows_bitwise_equal(got[1].data() + m * nqk, qkv.data() + m * nqk, ql);
  std::vector<char> hit_w(Rw, 0), hit_r(Rr, 0);
  for (int64_t m = 0; m < M; ++m) {
    if (to_win[m] >= 0) hit_w[to_win[m]] = 1;
    if (push[m] >= 0) hit_r[push[m]] = 1;
  }
  for (int64_t i = 0; i < Rw; ++i)
    if (!hit_w[i]) kept &= rows_bitwise_equal(got[3].data() + i * d, win.data() + i * d, d);
  for (int64_t i = 0; i < Rr; ++i)
    if (!hit_r[i]) kept &= rows_bitwise_equal(got[4].data() + i * d, ring.data() + i * d, d);
  expect_true(res, kept, "bytes outside the outputs changed");
  // bitwise: unfused kernels, and the fused one from a graph
  reset();
  unfused(0);
  CK(cudaGetLastError());
  expect_true(res, same_bits(grab(), got), "fused != unfused CUDA kernels (bitwise)");
  reset();
  std::string err;
  const bool captured = run_in_graph(fused, err);
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, same_bits(grab(), got), "graph != eager (bitwise)");
  if (res.pass) res.detail += "fused == unfused == graph (bitwise) ";
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us(fused, reps);
    const double un = time_graph_us(unfused, reps);
    res.us = time_us([&] { fused(0); });
    res.bytes = M * (H * d * 8.0 + d * 8.0 + d * 8.0 + hI * (double)dI * 8.0) + d * 4.0;
    char buf[120];
    snprintf(buf, sizeof buf, "graph/call: fused %.2f us, unfused %.2f us (%.2fx) ", res.graph_us, un, un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

// The attention block's first norm_rope call: q's low-rank rows normed in place (weighted, D = ql at row
// stride ql + d: a warp a row, NC = 8 at ql = 1024) and the sliding ring's rows gathered into the window
// buffer (x_rows → out rows, −1 skipped). CPU twin, bitwise the unfused rms_norm + copy_rows, graph.
Result norm_gather_case(int64_t M, int64_t ql, int d, int64_t n_ring, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t nqk = ql + d, Rr = n_ring + 9, Rw = n_ring + M + 3;
  std::vector<float> qkv = randn(r, M * nqk, 3.0f), w = randn(r, ql), ring = randn(r, Rr * d), win = randn(r, Rw * d);
  // (at least one entry each: with n_ring = 0 the host's pointers must still say "a gather of 0 rows", not
  // null, which would make the CPU twin treat the tensor as M plain rows)
  std::vector<int32_t> rr(Rr), wr(Rw), from(std::max<int64_t>(n_ring, 1), 0), to(std::max<int64_t>(n_ring, 1), 0);
  std::iota(rr.begin(), rr.end(), 0), std::iota(wr.begin(), wr.end(), 0);
  for (int64_t i = Rw - 1; i > 0; --i) std::swap(wr[i], wr[r.range(0, (int)i + 1)]);
  for (int64_t i = 0; i < n_ring; ++i) from[i] = rr[r.range(0, (int)Rr)], to[i] = r.range(0, 6) == 0 ? -1 : wr[i];
  DBuf dqkv = dup(qkv, "qkv"), dw = dup(w, "q_norm"), dring = dup(ring, "ring"), dwin = dup(win, "win");
  DBuf dfrom = dup(from, "from_ring"), dto = dup(to, "to_win_r");
  auto tensors = [&](float* pqkv, const float* pw, float* pring, float* pwin, const int32_t* pf, const int32_t* pt,
                     Backend::NormRope* t) {
    t[0] = {}, t[1] = {};
    t[0].x = pqkv, t[0].ld = nqk, t[0].head_dim = (int)ql, t[0].norm = true, t[0].w = pw;
    t[1].x = pring, t[1].ld = d, t[1].head_dim = d, t[1].x_rows = pf, t[1].rows = n_ring;
    t[1].out[0] = pwin, t[1].out_ld[0] = d, t[1].out_rows[0] = pt;
  };
  Backend::NormRope bt[2];
  tensors(dqkv.as<float>(), dw.as<float>(), dring.as<float>(), dwin.as<float>(), dfrom.as<int32_t>(), dto.as<int32_t>(), bt);
  dc::NormRopeTensor ct[2];
  for (int i = 0; i < 2; ++i) {
    const auto& a = bt[i];
    ct[i] = {a.x, a.ld, a.heads, a.head_dim, a.x_rows, a.rows, a.norm, a.w, a.rope_dim, a.inv_freq,
             {a.out[0], a.out[1]}, {a.out_ld[0], a.out_ld[1]}, {a.out_rows[0], a.out_rows[1]}};
  }
  expect_true(res, dc::norm_rope_supported(ct[0]) && dc::norm_rope_supported(ct[1]), "shape not taken by the kernel");
  auto fused = [&](cudaStream_t st) { CK(dc::norm_rope(ct, 2, M, nullptr, 1e-6f, false, st)); };
  auto unfused = [&](cudaStream_t st) {
    CK(dc::rms_norm(dqkv.as<float>(), M, ql, nqk, dw.as<float>(), 1e-6f, dqkv.as<float>(), nullptr, st));
    CK(dc::copy_rows(dring.as<float>(), d, dfrom.as<int32_t>(), 0, 0, dwin.as<float>(), d, dto.as<int32_t>(), 0, 0,
                     n_ring, d, st));
  };
  auto reset = [&] {
    CK(cudaMemcpy(dqkv.p(), qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwin.p(), win.data(), win.size() * 4, cudaMemcpyHostToDevice));
  };
  auto grab = [&] { return std::vector<std::vector<float>>{down<float>(dqkv, qkv.size()), down<float>(dwin, win.size()),
                                                           down<float>(dring, ring.size())}; };
  auto same_bits = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].size() != b[i].size() || !rows_bitwise_equal(a[i].data(), b[i].data(), (int64_t)a[i].size())) return false;
    return true;
  };
  fused(0);
  CK(cudaGetLastError());
  const auto got = grab();
  std::vector<float> rqkv(qkv), rring(ring), rwin(win);
  Backend::NormRope ht[2];
  tensors(rqkv.data(), w.data(), rring.data(), rwin.data(), from.data(), to.data(), ht);
  cpu().norm_rope(ht, 2, M, nullptr, 1e-6f, false);
  expect_nmse(res, "qkv", got[0], rqkv, 1e-11);
  expect_true(res, rows_bitwise_equal(got[1].data(), rwin.data(), (int64_t)win.size()), "win != the CPU's gather");
  expect_true(res, rows_bitwise_equal(got[2].data(), ring.data(), (int64_t)ring.size()), "the gather wrote its source");
  bool kept = true;  // kv columns of qkv untouched
  for (int64_t m = 0; m < M; ++m) kept &= rows_bitwise_equal(got[0].data() + m * nqk + ql, qkv.data() + m * nqk + ql, d);
  expect_true(res, kept, "kv columns changed");
  reset();
  unfused(0);
  CK(cudaGetLastError());
  expect_true(res, same_bits(grab(), got), "fused != unfused CUDA kernels (bitwise)");
  reset();
  std::string err;
  const bool captured = run_in_graph(fused, err);
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, same_bits(grab(), got), "graph != eager (bitwise)");
  if (res.pass) res.detail += "fused == unfused == graph (bitwise) ";
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us(fused, reps);
    const double un = time_graph_us(unfused, reps);
    res.us = time_us([&] { fused(0); });
    res.bytes = M * ql * 8.0 + ql * 4.0 + n_ring * d * 8.0;
    char buf[120];
    snprintf(buf, sizeof buf, "graph/call: fused %.2f us, unfused %.2f us (%.2fx) ", res.graph_us, un, un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

// The launcher refuses what the kernel does not take (the backend then runs the unfused ops) and
// writes nothing.
Result norm_rope_reject_case() {
  Result res;
  std::vector<float> x(8 * 260, 1.0f);
  DBuf dx = dup(x, "x"), dinv = dup(std::vector<float>(32, 1.0f), "inv");
  std::vector<int32_t> pos(8, 1);
  DBuf dpos = dup(pos, "pos");
  auto t = [&] {
    dc::NormRopeTensor z{};
    z.x = dx.as<float>(), z.ld = 260, z.heads = 1, z.head_dim = 256, z.norm = true, z.rope_dim = 64;
    z.inv_freq = dinv.as<float>();
    return z;
  };
  dc::NormRopeTensor ok = t(), off = t(), odd = t(), big = t(), ldo = t(), rot = t(), gat = t(), many[5];
  off.x += 2;           // 8-byte aligned only
  odd.head_dim = 254;   // not a multiple of 4
  big.head_dim = 1028, big.ld = 1028;  // past the warp's registers (buffer big enough: 8·260 ≥ 2·1028)
  ldo.ld = 258;         // row stride not a multiple of 4
  rot.rope_dim = 63;    // odd rope width
  gat.x_rows = dpos.as<int32_t>(), gat.rows = 2;  // a gather that would norm and rope
  for (auto& z : many) z = t();
  expect_true(res, dc::norm_rope_supported(ok), "supported shape refused");
  for (auto* z : {&off, &odd, &big, &ldo, &rot, &gat}) {
    expect_true(res, !dc::norm_rope_supported(*z), "bad shape accepted");
    expect_true(res, dc::norm_rope(z, 1, 2, dpos.as<int32_t>(), 1e-6f, false, 0) == cudaErrorInvalidValue,
                "launcher took a bad shape");
  }
  expect_true(res, dc::norm_rope(many, 5, 8, dpos.as<int32_t>(), 1e-6f, false, 0) == cudaErrorInvalidValue,
              "launcher took more than kNormRopeMax tensors");
  const auto after = down<float>(dx, x.size());
  expect_true(res, rows_bitwise_equal(after.data(), x.data(), (int64_t)x.size()), "a refused launch wrote");
  return res;
}

Result swiglu_case(int64_t M, int64_t I, bool rs, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> gu = randn(r, M * 2 * I, 6.0f), sc(M);
  for (auto& v : sc) v = r.uni() + 0.5f;
  DBuf dg = dup(gu, "gu"), ds = dup(sc, "scale"), da = dalloc(M * I * 4, "act"), db = dalloc(M * I * 2, "act_bf16");
  poison(da), poison(db);
  CK(dc::swiglu_clamp(dg.as<float>(), M, I, 10.0f, rs ? ds.as<float>() : nullptr, da.as<float>(), db.as<bf16>(), 0));
  auto a = down<float>(da, M * I);
  auto ab = down<bf16>(db, M * I);
  std::vector<float> ar(M * I);
  cpu().swiglu_clamp(gu.data(), M, I, 10.0f, rs ? sc.data() : nullptr, ar.data());
  expect_nmse(res, "act", a, ar, 1e-11);
  std::vector<float> abf(M * I);
  for (int64_t i = 0; i < M * I; ++i) abf[i] = __bfloat162float(ab[i]);
  expect_nmse(res, "act_bf16", abf, ar, 2e-5);
  if (g_perf) {
    res.us = time_us([&] {
      dc::swiglu_clamp(dg.as<float>(), M, I, 10.0f, rs ? ds.as<float>() : nullptr, nullptr, db.as<bf16>(), 0);
    });
    res.bytes = M * I * (8.0 + 2.0);
  }
  return res;
}

Result pool_case(int64_t W, int S, int d, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> kv = randn(r, W * S * d), g = randn(r, W * S * d, 2.0f);
  for (int64_t w = 0; w < W; ++w)  // absent slots: the second half of every other window
    if (w % 2)
      for (int s = S / 2; s < S; ++s)
        for (int c = 0; c < d; ++c) g[(w * S + s) * d + c] = -INFINITY;
  DBuf dk = dup(kv, "kv"), dg = dup(g, "gate"), dout = dalloc(W * d * 4, "out");
  poison(dout);
  CK(dc::compress_pool(dk.as<float>(), dg.as<float>(), W, S, d, dout.as<float>(), 0));
  auto o = down<float>(dout, W * d);
  std::vector<float> orf(W * d);
  cpu().compress_pool(kv.data(), g.data(), W, S, d, orf.data());
  expect_nmse(res, "out", o, orf, 1e-11);
  if (g_perf) {
    res.us = time_us([&] { dc::compress_pool(dk.as<float>(), dg.as<float>(), W, S, d, dout.as<float>(), 0); });
    res.bytes = W * S * d * 8.0 + W * d * 4.0;
  }
  return res;
}

// =================================================================================================
// mHC
// =================================================================================================
// hc_pre / hc_head inputs of a case (fn and base sized for the op: pre = (2+hc)·hc mixes, head = hc).
struct HcIn {
  std::vector<float> X, fn, base, scale;
  DBuf dX, df, db, ds;
};
HcIn hc_inputs(Rng& r, int64_t M, int hc, int64_t D, bool head) {
  HcIn in;
  const int mix = head ? hc : (2 + hc) * hc;
  in.X = randn(r, M * hc * D), in.fn = randn(r, mix * hc * D, 0.02f), in.base = randn(r, mix, 0.5f);
  in.scale = {0.8f + r.uni(), 0.8f + r.uni(), 0.8f + r.uni()};
  if (head) in.scale.resize(1);
  in.dX = dup(in.X, "X"), in.df = dup(in.fn, "fn"), in.db = dup(in.base, "base"), in.ds = dup(in.scale, "scale");
  return in;
}

// Batch invariance of hc_pre / hc_head: rows of the M-row launch against the same rows launched alone
// (M = 1: the decode kernel mapping) and inside an 8-row launch; bitwise on u, post and comb.
void hc_invariance(Result& res, const HcIn& in, int64_t M, int hc, int64_t D, int iters, bool head,
                   const std::vector<float>& u, const std::vector<float>& p, const std::vector<float>& cm) {
  const int64_t W = hc * D;
  std::vector<int64_t> rows = {0, M / 2, M - 1};
  DBuf du = dalloc(8 * D * 4, "u_alone"), dp = dalloc(8 * hc * 4, "post_alone"), dcm = dalloc(8 * hc * hc * 4, "comb_alone");
  bool ok = true;
  for (int64_t sub : {(int64_t)1, (int64_t)8}) {
    for (int64_t m : rows) {
      const int64_t m0 = std::min(m, M - std::min(M, sub)), n = std::min(M, sub);
      poison(du), poison(dp), poison(dcm);
      if (head)
        CK(dc::hc_head(in.dX.as<float>() + m0 * W, n, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                       1e-6f, 1e-6f, du.as<float>(), 0));
      else
        CK(dc::hc_pre(in.dX.as<float>() + m0 * W, n, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                      iters, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), 0));
      const int64_t r = m - m0;
      auto u1 = down<float>(du, n * D);
      ok &= rows_bitwise_equal(u1.data() + r * D, u.data() + m * D, D);
      if (!head) {
        auto p1 = down<float>(dp, n * hc), c1 = down<float>(dcm, n * hc * hc);
        ok &= rows_bitwise_equal(p1.data() + r * hc, p.data() + m * hc, hc);
        ok &= rows_bitwise_equal(c1.data() + r * hc * hc, cm.data() + m * hc * hc, hc * hc);
      }
    }
  }
  expect_true(res, ok, "batch invariance: a row alone / in 8 rows differs from the same row in the batch");
  if (ok) res.detail += "rows alone/in 8 == in batch (bitwise) ";
}

// path: what hc_pre runs by default (prefill "hc_gemm" path from M ≥ 1024), or the prefill path forced
// for any M (dc::hc_pre_gemm; its invariance check compares against the v3 kernels at 1 and 8 rows).
enum class HcPath { Default, Gemm, Fast };
Result hc_pre_case(int64_t M, int hc, int64_t D, int iters, const std::string& name, bool invariance = false,
                   HcPath path = HcPath::Default) {
  Rng r = rng_for(name);
  Result res;
  const int mix = (2 + hc) * hc;
  HcIn in = hc_inputs(r, M, hc, D, false);
  DBuf du = dalloc(M * D * 4, "u"), dp = dalloc(M * hc * 4, "post"), dcm = dalloc(M * hc * hc * 4, "comb");
  DBuf dsync = dalloc(dc::hc_pre_fast_sync_ints(M) * 4, "hcfast_sync");
  poison(du), poison(dp), poison(dcm), poison(dsync);
  auto launch_fast = [&] {  // hcfast (the backend's prefill path; the launcher zeroes sync)
    return dc::hc_pre_fast(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), iters,
                           1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), dsync.as<int32_t>(), 0);
  };
  auto launch_with = [&](bool gemm, bool force) {  // force: the prefill path whatever M
    if (path == HcPath::Fast) return launch_fast();
    if (force)
      return dc::hc_pre_gemm(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                             iters, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), 0);
    return dc::hc_pre(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), iters,
                      1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), 0, gemm);
  };
  auto launch = [&] { return launch_with(true, path == HcPath::Gemm); };
  CK(launch());
  auto u = down<float>(du, M * D), p = down<float>(dp, M * hc), cm = down<float>(dcm, M * hc * hc);
  std::vector<float> ur(M * D), pr(M * hc), cr(M * hc * hc);
  cpu().hc_pre(in.X.data(), M, hc, D, in.fn.data(), in.base.data(), in.scale.data(), iters, 1e-6f, 1e-6f, ur.data(),
               pr.data(), cr.data());
  expect_nmse(res, "u", u, ur, 1e-9);
  expect_nmse(res, "post", p, pr, 1e-9);
  expect_nmse(res, "comb", cm, cr, 1e-8);
  if (invariance) hc_invariance(res, in, M, hc, D, iters, false, u, p, cm);
  if (path == HcPath::Fast) {  // the 128-thread form (DEEPINFER_CUDA_OFF=hcfast_wide): bitwise the 256-thread default
    DBuf du2 = dalloc(M * D * 4, "u_128"), dp2 = dalloc(M * hc * 4, "post_128"), dcm2 = dalloc(M * hc * hc * 4, "comb_128");
    poison(du2), poison(dp2), poison(dcm2);
    CK(dc::hc_pre_fast(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), iters,
                       1e-6f, 1e-6f, du2.as<float>(), dp2.as<float>(), dcm2.as<float>(), dsync.as<int32_t>(), 0, 128));
    const auto u2 = down<float>(du2, M * D), p2 = down<float>(dp2, M * hc), cm2 = down<float>(dcm2, M * hc * hc);
    const bool same = memcmp(u2.data(), u.data(), M * D * 4) == 0 && memcmp(p2.data(), p.data(), M * hc * 4) == 0 &&
                      memcmp(cm2.data(), cm.data(), M * hc * hc * 4) == 0;
    expect_true(res, same, "hcfast 128 threads != 256 threads");
    if (same) res.detail += "128 threads == 256 threads (bitwise) ";
  }
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = M * hc * D * 4.0 + mix * hc * D * 4.0 + M * D * 4.0;
    res.flops = 2.0 * M * hc * D * (mix + 1) + 2.0 * M * hc * D;
    if (M >= 256 && path != HcPath::Fast) {  // both paths on the same inputs: v3 (DEEPINFER_CUDA_OFF=hc_gemm) and the prefill path
      char buf[96];
      snprintf(buf, sizeof buf, "v3(hc_gemm off) %.1f us, hc_gemm(forced) %.1f us ",
               time_us([&] { launch_with(false, false); }), time_us([&] { launch_with(true, true); }));
      res.detail += buf;
    }
    if (path == HcPath::Fast) {  // the previous paths on the same inputs (DEEPINFER_CUDA_OFF=hcfast: v3)
      char buf[160];
      auto fast_nt = [&](int nt) {
        return dc::hc_pre_fast(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                               iters, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(),
                               dsync.as<int32_t>(), 0, nt);
      };
      double f128 = 0, f256 = 0;
      for (int rep = 0; rep < 2; ++rep)  // alternating
        f128 += time_us([&] { fast_nt(128); }) / 2, f256 += time_us([&] { fast_nt(256); }) / 2;
      snprintf(buf, sizeof buf, "hcfast 256 threads %.1f us, 128 threads %.1f us (alternating) | ", f256, f128);
      res.detail += buf;
      snprintf(buf, sizeof buf, "v3 %.1f us, hc_gemm(forced) %.1f us ",
               time_us([&] {
                 dc::hc_pre(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                            iters, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), 0, false);
               }),
               time_us([&] {
                 dc::hc_pre_gemm(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(),
                                 iters, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), 0);
               }));
      res.detail += buf;
    }
  }
  return res;
}

Result hc_post_case(int64_t M, int hc, int64_t D, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> X = randn(r, M * hc * D), y = randn(r, M * D), post = randn(r, M * hc), comb = randn(r, M * hc * hc, 0.3f);
  DBuf dX = dup(X, "X"), dy = dup(y, "y"), dp = dup(post, "post"), dcm = dup(comb, "comb"), dout = dalloc(M * hc * D * 4, "out");
  poison(dout);
  CK(dc::hc_post(dX.as<float>(), dy.as<float>(), dp.as<float>(), dcm.as<float>(), M, hc, D, dout.as<float>(), 0));
  auto o = down<float>(dout, M * hc * D);
  std::vector<float> orf(M * hc * D);
  cpu().hc_post(X.data(), y.data(), post.data(), comb.data(), M, hc, D, orf.data());
  expect_nmse(res, "out", o, orf, 1e-12);
  if (g_perf) {
    res.us = time_us([&] {
      dc::hc_post(dX.as<float>(), dy.as<float>(), dp.as<float>(), dcm.as<float>(), M, hc, D, dout.as<float>(), 0);
    });
    res.bytes = M * hc * D * 8.0 + M * D * 4.0;
  }
  return res;
}

Result hc_head_case(int64_t M, int hc, int64_t D, const std::string& name, bool invariance = false) {
  Rng r = rng_for(name);
  Result res;
  HcIn in = hc_inputs(r, M, hc, D, true);
  DBuf du = dalloc(M * D * 4, "u");
  poison(du);
  auto launch = [&] {
    return dc::hc_head(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), 1e-6f,
                       1e-6f, du.as<float>(), 0);
  };
  CK(launch());
  auto u = down<float>(du, M * D);
  std::vector<float> ur(M * D);
  cpu().hc_head(in.X.data(), M, hc, D, in.fn.data(), in.base.data(), in.scale.data(), 1e-6f, 1e-6f, ur.data());
  expect_nmse(res, "u", u, ur, 1e-9);
  if (invariance) hc_invariance(res, in, M, hc, D, 0, true, u, {}, {});
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = M * hc * D * 4.0 + hc * hc * D * 4.0 + M * D * 4.0;
    res.flops = 2.0 * M * hc * D * (hc + 1) + 2.0 * M * hc * D;
  }
  return res;
}

// =================================================================================================
// Attention, indexer, top-k
// =================================================================================================
// prefill: queries are consecutive positions sharing one window pool; decode: independent queries.
Result attn_case(int64_t M, int H, int d, int W, int topk, bool prefill, const std::string& name, bool tc = false) {
  Rng r = rng_for(name);
  Result res;
  const int64_t n_win = prefill ? M + W : 4096, n_ent = 8192;
  std::vector<float> q = round_bf16(randn(r, M * H * d)), win = round_bf16(randn(r, n_win * d)),
                     ent = round_bf16(randn(r, n_ent * d)), sinks = randn(r, H);
  std::vector<int32_t> lo(M), hi(M), idx;
  std::vector<int64_t> off(M + 1, 0);
  for (int64_t m = 0; m < M; ++m) {
    if (prefill) {
      hi[m] = (int32_t)(W + m + 1 - W / 2);  // the query's own row is inside, some rows before it
      lo[m] = std::max(0, hi[m] - W);
    } else {
      hi[m] = r.range(W, (int)n_win);
      lo[m] = hi[m] - r.range(1, W + 1);
    }
    const int ne = prefill ? std::min<int>(topk, (int)(m * topk / std::max<int64_t>(M - 1, 1))) : topk;
    // distinct entries, ascending (as the top-k gives them)
    std::vector<int32_t> pick;
    for (int i = 0; i < ne; ++i) pick.push_back(r.range(0, (int)n_ent));
    std::sort(pick.begin(), pick.end());
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    idx.insert(idx.end(), pick.begin(), pick.end());
    off[m + 1] = (int64_t)idx.size();
  }
  if (idx.empty()) idx.push_back(0);
  const float scale = 1.0f / std::sqrt((float)d);
  DBuf dq = dup(to_bf16(q), "q"), dw = dup(to_bf16(win), "win"), de = dup(to_bf16(ent), "ent"), ds = dup(sinks, "sinks");
  DBuf dlo = dup(lo, "lo"), dhi = dup(hi, "hi"), di = dup(idx, "idx"), doff = dup(off, "off");
  DBuf dout = dalloc(M * H * d * 4, "out");
  poison(dout);
  auto launch = [&] {
    auto fn = tc ? dc::sink_attention_tc : dc::sink_attention;
    return fn(dq.as<bf16>(), M, (int64_t)H * d, H, d, dw.as<bf16>(), dlo.as<int32_t>(), dhi.as<int32_t>(), de.as<bf16>(),
              di.as<int32_t>(), doff.as<int64_t>(), ds.as<float>(), scale, dout.as<float>(), (int64_t)H * d, 0);
  };
  CK(launch());
  auto o = down<float>(dout, M * H * d);
  std::vector<float> orf(M * H * d);
  cpu().sink_attention(q.data(), M, (int64_t)H * d, H, d, win.data(), lo.data(), hi.data(), ent.data(), idx.data(),
                       off.data(), sinks.data(), scale, orf.data(), (int64_t)H * d);
  expect_nmse(res, "out", o, orf, tc ? 2e-5 : 1e-9);  // tc: P rounded to bf16 before P·V
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    double keys = 0;
    for (int64_t m = 0; m < M; ++m) keys += (hi[m] - lo[m]) + (off[m + 1] - off[m]);
    // bytes: q + out + each query's keys once (decode: keys are not shared between queries)
    const double kv_bytes = prefill ? (double)(n_win * d * 2) + (double)idx.size() * d * 2 : keys * d * 2;
    res.bytes = M * H * d * (2.0 + 4.0) + kv_bytes;
    res.flops = keys * H * d * 4.0;
  }
  return res;
}

// sink_attention_mma (the tensor-core path of the stored-weight mode). Inputs are f32 rounded to bf16
// (the kernel rounds keys and q to bf16 on the way in, so the CPU reference sees the same values); the
// remaining difference is P rounded to bf16 for P·V (relative 2^-9 a term: NMSE ~1e-6; one missing key
// of 640 gives ~1e-3). kind: 0 = window and entries, 1 = window only, 2 = entries only. nk ≥ 0: every
// query has nk keys (kind 0: min(nk, 128) window rows, the rest entries); nk < 0: random counts (window
// 0..128, entries 0..512; uneven across queries). prefill: queries share one window pool (row m .. m+127)
// and draw entries from one pool of 1024 rows (what a 4k prefill reads; L2-resident); otherwise each query
// owns its rows. ldq / ldo are padded (the padding must stay poisoned). check: 0 = every row against
// CpuBackend, k > 0 = k sampled rows. Bitwise: queries 0 and M/2 alone equal their rows of the batch,
// and a second run equals the first. Perf mode also times sink_attention_f32 on the same inputs.
// One case body for both sink-attention kernels (AttnKernel: the f32 one of the float32 mode, exact up to
// f32 rounding, or the tensor-core one): same draws for the same name, same checks, the kernel's own
// input rounding and tolerance.
struct AttnKernel {
  decltype(dc::sink_attention_f32)* fn;
  bool bf16_inputs;  // round q and keys to bf16 before the reference (the kernel does on the way in)
  double tol;        // NMSE against CpuBackend
  bool mma;          // perf: compare with sink_attention_f32 (else with v1)
  bool dec = false;  // attdec: bitwise equal to sink_attention_mma (v2); every query of M ≤ 8 alone; graph perf
  bool v3 = false;   // prefill v3: bitwise equal to sink_attention_mma (v2); perf against v2
};
const AttnKernel kAttnF32{dc::sink_attention_f32, false, 1e-9, false};
const AttnKernel kAttnMma{dc::sink_attention_mma, true, 2e-5, true};  // P rounded to bf16 before P·V
const AttnKernel kAttnDec{dc::sink_attention_dec, true, 2e-5, false, true};  // v2's bits on more CTAs
const AttnKernel kAttnV3{dc::sink_attention_mma_v3, true, 2e-5, false, false, true};  // v2's bits on wgmma

Result sink_attn_case(const AttnKernel& K, int64_t M, int H, int d, int nk, int kind, const std::string& name,
                      int check, bool prefill) {
  Rng r = rng_for(name);
  Result res;
  const int Wn = 128, En = 512;
  // padded strides (the padding must stay poisoned); prefill-pool cases keep rows 16-byte aligned, as the
  // model's q and out are (an odd stride takes the kernels' scalar paths)
  const int64_t ldq = (int64_t)H * d + (prefill ? 4 : 3), ldo = (int64_t)H * d + (prefill ? 4 : 5);
  std::vector<int32_t> lo(M), hi(M), idx;
  std::vector<int64_t> off(M + 1, 0);
  const int64_t ereg = 2 * (int64_t)std::max(En, nk);
  const int64_t n_win = prefill ? M + Wn : M * Wn + 1, n_ent = prefill ? 1024 : M * ereg + 1;
  for (int64_t m = 0; m < M; ++m) {
    int nwin, nent;
    if (nk >= 0) {
      nwin = kind == 2 ? 0 : kind == 1 ? std::min(nk, Wn) : std::min(nk, Wn);
      nent = kind == 1 ? 0 : nk - nwin;
    } else {
      nwin = kind == 2 ? 0 : r.range(0, Wn + 1);
      nent = kind == 1 ? 0 : r.range(0, En + 1);
    }
    if (prefill) {
      lo[m] = (int32_t)(m + Wn - nwin);
    } else {
      lo[m] = (int32_t)(m * Wn + r.range(0, Wn - nwin + 1));
    }
    hi[m] = lo[m] + nwin;
    std::vector<int32_t> pick(nent);
    for (auto& v : pick) v = prefill ? (int32_t)r.range(0, (int)n_ent) : (int32_t)(m * ereg + r.range(0, (int)ereg));
    std::sort(pick.begin(), pick.end());
    idx.insert(idx.end(), pick.begin(), pick.end());
    off[m + 1] = (int64_t)idx.size();
  }
  if (idx.empty()) idx.push_back(0);
  auto fast = [&](size_t n, float a) {  // uniform in (−a, a) (large pools: normal() is too slow here)
    std::vector<float> v(n);
    for (auto& x : v) x = K.bf16_inputs ? bf16r((r.uni() * 2.0f - 1.0f) * a) : (r.uni() * 2.0f - 1.0f) * a;
    return v;
  };
  std::vector<float> q = fast(M * ldq, 1.7f), win = fast(n_win * d, 1.7f), ent = fast(n_ent * d, 1.7f),
                     sinks = randn(r, H, 2.0f);
  const float scale = 1.0f / std::sqrt((float)d);
  DBuf dq = dup(q, "q"), dw = dup(win, "win"), de = dup(ent, "ent"), ds = dup(sinks, "sinks");
  DBuf dlo = dup(lo, "lo"), dhi = dup(hi, "hi"), di = dup(idx, "idx"), doff = dup(off, "off");
  DBuf dout = dalloc(M * ldo * 4, "out"), dout1 = dalloc(ldo * 4, "out_alone");
  poison(dout);
  auto run = [&](decltype(dc::sink_attention_f32)* fn, int64_t m0, int64_t Mx, float* o) {
    return fn(dq.as<float>() + m0 * ldq, Mx, ldq, H, d, dw.as<float>(), dlo.as<int32_t>() + m0, dhi.as<int32_t>() + m0,
              de.as<float>(), di.as<int32_t>(), doff.as<int64_t>() + m0, ds.as<float>(), scale, o, ldo, 0);
  };
  CK(run(K.fn, 0, M, dout.as<float>()));
  auto o = down<float>(dout, M * ldo);
  bool pad_ok = true;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = (int64_t)H * d; c < ldo; ++c) {
      uint32_t b;
      memcpy(&b, &o[m * ldo + c], 4);
      pad_ok &= b == 0xFFFFFFFFu;
    }
  expect_true(res, pad_ok, "output padding written");
  std::vector<int64_t> rows;
  if (check == 0)
    for (int64_t m = 0; m < M; ++m) rows.push_back(m);
  else
    for (int k = 0; k < check; ++k) rows.push_back(k == 0 ? 0 : k == 1 ? M - 1 : r.range(0, (int)M));
  std::vector<float> got, ref, one((size_t)H * d);
  for (int64_t m : rows) {
    cpu().sink_attention(q.data() + m * ldq, 1, ldq, H, d, win.data(), lo.data() + m, hi.data() + m, ent.data(),
                         idx.data(), off.data() + m, sinks.data(), scale, one.data(), (int64_t)H * d);
    ref.insert(ref.end(), one.begin(), one.end());
    got.insert(got.end(), o.begin() + m * ldo, o.begin() + m * ldo + (int64_t)H * d);
  }
  expect_nmse(res, "out", got, ref, K.tol);
  if (nk == 0) {
    bool z = true;
    for (float v : got) z &= v == 0.0f;
    expect_true(res, z, "no keys must give exact zeros");
  }
  std::vector<int64_t> alone{0, M / 2};
  if (K.dec && M <= 8)  // attdec: every query of a small batch alone
    for (int64_t m = 1; m < M; ++m)
      if (m != M / 2) alone.push_back(m);
  for (int64_t m : alone) {
    poison(dout1);
    CK(run(K.fn, m, 1, dout1.as<float>()));
    auto a = down<float>(dout1, ldo);
    expect_true(res, memcmp(a.data(), o.data() + m * ldo, (size_t)H * d * 4) == 0,
                "query " + std::to_string(m) + " alone differs from its row in the batch");
  }
  CK(run(K.fn, 0, M, dout.as<float>()));
  auto o2 = down<float>(dout, M * ldo);
  expect_true(res, memcmp(o2.data(), o.data(), o.size() * 4) == 0, "second run differs");
  res.detail += "bitwise: alone==batch, run==run ";
  if (K.mma) {  // v2 keeps v1's arithmetic (same splits, k-order, softmax, merge): same bits, padding too
    poison(dout);
    CK(run(dc::sink_attention_mma_v1, 0, M, dout.as<float>()));
    auto o1 = down<float>(dout, M * ldo);
    expect_true(res, memcmp(o1.data(), o.data(), o.size() * 4) == 0, "v2 differs from v1");
    res.detail += "v2==v1 ";
  }
  if (K.v3) {  // v3 keeps v2's arithmetic: same bits, padding too (so the backend may choose by M)
    poison(dout);
    CK(run(dc::sink_attention_mma, 0, M, dout.as<float>()));
    auto o2v = down<float>(dout, M * ldo);
    expect_true(res, memcmp(o2v.data(), o.data(), o.size() * 4) == 0, "v3 differs from v2");
    poison(dout);  // q loaded once a cluster: the same Q tiles
    CK(run(dc::sink_attention_mma_v3q, 0, M, dout.as<float>()));
    auto oq = down<float>(dout, M * ldo);
    expect_true(res, memcmp(oq.data(), o.data(), o.size() * 4) == 0, "v3 (q once a cluster) differs from v3");
    res.detail += "v3==v2==v3q ";
  }
  if (K.dec) {  // attdec keeps v2's arithmetic: same bits, padding too (so the backend may choose by M)
    poison(dout);
    CK(run(dc::sink_attention_mma, 0, M, dout.as<float>()));
    auto o2v = down<float>(dout, M * ldo);
    expect_true(res, memcmp(o2v.data(), o.data(), o.size() * 4) == 0, "attdec differs from v2");
    poison(dout);
    CK(run(dc::sink_attention_dec_narrow, 0, M, dout.as<float>()));
    auto onv = down<float>(dout, M * ldo);
    expect_true(res, memcmp(onv.data(), o.data(), o.size() * 4) == 0, "attdec narrow (2 tiles a chunk) differs");
    res.detail += "attdec==v2==narrow ";
  }
  if (g_perf && K.dec) {
    // From a graph with programmatic edges (as the model's decode steps), max(24, copies) calls, call i on
    // copy i % copies of the key pools (≤ 64 copies, ≤ 256 MB in all): the rows the calls touch add up to
    // more than the L2 (M = 1: 64 × 1.3 MB), so each call reads its keys from HBM, as a layer's attention
    // does in a decode step. Same inputs and rotation for attdec, v2 and narrow.
    const int64_t pool = (n_win + n_ent) * d * 4;
    const int copies = (int)std::max<int64_t>(1, std::min<int64_t>(64, (256ll << 20) / pool));
    const int calls = std::max(24, copies);
    DBuf dpools = dalloc(copies * pool, "pools");
    for (int k = 0; k < copies; ++k) {
      CK(cudaMemcpy(dpools.as<uint8_t>() + k * pool, dw.as<float>(), n_win * d * 4, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(dpools.as<uint8_t>() + k * pool + n_win * d * 4, de.as<float>(), n_ent * d * 4,
                    cudaMemcpyDeviceToDevice));
    }
    auto graph = [&](decltype(dc::sink_attention_f32)* fn) {
      int it = 0;
      return time_graph_us(
          [&](cudaStream_t st) {
            const float* w = reinterpret_cast<const float*>(dpools.as<uint8_t>() + (it++ % copies) * pool);
            CK(fn(dq.as<float>(), M, ldq, H, d, w, dlo.as<int32_t>(), dhi.as<int32_t>(), w + n_win * d,
                  di.as<int32_t>(), doff.as<int64_t>(), ds.as<float>(), scale, dout.as<float>(), ldo, st));
          },
          calls, true);
    };
    res.graph_us = graph(K.fn);
    res.us = res.graph_us;
    const double v2 = graph(dc::sink_attention_mma);
    const double nar = graph(dc::sink_attention_dec_narrow);
    double keys = 0;
    for (int64_t m = 0; m < M; ++m) keys += (hi[m] - lo[m]) + (off[m + 1] - off[m]);
    res.bytes = M * (double)H * d * 8.0 + keys * d * 4.0;
    res.flops = keys * H * d * 4.0;
    char buf[320];
    snprintf(buf, sizeof buf,
             "graph+pdl, %d calls, %d pool copies: attdec %.2f us, v2 %.2f us (attdec %.2fx), attdec narrow (2 tiles a "
             "chunk) %.2f us; backend takes %s at this M; clusters resident attdec %d, narrow %d, v2 %d ",
             calls, copies, res.graph_us, v2, v2 / res.graph_us, nar, M <= dc::kAttDecMaxM ? "attdec" : "v2",
             dc::sink_attention_dec_max_clusters(d), dc::sink_attention_dec_max_clusters(d, true),
             dc::sink_attention_mma_max_clusters(d, 2));
    res.detail += buf;
  } else if (g_perf) {
    res.us = time_us([&] { run(K.fn, 0, M, dout.as<float>()); });
    double keys = 0;
    for (int64_t m = 0; m < M; ++m) keys += (hi[m] - lo[m]) + (off[m + 1] - off[m]);
    // q + out (f32) + key rows (f32): decode reads each query's rows; prefill the two shared pools once
    res.bytes = M * (double)H * d * 8.0 + (prefill ? (double)(n_win + n_ent) * d * 4.0 : keys * d * 4.0);
    res.flops = keys * H * d * 4.0;
    char buf[192];
    if (K.v3) {
      const double v2 = time_us([&] { run(dc::sink_attention_mma, 0, M, dout.as<float>()); });
      double a3 = 0, a3q = 0;  // alternating
      for (int rep = 0; rep < 2; ++rep) {
        a3 += time_us([&] { run(dc::sink_attention_mma_v3, 0, M, dout.as<float>()); }) / 2;
        a3q += time_us([&] { run(dc::sink_attention_mma_v3q, 0, M, dout.as<float>()); }) / 2;
      }
      snprintf(buf, sizeof buf,
               "%.1f GFLOP; v2 %.1f us (v3 %.2fx); alternating: v3 %.1f us, v3q (q once a cluster) %.1f us; "
               "clusters resident v3 %d, v2 %d ",
               res.flops / 1e9, v2, v2 / res.us, a3, a3q, dc::sink_attention_mma_max_clusters(d, 3),
               dc::sink_attention_mma_max_clusters(d, 2));
    } else if (K.mma) {
      const double f32 = time_us([&] { run(dc::sink_attention_f32, 0, M, dout.as<float>()); });
      const double v1 = time_us([&] { run(dc::sink_attention_mma_v1, 0, M, dout.as<float>()); });
      snprintf(buf, sizeof buf,
               "%.1f GFLOP; mma v1 %.1f us (v2 %.2fx); sink_attention_f32 %.1f us (%.1fx); clusters resident v2 %d, "
               "v1 %d ",
               res.flops / 1e9, v1, v1 / res.us, f32, f32 / res.us, dc::sink_attention_mma_max_clusters(d, 2),
               dc::sink_attention_mma_max_clusters(d, 1));
    } else {
      const double v1 = time_us([&] { run(dc::sink_attention_f32_v1, 0, M, dout.as<float>()); });
      snprintf(buf, sizeof buf, "v1 %.1f us (%.1fx) ", v1, v1 / res.us);
    }
    res.detail += buf;
  }
  return res;
}

// sink_attention_f32 (the float32 Backend::sink_attention contract the model uses). Inputs stay f32.
// nk ≥ 0: every query has exactly nk keys (min(nk, 128) window rows, the rest entries); nk < 0: random
// counts (window 0..128, entries 0..512). Each query owns its key rows (decode: nothing shared), so the
// bytes are q + out + every query's keys. ldq / ldo are padded; the output padding must stay poisoned.
// check: 0 = all rows against CpuBackend; k > 0 = k sampled rows (perf cases). invariance: query 0
// and query M/2 alone (M = 1 through offset pointers) must equal their rows of the batch bitwise, and a
// second batch run must equal the first bitwise. Perf mode also times v1 on the same inputs.
Result attn_f32_case(int64_t M, int H, int d, int nk, const std::string& name, int check = 0) {
  return sink_attn_case(kAttnF32, M, H, d, nk, 0, name, check, false);
}
Result attn_mma_case(int64_t M, int H, int d, int nk, int kind, const std::string& name, int check = 0,
                     bool prefill = false) {
  return sink_attn_case(kAttnMma, M, H, d, nk, kind, name, check, prefill);
}
// attdec (sink_attention_dec): the same case body; also bitwise equal to sink_attention_mma (v2).
Result attdec_case(int64_t M, int H, int d, int nk, int kind, const std::string& name, int check = 0) {
  return sink_attn_case(kAttnDec, M, H, d, nk, kind, name, check, false);
}

Result indexer_case(int64_t M, int hI, int dI, int64_t nk, bool paged, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t pool = paged ? 2 * nk + 7 : nk;  // paged: key rows scattered over a larger pool
  std::vector<float> q = round_bf16(randn(r, M * hI * dI)), K = round_bf16(randn(r, pool * dI)), g = randn(r, M * hI);
  std::vector<int32_t> nv(M), rows(nk);
  for (int64_t w = 0; w < nk; ++w) rows[w] = paged ? r.range(0, (int)pool) : (int32_t)w;
  for (int64_t m = 0; m < M; ++m) nv[m] = (m == 0) ? (int32_t)nk : r.range(0, (int)nk + 1);
  const float qs = 1.0f / std::sqrt((float)dI);
  DBuf dq = dup(to_bf16(q), "qI"), dk = dup(to_bf16(K), "K"), dg = dup(g, "gamma"), dn = dup(nv, "n_vis"),
       dr = dup(rows, "key_rows");
  DBuf ds = dalloc(M * nk * 4, "score");
  poison(ds);
  auto launch = [&] {
    return dc::indexer_scores(dq.as<bf16>(), dg.as<float>(), M, hI, dI, dk.as<bf16>(), paged ? dr.as<int32_t>() : nullptr,
                              nk, dn.as<int32_t>(), qs, ds.as<float>(), 0);
  };
  CK(launch());
  auto s = down<float>(ds, M * nk);
  std::vector<float> sr(M * nk);
  cpu().indexer_scores(q.data(), g.data(), M, hI, dI, K.data(), rows.data(), 0, nk, nv.data(), qs, sr.data());
  expect_nmse(res, "score", s, sr, 1e-9);
  if (g_perf) {
    for (auto& v : nv) v = (int32_t)nk;  // time the full key range
    CK(cudaMemcpy(dn.p(), nv.data(), M * 4, cudaMemcpyHostToDevice));
    res.us = time_us([&] { launch(); });
    res.bytes = M * hI * dI * 2.0 + nk * dI * 2.0 + M * nk * 4.0;
    res.flops = 2.0 * M * nk * hI * dI;
  }
  return res;
}

// indexer_scores_mma (the Backend::indexer_scores contract on tensor cores) against CpuBackend with q
// and K rounded to bf16 before the reference; the kernel gets the raw f32 and rounds them itself.
// vis: 0 = random n_vis per row (row 0 all keys, row 1 none, row 2 one key short), 1 = causal prefill
// (query m at position P0 + m, n_vis = (pos+1)/4, the last query sees every key), 2 = every key.
// paged: key_rows scattered over a pool of 2·nk+7 rows (else null: key w is row w). check: 0 = every
// row against the CPU, k > 0 = k sampled rows (perf sizes). Batch invariance (bitwise): rows 0, M/2
// and M−1 alone (M = 1: the in-kernel key conversion) and the batch without its first query (M−1
// queries, every query in another tile slot, another key split) must equal their rows of the batch,
// and a second run must equal the first. pq: per-query key lists (a decode step's layout: query m's list
// at key_rows + m·kld, kld = nk + 3, each list drawn alone), and query 0 must also equal a shared-list run
// of its own list, bitwise.
Result indexer_mma_case(int64_t M, int hI, int dI, int64_t nk, int vis, bool paged, const std::string& name,
                        int check = 0, bool pq = false) {
  Rng r = rng_for(name);
  Result res;
  if (pq) paged = true;
  const int64_t pool = paged ? 2 * nk + 7 : nk, kld = pq ? nk + 3 : 0;
  auto fast = [&](size_t n, float a) {
    std::vector<float> v(n);
    for (auto& x : v) x = (r.uni() * 2.0f - 1.0f) * a;
    return v;
  };
  std::vector<float> q = fast(M * hI * dI, 1.7f), K = fast(pool * dI, 1.7f), g = randn(r, M * hI);
  std::vector<int32_t> nv(M), rows(pq ? M * kld : nk, -7);  // (pq: the 3 padding entries a list are never read)
  for (int64_t l = 0; l < (pq ? M : 1); ++l)
    for (int64_t w = 0; w < nk; ++w) rows[l * kld + w] = paged ? r.range(0, (int)pool) : (int32_t)w;
  const int64_t P0 = 4 * nk - M;  // causal: the last query's position is 4·nk − 1
  for (int64_t m = 0; m < M; ++m) {
    if (vis == 2) nv[m] = (int32_t)nk;
    else if (vis == 1) nv[m] = (int32_t)std::min<int64_t>(nk, std::max<int64_t>(0, (P0 + m + 1) / 4));
    else nv[m] = m == 0 ? (int32_t)nk : m == 1 ? 0 : m == 2 ? (int32_t)(nk - 1) : r.range(0, (int)nk + 1);
  }
  const float qs = 1.0f / std::sqrt((float)dI);
  DBuf dq = dup(q, "qI"), dk = dup(K, "K"), dg = dup(g, "gamma"), dn = dup(nv, "n_vis"), dr = dup(rows, "key_rows");
  DBuf ds = dalloc(M * nk * 4, "score"), ds1 = dalloc(std::max<int64_t>(M - 1, 1) * nk * 4, "score_shifted");
  const size_t wsb = std::max(dc::indexer_mma_workspace(M, nk, dI, kld),
                              dc::indexer_mma_workspace(std::max<int64_t>(M - 1, 1), nk, dI, kld));
  DBuf dws = dalloc(std::max<size_t>(wsb, 16), "workspace");
  poison(ds);
  auto run = [&](int64_t m0, int64_t Mx, float* out) {
    return dc::indexer_scores_mma(dq.as<float>() + m0 * hI * dI, dg.as<float>() + m0 * hI, Mx, hI, dI, dk.as<float>(),
                                  paged ? dr.as<int32_t>() + m0 * kld : nullptr, kld, nk, dn.as<int32_t>() + m0, qs,
                                  out, wsb ? dws.p() : nullptr, 0);
  };
  CK(run(0, M, ds.as<float>()));
  auto s = down<float>(ds, M * nk);
  // reference rows
  std::vector<int64_t> chk;
  if (check == 0)
    for (int64_t m = 0; m < M; ++m) chk.push_back(m);
  else
    for (int k = 0; k < check; ++k) chk.push_back(k == 0 ? 0 : k == 1 ? M - 1 : r.range(0, (int)M));
  const std::vector<float> qr = round_bf16(q), Kr = round_bf16(K);
  std::vector<float> got, ref;
  if (check == 0) {
    ref.resize(M * nk);
    cpu().indexer_scores(qr.data(), g.data(), M, hI, dI, Kr.data(), rows.data(), kld, nk, nv.data(), qs, ref.data());
    got = s;
  } else {
    std::vector<float> one(nk);
    for (int64_t m : chk) {
      cpu().indexer_scores(qr.data() + m * hI * dI, g.data() + m * hI, 1, hI, dI, Kr.data(), rows.data() + m * kld, kld,
                           nk, nv.data() + m, qs, one.data());
      ref.insert(ref.end(), one.begin(), one.end());
      got.insert(got.end(), s.begin() + m * nk, s.begin() + (m + 1) * nk);
    }
  }
  int64_t inf_bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) inf_bad += std::isinf(ref[i]) != std::isinf(got[i]) || std::isnan(got[i]);
  expect_true(res, inf_bad == 0, std::to_string(inf_bad) + " entries with the wrong -inf pattern or NaN");
  expect_nmse(res, "score", got, ref, 1e-10);
  // batch invariance
  for (int64_t m : {(int64_t)0, M / 2, M - 1}) {
    poison(ds1);
    CK(run(m, 1, ds1.as<float>()));
    auto a = down<float>(ds1, nk);
    expect_true(res, memcmp(a.data(), s.data() + m * nk, nk * 4) == 0,
                "query " + std::to_string(m) + " alone differs from its row in the batch");
  }
  if (M > 1) {
    poison(ds1);
    CK(run(1, M - 1, ds1.as<float>()));
    auto a = down<float>(ds1, (M - 1) * nk);
    int64_t bad = 0;
    for (int64_t m = 1; m < M; ++m) bad += memcmp(a.data() + (m - 1) * nk, s.data() + m * nk, nk * 4) != 0;
    expect_true(res, bad == 0, std::to_string(bad) + " rows differ when the batch starts one query later");
  }
  CK(run(0, M, ds.as<float>()));
  auto s2 = down<float>(ds, M * nk);
  expect_true(res, memcmp(s2.data(), s.data(), s.size() * 4) == 0, "second run differs");
  res.detail += "bitwise: alone==batch, shifted==batch, run==run ";
  if (pq) {  // query 0 through the shared-list kernel (its list as the one list): the same bits
    poison(ds1);
    CK(dc::indexer_scores_mma(dq.as<float>(), dg.as<float>(), 1, hI, dI, dk.as<float>(), dr.as<int32_t>(), 0, nk,
                              dn.as<int32_t>(), qs, ds1.as<float>(), nullptr, 0));
    auto a = down<float>(ds1, nk);
    expect_true(res, memcmp(a.data(), s.data(), nk * 4) == 0, "query 0: per-query list differs from a shared list");
    res.detail += "pq==shared ";
  }
  if (g_perf) {
    res.us = time_us([&] { run(0, M, ds.as<float>()); });
    double vis_keys = 0;
    for (int64_t m = 0; m < M; ++m) vis_keys += nv[m];
    // bytes: q, γ (f32), the keys (f32, read once), the scores
    res.bytes = M * hI * dI * 4.0 + M * hI * 4.0 + (pq ? M : 1) * nk * dI * 4.0 + M * nk * 4.0;
    res.flops = 2.0 * hI * dI * vis_keys;
    char buf[128];
    const double kb = (pq ? M : 1) * nk * dI * 4.0;
    snprintf(buf, sizeof buf, "key bytes %.1f MB at %.0f GB/s (%.1f%% HBM) ", kb / 1e6, kb / res.us / 1e3,
             100.0 * kb / res.us / 1e3 / g_hbm_gbs);
    res.detail += buf;
  }
  return res;
}

// Shapes indexer_scores_mma does not take: cudaErrorNotSupported, nothing launched, the output untouched.
Result indexer_mma_unsupported_case() {
  Result res;
  const int64_t M = 3, nk = 40;
  for (auto [hI, dI] : {std::pair<int, int>{24, 32}, {16, 40}, {16, 8}}) {
    DBuf dq = dalloc(M * hI * dI * 4, "qI"), dk = dalloc(nk * dI * 4, "K"), dg = dalloc(M * hI * 4, "gamma"),
         dn = dalloc(M * 4, "n_vis"), ds = dalloc(M * nk * 4, "score");
    poison(ds);
    const cudaError_t e = dc::indexer_scores_mma(dq.as<float>(), dg.as<float>(), M, hI, dI, dk.as<float>(), nullptr, 0,
                                                 nk, dn.as<int32_t>(), 1.0f, ds.as<float>(), nullptr, 0);
    expect_true(res, e == cudaErrorNotSupported, "hI=" + std::to_string(hI) + " dI=" + std::to_string(dI) +
                                                     " returned " + cudaGetErrorString(e));
    auto s = down<float>(ds, M * nk);
    bool untouched = true;
    for (float v : s) {
      uint32_t b;
      memcpy(&b, &v, 4);
      untouched &= b == 0xFFFFFFFFu;
    }
    expect_true(res, untouched, "output written for an unsupported shape");
  }
  CK(cudaGetLastError());
  res.detail += "NotSupported, output untouched ";
  return res;
}

Result topk_case(int64_t M, int64_t n, int topk, bool ties, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> s(M * n);
  std::vector<int32_t> nv(M);
  for (int64_t m = 0; m < M; ++m) {
    nv[m] = (m % 4 == 0) ? (int32_t)n : r.range(1, (int)n + 1);
    if (m == 1) nv[m] = std::min<int32_t>(topk / 2, (int32_t)n);  // fewer visible than topk
    for (int64_t i = 0; i < n; ++i) {
      float v = r.normal();
      if (ties) v = std::floor(v * 4.0f) * 0.25f;  // many exact ties
      if (ties && (i % 3 == 0)) v = 0.0f;         // ReLU-like zeros
      s[m * n + i] = i < nv[m] ? v : -INFINITY;
    }
  }
  DBuf ds = dup(s, "score"), dn = dup(nv, "n_valid"), di = dalloc(M * topk * 4, "idx"), dcnt = dalloc(M * 4, "count");
  poison(di), poison(dcnt);
  auto launch = [&] { return dc::topk_rows(ds.as<float>(), M, n, n, dn.as<int32_t>(), topk, di.as<int32_t>(), dcnt.as<int32_t>(), 0); };
  CK(launch());
  auto idx = down<int32_t>(di, M * topk), cnt = down<int32_t>(dcnt, M);
  int64_t bad = 0;
  std::vector<int32_t> cand;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t k = std::min<int64_t>(topk, nv[m]);
    const float* sc = s.data() + m * n;
    cand.resize(nv[m]);
    std::iota(cand.begin(), cand.end(), 0);
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                      [&](int32_t a, int32_t c) { return sc[a] > sc[c] || (sc[a] == sc[c] && a < c); });
    std::sort(cand.begin(), cand.begin() + k);
    if (cnt[m] != k) ++bad;
    for (int64_t j = 0; j < topk; ++j) bad += idx[m * topk + j] != (j < k ? cand[j] : -1);
  }
  expect_true(res, bad == 0, std::to_string(bad) + " indices differ");
  res.detail += "exact ";
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = M * n * 4.0 * 5 + M * topk * 4.0;  // 5 passes over the scores
  }
  return res;
}

// =================================================================================================
// MoE
// =================================================================================================
inline float softplus_h(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void host_route(const std::vector<float>& lg, int64_t T, int E, int K, dc::Scoring sf, const std::vector<float>& bias,
                const std::vector<int32_t>* tid2eid, const std::vector<int32_t>& tok, float rsf, std::vector<int32_t>& sel,
                std::vector<float>& w, std::vector<float>& biased_all) {
  sel.resize(T * K), w.resize(T * K), biased_all.resize(T * E);
  std::vector<float> sc(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lg.data() + t * E;
    if (sf == dc::Scoring::SqrtSoftplus)
      for (int e = 0; e < E; ++e) sc[e] = std::sqrt(softplus_h(l[e]));
    else if (sf == dc::Scoring::Sigmoid)
      for (int e = 0; e < E; ++e) sc[e] = 1.0f / (1.0f + std::exp(-l[e]));
    else {
      float mx = *std::max_element(l, l + E), s = 0;
      for (int e = 0; e < E; ++e) s += (sc[e] = std::exp(l[e] - mx));
      for (int e = 0; e < E; ++e) sc[e] /= s;
    }
    float* bb = biased_all.data() + t * E;
    for (int e = 0; e < E; ++e) bb[e] = sc[e] + bias[e];
    if (tid2eid) {
      for (int k = 0; k < K; ++k) sel[t * K + k] = (*tid2eid)[(int64_t)tok[t] * K + k];
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int32_t a, int32_t b) { return bb[a] > bb[b] || (bb[a] == bb[b] && a < b); });
      for (int k = 0; k < K; ++k) sel[t * K + k] = order[k];
    }
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += (w[t * K + k] = sc[sel[t * K + k]]);
    const float f = rsf / (sum + 1e-20f);
    for (int k = 0; k < K; ++k) w[t * K + k] *= f;
  }
}

Result route_case(int64_t T, int E, int K, dc::Scoring sf, bool hash, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int V = 1000;
  std::vector<float> lg = randn(r, T * E, 2.0f), bias = randn(r, E, 0.1f);
  std::vector<int32_t> tid2eid(V * K), tok(T);
  for (int v = 0; v < V; ++v)
    for (int k = 0; k < K; ++k) tid2eid[v * K + k] = r.range(0, E);
  for (auto& t : tok) t = r.range(0, V);
  DBuf dl = dup(lg, "logits"), db = dup(bias, "bias"), dt = dup(tid2eid, "tid2eid"), dtok = dup(tok, "tokens");
  DBuf ds = dalloc(T * K * 4, "sel"), dw = dalloc(T * K * 4, "w");
  poison(ds), poison(dw);
  auto launch = [&] {
    return dc::moe_route(dl.as<float>(), T, E, K, sf, db.as<float>(), hash ? dt.as<int32_t>() : nullptr, dtok.as<int32_t>(),
                         true, 1.5f, ds.as<int32_t>(), dw.as<float>(), 0);
  };
  CK(launch());
  auto sel = down<int32_t>(ds, T * K);
  auto w = down<float>(dw, T * K);
  std::vector<int32_t> sr;
  std::vector<float> wr, ball;
  host_route(lg, T, E, K, sf, bias, hash ? &tid2eid : nullptr, tok, 1.5f, sr, wr, ball);
  // a selection may differ only where the CPU's biased scores are within rounding of each other
  int64_t bad = 0, near = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      const int a = sel[t * K + k], b = sr[t * K + k];
      if (a == b) continue;
      if (a >= 0 && a < E && std::fabs(ball[t * E + a] - ball[t * E + b]) < 1e-5f) {
        ++near;
        w[t * K + k] = wr[t * K + k];
      } else {
        ++bad;
      }
    }
  expect_true(res, bad == 0, std::to_string(bad) + " selections differ");
  if (near) res.detail += "near-ties=" + std::to_string(near) + " ";
  expect_nmse(res, "w", w, wr, 1e-10);
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = T * E * 4.0 + T * K * 8.0;
  }
  return res;
}

__global__ void fill_bytes(uint8_t* p, int64_t n, uint64_t seed, int lo, int span) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = span ? (uint8_t)(lo + (int)(z % (uint64_t)span)) : (uint8_t)z;
  }
}

// The routed-expert FFN end to end on the GPU: route → group → grouped GEMM (fp4 w13, gathered rows)
// → SwiGLU (bf16 act) → grouped GEMM (fp4 w2) → combine (+ shared expert output). The reference is the
// model's loop (experts ascending) with dequantized weights and the act rounded to bf16 like the GPU.
Result moe_case(int64_t T, int E, int K, int64_t D, int64_t I, bool check, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> h = round_bf16(randn(r, T * D)), lg = randn(r, T * E, 2.0f), bias = randn(r, E, 0.1f),
                     shared = randn(r, T * D, 0.1f);
  const int64_t w13_b = 2 * I * D / 2, w13_s = 2 * I * D / 32, w2_b = D * I / 2, w2_s = D * I / 32;
  DBuf dw13 = dalloc(E * w13_b, "w13"), ds13 = dalloc(E * w13_s, "s13"), dw2 = dalloc(E * w2_b, "w2"), ds2 = dalloc(E * w2_s, "s2");
  const uint64_t sd = r.next();
  fill_bytes<<<4096, 256>>>(dw13.as<uint8_t>(), E * w13_b, sd + 1, 0, 0);
  fill_bytes<<<4096, 256>>>(ds13.as<uint8_t>(), E * w13_s, sd + 2, 119, 4);
  fill_bytes<<<4096, 256>>>(dw2.as<uint8_t>(), E * w2_b, sd + 3, 0, 0);
  fill_bytes<<<4096, 256>>>(ds2.as<uint8_t>(), E * w2_s, sd + 4, 119, 4);
  CK(cudaGetLastError());
  DBuf dh = dup(to_bf16(h), "h"), dl = dup(lg, "logits"), db = dup(bias, "bias"), dsh = dup(shared, "shared");
  const int64_t S = T * K, maxt = dc::moe_max_tiles(S, E, 64);
  DBuf dsel = dalloc(S * 4, "sel"), dwt = dalloc(S * 4, "wsel"), doff = dalloc((E + 1) * 4, "offsets"),
       dperm = dalloc(S * 4, "perm"), dslot = dalloc(S * 4, "slot_row"), dtile = dalloc(maxt * 8, "tiles"),
       dnt = dalloc(4, "n_tiles"), dgu = dalloc(S * 2 * I * 4, "gu"), dact = dalloc(S * I * 2, "act"),
       dye = dalloc(S * D * 4, "ye"), dout = dalloc(T * D * 4, "out");
  poison(dgu), poison(dye), poison(dout);
  dc::WeightRef W13{dc::WFmt::FP4_B32, dw13.p(), ds13.p(), 0}, W2{dc::WFmt::FP4_B32, dw2.p(), ds2.p(), 0};
  auto run = [&](bool all) {
    if (all) {
      CK(dc::moe_route(dl.as<float>(), T, E, K, dc::Scoring::SqrtSoftplus, db.as<float>(), nullptr, nullptr, true, 1.5f,
                       dsel.as<int32_t>(), dwt.as<float>(), 0));
      CK(dc::moe_group(dsel.as<int32_t>(), T, K, E, 64, doff.as<int32_t>(), dperm.as<int32_t>(), dslot.as<int32_t>(),
                       dtile.as<int2>(), dnt.as<int32_t>(), 0));
    }
    CK(dc::gemm_grouped(dh.as<bf16>(), D, dperm.as<int32_t>(), D, W13, w13_b, w13_s, 2 * I, dtile.as<int2>(),
                        dnt.as<int32_t>(), maxt, doff.as<int32_t>(), dgu.as<float>(), 2 * I, 0));
    CK(dc::swiglu_clamp(dgu.as<float>(), S, I, 10.0f, nullptr, nullptr, dact.as<bf16>(), 0));
    CK(dc::gemm_grouped(dact.as<bf16>(), I, nullptr, I, W2, w2_b, w2_s, D, dtile.as<int2>(), dnt.as<int32_t>(), maxt,
                        doff.as<int32_t>(), dye.as<float>(), D, 0));
    CK(dc::moe_combine(dye.as<float>(), dsel.as<int32_t>(), dwt.as<float>(), dslot.as<int32_t>(), T, K, D,
                       dsh.as<float>(), dout.as<float>(), 0));
  };
  run(true);
  if (check) {
    auto out = down<float>(dout, T * D);
    auto sel = down<int32_t>(dsel, S);
    auto wt = down<float>(dwt, S);
    auto offs = down<int32_t>(doff, E + 1);
    // grouping invariants: offsets consistent with the selection
    std::vector<int> cnt(E, 0);
    for (auto e : sel) cnt[e]++;
    bool ok = offs[0] == 0;
    for (int e = 0; e < E; ++e) ok &= offs[e + 1] - offs[e] == cnt[e];
    expect_true(res, ok, "offsets");
    auto w13q = down<uint8_t>(dw13, E * w13_b), s13 = down<uint8_t>(ds13, E * w13_s);
    auto w2q = down<uint8_t>(dw2, E * w2_b), s2 = down<uint8_t>(ds2, E * w2_s);
    std::vector<float> ref(T * D, 0.0f), wd13, wd2, xe, gu, act, ye;
    auto deq = [](const uint8_t* q, const uint8_t* s, int64_t N, int64_t Kd, std::vector<float>& o) {
      o.resize(N * Kd);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < Kd; ++k) {
          const uint8_t b = q[n * (Kd / 2) + k / 2];
          o[n * Kd + k] = kE2M1[(k & 1) ? b >> 4 : b & 0xF] * e8m0_val(s[n * (Kd / 32) + k / 32]);
        }
    };
    for (int e = 0; e < E; ++e) {
      std::vector<std::pair<int, float>> rows;
      for (int64_t t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
          if (sel[t * K + k] == e) rows.push_back({(int)t, wt[t * K + k]});
      if (rows.empty()) continue;
      const int64_t n = rows.size();
      deq(w13q.data() + e * w13_b, s13.data() + e * w13_s, 2 * I, D, wd13);
      deq(w2q.data() + e * w2_b, s2.data() + e * w2_s, D, I, wd2);
      xe.resize(n * D), gu.resize(n * 2 * I), act.resize(n * I), ye.resize(n * D);
      for (int64_t i = 0; i < n; ++i) memcpy(xe.data() + i * D, h.data() + rows[i].first * D, D * 4);
      cpu_linear(xe.data(), n, D, wd13.data(), 2 * I, gu.data());
      cpu().swiglu_clamp(gu.data(), n, I, 10.0f, nullptr, act.data());
      for (auto& a : act) a = bf16r(a);
      cpu_linear(act.data(), n, I, wd2.data(), D, ye.data());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < D; ++c) ref[rows[i].first * D + c] += ye[i * D + c] * rows[i].second;
    }
    for (int64_t i = 0; i < T * D; ++i) ref[i] += shared[i];
    expect_nmse(res, "out", out, ref, 2e-5);  // act bf16 rounding may flip on f32-order differences
  }
  if (g_perf) {
    res.us = time_us([&] { run(true); });
    // bytes: the weights of the experts actually hit, once; activations; f32 intermediates
    auto sel = down<int32_t>(dsel, S);
    std::vector<char> hit(E, 0);
    for (auto e : sel) hit[e] = 1;
    const double nhit = std::count(hit.begin(), hit.end(), 1);
    res.bytes = nhit * (w13_b + w13_s + w2_b + w2_s) + T * D * 2.0 + S * (2 * I * 4.0 * 2 + I * 2.0 * 2 + D * 4.0 * 2) + T * D * 8.0;
    res.flops = 2.0 * S * (2 * I) * D + 2.0 * S * D * I;
  }
  return res;
}

// =================================================================================================
// Decode GEMV on tensor cores (gemv_q, gemv_q_grouped): f32 x, weights in their stored format
// =================================================================================================
// A quantized weight on the host, in the device layout. variant 1: fp8 bytes all subnormal (exponent
// field 0); variant 2: large scales (fp8 2^8..2^10, fp4 e8m0 126..135) that take the two-multiply path.
struct HostQ {
  dc::WFmt fmt;
  int64_t N, K, ldws = 0;
  std::vector<uint8_t> w, s;
};
const char* wfmt_name(dc::WFmt f) { return f == dc::WFmt::BF16 ? "bf16" : f == dc::WFmt::FP8_B128 ? "fp8" : "fp4"; }
HostQ make_hostq(Rng& r, dc::WFmt fmt, int64_t N, int64_t K, int variant) {
  HostQ q{fmt, N, K};
  if (fmt == dc::WFmt::BF16) {
    auto b = to_bf16(randn(r, N * K, 0.05f));
    q.w.resize(N * K * 2);
    memcpy(q.w.data(), b.data(), q.w.size());
  } else if (fmt == dc::WFmt::FP8_B128) {
    q.ldws = (((K + 127) / 128 + 3) / 4) * 4;  // (a partial last scale block, K % 128 != 0)
    q.w.resize(N * K);
    for (auto& b : q.w) b = variant == 1 ? (uint8_t)(r.next() & 0x87) : rand_e4m3(r);
    std::vector<float> sc(((N + 127) / 128) * q.ldws, 0.0f);
    for (auto& v : sc)
      v = variant == 2 ? std::ldexp(1.0f, r.range(8, 11))
          : variant == 4 ? std::ldexp(1.0f, r.range(-10, 9))  // spread 2^-10..2^8
                         : std::ldexp(1.0f, r.range(-12, -6));
    q.s.resize(sc.size() * 4);
    memcpy(q.s.data(), sc.data(), q.s.size());
  } else {
    q.w.resize(N * K / 2);
    q.s.resize(N * K / 32);
    for (auto& b : q.w) b = (uint8_t)r.next();
    for (auto& b : q.s) b = variant == 2 ? (uint8_t)r.range(126, 136) : (uint8_t)r.range(118, 124);
  }
  return q;
}
// Row n of dequant(W), exactly (float products of a small-mantissa value and a power of two).
void hostq_row(const HostQ& q, int64_t n, float* out) {
  const int64_t K = q.K;
  for (int64_t k = 0; k < K; ++k) {
    if (q.fmt == dc::WFmt::BF16) {
      bf16 v;
      memcpy(&v, &q.w[(n * K + k) * 2], 2);
      out[k] = __bfloat162float(v);
    } else if (q.fmt == dc::WFmt::FP8_B128) {
      float sc;
      memcpy(&sc, &q.s[((n / 128) * q.ldws + k / 128) * 4], 4);
      out[k] = e4m3_val(q.w[n * K + k]) * sc;
    } else {
      const uint8_t b = q.w[n * (K / 2) + k / 2];
      out[k] = kE2M1[(k & 1) ? b >> 4 : b & 0xF] * e8m0_val(q.s[n * (K / 32) + k / 32]);
    }
  }
}
// Independent reference: y[n] = Σ_k bf16(x[k]) · W[n, k] in double, for the rows in `rows_n`.
void gemv_ref_rows(const HostQ& q, const float* x, const std::vector<int64_t>& rows_n, std::vector<double>& y) {
  std::vector<float> wr(q.K), xb(q.K);
  for (int64_t k = 0; k < q.K; ++k) xb[k] = bf16r(x[k]);
  y.assign(rows_n.size(), 0.0);
  for (size_t i = 0; i < rows_n.size(); ++i) {
    hostq_row(q, rows_n[i], wr.data());
    double a = 0;
    for (int64_t k = 0; k < q.K; ++k) a += (double)xb[k] * wr[k];
    y[i] = a;
  }
}
// The output rows the f64 reference checks: all of them, or 256 spread over N (both ends, nearby rows too) when
// the weight is larger than 4 M elements.
std::vector<int64_t> reference_rows(int64_t N, int64_t K) {
  std::vector<int64_t> rows;
  if (N * K <= (4ll << 20)) {
    rows.resize(N);
    std::iota(rows.begin(), rows.end(), 0);
  } else {
    for (int i = 0; i < 256; ++i) rows.push_back(std::min<int64_t>(N - 1, (N * i) / 255 + (i % 5) * (i < 255)));
  }
  return rows;
}
// Whether floats [from, to) of an output row still hold poison()'s bytes (a kernel wrote no padding).
bool pad_untouched(const float* row, int64_t from, int64_t to) {
  bool ok = true;
  for (int64_t c = from; c < to; ++c) {
    uint32_t u;
    memcpy(&u, &row[c], 4);
    ok &= u == 0xFFFFFFFFu;
  }
  return ok;
}
struct DevQ {
  DBuf w, s;
  dc::WeightRef ref() const { return {fmt, w.p(), s.base ? s.p() : nullptr, ldws}; }
  dc::WFmt fmt;
  int64_t ldws;
};
DevQ upload_q(const HostQ& q) {
  DevQ d;
  d.fmt = q.fmt, d.ldws = q.ldws;
  d.w = dup(q.w, "w");
  if (!q.s.empty()) d.s = dup(q.s, "w_scale");
  return d;
}

// The dense launcher a case runs: gemv_q (v4 / v3 by shape) or another version.
using DenseGemv = cudaError_t (*)(const float*, int64_t, int64_t, int64_t, dc::WeightRef, int64_t, float*, int64_t,
                                  cudaStream_t);
cudaError_t gemv_q_noplan(const float* x, int64_t M, int64_t K, int64_t ldx, dc::WeightRef W, int64_t N, float* y,
                          int64_t ldy, cudaStream_t s) {
  return dc::gemv_q(x, M, K, ldx, W, N, y, ldy, s);
}

cudaError_t gemv_q_v6_noplan(const float* x, int64_t M, int64_t K, int64_t ldx, dc::WeightRef W, int64_t N, float* y,
                             int64_t ldy, cudaStream_t s) {
  return dc::gemv_q_v6(x, M, K, ldx, W, N, y, ldy, s);
}

cudaError_t gemv_q_v8_noplan(const float* x, int64_t M, int64_t K, int64_t ldx, dc::WeightRef W, int64_t N, float* y,
                             int64_t ldy, cudaStream_t s) {
  return dc::gemv_q_v8(x, M, K, ldx, W, N, y, ldy, s);
}

// Dense: NMSE against the f64 reference, the padding of y untouched, and batch invariance: every row
// of the M-row launch is bitwise the same as that row launched alone (M = 1).
Result gemv_case(dc::WFmt fmt, int64_t M, int64_t N, int64_t K, int variant, const std::string& name,
                 DenseGemv gemv = gemv_q_noplan) {
  Rng r = rng_for(name);
  Result res;
  const HostQ q = make_hostq(r, fmt, N, K, variant);
  const int64_t ldx = K + 4, ldy = N + 5;
  std::vector<float> x = randn(r, M * ldx);
  if (variant == 1)  // subnormal weights: x = ±1 so that every product is a weight
    for (auto& v : x) v = v < 0 ? -1.0f : 1.0f;
  if (variant == 3)  // x's 128-k blocks scaled by 2^-40..2^40 (beyond f16's range: gemv_q_v6's pre-scale)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k0 = 0; k0 < K; k0 += 128) {
        const float f = std::ldexp(1.0f, r.range(-40, 41));
        for (int64_t k = k0; k < std::min(K, k0 + 128); ++k) x[m * ldx + k] *= f;
      }
  DevQ dq = upload_q(q);
  DBuf dx = dup(x, "x"), dy = dalloc(M * ldy * 4, "y"), dy1 = dalloc(ldy * 4, "y_alone");
  poison(dy);
  CK(gemv(dx.as<float>(), M, K, ldx, dq.ref(), N, dy.as<float>(), ldy, 0));
  auto yg = down<float>(dy, M * ldy);
  // the f64 reference on every output row, or on 256 rows spread over N (both ends included) when the
  // shape is large; batch invariance and the padding are checked on all of them
  const std::vector<int64_t> all = reference_rows(N, K);
  const int64_t nr = (int64_t)all.size();
  std::vector<float> yc(M * nr), yr(M * nr);
  bool pad_ok = true, inv_ok = true;
  std::vector<double> yd;
  for (int64_t m = 0; m < M; ++m) {
    gemv_ref_rows(q, x.data() + m * ldx, all, yd);
    for (int64_t i = 0; i < nr; ++i) yc[m * nr + i] = yg[m * ldy + all[i]], yr[m * nr + i] = (float)yd[i];
    if (m + 1 < M) pad_ok &= pad_untouched(yg.data() + m * ldy, N, ldy);
    poison(dy1);
    CK(gemv(dx.as<float>() + m * ldx, 1, K, ldx, dq.ref(), N, dy1.as<float>(), ldy, 0));
    auto y1 = down<float>(dy1, N);
    inv_ok &= rows_bitwise_equal(y1.data(), yg.data() + m * ldy, N);
  }
  expect_true(res, pad_ok, "row padding written");
  expect_true(res, inv_ok, "batch invariance: a row alone differs from the same row in the batch");
  if (inv_ok) res.detail += "rows alone == in batch (bitwise) ";
  expect_nmse(res, "y", yc, yr, variant == 1 ? 1e-10 : 1e-6);
  return res;
}

// gemv_q_v6_groups (linear_groups' layout: y[m, g·N + n] = x[m, g·K ..] · W_gᵀ, G weights at a byte
// stride): NMSE against the f64 reference of every group, y's padding untouched, and every row launched
// alone bitwise equal to the same row in the M-row launch.
Result gemv_groups_case(dc::WFmt fmt, int64_t M, int G, int64_t N, int64_t K, const std::string& name, bool v8 = false) {
  Rng r = rng_for(name);
  Result res;
  std::vector<HostQ> qs;
  for (int g = 0; g < G; ++g) qs.push_back(make_hostq(r, fmt, N, K, 0));
  const int64_t wstr = ((int64_t)qs[0].w.size() + 255) / 256 * 256 + 16,  // not a multiple of 256: any 16
      sstr = ((int64_t)qs[0].s.size() + 15) / 16 * 16 + (v8 ? 16 : 4);  // (v8: bulk copies of scale rows)
  auto groups = [&](const float* xp, int64_t M_, const dc::WeightRef& W_, float* yp) {
    return v8 ? dc::gemv_q_v8_groups(xp, M_, K, G * K + 4, W_, wstr, sstr, G, N, yp, G * N + 3, 0)
              : dc::gemv_q_v6_groups(xp, M_, K, G * K + 4, W_, wstr, sstr, G, N, yp, G * N + 3, 0);
  };
  std::vector<uint8_t> wall(G * wstr, 0), sall(G * sstr, 0);
  for (int g = 0; g < G; ++g) {
    memcpy(wall.data() + g * wstr, qs[g].w.data(), qs[g].w.size());
    if (!qs[g].s.empty()) memcpy(sall.data() + g * sstr, qs[g].s.data(), qs[g].s.size());
  }
  const int64_t ldx = G * K + 4, ldy = G * N + 3;
  std::vector<float> x = randn(r, M * ldx);
  DBuf dw = dup(wall, "w_groups"), ds = dup(sall, "s_groups"), dx = dup(x, "x"), dy = dalloc(M * ldy * 4, "y"),
       dy1 = dalloc(ldy * 4, "y_alone");
  const dc::WeightRef W{fmt, dw.p(), fmt == dc::WFmt::BF16 ? nullptr : ds.p(), qs[0].ldws};
  poison(dy);
  CK(groups(dx.as<float>(), M, W, dy.as<float>()));
  auto yg = down<float>(dy, M * ldy);
  std::vector<int64_t> all;
  if (N * K <= (4ll << 20)) {
    all.resize(N);
    std::iota(all.begin(), all.end(), 0);
  } else {
    for (int i = 0; i < 64; ++i) all.push_back(std::min<int64_t>(N - 1, (N * i) / 63));
  }
  std::vector<float> yc, yr;
  std::vector<double> yd;
  bool pad_ok = true, inv_ok = true;
  for (int64_t m = 0; m < M; ++m) {
    for (int g = 0; g < G; ++g) {
      gemv_ref_rows(qs[g], x.data() + m * ldx + g * K, all, yd);
      for (size_t i = 0; i < all.size(); ++i) yc.push_back(yg[m * ldy + g * N + all[i]]), yr.push_back((float)yd[i]);
    }
    if (m + 1 < M) pad_ok &= pad_untouched(yg.data() + m * ldy, G * N, ldy);
    poison(dy1);
    CK(groups(dx.as<float>() + m * ldx, 1, W, dy1.as<float>()));
    auto y1 = down<float>(dy1, G * N);
    inv_ok &= rows_bitwise_equal(y1.data(), yg.data() + m * ldy, G * N);
  }
  expect_true(res, pad_ok, "row padding written");
  expect_true(res, inv_ok, "batch invariance: a row alone differs from the same row in the batch");
  if (inv_ok) res.detail += "rows alone == in batch (bitwise) ";
  expect_nmse(res, "y", yc, yr, 1e-6);
  return res;
}

// Batch invariance over M = 1..32: one M = 32 launch, then every window x[s .. s + M) (s = 0 and
// s = 32 − M) launched as an M-row batch; each row bitwise equal to the same row of the M = 32 launch.
// (Crosses the v4 column-group counts 1..4 and the x staging sizes 1..32 rows.)
Result gemv_inv_case(dc::WFmt fmt, int64_t N, int64_t K, const std::string& name, DenseGemv gemv = gemv_q_noplan) {
  Rng r = rng_for(name);
  Result res;
  const int64_t MM = 32;
  const HostQ q = make_hostq(r, fmt, N, K, 0);
  const int64_t ldx = K + 8, ldy = N + 3;
  std::vector<float> x = randn(r, MM * ldx);
  DevQ dq = upload_q(q);
  DBuf dx = dup(x, "x"), dy = dalloc(MM * ldy * 4, "y32"), dyw = dalloc(MM * ldy * 4, "y_window");
  poison(dy);
  CK(gemv(dx.as<float>(), MM, K, ldx, dq.ref(), N, dy.as<float>(), ldy, 0));
  auto y32 = down<float>(dy, MM * ldy);
  bool finite = true;
  for (int64_t m = 0; m < MM; ++m)
    for (int64_t n = 0; n < N; ++n) finite &= std::isfinite(y32[m * ldy + n]);
  expect_true(res, finite, "M=32 output not finite (unwritten?)");
  int bad = 0;
  for (int64_t M = 1; M <= MM; ++M)
    for (int64_t s0 : {(int64_t)0, MM - M}) {
      poison(dyw);
      CK(gemv(dx.as<float>() + s0 * ldx, M, K, ldx, dq.ref(), N, dyw.as<float>(), ldy, 0));
      auto yw = down<float>(dyw, M * ldy);
      for (int64_t m = 0; m < M; ++m) bad += !rows_bitwise_equal(yw.data() + m * ldy, y32.data() + (s0 + m) * ldy, N);
    }
  expect_true(res, bad == 0, "batch invariance: " + std::to_string(bad) + " rows differ from the M=32 launch");
  if (!bad) res.detail += "every window M=1..32 == M=32 rows (bitwise) ";
  // and a sampled f64 check of the M = 32 launch
  std::vector<int64_t> rows;
  for (int i = 0; i < 32; ++i) rows.push_back(std::min<int64_t>(N - 1, (N * i) / 31));
  std::vector<float> yc, yr;
  std::vector<double> yd;
  for (int64_t m = 0; m < MM; ++m) {
    gemv_ref_rows(q, x.data() + m * ldx, rows, yd);
    for (size_t i = 0; i < rows.size(); ++i) yc.push_back(y32[m * ldy + rows[i]]), yr.push_back((float)yd[i]);
  }
  expect_nmse(res, "y(32 rows)", yc, yr, 1e-6);
  return res;
}

// gemv_q_v8 on a chain y1 = x·W1ᵀ, y2 = y1·W2ᵀ, 12 links, y1 poisoned (memset NaN) before each link, from a
// graph whose kernel → kernel edges are programmatic (the model's step graphs): v8 requests W2 before its
// griddepcontrol.wait, so a consumer that read y1 early would see NaN. Every y2 bitwise the plain chain's.
// Also: every ring depth gives the same bits (ring 2, 3, 16 against the default).
Result gemv_v8_chain_case(dc::WFmt fmt, int64_t M, int64_t N1, int64_t K, int64_t N2, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const HostQ q1 = make_hostq(r, fmt, N1, K, 0), q2 = make_hostq(r, fmt, N2, N1, 0);
  std::vector<float> x = randn(r, M * K);
  DevQ d1 = upload_q(q1), d2 = upload_q(q2);
  const int reps = 12;
  DBuf dx = dup(x, "x"), y1 = dalloc(M * N1 * 4, "y1"), yref = dalloc(M * N2 * 4, "y2_ref"),
       y2 = dalloc(reps * M * N2 * 4, "y2_reps"), yr = dalloc(M * N1 * 4, "y1_ring");
  CK(dc::gemv_q_v8(dx.as<float>(), M, K, K, d1.ref(), N1, y1.as<float>(), N1, 0));
  CK(dc::gemv_q_v8(y1.as<float>(), M, N1, N1, d2.ref(), N2, yref.as<float>(), N2, 0));
  auto want = down<float>(yref, M * N2);
  auto want1 = down<float>(y1, M * N1);
  bool finite = true;
  for (float f : want) finite &= std::isfinite(f);
  expect_true(res, finite, "plain chain not finite");
  int ring_bad = 0;
  for (int ring : {2, 3, 16}) {
    poison(yr);
    CK(dc::gemv_q_v8_ring(dx.as<float>(), M, K, K, d1.ref(), N1, yr.as<float>(), N1, 0, ring));
    auto got = down<float>(yr, M * N1);
    ring_bad += !rows_bitwise_equal(got.data(), want1.data(), M * N1);
  }
  expect_true(res, ring_bad == 0, std::to_string(ring_bad) + " of 3 ring depths differ from the default");
  auto chain = [&](cudaStream_t st) {
    for (int i = 0; i < reps; ++i) {
      CK(cudaMemsetAsync(y1.p(), 0xFF, M * N1 * 4, st));
      CK(dc::gemv_q_v8(dx.as<float>(), M, K, K, d1.ref(), N1, y1.as<float>(), N1, st));
      CK(dc::gemv_q_v8(y1.as<float>(), M, N1, N1, d2.ref(), N2, y2.as<float>() + i * M * N2, N2, st));
    }
  };
  poison(y2);
  std::string err;
  const bool captured = run_in_graph(chain, err, 1, true);
  expect_true(res, captured, "chain not capturable " + err);
  if (captured) {
    auto got = down<float>(y2, reps * M * N2);
    int bad = 0;
    for (int i = 0; i < reps; ++i) bad += !rows_bitwise_equal(got.data() + i * M * N2, want.data(), M * N2);
    expect_true(res, bad == 0, std::to_string(bad) + " of 12 links differ from the plain chain");
  }
  if (res.pass) res.detail += "12 links with programmatic edges == plain chain, ring 2/3/16 == default (bitwise) ";
  return res;
}

// Launch plans and CUDA graphs change no bit. gemv_q / gemv_q_v3 on M rows and gemv_q_grouped(_v3) on
// T = M tokens × 2 of 3 experts: without a plan (queries in the launcher), with the plan, and replayed
// from a captured graph (with the plan): bitwise equal. A plan made for another shape is rejected.
Result gemv_plan_case(dc::WFmt fmt, int64_t M, int64_t N, int64_t K, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int E = 3, topk = 2;
  const int64_t ldws = fmt == dc::WFmt::FP8_B128 ? ((K / 128 + 3) / 4) * 4 : 0;
  const int64_t wb = fmt == dc::WFmt::BF16 ? N * K * 2 : fmt == dc::WFmt::FP8_B128 ? N * K : N * K / 2;
  const int64_t sb = fmt == dc::WFmt::FP8_B128 ? ((N + 127) / 128) * ldws * 4 : fmt == dc::WFmt::FP4_B32 ? N * K / 32 : 0;
  const int64_t wstr = (wb + 255) / 256 * 256, sstr = (sb + 255) / 256 * 256;
  DBuf dw = dalloc(E * wstr, "w_experts"), ds;
  const uint64_t sd = r.next();
  // finite values only (as in gemv_perf_case)
  if (fmt == dc::WFmt::BF16) fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), E * wstr, sd, 0x30, 16);
  else fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), E * wstr, sd, 0, fmt == dc::WFmt::FP8_B128 ? 0x7f : 0);
  if (fmt == dc::WFmt::FP8_B128) {
    std::vector<float> sc(E * sstr / 4);
    for (auto& v : sc) v = std::ldexp(1.0f, r.range(-10, -6));
    ds = dup(sc, "s_experts");
  } else if (fmt == dc::WFmt::FP4_B32) {
    ds = dalloc(E * sstr, "s_experts");
    fill_bytes<<<4096, 256>>>(ds.as<uint8_t>(), E * sstr, sd + 3, 119, 4);
  }
  CK(cudaGetLastError());
  std::vector<int32_t> sel(M * topk);
  for (int64_t t = 0; t < M; ++t) {
    sel[t * topk] = r.range(0, E);
    sel[t * topk + 1] = (sel[t * topk] + 1 + r.range(0, E - 1)) % E;
  }
  std::vector<float> x = randn(r, M * K);
  DBuf dx = dup(x, "x"), dsel = dup(sel, "sel");
  const dc::WeightRef W{fmt, dw.p(), ds.base ? ds.p() : nullptr, ldws};
  dc::GemvPlan pd, pg;
  CK(dc::gemv_q_plan(W, N, K, false, &pd));
  CK(dc::gemv_q_plan(W, N, K, true, &pg));
  for (int v3 = 0; v3 < 2; ++v3) {
    auto dense = v3 ? dc::gemv_q_v3 : dc::gemv_q;
    auto grouped = v3 ? dc::gemv_q_grouped_v3 : dc::gemv_q_grouped;
    DBuf y[3], g[3];
    for (int i = 0; i < 3; ++i) {
      y[i] = dalloc(M * N * 4, "y"), g[i] = dalloc(M * topk * N * 4, "y_grouped");
      poison(y[i]), poison(g[i]);
    }
    auto run = [&](int i, bool plan, cudaStream_t st) {
      CK(dense(dx.as<float>(), M, K, K, W, N, y[i].as<float>(), N, st, plan ? &pd : nullptr));
      CK(grouped(dx.as<float>(), K, false, dsel.as<int32_t>(), M, topk, K, W, wstr, sstr, N, false, 0.0f,
                 g[i].as<float>(), N, st, plan ? &pg : nullptr));
    };
    run(0, false, 0);
    run(1, true, 0);
    std::string err;
    const bool captured = run_in_graph([&](cudaStream_t st) { run(2, true, st); }, err);
    const char* vn = v3 ? "v3" : "v4";
    expect_true(res, captured, std::string(vn) + " launches not capturable " + err);
    std::vector<float> yv[3], gv[3];
    for (int i = 0; i < 3; ++i) yv[i] = down<float>(y[i], M * N), gv[i] = down<float>(g[i], M * topk * N);
    bool finite = true;
    for (float f : yv[0]) finite &= std::isfinite(f);
    for (float f : gv[0]) finite &= std::isfinite(f);
    expect_true(res, finite, std::string(vn) + " output not finite");
    expect_true(res, rows_bitwise_equal(yv[0].data(), yv[1].data(), M * N), std::string(vn) + " plan changed gemv_q");
    expect_true(res, rows_bitwise_equal(gv[0].data(), gv[1].data(), M * topk * N), std::string(vn) + " plan changed grouped");
    if (captured) {
      expect_true(res, rows_bitwise_equal(yv[0].data(), yv[2].data(), M * N), std::string(vn) + " graph changed gemv_q");
      expect_true(res, rows_bitwise_equal(gv[0].data(), gv[2].data(), M * topk * N), std::string(vn) + " graph changed grouped");
    }
    // a plan of another shape: rejected, nothing launched
    dc::GemvPlan other = pd;
    other.N = N + 16;
    expect_true(res, dense(dx.as<float>(), M, K, K, W, N, y[0].as<float>(), N, 0, &pg) == cudaErrorInvalidValue,
                std::string(vn) + " grouped plan taken by gemv_q");
    expect_true(res, dense(dx.as<float>(), M, K, K, W, N, y[0].as<float>(), N, 0, &other) == cudaErrorInvalidValue,
                std::string(vn) + " plan of another N taken");
    cudaGetLastError();
  }
  char buf[96];
  snprintf(buf, sizeof buf, "no plan == plan == graph (bitwise, v3 and v4); sms %d, clusters[8 rows] %d ", pd.sms, pd.clusters[3]);
  if (res.pass) res.detail += buf;
  return res;
}

// Perf (and a sampled check): the weight is rotated among ⌈256 MB / bytes⌉ copies so that every timed
// launch reads it from HBM (the H200's L2 is 60 MB).
// ver: 4 = gemv_q (v4, v3 fallback), 3 = gemv_q_v3, 7 = gemv_q_v6 (with the plan), 8 = gemv_q_v6_tuned with
// `tune` (a schedule sweep), 11 = gemv_q_v8 (with the plan), 12 = gemv_q_v8 timed from a graph with programmatic edges (the model's
// setting), 13 = gemv_q_v8_ring with tune.items stages (plain edges).
Result gemv_perf_case(dc::WFmt fmt, int64_t M, int64_t N, int64_t K, int ver, const std::string& name,
                      dc::GemvV6Tune tune = {}) {
  // (plan: the backend's, made once for the weight's shape)
  auto gemv = [ver, tune](const float* x, int64_t M_, int64_t K_, int64_t ldx_, dc::WeightRef W_, int64_t N_, float* y,
                          int64_t ldy_, cudaStream_t st, const dc::GemvPlan* pl) {
    if (ver == 8) return dc::gemv_q_v6_tuned(x, M_, K_, ldx_, W_, N_, y, ldy_, st, tune);
    if (ver == 7) return dc::gemv_q_v6(x, M_, K_, ldx_, W_, N_, y, ldy_, st, pl);
    if (ver == 11 || ver == 12) return dc::gemv_q_v8(x, M_, K_, ldx_, W_, N_, y, ldy_, st, pl);
    if (ver == 13) return dc::gemv_q_v8_ring(x, M_, K_, ldx_, W_, N_, y, ldy_, st, tune.items);
    return (ver == 3 ? dc::gemv_q_v3 : dc::gemv_q)(x, M_, K_, ldx_, W_, N_, y, ldy_, st, pl);
  };
  Rng r = rng_for(name);
  Result res;
  const int64_t ldws = fmt == dc::WFmt::FP8_B128 ? ((K / 128 + 3) / 4) * 4 : 0;
  const int64_t wb = fmt == dc::WFmt::BF16 ? N * K * 2 : fmt == dc::WFmt::FP8_B128 ? N * K : N * K / 2;
  const int64_t sb = fmt == dc::WFmt::FP8_B128 ? ((N + 127) / 128) * ldws * 4 : fmt == dc::WFmt::FP4_B32 ? N * K / 32 : 0;
  const int64_t wstr = (wb + 255) / 256 * 256, sstr = (sb + 255) / 256 * 256;
  const int copies = (int)std::min<int64_t>(64, std::max<int64_t>(1, (256ll << 20) / (wb + sb) + 1));
  DBuf dw = dalloc(copies * wstr, "w_copies");
  const uint64_t sd = r.next();
  // finite values only: bf16 bytes in [0x30, 0x40), e4m3 bytes 0..0x7e (no NaN), any e2m1 byte
  if (fmt == dc::WFmt::BF16) fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * wstr, sd, 0x30, 16);
  else if (fmt == dc::WFmt::FP8_B128) fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * wstr, sd, 0, 0x7f);
  else fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * wstr, sd, 0, 0);
  DBuf ds;
  if (fmt == dc::WFmt::FP8_B128) {
    std::vector<float> sc(copies * sstr / 4);
    for (auto& v : sc) v = std::ldexp(1.0f, r.range(-10, -6));
    ds = dup(sc, "w_scale_copies");
  } else if (fmt == dc::WFmt::FP4_B32) {
    ds = dalloc(copies * sstr, "w_scale_copies");
    fill_bytes<<<4096, 256>>>(ds.as<uint8_t>(), copies * sstr, sd + 7, 119, 4);
  }
  CK(cudaGetLastError());
  const int64_t ldx = K, ldy = N;
  std::vector<float> x = randn(r, M * ldx);
  DBuf dx = dup(x, "x"), dy = dalloc(M * ldy * 4, "y");
  poison(dy);
  auto W = [&](int c) {
    return dc::WeightRef{fmt, dw.as<uint8_t>() + c * wstr, ds.base ? ds.as<uint8_t>() + c * sstr : nullptr, ldws};
  };
  dc::GemvPlan plan;
  CK(dc::gemv_q_plan(W(0), N, K, false, &plan));
  CK(gemv(dx.as<float>(), M, K, ldx, W(0), N, dy.as<float>(), ldy, 0, &plan));
  // sampled check of copy 0: 64 rows spread over N
  HostQ q{fmt, N, K, ldws};
  q.w = down<uint8_t>(dw, wb);
  if (sb) q.s = down<uint8_t>(ds, sb);
  auto yg = down<float>(dy, M * ldy);
  std::vector<int64_t> rows;
  for (int i = 0; i < 64; ++i) rows.push_back(std::min<int64_t>(N - 1, (N * i) / 64 + i % 7));
  std::vector<float> yc, yr;
  std::vector<double> yd;
  for (int64_t m = 0; m < M; ++m) {
    gemv_ref_rows(q, x.data() + m * ldx, rows, yd);
    for (size_t i = 0; i < rows.size(); ++i) yc.push_back(yg[m * ldy + rows[i]]), yr.push_back((float)yd[i]);
  }
  expect_nmse(res, "y(64 rows)", yc, yr, 1e-6);
  int it = 0;
  res.us = time_us([&] { gemv(dx.as<float>(), M, K, ldx, W(it++ % copies), N, dy.as<float>(), ldy, 0, &plan); });
  res.bytes = (double)(wb + sb) + M * K * 4.0 + M * N * 4.0;
  res.flops = 2.0 * M * N * K;
  // the same rotation from a CUDA graph (whole rounds of the copies)
  const int n = (int)((std::max(20, copies) + copies - 1) / copies * copies);
  it = 0;
  res.graph_us = time_graph_us(
      [&](cudaStream_t st) { CK(gemv(dx.as<float>(), M, K, ldx, W(it++ % copies), N, dy.as<float>(), ldy, st, &plan)); },
      n, ver == 12);
  // host cost of one call with the plan, and without (queries on every call)
  it = 0;
  res.host_us = host_us([&] { gemv(dx.as<float>(), M, K, ldx, W(it++ % copies), N, dy.as<float>(), ldy, 0, &plan); });
  const double host_np = host_us([&] { gemv(dx.as<float>(), M, K, ldx, W(it++ % copies), N, dy.as<float>(), ldy, 0, nullptr); });
  char buf[128];
  snprintf(buf, sizeof buf, "(%d weight copies rotated; %.1f MB; host %.2f us/call, %.2f without plan; graph of %d) ", copies,
           (wb + sb) / 1e6, res.host_us, host_np, n);
  res.detail += buf;
  return res;
}

// ---- the floor of a decode-sized kernel (perf mode): what a kernel that only streams B bytes costs
// from a graph, against which the GEMVs' ~6 µs at 2–4 MB can be judged. Every thread keeps 8 16-byte
// loads in flight (not .nc, so that with `early` they are issued before griddepcontrol.wait, as the
// GEMVs' weights are); the XOR of what was read is stored only if it equals an impossible value.
__global__ void floor_stream_kernel(const uint4* __restrict__ w, int64_t n16, bool early, uint32_t* sink) {
  // as DI_PDL_WAIT: wait, then let the successor launch (early: after the first loads are issued)
  if (!early) asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory");
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n16; i0 += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int64_t i = i0 + u * stride;
      v[u] = make_uint4(0, 0, 0, 0);
      if (i < n16)
        asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(w + i));
    }
    if (early && i0 == (int64_t)blockIdx.x * blockDim.x + threadIdx.x)
      asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory");
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (early) asm volatile("griddepcontrol.wait;\n" ::: "memory");  // (threads without loads)
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
// The floor of a decode GEMV's access pattern (s8): a [N, K]-byte matrix read as 16-row tiles, a warp
// taking units of (tile, k-slice of `span` bytes); a warp load = 8 rows × 64 B (lane (g, t): 16 B at 16t of
// row g or g + 8, as the MMA fragments of gemv_q_v6 / moe_gemv2 ask), 8 loads a thread in flight (16 rows ×
// 256 B a warp), no compute. order 0: a tile's consecutive slices on consecutive warps; 1: consecutive
// warps on different tiles. Against `floor perf stream` (the same bytes read contiguously) it tells whether
// DRAM locality, not the kernels' work, caps the GEMVs near 45 % of HBM.
__global__ void floor_tiles_kernel(const uint8_t* __restrict__ w, int64_t N, int64_t K, int span, int order,
                                   uint32_t* sink) {
  asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5), wid = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t tiles = N / 16, slices = K / span, units = tiles * slices;
  uint32_t acc = 0;
  for (int64_t u = wid; u < units; u += nw) {
    const int64_t tile = order == 0 ? u / slices : u % tiles, sl = order == 0 ? u % slices : u / tiles;
    const uint8_t* base = w + (tile * 16 + g) * K + sl * span + 16 * t;
    for (int k0 = 0; k0 < span; k0 += 256) {
      uint4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                     : "l"(base + (j & 1) * 8 * K + k0 + (j >> 1) * 64));
#pragma unroll
      for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
__global__ void floor_empty_kernel() {
  asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory");
}

// The floor of a bulk-copy (TMA) stream, for the GEMVs that move weights with cp.async.bulk (gemv_q_v8,
// moe_gemv2): one block an SM, thread 0 of warp 1 issues copies of `copy` bytes into a ring of `ring`
// bytes (one mbarrier a slot, the first slots before griddepcontrol.wait), warp 0 waits for each slot and
// frees it (no compute). Block b streams bytes [b·n/G, (b+1)·n/G) of w (rounded to whole copies).
__global__ void floor_bulk_kernel(const uint8_t* __restrict__ w, int64_t ncopies, int copy, int slots, uint32_t* sink) {
  namespace dd = deepinfer::cuda::detail;
  extern __shared__ __align__(128) uint8_t fb_smem[];
  __shared__ __align__(8) uint64_t full[192], empty[192];
  const int64_t c0 = ncopies * blockIdx.x / gridDim.x, c1 = ncopies * (blockIdx.x + 1) / gridDim.x, n = c1 - c0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) dd::mbar_init(dd::smem_u32(&full[i]), 1), dd::mbar_init(dd::smem_u32(&empty[i]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 32) {  // producer
    for (int64_t q = 0; q < n; ++q) {
      const int sl = (int)(q % slots);
      if (q >= slots) dd::mbar_wait(dd::smem_u32(&empty[sl]), (uint32_t)((q / slots - 1) & 1));
      const uint32_t bar = dd::smem_u32(&full[sl]);
      dd::mbar_expect(bar, (uint32_t)copy);
      dd::bulk_load(dd::smem_u32(fb_smem + (size_t)sl * copy), w + (c0 + q) * copy, (uint32_t)copy, bar);
      if (q + 1 == std::min<int64_t>(slots, n)) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
  } else if (threadIdx.x == 0) {  // consumer: waits, touches one word, frees the slot
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    uint32_t acc = 0;
    for (int64_t q = 0; q < n; ++q) {
      const int sl = (int)(q % slots);
      dd::mbar_wait(dd::smem_u32(&full[sl]), (uint32_t)((q / slots) & 1));
      acc ^= *reinterpret_cast<const uint32_t*>(fb_smem + (size_t)sl * copy);
      dd::mbar_arrive(dd::smem_u32(&empty[sl]));
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
  }
  if (threadIdx.x != 32) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
Result floor_bulk_case(int64_t bytes, int copy, int ring, bool pdl) {
  Result res;
  const int copies = (int)std::min<int64_t>(64, (256ll << 20) / bytes + 1);
  const int64_t str = (bytes + 4095) / 4096 * 4096;
  DBuf dw = dalloc(copies * str, "stream"), dsink = dalloc(16, "sink");
  fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * str, 4321, 0, 0);
  CK(cudaDeviceSynchronize());
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int slots = std::min(192, ring / copy);
  CK(cudaFuncSetAttribute(floor_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, slots * copy));
  const int64_t ncopies = bytes / copy;
  int it = 0;
  auto launch = [&](cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)std::min<int64_t>(sms, ncopies));
    cfg.blockDim = dim3(64);
    cfg.dynamicSmemBytes = (size_t)slots * copy;
    cfg.stream = st;
    const uint8_t* w = dw.as<uint8_t>() + (it++ % copies) * str;
    CK(cudaLaunchKernelEx(&cfg, floor_bulk_kernel, w, ncopies, copy, slots, dsink.as<uint32_t>()));
  };
  const int n = (int)((std::max(32, copies) + copies - 1) / copies * copies);
  res.graph_us = time_graph_us(launch, n, pdl);
  res.us = res.graph_us;
  res.bytes = (double)(ncopies * copy);
  char buf[160];
  snprintf(buf, sizeof buf, "graph of %d (%s edges), %d slots of %d B, %d copies rotated ", n, pdl ? "programmatic" : "plain",
           slots, copy, copies);
  res.detail += buf;
  return res;
}

// The floor of a 2-D tensor-copy stream (gemv_e4m3's weight path): an [N, K] byte matrix read in boxes of bw bytes ×
// bh rows (swizzle 128 B for bw = 128, 64 B for 64, none for 256), tiles of bh rows × all of K, a tile's boxes in k
// order; block b streams boxes [b·n/G, (b+1)·n/G) through a ring of `slots` boxes (thread 32 the producer, thread 0
// the consumer, which touches one word a box), the first before griddepcontrol.wait.
// wide (gemv_e4m3's shape of block): 160 threads, warp 4's lane 0 the producer, warps 0-3 all wait for every box
// and lane 0 of each frees it (an empty barrier of 4 arrivals).
__global__ void floor_tmap_kernel(const __grid_constant__ CUtensorMap tm, int64_t nbox, int kboxes, int bw, int bh,
                                  int slots, uint32_t* sink, int wide) {
  namespace dd = deepinfer::cuda::detail;
  extern __shared__ __align__(1024) uint8_t ft_smem[];
  __shared__ __align__(8) uint64_t full[16], empty[16];
  uint8_t* const ring = ft_smem + ((1024 - (dd::smem_u32(ft_smem) & 1023)) & 1023);
  const int box = bw * bh;
  const int64_t c0 = nbox * blockIdx.x / gridDim.x, c1 = nbox * (blockIdx.x + 1) / gridDim.x, n = c1 - c0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i)
      dd::mbar_init(dd::smem_u32(&full[i]), 1), dd::mbar_init(dd::smem_u32(&empty[i]), wide ? 4 : 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wide && threadIdx.x < 128) {  // gemv_e4m3's consumers
    asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory");
    uint32_t acc = 0;
    for (int64_t q = 0; q < n; ++q) {
      const int sl = (int)(q % slots);
      dd::mbar_wait(dd::smem_u32(&full[sl]), (uint32_t)((q / slots) & 1));
      acc ^= *reinterpret_cast<const uint32_t*>(ring + (size_t)sl * box + 4 * (threadIdx.x & 31));
      __syncwarp();
      if ((threadIdx.x & 31) == 0) dd::mbar_arrive(dd::smem_u32(&empty[sl]));
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
    return;
  }
  if (threadIdx.x == (wide ? 128 : 32)) {
    for (int64_t q = 0; q < n; ++q) {
      const int sl = (int)(q % slots);
      if (q >= slots) dd::mbar_wait(dd::smem_u32(&empty[sl]), (uint32_t)((q / slots - 1) & 1));
      const uint32_t bar = dd::smem_u32(&full[sl]);
      dd::mbar_expect(bar, (uint32_t)box);
      const int64_t b = c0 + q, tile = b / kboxes, kb = b - tile * kboxes;
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
              dd::smem_u32(ring + (size_t)sl * box)),
          "l"(reinterpret_cast<uint64_t>(&tm)), "r"((int)(kb * bw)), "r"((int)(tile * bh)), "r"(bar)
          : "memory");
      if (q + 1 == std::min<int64_t>(slots, n)) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
  } else if (threadIdx.x == 0) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    uint32_t acc = 0;
    for (int64_t q = 0; q < n; ++q) {
      const int sl = (int)(q % slots);
      dd::mbar_wait(dd::smem_u32(&full[sl]), (uint32_t)((q / slots) & 1));
      acc ^= *reinterpret_cast<const uint32_t*>(ring + (size_t)sl * box);
      dd::mbar_arrive(dd::smem_u32(&empty[sl]));
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
  }
  if (threadIdx.x != (wide ? 128 : 32)) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// extra: bytes of shared memory beyond the ring (gemv_e4m3 has ~9–20 KB more than its ring).
Result floor_tmap_case(int64_t N, int64_t K, int bw, int bh, int ring, int l2promo, int wide = 0, int extra = 0) {
  Result res;
  const int64_t bytes = N * K;
  const int copies = (int)std::min<int64_t>(64, (256ll << 20) / bytes + 1);
  const int64_t str = (bytes + 4095) / 4096 * 4096;
  DBuf dw = dalloc(copies * str, "stream"), dsink = dalloc(16, "sink");
  fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * str, 4321, 0, 0);
  CK(cudaDeviceSynchronize());
  std::vector<CUtensorMap> tms(copies);
  for (int c = 0; c < copies; ++c) {
    const uint64_t dims[2] = {(uint64_t)K, (uint64_t)N}, strides[1] = {(uint64_t)K};
    const uint32_t box[2] = {(uint32_t)bw, (uint32_t)bh};
    const cudaError_t e = dc::tensor_map_u8(&tms[c], dw.as<uint8_t>() + c * str, 2, dims, strides, box,
                                            bw == 128 ? 128 : bw == 64 ? 64 : 0, l2promo);
    if (e != cudaSuccess) {
      expect_true(res, false, std::string("tensor_map_u8 failed: ") + cudaGetErrorString(e));
      return res;
    }
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int boxb = bw * bh, slots = std::min(16, ring / boxb);
  CK(cudaFuncSetAttribute(floor_tmap_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, slots * boxb + 1024 + extra));
  const int kboxes = (int)(K / bw);
  const int64_t nbox = (N / bh) * kboxes;
  int it = 0;
  auto launch = [&](cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)std::min<int64_t>(sms, nbox));
    cfg.blockDim = dim3(wide ? 160 : 64);
    cfg.dynamicSmemBytes = (size_t)slots * boxb + 1024 + extra;
    cfg.stream = st;
    CK(cudaLaunchKernelEx(&cfg, floor_tmap_kernel, tms[it++ % copies], nbox, kboxes, bw, bh, slots, dsink.as<uint32_t>(),
                          wide));
  };
  const int n = (int)((std::max(32, copies) + copies - 1) / copies * copies);
  res.graph_us = time_graph_us(launch, n, true);
  res.us = res.graph_us;
  res.bytes = (double)bytes;
  char buf[160];
  snprintf(buf, sizeof buf, "graph of %d (programmatic edges), %d slots of %d B, %d copies rotated ", n, slots, boxb, copies);
  res.detail += buf;
  return res;
}

// bytes = 0: an empty kernel (one block). pdl: launched with programmatic stream serialization, so the
// graph's edges are programmatic (as in the model's step graphs); early: loads before the wait.
Result floor_case(int64_t bytes, bool pdl, bool early) {
  Result res;
  const int copies = bytes ? (int)std::min<int64_t>(64, (256ll << 20) / bytes + 1) : 1;
  const int64_t str = (bytes + 255) / 256 * 256;
  DBuf dw = dalloc(std::max<int64_t>(copies * str, 256), "stream"), dsink = dalloc(16, "sink");
  if (bytes) fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * str, 1234, 0, 0);
  CK(cudaDeviceSynchronize());
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t n16 = bytes / 16;
  const unsigned blocks = bytes ? (unsigned)std::min<int64_t>(4 * sms, std::max<int64_t>(1, (n16 + 255) / 256)) : 1;
  int it = 0;
  auto launch = [&](cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(bytes ? 256 : 32);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    const uint4* w = reinterpret_cast<const uint4*>(dw.as<uint8_t>() + (it++ % copies) * str);
    CK(bytes ? cudaLaunchKernelEx(&cfg, floor_stream_kernel, w, n16, early, dsink.as<uint32_t>())
             : cudaLaunchKernelEx(&cfg, floor_empty_kernel));
  };
  const int n = (int)((std::max(32, copies) + copies - 1) / copies * copies);
  res.graph_us = time_graph_us(launch, n);
  res.us = res.graph_us;
  res.bytes = (double)bytes;
  char buf[128];
  snprintf(buf, sizeof buf, "graph of %d, %u blocks, %d copies rotated; graph/call %.2f us ", n, blocks, copies, res.graph_us);
  res.detail += buf;
  return res;
}

// floor_tiles_kernel's case: N × K bytes (weight copies rotated out of L2), 4 blocks of 256 threads an SM.
Result floor_tiles_case(int64_t N, int64_t K, int span, int order) {
  Result res;
  const int64_t bytes = N * K;
  const int copies = (int)std::min<int64_t>(64, (256ll << 20) / bytes + 1);
  DBuf dw = dalloc(copies * bytes, "tiles"), dsink = dalloc(16, "sink");
  fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * bytes, 4321, 0, 0);
  CK(cudaDeviceSynchronize());
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int it = 0;
  auto launch = [&](cudaStream_t st) {
    floor_tiles_kernel<<<4 * sms, 256, 0, st>>>(dw.as<uint8_t>() + (it++ % copies) * bytes, N, K, span, order,
                                                dsink.as<uint32_t>());
    CK(cudaGetLastError());
  };
  const int n = (int)((std::max(32, copies) + copies - 1) / copies * copies);
  res.graph_us = time_graph_us(launch, n);
  res.us = res.graph_us;
  res.bytes = (double)bytes;
  char buf[128];
  snprintf(buf, sizeof buf, "graph of %d, %d blocks x 256, %d copies rotated ", n, 4 * sms, copies);
  res.detail += buf;
  return res;
}

// A grouped GEMV's fused SwiGLU (S slot rows of N = 2I gate|up columns) against swiglu_clamp applied to
// its unfused output, bitwise; the act rows' padding (lda > I) must stay untouched and some gate/up value
// must reach the clamp (else the check proves little). run(fuse, limit, y, ldy) launches the GEMV.
void check_fused_swiglu(Result& res, int64_t S, int64_t N, int64_t lda, float lim,
                        const std::function<cudaError_t(bool, float, float*, int64_t)>& run) {
  const int64_t I = N / 2;
  DBuf dgu = dalloc(S * N * 4, "gu"), dref = dalloc(S * I * 4, "act_ref"), dact = dalloc(S * lda * 4, "act");
  poison(dact);
  CK(run(false, 0.0f, dgu.as<float>(), N));
  CK(dc::swiglu_clamp(dgu.as<float>(), S, I, lim, nullptr, dref.as<float>(), nullptr, 0));
  CK(run(true, lim, dact.as<float>(), lda));
  auto ar = down<float>(dref, S * I), ag = down<float>(dact, S * lda), gu = down<float>(dgu, S * N);
  bool eq = true, pad_ok = true;
  int64_t clamped = 0;
  for (int64_t j = 0; j < S; ++j) {
    eq &= rows_bitwise_equal(ar.data() + j * I, ag.data() + j * lda, I);
    if (j + 1 < S) pad_ok &= pad_untouched(ag.data() + j * lda, I, lda);
    for (int64_t c = 0; c < N; ++c) clamped += std::fabs(gu[j * N + c]) > lim;
  }
  expect_true(res, eq, "fused swiglu != swiglu_clamp(gu)");
  expect_true(res, pad_ok, "act row padding written");
  expect_true(res, clamped > 0, "no value reached the clamp (test too weak)");
  if (eq) res.detail += "fused swiglu == swiglu_clamp (bitwise) ";
}

// Grouped: random routing with repeats (distinct experts within a token, as moe_route gives); NMSE
// against the f64 reference; every slot bitwise equal to gemv_q of its row alone with its expert; with
// swiglu, the fused act bitwise equal to swiglu_clamp applied to the unfused output.
Result gemv_grouped_case(dc::WFmt fmt, int64_t T, int topk, int E, int64_t N, int64_t K, bool per_slot, bool swiglu,
                         const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * topk, I = N / 2;
  const float lim = 1.0f;
  std::vector<HostQ> qs;
  for (int e = 0; e < E; ++e) qs.push_back(make_hostq(r, fmt, N, K, 0));
  const int64_t wstr = ((int64_t)qs[0].w.size() + 15) / 16 * 16, sstr = ((int64_t)qs[0].s.size() + 15) / 16 * 16;
  std::vector<uint8_t> wall(E * wstr, 0), sall(E * sstr, 0);
  for (int e = 0; e < E; ++e) {
    memcpy(wall.data() + e * wstr, qs[e].w.data(), qs[e].w.size());
    if (sstr) memcpy(sall.data() + e * sstr, qs[e].s.data(), qs[e].s.size());
  }
  std::vector<int32_t> sel(S);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    for (int k = 0; k < topk; ++k) {
      std::swap(ids[k], ids[k + r.range(0, E - k)]);
      sel[t * topk + k] = ids[k];
    }
  }
  const int64_t nx = per_slot ? S : T, ldx = K + 4, ldy = N + 4, lda = I + 4;
  std::vector<float> x = randn(r, nx * ldx);
  DBuf dw = dup(wall, "w_experts"), ds, dx = dup(x, "x"), dsel = dup(sel, "sel"), dy = dalloc(S * ldy * 4, "y"),
       dy1 = dalloc(ldy * 4, "y_alone");
  if (sstr) ds = dup(sall, "s_experts");
  const dc::WeightRef W{fmt, dw.p(), sstr ? ds.p() : nullptr, qs[0].ldws};
  auto We = [&](int e) { return dc::WeightRef{fmt, dw.as<uint8_t>() + e * wstr, sstr ? ds.as<uint8_t>() + e * sstr : nullptr, qs[0].ldws}; };
  poison(dy);
  CK(dc::gemv_q_grouped(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, false, 0.0f,
                        dy.as<float>(), ldy, 0));
  auto yg = down<float>(dy, S * ldy);
  std::vector<int64_t> all(N);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> yc, yr;
  std::vector<double> yd;
  bool inv_ok = true;
  for (int64_t j = 0; j < S; ++j) {
    const int64_t row = per_slot ? j : j / topk;
    gemv_ref_rows(qs[sel[j]], x.data() + row * ldx, all, yd);
    for (int64_t n = 0; n < N; ++n) yc.push_back(yg[j * ldy + n]), yr.push_back((float)yd[n]);
    poison(dy1);
    CK(dc::gemv_q(dx.as<float>() + row * ldx, 1, K, ldx, We(sel[j]), N, dy1.as<float>(), ldy, 0));
    auto y1 = down<float>(dy1, N);
    inv_ok &= rows_bitwise_equal(y1.data(), yg.data() + j * ldy, N);
  }
  expect_nmse(res, "y", yc, yr, 1e-6);
  expect_true(res, inv_ok, "a slot differs from gemv_q of its row alone");
  if (inv_ok) res.detail += "slots == gemv_q alone (bitwise) ";
  if (swiglu)
    check_fused_swiglu(res, S, N, lda, lim, [&](bool fuse, float limit, float* y, int64_t ldy) {
      return dc::gemv_q_grouped(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, fuse,
                                limit, y, ldy, 0);
    });
  return res;
}

// moe_gemv2 (fp4 routed experts at decode). sel_mode 0: K distinct experts a token, uniform over E
// (small E: experts shared by many tokens); 1: every token picks experts 0..topk−1 (runs of T slots);
// 2: experts drawn with repeats inside a token too (an expert has more slots than the run cap: runs of
// mmr). Checked: NMSE against the f64 reference (all rows, or 256 spread over N for the V4-Flash shapes),
// y's row padding untouched, every token bitwise equal to itself launched alone (T = 1, its own routing:
// a token's result does not depend on the other tokens), and with swiglu the fused act bitwise equal to
// swiglu_clamp of the unfused output (the clamp reached).
// ver 6: moe_gemv2_rows (one bulk copy a row, padded rows) the same way; ver 7 / 8: moe_gemv2_early with
// early = 2 / 1 (work before the PDL wait; outside a graph only the order changes) the same way.
using MoeGemv = cudaError_t (*)(const float*, int64_t, bool, const int32_t*, int64_t, int, int64_t, dc::WeightRef, int64_t,
                                int64_t, int64_t, bool, float, float*, int64_t, cudaStream_t, const dc::GemvPlan*);
template <int Early>
cudaError_t moe_gemv2_early_n(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                              int64_t K, dc::WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                              float limit, float* y, int64_t ldy, cudaStream_t s, const dc::GemvPlan* plan) {
  return dc::moe_gemv2_early(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy,
                             Early, s, plan);
}
template <int Early>
cudaError_t moe_gemv2_fp8_n(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                            int64_t K, dc::WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                            float limit, float* y, int64_t ldy, cudaStream_t s, const dc::GemvPlan* plan) {
  return dc::moe_gemv2_fp8(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, Early,
                           s, plan);
}
// ver 10 / 11: moe_gemv2_fp8 with early = 0 / 2 (e4m3 x, wgmma): the same checks against an f64 reference on the
// quantized x (x per token and 128-k block → e4m3 · 2^e, host_quant_block), ver 11 bitwise ver 10, and ver 10 next to
// moe_gemv2 (bf16 x) by NMSE.
Result moe_gemv2_case(int64_t T, int topk, int E, int64_t N, int64_t K, bool per_slot, bool swiglu, int variant,
                      int sel_mode, const std::string& name, int ver = 2) {
  const bool f8 = ver >= 10;
  const MoeGemv gemv = ver == 6    ? dc::moe_gemv2_rows
                       : ver == 7  ? moe_gemv2_early_n<2>
                       : ver == 8  ? moe_gemv2_early_n<1>
                       : ver == 10 ? moe_gemv2_fp8_n<0>
                       : ver == 11 ? moe_gemv2_fp8_n<2>
                                   : dc::moe_gemv2;
  const MoeGemv base = f8 ? moe_gemv2_fp8_n<0> : dc::moe_gemv2;
  Rng r = rng_for(name);
  Result res;
  const dc::WFmt fmt = dc::WFmt::FP4_B32;
  const int64_t S = T * topk, I = N / 2;
  const float lim = 1.0f;
  std::vector<HostQ> qs;
  for (int e = 0; e < E; ++e) qs.push_back(make_hostq(r, fmt, N, K, variant));
  const int64_t wstr = ((int64_t)qs[0].w.size() + 15) / 16 * 16, sstr = ((int64_t)qs[0].s.size() + 15) / 16 * 16;
  std::vector<uint8_t> wall(E * wstr, 0), sall(E * sstr, 0);
  for (int e = 0; e < E; ++e) {
    memcpy(wall.data() + e * wstr, qs[e].w.data(), qs[e].w.size());
    memcpy(sall.data() + e * sstr, qs[e].s.data(), qs[e].s.size());
  }
  std::vector<int32_t> sel(S);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    for (int k = 0; k < topk; ++k) {
      if (sel_mode == 0) std::swap(ids[k], ids[k + r.range(0, E - k)]);
      sel[t * topk + k] = sel_mode == 2 ? r.range(0, E) : ids[k];
    }
  }
  const int64_t nx = per_slot ? S : T, ldx = K + 4, ldy = N + 4, lda = I + 4;
  std::vector<float> x = randn(r, nx * ldx);
  DBuf dw = dup(wall, "w_experts"), ds = dup(sall, "s_experts"), dx = dup(x, "x"), dsel = dup(sel, "sel"),
       dy = dalloc(S * ldy * 4, "y"), dy1 = dalloc(topk * ldy * 4, "y_token_alone");
  const dc::WeightRef W{fmt, dw.p(), ds.p(), 0};
  expect_true(res, (f8 ? dc::moe_gemv2_fp8_ok : dc::moe_gemv2_ok)(W, T, topk, N, K, wstr, sstr),
              "_ok refuses the shape");
  poison(dy);
  CK(gemv(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, false, 0.0f, dy.as<float>(), ldy,
          0, nullptr));
  auto yg = down<float>(dy, S * ldy);
  if (ver != 2 && ver != 10) {  // moe_gemv2 (fp8: moe_gemv2_fp8) on the same inputs: bitwise the same rows
    DBuf d2 = dalloc(S * ldy * 4, "y_moe_gemv2");
    poison(d2);
    CK(base(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, false, 0.0f,
            d2.as<float>(), ldy, 0, nullptr));
    auto y2 = down<float>(d2, S * ldy);
    bool same = true;
    for (int64_t j = 0; j < S; ++j) same &= rows_bitwise_equal(y2.data() + j * ldy, yg.data() + j * ldy, N);
    expect_true(res, same, f8 ? "early 2 != moe_gemv2_fp8 early 0 (bitwise)" : "variant != moe_gemv2 (bitwise)");
    if (same) res.detail += f8 ? "== early 0 (bitwise) " : "== moe_gemv2 (bitwise) ";
  }
  {  // (every version)
    DBuf d2 = dalloc(S * ldy * 4, "y_2blocks");
    std::vector<float> y2;
    bool same = true;
    // a grid of 2 blocks: each block walks many runs (x restaged at run changes, shared x buffers reused)
    dc::GemvPlan two;
    two.sms = 2;
    poison(d2);
    CK(gemv(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, false, 0.0f,
            d2.as<float>(), ldy, 0, &two));
    y2 = down<float>(d2, S * ldy);
    same = true;
    for (int64_t j = 0; j < S; ++j) same &= rows_bitwise_equal(y2.data() + j * ldy, yg.data() + j * ldy, N);
    expect_true(res, same, "2 blocks differ from the full grid");
    if (same) res.detail += "2 blocks == 132 (bitwise) ";
  }
  const std::vector<int64_t> rows_n = reference_rows(N, K);
  // fp8: the reference takes x as the kernel quantizes it (e4m3 · 2^e per row and 128-k block: exact in bf16)
  std::vector<float> xq(x);
  if (f8)
    for (int64_t m = 0; m < nx; ++m)
      for (int64_t kb = 0; kb < K / 128; ++kb) {
        uint8_t q[128];
        const float sc = host_quant_block(&x[m * ldx + kb * 128], q);
        for (int i = 0; i < 128; ++i) xq[m * ldx + kb * 128 + i] = e4m3_val(q[i]) * sc;
      }
  std::vector<float> yc, yr;
  std::vector<double> yd;
  bool pad_ok = true;
  for (int64_t j = 0; j < S; ++j) {
    gemv_ref_rows(qs[sel[j]], xq.data() + (per_slot ? j : j / topk) * ldx, rows_n, yd);
    for (size_t i = 0; i < rows_n.size(); ++i) yc.push_back(yg[j * ldy + rows_n[i]]), yr.push_back((float)yd[i]);
    if (j + 1 < S) pad_ok &= pad_untouched(yg.data() + j * ldy, N, ldy);
  }
  expect_nmse(res, f8 ? "y (vs f64 on the e4m3 x)" : "y", yc, yr, f8 ? 1e-7 : 1e-6);
  expect_true(res, pad_ok, "y row padding written");
  if (ver == 10) {  // next to the bf16-x kernel: the e4m3 x's own error
    DBuf d2 = dalloc(S * ldy * 4, "y_moe_gemv2");
    CK(dc::moe_gemv2(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, false, 0.0f,
                     d2.as<float>(), ldy, 0));
    auto y2 = down<float>(d2, S * ldy);
    std::vector<float> a, b;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t n = 0; n < N; ++n) a.push_back(yg[j * ldy + n]), b.push_back(y2[j * ldy + n]);
    expect_nmse(res, "vs moe_gemv2 (bf16 x)", a, b, 5e-3);
  }
  bool inv_ok = true;
  for (int64_t t = 0; t < T; ++t) {
    poison(dy1);
    CK(gemv(dx.as<float>() + (per_slot ? t * topk : t) * ldx, ldx, per_slot, dsel.as<int32_t>() + t * topk, 1, topk, K, W,
            wstr, sstr, N, false, 0.0f, dy1.as<float>(), ldy, 0, nullptr));
    auto y1 = down<float>(dy1, topk * ldy);
    for (int k = 0; k < topk; ++k) inv_ok &= rows_bitwise_equal(y1.data() + k * ldy, yg.data() + (t * topk + k) * ldy, N);
  }
  expect_true(res, inv_ok, "a token differs from itself launched alone");
  if (inv_ok) res.detail += "tokens alone == in batch (bitwise) ";
  if (swiglu)
    check_fused_swiglu(res, S, N, lda, lim, [&](bool fuse, float limit, float* y, int64_t ldy) {
      return gemv(dx.as<float>(), ldx, per_slot, dsel.as<int32_t>(), T, topk, K, W, wstr, sstr, N, fuse, limit, y, ldy, 0,
                  nullptr);
    });
  return res;
}

// Shapes moe_gemv2 does not take: cudaErrorNotSupported (the backend then takes gemv_q_grouped).
Result moe_gemv2_unsupported_case() {
  const MoeGemv gemv = dc::moe_gemv2;
  Result res;
  DBuf dw = dalloc(1 << 20, "w"), ds = dalloc(1 << 16, "s"), dx = dalloc(1 << 16, "x"), dy = dalloc(1 << 16, "y"),
       dsel = dalloc(1024, "sel");
  const dc::WeightRef W{dc::WFmt::FP4_B32, dw.p(), ds.p(), 0}, W8{dc::WFmt::FP8_B128, dw.p(), ds.p(), 4};
  auto call = [&](dc::WeightRef w, int64_t T, int topk, int64_t N, int64_t K) {
    return gemv(dx.as<float>(), K, false, dsel.as<int32_t>(), T, topk, K, w, 1 << 14, 1 << 10, N, false, 0.0f,
                dy.as<float>(), N, 0, nullptr);
  };
  expect_true(res, call(W8, 1, 6, 256, 512) == cudaErrorNotSupported, "fp8 accepted");
  expect_true(res, call(W, 1, 6, 48, 512) == cudaErrorNotSupported, "N % 32 != 0 accepted");
  expect_true(res, call(W, 1, 6, 256, 640) == cudaErrorNotSupported, "K % 512 != 0 accepted");
  expect_true(res, call(W, 11, 6, 256, 512) == cudaErrorNotSupported, "66 slots accepted");
  {  // moe_gemv2_fp8: K = 4608 at T = 3 fits moe_gemv2's ring but not beside kernel<4>'s B operands
    expect_true(res, dc::moe_gemv2_ok(W, 3, 6, 256, 4608, 1 << 14, 1 << 10) &&
                         !dc::moe_gemv2_fp8_ok(W, 3, 6, 256, 4608, 1 << 14, 1 << 10) &&
                         dc::moe_gemv2_fp8(dx.as<float>(), 4608, false, dsel.as<int32_t>(), 3, 6, 4608, W, 1 << 14,
                                           1 << 10, 256, false, 0.0f, dy.as<float>(), 256, 0, 0) == cudaErrorNotSupported,
                "moe_gemv2_fp8 accepted K = 4608 at T = 3");
    expect_true(res, dc::moe_gemv2_fp8(dx.as<float>(), 512, false, dsel.as<int32_t>(), 1, 6, 512, W8, 1 << 14, 1 << 10,
                                       256, false, 0.0f, dy.as<float>(), 256, 0, 0) == cudaErrorNotSupported,
                "moe_gemv2_fp8 accepted fp8 weights");
  }
  cudaGetLastError();
  return res;
}

// gemv_e4m3 (the decode fp8 linear on e4m3 wgmma, x quantized per token and 128-k block): G groups of N × K fp8
// weights (G = 1: a plain linear; G > 1: linear_groups' layout at a byte stride that is not a multiple of 256),
// checked: NMSE against an f64 reference on the quantized x (host_quant_block: e4m3 · 2^e, exact in bf16), y's
// row padding untouched, every row launched alone bitwise equal to the same row in the M-row launch (batch
// invariance; M > 8 crosses launches of 8), a second launch bitwise equal to the first (the split counters
// left at zero), a plan for another SM count (another split of K: other bits) close by NMSE, next to v6 (bf16 x)
// by NMSE (the e4m3 x's own error), and with swiglu the fused act bitwise swiglu_clamp of the unfused output.
Result gemv_e4m3_case(int64_t M, int G, int64_t N, int64_t K, bool swiglu, int variant, int sms, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const dc::WFmt fmt = dc::WFmt::FP8_B128;
  std::vector<HostQ> qs;
  for (int g = 0; g < G; ++g) qs.push_back(make_hostq(r, fmt, N, K, variant));
  const int64_t wstr = G > 1 ? ((int64_t)qs[0].w.size() + 255) / 256 * 256 + 16 : (int64_t)qs[0].w.size(),
                sstr = ((int64_t)qs[0].s.size() + 15) / 16 * 16 + 4;
  std::vector<uint8_t> wall(G * wstr, 0), sall(G * sstr, 0);
  for (int g = 0; g < G; ++g) {
    memcpy(wall.data() + g * wstr, qs[g].w.data(), qs[g].w.size());
    memcpy(sall.data() + g * sstr, qs[g].s.data(), qs[g].s.size());
  }
  const int64_t ldx = G * K + 4, ldy = G * N + 3;
  std::vector<float> x = randn(r, M * ldx);
  if (variant == 3)  // x's 128-k blocks scaled by 2^-40..2^40: the scale exponents far from 0
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k0 = 0; k0 < G * K; k0 += 128) {
        const float f = std::ldexp(1.0f, r.range(-40, 41));
        for (int64_t k = k0; k < k0 + 128; ++k) x[m * ldx + k] *= f;
      }
  DBuf dw = dup(wall, "w"), ds = dup(sall, "w_scale"), dx = dup(x, "x"), dy = dalloc(M * ldy * 4, "y"),
       dy1 = dalloc(ldy * 4, "y_alone"), dy2 = dalloc(M * ldy * 4, "y_again");
  const dc::WeightRef W{fmt, dw.p(), ds.p(), qs[0].ldws};
  dc::GemvE4m3Plan pl;
  CK(dc::gemv_e4m3_plan(W, N, K, G, wstr, sstr, false, &pl, sms));
  char buf[160];
  snprintf(buf, sizeof buf, "(sp=%d P=%d ks=%d ring=%d smem=%zu) ", pl.sp, pl.P, pl.ks, pl.ring, pl.smem);
  res.detail += buf;
  DBuf work = dalloc(pl.work_bytes, "work");
  CK(cudaMemset(work.p(), 0, pl.work_bytes));
  auto run = [&](const dc::GemvE4m3Plan& p, const float* xp, int64_t M_, float* yp, float lim = 0.0f) {
    return dc::gemv_e4m3(p, xp, M_, ldx, yp, ldy, lim, work.p(), 0);
  };
  poison(dy);
  CK(run(pl, dx.as<float>(), M, dy.as<float>()));
  auto yg = down<float>(dy, M * ldy);
  // the reference: x as the kernel quantizes it
  std::vector<float> xq(x);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kb = 0; kb < G * K / 128; ++kb) {
      uint8_t q[128];
      const float sc = host_quant_block(&x[m * ldx + kb * 128], q);
      for (int i = 0; i < 128; ++i) xq[m * ldx + kb * 128 + i] = e4m3_val(q[i]) * sc;
    }
  const std::vector<int64_t> rows = reference_rows(N, K);
  std::vector<float> yc, yr;
  std::vector<double> yd;
  bool pad_ok = true, inv_ok = true;
  for (int64_t m = 0; m < M; ++m) {
    for (int g = 0; g < G; ++g) {
      gemv_ref_rows(qs[g], xq.data() + m * ldx + g * K, rows, yd);
      for (size_t i = 0; i < rows.size(); ++i) yc.push_back(yg[m * ldy + g * N + rows[i]]), yr.push_back((float)yd[i]);
    }
    if (m + 1 < M) pad_ok &= pad_untouched(yg.data() + m * ldy, G * N, ldy);
    poison(dy1);
    CK(run(pl, dx.as<float>() + m * ldx, 1, dy1.as<float>()));
    auto y1 = down<float>(dy1, G * N);
    inv_ok &= rows_bitwise_equal(y1.data(), yg.data() + m * ldy, G * N);
  }
  expect_nmse(res, "y (vs f64 on the e4m3 x)", yc, yr, 1e-6);
  expect_true(res, pad_ok, "y row padding written");
  expect_true(res, inv_ok, "batch invariance: a row alone differs from the same row in the batch");
  if (inv_ok) res.detail += "rows alone == in batch (bitwise) ";
  {
    poison(dy2);
    CK(run(pl, dx.as<float>(), M, dy2.as<float>()));
    auto y2 = down<float>(dy2, M * ldy);
    bool same = true;
    for (int64_t m = 0; m < M; ++m) same &= rows_bitwise_equal(y2.data() + m * ldy, yg.data() + m * ldy, G * N);
    expect_true(res, same, "a second launch differs from the first");
    if (same) res.detail += "relaunch == (bitwise) ";
  }
  {  // another SM count: another split (and grid); the same sums up to rounding
    dc::GemvE4m3Plan p2;
    CK(dc::gemv_e4m3_plan(W, N, K, G, wstr, sstr, false, &p2, sms == 0 ? 7 : 0));
    DBuf w2 = dalloc(p2.work_bytes, "work2");
    CK(cudaMemset(w2.p(), 0, p2.work_bytes));
    poison(dy2);
    CK(dc::gemv_e4m3(p2, dx.as<float>(), M, ldx, dy2.as<float>(), ldy, 0.0f, w2.p(), 0));
    auto y2 = down<float>(dy2, M * ldy);
    std::vector<float> a, b;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < G * N; ++n) a.push_back(y2[m * ldy + n]), b.push_back(yg[m * ldy + n]);
    snprintf(buf, sizeof buf, "vs sp=%d P=%d", p2.sp, p2.P);
    expect_nmse(res, buf, a, b, 1e-9);
  }
  if (variant != 3) {  // next to v6 (bf16 x)
    poison(dy2);
    if (G == 1) CK(dc::gemv_q_v6(dx.as<float>(), M, K, ldx, W, N, dy2.as<float>(), ldy, 0));
    else CK(dc::gemv_q_v6_groups(dx.as<float>(), M, K, ldx, W, wstr, sstr, G, N, dy2.as<float>(), ldy, 0));
    auto y2 = down<float>(dy2, M * ldy);
    std::vector<float> a, b;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < G * N; ++n) a.push_back(yg[m * ldy + n]), b.push_back(y2[m * ldy + n]);
    expect_nmse(res, "vs gemv_q_v6 (bf16 x)", a, b, 5e-3);
  }
  if (swiglu) {
    // the fused plan, and an unfused one with its split of K (the same sums: the fused act must be their swiglu)
    dc::GemvE4m3Plan ps, pu;
    CK(dc::gemv_e4m3_plan(W, N, K, 1, 0, 0, true, &ps, sms));
    CK(dc::gemv_e4m3_plan(W, N, K, 1, 0, 0, false, &pu, sms, ps.sp));
    DBuf wsw = dalloc(ps.work_bytes, "work_swiglu"), wun = dalloc(pu.work_bytes, "work_unfused");
    CK(cudaMemset(wsw.p(), 0, ps.work_bytes));
    CK(cudaMemset(wun.p(), 0, pu.work_bytes));
    check_fused_swiglu(res, M, N, N / 2 + 5, 1.0f, [&](bool fuse, float limit, float* y, int64_t ldy_) {
      return fuse ? dc::gemv_e4m3(ps, dx.as<float>(), M, ldx, y, ldy_, limit, wsw.p(), 0)
                  : dc::gemv_e4m3(pu, dx.as<float>(), M, ldx, y, ldy_, 0.0f, wun.p(), 0);
    });
  }
  return res;
}

// gemv_e4m3 timed (as gemv_perf_case: weight copies rotated past L2, from a graph with programmatic edges
// as in the model), with a plan a copy (the tensor map holds the address). swiglu: the fused shared w13.
Result gemv_e4m3_perf_case(int64_t M, int G, int64_t N, int64_t K, bool swiglu, const std::string& name, int ablate = 0,
                           int l2promo = -1) {
  Rng r = rng_for(name);
  Result res;
  const int64_t ldws = ((K / 128 + 3) / 4) * 4, wb = G * N * K, sb = G * ((N + 127) / 128) * ldws * 4;
  const int64_t wstr = (wb + 255) / 256 * 256, sstr = (sb + 255) / 256 * 256;
  const int copies = (int)std::min<int64_t>(64, std::max<int64_t>(1, (256ll << 20) / (wb + sb) + 1));
  DBuf dw = dalloc(copies * wstr, "w_copies");
  fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * wstr, r.next(), 0, 0x7f);
  std::vector<float> sc(copies * sstr / 4);
  for (auto& v : sc) v = std::ldexp(1.0f, r.range(-10, -6));
  DBuf ds = dup(sc, "w_scale_copies");
  CK(cudaGetLastError());
  const int64_t ldx = G * K, ldy = G * N;
  std::vector<float> x = randn(r, M * ldx);
  DBuf dx = dup(x, "x"), dy = dalloc(M * ldy * 4, "y");
  std::vector<dc::GemvE4m3Plan> pls(copies);
  for (int c = 0; c < copies; ++c) {
    const dc::WeightRef W{dc::WFmt::FP8_B128, dw.as<uint8_t>() + c * wstr, ds.as<uint8_t>() + c * sstr, ldws};
    CK(dc::gemv_e4m3_plan(W, N, K, G, N * K, ((N + 127) / 128) * ldws * 4, swiglu, &pls[c], 0, 0, l2promo));
    pls[c].ablate = ablate;
  }
  DBuf work = dalloc(pls[0].work_bytes, "work");
  CK(cudaMemset(work.p(), 0, pls[0].work_bytes));
  const float lim = swiglu ? 1.0f : 0.0f;
  int it = 0;
  auto call = [&](cudaStream_t st) {
    CK(dc::gemv_e4m3(pls[it++ % copies], dx.as<float>(), M, ldx, dy.as<float>(), swiglu ? N / 2 : ldy, lim, work.p(), st));
  };
  call(0);
  CK(cudaDeviceSynchronize());
  res.us = time_us([&] { call(0); });
  res.bytes = (double)(wb + sb) + M * G * K * 4.0 + M * G * N * 4.0;
  res.flops = 2.0 * M * G * N * K;
  const int n = (int)((std::max(20, copies) + copies - 1) / copies * copies);
  it = 0;
  res.graph_us = time_graph_us(call, n, true);
  char buf[160];
  snprintf(buf, sizeof buf, "(sp=%d P=%d ks=%d ring=%d; %d weight copies rotated; %.1f MB; graph of %d, programmatic) ",
           pls[0].sp, pls[0].P, pls[0].ks, pls[0].ring, copies, (wb + sb) / 1e6, n);
  res.detail += buf;
  return res;
}

// Grouped perf. routed: E = 256 experts (one copy: 2.2 GB / 1.1 GB), 16 routing sets rotated, bytes =
// the distinct experts each set reads. wo_a: E = 8 groups, sel[t, g] = g, x per slot; the 8 groups'
// weight (32 MB) rotated among copies. The swiglu case times the fused w13. kind: 0 gemv_q_grouped,
// 1 gemv_q_grouped_v3, 2 moe_gemv2 (fp4 only), 3 gemv_q_v6_groups (identity_sel, per_slot, E == topk only:
// linear_groups' layout), 5
// gemv_q_v8_groups (as 3), 6 moe_gemv2_rows (moe_gemv2 with one bulk copy a row: same bits), 7
// moe_gemv2_early as the model calls it (early 2 with the fused SwiGLU, else 1), 8 moe_gemv2 and 9 moe_gemv2_fp8 as 7, all timed
// in a graph with programmatic edges (each launch's routing and x are written before the chain: valid).
using GroupedGemv = cudaError_t (*)(const float*, int64_t, bool, const int32_t*, int64_t, int, int64_t, dc::WeightRef,
                                    int64_t, int64_t, int64_t, bool, float, float*, int64_t, cudaStream_t,
                                    const dc::GemvPlan*);
Result gemv_grouped_perf_case(dc::WFmt fmt, int64_t T, int topk, int E, int64_t N, int64_t K, bool per_slot,
                              bool swiglu, bool identity_sel, int kind, const std::string& name) {
  const bool v3 = kind == 1, v6 = kind == 3 || kind == 5;  // 5: gemv_q_v8_groups (as 3)
  const bool pdl = kind == 7 || kind == 8 || kind == 9;
  const GroupedGemv gemv = kind == 9 ? (swiglu ? moe_gemv2_fp8_n<2> : moe_gemv2_fp8_n<1>)
                           : kind == 6 ? dc::moe_gemv2_rows
                           : kind == 7 ? (swiglu ? moe_gemv2_early_n<2> : moe_gemv2_early_n<1>)
                           : kind == 2 || kind == 8 ? dc::moe_gemv2
                           : v3        ? dc::gemv_q_grouped_v3
                                       : dc::gemv_q_grouped;
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * topk;
  const int64_t ldws = fmt == dc::WFmt::FP8_B128 ? ((K / 128 + 3) / 4) * 4 : 0;
  const int64_t wb = fmt == dc::WFmt::BF16 ? N * K * 2 : fmt == dc::WFmt::FP8_B128 ? N * K : N * K / 2;
  const int64_t sb = fmt == dc::WFmt::FP8_B128 ? ((N + 127) / 128) * ldws * 4 : fmt == dc::WFmt::FP4_B32 ? N * K / 32 : 0;
  const int64_t wstr = (wb + 255) / 256 * 256, sstr = (sb + 255) / 256 * 256;
  const int copies = (int)std::min<int64_t>(64, std::max<int64_t>(1, (256ll << 20) / (E * (wb + sb)) + 1));
  DBuf dw = dalloc(copies * E * wstr, "w_experts"), ds;
  const uint64_t sd = r.next();
  fill_bytes<<<4096, 256>>>(dw.as<uint8_t>(), copies * E * wstr, sd, 0, fmt == dc::WFmt::FP8_B128 ? 0x7f : 0);
  if (fmt == dc::WFmt::FP8_B128) {
    std::vector<float> sc(copies * E * sstr / 4);
    for (auto& v : sc) v = std::ldexp(1.0f, r.range(-10, -6));
    ds = dup(sc, "s_experts");
  } else if (fmt == dc::WFmt::FP4_B32) {
    ds = dalloc(copies * E * sstr, "s_experts");
    fill_bytes<<<4096, 256>>>(ds.as<uint8_t>(), copies * E * sstr, sd + 3, 119, 4);
  }
  CK(cudaGetLastError());
  const int nsets = identity_sel ? 1 : 16;
  std::vector<int32_t> sel(nsets * S);
  double distinct = 0;
  for (int st = 0; st < nsets; ++st) {
    std::vector<char> hit(E, 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> ids(E);
      std::iota(ids.begin(), ids.end(), 0);
      for (int k = 0; k < topk; ++k) {
        if (!identity_sel) std::swap(ids[k], ids[k + r.range(0, E - k)]);
        sel[st * S + t * topk + k] = ids[k];
        hit[ids[k]] = 1;
      }
    }
    distinct += std::count(hit.begin(), hit.end(), 1);
  }
  distinct /= nsets;
  const int64_t nx = per_slot ? S : T, I = N / 2, ncol = swiglu ? I : N;
  std::vector<float> x = randn(r, nx * K);
  DBuf dx = dup(x, "x"), dsel = dup(sel, "sel_sets"), dy = dalloc(S * ncol * 4, "y"), dgu = dalloc(N * 4, "gu_alone"),
       da1 = dalloc(I * 4, "act_alone");
  auto W = [&](int c) { return dc::WeightRef{fmt, dw.as<uint8_t>() + c * E * wstr, ds.base ? ds.as<uint8_t>() + c * E * sstr : nullptr, ldws}; };
  dc::GemvPlan plan;
  CK(dc::gemv_q_plan(W(0), N, K, true, &plan));
  const dc::GemvPlan* pl = &plan;
  auto launch = [&](int c, int st, cudaStream_t stream = 0) {
    if (kind == 5)
      return dc::gemv_q_v8_groups(dx.as<float>(), T, K, topk * K, W(c), wstr, sstr, topk, N, dy.as<float>(), topk * N,
                                  stream, pl);
    if (v6)
      return dc::gemv_q_v6_groups(dx.as<float>(), T, K, topk * K, W(c), wstr, sstr, topk, N, dy.as<float>(), topk * N,
                                  stream, pl);
    return gemv(dx.as<float>(), K, per_slot, dsel.as<int32_t>() + st * S, T, topk, K, W(c), wstr, sstr, N, swiglu,
                10.0f, dy.as<float>(), ncol, stream, pl);
  };
  poison(dy);
  CK(launch(0, 0));
  auto yg = down<float>(dy, ncol);
  if (v6) {  // (another schedule than gemv_q alone: a sampled f64 check of slot 0 instead)
    HostQ q{fmt, N, K, ldws};
    q.w = down<uint8_t>(dw, wb);
    if (sb) q.s = down<uint8_t>(ds, sb);
    std::vector<int64_t> rows;
    for (int i = 0; i < 64; ++i) rows.push_back(std::min<int64_t>(N - 1, (N * i) / 64 + i % 7));
    std::vector<double> yd;
    gemv_ref_rows(q, x.data(), rows, yd);
    std::vector<float> yc, yr;
    for (size_t i = 0; i < rows.size(); ++i) yc.push_back(yg[rows[i]]), yr.push_back((float)yd[i]);
    expect_nmse(res, "slot 0 (64 rows)", yc, yr, 1e-6);
  } else {
    std::vector<float> y1;
    if (kind == 2 || kind >= 6) {
      // slot 0 of set 0 against token 0 launched alone (T = 1, its own routing), bitwise
      DBuf d1 = dalloc(topk * ncol * 4, "token0_alone");
      CK(gemv(dx.as<float>(), K, per_slot, dsel.as<int32_t>(), 1, topk, K, W(0), wstr, sstr, N, swiglu, 10.0f,
              d1.as<float>(), ncol, 0, nullptr));
      y1 = down<float>(d1, ncol);
    } else {
      // slot 0 of set 0 against gemv_q of its row alone (+ swiglu_clamp), bitwise
      const int e0 = sel[0];
      const dc::WeightRef We0{fmt, dw.as<uint8_t>() + e0 * wstr, ds.base ? ds.as<uint8_t>() + e0 * sstr : nullptr, ldws};
      CK((v3 ? dc::gemv_q_v3 : dc::gemv_q)(dx.as<float>(), 1, K, K, We0, N, dgu.as<float>(), N, 0, nullptr));
      if (swiglu) CK(dc::swiglu_clamp(dgu.as<float>(), 1, I, 10.0f, nullptr, da1.as<float>(), nullptr, 0));
      y1 = down<float>(swiglu ? da1 : dgu, ncol);
    }
    bool finite = true;
    for (float v : yg) finite &= std::isfinite(v);
    expect_true(res, finite && rows_bitwise_equal(yg.data(), y1.data(), ncol),
                kind == 2 || kind >= 6 ? "slot 0 != token 0 alone" : "slot 0 != gemv_q alone");
  }
  int it = 0;
  res.us = time_us([&] {
    const int i = it++;
    launch(i % copies, i % nsets);
  });
  res.bytes = distinct * (wb + sb) + nx * K * 4.0 + S * ncol * 4.0;
  res.flops = 2.0 * S * N * K;
  const int n = std::max(32, copies);
  it = 0;
  res.graph_us = time_graph_us(
      [&](cudaStream_t stream) {
        const int i = it++;
        CK(launch(i % copies, i % nsets, stream));
      },
      n, pdl);
  it = 0;
  res.host_us = host_us([&] {
    const int i = it++;
    launch(i % copies, i % nsets);
  });
  pl = nullptr;
  const double host_np = host_us([&] {
    const int i = it++;
    launch(i % copies, i % nsets);
  });
  char buf[160];
  snprintf(buf, sizeof buf, "(%.1f distinct experts a launch, %d copies, %d routing sets; host %.2f us/call, %.2f without plan; graph of %d) ",
           distinct, copies, nsets, res.host_us, host_np, n);
  res.detail += buf;
  return res;
}

// =================================================================================================
// Routed experts for T > 8 (moe_grouped.cu): parallel grouping, grouped expert GEMM, the moe_ffn path
// =================================================================================================
// Routing on the host: K distinct experts a token. skew 0: uniform over E. skew 1: expert E/3 in ~90 % of
// the tokens (at a random position of the token's K), the others from experts [0, E/8) only, so one
// expert has many rows (several tiles) and ≥ 3/4 of the experts have none.
std::vector<int32_t> make_sel(Rng& r, int64_t T, int K, int E, int skew) {
  std::vector<int32_t> sel(T * K);
  const int pool = skew ? std::max(E / 8, K) : E, hot = E / 3;
  std::vector<int32_t> ids(pool);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int k = 0; k < K; ++k) {
      std::swap(ids[k], ids[k + r.range(0, pool - k)]);
      sel[t * K + k] = ids[k];
    }
    if (skew && r.uni() < 0.9f && hot >= pool) sel[t * K + r.range(0, K)] = hot;
  }
  return sel;
}

// Host reference of moe_group's outputs.
struct HostGroup {
  std::vector<int32_t> offsets, perm, slot, tiles;  // tiles: {e, r0} pairs
};
HostGroup host_group(const std::vector<int32_t>& sel, int64_t T, int K, int E, int tile_m) {
  HostGroup h;
  const int64_t S = T * K;
  h.offsets.assign(E + 1, 0);
  for (int64_t i = 0; i < S; ++i) h.offsets[sel[i] + 1]++;
  for (int e = 0; e < E; ++e) h.offsets[e + 1] += h.offsets[e];
  h.perm.assign(S, -1), h.slot.assign(S, -1);
  std::vector<int32_t> fill(h.offsets.begin(), h.offsets.end() - 1);
  for (int64_t i = 0; i < S; ++i) {
    const int32_t r = fill[sel[i]]++;
    h.slot[i] = r, h.perm[r] = (int32_t)(i / K);
  }
  for (int e = 0; e < E; ++e)
    for (int32_t r = h.offsets[e]; r < h.offsets[e + 1]; r += tile_m) h.tiles.push_back(e), h.tiles.push_back(r);
  return h;
}

// moe_group_par against the host reference and against the single-block moe_group, exactly.
Result group_par_case(int64_t T, int K, int E, int tile_m, int skew, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * K, maxt = dc::moe_max_tiles(S, E, tile_m);
  auto sel = make_sel(r, T, K, E, skew);
  const HostGroup h = host_group(sel, T, K, E, tile_m);
  DBuf dsel = dup(sel, "sel"), doff = dalloc((E + 1) * 4, "offsets"), dperm = dalloc(S * 4, "perm"),
       dslot = dalloc(S * 4, "slot_row"), dtile = dalloc(maxt * 8, "tiles"), dnt = dalloc(4, "n_tiles"),
       dscr = dalloc(dc::moe_group_scratch_ints(S, E) * 4, "scratch"), doff1 = dalloc((E + 1) * 4, "offsets_1blk"),
       dperm1 = dalloc(S * 4, "perm_1blk"), dslot1 = dalloc(S * 4, "slot_1blk"), dtile1 = dalloc(maxt * 8, "tiles_1blk"),
       dnt1 = dalloc(4, "n_tiles_1blk");
  for (auto* b : {&doff, &dperm, &dslot, &dtile, &dnt, &dscr}) poison(*b);
  auto launch = [&] {
    return dc::moe_group_par(dsel.as<int32_t>(), T, K, E, tile_m, doff.as<int32_t>(), dperm.as<int32_t>(),
                             dslot.as<int32_t>(), dtile.as<int2>(), dnt.as<int32_t>(), dscr.as<int32_t>(), 0);
  };
  CK(launch());
  const int nt = down<int32_t>(dnt, 1)[0];
  expect_true(res, nt == (int)h.tiles.size() / 2, "n_tiles " + std::to_string(nt) + " != " + std::to_string(h.tiles.size() / 2));
  expect_true(res, down<int32_t>(doff, E + 1) == h.offsets, "offsets");
  expect_true(res, down<int32_t>(dperm, S) == h.perm, "perm_tok");
  expect_true(res, down<int32_t>(dslot, S) == h.slot, "slot_row");
  if (nt == (int)h.tiles.size() / 2) {
    auto tl = down<int32_t>(dtile, 2 * (size_t)nt);
    expect_true(res, tl == h.tiles, "tile_info");
  }
  // the single-block moe_group gives the same bits
  if (E <= 1024) {
    CK(dc::moe_group(dsel.as<int32_t>(), T, K, E, tile_m, doff1.as<int32_t>(), dperm1.as<int32_t>(),
                     dslot1.as<int32_t>(), dtile1.as<int2>(), dnt1.as<int32_t>(), 0));
    bool same = down<int32_t>(doff1, E + 1) == down<int32_t>(doff, E + 1) && down<int32_t>(dperm1, S) == down<int32_t>(dperm, S) &&
                down<int32_t>(dslot1, S) == down<int32_t>(dslot, S) && down<int32_t>(dnt1, 1) == down<int32_t>(dnt, 1);
    if (same && nt > 0) same = down<int32_t>(dtile1, 2 * (size_t)nt) == down<int32_t>(dtile, 2 * (size_t)nt);
    expect_true(res, same, "differs from moe_group");
    if (same) res.detail += "== moe_group (bitwise) ";
  }
  int mx = 0, empty = 0;
  for (int e = 0; e < E; ++e) mx = std::max(mx, h.offsets[e + 1] - h.offsets[e]), empty += h.offsets[e + 1] == h.offsets[e];
  char buf[96];
  snprintf(buf, sizeof buf, "(max rows %d, %d empty experts, %d tiles) ", mx, empty, nt);
  res.detail += buf;
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = S * 4.0 * 4 + (E + 1) * 4.0;
    res.graph_us = time_graph_us(
        [&](cudaStream_t st) {
          CK(dc::moe_group_par(dsel.as<int32_t>(), T, K, E, tile_m, doff.as<int32_t>(), dperm.as<int32_t>(),
                               dslot.as<int32_t>(), dtile.as<int2>(), dnt.as<int32_t>(), dscr.as<int32_t>(), st));
        },
        20);
  }
  return res;
}

// Stored-format expert weights on the device: E experts of [N, K] at wstr (scales at sstr) bytes.
__global__ void fill_wq(uint8_t* p, int64_t n, uint64_t seed, int fmt) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    if (fmt == 0) {  // bf16 element i (n = elements): ~ U(-1, 1)·0.05
      const float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
      reinterpret_cast<bf16*>(p)[i] = __float2bfloat16_rn(u * 0.05f);
    } else if (fmt == 1) {  // e4m3 byte, no NaN
      uint8_t b = (uint8_t)z;
      if ((b & 0x7f) == 0x7f) b ^= 1;
      p[i] = b;
    } else {
      p[i] = (uint8_t)z;  // two e2m1
    }
  }
}
struct DevExperts {
  dc::WFmt fmt;
  int64_t N, K, ldws, wb, sb, wstr, sstr;
  DBuf w, s;
  dc::WeightRef ref() const { return {fmt, w.p(), sb ? s.p() : nullptr, ldws}; }
  HostQ host(int e) const {  // expert e in HostQ form (the unpadded layout)
    HostQ q{fmt, N, K, ldws};
    q.w.resize(wb);
    CK(cudaMemcpy(q.w.data(), w.as<uint8_t>() + e * wstr, wb, cudaMemcpyDeviceToHost));
    if (sb) {
      q.s.resize(sb);
      CK(cudaMemcpy(q.s.data(), s.as<uint8_t>() + e * sstr, sb, cudaMemcpyDeviceToHost));
    }
    return q;
  }
};
// variant 2: large scales (fp8 2^8..2^10, fp4 e8m0 126..135) that take the two-multiply dequantization.
DevExperts make_dev_experts(Rng& r, dc::WFmt fmt, int E, int64_t N, int64_t K, int variant) {
  DevExperts d{fmt, N, K};
  d.ldws = fmt == dc::WFmt::FP8_B128 ? ((K / 128 + 3) / 4) * 4 : 0;
  d.wb = fmt == dc::WFmt::BF16 ? N * K * 2 : fmt == dc::WFmt::FP8_B128 ? N * K : N * K / 2;
  d.sb = fmt == dc::WFmt::FP8_B128 ? ((N + 127) / 128) * d.ldws * 4 : fmt == dc::WFmt::FP4_B32 ? N * K / 32 : 0;
  d.wstr = (d.wb + 255) / 256 * 256, d.sstr = (d.sb + 255) / 256 * 256;
  d.w = dalloc(E * d.wstr, "w_experts");
  const uint64_t sd = r.next();
  if (fmt == dc::WFmt::BF16) fill_wq<<<4096, 256>>>(d.w.as<uint8_t>(), E * d.wstr / 2, sd, 0);
  else fill_wq<<<4096, 256>>>(d.w.as<uint8_t>(), E * d.wstr, sd, fmt == dc::WFmt::FP8_B128 ? 1 : 2);
  if (fmt == dc::WFmt::FP8_B128) {
    std::vector<float> sc(E * d.sstr / 4);
    for (auto& v : sc) v = variant == 2 ? std::ldexp(1.0f, r.range(8, 11)) : std::ldexp(1.0f, r.range(-12, -7));
    d.s = dup(sc, "s_experts");
  } else if (fmt == dc::WFmt::FP4_B32) {
    d.s = dalloc(E * d.sstr, "s_experts");
    // variant 3 (fp8 expert kernel): e8m0 110..124, a row block's groups up to 14 binades apart (its exact limit)
    fill_bytes<<<4096, 256>>>(d.s.as<uint8_t>(), E * d.sstr, sd + 5, variant == 2 ? 126 : variant == 3 ? 110 : 119,
                              variant == 2 ? 10 : variant == 3 ? 15 : 4);
  }
  CK(cudaGetLastError());
  return d;
}
std::vector<float> dequant_all(const HostQ& q) {
  std::vector<float> o(q.N * q.K);
  for (int64_t n = 0; n < q.N; ++n) hostq_row(q, n, o.data() + n * q.K);
  return o;
}

// The CudaBackend::moe_ffn path for T > 8 (moe_group_par → bf16 h → w13 + fused SwiGLU → w2 → combine), on
// device buffers that the case owns (guarded, poisoned).
struct GroupedRun {
  int64_t T, S, E, D, I, maxt;
  int K, tm;
  bool fp8;  // the fp8 expert kernels (moe_fp8.cu: tile 128, e4m3 x and act)
  int fk = 2;  // which fp8 expert kernel (moe_expert_gemm_fp8's kernel: 0 register-A on a grid, 1 warp-specialized,
               // 2 register-A persistent, the backend's)
  DBuf off, perm, slot, tiles, nt, scr, hb, act, ye, out, xq, xs, aq, as, ctr;
};
GroupedRun grouped_alloc(int64_t T, int K, int E, int64_t D, int64_t I, int tm, bool fp8 = false) {
  GroupedRun g{T, T * K, E, D, I, 0, K, tm, fp8};
  if (fp8) {
    g.xq = dalloc(T * D, "x_e4m3"), g.xs = dalloc(T * (D / 128) * 4, "x_scales");
    g.aq = dalloc(g.S * I, "act_e4m3"), g.as = dalloc(g.S * (I / 128) * 4, "act_scales");
  }
  g.maxt = dc::moe_max_tiles(g.S, E, tm);
  g.off = dalloc((E + 1) * 4, "offsets"), g.perm = dalloc(g.S * 4, "perm"), g.slot = dalloc(g.S * 4, "slot_row");
  g.tiles = dalloc(g.maxt * 8, "tiles"), g.nt = dalloc(4, "n_tiles");
  g.scr = dalloc(dc::moe_group_scratch_ints(g.S, E) * 4, "group_scratch");
  g.ctr = dup(std::vector<int32_t>{0, 0}, "persistent_counter");
  g.hb = dalloc(T * D * 2, "h_bf16"), g.act = dalloc(g.S * I * 2, "act_bf16"), g.ye = dalloc(g.S * D * 4, "ye");
  g.out = dalloc(T * D * 4, "out");
  poison(g.act), poison(g.ye), poison(g.out), poison(g.perm), poison(g.slot);
  return g;
}
// fp4 weights take x in e2m1 pair order (tile 128: wg order): h is converted so, and w13's epilogue writes act so
cudaError_t grouped_w13(GroupedRun& g, const DevExperts& w13, const DevExperts& w2, float lim) {
  if (g.fp8)  // (x quantized by grouped_run)
    return dc::moe_expert_gemm_fp8(g.xq.as<uint8_t>(), g.xs.as<float>(), g.perm.as<int32_t>(), g.D, w13.ref(), w13.wstr,
                                   w13.sstr, 2 * g.I, true, lim, g.tiles.as<int2>(), g.nt.as<int32_t>(), g.maxt,
                                   g.off.as<int32_t>(), g.act.p(), g.I, 0, g.fk, g.ctr.as<int32_t>());
  return dc::moe_expert_gemm(g.hb.as<bf16>(), g.D, g.perm.as<int32_t>(), g.D, w13.ref(), w13.wstr, w13.sstr, 2 * g.I,
                             true, lim, g.tm == 128 ? 2 : w2.fmt == dc::WFmt::FP4_B32, g.tiles.as<int2>(), g.nt.as<int32_t>(), g.maxt,
                             g.off.as<int32_t>(), g.tm, g.act.p(), g.I, 0);
}
cudaError_t grouped_w2(GroupedRun& g, const DevExperts& w2) {
  if (g.fp8) {  // act → e4m3, then the fp8 kernel
    cudaError_t e = dc::moe_quant_fp8_bf16(g.act.as<bf16>(), g.S, g.I, g.I, g.aq.as<uint8_t>(), g.as.as<float>(), 0);
    if (e != cudaSuccess) return e;
    return dc::moe_expert_gemm_fp8(g.aq.as<uint8_t>(), g.as.as<float>(), nullptr, g.I, w2.ref(), w2.wstr, w2.sstr, g.D,
                                   false, 0.0f, g.tiles.as<int2>(), g.nt.as<int32_t>(), g.maxt, g.off.as<int32_t>(),
                                   g.ye.p(), g.D, 0, g.fk, g.ctr.as<int32_t>());
  }
  return dc::moe_expert_gemm(g.act.as<bf16>(), g.I, nullptr, g.I, w2.ref(), w2.wstr, w2.sstr, g.D, false, 0.0f, false,
                             g.tiles.as<int2>(), g.nt.as<int32_t>(), g.maxt, g.off.as<int32_t>(), g.tm, g.ye.p(), g.D, 0);
}
void grouped_run(GroupedRun& g, const DBuf& h, const DBuf& sel, const DBuf& wsel, const DevExperts& w13,
                 const DevExperts& w2, float lim) {
  CK(dc::moe_group_par(sel.as<int32_t>(), g.T, g.K, (int)g.E, g.tm, g.off.as<int32_t>(), g.perm.as<int32_t>(),
                       g.slot.as<int32_t>(), g.tiles.as<int2>(), g.nt.as<int32_t>(), g.scr.as<int32_t>(), 0));
  if (g.fp8) CK(dc::moe_quant_fp8(h.as<float>(), g.T, g.D, g.D, g.xq.as<uint8_t>(), g.xs.as<float>(), 0));
  else CK(dc::moe_x_to_bf16(h.as<float>(), g.T, g.D, g.D, g.tm == 128 ? 2 : w13.fmt == dc::WFmt::FP4_B32 ? 1 : 0, g.hb.as<bf16>(), 0));
  CK(grouped_w13(g, w13, w2, lim));
  CK(grouped_w2(g, w2));
  CK(dc::moe_combine(g.ye.as<float>(), sel.as<int32_t>(), wsel.as<float>(), g.slot.as<int32_t>(), g.T, g.K, g.D, nullptr,
                     g.out.as<float>(), 0));
}


// ---- fp8 activations (moe_fp8.cu) ----
// one row: q (natural k order), scales [K/128]; xd = the dequantized row q·s
void host_quant_row(const float* x, int64_t K, uint8_t* q, float* sc, float* xd) {
  for (int64_t b = 0; b < K / 128; ++b) {
    sc[b] = host_quant_block(x + b * 128, q + b * 128);
    for (int k = 0; k < 128; ++k) xd[b * 128 + k] = e4m3_val(q[b * 128 + k]) * sc[b];
  }
}
void host_quant_rows(float* x, int64_t n, int64_t K) {  // in place: x → q·s
  std::vector<uint8_t> q(K);
  std::vector<float> sc(K / 128), xd(K);
  for (int64_t m = 0; m < n; ++m) {
    host_quant_row(x + m * K, K, q.data(), sc.data(), xd.data());
    memcpy(x + m * K, xd.data(), K * 4);
  }
}
bool moe_fp8_off() {
  const char* v = getenv("DEEPINFER_CUDA_OFF");
  return v && ("," + std::string(v) + ",").find(",moe_fp8,") != std::string::npos;
}

// Reference for the tokens `chk` (ascending): experts ascending, per expert the CPU twin's linear on the
// dequantized weights with x = bf16(h) and the act rounded to bf16 like the device.
std::vector<float> grouped_ref(const std::vector<float>& hb, const std::vector<int32_t>& sel, const std::vector<float>& wsel,
                               const std::vector<int64_t>& chk, int K, int E, int64_t D, int64_t I, float lim,
                               const DevExperts& w13, const DevExperts& w2, bool fp8 = false) {
  // fp8 (the fp8 kernels' semantics): hb is then h itself (not rounded), x and act quantized per 128-k block
  std::vector<float> ref(chk.size() * D, 0.0f), xe, gu, act, ye;
  for (int e = 0; e < E; ++e) {
    std::vector<std::pair<size_t, float>> rows;
    for (size_t c = 0; c < chk.size(); ++c)
      for (int k = 0; k < K; ++k)
        if (sel[chk[c] * K + k] == e) rows.push_back({c, wsel[chk[c] * K + k]});
    if (rows.empty()) continue;
    const int64_t n = rows.size();
    const std::vector<float> wd13 = dequant_all(w13.host(e)), wd2 = dequant_all(w2.host(e));
    xe.resize(n * D), gu.resize(n * 2 * I), act.resize(n * I), ye.resize(n * D);
    for (int64_t i = 0; i < n; ++i) memcpy(xe.data() + i * D, hb.data() + chk[rows[i].first] * D, D * 4);
    if (fp8) host_quant_rows(xe.data(), n, D);
    cpu_linear(xe.data(), n, D, wd13.data(), 2 * I, gu.data());
    cpu().swiglu_clamp(gu.data(), n, I, lim, nullptr, act.data());
    for (auto& a : act) a = bf16r(a);
    if (fp8) host_quant_rows(act.data(), n, I);
    cpu_linear(act.data(), n, I, wd2.data(), D, ye.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < D; ++c) ref[rows[i].first * D + c] += ye[i * D + c] * rows[i].second;
  }
  return ref;
}

// wg order (the tile-128 kernel's x): pair-order position p = 16t + 4i + 2h + l of each 64-k chunk moved to
// 16i + 8h + 2t + l (written here from the header's definition, independently of the kernel's wg_pos)
int64_t wg_pos_host(int64_t pp) {
  const int64_t q = pp & 63, t = q >> 4, i = (q >> 2) & 3, h = (q >> 1) & 1, l = q & 1;
  return (pp & ~(int64_t)63) + 16 * i + 8 * h + 2 * t + l;
}
// moe_x_to_bf16: natural, e2m1 pair and wg order, bitwise against the host (round to nearest even).
Result x_pair_case(int64_t M, int64_t K, int64_t ldx, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * ldx);
  DBuf dx = dup(x, "x"), dn = dalloc(M * K * 2, "y_natural"), dp = dalloc(M * K * 2, "y_pair"),
       dw = dalloc(M * K * 2, "y_wg");
  poison(dn), poison(dp), poison(dw);
  CK(dc::moe_x_to_bf16(dx.as<float>(), M, K, ldx, 0, dn.as<bf16>(), 0));
  CK(dc::moe_x_to_bf16(dx.as<float>(), M, K, ldx, 1, dp.as<bf16>(), 0));
  CK(dc::moe_x_to_bf16(dx.as<float>(), M, K, ldx, 2, dw.as<bf16>(), 0));
  auto yn = down<uint16_t>(dn, M * K), yp = down<uint16_t>(dp, M * K), yw = down<uint16_t>(dw, M * K);
  bool okn = true, okp = true, okw = true;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      bf16 b = __float2bfloat16_rn(x[m * ldx + k]);
      uint16_t u;
      memcpy(&u, &b, 2);
      okn &= yn[m * K + k] == u;
      const int64_t pp = (k & ~7) + ((k & 7) < 4 ? 2 * (k & 7) : 2 * ((k & 7) - 4) + 1);
      okp &= yp[m * K + pp] == u;
      okw &= yw[m * K + wg_pos_host(pp)] == u;
    }
  expect_true(res, okn, "natural order");
  expect_true(res, okp, "pair order");
  expect_true(res, okw, "wg order");
  return res;
}

// The expert GEMM cases' fused SwiGLU (bf16 act a) against swiglu_clamp of the unfused z (ar), bitwise, with
// limit 1: some |z| must reach it or the check is too weak.
void expect_fused_swiglu(Result& res, const std::vector<bf16>& a, const std::vector<bf16>& ar, const std::vector<float>& z) {
  const bool eq = a.size() == ar.size() && memcmp(a.data(), ar.data(), a.size() * 2) == 0;
  int64_t clamped = 0;
  for (float v : z) clamped += std::fabs(v) > 1.0f;
  expect_true(res, eq, "fused swiglu != swiglu_clamp(z)");
  expect_true(res, clamped > 0, "no value reached the clamp (test too weak)");
  if (eq) res.detail += "fused swiglu == swiglu_clamp (bitwise) ";
}

// moe_expert_gemm alone (diagnoses a moe_grouped failure: grouping, w13 gather mode or w2 mode): z for
// every grouped row against the f64 reference (x[row] · dequant(W_e) over the routed rows), and the fused
// SwiGLU bitwise equal to swiglu_clamp (bf16 out) applied to the unfused z (same k order per element).
Result expert_gemm_case(dc::WFmt fmt, int64_t T, int K, int E, int64_t N, int64_t Kd, int tm, bool gather,
                        const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * K, I = N / 2, maxt = dc::moe_max_tiles(S, E, tm), nx = gather ? T : S, ldx = Kd + 8;
  const DevExperts W = make_dev_experts(r, fmt, E, N, Kd, 0);
  auto sel = make_sel(r, T, K, E, 1);
  std::vector<float> x = randn(r, nx * ldx);
  std::vector<bf16> xb = to_bf16(x);
  if (fmt == dc::WFmt::FP4_B32)  // fp4 wants x in e2m1 pair order (k0 k4 k1 k5 k2 k6 k3 k7 in each 8 k)
    for (int64_t m = 0; m < nx; ++m)
      for (int64_t k = 0; k < Kd; ++k) xb[m * ldx + (k & ~7) + ((k & 7) < 4 ? 2 * (k & 7) : 2 * ((k & 7) - 4) + 1)] =
          __float2bfloat16_rn(x[m * ldx + k]);
  // the tile-128 wgmma kernels take x in wg order (the pair-order copy xb feeds the tile-64 comparison below)
  std::vector<bf16> xw(xb.size());
  for (int64_t m = 0; m < nx; ++m) {
    for (int64_t k = Kd; k < ldx; ++k) xw[m * ldx + k] = xb[m * ldx + k];
    for (int64_t pp = 0; pp < Kd; ++pp) xw[m * ldx + wg_pos_host(pp)] = xb[m * ldx + pp];
  }
  DBuf dx = dup(tm == 128 ? xw : xb, "x_bf16"), dsel = dup(sel, "sel"), doff = dalloc((E + 1) * 4, "offsets"), dperm = dalloc(S * 4, "perm"),
       dslot = dalloc(S * 4, "slot_row"), dtile = dalloc(maxt * 8, "tiles"), dnt = dalloc(4, "n_tiles"),
       dscr = dalloc(dc::moe_group_scratch_ints(S, E) * 4, "scratch"), dz = dalloc(S * N * 4, "z"),
       da = dalloc(S * I * 2, "act_fused"), dref = dalloc(S * I * 2, "act_unfused");
  poison(dz), poison(da), poison(dref);
  CK(dc::moe_group_par(dsel.as<int32_t>(), T, K, E, tm, doff.as<int32_t>(), dperm.as<int32_t>(), dslot.as<int32_t>(),
                       dtile.as<int2>(), dnt.as<int32_t>(), dscr.as<int32_t>(), 0));
  const int32_t* g = gather ? dperm.as<int32_t>() : nullptr;
  CK(dc::moe_expert_gemm(dx.as<bf16>(), ldx, g, Kd, W.ref(), W.wstr, W.sstr, N, false, 0.0f, false, dtile.as<int2>(),
                         dnt.as<int32_t>(), maxt, doff.as<int32_t>(), tm, dz.p(), N, 0));
  CK(dc::moe_expert_gemm(dx.as<bf16>(), ldx, g, Kd, W.ref(), W.wstr, W.sstr, N, true, 1.0f, false, dtile.as<int2>(),
                         dnt.as<int32_t>(), maxt, doff.as<int32_t>(), tm, da.p(), I, 0));
  CK(dc::swiglu_clamp(dz.as<float>(), S, I, 1.0f, nullptr, nullptr, dref.as<bf16>(), 0));
  const HostGroup h = host_group(sel, T, K, E, tm);
  auto z = down<float>(dz, S * N);
  std::vector<float> zr(S * N), xr(Kd);
  std::vector<int64_t> all(N);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> yd;
  for (int e = 0; e < E; ++e) {
    if (h.offsets[e + 1] == h.offsets[e]) continue;
    const HostQ q = W.host(e);
    for (int32_t row = h.offsets[e]; row < h.offsets[e + 1]; ++row) {
      const int64_t src = gather ? h.perm[row] : row;
      gemv_ref_rows(q, x.data() + src * ldx, all, yd);  // rounds x to bf16 like the upload
      for (int64_t n = 0; n < N; ++n) zr[row * N + n] = (float)yd[n];
    }
  }
  expect_nmse(res, "z", z, zr, 1e-10);
  const auto a = down<bf16>(da, S * I), ar = down<bf16>(dref, S * I);
  expect_fused_swiglu(res, a, ar, z);
  if (tm == 128) {  // wgmma kernel vs the mma.sync kernel (tile 64) on the same rows: the same bits (batch invariance)
    const int64_t maxt64 = dc::moe_max_tiles(S, E, 64);
    DBuf doff6 = dalloc((E + 1) * 4, "offsets64"), dperm6 = dalloc(S * 4, "perm64"), dslot6 = dalloc(S * 4, "slot64"),
         dtile6 = dalloc(maxt64 * 8, "tiles64"), dnt6 = dalloc(4, "n_tiles64"), dz6 = dalloc(S * N * 4, "z64"),
         da6 = dalloc(S * I * 2, "act64");
    poison(dz6), poison(da6);
    CK(dc::moe_group_par(dsel.as<int32_t>(), T, K, E, 64, doff6.as<int32_t>(), dperm6.as<int32_t>(), dslot6.as<int32_t>(),
                         dtile6.as<int2>(), dnt6.as<int32_t>(), dscr.as<int32_t>(), 0));
    const int32_t* g6 = gather ? dperm6.as<int32_t>() : nullptr;
    DBuf dxp = dup(xb, "x_bf16_pair");  // the tile-64 kernel's x in pair order
    CK(dc::moe_expert_gemm(dxp.as<bf16>(), ldx, g6, Kd, W.ref(), W.wstr, W.sstr, N, false, 0.0f, false, dtile6.as<int2>(),
                           dnt6.as<int32_t>(), maxt64, doff6.as<int32_t>(), 64, dz6.p(), N, 0));
    CK(dc::moe_expert_gemm(dxp.as<bf16>(), ldx, g6, Kd, W.ref(), W.wstr, W.sstr, N, true, 1.0f, false, dtile6.as<int2>(),
                           dnt6.as<int32_t>(), maxt64, doff6.as<int32_t>(), 64, da6.p(), I, 0));
    const auto z6 = down<float>(dz6, S * N);
    const auto a6 = down<bf16>(da6, S * I);
    const bool same = memcmp(z6.data(), z.data(), S * N * 4) == 0 && memcmp(a6.data(), a.data(), S * I * 2) == 0;
    expect_true(res, same, "wgmma (tile 128) != mma.sync (tile 64) bits");
    if (same) res.detail += "== mma.sync tile 64 (bitwise) ";
    // act written in wg order (act_order 2, what w2's tile-128 launch reads): the same values at their wg positions
    DBuf daw = dalloc(S * I * 2, "act_wgorder");
    poison(daw);
    CK(dc::moe_expert_gemm(dx.as<bf16>(), ldx, g, Kd, W.ref(), W.wstr, W.sstr, N, true, 1.0f, 2, dtile.as<int2>(),
                           dnt.as<int32_t>(), maxt, doff.as<int32_t>(), tm, daw.p(), I, 0));
    const auto aw = down<bf16>(daw, S * I);
    bool samew = true;
    for (int64_t r = 0; r < S; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t pp = (i & ~7) + ((i & 7) < 4 ? 2 * (i & 7) : 2 * ((i & 7) - 4) + 1);
        samew &= memcmp(&aw[r * I + wg_pos_host(pp)], &a[r * I + i], 2) == 0;
      }
    expect_true(res, samew, "act in wg order != act");
    if (samew) res.detail += "act in wg order == act (bitwise) ";
  }
  return res;
}


// moe_quant_fp8 (f32 and bf16 rows): every e4m3 byte at its moe_fp8_pos position and every scale bitwise against
// the host's quantization; blocks scaled by 2^-30..2^30, an all-zero block (amax below 1e-4) and one of tiny values.
Result fp8_quant_case(int64_t M, int64_t K, int64_t ldx, bool bf, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * ldx);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < K / 128; ++b) {
      const float f = (m == 0 && b == 1) ? 0.0f : (m == 1 && b == 0) ? 1e-7f : std::ldexp(1.0f, r.range(-30, 31));
      for (int k = 0; k < 128; ++k) x[m * ldx + b * 128 + k] *= f;
      if (b % 2 == 0) x[m * ldx + b * 128 + 7] = (m % 2 ? -445.0f : 445.0f) * f;  // amax/s = 445: rounds to 448
    }
  if (bf)
    for (auto& v : x) v = bf16r(v);
  DBuf dx = bf ? dup(to_bf16(x), "x_bf16") : dup(x, "x"), dq = dalloc(M * K, "q"), ds = dalloc(M * (K / 128) * 4, "sc");
  poison(dq), poison(ds);
  CK(bf ? dc::moe_quant_fp8_bf16(dx.as<bf16>(), M, K, ldx, dq.as<uint8_t>(), ds.as<float>(), 0)
        : dc::moe_quant_fp8(dx.as<float>(), M, K, ldx, dq.as<uint8_t>(), ds.as<float>(), 0));
  const auto q = down<uint8_t>(dq, M * K);
  const auto sc = down<float>(ds, M * (K / 128));
  std::vector<uint8_t> hq(K);
  std::vector<float> hs(K / 128), xd(K);
  int64_t badq = 0, bads = 0, sat = 0;
  for (int64_t m = 0; m < M; ++m) {
    host_quant_row(x.data() + m * ldx, K, hq.data(), hs.data(), xd.data());
    for (int64_t k = 0; k < K; ++k) {
      badq += q[m * K + (k & ~127) + dc::moe_fp8_pos((int)(k & 127))] != hq[k];
      sat += (hq[k] & 0x7f) == 0x7e;
    }
    for (int64_t b = 0; b < K / 128; ++b) bads += memcmp(&sc[m * (K / 128) + b], &hs[b], 4) != 0;
  }
  expect_true(res, badq == 0, "e4m3 bytes differ from the host's");
  expect_true(res, bads == 0, "scales differ from the host's");
  expect_true(res, sat > 0, "no value reached 448 (test too weak)");
  char buf[96];
  snprintf(buf, sizeof buf, "%ld bytes and %ld scales bitwise (%ld at ±448) ", (long)(M * K), (long)(M * (K / 128)), (long)sat);
  res.detail += buf;
  return res;
}

// moe_expert_gemm_fp8 alone: z for every grouped row against the f64 reference on the quantized x (q·s) and the
// exact weights, the fused SwiGLU bitwise swiglu_clamp of the unfused z, a second run bitwise the first, and
// batch invariance (gather mode: the first 9 tokens grouped alone give bitwise the same rows).
Result fp8_expert_case(int64_t T, int K, int E, int64_t N, int64_t Kd, int variant, bool gather, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * K, I = N / 2, maxt = dc::moe_max_tiles(S, E, 128), nx = gather ? T : S;
  const DevExperts W = make_dev_experts(r, dc::WFmt::FP4_B32, E, N, Kd, variant);
  auto sel = make_sel(r, T, K, E, 1);
  std::vector<float> x = randn(r, nx * Kd);
  DBuf dx = dup(x, "x"), dq = dalloc(nx * Kd, "xq"), ds = dalloc(nx * (Kd / 128) * 4, "xs"), dsel = dup(sel, "sel"),
       doff = dalloc((E + 1) * 4, "offsets"), dperm = dalloc(S * 4, "perm"), dslot = dalloc(S * 4, "slot_row"),
       dtile = dalloc(maxt * 8, "tiles"), dnt = dalloc(4, "n_tiles"),
       dscr = dalloc(dc::moe_group_scratch_ints(S, E) * 4, "scratch"), dz = dalloc(S * N * 4, "z"),
       dz2 = dalloc(S * N * 4, "z_again"), da = dalloc(S * I * 2, "act_fused"), dref = dalloc(S * I * 2, "act_unfused");
  poison(dz), poison(dz2), poison(da), poison(dref);
  CK(dc::moe_quant_fp8(dx.as<float>(), nx, Kd, Kd, dq.as<uint8_t>(), ds.as<float>(), 0));
  CK(dc::moe_group_par(dsel.as<int32_t>(), T, K, E, 128, doff.as<int32_t>(), dperm.as<int32_t>(), dslot.as<int32_t>(),
                       dtile.as<int2>(), dnt.as<int32_t>(), dscr.as<int32_t>(), 0));
  const int32_t* g = gather ? dperm.as<int32_t>() : nullptr;
  DBuf dctr = dup(std::vector<int32_t>{0, 0}, "persistent_counter");
  auto run = [&](void* y, bool swiglu, int kernel) {
    CK(dc::moe_expert_gemm_fp8(dq.as<uint8_t>(), ds.as<float>(), g, Kd, W.ref(), W.wstr, W.sstr, N, swiglu,
                               swiglu ? 1.0f : 0.0f, dtile.as<int2>(), dnt.as<int32_t>(), maxt, doff.as<int32_t>(), y,
                               swiglu ? I : N, 0, kernel, dctr.as<int32_t>()));
  };
  run(dz.p(), false, 0);  // the register-A kernel on a grid (the persistent one, the backend's, below)
  run(da.p(), true, 0);
  run(dz2.p(), false, 0);
  for (int k : {1, 2}) {  // the warp-specialized and persistent forms: bitwise the same z and act (same codes, MMA
                          // k order, sums)
    const std::string kn = k == 1 ? "warp-specialized" : "persistent";
    DBuf dz0 = dalloc(S * N * 4, "z_kernel_k"), da0 = dalloc(S * I * 2, "act_kernel_k");
    poison(dz0), poison(da0);
    run(dz0.p(), false, k);
    run(da0.p(), true, k);
    const auto z0 = down<float>(dz0, S * N), zw = down<float>(dz, S * N);
    const auto a0 = down<bf16>(da0, S * I), aw = down<bf16>(da, S * I);
    const bool same = memcmp(z0.data(), zw.data(), S * N * 4) == 0 && memcmp(a0.data(), aw.data(), S * I * 2) == 0;
    expect_true(res, same, kn + " kernel != register-A kernel");
    if (same) res.detail += kn + " == register-A kernel (bitwise, z and act) ";
  }
  {  // the persistent kernel's counter: zero again after its launches (the next launch's items start at 0)
    const auto c = down<int32_t>(dctr, 2);
    expect_true(res, c[0] == 0 && c[1] == 0, "persistent counter not reset");
  }
  CK(dc::swiglu_clamp(dz.as<float>(), S, I, 1.0f, nullptr, nullptr, dref.as<bf16>(), 0));
  const HostGroup h = host_group(sel, T, K, E, 128);
  auto z = down<float>(dz, S * N);
  std::vector<float> zr(S * N), xd(nx * Kd);
  memcpy(xd.data(), x.data(), nx * Kd * 4);
  host_quant_rows(xd.data(), nx, Kd);
  for (int e = 0; e < E; ++e) {
    if (h.offsets[e + 1] == h.offsets[e]) continue;
    const std::vector<float> wd = dequant_all(W.host(e));
    for (int32_t row = h.offsets[e]; row < h.offsets[e + 1]; ++row) {
      const float* xr = xd.data() + (gather ? h.perm[row] : row) * Kd;
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < Kd; ++k) acc += (double)wd[n * Kd + k] * xr[k];
        zr[row * N + n] = (float)acc;
      }
    }
  }
  expect_nmse(res, "z (vs f64 on q·s)", z, zr, 1e-7);
  const auto a = down<bf16>(da, S * I), ar = down<bf16>(dref, S * I);
  expect_fused_swiglu(res, a, ar, z);
  const bool rep = rows_bitwise_equal(down<float>(dz2, S * N).data(), z.data(), S * N);
  expect_true(res, rep, "a second run differs");
  if (rep) res.detail += "2nd run == 1st (bitwise) ";
  if (gather && T > 9) {  // the first 9 tokens alone: their slots' rows bitwise those of the whole batch
    const int64_t T2 = 9, S2 = T2 * K, maxt2 = dc::moe_max_tiles(S2, E, 128);
    DBuf dsel2 = dup(std::vector<int32_t>(sel.begin(), sel.begin() + S2), "sel9"), doff2 = dalloc((E + 1) * 4, "off9"),
         dperm2 = dalloc(S2 * 4, "perm9"), dslot2 = dalloc(S2 * 4, "slot9"), dtile2 = dalloc(maxt2 * 8, "tiles9"),
         dnt2 = dalloc(4, "nt9"), dz9 = dalloc(S2 * N * 4, "z9");
    poison(dz9);
    CK(dc::moe_group_par(dsel2.as<int32_t>(), T2, K, E, 128, doff2.as<int32_t>(), dperm2.as<int32_t>(),
                         dslot2.as<int32_t>(), dtile2.as<int2>(), dnt2.as<int32_t>(), dscr.as<int32_t>(), 0));
    CK(dc::moe_expert_gemm_fp8(dq.as<uint8_t>(), ds.as<float>(), dperm2.as<int32_t>(), Kd, W.ref(), W.wstr, W.sstr, N,
                               false, 0.0f, dtile2.as<int2>(), dnt2.as<int32_t>(), maxt2, doff2.as<int32_t>(), dz9.p(),
                               N, 0));
    const auto z9 = down<float>(dz9, S2 * N);
    const auto slot = down<int32_t>(dslot, S), slot9 = down<int32_t>(dslot2, S2);
    bool inv = true;
    for (int64_t i = 0; i < S2; ++i) inv &= rows_bitwise_equal(z9.data() + slot9[i] * N, z.data() + slot[i] * N, N);
    expect_true(res, inv, "batch invariance: the first 9 tokens alone differ");
    if (inv) res.detail += "9 tokens alone == in batch (bitwise) ";
  }
  return res;
}

// The tile height CudaBackend::moe_ffn takes: 128 (the wgmma prefill kernel) for fp4 at T > 256 unless
// DEEPINFER_CUDA_OFF names moe_wgmma (then the mma.sync kernel's 64, as the backend does).
bool moe_wgmma_off() {
  const char* v = getenv("DEEPINFER_CUDA_OFF");
  return v && ("," + std::string(v) + ",").find(",moe_wgmma,") != std::string::npos;
}
int grouped_tile(dc::WFmt fmt, int64_t T) { return dc::moe_grouped_tile_m(T, fmt == dc::WFmt::FP4_B32 && !moe_wgmma_off()); }
// The backend's choice of the fp8 expert kernels: tile 128 with fp4 weights, unless DEEPINFER_CUDA_OFF=moe_fp8.
bool grouped_fp8(dc::WFmt fmt, int tm) { return tm == 128 && fmt == dc::WFmt::FP4_B32 && !moe_fp8_off(); }

// Checked: the moe_ffn path for T > 8 against the reference (all tokens, or `sample` tokens spread over T),
// the grouping against the host, the CPU twin CpuBackend::moe_ffn (all tokens, when cpu_twin: it keeps the
// act in f32, hence the looser tolerance), and batch invariance (the first 9 tokens alone, with another
// tile height, give bitwise the same rows).
Result moe_grouped_case(dc::WFmt fmt, int64_t T, int E, int K, int64_t D, int64_t I, int skew, int variant,
                        int64_t sample, bool cpu_twin, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const float lim = variant == 2 ? 1e30f : 7.0f;
  const DevExperts w13 = make_dev_experts(r, fmt, E, 2 * I, D, variant), w2 = make_dev_experts(r, fmt, E, D, I, variant);
  std::vector<float> h = randn(r, T * D), wsel(T * K);
  for (auto& v : wsel) v = 0.1f + r.uni();
  auto sel = make_sel(r, T, K, E, skew);
  DBuf dh = dup(h, "h"), dsel = dup(sel, "sel"), dw = dup(wsel, "wsel");
  const int tm = grouped_tile(fmt, T);
  const bool fp8 = grouped_fp8(fmt, tm);  // the backend's prefill path: e4m3 x and act (moe_fp8.cu)
  GroupedRun g = grouped_alloc(T, K, E, D, I, tm, fp8);
  grouped_run(g, dh, dsel, dw, w13, w2, lim);
  auto out = down<float>(g.out, T * D);
  const HostGroup hg = host_group(sel, T, K, E, tm);
  expect_true(res, down<int32_t>(g.off, E + 1) == hg.offsets && down<int32_t>(g.slot, T * K) == hg.slot &&
                       down<int32_t>(g.nt, 1)[0] == (int)hg.tiles.size() / 2,
              "grouping");
  std::vector<float> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = bf16r(h[i]);
  std::vector<int64_t> chk;
  if (sample <= 0 || sample >= T) {
    for (int64_t t = 0; t < T; ++t) chk.push_back(t);
  } else {
    for (int64_t i = 0; i < sample; ++i) chk.push_back(std::min<int64_t>(T - 1, T * i / sample + (i % 3)));
    std::sort(chk.begin(), chk.end());
    chk.erase(std::unique(chk.begin(), chk.end()), chk.end());
  }
  const auto ref = grouped_ref(fp8 ? h : hb, sel, wsel, chk, K, E, D, I, lim, w13, w2, fp8);
  std::vector<float> got(chk.size() * D);
  for (size_t c = 0; c < chk.size(); ++c) memcpy(got.data() + c * D, out.data() + chk[c] * D, D * 4);
  // (fp8: the reference quantizes its own act, whose bf16 / e4m3 roundings flip now and then against the
  // device's: ~1e-5 measured, hence 1e-4; a wrong layout or scale gives ~1)
  expect_nmse(res, "out", got, ref, fp8 ? 1e-4 : 1e-6);
  if (cpu_twin) {  // CpuBackend::moe_ffn on the dequantized experts, x = bf16(h)
    std::vector<WeightPtr> c13, c2;
    for (int e = 0; e < E; ++e) {
      c13.push_back(cpu().make_weight(dequant_all(w13.host(e)).data(), 2 * I, D));
      c2.push_back(cpu().make_weight(dequant_all(w2.host(e)).data(), D, I));
    }
    ExpertsPtr ex = cpu().make_experts(std::move(c13), std::move(c2));
    std::vector<float> oc(T * D);
    cpu().moe_ffn(hb.data(), T, *ex, sel.data(), wsel.data(), K, lim, nullptr, oc.data());
    // (fp8: e4m3 x and act, ~2^-5 relative rounding an element, against the twin's f32 — hence 3e-3)
    expect_nmse(res, fp8 ? "vs CpuBackend::moe_ffn (f32 act; fp8 path)" : "vs CpuBackend::moe_ffn (f32 act)", out, oc,
                fp8 ? 3e-3 : 1e-4);
  }
  if (T > 9) {  // the first 9 tokens alone (tile height 16; fp8: the fp8 path on 9 tokens): the same bits
    const int64_t T2 = 9;
    GroupedRun g2 = grouped_alloc(T2, K, E, D, I, fp8 ? 128 : dc::moe_grouped_tile_m(T2), fp8);
    grouped_run(g2, dh, dsel, dw, w13, w2, lim);
    auto o2 = down<float>(g2.out, T2 * D);
    const bool inv = rows_bitwise_equal(o2.data(), out.data(), T2 * D);
    expect_true(res, inv, "batch invariance: the first 9 tokens alone differ");
    if (inv) res.detail += "9 tokens alone == in batch (bitwise) ";
  }
  int mx = 0;
  for (int e = 0; e < E; ++e) mx = std::max(mx, hg.offsets[e + 1] - hg.offsets[e]);
  char buf[96];
  snprintf(buf, sizeof buf, "(%zu tokens checked, max rows/expert %d, tile %d%s) ", chk.size(), mx, tm, fp8 ? ", fp8" : "");
  res.detail += buf;
  return res;
}

// Perf at V4-Flash shapes: the whole T > 8 path, and each expert GEMM alone; bytes = the distinct experts'
// weights (+ scales) once + activations (h f32, bf16 h, gathered bf16 rows, act bf16 written and read,
// ye f32 written and read, out); FLOPs = 2·S·(2I·D + D·I). The old path (moe_group + gemm_grouped) is
// timed on the same routing for comparison. Sampled check of 2 tokens.
Result moe_grouped_perf_case(dc::WFmt fmt, int64_t T, int E, int K, int64_t D, int64_t I, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const float lim = 7.0f;
  const DevExperts w13 = make_dev_experts(r, fmt, E, 2 * I, D, 0), w2 = make_dev_experts(r, fmt, E, D, I, 0);
  std::vector<float> h = randn(r, T * D), wsel(T * K);
  for (auto& v : wsel) v = 0.1f + r.uni();
  auto sel = make_sel(r, T, K, E, 0);
  DBuf dh = dup(h, "h"), dsel = dup(sel, "sel"), dw = dup(wsel, "wsel");
  const int tm = grouped_tile(fmt, T);
  const bool fp8 = grouped_fp8(fmt, tm);
  GroupedRun g = grouped_alloc(T, K, E, D, I, tm, fp8);
  grouped_run(g, dh, dsel, dw, w13, w2, lim);
  auto out = down<float>(g.out, T * D);
  std::vector<float> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = bf16r(h[i]);
  const std::vector<int64_t> chk = {0, T - 1};
  const auto ref = grouped_ref(fp8 ? h : hb, sel, wsel, chk, K, E, D, I, lim, w13, w2, fp8);
  std::vector<float> got(chk.size() * D);
  for (size_t c = 0; c < chk.size(); ++c) memcpy(got.data() + c * D, out.data() + chk[c] * D, D * 4);
  expect_nmse(res, "out(2 tokens)", got, ref, fp8 ? 1e-4 : 1e-6);
  const int64_t S = T * K;
  std::vector<char> hit(E, 0);
  for (auto e : sel) hit[e] = 1;
  const double nhit = std::count(hit.begin(), hit.end(), 1);
  const double wb13 = nhit * (w13.wb + w13.sb), wb2 = nhit * (w2.wb + w2.sb);
  res.us = time_us([&] { grouped_run(g, dh, dsel, dw, w13, w2, lim); });
  const double us13 = time_us([&] { CK(grouped_w13(g, w13, w2, lim)); }), us2 = time_us([&] { CK(grouped_w2(g, w2)); });
  if (fp8) {  // the three fp8 expert kernels on the same data, alternating
    double a13[3] = {0, 0, 0}, a2[3] = {0, 0, 0};
    for (int rep = 0; rep < 2; ++rep)
      for (int k = 0; k < 3; ++k) {
        g.fk = k;
        a13[k] += time_us([&] { CK(grouped_w13(g, w13, w2, lim)); }) / 2;
        a2[k] += time_us([&] { CK(grouped_w2(g, w2)); }) / 2;
      }
    g.fk = 2;
    char bk[320];
    snprintf(bk, sizeof bk,
             "| fp8 kernels, alternating: register-A grid w13 %.1f w2 %.1f us, persistent w13 %.1f w2 %.1f us, "
             "warp-specialized w13 %.1f w2 %.1f us ",
             a13[0], a2[0], a13[2], a2[2], a13[1], a2[1]);
    res.detail += bk;
  }
  res.bytes = wb13 + wb2 + T * D * 4.0 + T * D * 2.0 + S * D * 2.0 + S * I * 2.0 * 2 + S * D * 4.0 * 2 + T * D * 4.0;
  res.flops = 2.0 * S * (2 * I * D + D * I);
  // old path on the same routing: moe_group (tile 64) + gemm_grouped ×2 + swiglu_clamp + combine
  const int64_t maxt64 = dc::moe_max_tiles(S, E, 64);
  DBuf ooff = dalloc((E + 1) * 4, "old_offsets"), operm = dalloc(S * 4, "old_perm"), oslot = dalloc(S * 4, "old_slot"),
       otile = dalloc(maxt64 * 8, "old_tiles"), ont = dalloc(4, "old_nt"), ogu = dalloc(S * 2 * I * 4, "old_gu"),
       oact = dalloc(S * I * 2, "old_act"), oye = dalloc(S * D * 4, "old_ye"), oout = dalloc(T * D * 4, "old_out"),
       ohb = dalloc(T * D * 2, "old_h_bf16");
  auto old = [&] {
    CK(dc::moe_group(dsel.as<int32_t>(), T, K, E, 64, ooff.as<int32_t>(), operm.as<int32_t>(), oslot.as<int32_t>(),
                     otile.as<int2>(), ont.as<int32_t>(), 0));
    CK(dc::f32_to_bf16_rows(dh.as<float>(), T, D, D, ohb.as<bf16>(), 0));
    CK(dc::gemm_grouped(ohb.as<bf16>(), D, operm.as<int32_t>(), D, w13.ref(), w13.wstr, w13.sstr, 2 * I, otile.as<int2>(),
                        ont.as<int32_t>(), maxt64, ooff.as<int32_t>(), ogu.as<float>(), 2 * I, 0));
    CK(dc::swiglu_clamp(ogu.as<float>(), S, I, lim, nullptr, nullptr, oact.as<bf16>(), 0));
    CK(dc::gemm_grouped(oact.as<bf16>(), I, nullptr, I, w2.ref(), w2.wstr, w2.sstr, D, otile.as<int2>(), ont.as<int32_t>(),
                        maxt64, ooff.as<int32_t>(), oye.as<float>(), D, 0));
    CK(dc::moe_combine(oye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), oslot.as<int32_t>(), T, K, D, nullptr,
                       oout.as<float>(), 0));
  };
  old();
  const double us_old = time_us(old);
  res.fp8 = fp8;  // (the perf line and the w13 / w2 shares against fp8's peak on the fp8 path)
  const double pk = (fp8 ? g_fp8_tflops : g_bf16_tflops) * 1e6, bw = g_hbm_gbs * 1e3;  // FLOP/us, B/us
  if (fmt == dc::WFmt::FP4_B32) {
    // fp4: the other expert kernel on the same routing, side by side, outputs bitwise equal — at T > 256 the
    // mma.sync kernel (tile 64) next to the wgmma one; at T ≤ 256 the wgmma kernel (tile 128, not used there:
    // data for making it the one kernel of all T > 8) next to the mma.sync one
    // (fp8 path: the bf16 wgmma kernel, tile 128, side by side — other numerics: compared by NMSE)
    const int tmo = tm == 128 && !fp8 ? 64 : 128;
    GroupedRun go = grouped_alloc(T, K, E, D, I, tmo);
    grouped_run(go, dh, dsel, dw, w13, w2, lim);
    const auto oo = down<float>(go.out, T * D);
    const bool same = memcmp(oo.data(), out.data(), T * D * 4) == 0;
    if (fp8) expect_nmse(res, "fp8 path vs bf16 wgmma path", out, oo, 3e-3);
    else expect_true(res, same, "wgmma (tile 128) and mma.sync outputs differ");
    const double u = time_us([&] { grouped_run(go, dh, dsel, dw, w13, w2, lim); });
    const double u13 = time_us([&] { CK(grouped_w13(go, w13, w2, lim)); }), u2 = time_us([&] { CK(grouped_w2(go, w2)); });
    char bo[240];
    snprintf(bo, sizeof bo, "| %s tile %d: %.1f us (w13 %.1f, w2 %.1f; %.1f%% bf16) = %.2fx this%s ",
             tmo == 128 ? "bf16 wgmma" : "mma.sync", tmo, u, u13, u2,
             100.0 * res.flops / u / (g_bf16_tflops * 1e6), u / res.us,
             same ? ", bitwise equal" : "");
    res.detail += bo;
  }
  char buf[400];
  snprintf(buf, sizeof buf,
           "(%.0f distinct experts, tile %d%s) w13+swiglu %.1f us (%.0f%% HBM on its weights, %.1f%% %s) | w2 %.1f us "
           "(%.0f%% HBM, %.1f%% %s) | old path %.1f us (%.2fx) ",
           nhit, tm, fp8 ? ", fp8" : "", us13, 100.0 * wb13 / us13 / bw, 100.0 * 2.0 * S * 2 * I * D / us13 / pk,
           fp8 ? "fp8" : "bf16", us2, 100.0 * wb2 / us2 / bw, 100.0 * 2.0 * S * D * I / us2 / pk, fp8 ? "fp8" : "bf16",
           us_old, us_old / res.us);
  res.detail += buf;
  return res;
}

// =================================================================================================
// Sampler
// =================================================================================================
// sample_rows (Backend::sample_rows) against the CPU twin (ops/sampling.h's sample_row), bitwise: every
// filter alone and together, at the k-th / top-p cut among tied values, −inf tokens, greedy rows, a NaN row
// (−2), an all −inf row (−1), nearly flat rows (the cut's bin too full to sort: the radix refinement) and
// rows of one value (every cut among ties, in id order).
// ld > N: rows not 16-byte aligned (the scalar loads), the gaps NaN (a read past N answers −2).
// with_edits: every third row carries logit edits (bias, repetition, frequency / presence counts, masks on
// unique ids), applied in place before the pick: the edited logits and the picks bitwise the CPU's.
// lps: then the raw logprobs (Backend::logprob_rows, top lists of 0 … 20, some rows none): every asking row's
// edits put back and its RowLogprobs bitwise the CPU twin's.
Result sample_rows_case(int64_t M, int64_t N, int kind0, const std::string& name, int64_t ld = 0,
                        bool with_edits = false, bool lps = false) {
  Rng r = rng_for(name);
  Result res;
  if (ld < N) ld = N;
  std::vector<float> x((size_t)(M * ld), std::numeric_limits<float>::quiet_NaN());
  std::vector<deepinfer::SampleSpec> spec((size_t)M);
  std::vector<char> flat((size_t)M, 0);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t m = 0; m < M; ++m) {
    float* row = x.data() + m * ld;
    const int kind = (int)((m + kind0) % 18);
    const float scale = kind >= 15 ? 0.02f : 0.5f + 0.5f * (float)(m % 7);  // nearly flat .. peaked
    flat[m] = kind >= 15;
    for (int64_t i = 0; i < N; ++i) row[i] = kind == 17 ? 1.5f : scale * (float)r.normal();
    if (kind == 17)  // one value everywhere but a few better tokens and a few masked ones
      for (int j = 0; j < 6; ++j) row[r.range(0, (int)N)] = j < 3 ? 2.0f : -inf;
    if (kind == 3 || kind == 4)  // ties: the best value at several ids, and a band of equal values
      for (int j = 0; j < 40; ++j) row[r.range(0, (int)N)] = j < 4 ? 12.0f * scale : 2.0f * scale;
    if (kind == 5)  // masked tokens
      for (int64_t i = 0; i < N; i += 3) row[i] = -inf;
    if (kind == 6) row[r.range(0, (int)N)] = std::numeric_limits<float>::quiet_NaN();
    if (kind == 7) {
      for (int64_t i = 0; i < N; ++i) row[i] = -inf;
      if (m % 32 == 23) row[r.range(0, (int)N)] = 1.0f;  // one finite token
    }
    if (lps && m % 5 == 4 && kind < 15 && kind != 6 && kind != 7)  // steep: the top list reaches past 24 nats
      for (int64_t i = 0; i < N; ++i) row[i] *= 40.0f;
    deepinfer::SampleSpec& sp = spec[m];
    sp.temperature = kind == 0 ? 0.0f : 0.3f + 1.2f * (float)r.uni();
    sp.key = r.next(), sp.position = (uint64_t)r.range(0, 1 << 30) | ((m & 1) ? (1ull << 33) : 0ull);
    switch (kind) {
      case 1: sp.top_k = 50; break;
      case 2: sp.top_p = 0.9f; break;
      case 3: sp.top_k = 2; sp.top_p = 0.95f; break;
      case 4: sp.top_k = 30; break;  // the cut inside the band of equal values
      case 8: sp.min_p = 0.05f; break;
      case 9: sp.top_k = 1; break;
      case 10: sp.top_p = 0.5f; sp.min_p = 0.2f; break;
      case 11: sp.top_k = (int)N - 1; sp.top_p = 0.999f; break;
      case 12: sp.top_k = 1000; sp.top_p = 0.8f; break;
      case 13: sp.top_p = 0.99999994f; break;
      case 14: sp.top_k = 7; sp.min_p = 0.5f; break;
      case 15: sp.top_p = 0.7f; break;
      case 16: sp.top_k = (int)(N / 3) + 1; sp.top_p = 0.9f; break;  // both cuts in full bins
      case 17: sp.top_k = (int)(N / 2); sp.top_p = 0.3f + 0.6f * (float)r.uni(); break;
      default: break;
    }
  }
  std::vector<deepinfer::RowEdits> erows;
  std::vector<deepinfer::LogitEdit> elist;
  // Pending tokens (RowEdits::pend): rows 3k + 1 have one and no list, rows 6k one that is in their list half the
  // time; tok holds the step's token ids (row m's at m).
  std::vector<int32_t> tok((size_t)M);
  if (with_edits) {
    erows.resize((size_t)M);
    for (int64_t m = 0; m < M; ++m) {
      if (m % 3 == 2) continue;
      deepinfer::RowEdits& e = erows[(size_t)m];
      e.rep = m % 2 ? 1.3f : 0.8f, e.freq = 0.1f * (float)(m % 5), e.presence = m % 4 ? 0.25f : 0.0f;
      e.first = (int32_t)elist.size();
      std::vector<int32_t> ids;
      if (m % 3 == 0)
        for (int j = 0, n = r.range(1, 300); j < n; ++j) ids.push_back(r.range(-3, (int)N + 3));  // some outside
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (int32_t id : ids) {
        deepinfer::LogitEdit d;
        d.id = id, d.flags = (uint32_t)r.range(0, 8), d.bias = (float)r.range(-8, 9) * 0.5f, d.count = r.range(0, 4);
        if (r.range(0, 50) == 0) d.flags = deepinfer::sampling::kEditMask;
        elist.push_back(d);
      }
      e.count = (int32_t)elist.size() - e.first;
      if (m % 3 == 1 || m % 6 == 0) {
        e.pend = (int32_t)m + 1;
        const bool listed = m % 6 == 0 && !ids.empty() && r.range(0, 2) == 0;
        tok[(size_t)m] = listed ? std::max<int32_t>(0, std::min<int32_t>((int32_t)N - 1, ids[ids.size() / 2]))
                                : r.range(0, (int)N);
        elist.resize(elist.size() + 2, deepinfer::LogitEdit{-1, 0.0f, 0, 0u});  // the pending token's places
      }
    }
  }
  DBuf dx = dup(x, "x"), dspec = dalloc(M * (int64_t)sizeof(deepinfer::SampleSpec), "spec"), dout = dalloc(M * 4, "out");
  CK(cudaMemcpy(dspec.p(), spec.data(), M * sizeof(deepinfer::SampleSpec), cudaMemcpyHostToDevice));
  DBuf dtok = dup(tok, "tokens");
  DBuf drows = dalloc(std::max<int64_t>(1, M) * (int64_t)sizeof(deepinfer::RowEdits), "rows"),
       dedits = dalloc(std::max<int64_t>(1, (int64_t)elist.size()) * (int64_t)sizeof(deepinfer::LogitEdit), "edits"),
       draw = dalloc(std::max<int64_t>(1, (int64_t)elist.size()) * 4, "raw");
  if (with_edits) {
    CK(cudaMemcpy(drows.p(), erows.data(), M * sizeof(deepinfer::RowEdits), cudaMemcpyHostToDevice));
    if (!elist.empty())
      CK(cudaMemcpy(dedits.p(), elist.data(), elist.size() * sizeof(deepinfer::LogitEdit), cudaMemcpyHostToDevice));
  }
  poison(dout);
  auto launch = [&] {
    return dc::sample_rows(dx.as<float>(), M, N, ld, dspec.as<const deepinfer::SampleSpec>(),
                           with_edits ? drows.as<const deepinfer::RowEdits>() : nullptr,
                           with_edits ? dedits.as<const deepinfer::LogitEdit>() : nullptr,
                           with_edits ? draw.as<float>() : nullptr, with_edits ? dtok.as<const int32_t>() : nullptr,
                           dout.as<int32_t>(), 0);
  };
  CK(launch());
  auto got = down<int32_t>(dout, M);
  std::vector<int32_t> want((size_t)M);
  const std::vector<float> x_raw = x;
  std::vector<float> raw(elist.size());
  cpu().sample_rows(x.data(), M, N, ld, spec.data(), with_edits ? erows.data() : nullptr,
                    with_edits ? elist.data() : nullptr, with_edits ? raw.data() : nullptr, tok.data(), want.data());
  int64_t bad = 0, nflat = 0;
  for (int64_t m = 0; m < M; ++m) bad += got[m] != want[m], nflat += flat[m];
  expect_true(res, bad == 0, std::to_string(bad) + " rows differ");
  if (with_edits) {  // the edited logits themselves (NaN gaps past N compared as bits)
    const auto xg = down<float>(dx, M * ld);
    expect_true(res, std::memcmp(xg.data(), x.data(), x.size() * sizeof(float)) == 0, "edited logits differ");
    const auto rg = down<float>(draw, (int64_t)elist.size());  // the values before, for a host fallback
    int64_t bad_raw = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int32_t j = 0; j < erows[(size_t)m].count; ++j) {
        const deepinfer::LogitEdit& e = elist[(size_t)(erows[(size_t)m].first + j)];
        if (e.id < 0 || e.id >= N) continue;
        const float a = rg[(size_t)(erows[(size_t)m].first + j)], b = x_raw[(size_t)(m * ld + e.id)];
        bad_raw += std::memcmp(&a, &b, 4) != 0 || std::memcmp(&a, &raw[(size_t)(erows[(size_t)m].first + j)], 4) != 0;
      }
    int64_t npend = 0;
    for (int64_t m = 0; m < M; ++m) {  // a pending token's places: its id (or −1), its value before when unlisted
      const deepinfer::RowEdits& e = erows[(size_t)m];
      if (e.pend <= 0) continue;
      ++npend;
      const size_t at = (size_t)(e.first + e.count);
      int32_t id = 0;
      std::memcpy(&id, &rg[at + 1], 4);
      bad_raw += std::memcmp(&rg[at + 1], &raw[at + 1], 4) != 0;
      if (id >= 0) bad_raw += id != tok[(size_t)m] || std::memcmp(&rg[at], &x_raw[(size_t)(m * ld + id)], 4) != 0;
    }
    res.detail += std::to_string(npend) + " pending tokens, ";
    expect_true(res, bad_raw == 0, std::to_string(bad_raw) + " saved raw logits differ");
    res.detail += std::to_string(elist.size()) + " edits, ";
  }
  if (lps) {
    int64_t asked = 0;
    for (int64_t m = 0; m < M; ++m) {
      spec[(size_t)m].logprobs = (int32_t)((m * 7 + kind0) % 24) - 2;  // −2 … 21 (none, 0 … 20, 21 → 20)
      asked += spec[(size_t)m].logprobs >= 0;
    }
    CK(cudaMemcpy(dspec.p(), spec.data(), M * sizeof(deepinfer::SampleSpec), cudaMemcpyHostToDevice));
    DBuf dlp = dalloc(M * sizeof(deepinfer::RowLogprobs), "logprobs");
    poison(dlp);
    auto lp_launch = [&] {
      return dc::logprob_rows(dx.as<float>(), M, N, ld, dspec.as<const deepinfer::SampleSpec>(),
                              with_edits ? drows.as<const deepinfer::RowEdits>() : nullptr,
                              with_edits ? dedits.as<const deepinfer::LogitEdit>() : nullptr,
                              with_edits ? draw.as<const float>() : nullptr, dout.as<const int32_t>(),
                              dlp.as<deepinfer::RowLogprobs>(), 0);
    };
    CK(lp_launch());
    std::vector<deepinfer::RowLogprobs> lw((size_t)M);
    cpu().logprob_rows(x.data(), M, N, ld, spec.data(), with_edits ? erows.data() : nullptr,
                       with_edits ? elist.data() : nullptr, with_edits ? raw.data() : nullptr, want.data(), lw.data());
    const auto lg = down<deepinfer::RowLogprobs>(dlp, M);
    int64_t bad_lp = 0, entries = 0;
    for (int64_t m = 0; m < M; ++m) {
      if (spec[(size_t)m].logprobs < 0) continue;
      const deepinfer::RowLogprobs &a = lg[(size_t)m], &b = lw[(size_t)m];
      bool same = std::memcmp(&a.token, &b.token, 4) == 0 && a.n == b.n && a.n >= 0 && a.n <= deepinfer::kMaxLogprobs;
      for (int j = 0; same && j < a.n; ++j) same = a.ids[j] == b.ids[j] && std::memcmp(&a.lps[j], &b.lps[j], 4) == 0;
      bad_lp += !same, entries += b.n;
    }
    expect_true(res, bad_lp == 0, std::to_string(bad_lp) + " rows' logprobs differ");
    const auto xg = down<float>(dx, M * ld);  // the asking rows' raw logits back, the others as they were
    expect_true(res, std::memcmp(xg.data(), x.data(), x.size() * sizeof(float)) == 0, "logits after logprob_rows differ");
    res.detail += std::to_string(asked) + " rows with logprobs (" + std::to_string(entries) + " top entries), ";
    if (g_perf) {
      char buf[96];
      snprintf(buf, sizeof buf, "logprob_rows %.1f us, ", time_us([&] { lp_launch(); }));
      res.detail += buf;
    }
  }
  res.detail += "bitwise, " + std::to_string(nflat) + " flat rows ";
  if (g_perf && !with_edits && !lps) {
    // Timed on rows without the degenerate kinds: temperature only, then top-p 0.9 (the common request).
    for (auto& sp : spec) sp = deepinfer::SampleSpec{1.0f, 1.0f, 0.0f, 0, sp.key, sp.position};
    CK(cudaMemcpy(dspec.p(), spec.data(), M * sizeof(deepinfer::SampleSpec), cudaMemcpyHostToDevice));
    const double us_t = time_us([&] { launch(); });
    for (auto& sp : spec) sp.top_p = 0.9f;
    CK(cudaMemcpy(dspec.p(), spec.data(), M * sizeof(deepinfer::SampleSpec), cudaMemcpyHostToDevice));
    res.us = time_us([&] { launch(); });
    res.bytes = M * N * 4.0;
    char buf[160];
    snprintf(buf, sizeof buf, "(top-p 0.9 timed; temperature only %.1f us) ", us_t);
    res.detail += buf;
  }
  return res;
}

// mask_rows (structured-output grammar masks on the GPU) against the CPU twin, bitwise: masks from dense to one
// token and none, rows without a mask (−1), the masks in any order of the step's list, NaN / +inf kept under a
// clear bit, rows not 16-byte aligned (ld > N, the gaps untouched).
Result mask_rows_case(int64_t M, int64_t N, int64_t ld, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t W = deepinfer::mask_words(N);
  std::vector<float> x = randn(r, M * ld, 3.0f);
  std::vector<deepinfer::RowEdits> rows((size_t)M);
  std::vector<uint32_t> masks;
  int64_t nmask = 0;
  for (int64_t m = M - 1; m >= 0; --m) {  // the list in reverse row order
    if (m % 5 == 3) continue;               // no mask
    rows[(size_t)m].mask = (int32_t)nmask++;
    const int density = (int)(m % 4);
    for (int64_t w = 0; w < W; ++w) {
      uint32_t bits = 0;
      for (int j = 0; j < 32; ++j) {
        const bool ok = density == 0 ? r.range(0, 50) != 0 : density == 1 ? r.range(0, 2) == 0 : density == 2 ? r.range(0, 16) == 0 : false;
        bits |= (uint32_t)ok << j;
      }
      masks.push_back(bits);
    }
    if (m % 7 == 0) x[(size_t)(m * ld + r.range(0, (int)N))] = std::numeric_limits<float>::quiet_NaN();
    if (m % 7 == 1) x[(size_t)(m * ld + r.range(0, (int)N))] = std::numeric_limits<float>::infinity();
  }
  DBuf dx = dup(x, "x"), drows = dup(rows, "rows"), dmasks = dup(masks, "masks");
  auto launch = [&] {
    return dc::mask_rows(dx.as<float>(), M, N, ld, drows.as<const deepinfer::RowEdits>(), dmasks.as<const uint32_t>(), 0);
  };
  CK(launch());
  cpu().mask_rows(x.data(), M, N, ld, rows.data(), masks.data());
  const auto xg = down<float>(dx, M * ld);
  expect_true(res, std::memcmp(xg.data(), x.data(), x.size() * sizeof(float)) == 0, "masked logits differ");
  res.detail += std::to_string(nmask) + " masks, bitwise ";
  if (g_perf) {
    res.us = time_us([&] { launch(); });
    res.bytes = nmask * N * 8.0;
  }
  return res;
}

// argmax_rows (greedy sampling on the GPU) against the CPU twin, bitwise: ties placed on purpose (the
// lowest id wins), rows of −inf with one finite value, all −inf (−1), a NaN or +inf (−2).
Result argmax_case(int64_t M, int64_t N, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> x = randn(r, M * N, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t m = 0; m < M; ++m) {
    float* row = x.data() + m * N;
    const int kind = (int)(m % 6);
    if (kind == 1) {  // the max value at several ids
      const int64_t a = r.range(0, (int)N), b = r.range(0, (int)N);
      row[a] = row[b] = 50.0f;
    } else if (kind == 2) {
      for (int64_t i = 0; i < N; ++i) row[i] = -inf;
      row[r.range(0, (int)N)] = -7.0f;
    } else if (kind == 3) {
      for (int64_t i = 0; i < N; ++i) row[i] = -inf;
    } else if (kind == 4) {
      row[r.range(0, (int)N)] = std::numeric_limits<float>::quiet_NaN();
    } else if (kind == 5 && m % 12 == 5) {
      row[r.range(0, (int)N)] = inf;
    }
  }
  DBuf dx = dup(x, "x"), dout = dalloc(M * 4, "out");
  poison(dout);
  CK(dc::argmax_rows(dx.as<float>(), M, N, N, dout.as<int32_t>(), 0));
  auto got = down<int32_t>(dout, M);
  std::vector<int32_t> want(M);
  cpu().argmax_rows(x.data(), M, N, N, want.data());
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m) bad += got[m] != want[m];
  expect_true(res, bad == 0, std::to_string(bad) + " rows differ");
  res.detail += "bitwise ";
  if (g_perf) {
    res.us = time_us([&] { dc::argmax_rows(dx.as<float>(), M, N, N, dout.as<int32_t>(), 0); });
    res.bytes = M * N * 4.0;
  }
  return res;
}

// =================================================================================================
// smallk: the decode-size kernels (rms_norm, hc finish, moe_route, moe_combine) against their previous
// versions (the *_v1 launchers, DEEPINFER_CUDA_OFF=smallk). Each case runs both on the same inputs and
// wants the outputs bitwise equal (new eager, v1 eager, new from a CUDA graph); --perf times 20 calls of
// each from a CUDA graph (graph: the new kernel, detail: v1's graph time) — the per-call latency a
// decode step sees. The CPU-twin accuracy of the new kernels is covered by the ops' own cases, which
// now run them.
// =================================================================================================
struct SmallkRun {
  std::function<void(bool v1, cudaStream_t)> run;
  std::vector<DBuf> outs;  // bitwise-compared outputs (poisoned before each run)
  double bytes = 0;
};
Result smallk_case(const SmallkRun& k) {
  Result res;
  auto grab = [&](const std::function<void()>& f) {
    for (auto& o : k.outs) poison(o);
    f();
    std::vector<std::vector<uint8_t>> v;
    for (auto& o : k.outs) v.push_back(down<uint8_t>(o, o.bytes));
    return v;
  };
  auto a = grab([&] { k.run(false, 0); CK(cudaGetLastError()); });
  auto b = grab([&] { k.run(true, 0); CK(cudaGetLastError()); });
  std::string err;
  bool captured = false;
  auto c = grab([&] { captured = run_in_graph([&](cudaStream_t st) { k.run(false, st); }, err); });
  expect_true(res, a == b, "new != v1 (bitwise)");
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, a == c, "graph != eager (bitwise)");
  if (res.pass) res.detail += "new == v1 == graph (bitwise) ";
  if (g_perf) {
    constexpr int n = 20;
    res.graph_us = time_graph_us([&](cudaStream_t st) { k.run(false, st); }, n);
    const double v1 = time_graph_us([&](cudaStream_t st) { k.run(true, st); }, n);
    res.us = time_us([&] { k.run(false, 0); });
    res.bytes = k.bytes;
    char buf[120];
    snprintf(buf, sizeof buf, "graph/call: new %.2f us, v1 %.2f us (%.2fx) ", res.graph_us, v1, v1 / res.graph_us);
    res.detail += buf;
  }
  return res;
}

Result smallk_rms(int64_t M, int64_t D, int64_t ld, bool weight, const std::string& name) {
  Rng r = rng_for(name);
  std::vector<float> x = randn(r, M * ld, 3.0f), w = randn(r, D);
  DBuf dx = dup(x, "x"), dw = dup(w, "w"), dy = dalloc(M * ld * 4, "y"), dyb = dalloc(M * D * 2, "y_bf16");
  SmallkRun k;
  k.outs = {dy, dyb};
  k.bytes = M * D * 4.0 * 2 + M * D * 2.0 + (weight ? D * 4.0 : 0.0);
  k.run = [=](bool v1, cudaStream_t st) {
    CK((v1 ? dc::rms_norm_v1 : dc::rms_norm)(dx.as<float>(), M, D, ld, weight ? dw.as<float>() : nullptr, 1e-6f,
                                              dy.as<float>(), dyb.as<bf16>(), st));
  };
  return smallk_case(k);
}

Result smallk_hc(int64_t M, int hc, int64_t D, bool head, const std::string& name) {
  Rng r = rng_for(name);
  const int mix = head ? hc : (2 + hc) * hc;
  std::vector<float> X = randn(r, M * hc * D), fn = randn(r, mix * hc * D, 0.02f), base = randn(r, mix, 0.5f);
  std::vector<float> scale = {0.8f + r.uni(), 0.8f + r.uni(), 0.8f + r.uni()};
  DBuf dX = dup(X, "X"), df = dup(fn, "fn"), db = dup(base, "base"), ds = dup(scale, "scale");
  DBuf du = dalloc(M * D * 4, "u"), dp = dalloc(M * hc * 4, "post"), dcm = dalloc(M * hc * hc * 4, "comb");
  SmallkRun k;
  k.outs = head ? std::vector<DBuf>{du} : std::vector<DBuf>{du, dp, dcm};
  k.bytes = M * hc * D * 4.0 + mix * hc * D * 4.0 + M * D * 4.0;
  k.run = [=](bool v1, cudaStream_t st) {
    if (head)
      CK((v1 ? dc::hc_head_v1 : dc::hc_head)(dX.as<float>(), M, hc, D, df.as<float>(), db.as<float>(), ds.as<float>(),
                                             1e-6f, 1e-6f, du.as<float>(), st));
    else
      CK((v1 ? dc::hc_pre_v1 : dc::hc_pre)(dX.as<float>(), M, hc, D, df.as<float>(), db.as<float>(), ds.as<float>(),
                                           20, 1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), st,
                                           true));
  };
  return smallk_case(k);
}

Result smallk_route(int64_t T, int E, int K, dc::Scoring sf, bool hash, const std::string& name) {
  Rng r = rng_for(name);
  const int V = 1000;
  std::vector<float> lg = randn(r, T * E, 2.0f), bias = randn(r, E, 0.1f);
  // a few exact ties (equal logits): the lower id must win on both kernels
  for (int64_t t = 0; t < T; ++t) lg[t * E + 7] = lg[t * E + 200 % E], bias[7] = bias[200 % E];
  std::vector<int32_t> tid2eid(V * K), tok(T);
  for (int v = 0; v < V; ++v)
    for (int k = 0; k < K; ++k) tid2eid[v * K + k] = r.range(0, E);
  for (auto& t : tok) t = r.range(0, V);
  DBuf dl = dup(lg, "logits"), db = dup(bias, "bias"), dt = dup(tid2eid, "tid2eid"), dtok = dup(tok, "tokens");
  DBuf ds = dalloc(T * K * 4, "sel"), dw = dalloc(T * K * 4, "w");
  SmallkRun k;
  k.outs = {ds, dw};
  k.bytes = T * E * 4.0 + E * 4.0 + T * K * 8.0;
  k.run = [=](bool v1, cudaStream_t st) {
    CK((v1 ? dc::moe_route_v1 : dc::moe_route)(dl.as<float>(), T, E, K, sf, hash ? nullptr : db.as<float>(),
                                               hash ? dt.as<int32_t>() : nullptr, dtok.as<int32_t>(), true, 1.5f,
                                               ds.as<int32_t>(), dw.as<float>(), st));
  };
  return smallk_case(k);
}

Result smallk_combine(int64_t T, int K, int64_t D, int E, bool slots, bool shared, const std::string& name) {
  Rng r = rng_for(name);
  const int64_t S = T * K;
  std::vector<float> ye = randn(r, S * D), w = randn(r, S), sh = randn(r, T * D, 0.1f);
  std::vector<int32_t> sel(S), slot(S);
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {  // distinct experts a token, random order (plus one repeat when E is small)
      int e;
      bool dup_e;
      do {
        e = r.range(0, E);
        dup_e = false;
        for (int q = 0; q < k; ++q) dup_e |= sel[t * K + q] == e;
      } while (dup_e && E >= 2 * K);
      sel[t * K + k] = e;
    }
  std::vector<int64_t> perm(S);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = S - 1; i > 0; --i) std::swap(perm[i], perm[r.range(0, (int)i + 1)]);
  for (int64_t i = 0; i < S; ++i) slot[i] = (int32_t)perm[i];
  DBuf dye = dup(ye, "ye"), dw = dup(w, "wsel"), dsh = dup(sh, "shared"), dsel = dup(sel, "sel"), dsl = dup(slot, "slot");
  DBuf dout = dalloc(T * D * 4, "out");
  SmallkRun k;
  k.outs = {dout};
  k.bytes = S * D * 4.0 + T * D * 4.0 * (shared ? 2 : 1);
  k.run = [=](bool v1, cudaStream_t st) {
    CK((v1 ? dc::moe_combine_v1 : dc::moe_combine)(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(),
                                                   slots ? dsl.as<int32_t>() : nullptr, T, K, D,
                                                   shared ? dsh.as<float>() : nullptr, dout.as<float>(), st));
  };
  return smallk_case(k);
}

Result smallk_pool(int64_t W, int S, int d, const std::string& name) {
  Rng r = rng_for(name);
  std::vector<float> kv = randn(r, W * S * d), gate = randn(r, W * S * d, 2.0f);
  for (size_t i = 0; i < gate.size(); i += 7) gate[i] = -INFINITY;  // absent slots
  if (W > 1)
    for (int s = 0; s < S; ++s) gate[(int64_t)s * d] = -INFINITY;  // a column with no slot: 0/0 on both
  DBuf dkv = dup(kv, "kv"), dg = dup(gate, "gate"), dout = dalloc(W * d * 4, "out");
  SmallkRun k;
  k.outs = {dout};
  k.bytes = W * S * d * 8.0 + W * d * 4.0;
  k.run = [=](bool v1, cudaStream_t st) {
    CK((v1 ? dc::compress_pool_v1 : dc::compress_pool)(dkv.as<float>(), dg.as<float>(), W, S, d, dout.as<float>(), st));
  };
  return smallk_case(k);
}

void register_smallk(const std::function<std::string(const char*, int64_t)>& nm1) {
  // decode sizes (M = 1..8) and one prefill size each (must not get slower)
  for (int64_t M : {1, 2, 8, 4096}) {
    add(nm1("smallk rms_norm M=%ld D=4096 w (block row)", M), [=] { return smallk_rms(M, 4096, 4096, true, "sk_rms1"); });
    add(nm1("smallk rms_norm M=%ld D=1024 w (warp row, q_lora)", M), [=] { return smallk_rms(M, 1024, 1024, true, "sk_rms2"); });
    add(nm1("smallk rms_norm M=%ld D=512 w (warp row, kv)", M), [=] { return smallk_rms(M, 512, 512, true, "sk_rms3"); });
  }
  add("smallk rms_norm M=3 D=1000 ld=1000 (warp row, partial float4 tail)", [] { return smallk_rms(3, 1000, 1000, true, "sk_rms4"); });
  add("smallk rms_norm M=3 D=3000 ld=3004 (block row, tail)", [] { return smallk_rms(3, 3000, 3004, false, "sk_rms5"); });
  add("smallk rms_norm M=2 D=7000 ld=7000 (block row, NC=8)", [] { return smallk_rms(2, 7000, 7000, true, "sk_rms6"); });
  add("smallk rms_norm M=4096 D=512 (per-head q norm, 256-thread blocks)", [] { return smallk_rms(64 * 64, 512, 512, false, "sk_rms7"); });
  for (int64_t M : {1, 2, 8, 64}) {
    add(nm1("smallk hc_pre M=%ld hc=4 D=4096 it=20 (finish2)", M), [=] { return smallk_hc(M, 4, 4096, false, "sk_hc1"); });
  }
  add("smallk hc_pre M=3 hc=3 D=1000 it=20 (finish2, partial slice)", [] { return smallk_hc(3, 3, 1000, false, "sk_hc2"); });
  add("smallk hc_pre M=2 hc=8 D=1024 it=20 (hc=8: finish v1 both)", [] { return smallk_hc(2, 8, 1024, false, "sk_hc3"); });
  add("smallk hc_head M=1 hc=4 D=4096 (finish2)", [] { return smallk_hc(1, 4, 4096, true, "sk_hh1"); });
  add("smallk hc_head M=8 hc=4 D=4096 (finish2)", [] { return smallk_hc(8, 4, 4096, true, "sk_hh2"); });
  for (int64_t T : {1, 8, 128, 4096}) {
    add(nm1("smallk moe_route T=%ld E=256 K=6 sqrtsoftplus", T),
        [=] { return smallk_route(T, 256, 6, dc::Scoring::SqrtSoftplus, false, "sk_rt1"); });
  }
  add("smallk moe_route T=8 E=256 K=6 hash", [] { return smallk_route(8, 256, 6, dc::Scoring::SqrtSoftplus, true, "sk_rt2"); });
  add("smallk moe_route T=8 E=384 K=6 sqrtsoftplus (V4.1: J=12)", [] { return smallk_route(8, 384, 6, dc::Scoring::SqrtSoftplus, false, "sk_rt3"); });
  add("smallk moe_route T=8 E=100 K=2 softmax", [] { return smallk_route(8, 100, 2, dc::Scoring::Softmax, false, "sk_rt4"); });
  add("smallk moe_route T=8 E=1024 K=16 sigmoid (J=32)", [] { return smallk_route(8, 1024, 16, dc::Scoring::Sigmoid, false, "sk_rt5"); });
  for (int64_t T : {1, 8, 4096}) {
    add(nm1("smallk moe_combine T=%ld K=6 D=4096 (slot order, decode)", T),
        [=] { return smallk_combine(T, 6, 4096, 256, false, false, "sk_cb1"); });
    add(nm1("smallk moe_combine T=%ld K=6 D=4096 (slot_row + shared, prefill)", T),
        [=] { return smallk_combine(T, 6, 4096, 256, true, true, "sk_cb2"); });
  }
  add("smallk moe_combine T=5 K=12 D=1000 E=8 (KM=16, repeated experts, tail)",
      [] { return smallk_combine(5, 12, 1000, 8, true, true, "sk_cb3"); });
  // moe_group_par's kernels (sel prefetched, the scan's last chunks loaded together; no v1 kept: exact
  // integer results, checked against the host and the single-block moe_group); graph: 3 launches a call
  for (int64_t T : {8, 128, 290, 4096})  // 1, 3, 7 (4 + 3), 96 chunks of 256 slots
    add(nm1("smallk moe_group_par T=%ld K=6 E=256 tile=32 (exact)", T), [=] { return group_par_case(T, 6, 256, 32, 0, "sk_gp"); });
  add("smallk compress_pool W=1 S=128 d=512 (HCA decode)", [] { return smallk_pool(1, 128, 512, "sk_cp1"); });
  add("smallk compress_pool W=1 S=8 d=512 (CSA decode)", [] { return smallk_pool(1, 8, 512, "sk_cp2"); });
  add("smallk compress_pool W=8 S=128 d=512 (HCA, 8 windows)", [] { return smallk_pool(8, 128, 512, "sk_cp3"); });
  add("smallk compress_pool W=1024 S=8 d=512 (CSA prefill: v1 both)", [] { return smallk_pool(1024, 8, 512, "sk_cp4"); });
  add("smallk compress_pool W=32 S=128 d=512 (HCA prefill, 4k tokens)", [] { return smallk_pool(32, 128, 512, "sk_cp5"); });
  add("smallk compress_pool W=64 S=8 d=512 (CSA, 256 tokens: new)", [] { return smallk_pool(64, 8, 512, "sk_cp8"); });
  add("smallk compress_pool W=3 S=5 d=100 (column tail)", [] { return smallk_pool(3, 5, 100, "sk_cp6"); });
  add("smallk compress_pool W=2 S=200 d=64 (S > 128: v1 both)", [] { return smallk_pool(2, 200, 64, "sk_cp7"); });
}

// =================================================================================================
// fusecomp: the compressor chain, the compressor-ring pushes and the shared expert in fewer launches
// (compress_emit, copy_rows_multi, gemv_q(_v3)_swiglu, moe_combine's shared addend)
// =================================================================================================
// compress_emit against its CPU twin (CpuBackend's composition: compress_windows, compress_pool, rms_norm,
// rope, copy_rows) over the whole page buffer: the written rows by NMSE, every other row bitwise untouched;
// the fused rows also against the unfused CUDA chain (bitwise equality expected and reported, not
// required: FMA contraction is the compiler's), and a graph launch bitwise equal to the eager one.
// Decode (n = 0): B windows, each in its own slot's ring (ring_rows), every position from the rings
// (p0 = max), window ids random (window 0 first when overlap: its absent half), about close_pct % of the
// rows written (the others −1). Prefill (n > 0): one sequence's chunk [p0, p0 + n) closing every window it
// completes, positions before p0 from its ring (ring_rows null), the rest from the chunk's projections.
Result compress_emit_case(int m, int width, bool overlap, int64_t B, int close_pct, int64_t p0, int64_t n,
                          const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const bool prefill = n > 0;
  const int R = overlap ? 2 * m : m, S = R, rd = std::min(64, width / 2 * 2);
  const int64_t cw = (overlap ? 2 : 1) * (int64_t)width, ld = 2 * cw + 8;  // [kv | gate | others]
  const int64_t nslots = prefill ? 1 : B + 3;
  const float eps = 1e-6f;
  std::vector<float> rkv = randn(r, nslots * R * cw), rg = randn(r, nslots * R * cw, 2.0f), ape = randn(r, m * cw, 0.5f);
  std::vector<float> proj = randn(r, std::max<int64_t>(n, 1) * ld, 1.5f), norm(width), inv(rd / 2);
  for (auto& v : norm) v = 1.0f + 0.3f * r.normal();
  for (int i = 0; i < rd / 2; ++i) inv[i] = std::pow(160000.0f, -2.0f * i / rd);
  std::vector<int32_t> wins, rrows, pos, drows;
  if (prefill) {
    for (int64_t i = 0; i < n; ++i)
      if ((p0 + i + 1) % m == 0) wins.push_back((int32_t)((p0 + i) / m));
  } else {
    for (int64_t b = 0; b < B; ++b) {
      wins.push_back(b == 0 && overlap ? 0 : r.range(0, 5000));
      rrows.push_back((int32_t)((b + 2) * R));  // slot b + 2 (rows of cw)
    }
  }
  const int64_t nw = (int64_t)wins.size(), P = 2 * nw + 16;  // page rows
  for (int32_t w : wins) pos.push_back(w * m);
  std::vector<int32_t> perm(P);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = P - 1; i > 0; --i) std::swap(perm[i], perm[r.range(0, (int)i + 1)]);
  for (int64_t i = 0; i < nw; ++i) drows.push_back(prefill || r.range(0, 100) < close_pct ? perm[i] : -1);
  const std::vector<float> dst0 = randn(r, P * width);
  const int64_t p0_arg = prefill ? p0 : std::numeric_limits<int64_t>::max();
  DBuf drkv = dup(rkv, "ring_kv"), drg = dup(rg, "ring_gate"), dape = dup(ape, "ape"), dproj = dup(proj, "proj"),
       dnorm = dup(norm, "norm"), dinv = dup(inv, "inv_freq"), dwin = dup(wins, "wins"), drr = dup(rrows, "ring_rows"),
       dpos = dup(pos, "pos"), ddr = dup(drows, "dst_rows"), ddst = dup(dst0, "dst"), dref = dup(dst0, "dst_unfused"),
       dskv = dalloc(nw * S * width * 4, "skv"), dsg = dalloc(nw * S * width * 4, "sg"), dout = dalloc(nw * width * 4, "out");
  const float* pk = dproj.as<float>();
  const int32_t* rr = prefill ? nullptr : drr.as<int32_t>();
  auto fused = [&](float* dst, cudaStream_t st) {
    CK(dc::compress_emit(drkv.as<float>(), drg.as<float>(), pk, pk + cw, ld, p0_arg, dape.as<float>(), m, width, overlap,
                         dwin.as<int32_t>(), rr, nw, dnorm.as<float>(), eps, rd, dpos.as<int32_t>(), dinv.as<float>(), dst,
                         ddr.as<int32_t>(), st));
  };
  auto unfused = [&](float* dst, cudaStream_t st) {
    CK(dc::compress_windows(drkv.as<float>(), drg.as<float>(), pk, pk + cw, ld, p0_arg, dape.as<float>(), m, width, overlap,
                            dwin.as<int32_t>(), rr, nw, dskv.as<float>(), dsg.as<float>(), st));
    CK(dc::compress_pool(dskv.as<float>(), dsg.as<float>(), nw, S, width, dout.as<float>(), st));
    CK(dc::rms_norm(dout.as<float>(), nw, width, width, dnorm.as<float>(), eps, dout.as<float>(), nullptr, st));
    CK(dc::rope(dout.as<float>(), nw, width, 1, width, rd, dpos.as<int32_t>(), dinv.as<float>(), false, st));
    CK(dc::copy_rows(dout.as<float>(), width, nullptr, 0, 0, dst, width, ddr.as<int32_t>(), 0, 0, nw, width, st));
  };
  fused(ddst.as<float>(), 0);
  unfused(dref.as<float>(), 0);
  auto got = down<float>(ddst, P * width), chain = down<float>(dref, P * width);
  std::vector<float> ref(dst0);
  cpu().compress_emit(rkv.data(), rg.data(), proj.data(), proj.data() + cw, ld, p0_arg, ape.data(), m, width, overlap,
                      wins.data(), prefill ? nullptr : rrows.data(), nw, norm.data(), eps, rd, pos.data(), inv.data(),
                      ref.data(), drows.data());
  std::vector<float> gw, rw;
  bool kept = true;
  int64_t written = 0, chain_diff = 0;
  std::vector<bool> is_written(P, false);
  for (int32_t d : drows)
    if (d >= 0) is_written[d] = true;
  for (int64_t row = 0; row < P; ++row) {
    const float* g = got.data() + row * width;
    if (is_written[row]) {
      ++written;
      gw.insert(gw.end(), g, g + width);
      rw.insert(rw.end(), ref.data() + row * width, ref.data() + (row + 1) * width);
      chain_diff += !rows_bitwise_equal(g, chain.data() + row * width, width);
    } else {
      kept &= rows_bitwise_equal(g, dst0.data() + row * width, width);
    }
  }
  expect_nmse(res, "entries", gw, rw, 1e-10);
  expect_true(res, kept, "a row that is not a closing window's was written");
  std::string err;
  const bool captured = run_in_graph([&](cudaStream_t st) { fused(dref.as<float>(), st); }, err);
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, down<float>(dref, P * width) == got, "graph != eager (bitwise)");
  char buf[200];
  snprintf(buf, sizeof buf, "%ld of %ld windows written; %s ", (long)written, (long)nw,
           chain_diff ? "differs from the unfused CUDA chain in some rows (info)" : "== unfused CUDA chain (bitwise)");
  res.detail += buf;
  if (chain_diff) res.detail += std::to_string(chain_diff) + " rows differ ";
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us([&](cudaStream_t st) { fused(ddst.as<float>(), st); }, reps);
    const double un = time_graph_us([&](cudaStream_t st) { unfused(dref.as<float>(), st); }, reps);
    res.us = time_us([&] { fused(ddst.as<float>(), 0); });
    res.bytes = (double)written * (S * width * 8.0 + width * 4.0);
    snprintf(buf, sizeof buf, "graph/call: fused %.2f us, unfused chain (5 launches) %.2f us (%.2fx) ", res.graph_us, un,
             un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

// copy_rows_multi against the CPU twin (copy_rows per set): the compressor-ring pushes of a step (kv, gate
// of the main compressor, then the indexer's, column slices of one projection row of width 2·cw + 2·icw);
// both rings compared bitwise whole (rows −1 and the rows no set names untouched), graph == eager.
Result copy_rows_multi_case(int64_t n, int nsets, int skip_pct, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t cw = 1024, icw = 256, lds = 2 * cw + 2 * icw, nsrc = n + 5;
  const int64_t RA = 2 * n + 7, RB = 2 * n + 9;  // ring rows (kv rows and gate rows of one ring buffer)
  std::vector<float> src = randn(r, nsrc * lds), ra0 = randn(r, RA * cw), rb0 = randn(r, RB * icw);
  std::vector<int32_t> srows(n), rows[4];
  for (auto& v : srows) v = r.range(0, (int)nsrc);
  for (int k = 0; k < 4; k += 2) {  // sets k, k + 1 share a ring: distinct rows across both
    const int64_t RR = k == 0 ? RA : RB;
    std::vector<int32_t> perm(RR);
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = RR - 1; i > 0; --i) std::swap(perm[i], perm[r.range(0, (int)i + 1)]);
    for (int64_t i = 0; i < n; ++i) {
      rows[k].push_back(r.range(0, 100) < skip_pct ? -1 : perm[i]);
      rows[k + 1].push_back(r.range(0, 100) < skip_pct ? -1 : perm[n + i]);
    }
  }
  DBuf dsrc = dup(src, "src"), dsr = dup(srows, "src_rows"), dra = dup(ra0, "ring_a"), drb = dup(rb0, "ring_b"),
       dra2 = dup(ra0, "ring_a_graph"), drb2 = dup(rb0, "ring_b_graph"), dr0 = dup(rows[0], "rows_kv"),
       dr1 = dup(rows[1], "rows_gate"), dr2 = dup(rows[2], "rows_ikv"), dr3 = dup(rows[3], "rows_igate");
  const int64_t col[4] = {0, cw, 2 * cw, 2 * cw + icw}, wid[4] = {cw, cw, icw, icw};
  const DBuf* drow[4] = {&dr0, &dr1, &dr2, &dr3};
  auto dsets = [&](const DBuf& a, const DBuf& b, dc::RowCopySet* s) {
    for (int k = 0; k < 4; ++k) s[k] = {col[k], (k < 2 ? a : b).as<float>(), wid[k], drow[k]->as<int32_t>(), wid[k]};
  };
  dc::RowCopySet s1[4], s2[4];
  dsets(dra, drb, s1);
  dsets(dra2, drb2, s2);
  CK(dc::copy_rows_multi(dsrc.as<float>(), lds, dsr.as<int32_t>(), s1, nsets, n, 0));
  auto ga = down<float>(dra, RA * cw), gb = down<float>(drb, RB * icw);
  std::vector<float> ra(ra0), rb(rb0);
  Backend::RowCopy hs[4];
  for (int k = 0; k < 4; ++k) hs[k] = {col[k], k < 2 ? ra.data() : rb.data(), wid[k], rows[k].data(), wid[k]};
  cpu().copy_rows_multi(src.data(), lds, srows.data(), hs, nsets, n);
  expect_true(res, ga == ra && gb == rb, "rings differ from copy_rows per set (bitwise)");
  std::string err;
  const bool captured =
      run_in_graph([&](cudaStream_t st) { CK(dc::copy_rows_multi(dsrc.as<float>(), lds, dsr.as<int32_t>(), s2, nsets, n, st)); }, err);
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, down<float>(dra2, RA * cw) == ga && down<float>(drb2, RB * icw) == gb, "graph != eager");
  if (res.pass) res.detail += "== copy_rows per set (bitwise), graph == eager ";
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us(
        [&](cudaStream_t st) { CK(dc::copy_rows_multi(dsrc.as<float>(), lds, dsr.as<int32_t>(), s1, nsets, n, st)); }, reps);
    const double un = time_graph_us(
        [&](cudaStream_t st) {
          for (int k = 0; k < nsets; ++k)
            CK(dc::copy_rows(dsrc.as<float>() + col[k], lds, dsr.as<int32_t>(), 0, 0, s1[k].dst, wid[k], s1[k].dst_rows, 0,
                             0, n, wid[k], st));
        },
        reps);
    res.us = time_us([&] { CK(dc::copy_rows_multi(dsrc.as<float>(), lds, dsr.as<int32_t>(), s1, nsets, n, 0)); });
    int64_t w = 0;
    for (int k = 0; k < nsets; ++k) w += wid[k];
    res.bytes = n * w * 8.0;
    char buf[160];
    snprintf(buf, sizeof buf, "graph/call: one launch %.2f us, %d copy_rows %.2f us (%.2fx) ", res.graph_us, nsets, un,
             un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

// The dense GEMV's fused SwiGLU (linear_swiglu: the shared expert's w13 at decode): act bitwise
// swiglu_clamp of the unfused GEMV's output (check_fused_swiglu: act padding untouched, the clamp reached),
// NMSE against swiglu_clamp of the f64 reference, and every row launched alone bitwise equal to the
// same row in the M-row launch. v3: gemv_q_v3(_swiglu) (the backend's M ≤ 8), else gemv_q(_swiglu).
Result gemv_swiglu_case(dc::WFmt fmt, int64_t M, int64_t N, int64_t K, int ver, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const HostQ q = make_hostq(r, fmt, N, K, 0);
  const int64_t I = N / 2, ldx = K + 4;
  const float lim = 1.0f;
  std::vector<float> x = randn(r, M * ldx);
  DevQ dq = upload_q(q);
  DBuf dx = dup(x, "x"), dact = dalloc(M * I * 4, "act"), dact1 = dalloc(I * 4, "act_alone"), dgu = dalloc(M * N * 4, "gu");
  auto plain = [&](const float* xp, int64_t rows, float* y, int64_t ldy, cudaStream_t st) {
    return ver == 3   ? dc::gemv_q_v3(xp, rows, K, ldx, dq.ref(), N, y, ldy, st)
           : ver == 8 ? dc::gemv_q_v8(xp, rows, K, ldx, dq.ref(), N, y, ldy, st)
           : ver == 6 ? dc::gemv_q_v6(xp, rows, K, ldx, dq.ref(), N, y, ldy, st)
                      : dc::gemv_q(xp, rows, K, ldx, dq.ref(), N, y, ldy, st);
  };
  auto fused = [&](const float* xp, int64_t rows, float limit, float* a, int64_t lda, cudaStream_t st) {
    return ver == 3   ? dc::gemv_q_v3_swiglu(xp, rows, K, ldx, dq.ref(), N, limit, a, lda, st)
           : ver == 8 ? dc::gemv_q_v8_swiglu(xp, rows, K, ldx, dq.ref(), N, limit, a, lda, st)
           : ver == 6 ? dc::gemv_q_v6_swiglu(xp, rows, K, ldx, dq.ref(), N, limit, a, lda, st)
                      : dc::gemv_q_swiglu(xp, rows, K, ldx, dq.ref(), N, limit, a, lda, st);
  };
  if (ver == 6) expect_true(res, dc::gemv_q_v6_swiglu_ok(fmt, N, K), "gemv_q_v6_swiglu_ok false for this shape");
  if (ver == 8) expect_true(res, dc::gemv_q_v8_swiglu_ok(fmt, N, K), "gemv_q_v8_swiglu_ok false for this shape");
  check_fused_swiglu(res, M, N, I + 4, lim, [&](bool fuse, float limit, float* y, int64_t ldy) {
    return fuse ? fused(dx.as<float>(), M, limit, y, ldy, 0) : plain(dx.as<float>(), M, y, ldy, 0);
  });
  poison(dact);
  CK(fused(dx.as<float>(), M, lim, dact.as<float>(), I, 0));
  auto ag = down<float>(dact, M * I);
  std::vector<int64_t> all(N);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> gu(M * N), ar(M * I);
  std::vector<double> yd;
  bool inv_ok = true;
  for (int64_t m = 0; m < M; ++m) {
    gemv_ref_rows(q, x.data() + m * ldx, all, yd);
    for (int64_t c = 0; c < N; ++c) gu[m * N + c] = (float)yd[c];
    poison(dact1);
    CK(fused(dx.as<float>() + m * ldx, 1, lim, dact1.as<float>(), I, 0));
    auto a1 = down<float>(dact1, I);
    inv_ok &= rows_bitwise_equal(a1.data(), ag.data() + m * I, I);
  }
  cpu().swiglu_clamp(gu.data(), M, I, lim, nullptr, ar.data());
  expect_nmse(res, "act", ag, ar, 1e-6);
  expect_true(res, inv_ok, "batch invariance: a row alone differs from the same row in the batch");
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us([&](cudaStream_t st) { CK(fused(dx.as<float>(), M, lim, dact.as<float>(), I, st)); }, reps);
    const double un = time_graph_us(
        [&](cudaStream_t st) {
          CK(plain(dx.as<float>(), M, dgu.as<float>(), N, st));
          CK(dc::swiglu_clamp(dgu.as<float>(), M, I, lim, nullptr, dact.as<float>(), nullptr, st));
        },
        reps);
    res.us = time_us([&] { CK(fused(dx.as<float>(), M, lim, dact.as<float>(), I, 0)); });
    res.bytes = (double)(q.w.size() + q.s.size()) + M * K * 4.0 + M * I * 4.0;
    char buf[160];
    snprintf(buf, sizeof buf, "graph/call: fused %.2f us, gemv + swiglu_clamp %.2f us (%.2fx) ", res.graph_us, un,
             un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

// moe_combine with the shared expert's output (moe_ffn's shared addend) bitwise equal to the combine
// without it followed by add_rows (the unfused order), for the current and the v1 kernel.
Result combine_shared_case(int64_t T, int K, int64_t D, bool slots, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  const int64_t S = T * K;
  std::vector<float> ye = randn(r, S * D), w = randn(r, S), sh = randn(r, T * D, 0.5f);
  std::vector<int32_t> sel(S), slot(S);
  for (int64_t i = 0; i < S; ++i) sel[i] = (int32_t)((i * 37 + r.range(0, 5)) % 256), slot[i] = (int32_t)(S - 1 - i);
  DBuf dye = dup(ye, "ye"), dw = dup(w, "wsel"), dsh = dup(sh, "shared"), dsel = dup(sel, "sel"), dsl = dup(slot, "slot"),
       d1 = dalloc(T * D * 4, "out_fused"), d2 = dalloc(T * D * 4, "out_unfused");
  const int32_t* sr = slots ? dsl.as<int32_t>() : nullptr;
  for (int v1 = 0; v1 < 2; ++v1) {
    auto comb = v1 ? dc::moe_combine_v1 : dc::moe_combine;
    poison(d1), poison(d2);
    CK(comb(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), sr, T, K, D, dsh.as<float>(), d1.as<float>(), 0));
    CK(comb(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), sr, T, K, D, nullptr, d2.as<float>(), 0));
    CK(dc::add_rows(dsh.as<float>(), T, D, nullptr, nullptr, d2.as<float>(), 0));
    expect_true(res, down<float>(d1, T * D) == down<float>(d2, T * D),
                std::string(v1 ? "v1: " : "") + "combine(+shared) != combine, add_rows (bitwise)");
  }
  if (res.pass) res.detail += "combine(+shared) == combine then add_rows (bitwise, both kernels) ";
  if (g_perf) {
    constexpr int reps = 20;
    res.graph_us = time_graph_us([&](cudaStream_t st) {
      CK(dc::moe_combine(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), sr, T, K, D, dsh.as<float>(), d1.as<float>(), st));
    }, reps);
    const double un = time_graph_us([&](cudaStream_t st) {
      CK(dc::moe_combine(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), sr, T, K, D, nullptr, d2.as<float>(), st));
      CK(dc::add_rows(dsh.as<float>(), T, D, nullptr, nullptr, d2.as<float>(), st));
    }, reps);
    res.us = time_us([&] {
      CK(dc::moe_combine(dye.as<float>(), dsel.as<int32_t>(), dw.as<float>(), sr, T, K, D, dsh.as<float>(), d1.as<float>(), 0));
    });
    res.bytes = S * D * 4.0 + T * D * 8.0;
    char buf[160];
    snprintf(buf, sizeof buf, "graph/call: combine+shared %.2f us, combine + add_rows %.2f us (%.2fx) ", res.graph_us, un,
             un / res.graph_us);
    res.detail += buf;
  }
  return res;
}

void register_fusecomp(const std::function<std::string(const char*, int64_t)>& nm1) {
  // V4-Flash shapes: d = 512, index_head_dim = 128, rope_dim = 64; CSA rate 4 (overlap), HCA rate 128
  for (int64_t B : {1, 4, 8, 32}) {
    add(nm1("fusecomp compress_emit CSA d=512 m=4 overlap B=%ld (decode, ~half closing)", B),
        [=] { return compress_emit_case(4, 512, true, B, 50, 0, 0, "fc_ce1"); });
    add(nm1("fusecomp compress_emit CSA indexer d=128 m=4 overlap B=%ld (decode, ~half closing)", B),
        [=] { return compress_emit_case(4, 128, true, B, 50, 0, 0, "fc_ce2"); });
    add(nm1("fusecomp compress_emit HCA d=512 m=128 B=%ld (decode, ~half closing)", B),
        [=] { return compress_emit_case(128, 512, false, B, 50, 0, 0, "fc_ce3"); });
  }
  add("fusecomp compress_emit CSA d=512 m=4 overlap B=1 (decode, closing)", [] { return compress_emit_case(4, 512, true, 1, 100, 0, 0, "fc_ce4"); });
  add("fusecomp compress_emit HCA d=512 m=128 B=1 (decode, closing)", [] { return compress_emit_case(128, 512, false, 1, 100, 0, 0, "fc_ce5"); });
  add("fusecomp compress_emit CSA d=512 m=4 overlap B=8 (decode, none closing)", [] { return compress_emit_case(4, 512, true, 8, 0, 0, 0, "fc_ce6"); });
  add("fusecomp compress_emit CSA d=512 m=4 overlap (prefill p0=37 n=64: ring + chunk)",
      [] { return compress_emit_case(4, 512, true, 0, 100, 37, 64, "fc_ce7"); });
  add("fusecomp compress_emit CSA indexer d=128 m=4 overlap (prefill p0=37 n=64)",
      [] { return compress_emit_case(4, 128, true, 0, 100, 37, 64, "fc_ce8"); });
  add("fusecomp compress_emit CSA d=512 m=4 overlap (prefill p0=0 n=4096)",
      [] { return compress_emit_case(4, 512, true, 0, 100, 0, 4096, "fc_ce9"); });
  add("fusecomp compress_emit HCA d=512 m=128 (prefill p0=100 n=300)", [] { return compress_emit_case(128, 512, false, 0, 100, 100, 300, "fc_ce10"); });
  add("fusecomp compress_emit HCA d=512 m=128 (prefill p0=0 n=4096)", [] { return compress_emit_case(128, 512, false, 0, 100, 0, 4096, "fc_ce11"); });
  add("fusecomp compress_emit m=3 width=100 overlap B=5 (column tail, NC=2)", [] { return compress_emit_case(3, 100, true, 5, 60, 0, 0, "fc_ce12"); });
  add("fusecomp compress_emit m=2 width=1024 B=3 (NC=8)", [] { return compress_emit_case(2, 1024, false, 3, 70, 0, 0, "fc_ce13"); });
  for (int64_t n : {1, 8, 32}) {
    add(nm1("fusecomp copy_rows_multi CSA pushes n=%ld (4 sets, stand-in rows -1)", n), [=] { return copy_rows_multi_case(n, 4, 20, "fc_cr1"); });
    add(nm1("fusecomp copy_rows_multi HCA pushes n=%ld (2 sets)", n), [=] { return copy_rows_multi_case(n, 2, 0, "fc_cr2"); });
  }
  add("fusecomp copy_rows_multi n=512 (4 sets, prefill size)", [] { return copy_rows_multi_case(512, 4, 10, "fc_cr3"); });
  add("fusecomp copy_rows_multi n=3 (1 set)", [] { return copy_rows_multi_case(3, 1, 30, "fc_cr4"); });
  // shared expert w13 (V4-Flash: fp8 [2·2048, 4096]); v3 at M ≤ 8 (the backend's choice), gemv_q above
  for (int64_t M : {1, 2, 4, 8})
    add(nm1("fusecomp gemv_q_v3_swiglu fp8 M=%ld N=4096 K=4096 (shared w13)", M),
        [=] { return gemv_swiglu_case(dc::WFmt::FP8_B128, M, 4096, 4096, 3, "fc_gs1"); });
  for (int64_t M : {9, 16, 32})
    add(nm1("fusecomp gemv_q_swiglu fp8 M=%ld N=4096 K=4096 (shared w13, v4)", M),
        [=] { return gemv_swiglu_case(dc::WFmt::FP8_B128, M, 4096, 4096, 4, "fc_gs2"); });
  // v6 (main takes it for every N at M ≤ 8): the schedules of these shapes, one cluster rank and several
  for (int64_t M : {1, 3, 8})
    add(nm1("fusecomp gemv_q_v6_swiglu fp8 M=%ld N=4096 K=4096 (shared w13)", M),
        [=] { return gemv_swiglu_case(dc::WFmt::FP8_B128, M, 4096, 4096, 6, "fc_gs7"); });
  add("fusecomp gemv_q_v6_swiglu bf16 M=2 N=1024 K=512 (cs 4, sw 2)", [] { return gemv_swiglu_case(dc::WFmt::BF16, 2, 1024, 512, 6, "fc_gs8"); });
  add("fusecomp gemv_q_v6_swiglu fp8 M=1 N=32768 K=1024 (cs 1, sw 1: the direct store, 8 tiles a block)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 1, 32768, 1024, 6, "fc_gs9"); });
  add("fusecomp gemv_q_v6_swiglu fp8 M=2 N=8192 K=2048 (cs 4, sw 1)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 2, 8192, 2048, 6, "fc_gs10"); });
  add("fusecomp gemv_q_v6_swiglu fp8 M=1 N=4128 K=4096 (129 pairs: a round past the last pair)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 1, 4128, 4096, 6, "fc_gs11"); });
  add("fusecomp gemv_q_v6_swiglu fp8 M=1 N=6144 K=7168 (V4-Pro-like shared w13)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 1, 6144, 7168, 6, "fc_gs12"); });
  // v8 (the backend's choice at M ≤ 8 where its shapes allow)
  for (int64_t M : {1, 3, 8})
    add(nm1("gemv_q_v8_swiglu fp8 M=%ld N=4096 K=4096 (shared w13)", M),
        [=] { return gemv_swiglu_case(dc::WFmt::FP8_B128, M, 4096, 4096, 8, "g8_gs1"); });
  add("gemv_q_v8_swiglu bf16 M=2 N=1024 K=512", [] { return gemv_swiglu_case(dc::WFmt::BF16, 2, 1024, 512, 8, "g8_gs2"); });
  add("gemv_q_v8_swiglu fp8 M=1 N=32768 K=1024 (1024 pairs)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 1, 32768, 1024, 8, "g8_gs3"); });
  add("gemv_q_v8_swiglu fp8 M=1 N=4128 K=4096 (129 pairs)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 1, 4128, 4096, 8, "g8_gs4"); });
  add("fusecomp gemv_q_v3_swiglu bf16 M=3 N=512 K=1024", [] { return gemv_swiglu_case(dc::WFmt::BF16, 3, 512, 1024, 3, "fc_gs3"); });
  add("fusecomp gemv_q_v3_swiglu fp4 M=1 N=4096 K=4096", [] { return gemv_swiglu_case(dc::WFmt::FP4_B32, 1, 4096, 4096, 3, "fc_gs4"); });
  add("fusecomp gemv_q_swiglu fp4 M=16 N=4096 K=4096 (v4)", [] { return gemv_swiglu_case(dc::WFmt::FP4_B32, 16, 4096, 4096, 4, "fc_gs5"); });
  add("fusecomp gemv_q_swiglu fp8 M=12 N=6144 K=7168 (V4-Pro-like shared w13, v4)",
      [] { return gemv_swiglu_case(dc::WFmt::FP8_B128, 12, 6144, 7168, 4, "fc_gs6"); });
  for (int64_t T : {1, 8})
    add(nm1("fusecomp moe_combine + shared T=%ld K=6 D=4096 (decode slot order)", T),
        [=] { return combine_shared_case(T, 6, 4096, false, "fc_cs1"); });
  add("fusecomp moe_combine + shared T=64 K=6 D=4096 (slot_row)", [] { return combine_shared_case(64, 6, 4096, true, "fc_cs2"); });
}

// =================================================================================================
// =================================================================================================
// hcdec: hc_pre's one-kernel decode path (dc::hc_pre_dec, M ≤ 8) against v3 (dc::hc_pre, what
// DEEPINFER_CUDA_OFF=hcdec runs) bitwise, and against the CPU twin with hc_pre's tolerances; hc_post v2
// (dc::hc_post) against hc_post_v1 bitwise and the CPU twin. The new hc_pre runs eagerly twice and three
// times back to back in a graph with programmatic edges (the arrival counter must wrap and the generation
// advance across launches). --perf: old and new, each n calls in one graph with programmatic edges (as the
// model's step graphs), inputs rotated so that the weights come from HBM as in the model.
// =================================================================================================
DBuf hcdec_sync() {
  DBuf b = dalloc(dc::hc_pre_dec_sync_ints() * 4, "hcdec_sync");
  CK(cudaMemset(b.p(), 0, b.bytes));
  return b;
}

Result hcdec_pre_case(int64_t M, int hc, int64_t D, int iters, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  HcIn in = hc_inputs(r, M, hc, D, false);
  DBuf du = dalloc(M * D * 4, "u"), dp = dalloc(M * hc * 4, "post"), dcm = dalloc(M * hc * hc * 4, "comb");
  DBuf dsync = hcdec_sync();
  expect_true(res, dc::hc_pre_dec_use(M, hc, D), "hc_pre_dec does not take this shape");
  if (!res.pass) return res;
  auto run_new = [&](cudaStream_t st) {
    CK(dc::hc_pre_dec(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), iters,
                      1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), dsync.as<int32_t>(), st));
  };
  auto run_v3 = [&](cudaStream_t st) {
    CK(dc::hc_pre(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), iters, 1e-6f,
                  1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), st, false));
  };
  auto grab = [&](const std::function<void()>& f) {
    poison(du), poison(dp), poison(dcm);
    f();
    CK(cudaGetLastError());
    return std::vector<std::vector<uint8_t>>{down<uint8_t>(du, du.bytes), down<uint8_t>(dp, dp.bytes),
                                             down<uint8_t>(dcm, dcm.bytes)};
  };
  const auto v3 = grab([&] { run_v3(0); });
  const auto a = grab([&] { run_new(0); });
  const auto b = grab([&] { run_new(0); });
  std::string err;
  bool captured = false;
  const auto c = grab([&] { captured = run_in_graph(run_new, err, 3, true); });
  expect_true(res, a == v3, "new != v3 (bitwise)");
  expect_true(res, b == v3, "second launch != v3 (bitwise)");
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, c == v3, "graph (3 launches, programmatic edges) != v3 (bitwise)");
  const auto sy = down<int32_t>(dsync, 2);
  expect_true(res, sy[0] == 0, "arrival counter not 0 after the launches: " + std::to_string(sy[0]));
  if (res.pass) res.detail += "new == v3 == graph x3 (bitwise) ";
  std::vector<float> u(M * D), p(M * hc), cm(M * hc * hc), ur(M * D), pr(M * hc), cr(M * hc * hc);
  std::memcpy(u.data(), a[0].data(), u.size() * 4), std::memcpy(p.data(), a[1].data(), p.size() * 4);
  std::memcpy(cm.data(), a[2].data(), cm.size() * 4);
  cpu().hc_pre(in.X.data(), M, hc, D, in.fn.data(), in.base.data(), in.scale.data(), iters, 1e-6f, 1e-6f, ur.data(),
               pr.data(), cr.data());
  expect_nmse(res, "u", u, ur, 1e-9);
  expect_nmse(res, "post", p, pr, 1e-9);
  expect_nmse(res, "comb", cm, cr, 1e-8);
  return res;
}

// hc_pre_norm at decode: hc_pre_dec with the norm fused into its finishers (h = rms_norm(u)) against the two launches
// the backend runs otherwise (hc_pre_dec, then cuda::rms_norm: its warp kernel at D ≤ 1024, its block kernel above)
// bitwise — u, post, comb and h — eagerly and from a graph with programmatic edges; h against the CPU twin.
Result hcnorm_case(int64_t M, int hc, int64_t D, bool weights, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  HcIn in = hc_inputs(r, M, hc, D, false);
  std::vector<float> w = randn(r, D, 0.5f);
  for (auto& v : w) v += 1.0f;
  DBuf dw = dup(w, "norm_w");
  const float* wp = weights ? dw.as<float>() : nullptr;
  const float eps = 1e-6f;
  DBuf du = dalloc(M * D * 4, "u"), dp = dalloc(M * hc * 4, "post"), dcm = dalloc(M * hc * hc * 4, "comb"),
       dh = dalloc(M * D * 4, "h");
  DBuf dsync = hcdec_sync();
  expect_true(res, dc::hc_pre_dec_norm_ok(M, hc, D, du.as<float>(), wp, dh.as<float>()),
              "hc_pre_dec_norm_ok refuses this shape");
  if (!res.pass) return res;
  auto run = [&](bool fused, cudaStream_t st) {
    if (fused) {
      CK(dc::hc_pre_dec(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), 20,
                        1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), dsync.as<int32_t>(), st, wp, eps,
                        dh.as<float>()));
    } else {
      CK(dc::hc_pre_dec(in.dX.as<float>(), M, hc, D, in.df.as<float>(), in.db.as<float>(), in.ds.as<float>(), 20,
                        1e-6f, 1e-6f, du.as<float>(), dp.as<float>(), dcm.as<float>(), dsync.as<int32_t>(), st));
      CK(dc::rms_norm(du.as<float>(), M, D, D, wp, eps, dh.as<float>(), nullptr, st));
    }
  };
  auto grab = [&](const std::function<void()>& f) {
    poison(du), poison(dp), poison(dcm), poison(dh);
    f();
    CK(cudaGetLastError());
    return std::vector<std::vector<uint8_t>>{down<uint8_t>(du, du.bytes), down<uint8_t>(dp, dp.bytes),
                                             down<uint8_t>(dcm, dcm.bytes), down<uint8_t>(dh, dh.bytes)};
  };
  const auto ref = grab([&] { run(false, 0); });
  const auto a = grab([&] { run(true, 0); });
  std::string err;
  bool captured = false;
  const auto c = grab([&] { captured = run_in_graph([&](cudaStream_t st) { run(true, st); }, err, 3, true); });
  expect_true(res, a == ref, "fused != hc_pre_dec + rms_norm (bitwise)");
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, c == ref, "graph (3 launches, programmatic edges) != two launches (bitwise)");
  if (res.pass) res.detail += "fused == hc_pre_dec + rms_norm == graph x3 (bitwise: u, post, comb, h) ";
  std::vector<float> u(M * D), h(M * D), hr(M * D);
  std::memcpy(u.data(), a[0].data(), u.size() * 4), std::memcpy(h.data(), a[3].data(), h.size() * 4);
  cpu().rms_norm(u.data(), M, D, D, wp ? w.data() : nullptr, eps, hr.data());
  expect_nmse(res, "h vs CPU rms_norm(u)", h, hr, 1e-11);
  return res;
}

// perf: n calls, each with its own copy of fn (64 × 1.57 MB > L2, so fn comes from HBM as in the model, where
// every layer has its own); X fixed (written just before in the model: in L2).
// iters = 1: the Sinkhorn's share of the call (its 20-iteration chain is the serial tail of the finishing warp)
Result hcdec_pre_perf(int64_t M, int iters, const std::string& name) {
  const int hc = 4;
  const int64_t D = 4096, W = hc * D, mix = (2 + hc) * hc;
  Rng r = rng_for(name);
  Result res;
  const int copies = 64;
  std::vector<float> X = randn(r, M * W), fn = randn(r, mix * W, 0.02f), base = randn(r, mix, 0.5f);
  std::vector<float> scale = {1.0f, 1.1f, 0.9f};
  DBuf dX = dup(X, "X"), db = dup(base, "base"), ds = dup(scale, "scale"), df = dalloc(copies * mix * W * 4, "fn");
  for (int c = 0; c < copies; ++c) CK(cudaMemcpy(df.as<float>() + c * mix * W, fn.data(), mix * W * 4, cudaMemcpyHostToDevice));
  DBuf du = dalloc(M * D * 4, "u"), dp = dalloc(M * hc * 4, "post"), dcm = dalloc(M * hc * hc * 4, "comb");
  DBuf dsync = hcdec_sync();
  int it = 0;
  auto run = [&](bool v3, cudaStream_t st) {
    const float* f = df.as<float>() + (it++ % copies) * mix * W;
    if (v3)
      CK(dc::hc_pre(dX.as<float>(), M, hc, D, f, db.as<float>(), ds.as<float>(), iters, 1e-6f, 1e-6f, du.as<float>(),
                    dp.as<float>(), dcm.as<float>(), st, false));
    else
      CK(dc::hc_pre_dec(dX.as<float>(), M, hc, D, f, db.as<float>(), ds.as<float>(), iters, 1e-6f, 1e-6f,
                        du.as<float>(), dp.as<float>(), dcm.as<float>(), dsync.as<int32_t>(), st));
  };
  res.graph_us = time_graph_us([&](cudaStream_t st) { run(false, st); }, copies, true);
  const double v3 = time_graph_us([&](cudaStream_t st) { run(true, st); }, copies, true);
  const double plain = time_graph_us([&](cudaStream_t st) { run(false, st); }, copies, false);
  const double v3plain = time_graph_us([&](cudaStream_t st) { run(true, st); }, copies, false);
  res.us = res.graph_us;
  res.bytes = M * W * 4.0 + mix * W * 4.0 + M * D * 4.0;
  char buf[200];
  snprintf(buf, sizeof buf,
           "graph/call, programmatic edges: new %.2f us, v3 %.2f us (%.2fx); plain edges: new %.2f us, v3 %.2f us ",
           res.graph_us, v3, v3 / res.graph_us, plain, v3plain);
  res.detail += buf;
  return res;
}

Result hcdec_post_case(int64_t M, int hc, int64_t D, const std::string& name) {
  Rng r = rng_for(name);
  Result res;
  std::vector<float> X = randn(r, M * hc * D), y = randn(r, M * D), post = randn(r, M * hc), comb = randn(r, M * hc * hc, 0.3f);
  DBuf dX = dup(X, "X"), dy = dup(y, "y"), dp = dup(post, "post"), dcm = dup(comb, "comb"), dout = dalloc(M * hc * D * 4, "out");
  auto grab = [&](const std::function<void()>& f) {
    poison(dout);
    f();
    CK(cudaGetLastError());
    return down<uint8_t>(dout, dout.bytes);
  };
  auto run = [&](bool v1, cudaStream_t st) {
    CK((v1 ? dc::hc_post_v1 : dc::hc_post)(dX.as<float>(), dy.as<float>(), dp.as<float>(), dcm.as<float>(), M, hc, D,
                                           dout.as<float>(), st));
  };
  const auto a = grab([&] { run(false, 0); }), b = grab([&] { run(true, 0); });
  std::string err;
  bool captured = false;
  const auto c = grab([&] { captured = run_in_graph([&](cudaStream_t st) { run(false, st); }, err, 2, true); });
  expect_true(res, a == b, "new != v1 (bitwise)");
  expect_true(res, captured, "graph capture: " + err);
  if (captured) expect_true(res, a == c, "graph (programmatic edges) != eager (bitwise)");
  if (res.pass) res.detail += "new == v1 == graph (bitwise) ";
  std::vector<float> o(M * hc * D), orf(M * hc * D);
  std::memcpy(o.data(), a.data(), o.size() * 4);
  cpu().hc_post(X.data(), y.data(), post.data(), comb.data(), M, hc, D, orf.data());
  expect_nmse(res, "out", o, orf, 1e-12);
  return res;
}

// perf: n calls, X rotated over up to 64 copies (≤ 256 MB; 64 × 64 KB a row: in L2 at M ≤ 8; the model's X is
// a layer old and likely comes from HBM, ~0.5 µs more for either kernel), y fixed (written just before).
Result hcdec_post_perf(int64_t M, const std::string& name) {
  const int hc = 4;
  const int64_t D = 4096, W = hc * D;
  Rng r = rng_for(name);
  Result res;
  const int copies = (int)std::max<int64_t>(1, std::min<int64_t>(64, (256ll << 20) / (M * W * 4)));
  const int n = std::max(copies, 8);  // calls in the graph
  std::vector<float> X = randn(r, M * W), y = randn(r, M * D), post = randn(r, M * hc), comb = randn(r, M * hc * hc, 0.3f);
  DBuf dX = dalloc(copies * M * W * 4, "X"), dy = dup(y, "y"), dp = dup(post, "post"), dcm = dup(comb, "comb");
  for (int c = 0; c < copies; ++c) CK(cudaMemcpy(dX.as<float>() + c * M * W, X.data(), M * W * 4, cudaMemcpyHostToDevice));
  DBuf dout = dalloc(M * W * 4, "out");
  int it = 0;
  auto run = [&](bool v1, cudaStream_t st) {
    const float* x = dX.as<float>() + (it++ % copies) * M * W;
    CK((v1 ? dc::hc_post_v1 : dc::hc_post)(x, dy.as<float>(), dp.as<float>(), dcm.as<float>(), M, hc, D,
                                           dout.as<float>(), st));
  };
  res.graph_us = time_graph_us([&](cudaStream_t st) { run(false, st); }, n, true);
  const double v1 = time_graph_us([&](cudaStream_t st) { run(true, st); }, n, true);
  const double plain = time_graph_us([&](cudaStream_t st) { run(false, st); }, n, false);
  const double v1plain = time_graph_us([&](cudaStream_t st) { run(true, st); }, n, false);
  res.us = res.graph_us;
  res.bytes = M * W * 8.0 + M * D * 4.0;
  char buf[200];
  snprintf(buf, sizeof buf,
           "graph/call, programmatic edges: new %.2f us, v1 %.2f us (%.2fx); plain edges: new %.2f us, v1 %.2f us ",
           res.graph_us, v1, v1 / res.graph_us, plain, v1plain);
  res.detail += buf;
  return res;
}

void register_hcdec(const std::function<std::string(const char*, int64_t)>& nm1) {
  for (int64_t M : {1, 2, 4, 8}) {
    add(nm1("hcdec hc_pre M=%ld hc=4 D=4096 it=20 (new == v3, CPU)", M), [=] { return hcdec_pre_case(M, 4, 4096, 20, "hd1"); });
    add(nm1("hcdec hc_post M=%ld hc=4 D=4096 (new == v1, CPU)", M), [=] { return hcdec_post_case(M, 4, 4096, "hd2"); });
  }
  add("hcdec hc_pre M=3 hc=3 D=1000 it=20 (partial last slice, S=24)", [] { return hcdec_pre_case(3, 3, 1000, 20, "hd3"); });
  add("hcdec hc_pre M=5 hc=4 D=7168 it=20 (V4 width, S=224)", [] { return hcdec_pre_case(5, 4, 7168, 20, "hd4"); });
  add("hcdec hc_pre M=7 hc=2 D=512 it=3 (hc=2, S=8)", [] { return hcdec_pre_case(7, 2, 512, 3, "hd5"); });
  add("hcdec hc_pre M=2 hc=1 D=512 it=1 (hc=1)", [] { return hcdec_pre_case(2, 1, 512, 1, "hd6"); });
  add("hcdec hc_pre M=4 hc=4 D=100 it=20 (S*NV == D, S=4)", [] { return hcdec_pre_case(4, 4, 100, 20, "hd7"); });
  // the fused norm: the rms_norm kernels cuda::rms_norm picks for D (warp NC 2 / 4 / 8, block NC 2 / 4 / 8)
  for (int64_t M : {1, 8})
    add(nm1("hcnorm hc_pre_norm M=%ld hc=4 D=4096 (block kernel, NC 4)", M), [=] { return hcnorm_case(M, 4, 4096, true, "hn1"); });
  add("hcnorm hc_pre_norm M=3 hc=4 D=7168 (block kernel, NC 8)", [] { return hcnorm_case(3, 4, 7168, true, "hn2"); });
  add("hcnorm hc_pre_norm M=2 hc=4 D=1536 no weights (block kernel, NC 2)", [] { return hcnorm_case(2, 4, 1536, false, "hn3"); });
  add("hcnorm hc_pre_norm M=1 hc=4 D=256 (warp kernel, NC 2: nano)", [] { return hcnorm_case(1, 4, 256, true, "hn4"); });
  add("hcnorm hc_pre_norm M=5 hc=3 D=512 (warp kernel, NC 4)", [] { return hcnorm_case(5, 3, 512, true, "hn5"); });
  add("hcnorm hc_pre_norm M=4 hc=3 D=1000 (warp kernel, NC 8, partial slice)", [] { return hcnorm_case(4, 3, 1000, true, "hn6"); });
  add("hcnorm hc_pre_norm M=2 hc=3 D=64 (warp kernel, fixture width, S=2)", [] { return hcnorm_case(2, 3, 64, true, "hn7"); });
  add("hcdec hc_post M=3 hc=3 D=1000 (partial block)", [] { return hcdec_post_case(3, 3, 1000, "hd8"); });
  add("hcdec hc_post M=5 hc=8 D=1028 (hc=8)", [] { return hcdec_post_case(5, 8, 1028, "hd9"); });
  add("hcdec hc_post M=300 hc=4 D=4096 (prefill size)", [] { return hcdec_post_case(300, 4, 4096, "hd10"); });
  if (g_perf) {
    for (int64_t M : {1, 2, 4, 8}) {
      auto n = nm1("hcdec perf hc_pre M=%ld hc=4 D=4096 it=20 (V4-Flash, fn from HBM)", M);
      add(n, [=] { return hcdec_pre_perf(M, 20, n); });
    }
    for (int64_t M : {1, 8}) {  // the same with a one-iteration Sinkhorn: what moving it off hc_pre could gain
      auto n = nm1("hcdec perf hc_pre M=%ld hc=4 D=4096 it=1 (the Sinkhorn's share)", M);
      add(n, [=] { return hcdec_pre_perf(M, 1, n); });
    }
    for (int64_t M : {1, 2, 4, 8, 64, 4096}) {  // 4096: the prefill size must not get slower
      auto n = nm1("hcdec perf hc_post M=%ld hc=4 D=4096 (V4-Flash)", M);
      add(n, [=] { return hcdec_post_perf(M, n); });
    }
  }
}

void register_cases() {
  const int64_t D = 4096, H = 64, d = 512, ql = 1024, ol = 1024, G = 8, I = 2048, Vv = 129280;
  char buf[200];
  auto nm = [&](const char* fmt, auto... a) {
    snprintf(buf, sizeof buf, fmt, a...);
    return std::string(buf);
  };
  register_smallk([&](const char* fmt, int64_t v) { return nm(fmt, (long)v); });
  register_fusecomp([&](const char* fmt, int64_t v) { return nm(fmt, (long)v); });
  register_hcdec([&](const char* fmt, int64_t v) { return nm(fmt, (long)v); });
  add(nm("f32_to_bf16 n=%d", 1 << 24), [] { return cvt_case(1 << 24, "cvt"); });
  for (auto MK : {std::pair<int64_t, int64_t>{64, D}, {4096, 7168}}) {
    const int64_t M = MK.first, K = MK.second;
    auto n = nm("quant_act_fp8 M=%ld K=%ld", M, K);
    add(n, [=] { return quant_case(M, K, n); });
  }
  add("cublaslt_fp8_scale_layout_probe", [] { return lt_fp8_layout_probe("probe"); });
  for (auto MN : {std::pair<int64_t, int64_t>{1, Vv}, {8, Vv}, {37, 1000}, {256, Vv}}) {  // clusters of 16, 16, 2, 1
    auto n = nm("argmax_rows M=%ld N=%ld", MN.first, MN.second);
    add(n, [=] { return argmax_case(MN.first, MN.second, n); });
  }
  struct GS { int64_t M, N, K; const char* what; };
  const GS bf[] = {{1, ql, D, "wq_a decode"}, {2, H * d, ql, "wq_b decode M=2"}, {4, Vv, D, "head decode M=4"},
                   {64, ql, D, "wq_a"}, {64, H * d, ql, "wq_b"}, {512, d, D, "wkv"},
                   {512, ol, H * d / G, "wo_a/group"}, {512, D, G * ol, "wo_b"}, {32, Vv, D, "head"},
                   {4096, 4096, 4096, "square 4k"}};
  for (auto k : {GemmKind::Bf16Lt, GemmKind::Bf16Own})
    for (auto g : bf) {
      auto n = nm("%s M=%ld N=%ld K=%ld (%s)", kind_name(k), g.M, g.N, g.K, g.what);
      add(n, [=] { return gemm_case(k, g.M, g.N, g.K, n); });
    }
  const GS f8[] = {{1, ql, D, "wq_a decode"}, {4, D, G * ol, "wo_b decode M=4"}, {64, H * d, ql, "wq_b"}, {512, D, G * ol, "wo_b"},
                   {256, 2 * I, D, "shared w13"}, {4096, 4096, 4096, "square 4k"}};
  for (auto k : {GemmKind::Fp8Lt, GemmKind::Fp8Own})
    for (auto g : f8) {
      auto n = nm("%s M=%ld N=%ld K=%ld (%s)", kind_name(k), g.M, g.N, g.K, g.what);
      add(n, [=] { return gemm_case(k, g.M, g.N, g.K, n); });
    }
  const GS f4[] = {{1, 2 * I, D, "expert w13 decode"}, {3, D, I, "expert w2 decode M=3"}, {64, 2 * I, D, "expert w13"},
                   {64, D, I, "expert w2"}, {1024, 2 * I, D, "expert w13 prefill"}};
  for (auto k : {GemmKind::Fp4Bf16A, GemmKind::Fp4Fp8A})
    for (auto g : f4) {
      auto n = nm("%s M=%ld N=%ld K=%ld (%s)", kind_name(k), g.M, g.N, g.K, g.what);
      add(n, [=] { return gemm_case(k, g.M, g.N, g.K, n); });
    }
  add("rms_norm M=64 D=4096 w", [] { return rms_case(64, 4096, 4096, true, "rms1"); });
  add("rms_norm M=4096 D=4096 w", [] { return rms_case(4096, 4096, 4096, true, "rms1b"); });
  add("rms_norm M=64 D=1024 ld=1088 w (q_norm)", [] { return rms_case(64, 1024, 1088, true, "rms2"); });
  add("rms_norm M=4096 D=512 (per-head q, 64 tok x 64 heads)", [] { return rms_case(4096, 512, 512, false, "rms3"); });
  add("rms_norm M=8 D=16384 ld=16400 w (big rows)", [] { return rms_case(8, 16384, 16400, true, "rms4"); });
  add("rope M=64 H=64 hd=512 r=64 fwd", [] { return rope_case(64, 64, 512, 64, false, "rope1"); });
  add("rope M=64 H=64 hd=512 r=64 inverse", [] { return rope_case(64, 64, 512, 64, true, "rope2"); });
  add("rope M=512 H=1 hd=512 r=64 (kv)", [] { return rope_case(512, 1, 512, 64, false, "rope3"); });
  add("rope M=64 H=64 hd=128 r=64 (indexer q)", [] { return rope_case(64, 64, 128, 64, false, "rope4"); });
  // norm_rope (fuseattn): V4-Flash (H=64, d=512, q_lora 1024, indexer 64×128), V4-Pro (H=128, q_lora 1536),
  // sliding/HCA layers (no indexer q), odd shapes (a rope span starting inside a float4, d = 1024, d < 128)
  for (int64_t M : {1, 2, 8, 32, 128, 300}) {
    add(nm("norm_rope M=%ld H=64 d=512 r=64 ql=1024 idx 64x128 (V4-Flash CSA)", (long)M),
        [=] { return norm_rope_case(M, 64, 512, 64, 1024, 64, 128, false, "nr1"); });
    add(nm("norm_rope M=%ld H=64 d=512 r=64 ql=1024 (V4-Flash SWA/HCA)", (long)M),
        [=] { return norm_rope_case(M, 64, 512, 64, 1024, 0, 0, false, "nr2"); });
  }
  for (int64_t M : {1, 8, 300})
    add(nm("norm_rope M=%ld H=128 d=512 r=64 ql=1536 idx 64x128 (V4-Pro CSA)", (long)M),
        [=] { return norm_rope_case(M, 128, 512, 64, 1536, 64, 128, false, "nr3"); });
  add("norm_rope M=5 H=3 d=100 r=34 ql=12 idx 5x36 inverse (rope span mid-float4)",
      [] { return norm_rope_case(5, 3, 100, 34, 12, 5, 36, true, "nr4"); });
  add("norm_rope M=3 H=2 d=1024 r=64 ql=8 (NC=8)", [] { return norm_rope_case(3, 2, 1024, 64, 8, 0, 0, false, "nr5"); });
  add("norm_rope M=7 H=4 d=64 r=64 ql=4 idx 2x64 (whole head rotated, NC=1)",
      [] { return norm_rope_case(7, 4, 64, 64, 4, 2, 64, false, "nr6"); });
  add("norm_rope M=4 H=8 d=128 r=0 ql=128 (norm only)", [] { return norm_rope_case(4, 8, 128, 0, 128, 0, 0, false, "nr7"); });
  for (int64_t M : {1, 8, 300})  // decode: W − 1 = 127 ring rows a sequence; prefill: the chunk's earlier tokens
    add(nm("norm_rope gather M=%ld ql=1024 d=512 ring rows %ld (q_lora norm + window gather)", (long)M, (long)(M == 300 ? 127 : 127 * M)),
        [=] { return norm_gather_case(M, 1024, 512, M == 300 ? 127 : 127 * M, "ng1"); });
  add("norm_rope gather M=3 ql=36 d=100 ring rows 0", [] { return norm_gather_case(3, 36, 100, 0, "ng2"); });
  add("norm_rope gather M=2 ql=512 d=64 ring rows 5", [] { return norm_gather_case(2, 512, 64, 5, "ng3"); });
  add("norm_rope rejects unsupported shapes", [] { return norm_rope_reject_case(); });
  add("swiglu_clamp M=64 I=2048", [] { return swiglu_case(64, 2048, false, "sw1"); });
  add("swiglu_clamp M=4096 I=2048 row_scale", [] { return swiglu_case(4096, 2048, true, "sw2"); });
  add("compress_pool W=64 S=8 d=512", [] { return pool_case(64, 8, 512, "pool1"); });
  add("compress_pool W=16 S=256 d=512", [] { return pool_case(16, 256, 512, "pool2"); });
  add("compress_pool W=64 S=8 d=128 (indexer)", [] { return pool_case(64, 8, 128, "pool3"); });
  add("hc_pre M=1 hc=4 D=4096 it=20", [] { return hc_pre_case(1, 4, 4096, 20, "hc1"); });
  add("hc_pre M=3 hc=4 D=4096 it=20", [] { return hc_pre_case(3, 4, 4096, 20, "hc1b"); });
  add("hc_pre M=64 hc=4 D=4096 it=20 (+ batch invariance)", [] { return hc_pre_case(64, 4, 4096, 20, "hc2", true); });
  add("hc_pre M=1024 hc=4 D=4096 it=20 (+ batch invariance)", [] { return hc_pre_case(1024, 4, 4096, 20, "hc2b", true); });
  add("hc_pre M=7 hc=2 D=64 it=3 (tiny)", [] { return hc_pre_case(7, 2, 64, 3, "hc3"); });
  add("hc_pre M=1 hc=3 D=1000 it=20 (partial last slice)", [] { return hc_pre_case(1, 3, 1000, 20, "hc4"); });
  add("hc_pre M=3 hc=3 D=1000 it=20", [] { return hc_pre_case(3, 3, 1000, 20, "hc4b"); });
  add("hc_pre M=64 hc=3 D=1000 it=20 (+ batch invariance)", [] { return hc_pre_case(64, 3, 1000, 20, "hc4c", true); });
  add("hc_pre M=1024 hc=3 D=1000 it=20", [] { return hc_pre_case(1024, 3, 1000, 20, "hc4d"); });
  add("hc_pre M=40 hc=4 D=100 it=20 (S*NV == D)", [] { return hc_pre_case(40, 4, 100, 20, "hc5", true); });
  add("hc_pre M=5 hc=4 D=20 it=20 (D < NV: v1 kernel)", [] { return hc_pre_case(5, 4, 20, 20, "hc6"); });
  add("hc_pre M=33 hc=8 D=4096 it=20 (hc=8, serial Sinkhorn)", [] { return hc_pre_case(33, 8, 4096, 20, "hc7", true); });
  // prefill path (hc_gemm): forced at small M and odd shapes, by default from M = 1024 on; the invariance
  // checks compare its rows with the v3 kernels' (1 and 8 rows) bitwise
  add("hc_pre_gemm M=300 hc=4 D=4096 it=20 (forced, + batch invariance)",
      [] { return hc_pre_case(300, 4, 4096, 20, "hg1", true, HcPath::Gemm); });
  add("hc_pre_gemm M=1024 hc=4 D=4096 it=20 (default path, + batch invariance)",
      [] { return hc_pre_case(1024, 4, 4096, 20, "hg2", true); });
  add("hc_pre_gemm M=4096 hc=4 D=4096 it=20 (default path, + batch invariance)",
      [] { return hc_pre_case(4096, 4, 4096, 20, "hg3", true); });
  add("hc_pre_gemm M=2100 hc=4 D=4096 it=20 (BM=16 tiles, + batch invariance)",
      [] { return hc_pre_case(2100, 4, 4096, 20, "hg4", true); });
  add("hc_pre_gemm M=301 hc=3 D=1000 it=20 (forced, partial chunk/slice, + batch invariance)",
      [] { return hc_pre_case(301, 3, 1000, 20, "hg5", true, HcPath::Gemm); });
  add("hc_pre_gemm M=40 hc=4 D=100 it=20 (forced, S*NV == D, + batch invariance)",
      [] { return hc_pre_case(40, 4, 100, 20, "hg6", true, HcPath::Gemm); });
  add("hc_pre_gemm M=7 hc=2 D=64 it=3 (forced, tiny, + batch invariance)",
      [] { return hc_pre_case(7, 2, 64, 3, "hg7", true, HcPath::Gemm); });
  add("hc_pre_gemm M=9 hc=1 D=256 it=1 (forced, hc=1, + batch invariance)",
      [] { return hc_pre_case(9, 1, 256, 1, "hg8", true, HcPath::Gemm); });
  // hcfast (fused ticketed kernel): bitwise v3, so every case also checks rows against M = 1 / 8 launches
  add("hc_pre_fast M=4096 hc=4 D=4096 it=20 (32 tiles, + batch invariance)",
      [] { return hc_pre_case(4096, 4, 4096, 20, "hf1", true, HcPath::Fast); });
  add("hc_pre_fast M=1024 hc=4 D=4096 it=20 (+ batch invariance)",
      [] { return hc_pre_case(1024, 4, 4096, 20, "hf2", true, HcPath::Fast); });
  add("hc_pre_fast M=300 hc=4 D=4096 it=20 (partial tile and F items, + batch invariance)",
      [] { return hc_pre_case(300, 4, 4096, 20, "hf3", true, HcPath::Fast); });
  add("hc_pre_fast M=1 hc=4 D=4096 it=20 (one row)", [] { return hc_pre_case(1, 4, 4096, 20, "hf4", true, HcPath::Fast); });
  add("hc_pre_fast M=259 hc=4 D=7168 it=20 (V4 width, S=224, + batch invariance)",
      [] { return hc_pre_case(259, 4, 7168, 20, "hf5", true, HcPath::Fast); });
  add("hc_pre_fast M=130 hc=3 D=1024 it=20 (hc=3, + batch invariance)",
      [] { return hc_pre_case(130, 3, 1024, 20, "hf6", true, HcPath::Fast); });
  add("hc_pre_fast M=7 hc=2 D=64 it=3 (tiny, S=1, + batch invariance)",
      [] { return hc_pre_case(7, 2, 64, 3, "hf7", true, HcPath::Fast); });
  add("hc_pre_fast M=9 hc=1 D=256 it=1 (hc=1, + batch invariance)",
      [] { return hc_pre_case(9, 1, 256, 1, "hf8", true, HcPath::Fast); });
  add("hc_post M=64 hc=4 D=4096", [] { return hc_post_case(64, 4, 4096, "hp1"); });
  add("hc_post M=1024 hc=4 D=4096", [] { return hc_post_case(1024, 4, 4096, "hp2"); });
  add("hc_head M=64 hc=4 D=4096 (+ batch invariance)", [] { return hc_head_case(64, 4, 4096, "hh1", true); });
  add("hc_head M=1 hc=4 D=4096", [] { return hc_head_case(1, 4, 4096, "hh2"); });
  add("hc_head M=3 hc=3 D=1000", [] { return hc_head_case(3, 3, 1000, "hh3"); });
  add("hc_head M=300 hc=3 D=1000 (+ batch invariance)", [] { return hc_head_case(300, 3, 1000, "hh4", true); });
  if (g_perf) {
    for (int64_t M : {1, 8, 64, 256, 1024, 4096}) {
      auto n = nm("hc_pre perf M=%ld hc=4 D=4096 it=20 (V4-Flash)", M);
      add(n, [=] { return hc_pre_case(M, 4, 4096, 20, n); });
    }
    for (int64_t M : {256, 512, 1024, 4096}) {
      auto n = nm("hc_pre_fast perf M=%ld hc=4 D=4096 it=20 (V4-Flash)", M);
      add(n, [=] { return hc_pre_case(M, 4, 4096, 20, n, false, HcPath::Fast); });
    }
    for (int64_t M : {1, 8, 64, 256}) {
      auto n = nm("hc_head perf M=%ld hc=4 D=4096 (V4-Flash)", M);
      add(n, [=] { return hc_head_case(M, 4, 4096, n); });
    }
  }
  add("sink_attention decode M=1 H=64 d=512 W=128 topk=512", [] { return attn_case(1, 64, 512, 128, 512, false, "at1"); });
  add("sink_attention decode M=64 H=64 d=512 W=128 topk=512", [] { return attn_case(64, 64, 512, 128, 512, false, "at2"); });
  add("sink_attention decode M=32 H=64 d=512 W=128 no entries", [] { return attn_case(32, 64, 512, 128, 0, false, "at3"); });
  add("sink_attention prefill M=512 H=64 d=512 W=128 topk<=512", [] { return attn_case(512, 64, 512, 128, 512, true, "at4"); });
  add("sink_attention decode M=16 H=16 d=256 W=64 topk=64", [] { return attn_case(16, 16, 256, 64, 64, false, "at5"); });
  // sink_attention_f32 (v2, the model's path): V4-Flash shapes, odd shapes, key counts, invariance
  for (int64_t M : {1, 3, 64}) {
    auto n = nm("sink_attention_f32 M=%ld H=64 d=512 keys=640 (V4-Flash decode)", M);
    add(n, [=] { return attn_f32_case(M, 64, 512, 640, n); });
  }
  add("sink_attention_f32 M=64 H=64 d=512 keys=random 0..640", [] { return attn_f32_case(64, 64, 512, -1, "af_rand"); });
  for (int nk : {0, 1, 127, 640, 2000}) {
    auto n = nm("sink_attention_f32 M=3 H=64 d=512 keys=%d", nk);
    add(n, [=] { return attn_f32_case(3, 64, 512, nk, n); });
  }
  struct AS { int64_t M; int H, d, nk; };
  const AS as[] = {{3, 3, 40, 127}, {5, 3, 40, 0}, {7, 5, 72, 33}, {2, 1, 8, 1}, {4, 7, 37, 300} /* d%4 != 0: scalar */,
                   {3, 17, 96, -1}, {16, 16, 256, 640}, {2, 7, 1000, 200} /* d > 512 */, {1, 64, 1024, 127}};
  for (auto c : as) {
    auto n = nm("sink_attention_f32 M=%ld H=%d d=%d keys=%d (small/odd)", c.M, c.H, c.d, c.nk);
    add(n, [=] { return attn_f32_case(c.M, c.H, c.d, c.nk, n); });
  }
  add("sink_attention_f32 M=1024 H=8 d=64 keys=random (prefill-sized M)",
      [] { return attn_f32_case(1024, 8, 64, -1, "af_bigM"); });
  if (g_perf) {
    for (int64_t M : {1, 8, 64, 256}) {
      auto n = nm("sink_attention_f32 perf M=%ld H=64 d=512 keys=640 (own keys per query)", M);
      add(n, [=] { return attn_f32_case(M, 64, 512, 640, n, 3); });
    }
    add("sink_attention_f32 perf M=1 H=64 d=512 keys=4096 (HCA at 512k)",
        [] { return attn_f32_case(1, 64, 512, 4096, "af_perf_4k", 1); });
    add("sink_attention_f32 perf M=512 H=64 d=512 keys=640 (prefill-sized batch)",
        [] { return attn_f32_case(512, 64, 512, 640, "af_perf_512", 3); });
  }
  // sink_attention_mma (tensor cores; the stored-weight mode's path)
  {
    struct MC { int64_t M; int H, d, nk, kind; const char* what; };
    const MC mc[] = {{1, 64, 512, 640, 0, "win+ent"},      {7, 64, 512, -1, 0, "uneven win+ent"},
                     {64, 64, 512, 640, 0, "win+ent"},     {512, 64, 512, -1, 0, "uneven win+ent"},
                     {7, 64, 512, 100, 1, "window only"},  {7, 64, 512, 128, 1, "window only"},
                     {7, 64, 512, 300, 2, "entries only"}, {7, 64, 512, -1, 2, "uneven entries only"},
                     {3, 64, 512, 0, 0, "no keys"},        {3, 64, 512, 1, 0, "one key"},
                     {3, 64, 512, 33, 0, "33 keys"},       {3, 64, 512, 2000, 0, "many keys"},
                     {64, 64, 128, -1, 0, "uneven"},       {7, 16, 128, -1, 0, "uneven"},
                     {1, 16, 128, 640, 0, "win+ent"},      {7, 16, 512, 640, 0, "win+ent"},
                     {7, 32, 256, -1, 0, "uneven"},        {5, 80, 64, -1, 0, "two head groups"},
                     {64, 16, 64, 0, 0, "no keys"},       {9, 4, 64, -1, 0, "tiny fixtures' shape"}};
    for (auto c : mc) {
      auto n = nm("sink_attention_mma M=%ld H=%d d=%d keys=%d (%s)", c.M, c.H, c.d, c.nk, c.what);
      add(n, [=] { return attn_mma_case(c.M, c.H, c.d, c.nk, c.kind, n, c.M > 64 ? 24 : 0); });
    }
    add("sink_attention_mma M=512 H=64 d=512 keys=640 (prefill pools)",
        [] { return attn_mma_case(512, 64, 512, 640, 0, "am_pf512", 16, true); });
  }
  if (g_perf) {
    add("sink_attention_mma perf M=4096 H=64 d=512 keys=640 (prefill 4k)",
        [] { return attn_mma_case(4096, 64, 512, 640, 0, "am_perf_pf", 3, true); });
    add("sink_attention_mma perf M=4096 H=64 d=512 keys=160 (prefill 4k, HCA layer)",
        [] { return attn_mma_case(4096, 64, 512, 160, 0, "am_perf_pf_hca", 3, true); });
    for (int64_t M : {1, 8, 64, 256}) {
      auto n = nm("sink_attention_mma perf M=%ld H=64 d=512 keys=640 (decode, own keys per query)", M);
      add(n, [=] { return attn_mma_case(M, 64, 512, 640, 0, n, 3); });
    }
    add("sink_attention_mma perf M=1 H=64 d=512 keys=4096 (HCA at 512k)",
        [] { return attn_mma_case(1, 64, 512, 4096, 0, "am_perf_4k", 1); });
  }
  // v3 (sink_attention_mma_v3: v2's bits on warpgroup MMAs, d = 512; the backend's path for M > kAttDecMaxM)
  {
    struct MC { int64_t M; int H, nk, kind; const char* what; };
    const MC mc[] = {{1, 64, 640, 0, "win+ent"},       {7, 64, -1, 0, "uneven win+ent"},
                     {64, 64, 640, 0, "win+ent"},      {512, 64, -1, 0, "uneven win+ent"},
                     {7, 64, 100, 1, "window only"},   {7, 64, 128, 1, "window only"},
                     {7, 64, 300, 2, "entries only"},  {7, 64, -1, 2, "uneven entries only"},
                     {3, 64, 0, 0, "no keys"},         {3, 64, 1, 0, "one key"},
                     {3, 64, 33, 0, "33 keys"},        {3, 64, 161, 0, "161 keys"},
                     {3, 64, 2000, 0, "many keys"},    {7, 16, 640, 0, "16 heads"},
                     {5, 80, -1, 0, "two head groups"}, {9, 4, -1, 0, "4 heads"}};
    for (auto c : mc) {
      auto n = nm("sink_attention_v3 M=%ld H=%d d=512 keys=%d (%s)", c.M, c.H, c.nk, c.what);
      add(n, [=] { return sink_attn_case(kAttnV3, c.M, c.H, 512, c.nk, c.kind, n, c.M > 64 ? 24 : 0, false); });
    }
    add("sink_attention_v3 M=512 H=64 d=512 keys=640 (prefill pools)",
        [] { return sink_attn_case(kAttnV3, 512, 64, 512, 640, 0, "a3_pf512", 16, true); });
    add("sink_attention_v3 M=300 H=64 d=512 keys<=640 (prefill pools, uneven)",
        [] { return sink_attn_case(kAttnV3, 300, 64, 512, -1, 0, "a3_pf300", 16, true); });
  }
  if (g_perf) {
    add("sink_attention_v3 perf M=4096 H=64 d=512 keys=640 (prefill 4k, CSA layer)",
        [] { return sink_attn_case(kAttnV3, 4096, 64, 512, 640, 0, "am_perf_pf", 3, true); });
    add("sink_attention_v3 perf M=4096 H=64 d=512 keys=160 (prefill 4k, HCA layer)",
        [] { return sink_attn_case(kAttnV3, 4096, 64, 512, 160, 0, "am_perf_pf_hca", 3, true); });
    add("sink_attention_v3 perf M=4096 H=64 d=512 keys=128 (prefill 4k, sliding layer)",
        [] { return sink_attn_case(kAttnV3, 4096, 64, 512, 128, 1, "am_perf_pf_swa", 3, true); });
  }
  // attdec (sink_attention_dec: v2's bits on 8× the CTAs, the backend's path for M ≤ kAttDecMaxM)
  {
    struct MC { int64_t M; int H, d, nk, kind; const char* what; };
    const MC mc[] = {{1, 64, 512, 640, 0, "win+ent"},       {2, 64, 512, 640, 0, "win+ent"},
                     {8, 64, 512, 640, 0, "win+ent"},       {8, 64, 512, -1, 0, "uneven win+ent"},
                     {7, 64, 512, 100, 1, "window only"},   {7, 64, 512, 128, 1, "window only"},
                     {7, 64, 512, 300, 2, "entries only"},  {8, 64, 512, -1, 2, "uneven entries only"},
                     {8, 64, 512, -1, 1, "uneven window only"},
                     {3, 64, 512, 0, 0, "no keys"},         {3, 64, 512, 1, 0, "one key"},
                     {3, 64, 512, 33, 0, "33 keys"},        {3, 64, 512, 161, 0, "161 keys"},
                     {2, 64, 512, 2000, 0, "many keys: 4 chunks a split"},
                     {64, 64, 512, -1, 0, "uneven, large batch"},
                     {7, 16, 128, -1, 0, "uneven"},         {1, 16, 128, 640, 0, "win+ent"},
                     {7, 32, 256, -1, 0, "uneven"},         {5, 80, 64, -1, 0, "five head groups"},
                     {9, 4, 64, -1, 0, "tiny fixtures' shape"}, {5, 72, 512, -1, 0, "partial head group"}};
    for (auto c : mc) {
      auto n = nm("attdec M=%ld H=%d d=%d keys=%d (%s)", c.M, c.H, c.d, c.nk, c.what);
      add(n, [=] { return attdec_case(c.M, c.H, c.d, c.nk, c.kind, n); });
    }
  }
  if (g_perf)
    for (int64_t M : {1, 2, 8, 16, 32, 128}) {
      auto n = nm("attdec perf M=%ld H=64 d=512 keys=640 (decode, graph with programmatic edges)", M);
      add(n, [=] { return attdec_case(M, 64, 512, 640, 0, n, 3); });
    }
  if (g_perf)
    add("attdec perf M=1 H=64 d=512 keys=4096 (HCA at 512k: 7 chunks a split, graph with programmatic edges)",
        [] { return attdec_case(1, 64, 512, 4096, 0, "ad_perf_4k", 1); });
  add("sink_attention_tc decode M=1 H=64 d=512 W=128 topk=512", [] { return attn_case(1, 64, 512, 128, 512, false, "tc1", true); });
  add("sink_attention_tc decode M=64 H=64 d=512 W=128 topk=512", [] { return attn_case(64, 64, 512, 128, 512, false, "tc2", true); });
  add("sink_attention_tc decode M=32 H=64 d=512 W=128 no entries", [] { return attn_case(32, 64, 512, 128, 0, false, "tc3", true); });
  add("sink_attention_tc prefill M=512 H=64 d=512 W=128 topk<=512", [] { return attn_case(512, 64, 512, 128, 512, true, "tc4", true); });
  add("sink_attention_tc decode M=16 H=32 d=256 W=64 topk=64", [] { return attn_case(16, 32, 256, 64, 64, false, "tc5", true); });
  add("indexer_scores M=1 hI=64 dI=128 n=16384", [] { return indexer_case(1, 64, 128, 16384, false, "ix1"); });
  add("indexer_scores M=64 hI=64 dI=128 n=4096 paged rows", [] { return indexer_case(64, 64, 128, 4096, true, "ix2"); });
  add("indexer_scores M=512 hI=64 dI=128 n=2048", [] { return indexer_case(512, 64, 128, 2048, false, "ix3"); });
  add("indexer_scores M=9 hI=16 dI=32 n=1000 (small)", [] { return indexer_case(9, 16, 32, 1000, true, "ix4"); });
  // indexer_scores_mma: M ∈ {1, 5, 64, 1000}, n_keys ∈ {1, 37, 1024, 16384}, hI ∈ {16, 64}, dI ∈ {32, 128}
  struct IM { int64_t M; int hI, dI; int64_t nk; int vis; bool paged; };
  const IM ims[] = {{1, 64, 128, 16384, 0, true},  {5, 64, 128, 37, 0, true},     {64, 64, 128, 16384, 0, true},
                    {1000, 64, 128, 1024, 1, true}, {1000, 16, 32, 1024, 0, true}, {5, 16, 32, 1, 0, true},
                    {64, 16, 128, 37, 0, false},    {64, 64, 32, 1024, 1, true},   {1, 16, 32, 37, 0, false},
                    {5, 64, 32, 1024, 0, true},     {1000, 64, 128, 37, 0, true},  {9, 128, 64, 1024, 0, true},
                    {64, 48, 128, 1024, 0, true},   {8, 64, 128, 16384, 0, true}};
  for (auto c : ims) {
    auto n = nm("indexer_mma M=%ld hI=%d dI=%d n=%ld %s%s", c.M, c.hI, c.dI, c.nk,
                c.vis == 1 ? "causal" : "n_vis random", c.paged ? " paged" : "");
    add(n, [=] { return indexer_mma_case(c.M, c.hI, c.dI, c.nk, c.vis, c.paged, n); });
  }
  add("indexer_mma unsupported shapes (hI=24, dI=40, dI=8)", [] { return indexer_mma_unsupported_case(); });
  // per-query key lists (decode steps): M across the 4-query tile and the 8-row boundary, lists shorter
  // and longer than a 128-key tile, random visibility (incl. none / all / one short), narrow heads
  for (auto c : std::initializer_list<std::tuple<int64_t, int, int, int64_t, int>>{
           {1, 64, 128, 1024, 2}, {3, 64, 128, 37, 0}, {5, 64, 128, 1024, 0}, {9, 64, 128, 300, 0},
           {64, 64, 128, 1024, 0}, {130, 64, 128, 512, 2}, {7, 16, 32, 200, 0}}) {
    auto [M, hI, dI, nk, vis] = c;
    auto n = nm("indexer_mma pq M=%ld hI=%d dI=%d n=%ld %s", M, hI, dI, nk, vis == 2 ? "all visible" : "random visible");
    add(n, [=] { return indexer_mma_case(M, hI, dI, nk, vis, true, n, 0, true); });
  }
  if (g_perf) {
    for (int64_t M : {1, 8, 32, 128, 256}) {
      auto n = nm("indexer_mma pq perf M=%ld hI=64 dI=128 n=1024 (decode at 4k, b%ld)", M, M);
      add(n, [=] { return indexer_mma_case(M, 64, 128, 1024, 2, true, n, 3, true); });
    }
    add("indexer_mma perf M=4096 hI=64 dI=128 n=1024 all visible (prefill chunk)",
        [] { return indexer_mma_case(4096, 64, 128, 1024, 2, true, "im_p1", 4); });
    add("indexer_mma perf M=4096 hI=64 dI=128 n=1024 causal (first 4k chunk)",
        [] { return indexer_mma_case(4096, 64, 128, 1024, 1, true, "im_p2", 4); });
    add("indexer_mma perf M=4096 hI=64 dI=128 n=4096 causal (chunk ending at 16k)",
        [] { return indexer_mma_case(4096, 64, 128, 4096, 1, true, "im_p3", 4); });
    add("indexer_mma perf M=1 hI=64 dI=128 n=16384 (decode at 64k)",
        [] { return indexer_mma_case(1, 64, 128, 16384, 2, true, "im_p4", 1); });
    add("indexer_mma perf M=64 hI=64 dI=128 n=16384 (batch decode)",
        [] { return indexer_mma_case(64, 64, 128, 16384, 2, true, "im_p5", 3); });
  }
  add("topk_rows M=64 n=16384 k=512", [] { return topk_case(64, 16384, 512, false, "tk1"); });
  // decode at 4k context (1024 CSA keys a sequence): b1 and b128
  add("topk_rows M=1 n=1024 k=512 (decode b1)", [] { return topk_case(1, 1024, 512, false, "tk6"); });
  add("topk_rows M=128 n=1024 k=512 ties (decode b128)", [] { return topk_case(128, 1024, 512, true, "tk7"); });
  add("topk_rows M=64 n=16384 k=512 ties", [] { return topk_case(64, 16384, 512, true, "tk2"); });
  add("topk_rows M=512 n=2048 k=512 ties", [] { return topk_case(512, 2048, 512, true, "tk3"); });
  add("topk_rows M=4 n=262144 k=512 (cluster path)", [] { return topk_case(4, 262144, 512, false, "tk4"); });
  add("topk_rows M=6 n=100000 k=512 ties (cluster path)", [] { return topk_case(6, 100000, 512, true, "tk5"); });
  add("moe_route T=64 E=256 K=6 sqrtsoftplus", [] { return route_case(64, 256, 6, dc::Scoring::SqrtSoftplus, false, "rt1"); });
  add("moe_route T=4096 E=256 K=6 sqrtsoftplus", [] { return route_case(4096, 256, 6, dc::Scoring::SqrtSoftplus, false, "rt2"); });
  add("moe_route T=64 E=256 K=6 hash", [] { return route_case(64, 256, 6, dc::Scoring::SqrtSoftplus, true, "rt3"); });
  add("moe_route T=64 E=64 K=4 sigmoid", [] { return route_case(64, 64, 4, dc::Scoring::Sigmoid, false, "rt4"); });
  add("moe_route T=64 E=100 K=2 softmax", [] { return route_case(64, 100, 2, dc::Scoring::Softmax, false, "rt5"); });
  add("moe_ffn fp4 T=64 E=32 K=6 D=4096 I=2048 (checked)", [] { return moe_case(64, 32, 6, 4096, 2048, true, "moe1"); });
  add("moe_ffn fp4 T=4 E=256 K=6 D=4096 I=2048 (checked, decode: grouped GEMV)",
      [] { return moe_case(4, 256, 6, 4096, 2048, true, "moe3"); });
  add("moe_ffn fp4 T=5 E=16 K=6 D=256 I=128 (checked)", [] { return moe_case(5, 16, 6, 256, 128, true, "moe2"); });
  if (g_perf) {
    for (int64_t T : {1, 64, 1024}) {
      auto n = nm("moe_ffn fp4 T=%ld E=256 K=6 D=4096 I=2048 (perf only)", T);
      add(n, [=] { return moe_case(T, 256, 6, 4096, 2048, false, n); });
    }
  }
  // routed experts for T > 8 (moe_grouped.cu)
  {
    using F = dc::WFmt;
    for (int64_t T : {9, 32, 256, 4096})
      for (int skew : {0, 1}) {
        const int tm = dc::moe_grouped_tile_m(T);
        auto n = nm("moe_group_par T=%ld K=6 E=256 tile=%d %s (exact)", T, tm, skew ? "skewed" : "uniform");
        add(n, [=] { return group_par_case(T, 6, 256, tm, skew, n); });
      }
    add("moe_group_par T=4096 K=6 E=256 tile=128 uniform (exact)", [] { return group_par_case(4096, 6, 256, 128, 0, "mgp_t128"); });
    add("moe_group_par T=1000 K=8 E=1024 tile=64 uniform (exact)", [] { return group_par_case(1000, 8, 1024, 64, 0, "mgp_e1024"); });
    add("moe_group_par T=3 K=2 E=5 tile=8 uniform (exact)", [] { return group_par_case(3, 2, 5, 8, 0, "mgp_tiny"); });
    add("moe_x_to_bf16 M=5 K=1024 ldx=1032 natural, e2m1 pair and wg order (exact)", [] { return x_pair_case(5, 1024, 1032, "xpair"); });
    for (F f : {F::FP4_B32, F::FP8_B128, F::BF16})
      for (int tm : {8, 16, 64, 128}) {
        if (tm == 128 && f != F::FP4_B32) continue;  // the wgmma kernel takes fp4 only
        auto n = nm("moe_expert_gemm %s T=40 K=4 E=8 N=768 K=512 tile=%d x gathered (w13 mode)", wfmt_name(f), tm);
        add(n, [=] { return expert_gemm_case(f, 40, 4, 8, 768, 512, tm, true, n); });
        n = nm("moe_expert_gemm %s T=40 K=4 E=8 N=768 K=512 tile=%d x per grouped row (w2 mode)", wfmt_name(f), tm);
        add(n, [=] { return expert_gemm_case(f, 40, 4, 8, 768, 512, tm, false, n); });
      }
    // the wgmma kernel (tile 128) on full and partial tiles (skewed routing: one hot expert with ~270 rows, 8 with
    // ~190: n = 128, 64-ish and 16) and a 1024-k reduction (8 stages); the tile-64 mma.sync kernel on the same draw
    for (int tm : {128, 64}) {
      auto n = nm("moe_expert_gemm fp4 T=300 K=6 E=64 N=512 K=1024 tile=%d x gathered (w13 mode)", tm);
      add(n, [=] { return expert_gemm_case(F::FP4_B32, 300, 6, 64, 512, 1024, tm, true, "mwg300g"); });
      n = nm("moe_expert_gemm fp4 T=300 K=6 E=64 N=512 K=1024 tile=%d x per grouped row (w2 mode)", tm);
      add(n, [=] { return expert_gemm_case(F::FP4_B32, 300, 6, 64, 512, 1024, tm, false, "mwg300r"); });
    }
    // the fp8 prefill expert kernels (moe_fp8.cu)
    add("moe_quant_fp8 M=5 K=1024 ldx=1032 f32 (exact)", [] { return fp8_quant_case(5, 1024, 1032, false, "fq1"); });
    add("moe_quant_fp8 M=3 K=2048 ldx=2048 bf16 (exact)", [] { return fp8_quant_case(3, 2048, 2048, true, "fq2"); });
    add("moe_expert_gemm_fp8 T=40 K=4 E=8 N=768 K=512 x gathered (w13 mode)",
        [] { return fp8_expert_case(40, 4, 8, 768, 512, 0, true, "mf40g"); });
    add("moe_expert_gemm_fp8 T=40 K=4 E=8 N=768 K=512 x per grouped row (w2 mode)",
        [] { return fp8_expert_case(40, 4, 8, 768, 512, 0, false, "mf40r"); });
    add("moe_expert_gemm_fp8 T=300 K=6 E=64 N=512 K=1024 x gathered (w13 mode, skewed: n = 128 and partial)",
        [] { return fp8_expert_case(300, 6, 64, 512, 1024, 0, true, "mf300g"); });
    add("moe_expert_gemm_fp8 T=300 K=6 E=64 N=512 K=1024 x per grouped row (w2 mode)",
        [] { return fp8_expert_case(300, 6, 64, 512, 1024, 0, false, "mf300r"); });
    add("moe_expert_gemm_fp8 T=64 K=4 E=16 N=256 K=2048 e8m0 126..135 (x gathered)",
        [] { return fp8_expert_case(64, 4, 16, 256, 2048, 2, true, "mfbig"); });
    add("moe_expert_gemm_fp8 T=64 K=4 E=16 N=256 K=1024 e8m0 110..124 (14 binades in a block: exact limit)",
        [] { return fp8_expert_case(64, 4, 16, 256, 1024, 3, true, "mfwide"); });
    for (F f : {F::FP4_B32, F::FP8_B128, F::BF16})
      for (int64_t T : {9, 32, 256, 4096}) {
        const int skew = T >= 256 ? 1 : 0;
        auto n = nm("moe_grouped %s T=%ld E=64 K=6 D=512 I=256 %s (checked, CPU twin)", wfmt_name(f), T,
                    skew ? "skewed" : "uniform");
        add(n, [=] { return moe_grouped_case(f, T, 64, 6, 512, 256, skew, 0, 0, true, n); });
      }
    add("moe_grouped fp4 T=40 E=16 K=4 D=1024 I=768 e8m0 126..135 (two-step scale, checked)",
        [] { return moe_grouped_case(F::FP4_B32, 40, 16, 4, 1024, 768, 0, 2, 0, true, "mg_fp4_big"); });
    add("moe_grouped fp8 T=40 E=16 K=4 D=1024 I=768 scales 2^8..2^10 (two-step scale, checked)",
        [] { return moe_grouped_case(F::FP8_B128, 40, 16, 4, 1024, 768, 0, 2, 0, true, "mg_fp8_big"); });
    for (int64_t T : {9, 32, 256})
      for (F f : {F::FP4_B32, F::FP8_B128}) {
        auto n = nm("moe_grouped %s T=%ld E=256 K=6 D=4096 I=2048 (V4-Flash shapes, 6 tokens checked)", wfmt_name(f), T);
        add(n, [=] { return moe_grouped_case(f, T, 256, 6, D, I, 0, 0, 6, false, n); });
      }
    add("moe_grouped fp4 T=4096 E=256 K=6 D=4096 I=2048 skewed (V4-Flash shapes, 4 tokens checked)",
        [=] { return moe_grouped_case(F::FP4_B32, 4096, 256, 6, D, I, 1, 0, 4, false, "mg_v4_4096"); });
    // prefill sizes on the wgmma kernel (tile 128): uniform routing (~96 rows an expert at 4096, ~12 at 512), a
    // T just above the 256 switch, and fp4 scales > 2 (the two-step factor) at T = 300
    add("moe_grouped fp4 T=4096 E=256 K=6 D=4096 I=2048 uniform (V4-Flash shapes, 8 tokens checked)",
        [=] { return moe_grouped_case(F::FP4_B32, 4096, 256, 6, D, I, 0, 0, 8, false, "mg_v4_4096u"); });
    add("moe_grouped fp4 T=257 E=256 K=6 D=4096 I=2048 uniform (V4-Flash shapes, 6 tokens checked)",
        [=] { return moe_grouped_case(F::FP4_B32, 257, 256, 6, D, I, 0, 0, 6, false, "mg_v4_257"); });
    add("moe_grouped fp4 T=300 E=16 K=4 D=1024 I=768 e8m0 126..135 (two-step scale, checked)",
        [] { return moe_grouped_case(F::FP4_B32, 300, 16, 4, 1024, 768, 0, 2, 0, true, "mg_fp4_big300"); });
    if (g_perf) {
      for (int64_t T : {16, 32, 64, 128, 256, 512, 1024, 4096, 16384}) {
        auto n = nm("moe_grouped perf fp4 T=%ld E=256 K=6 D=4096 I=2048 (group + w13/swiglu + w2 + combine)", T);
        add(n, [=] { return moe_grouped_perf_case(F::FP4_B32, T, 256, 6, D, I, n); });
      }
      for (int64_t T : {64, 256, 4096}) {
        auto n = nm("moe_grouped perf fp8 T=%ld E=256 K=6 D=4096 I=2048 (group + w13/swiglu + w2 + combine)", T);
        add(n, [=] { return moe_grouped_perf_case(F::FP8_B128, T, 256, 6, D, I, n); });
      }
      for (int64_t T : {256, 4096}) {
        auto n = nm("moe_grouped perf bf16 T=%ld E=128 K=6 D=4096 I=2048 (group + w13/swiglu + w2 + combine)", T);
        add(n, [=] { return moe_grouped_perf_case(F::BF16, T, 128, 6, D, I, n); });
      }
    }
  }
  // gemv_q / gemv_q_grouped (decode GEMV on tensor cores, f32 x)
  {
    using F = dc::WFmt;
    struct GQ { F f; int64_t M, N, K; int variant; const char* what; };
    // M ∈ {1, 3, 8, 9, 16, 31, 32} on small shapes and odd N (full f64 reference); the V4-Flash shapes
    // (q_lora 1024, heads·head_dim 32768, o_lora·groups 8192, hidden 4096, moe_inter 2048, vocab 129280
    // with a short K) at M ∈ {1, 9, 32} (256 sampled rows). Every case: each row bitwise equal to it alone.
    std::vector<GQ> gq = {{F::BF16, 3, 520, 1032, 0, " (K%32!=0: partial chunk)"},
                          {F::BF16, 8, 264, 16384, 0, " (cluster split-K 8)"},
                          {F::BF16, 13, 97, 256, 0, " (odd N)"},
                          {F::BF16, 40, 97, 256, 0, " (M>32: launches of 32)"},
                          {F::BF16, 5, 136, 24576, 0, " (K>16384: v3 path)"},
                          {F::FP8_B128, 3, 1000, 1152, 0, " (ragged scale grid)"},
                          {F::FP8_B128, 8, 520, 16384, 0, " (cluster split-K 8)"},
                          {F::FP8_B128, 5, 44, 128, 0, " (tiny)"},
                          {F::FP8_B128, 2, 264, 512, 1, " subnormal e4m3 (exact dequant)"},
                          {F::FP8_B128, 20, 264, 512, 1, " subnormal e4m3 (exact dequant)"},
                          {F::FP8_B128, 7, 136, 256, 2, " scales 2^8..2^10 (two-step scale)"},
                          {F::FP8_B128, 27, 136, 256, 2, " scales 2^8..2^10 (two-step scale)"},
                          {F::FP4_B32, 3, 1000, 2080, 0, " (K%128!=0: v3 path)"},
                          {F::FP4_B32, 12, 1000, 2080, 0, " (K%128!=0: v3 path, launches of 8)"},
                          {F::FP4_B32, 8, 512, 16384, 0, " (cluster split-K 8)"},
                          {F::FP4_B32, 2, 24, 32, 0, " (tiny, v3 path)"},
                          {F::FP4_B32, 4, 128, 1024, 2, " e8m0 126..135 (two-step scale)"},
                          {F::FP4_B32, 29, 128, 1024, 2, " e8m0 126..135 (two-step scale)"}};
    for (int64_t M : {1, 3, 8, 9, 16, 31, 32}) {
      gq.push_back({F::BF16, M, 1000, 4096, 0, " (odd N)"});
      gq.push_back({F::FP8_B128, M, 1000, 4096, 0, " (odd N)"});
      gq.push_back({F::FP8_B128, M, ql, D, 0, " (wq_a)"});
      gq.push_back({F::FP4_B32, M, 1000, 4096, 0, " (odd N)"});
      gq.push_back({F::FP4_B32, M, 200, 2048, 0, " (odd N, w2 K)"});
    }
    for (int64_t M : {1, 9, 32}) {
      gq.push_back({F::FP8_B128, M, H * d, ql, 0, " (wq_b)"});
      gq.push_back({F::FP8_B128, M, D, G * ol, 0, " (wo_b)"});
      gq.push_back({F::FP8_B128, M, D, I, 0, " (shared w2)"});
      gq.push_back({F::FP4_B32, M, 2 * I, D, 0, " (routed w13)"});
      gq.push_back({F::FP4_B32, M, D, I, 0, " (routed w2)"});
      gq.push_back({F::BF16, M, 2 * d, D, 0, " (compressor)"});
      gq.push_back({F::BF16, M, Vv, 256, 0, " (vocab rows, short K)"});
      gq.push_back({F::BF16, M, 4095, 4096, 0, " (odd N)"});
    }
    for (auto c : gq) {
      auto n = nm("gemv_q %s M=%ld N=%ld K=%ld%s", wfmt_name(c.f), c.M, c.N, c.K, c.what);
      add(n, [=] { return gemv_case(c.f, c.M, c.N, c.K, c.variant, n); });
    }
    struct GI { F f; int64_t N, K; };
    const GI gi[] = {{F::BF16, 1000, 4096}, {F::BF16, 97, 16384}, {F::FP8_B128, 1000, 4096}, {F::FP8_B128, 4096, 2048},
                     {F::FP8_B128, 264, 16384}, {F::FP4_B32, 1000, 4096}, {F::FP4_B32, 4096, 2048}};
    for (auto c : gi) {
      auto n = nm("gemv_q invariance M=1..32 %s N=%ld K=%ld", wfmt_name(c.f), c.N, c.K);
      add(n, [=] { return gemv_inv_case(c.f, c.N, c.K, n); });
    }
    // plans and graphs: cluster sizes 1..8 (K = 16384, small N), v4's occupancy query (wo_b, cluster 4), fp4
    struct GL { F f; int64_t M, N, K; };
    const GL gl[] = {{F::FP8_B128, 8, D, G * ol}, {F::FP8_B128, 20, D, G * ol}, {F::FP4_B32, 1, 2 * I, D},
                     {F::BF16, 3, 1000, 16384}, {F::FP8_B128, 32, 1024, 4096}, {F::FP4_B32, 5, 4096, 2080}};
    for (auto c : gl) {
      auto n = nm("gemv_q plan+graph %s M=%ld N=%ld K=%ld", wfmt_name(c.f), c.M, c.N, c.K);
      add(n, [=] { return gemv_plan_case(c.f, c.M, c.N, c.K, n); });
    }
    struct GG { F f; int64_t T; int topk, E; int64_t N, K; bool per_slot, swiglu; const char* what; };
    const GG gg[] = {{F::FP4_B32, 3, 6, 16, 256, 512, false, false, "x[t] (w13 mode)"},
                     {F::FP4_B32, 5, 6, 8, 512, 1024, true, false, "x[slot] (w2 mode)"},
                     {F::FP4_B32, 12, 3, 4, 96, 256, true, false, "x[slot], experts repeated > 8 times"},
                     {F::FP4_B32, 4, 6, 16, 512, 1024, false, true, "x[t], fused swiglu"},
                     {F::FP8_B128, 4, 8, 8, 1024, 4096, true, false, "x[slot] (wo_a as 8 groups)"},
                     {F::BF16, 2, 2, 3, 264, 520, false, false, "x[t]"},
                     {F::FP8_B128, 32, 8, 8, 256, 4096, true, false, "x[slot] (wo_a as 8 groups, runs of 32)"},
                     {F::FP8_B128, 9, 8, 8, 1000, 1024, true, false, "x[slot] (runs of 9, odd N)"},
                     {F::FP4_B32, 16, 6, 16, 512, 1024, false, true, "x[t], fused swiglu, runs ≤ 16"},
                     {F::FP4_B32, 40, 2, 2, 256, 512, true, false, "x[slot], 2 experts x 40 slots: runs of 32 + 8"},
                     {F::BF16, 31, 2, 3, 97 * 2, 264, false, false, "x[t], odd N"}};
    for (auto c : gg) {
      auto n = nm("gemv_q_grouped %s T=%ld topk=%d E=%d N=%ld K=%ld %s", wfmt_name(c.f), c.T, c.topk, c.E, c.N, c.K, c.what);
      add(n, [=] { return gemv_grouped_case(c.f, c.T, c.topk, c.E, c.N, c.K, c.per_slot, c.swiglu, n); });
    }
    // moe_gemv2 (fp4 routed experts at decode, T ≤ 8): T = 1, 3, 8; experts shared among tokens (small E,
    // every token the same experts), runs split at the cap, fused SwiGLU, large scales (two-factor path),
    // the V4-Flash w13 / w2 shapes (16 experts: the host reference's memory)
    struct MG { int64_t T; int topk, E; int64_t N, K; bool per_slot, swiglu; int variant, sel_mode; const char* what; };
    const MG mg[] = {{1, 6, 16, 256, 512, false, false, 0, 0, "x[t]"},
                     {1, 6, 16, 512, 1024, false, true, 0, 0, "x[t], fused swiglu"},
                     {3, 6, 8, 256, 1024, true, false, 0, 0, "x[slot], experts shared"},
                     {3, 6, 8, 512, 512, false, true, 0, 0, "x[t], fused swiglu, experts shared"},
                     {8, 6, 8, 512, 1024, false, true, 0, 0, "x[t], fused swiglu, experts shared"},
                     {8, 6, 12, 256, 2048, true, false, 0, 1, "x[slot], every token experts 0..5 (runs of 8)"},
                     {3, 6, 2, 256, 512, true, false, 0, 2, "x[slot], repeats in a token (runs of 4)"},
                     {5, 6, 6, 128, 512, false, true, 0, 2, "x[t], fused swiglu, repeats in a token (runs of 8)"},
                     {2, 6, 8, 256, 512, false, false, 2, 0, "x[t], scales 2^-1..2^8 (two-factor path)"},
                     {8, 8, 16, 96, 1536, true, false, 0, 0, "x[slot], 64 slots, K=1536, N=96"},
                     {1, 6, 16, 2 * I, D, false, true, 0, 0, "routed w13 + fused swiglu"},
                     {8, 6, 16, 2 * I, D, false, true, 0, 0, "routed w13 + fused swiglu"},
                     {1, 6, 16, D, I, true, false, 0, 0, "routed w2"},
                     {8, 6, 16, D, I, true, false, 0, 0, "routed w2"}};
    for (auto c : mg) {
      auto n = nm("moe_gemv2 fp4 T=%ld topk=%d E=%d N=%ld K=%ld %s", c.T, c.topk, c.E, c.N, c.K, c.what);
      add(n, [=] { return moe_gemv2_case(c.T, c.topk, c.E, c.N, c.K, c.per_slot, c.swiglu, c.variant, c.sel_mode, n); });
    }
    add("moe_gemv2 unsupported shapes", [] { return moe_gemv2_unsupported_case(); });
    // moe_gemv2_rows (the session-5 loads) and moe_gemv2_early (early = 2, 1): the same cases, each also
    // bitwise against moe_gemv2
    for (auto c : mg) {
      auto n = nm("moe_gemv2_rows fp4 T=%ld topk=%d E=%d N=%ld K=%ld %s", c.T, c.topk, c.E, c.N, c.K, c.what);
      add(n, [=] { return moe_gemv2_case(c.T, c.topk, c.E, c.N, c.K, c.per_slot, c.swiglu, c.variant, c.sel_mode, n, 6); });
      for (int early : {2, 1}) {
        n = nm("moe_gemv2_early=%d fp4 T=%ld topk=%d E=%d N=%ld K=%ld %s", early, c.T, c.topk, c.E, c.N, c.K, c.what);
        add(n, [=] {
          return moe_gemv2_case(c.T, c.topk, c.E, c.N, c.K, c.per_slot, c.swiglu, c.variant, c.sel_mode, n, 9 - early);
        });
      }
    }
    // moe_gemv2_fp8 (e4m3 x, wgmma; early = 0 and 2): the same cases against the f64 reference on the quantized x
    for (auto c : mg)
      for (int early : {0, 2}) {
        auto n = nm("moe_gemv2_fp8 early=%d T=%ld topk=%d E=%d N=%ld K=%ld %s", early, c.T, c.topk, c.E, c.N, c.K, c.what);
        add(n, [=] {
          return moe_gemv2_case(c.T, c.topk, c.E, c.N, c.K, c.per_slot, c.swiglu, c.variant, c.sel_mode, n,
                                early ? 11 : 10);
        });
      }
    // gemv_e4m3 (the decode fp8 linear on e4m3 wgmma): V4-Flash's shapes (wq_b: no split; wo_b, wq_a+wkv, w2:
    // split K; wo_a: 8 groups; the shared w13 fused), M = 1..13 (13: launches of 8), a partial last tile (N = 300),
    // large / spread weight scales (variant 2 / 4), x blocks scaled by 2^±40 (variant 3), a 2-SM schedule.
    {
      struct GE { int64_t M; int G; int64_t N, K; bool swiglu; int variant, sms; const char* what; };
      const GE ge[] = {{1, 1, 32768, 1024, false, 0, 0, " (wq_b)"},          {8, 1, 4096, 8192, false, 0, 0, " (wo_b)"},
                       {3, 1, 1536, 4096, false, 0, 0, " (wq_a+wkv)"},       {13, 1, 4096, 2048, false, 0, 0, " (shared w2)"},
                       {2, 8, 1024, 4096, false, 0, 0, " (wo_a, 8 groups)"},  {5, 1, 4096, 4096, true, 0, 0, " (shared w13)"},
                       {4, 1, 300, 384, false, 0, 0, " (partial tile)"},      {2, 1, 640, 1024, false, 2, 0, " (large scales)"},
                       {8, 1, 512, 2048, false, 3, 0, " (x blocks 2^±40)"},   {1, 1, 256, 4096, false, 4, 0, " (spread scales)"},
                       {3, 1, 1024, 1024, false, 0, 2, " (2 SMs)"},           {3, 1, 512, 1024, true, 0, 0, " (small fused)"},
                       {4, 3, 256, 512, false, 0, 0, " (3 groups)"}};
      for (auto c : ge) {
        auto n = nm("gemv_e4m3 M=%ld G=%d N=%ld K=%ld%s%s", c.M, c.G, c.N, c.K, c.swiglu ? " swiglu" : "", c.what);
        add(n, [=] { return gemv_e4m3_case(c.M, c.G, c.N, c.K, c.swiglu, c.variant, c.sms, n); });
      }
      add("gemv_e4m3 unsupported shapes", [] {
        Result res;
        DBuf dw = dalloc(1 << 20, "w"), ds = dalloc(1 << 16, "s");
        const dc::WeightRef W8{dc::WFmt::FP8_B128, dw.p(), ds.p(), 8}, Wb{dc::WFmt::BF16, dw.p(), nullptr, 0};
        dc::GemvE4m3Plan pl;
        expect_true(res, !dc::gemv_e4m3_ok(Wb, 256, 1024, 1, 0, 0, false), "bf16 accepted");
        expect_true(res, !dc::gemv_e4m3_ok(W8, 256, 1000, 1, 0, 0, false), "K % 128 != 0 accepted");
        expect_true(res, !dc::gemv_e4m3_ok(W8, 384, 1024, 1, 0, 0, true), "fused N % 256 != 0 accepted");
        expect_true(res, !dc::gemv_e4m3_ok(W8, 256, 1024, 2, 256 * 1024 + 8, 64, false), "w_stride % 16 != 0 accepted");
        expect_true(res, dc::gemv_e4m3_plan(W8, 256, 1000, 1, 0, 0, false, &pl) == cudaErrorNotSupported && !pl.fmt_ok,
                    "plan made for K % 128 != 0");
        expect_true(res, dc::gemv_e4m3(pl, nullptr, 1, 1024, nullptr, 256, 0.0f, ds.p(), 0) == cudaErrorInvalidValue,
                    "launch without a plan accepted");
        cudaGetLastError();
        return res;
      });
    }
    // gemv_q_v6 (bf16 / fp8, K % 128 == 0): the same checks as gemv_q (f64 reference, padding, every row
    // alone bitwise), the V4-Flash decode shapes at M = 1, 2, 5, 8, odd N, x spanning 2^±40 (the f16
    // pre-scale), subnormal e4m3, large scales, M = 13 (launches of 8), K up to 32768 (8 cluster ranks).
    // Schedules (cluster ranks × warp slices, steps a slice; tests/cuda/gemv_q_v6_model.py prints them):
    // wq_b 1×1 (8), wo_b 4×2 (8), w13 4×2 (4), w2 4×2 (2), wq_a 4×8 (1), wkv 4×8 (1), bf16 router 8×8 (1).
    {
      std::vector<GQ> g6 = {{F::FP8_B128, 5, 44, 128, 0, " (tiny)"},
                            {F::FP8_B128, 2, 264, 512, 1, " subnormal e4m3 (exact dequant)"},
                            {F::FP8_B128, 8, 264, 512, 1, " subnormal e4m3 (exact dequant)"},
                            {F::FP8_B128, 7, 136, 256, 2, " scales 2^8..2^10"},
                            {F::FP8_B128, 13, 1000, 4096, 0, " (M>8: launches of 8)"},
                            {F::FP8_B128, 3, 264, 16384, 0, " (8 cluster ranks)"},
                            {F::FP8_B128, 2, 136, 32768, 0, " (K=32768: 8 ranks of 4096)"},
                            {F::FP8_B128, 3, 1000, 1152, 0, " (odd N, 9 steps: ragged slices)"},
                            {F::BF16, 13, 97, 256, 0, " (odd N, M>8)"},
                            {F::BF16, 3, 264, 16384, 0, " (8 cluster ranks)"},
                            {F::BF16, 3, 1000, 1152, 0, " (odd N, ragged slices)"}};
      for (int64_t M : {1, 2, 5, 8}) {
        g6.push_back({F::FP8_B128, M, d, D, 0, " (wkv)"});
        g6.push_back({F::FP8_B128, M, ql, D, 0, " (wq_a)"});
        g6.push_back({F::FP8_B128, M, H * d, ql, 0, " (wq_b)"});
        g6.push_back({F::FP8_B128, M, D, G * ol, 0, " (wo_b)"});
        g6.push_back({F::FP8_B128, M, 2 * I, D, 0, " (shared w13)"});
        g6.push_back({F::FP8_B128, M, D, I, 0, " (shared w2)"});
        g6.push_back({F::FP8_B128, M, 1001, 4096, 0, " (odd N)"});
        g6.push_back({F::FP8_B128, M, 1001, 4096, 3, " (odd N, x blocks 2^-40..2^40)"});
        g6.push_back({F::BF16, M, 1001, 4096, 0, " (odd N)"});
        g6.push_back({F::BF16, M, 256, D, 0, " (router gate)"});
        g6.push_back({F::BF16, M, 2 * d, D, 0, " (compressor)"});
      }
      for (auto c : g6) {
        auto n = nm("gemv_q_v6 %s M=%ld N=%ld K=%ld%s", wfmt_name(c.f), c.M, c.N, c.K, c.what);
        add(n, [=] { return gemv_case(c.f, c.M, c.N, c.K, c.variant, n, gemv_q_v6_noplan); });
      }
      const GI g6i[] = {{F::FP8_B128, 1000, 4096}, {F::FP8_B128, 512, 4096}, {F::FP8_B128, 4096, 2048},
                        {F::FP8_B128, 264, 16384}, {F::BF16, 256, 4096}, {F::BF16, 1000, 4096}};
      for (auto c : g6i) {
        auto n = nm("gemv_q_v6 invariance M=1..32 %s N=%ld K=%ld", wfmt_name(c.f), c.N, c.K);
        add(n, [=] { return gemv_inv_case(c.f, c.N, c.K, n, gemv_q_v6_noplan); });
      }
      // groups (wo_a: 8 groups of 1024×4096, linear_groups' layout), odd N, bf16, M > 8
      struct GR { F f; int64_t M; int G; int64_t N, K; const char* what; };
      const GR g6g[] = {{F::FP8_B128, 1, G, ol, H * d / G, "wo_a"}, {F::FP8_B128, 2, G, ol, H * d / G, "wo_a"},
                        {F::FP8_B128, 5, G, ol, H * d / G, "wo_a"},  {F::FP8_B128, 8, G, ol, H * d / G, "wo_a"},
                        {F::FP8_B128, 3, 3, 1001, 1152, "odd N"},   {F::BF16, 4, 2, 264, 4096, "bf16"},
                        {F::FP8_B128, 13, 8, 136, 512, "M>8"}};
      for (auto c : g6g) {
        auto n = nm("gemv_q_v6_groups %s M=%ld G=%d N=%ld K=%ld (%s)", wfmt_name(c.f), c.M, c.G, c.N, c.K, c.what);
        add(n, [=] { return gemv_groups_case(c.f, c.M, c.G, c.N, c.K, n); });
      }
      add("gemv_q_v6 unsupported (fp4, K%128!=0, K>32768)", [] {
        Result res;
        DBuf x = dalloc(4 * 2048 * 4, "x"), w = dalloc(64 * 2048 * 2, "w"), sc = dalloc(64 * 64 * 4, "s"),
             y = dalloc(4 * 64 * 4, "y");
        poison(y);
        auto call = [&](dc::WFmt f, int64_t K) {
          return dc::gemv_q_v6(x.as<float>(), 4, K, 2048, dc::WeightRef{f, w.p(), sc.p(), 64}, 64, y.as<float>(), 64, 0);
        };
        expect_true(res, call(F::FP4_B32, 1024) == cudaErrorNotSupported, "fp4 not refused");
        expect_true(res, call(F::FP8_B128, 1088) == cudaErrorNotSupported, "fp8 K=1088 not refused");
        expect_true(res, call(F::BF16, 1000) == cudaErrorNotSupported, "bf16 K=1000 not refused");
        expect_true(res, call(F::BF16, 32896) == cudaErrorNotSupported, "bf16 K=32896 not refused");
        expect_true(res, !dc::gemv_q_v6_supported(F::FP8_B128, 1088) && dc::gemv_q_v6_supported(F::FP8_B128, 4096),
                    "gemv_q_v6_supported");
        cudaGetLastError();
        auto yv = down<float>(y, 4 * 64);
        bool untouched = true;
        for (float f : yv) {
          uint32_t u;
          memcpy(&u, &f, 4);
          untouched &= u == 0xFFFFFFFFu;
        }
        expect_true(res, untouched, "y written by a refused call");
        if (res.pass) res.detail += "refused with cudaErrorNotSupported, nothing launched ";
        return res;
      });
    }
    // gemv_q_v8 (bulk-copy ring, bf16 / fp8, row bytes % 1024 == 0, K ≤ 8192, N % 16 == 0): f64 reference,
    // padding, every row alone bitwise (batch invariance), the V4-Flash decode shapes at M = 1, 2, 5, 8, one
    // tile (grid 1), tile counts that do not divide over the SMs, x blocks 2^±40, subnormal e4m3, large
    // scales, M > 8 (launches of 8); groups (wo_a); the PDL chain and ring depths.
    {
      // (shapes: N a multiple of 16·TPS, TPS = 4096 / min(row bytes, 4096) tiles of 8 rows a stage)
      std::vector<GQ> g8 = {{F::FP8_B128, 5, 64, 1024, 0, " (one stage: grid 1)"},
                            {F::FP8_B128, 2, 320, 1024, 1, " subnormal e4m3 (exact dequant)"},
                            {F::FP8_B128, 8, 320, 1024, 1, " subnormal e4m3 (exact dequant)"},
                            {F::FP8_B128, 7, 160, 2048, 2, " scales 2^8..2^10"},
                            {F::FP8_B128, 13, 1008, 4096, 0, " (M>8: launches of 8)"},
                            {F::FP8_B128, 8, 2192, 8192, 0, " (K=8192 at M=8: the smallest ring)"},
                            {F::FP8_B128, 3, 8768, 1024, 0, " (137 tile groups over the SMs)"},
                            {F::BF16, 13, 128, 512, 0, " (M>8, 4 tiles a stage)"},
                            {F::BF16, 3, 2192, 8192, 0, " (K=8192)"},
                            {F::BF16, 1, 64, 512, 0, " (one stage)"}};
      for (int64_t M : {1, 2, 5, 8}) {
        g8.push_back({F::FP8_B128, M, d, D, 0, " (wkv)"});
        g8.push_back({F::FP8_B128, M, ql, D, 0, " (wq_a)"});
        g8.push_back({F::FP8_B128, M, ql + d, D, 0, " (wq_a+wkv fused)"});
        g8.push_back({F::FP8_B128, M, H * d, ql, 0, " (wq_b)"});
        g8.push_back({F::FP8_B128, M, D, G * ol, 0, " (wo_b)"});
        g8.push_back({F::FP8_B128, M, 2 * I, D, 0, " (shared w13)"});
        g8.push_back({F::FP8_B128, M, D, I, 0, " (shared w2)"});
        g8.push_back({F::FP8_B128, M, 1008, 4096, 3, " (x blocks 2^-40..2^40)"});
        g8.push_back({F::FP8_B128, M, 1008, 4096, 4, " (scales 2^-10..2^8)"});
        g8.push_back({F::BF16, M, 256, D, 0, " (router gate)"});
        g8.push_back({F::BF16, M, 2 * d, D, 0, " (compressor)"});
      }
      for (auto c : g8) {
        auto n = nm("gemv_q_v8 %s M=%ld N=%ld K=%ld%s", wfmt_name(c.f), c.M, c.N, c.K, c.what);
        add(n, [=] { return gemv_case(c.f, c.M, c.N, c.K, c.variant, n, gemv_q_v8_noplan); });
      }
      const GI g8i[] = {{F::FP8_B128, 1008, 4096}, {F::FP8_B128, 4096, 2048}, {F::BF16, 256, 4096}, {F::BF16, 1024, 1024}};
      for (auto c : g8i) {
        auto n = nm("gemv_q_v8 invariance M=1..32 %s N=%ld K=%ld", wfmt_name(c.f), c.N, c.K);
        add(n, [=] { return gemv_inv_case(c.f, c.N, c.K, n, gemv_q_v8_noplan); });
      }
      struct GR { F f; int64_t M; int G; int64_t N, K; const char* what; };
      const GR g8g[] = {{F::FP8_B128, 1, G, ol, H * d / G, "wo_a"}, {F::FP8_B128, 2, G, ol, H * d / G, "wo_a"},
                        {F::FP8_B128, 8, G, ol, H * d / G, "wo_a"},  {F::FP8_B128, 3, 3, 1056, 2048, "3 groups"},
                        {F::BF16, 4, 2, 272, 4096, "bf16"},          {F::FP8_B128, 13, 8, 192, 1024, "M>8"}};
      for (auto c : g8g) {
        auto n = nm("gemv_q_v8_groups %s M=%ld G=%d N=%ld K=%ld (%s)", wfmt_name(c.f), c.M, c.G, c.N, c.K, c.what);
        add(n, [=] { return gemv_groups_case(c.f, c.M, c.G, c.N, c.K, n, true); });
      }
      add("gemv_q_v8 chain with programmatic edges fp8 M=1 (wq_a -> q norm-less wq_b-like 4096x1024)",
          [] { return gemv_v8_chain_case(F::FP8_B128, 1, 1024, 4096, 4096, "g8_chain1"); });
      add("gemv_q_v8 chain with programmatic edges fp8 M=8", [] { return gemv_v8_chain_case(F::FP8_B128, 8, 2048, 4096, 1024, "g8_chain2"); });
      add("gemv_q_v8 chain with programmatic edges bf16 M=3", [] { return gemv_v8_chain_case(F::BF16, 3, 1024, 2048, 512, "g8_chain3"); });
      add("gemv_q_v8 unsupported (fp4, K%1024!=0 fp8, K>8192, N%16!=0)", [] {
        Result res;
        DBuf x = dalloc(4 * 16384 * 4, "x"), w = dalloc(64 * 16384 * 2, "w"), sc = dalloc(64 * 128 * 4, "s"),
             y = dalloc(4 * 64 * 4, "y");
        poison(y);
        auto call = [&](dc::WFmt f, int64_t K, int64_t N) {
          return dc::gemv_q_v8(x.as<float>(), 4, K, 16384, dc::WeightRef{f, w.p(), sc.p(), 128}, N, y.as<float>(), 64, 0);
        };
        expect_true(res, call(F::FP4_B32, 1024, 64) == cudaErrorNotSupported, "fp4 not refused");
        expect_true(res, call(F::FP8_B128, 1536, 64) == cudaErrorNotSupported, "fp8 K=1536 not refused");
        expect_true(res, call(F::BF16, 768, 64) == cudaErrorNotSupported, "bf16 K=768 not refused");
        expect_true(res, call(F::FP8_B128, 9216, 64) == cudaErrorNotSupported, "fp8 K=9216 not refused");
        expect_true(res, call(F::FP8_B128, 1024, 40) == cudaErrorNotSupported, "N=40 not refused");
        expect_true(res, !dc::gemv_q_v8_supported(F::FP8_B128, 64, 1536) && dc::gemv_q_v8_supported(F::FP8_B128, 64, 4096),
                    "gemv_q_v8_supported");
        cudaGetLastError();
        auto yv = down<float>(y, 4 * 64);
        bool untouched = true;
        for (float f : yv) {
          uint32_t u;
          memcpy(&u, &f, 4);
          untouched &= u == 0xFFFFFFFFu;
        }
        expect_true(res, untouched, "y written by a refused call");
        if (res.pass) res.detail += "refused with cudaErrorNotSupported, nothing launched ";
        return res;
      });
    }
    if (g_perf) {
      struct GP { F f; int64_t N, K; const char* what; };
      const GP gp[] = {{F::FP8_B128, ql, D, "wq_a"}, {F::FP8_B128, H * d, ql, "wq_b"}, {F::FP8_B128, d, D, "wkv"},
                       {F::FP8_B128, ol, H * d / G, "wo_a one group"}, {F::FP8_B128, D, G * ol, "wo_b"},
                       {F::BF16, 2 * d, D, "compressor wkv/wgate"}, {F::BF16, 256, D, "router gate"},
                       {F::FP8_B128, 2 * I, D, "shared w13"}, {F::FP8_B128, D, I, "shared w2"},
                       {F::FP4_B32, 2 * I, D, "routed w13, one expert"}, {F::FP4_B32, D, I, "routed w2, one expert"},
                       {F::FP8_B128, 512, D, "2 MB"}, {F::FP8_B128, 2048, D, "8 MB"}, {F::FP8_B128, 8192, D, "32 MB"},
                       {F::BF16, Vv, D, "head"}};
      // v4 at M = 1..32; v3 (gemv_q_v3, launches of 8) side by side at M = 1 and 8
      for (auto c : gp) {
        for (int64_t M : {1, 4, 8, 16, 32}) {
          auto n = nm("gemv_q perf %s M=%ld N=%ld K=%ld (%s)", wfmt_name(c.f), M, c.N, c.K, c.what);
          add(n, [=] { return gemv_perf_case(c.f, M, c.N, c.K, 4, n); });
        }
        for (int64_t M : {1, 8}) {
          auto n = nm("gemv_q_v3 perf %s M=%ld N=%ld K=%ld (%s)", wfmt_name(c.f), M, c.N, c.K, c.what);
          add(n, [=] { return gemv_perf_case(c.f, M, c.N, c.K, 3, n); });
        }
        if (c.f == F::FP4_B32) continue;  // v6, v8: bf16 and fp8 only
        for (int64_t M : {1, 2, 4, 8}) {
          auto n = nm("gemv_q_v6 perf %s M=%ld N=%ld K=%ld (%s)", wfmt_name(c.f), M, c.N, c.K, c.what);
          add(n, [=] { return gemv_perf_case(c.f, M, c.N, c.K, 7, n); });
        }
        // v8 (M = 1, 8): plain graph edges and programmatic ones (the model's setting); ring depth at M = 1
        if (c.f != F::FP4_B32 && dc::gemv_q_v8_supported(c.f, c.N, c.K)) {
          for (int64_t M : {1, 8})
            for (int ver : {11, 12}) {
              auto n = nm("gemv_q_v8%s perf %s M=%ld N=%ld K=%ld (%s)", ver == 12 ? "_pdl" : "", wfmt_name(c.f), M, c.N,
                          c.K, c.what);
              add(n, [=] { return gemv_perf_case(c.f, M, c.N, c.K, ver, n); });
            }
          for (int ring : {3, 4, 8, 12}) {
            auto n = nm("gemv_q_v8 ring=%d perf %s M=1 N=%ld K=%ld (%s)", ring, wfmt_name(c.f), c.N, c.K, c.what);
            add(n, [=] { return gemv_perf_case(c.f, 1, c.N, c.K, 13, n, dc::GemvV6Tune{ring, 0, 0}); });
          }
        }
        // v6 schedule sweep (session 5: v6 loses to v3 on N ≤ 8192, where the default splits K into
        // one-step slices over 4-rank clusters): fewer, longer slices and fewer ranks, M = 1
        if (c.N < 16384)
          for (dc::GemvV6Tune t : {dc::GemvV6Tune{2048, 1, 4}, dc::GemvV6Tune{1024, 2, 4}, dc::GemvV6Tune{512, 4, 4},
                                   dc::GemvV6Tune{512, 4, 1}, dc::GemvV6Tune{256, 4, 1}, dc::GemvV6Tune{1024, 4, 2},
                                   dc::GemvV6Tune{2048, 4, 2}, dc::GemvV6Tune{4096, 4, 2}}) {
            auto n = nm("gemv_q_v6 tune items=%d steps=%d ranks=%d perf %s M=1 N=%ld K=%ld (%s)", t.items,
                        t.min_steps, t.ranks, wfmt_name(c.f), c.N, c.K, c.what);
            add(n, [=] { return gemv_perf_case(c.f, 1, c.N, c.K, 8, n, t); });
          }
      }
      // gemv_e4m3 (e4m3 x, wgmma, tensor-map weights) on the decode fp8 linears, M = 1 and 8
      {
        struct GEP { int G; int64_t N, K; bool swiglu; const char* what; };
        const GEP gep[] = {{1, ql + d, D, false, "wq_a+wkv fused"}, {1, H * d, ql, false, "wq_b"}, {1, D, G * ol, false, "wo_b"},
                           {G, ol, H * d / G, false, "wo_a 8 groups"},   {1, 2 * I, D, true, "shared w13 fused"},
                           {1, D, I, false, "shared w2"},                 {1, 8192, ql, false, "indexer wq_b"},
                           {1, 8192, D, false, "32 MB"}};
        for (auto c : gep)
          for (int64_t M : {1, 8}) {
            auto n = nm("gemv_e4m3 perf fp8 M=%ld G=%d N=%ld K=%ld (%s)", M, c.G, c.N, c.K, c.what);
            add(n, [=] { return gemv_e4m3_perf_case(M, c.G, c.N, c.K, c.swiglu, n); });
          }
        // timing ablations (results wrong): 1 no MMAs, 2 no x staging, 4 no epilogue, 7 a pure tensor-copy stream
        for (auto c : {gep[1], gep[2]})
          for (int64_t M : {1, 8})
            for (int ab : {1, 2, 4, 7}) {
              auto n = nm("gemv_e4m3 ablate=%d perf fp8 M=%ld G=%d N=%ld K=%ld (%s)", ab, M, c.G, c.N, c.K, c.what);
              add(n, [=] { return gemv_e4m3_perf_case(M, c.G, c.N, c.K, c.swiglu, n, ab); });
            }
        // the tensor-copy stream alone (ablate 7) by the tensor map's L2 promotion (0 none, 1 128 B; 2 = the default 256 B)
        for (auto c : {gep[1], gep[2]})
          for (int l2 : {0, 1}) {
            auto n = nm("gemv_e4m3 l2promo=%d ablate=7 perf fp8 M=1 G=%d N=%ld K=%ld (%s)", l2, c.G, c.N, c.K, c.what);
            add(n, [=] { return gemv_e4m3_perf_case(1, c.G, c.N, c.K, c.swiglu, n, 7, l2); });
          }
      }
      // session-8 sweep of the shapes the one above leaves out: wq_b (the ≥ 1024-tile default) and the fused
      // wq_a+wkv weight (the ≤ 6 MB default {512, 4, 1})
      for (auto [c, t] : {std::pair{GP{F::FP8_B128, H * d, ql, "wq_b"}, dc::GemvV6Tune{4096, 1, 1}},
                          std::pair{GP{F::FP8_B128, H * d, ql, "wq_b"}, dc::GemvV6Tune{4096, 1, 2}},
                          std::pair{GP{F::FP8_B128, H * d, ql, "wq_b"}, dc::GemvV6Tune{1024, 1, 1}},
                          std::pair{GP{F::FP8_B128, ql + d, D, "wq_a+wkv fused"}, dc::GemvV6Tune{512, 4, 1}},
                          std::pair{GP{F::FP8_B128, ql + d, D, "wq_a+wkv fused"}, dc::GemvV6Tune{1024, 2, 1}},
                          std::pair{GP{F::FP8_B128, ql + d, D, "wq_a+wkv fused"}, dc::GemvV6Tune{1024, 4, 2}},
                          std::pair{GP{F::FP8_B128, ql + d, D, "wq_a+wkv fused"}, dc::GemvV6Tune{2048, 2, 2}}}) {
        auto n = nm("gemv_q_v6 tune items=%d steps=%d ranks=%d perf %s M=1 N=%ld K=%ld (%s)", t.items, t.min_steps,
                    t.ranks, wfmt_name(c.f), c.N, c.K, c.what);
        add(n, [=] { return gemv_perf_case(c.f, 1, c.N, c.K, 8, n, t); });
      }
      // v6 against v8 on two more M = 1 shapes (the fused wq_a+wkv weight, a 2560-row compressor)
      for (auto c : {GP{F::FP8_B128, ql + d, D, "wq_a+wkv fused"}, GP{F::BF16, 2560, D, "compressor 2560"}})
        for (int ver : {7, 11, 12}) {
          auto n = nm("%s perf %s M=1 N=%ld K=%ld (%s)", ver == 7 ? "gemv_q_v6" : ver == 11 ? "gemv_q_v8" : "gemv_q_v8_pdl",
                      wfmt_name(c.f), c.N, c.K, c.what);
          add(n, [=] { return gemv_perf_case(c.f, 1, c.N, c.K, ver, n); });
        }
      // the floor of a kernel that only streams its bytes, from a graph (plain and programmatic edges)
      for (int64_t mb : {0, 2, 4, 8, 16, 33})
        for (int mode : {0, 1, 2}) {
          auto n = nm("floor perf stream %ld MB %s", mb, mode == 0 ? "plain" : mode == 1 ? "pdl" : "pdl early loads");
          add(n, [=] { return floor_case(mb << 20, mode > 0, mode == 2); });
        }
      // the floor of the GEMVs' 16-row tile pattern (wo_b- and wq_b-shaped, 33.5 MB), by slice length and order
      for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 8192}, {32768, 1024}})
        for (int span : {256, 1024, 8192})
          for (int order : {0, 1}) {
            if (span > K) continue;
            auto n = nm("floor perf tiles N=%ld K=%ld span=%d order=%d", N, K, span, order);
            add(n, [=] { return floor_tiles_case(N, K, span, order); });
          }
      // the floor of a 2-D tensor-copy stream (gemv_e4m3's weights), wq_b- and wo_b-shaped, by box and L2 promotion
      for (auto [N, K] : {std::pair<int64_t, int64_t>{32768, 1024}, {4096, 8192}})
        for (auto [bw, bh] : {std::pair<int, int>{128, 128}, {128, 256}, {128, 64}, {256, 64}, {256, 128}, {64, 256}})
          for (int l2 : {1, 2}) {
            auto n = nm("floor perf tmap N=%ld K=%ld box=%dx%d l2promo=%d ring=131072", N, K, bw, bh, l2);
            add(n, [=] { return floor_tmap_case(N, K, bw, bh, 131072, l2); });
          }
      // ... grown toward gemv_e4m3's block: 160 threads with 4 waiting warps, ~10 / ~90 KB more shared memory
      for (auto [N, K] : {std::pair<int64_t, int64_t>{32768, 1024}, {4096, 8192}})
        for (auto [wide, extra] : {std::pair<int, int>{1, 0}, {0, 10240}, {1, 10240}, {0, 90112}}) {
          auto n = nm("floor perf tmap N=%ld K=%ld box=128x128 l2promo=1 ring=131072 wide=%d extra=%d", N, K, wide, extra);
          add(n, [=] { return floor_tmap_case(N, K, 128, 128, 131072, 1, wide, extra); });
        }
      // the floor of a bulk-copy stream (copy size x ring bytes a block, one block an SM)
      for (int64_t mb : {4, 33})
        for (int copy : {1024, 2048, 4096, 16384, 32768})
          for (int ring : {65536, 131072, 196608}) {
            auto n = nm("floor perf bulk %ld MB copy=%d ring=%d pdl", mb, copy, ring);
            add(n, [=] { return floor_bulk_case(mb << 20, copy, ring, true); });
          }
      for (int64_t T : {1, 4, 8, 16, 32}) {
        auto n = nm("gemv_q_grouped perf fp8 T=%ld x 8 groups N=%ld K=%ld (wo_a, sel=0..7)", T, ol, H * d / G);
        add(n, [=] { return gemv_grouped_perf_case(F::FP8_B128, T, 8, 8, ol, H * d / G, true, false, true, false, n); });
        if (T > 8) continue;
        n = nm("gemv_q_v6_groups perf fp8 T=%ld x 8 groups N=%ld K=%ld (wo_a)", T, ol, H * d / G);
        add(n, [=] { return gemv_grouped_perf_case(F::FP8_B128, T, 8, 8, ol, H * d / G, true, false, true, 3, n); });
        n = nm("gemv_q_v8_groups perf fp8 T=%ld x 8 groups N=%ld K=%ld (wo_a)", T, ol, H * d / G);
        add(n, [=] { return gemv_grouped_perf_case(F::FP8_B128, T, 8, 8, ol, H * d / G, true, false, true, 5, n); });
        n = nm("gemv_q_grouped_v3 perf fp8 T=%ld x 8 groups N=%ld K=%ld (wo_a, sel=0..7)", T, ol, H * d / G);
        add(n, [=] { return gemv_grouped_perf_case(F::FP8_B128, T, 8, 8, ol, H * d / G, true, false, true, true, n); });
      }
      for (int64_t T : {1, 8}) {
        auto n = nm("gemv_q_grouped perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w13 + fused swiglu)", T, T * 6, 2 * I, D);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, 2 * I, D, false, true, false, false, n); });
        n = nm("gemv_q_grouped perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w2)", T, T * 6, D, I);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, D, I, true, false, false, false, n); });
        n = nm("gemv_q_grouped_v3 perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w13 + fused swiglu)", T, T * 6, 2 * I, D);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, 2 * I, D, false, true, false, true, n); });
        n = nm("gemv_q_grouped_v3 perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w2)", T, T * 6, D, I);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, D, I, true, false, false, true, n); });
      }
      // moe_gemv2 next to them: same shapes, same routing sets and byte counts (T = 2, 4 for the scaling)
      for (int64_t T : {1, 2, 4, 8}) {
        auto n = nm("moe_gemv2 perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w13 + fused swiglu)", T, T * 6, 2 * I, D);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, 2 * I, D, false, true, false, 2, n); });
        n = nm("moe_gemv2 perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w2)", T, T * 6, D, I);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, D, I, true, false, false, 2, n); });
        n = nm("moe_gemv2_rows perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w13 + fused swiglu)", T, T * 6, 2 * I, D);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, 2 * I, D, false, true, false, 6, n); });
        n = nm("moe_gemv2_rows perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w2)", T, T * 6, D, I);
        add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, D, I, true, false, false, 6, n); });
        for (int kind : {8, 7, 9}) {
          const char* what = kind == 7 ? "moe_gemv2_early" : kind == 9 ? "moe_gemv2_fp8 early" : "moe_gemv2 pdl";
          n = nm("%s perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w13 + fused swiglu)", what, T, T * 6, 2 * I, D);
          add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, 2 * I, D, false, true, false, kind, n); });
          n = nm("%s perf fp4 T=%ld slots=%ld E=256 N=%ld K=%ld (routed w2)", what, T, T * 6, D, I);
          add(n, [=] { return gemv_grouped_perf_case(F::FP4_B32, T, 6, 256, D, I, true, false, false, kind, n); });
        }
      }
    }
  }
  add("sample_rows M=64 V=129280", [] { return sample_rows_case(64, 129280, 0, "sm1"); });
  add("sample_rows M=160 V=1000", [] { return sample_rows_case(160, 1000, 0, "sm2"); });
  add("sample_rows M=1 V=129280", [] { return sample_rows_case(1, 129280, 2, "sm3"); });
  // clusters of 16 blocks a row (M ≤ SMs / 16), flat rows among them (radix refinement across the cluster)
  add("sample_rows M=8 V=129280 (16 blocks a row, flat rows)", [] { return sample_rows_case(8, 129280, 10, "sm7"); });
  add("sample_rows M=256 V=129280 (one block a row)", [] { return sample_rows_case(256, 129280, 0, "sm8"); });
  add("sample_rows M=48 V=1001 ld=1003 (unaligned rows)", [] { return sample_rows_case(48, 1001, 5, "sm4", 1003); });
  add("sample_rows M=64 V=129280 with logit edits", [] { return sample_rows_case(64, 129280, 1, "sm5", 0, true); });
  add("sample_rows M=33 V=1001 ld=1003 with logit edits", [] { return sample_rows_case(33, 1001, 3, "sm6", 1003, true); });
  add("mask_rows M=16 V=129280", [] { return mask_rows_case(16, 129280, 129280, "mk1"); });
  add("mask_rows M=37 V=1001 ld=1003", [] { return mask_rows_case(37, 1001, 1003, "mk2"); });
  add("sample_rows M=64 V=129280 with logit edits and logprobs", [] { return sample_rows_case(64, 129280, 1, "sm9", 0, true, true); });
  add("sample_rows M=48 V=1001 ld=1003 with logit edits and logprobs", [] { return sample_rows_case(48, 1001, 5, "sm10", 1003, true, true); });
  add("sample_rows M=1 V=129280 logprobs", [] { return sample_rows_case(1, 129280, 22, "sm11", 0, false, true); });
  add("sample_rows M=8 V=129280 logprobs (flat rows)", [] { return sample_rows_case(8, 129280, 10, "sm12", 0, false, true); });
}

void measure_ceilings() {
  std::vector<DBuf> bufs;
  g_bufs = &bufs;
  const size_t n = 2ull << 30;
  DBuf a = dalloc(n, "copy_a"), b = dalloc(n, "copy_b");
  const double us = time_us([&] { cudaMemcpyAsync(b.p(), a.p(), n, cudaMemcpyDeviceToDevice, 0); });
  const double copy = 2.0 * n / us / 1e3;
  const int64_t S = 8192;
  DBuf x = dalloc(S * S * 2, "gx"), w = dalloc(S * S * 2, "gw"), y = dalloc(S * S * 4, "gy");
  fill_bytes<<<4096, 256>>>(x.as<uint8_t>(), S * S * 2, 1, 0x30, 16);  // finite bf16 values, not zeros
  fill_bytes<<<4096, 256>>>(w.as<uint8_t>(), S * S * 2, 2, 0x30, 16);
  const double gus = time_us([&] { dc::gemm_bf16_lt(lt(), x.as<bf16>(), S, S, S, w.as<bf16>(), S, y.as<float>(), S, 0); });
  const double tf = 2.0 * S * S * S / gus / 1e6;
  DBuf xs = dalloc(S / 128 * S * 4, "gxs"), ws = dalloc(S / 128 * S / 128 * 4, "gws");
  std::vector<float> ones(S / 128 * S, 1.0f);
  CK(cudaMemcpy(xs.p(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ws.p(), ones.data(), (S / 128) * (S / 128) * 4, cudaMemcpyHostToDevice));
  double tf8 = 0;
  if (dc::gemm_fp8_block_lt(lt(), x.as<uint8_t>(), xs.as<float>(), S, S, w.as<uint8_t>(), ws.as<float>(), S / 128, S,
                            y.as<float>(), S, 0) == cudaSuccess) {
    const double fus = time_us([&] {
      dc::gemm_fp8_block_lt(lt(), x.as<uint8_t>(), xs.as<float>(), S, S, w.as<uint8_t>(), ws.as<float>(), S / 128, S,
                            y.as<float>(), S, 0);
    });
    tf8 = 2.0 * S * S * S / fus / 1e6;
  }
  cudaGetLastError();
  printf("ceilings (issue): HBM copy %.0f GB/s, bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s\n", g_hbm_gbs, g_bf16_tflops, g_fp8_tflops);
  printf("ceilings (this run): D2D copy %.0f GB/s (2 GiB, read+write); cuBLASLt bf16 8192^3 %.0f TFLOP/s (f32 out); "
         "cuBLASLt fp8 block-scaled 8192^3 %.0f TFLOP/s\n", copy, tf, tf8);
  for (auto& bb : bufs) cudaFree(bb.base);
  g_bufs = nullptr;
}

}  // namespace

bool filter_match(const std::string& name) {
  if (g_filter.empty()) return true;
  const bool negate = g_filter[0] == '!';
  std::stringstream ss(g_filter.substr(negate ? 1 : 0));
  std::string alt;
  bool any = false;
  while (std::getline(ss, alt, '|')) any |= !alt.empty() && name.find(alt) != std::string::npos;
  return any != negate;
}

int main(int argc, char** argv) {
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--perf") g_perf = true;
    else if (a == "--list") list = true;
    else if (a == "--filter" && i + 1 < argc) g_filter = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--perf] [--filter SUBSTR] [--list]\n", argv[0]);
      return 2;
    }
  }
  const char* se = getenv("DEEPINFER_SEED");
  g_seed = se ? strtoull(se, nullptr, 10) : (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
  register_cases();
  if (list) {
    for (auto& c : cases()) printf("%s\n", c.name.c_str());
    return 0;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    printf("no CUDA device\n0 passed, 1 failed\n");
    return 1;
  }
  if (const cudaError_t e = dc::init_kernel_attributes(); e != cudaSuccess) {  // once, as CudaBackend does
    printf("init_kernel_attributes: %s\n0 passed, 1 failed\n", cudaGetErrorString(e));
    return 1;
  }
  printf("device: %s, %d SMs, %.0f MB L2, cc %d.%d; seed %llu\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize / 1e6, prop.major, prop.minor, (unsigned long long)g_seed);
  if (g_perf) {
    try {
      measure_ceilings();
    } catch (const std::exception& e) {
      printf("ceiling measurement failed: %s\n", e.what());
    }
  }
  int passed = 0, failed = 0;
  for (auto& c : cases()) {
    if (!filter_match(c.name)) continue;
    std::vector<DBuf> bufs;
    g_bufs = &bufs;
    Result r;
    try {
      r = c.fn();
      const std::string g = check_guards();
      if (!g.empty()) r.pass = false, r.detail += "FAIL:" + g + " ";
    } catch (const std::exception& e) {
      r.pass = false;
      r.detail += std::string("exception: ") + e.what();
      cudaGetLastError();
    }
    for (auto& b : bufs) cudaFree(b.base);
    g_bufs = nullptr;
    (r.pass ? passed : failed)++;
    printf("[%s] %-70s %s\n", r.pass ? "PASS" : "FAIL", c.name.c_str(), r.detail.c_str());
    if (g_perf && r.us > 0) {
      const double gbs = r.bytes / r.us / 1e3, tfl = r.flops / r.us / 1e6;
      const double ceil_t = r.fp8 ? g_fp8_tflops : g_bf16_tflops;
      const double floor_us = std::max(r.bytes / (g_hbm_gbs * 1e3), r.flops / (ceil_t * 1e6));
      printf("       perf: %10.2f us | %7.0f GB/s (%5.1f%% HBM) | %7.1f TFLOP/s (%5.1f%% %s) | roofline floor %.2f us -> %5.1f%%\n",
             r.us, gbs, 100.0 * gbs / g_hbm_gbs, tfl, 100.0 * tfl / ceil_t, r.fp8 ? "fp8" : "bf16", floor_us,
             100.0 * floor_us / r.us);
      if (r.graph_us > 0)
        printf("       graph: %10.2f us/call from a CUDA graph (%5.1f%% HBM) | back to back %.2f us | host %.2f us/call\n",
               r.graph_us, 100.0 * r.bytes / r.graph_us / 1e3 / g_hbm_gbs, r.us, r.host_us);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
