// DeepSeek-V4 on the CUDA backend against the CPU oracle (run by hand on a GPU machine; not a ctest):
//
//  0. every op of the Backend table, CUDA against CPU, on small odd shapes (relative max error);
//  1. the reference fixtures (tests/fixtures/v4): full forward, token-by-token decode and chunked
//     prefill on the GPU within the CPU test's float32 bounds against transformers (median relative
//     L2 per position ≤ 1e-5, max ≤ 1e-3, argmax agreement ≥ 0.99), bitwise equal across schedules
//     and between batched and alone, and close to the CPU backend's logits;
//  2. the embedded model (models/nano-v4): greedy decoding of every prompt of greedy_reference.json
//     for --tokens new tokens (EOS ignored) on GPU and CPU, token for token; timed;
//  3. the engine (EngineConfig::backend = "cuda": weights, activations and the paged cache in device
//     memory, the cache sized from the free memory) against the engine on the CPU: same prompts,
//     same greedy tokens; timed.
//  4. the fast path (CudaWeights::Stored: bf16 / fp8 / fp4 weights kept as stored, activations rounded to
//     bf16, or e4m3 for large fp8 GEMMs): linear() per format and batch size against the CPU on the
//     dequantized weights; the fixtures within the BF16-compute bounds of tests/fixtures/v4/README.md
//     (median row rel-L2 < 0.05, argmax agreement ≥ 0.85); nano greedy tokens and speed next to float32.
//  5. DeepSeek-V4.1: (a) its ops (hc_mix, kv_qdq, engram_gate, and compress_windows / indexer_scores
//     in the forms only V4.1 uses), CUDA against CPU on odd shapes; (b) the V4.1 fixtures
//     (tests/fixtures/v41, float64 references of the spec) in the CPU test's four schedules and
//     bounds, bitwise across schedules and batched vs alone, with the GPU–CPU distance; (c) the
//     engine driving V4.1 on cuda: greedy = the engine on cpu, seeded batches with preemption = alone.
//
// Usage: test_model_cuda [--root DIR (repo root, default .)] [--tokens N (256)] [--threads N]
//                        [--out summary.json] [--decode-only N (profiling: one sequence, N greedy tokens)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cuda/cuda_backend.h"
#include "util/error.h"
#include "util/json.h"
#include "../unit/reference_fixtures.h"
#include "../unit/v41_flips.h"

using namespace deepinfer;
namespace fs = std::filesystem;
using testref::RefSeq, testref::ErrStats, testref::compare, testref::read_refs;

namespace {

int g_failures = 0;
nlohmann::json g_summary;

// Names appended to a comma list in the environment (DEEPINFER_CUDA_OFF / DEEPINFER_CUDA_ON) while it lives: a
// backend or engine made meanwhile takes them (the backend reads the lists when it is made); the variable as it
// was afterwards (unset when it was).
class EnvAppend {
 public:
  EnvAppend(const char* var, const char* names) : var_(var) {
    const char* v = std::getenv(var);
    had_ = v != nullptr;
    if (had_) before_ = v;
    setenv(var, (before_ + "," + names).c_str(), 1);
  }
  ~EnvAppend() {
    if (had_) setenv(var_, before_.c_str(), 1);
    else unsetenv(var_);
  }
  EnvAppend(const EnvAppend&) = delete;
  EnvAppend& operator=(const EnvAppend&) = delete;

 private:
  const char* var_;
  bool had_ = false;
  std::string before_;
};
// Device 0 for a backend made with an EnvAppend in force: `CudaBackend b(device_with(EnvAppend(...)), ...)` (the
// temporary lives until the backend is made).
int device_with(const EnvAppend&) { return 0; }

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- 0. op checks: the same inputs through both backends ----
std::vector<float> randv(std::mt19937& g, int64_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

// One op case: the same inputs through a backend, the outputs concatenated; tol bounds
// max |gpu − cpu| / max |cpu| (0: bitwise).
struct OpCase {
  std::string name;
  std::function<std::vector<float>(Backend&)> run;
  double tol;
};

void run_op_cases(const std::vector<OpCase>& cases, CpuBackend& cpu, CudaBackend& gpu, const char* key) {
  for (const auto& c : cases) {
    std::vector<float> a, b;
    try {
      a = c.run(cpu);
      b = c.run(gpu);
    } catch (const std::exception& e) {
      expect(false, "op " + c.name + ": " + e.what());
      continue;
    }
    double mx = 0, ref = 0;
    bool nan = a.size() != b.size() || a.empty();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (std::isnan(b[i]) != std::isnan(a[i])) nan = true;
      if (std::isfinite(a[i]) && std::isfinite(b[i])) mx = std::max(mx, (double)std::fabs(a[i] - b[i]));
      else if (a[i] != b[i]) nan = true;
      if (std::isfinite(a[i])) ref = std::max(ref, (double)std::fabs(a[i]));
    }
    const double rel = mx / std::max(ref, 1e-30);
    std::printf("op %-40s max |gpu - cpu| / max |cpu| = %.2e (tol %.0e)%s\n", c.name.c_str(), rel, c.tol,
                nan ? " NaN/inf/size mismatch" : "");
    expect(!nan && rel <= c.tol, "op " + c.name);
    g_summary[key][c.name] = rel;
  }
}

void op_checks(CpuBackend& cpu, CudaBackend& gpu) {
  std::mt19937 g(1234);
  using Case = OpCase;
  std::vector<Case> cases;
  {  // strided linear
    const int64_t M = 5, K = 48, N = 37, ldx = K + 3, ldy = N + 5;
    auto x = randv(g, M * ldx), w = randv(g, N * K);
    cases.push_back({"linear 5x48x37 strided", [=](Backend& be) {
                       Buffer<float> X(be, x), Y(be, M * ldy);
                       be.fill(Y.data(), M * ldy, 7.0f);
                       auto W = be.make_weight(w.data(), N, K);
                       be.linear(X.data(), M, ldx, *W, Y.data(), ldy);
                       return Y.to_host();
                     }, 1e-5});
    const int64_t M2 = 70, K2 = 256, N2 = 130;
    auto x2 = randv(g, M2 * K2), w2 = randv(g, N2 * K2);
    cases.push_back({"linear 70x256x130", [=](Backend& be) {
                       Buffer<float> X(be, x2), Y(be, M2 * N2);
                       auto W = be.make_weight(w2.data(), N2, K2);
                       be.linear(X.data(), M2, K2, *W, Y.data(), N2);
                       return Y.to_host();
                     }, 1e-5});
  }
  {  // sink attention over a window pool and an entry pool
    const int64_t M = 6, H = 4, d = 64, nwin = 20, nent = 30;
    auto q = randv(g, M * H * d), win = randv(g, nwin * d), ent = randv(g, nent * d), sinks = randv(g, H);
    std::vector<int32_t> lo(M), hi(M), idx;
    std::vector<int64_t> off{0};
    for (int64_t m = 0; m < M; ++m) {
      lo[m] = (int32_t)(m * 2);
      hi[m] = (int32_t)(m * 2 + 3 + m);
      for (int64_t j = 0; j < m * 3; ++j) idx.push_back((int32_t)((m * 7 + j * 5) % nent));
      off.push_back((int64_t)idx.size());
    }
    for (bool with_ent : {false, true})
      cases.push_back({std::string("sink_attention ") + (with_ent ? "win+ent" : "win only"), [=](Backend& be) {
                         Buffer<float> Q(be, q), Wn(be, win), En(be, ent), S(be, sinks), O(be, M * H * d);
                         Buffer<int32_t> L(be, lo), Hh(be, hi), I(be, idx);
                         Buffer<int64_t> Of(be, off);
                         be.sink_attention(Q.data(), M, H * d, (int)H, (int)d, Wn.data(), L.data(), Hh.data(),
                                           En.data(), I.data(), with_ent ? Of.data() : nullptr, S.data(), 0.125f,
                                           O.data(), H * d);
                         return O.to_host();
                       }, 1e-5});
  }
  {  // indexer
    const int64_t M = 3, hI = 12, dI = 16, nk = 25, rows = 40;
    auto q = randv(g, M * hI * dI), gm = randv(g, M * hI), K = randv(g, rows * dI);
    std::vector<int32_t> kr(nk), nv{5, 25, 17};
    for (int64_t i = 0; i < nk; ++i) kr[i] = (int32_t)((i * 13) % rows);
    cases.push_back({"indexer_scores", [=](Backend& be) {
                       Buffer<float> Q(be, q), G(be, gm), Kb(be, K), S(be, M * nk);
                       Buffer<int32_t> R(be, kr), N(be, nv);
                       be.indexer_scores(Q.data(), G.data(), M, (int)hI, (int)dI, Kb.data(), R.data(), 0, nk, N.data(),
                                         0.25f, S.data());
                       return S.to_host();
                     }, 1e-5});
  }
  for (bool overlap : {false, true}) {  // compressor windows + pooling
    const int m = 4, width = 8;
    const int64_t cw = (overlap ? 2 : 1) * width, R = overlap ? 2 * m : m, n = 9, p0 = 5, ld = cw + 2;
    auto rkv = randv(g, R * cw), rg = randv(g, R * cw), kv = randv(g, n * ld), gate = randv(g, n * ld),
         ape = randv(g, m * cw);
    std::vector<int32_t> wins{1, 2, 3};  // windows closing at positions 7, 11, 15 (p0 = 5, n = 9 → 5..13)
    wins.pop_back();
    const int S = overlap ? 2 * m : m;
    cases.push_back({std::string("compress_windows+pool ") + (overlap ? "CSA" : "HCA"), [=](Backend& be) {
                       Buffer<float> RK(be, rkv), RG(be, rg), KV(be, kv), GT(be, gate), A(be, ape);
                       Buffer<int32_t> Wd(be, wins);
                       const int64_t nw = (int64_t)wins.size();
                       Buffer<float> skv(be, nw * S * width), sg(be, nw * S * width), out(be, nw * width);
                       be.compress_windows(RK.data(), RG.data(), KV.data(), GT.data(), ld, p0, A.data(), m, width,
                                           overlap, Wd.data(), nullptr, nw, skv.data(), sg.data());
                       be.compress_pool(skv.data(), sg.data(), nw, S, width, out.data());
                       be.ring_write(KV.data(), ld, n, cw, p0, RK.data(), R);
                       auto a = out.to_host(), b = RK.to_host(), c = skv.to_host();
                       a.insert(a.end(), b.begin(), b.end());
                       a.insert(a.end(), c.begin(), c.end());
                       return a;
                     }, 1e-6});
  }
  for (bool overlap : {false, true}) {  // compress_emit (one kernel on CUDA): a chunk's windows, one row −1
    const int m = 4, width = 16, rd = 8;
    const int64_t cw = (overlap ? 2 : 1) * width, R = overlap ? 2 * m : m, n = 9, p0 = 5, ld = 2 * cw + 4, rows = 6;
    auto rkv = randv(g, R * cw), rg = randv(g, R * cw), proj = randv(g, n * ld), ape = randv(g, m * cw),
         nw_ = randv(g, width), invf = randv(g, rd / 2, 0.0f, 1.0f);
    std::vector<int32_t> wins{1, 2, 0}, pos{4, 8, 0}, dr{3, -1, 5};  // window 0 too (its absent half)
    cases.push_back({std::string("compress_emit ") + (overlap ? "CSA" : "HCA"), [=](Backend& be) {
                       Buffer<float> RK(be, rkv), RG(be, rg), P(be, proj), A(be, ape), NW(be, nw_), F(be, invf),
                           Dst(be, rows * width);
                       Buffer<int32_t> Wd(be, wins), Ps(be, pos), Dr(be, dr);
                       be.fill(Dst.data(), rows * width, 0.5f);
                       be.compress_emit(RK.data(), RG.data(), P.data(), P.data() + cw, ld, p0, A.data(), m, width,
                                        overlap, Wd.data(), nullptr, (int64_t)wins.size(), NW.data(), 1e-6f, rd,
                                        Ps.data(), F.data(), Dst.data(), Dr.data());
                       return Dst.to_host();
                     }, 1e-5});
  }
  {  // copy_rows_multi (one kernel on CUDA): 3 column slices of the same rows into two buffers, a row −1
    const int64_t n = 5, lds = 40, rows = 12;
    auto src = randv(g, 9 * lds);
    std::vector<int32_t> sr{8, 0, 3, 3, 6}, d0{1, 4, -1, 7, 10}, d1{0, 2, 3, 5, 11}, d2{6, 8, 9, -1, 11};
    cases.push_back({"copy_rows_multi", [=](Backend& be) {
                       Buffer<float> S(be, src), A(be, rows * 16), B(be, rows * 8);
                       Buffer<int32_t> SR(be, sr), D0(be, d0), D1(be, d1), D2(be, d2);
                       be.fill(A.data(), rows * 16, 0.25f);
                       be.fill(B.data(), rows * 8, -1.0f);
                       // A's rows d0 and d2 are distinct: the first and third sets write A, the second B
                       const Backend::RowCopy sets[3] = {{0, A.data(), 16, D0.data(), 16},
                                                         {16, B.data(), 8, D1.data(), 8},
                                                         {24, A.data(), 16, D2.data(), 16}};
                       be.copy_rows_multi(S.data(), lds, SR.data(), sets, 3, n);
                       auto a = A.to_host(), b = B.to_host();
                       a.insert(a.end(), b.begin(), b.end());
                       return a;
                     }, 0.0});
  }
  {  // rows: copy_rows, ring_read, add_rows, scale
    const int64_t n = 7, width = 12, rows = 20;
    auto src = randv(g, rows * width), w = randv(g, n);
    std::vector<int32_t> sr{3, 1, 4, 15, 9, 2, 6}, dr{0, 5, 10, 15, 19, 2, 7};
    cases.push_back({"copy_rows/ring_read/add_rows/scale", [=](Backend& be) {
                       Buffer<float> S(be, src), D(be, rows * width), D2(be, n * width);
                       be.fill(D.data(), rows * width, 0.5f);
                       be.copy_rows(S.data(), width, nullptr, D.data(),
                                    width, nullptr, n, width);
                       Buffer<int32_t> SR(be, sr), DR(be, dr);
                       Buffer<float> Wt(be, w);
                       be.copy_rows(S.data(), width, SR.data(), D.data(), width, DR.data(), n, width);
                       be.ring_read(S.data(), rows, width, 17, n, D2.data());
                       be.add_rows(D2.data(), n, width, Wt.data(), DR.data(), D.data());
                       be.add_rows(D2.data(), n, width, nullptr, nullptr, D.data());
                       be.scale(D.data(), rows * width, 0.75f);
                       return D.to_host();
                     }, 1e-6});
  }
  {  // norms, rope, swiglu, mHC with hc = 3 and 4
    const int64_t M = 5, D = 48;
    auto x = randv(g, M * D), w = randv(g, D);
    cases.push_back({"rms_norm", [=](Backend& be) {
                       Buffer<float> X(be, x), W(be, w), Y(be, M * D);
                       be.rms_norm(X.data(), M, D, D, W.data(), 1e-6f, Y.data());
                       return Y.to_host();
                     }, 1e-5});
    const int64_t H = 4, hd = 32, rd = 16;
    auto xr = randv(g, M * H * hd), invf = randv(g, rd / 2, 0.0f, 1.0f);
    std::vector<int32_t> pos{0, 3, 17, 100, 4095};
    cases.push_back({"rope fwd+inv", [=](Backend& be) {
                       Buffer<float> X(be, xr), F(be, invf);
                       Buffer<int32_t> P(be, pos);
                       be.rope(X.data(), M, H * hd, (int)H, (int)hd, (int)rd, P.data(), F.data(), false);
                       auto a = X.to_host();
                       be.rope(X.data(), M, H * hd, (int)H, (int)hd, (int)rd, P.data(), F.data(), true);
                       auto b = X.to_host();
                       a.insert(a.end(), b.begin(), b.end());
                       return a;
                     }, 1e-5});
    const int64_t I = 16;
    auto gu = randv(g, M * 2 * I, -12, 12);
    cases.push_back({"swiglu_clamp", [=](Backend& be) {
                       Buffer<float> G(be, gu), A(be, M * I);
                       be.swiglu_clamp(G.data(), M, I, 10.0f, nullptr, A.data());
                       return A.to_host();
                     }, 1e-5});
    for (int hc : {3, 4}) {
      const int64_t mix = (2 + hc) * hc;
      auto X = randv(g, M * hc * D), fn = randv(g, mix * hc * D, -0.1f, 0.1f), base = randv(g, mix),
           sc = randv(g, 3), y = randv(g, M * D), hfn = randv(g, hc * hc * D, -0.1f, 0.1f), hb = randv(g, hc);
      cases.push_back({"hc_pre/post/head hc=" + std::to_string(hc), [=](Backend& be) {
                         Buffer<float> Xb(be, X), F(be, fn), B(be, base), S(be, sc), Y(be, y), HF(be, hfn), HB(be, hb);
                         Buffer<float> u(be, M * D), post(be, M * hc), comb(be, M * hc * hc), out(be, M * hc * D),
                             hu(be, M * D);
                         be.hc_pre(Xb.data(), M, hc, D, F.data(), B.data(), S.data(), 20, 1e-6f, 1e-6f, u.data(),
                                   post.data(), comb.data());
                         be.hc_post(Xb.data(), Y.data(), post.data(), comb.data(), M, hc, D, out.data());
                         be.hc_head(Xb.data(), M, hc, D, HF.data(), HB.data(), S.data(), 1e-6f, 1e-6f, hu.data());
                         std::vector<float> r;
                         for (auto* b : {&u, &post, &comb, &out, &hu}) {
                           auto h = b->to_host();
                           r.insert(r.end(), h.begin(), h.end());
                         }
                         return r;
                       }, 1e-5});
    }
  }
  run_op_cases(cases, cpu, gpu, "ops");
}

// One sequence: `first` tokens in one step, then steps of `step` tokens; the cache in `be`'s memory.
std::vector<float> run_schedule(DeepseekV4Model& m, Backend& be, const std::vector<int32_t>& ids, int64_t first,
                                int64_t step) {
  V4Cache cache(m.config(), 1, (int32_t)V4CacheLayout::make(m.config()).pages_for((int64_t)ids.size()), &be);
  V4SeqState st;
  if (!cache.open(&st) || !cache.reserve(&st, (int64_t)ids.size())) throw Error("cache");
  std::vector<float> out;
  int64_t done = 0, T = (int64_t)ids.size();
  while (done < T) {
    int64_t n = done == 0 ? std::min(first, T) : std::min(step, T - done);
    V4SeqChunk c{&st, std::span<const int32_t>(ids.data() + done, n), true};
    auto l = m.forward(std::span<const V4SeqChunk>(&c, 1), cache);
    out.insert(out.end(), l.begin(), l.end());
    done += n;
  }
  return out;
}

void fixtures(const std::string& root, CpuBackend& cpu, CudaBackend& gpu) {
  std::vector<std::string> dirs;
  for (auto& e : fs::directory_iterator(root + "/tests/fixtures/v4"))
    if (fs::exists(e.path() / "ref.safetensors")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  expect(!dirs.empty(), "no fixtures");
  for (const auto& dir : dirs) {
    const std::string name = fs::path(dir).filename();
    LoadedModel mg = load_model(dir + "/model", gpu);
    LoadedModel mc = load_model(dir + "/model", cpu);
    const int64_t V = mg.v4->config().vocab_size;
    auto refs = read_refs(dir);
    double worst_median = 0, worst_max = 0, worst_agree = 1, worst_vs_cpu = 0;
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto& r = refs[k];
      const int64_t T = (int64_t)r.ids.size();
      struct Mode {
        const char* name;
        int64_t first, step;
      };
      std::vector<float> full;
      for (Mode mode : {Mode{"full", T, T}, Mode{"decode", 13, 1}, Mode{"chunked", 5, 7}, Mode{"chunked", 1, 4}}) {
        const std::string what = name + " seq " + std::to_string(k) + " " + mode.name + "(" +
                                 std::to_string(mode.first) + "," + std::to_string(mode.step) + ")";
        auto out = run_schedule(*mg.v4, gpu, r.ids, mode.first, mode.step);
        if (full.empty()) {
          full = out;
          auto cpu_out = run_schedule(*mc.v4, cpu, r.ids, T, T);
          ErrStats c = compare(out, cpu_out, V);
          worst_vs_cpu = std::max(worst_vs_cpu, c.max);
          std::printf("%-40s gpu vs cpu: median rel %.2e max %.2e argmax %.3f\n", what.c_str(), c.median, c.max,
                      c.argmax_agree);
        } else {
          expect(std::memcmp(full.data(), out.data(), out.size() * sizeof(float)) == 0,
                 what + ": not bitwise equal to the full forward");
        }
        ErrStats e = compare(out, r.logits, V);
        std::printf("%-40s gpu vs ref: median rel %.2e max %.2e argmax %.3f\n", what.c_str(), e.median, e.max,
                    e.argmax_agree);
        expect(e.median <= 1e-5, what + ": median");
        expect(e.max <= 1e-3, what + ": max");
        expect(e.argmax_agree >= 0.99, what + ": argmax");
        worst_median = std::max(worst_median, e.median);
        worst_max = std::max(worst_max, e.max);
        worst_agree = std::min(worst_agree, e.argmax_agree);
      }
    }
    g_summary["fixtures"][name] = {{"worst_median_rel", worst_median},
                                   {"worst_max_rel", worst_max},
                                   {"worst_argmax_agree", worst_agree},
                                   {"worst_max_rel_vs_cpu", worst_vs_cpu}};
  }

  // Batched vs alone on the GPU (first fixture): bitwise.
  const std::string dir = dirs.front();
  LoadedModel m = load_model(dir + "/model", gpu);
  const int64_t V = m.v4->config().vocab_size;
  auto refs = read_refs(dir);
  std::vector<std::vector<int32_t>> seqs;
  for (auto& r : refs) seqs.push_back(r.ids);
  seqs.push_back(std::vector<int32_t>(refs[0].ids.begin(), refs[0].ids.begin() + 29));
  struct Sched {
    int64_t first, step;
  };
  std::vector<Sched> sched{{9, 4}, {1, 1}, {30, 11}, {17, 3}};
  sched.resize(seqs.size(), {5, 2});
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < seqs.size(); ++i)
    alone.push_back(run_schedule(*m.v4, gpu, seqs[i], sched[i].first, sched[i].step));
  V4Cache cache(m.v4->config(), (int32_t)seqs.size(), 64, &gpu);
  std::vector<V4SeqState> states(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    if (!cache.open(&states[i]) || !cache.reserve(&states[i], (int64_t)seqs[i].size())) throw Error("cache");
  std::vector<int64_t> done(seqs.size(), 0);
  std::vector<std::vector<float>> batched(seqs.size());
  for (;;) {
    std::vector<V4SeqChunk> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      int64_t T = (int64_t)seqs[i].size();
      if (done[i] >= T) continue;
      int64_t n = done[i] == 0 ? std::min(sched[i].first, T) : std::min(sched[i].step, T - done[i]);
      batch.push_back({&states[i], std::span<const int32_t>(seqs[i].data() + done[i], n), true});
      who.push_back(i);
      done[i] += n;
    }
    if (batch.empty()) break;
    auto l = m.v4->forward(batch, cache);
    size_t off = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      size_t n = batch[b].tokens.size() * V;
      batched[who[b]].insert(batched[who[b]].end(), l.begin() + off, l.begin() + off + n);
      off += n;
    }
  }
  bool same = true;
  for (size_t i = 0; i < seqs.size(); ++i)
    same = same && alone[i].size() == batched[i].size() &&
           std::memcmp(alone[i].data(), batched[i].data(), alone[i].size() * sizeof(float)) == 0;
  std::printf("batched vs alone on the GPU (%s, %zu sequences): %s\n", fs::path(dir).filename().c_str(), seqs.size(),
              same ? "bitwise equal" : "DIFFERENT");
  expect(same, "batched vs alone on the GPU");
  g_summary["batched_bitwise_equal"] = same;
}

struct GreedyRun {
  std::vector<std::vector<int32_t>> out;  // new tokens per prompt
  double prefill_s = 0, decode_s = 0;
  int64_t decode_tokens = 0;
};

int32_t argmax(const float* x, int64_t V) { return (int32_t)(std::max_element(x, x + V) - x); }

// Greedy decoding of all prompts together (one prefill step, then one token per sequence a step). With
// `prepared_ahead`, the engine's pipelining (DeepseekV4Model::prepare/launch): step N+1 is planned and
// recorded before step N's logits are read, its token ids go in at launch; counts the steps prepared
// ahead (recorded in a graph, not just kept for launch).
GreedyRun greedy(DeepseekV4Model& m, Backend& be, const std::vector<std::vector<int32_t>>& prompts, int n_new,
                 int* prepared_ahead = nullptr) {
  const int64_t V = m.config().vocab_size, B = (int64_t)prompts.size();
  const V4CacheLayout lay = V4CacheLayout::make(m.config());
  int64_t pages = 0;
  for (auto& p : prompts) pages += lay.pages_for((int64_t)p.size() + n_new);
  V4Cache cache(m.config(), (int32_t)B, (int32_t)pages, &be);
  std::vector<V4SeqState> st(B);
  for (int64_t b = 0; b < B; ++b)
    if (!cache.open(&st[b]) || !cache.reserve(&st[b], (int64_t)prompts[b].size() + n_new)) throw Error("cache");
  GreedyRun r;
  r.out.resize(B);
  be.synchronize();
  double t0 = now_s();
  std::vector<V4SeqChunk> batch;
  for (int64_t b = 0; b < B; ++b) batch.push_back({&st[b], std::span<const int32_t>(prompts[b]), false});
  std::span<const float> l = m.forward_view(batch, cache);
  auto take = [&] {
    for (int64_t b = 0; b < B; ++b) r.out[b].push_back(argmax(l.data() + b * V, V));
  };
  take();
  double t1 = now_s();
  if (!prepared_ahead) {
    for (int i = 1; i < n_new; ++i) {
      batch.clear();
      for (int64_t b = 0; b < B; ++b) batch.push_back({&st[b], std::span<const int32_t>(&r.out[b].back(), 1), false});
      l = m.forward_view(batch, cache);
      take();
    }
  } else {
    *prepared_ahead = 0;
    const int32_t placeholder = 0;
    for (int step = 1; step <= n_new; ++step) {
      // step `step` (its input: the previous token) is prepared before the running step's logits are read
      const bool more = step < n_new;
      if (more) {
        batch.clear();
        for (int64_t b = 0; b < B; ++b) batch.push_back({&st[b], std::span<const int32_t>(&placeholder, 1), false});
        m.prepare(batch, cache);
        *prepared_ahead += m.prepared_ahead();
      }
      if (step > 1) {  // the step launched last round
        l = m.logits();
        take();
      }
      if (!more) break;
      std::vector<int32_t> ids(B);
      for (int64_t b = 0; b < B; ++b) ids[b] = r.out[b].back();
      m.launch(ids);
    }
  }
  be.synchronize();
  double t2 = now_s();
  r.prefill_s = t1 - t0;
  r.decode_s = t2 - t1;
  r.decode_tokens = B * (n_new - 1);
  return r;
}

void nano(const std::string& root, CpuBackend& cpu, CudaBackend& gpu, int n_new) {
  const std::string dir = root + "/models/nano-v4";
  std::ifstream f(dir + "/greedy_reference.json");
  if (!f) throw Error("missing " + dir + "/greedy_reference.json");
  nlohmann::json ref = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts, want;
  for (const auto& r : ref) {
    prompts.push_back(r["prompt_ids"].get<std::vector<int32_t>>());
    auto ids = r["ids"].get<std::vector<int32_t>>();
    want.push_back(std::vector<int32_t>(ids.begin() + prompts.back().size(), ids.end()));
  }
  const int64_t free_before = gpu.free_memory();
  LoadedModel mg = load_model(dir, gpu);
  const int64_t weights_bytes = free_before - gpu.free_memory();
  LoadedModel mc = load_model(dir, cpu);
  g_summary["nano"]["prompts"] = prompts.size();
  g_summary["nano"]["new_tokens"] = n_new;
  g_summary["nano"]["gpu_weight_bytes"] = weights_bytes;

  GreedyRun g = greedy(*mg.v4, gpu, prompts, n_new);
  GreedyRun c = greedy(*mc.v4, cpu, prompts, n_new);
  int64_t total_match = 0, total = 0, full_match = 0, ref_match = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    size_t same = 0;
    while (same < g.out[i].size() && g.out[i][same] == c.out[i][same]) ++same;
    size_t rs = 0;
    while (rs < want[i].size() && rs < g.out[i].size() && g.out[i][rs] == want[i][rs]) ++rs;
    std::printf("nano prompt %2zu (%3zu prompt tokens): gpu = cpu for %zu/%zu tokens; gpu = pytorch reference for "
                "%zu/%zu\n",
                i, prompts[i].size(), same, g.out[i].size(), rs, want[i].size());
    expect(same == g.out[i].size(), "nano prompt " + std::to_string(i) + ": GPU and CPU greedy tokens differ at " +
                                        std::to_string(same));
    expect(rs == want[i].size(), "nano prompt " + std::to_string(i) + ": GPU differs from the PyTorch reference");
    total_match += (int64_t)same;
    total += (int64_t)g.out[i].size();
    full_match += same == g.out[i].size();
    ref_match += rs == want[i].size();
  }
  g_summary["nano"]["gpu_cpu_tokens_equal"] = total_match;
  g_summary["nano"]["tokens"] = total;
  g_summary["nano"]["prompts_fully_equal"] = full_match;
  g_summary["nano"]["prompts_equal_to_pytorch_ref"] = ref_match;
  auto rate = [](const GreedyRun& r) { return (double)r.decode_tokens / r.decode_s; };
  std::printf("batched greedy, B=%zu: gpu prefill %.1f ms, decode %.1f tok/s (%.2f ms/step); cpu prefill %.1f ms, "
              "decode %.1f tok/s (%.2f ms/step)\n",
              prompts.size(), 1e3 * g.prefill_s, rate(g), 1e3 * g.decode_s / (n_new - 1), 1e3 * c.prefill_s, rate(c),
              1e3 * c.decode_s / (n_new - 1));
  g_summary["nano"]["batched"] = {{"B", prompts.size()},
                                  {"gpu_decode_tok_s", rate(g)},
                                  {"gpu_ms_per_step", 1e3 * g.decode_s / (n_new - 1)},
                                  {"gpu_prefill_ms", 1e3 * g.prefill_s},
                                  {"cpu_decode_tok_s", rate(c)},
                                  {"cpu_ms_per_step", 1e3 * c.decode_s / (n_new - 1)},
                                  {"cpu_prefill_ms", 1e3 * c.prefill_s}};
  // One sequence alone: the decode latency.
  std::vector<std::vector<int32_t>> one{prompts[0]};
  GreedyRun g1 = greedy(*mg.v4, gpu, one, n_new);
  GreedyRun c1 = greedy(*mc.v4, cpu, one, n_new);
  expect(g1.out[0] == g.out[0], "nano: prompt 0 alone differs from prompt 0 in the batch (GPU)");
  std::printf("single sequence: gpu decode %.1f tok/s (%.2f ms/token); cpu decode %.1f tok/s (%.2f ms/token)\n",
              rate(g1), 1e3 * g1.decode_s / (n_new - 1), rate(c1), 1e3 * c1.decode_s / (n_new - 1));
  g_summary["nano"]["single"] = {{"gpu_decode_tok_s", rate(g1)},
                                 {"gpu_ms_per_token", 1e3 * g1.decode_s / (n_new - 1)},
                                 {"cpu_decode_tok_s", rate(c1)},
                                 {"cpu_ms_per_token", 1e3 * c1.decode_s / (n_new - 1)}};
}

void engine_section(const std::string& root, CudaBackend& gpu, int n_new, int threads) {
  const std::string dir = root + "/models/nano-v4";
  std::ifstream f(dir + "/greedy_reference.json");
  nlohmann::json ref = nlohmann::json::parse(f);
  std::vector<Request> reqs;
  for (const auto& r : ref) {
    Request q;
    q.prompt_ids = r["prompt_ids"].get<std::vector<int32_t>>();
    q.params.temperature = 0;
    q.params.max_tokens = n_new;
    q.params.ignore_eos = true;
    reqs.push_back(q);
  }
  struct Out {
    std::vector<std::vector<int32_t>> tokens;
    double batch_s = 0, single_s = 0;
    EngineStats stats;
  };
  auto run = [&](const std::string& backend) {
    EngineConfig cfg;
    cfg.model_dir = dir;
    cfg.backend = backend;
    cfg.dtype = "float32";  // token identity with the cpu needs the float32 weights
    cfg.threads = threads;
    Out o;
    const int64_t free0 = gpu.free_memory();
    Engine e(cfg);
    o.stats = e.stats();
    if (backend == "cuda") {
      const int64_t free1 = gpu.free_memory();
      const int64_t cache = (o.stats.cache_pages_total * o.stats.cache_page_bytes +
                             o.stats.cache_slots_total * o.stats.cache_slot_bytes);
      std::printf("engine cuda: device memory free before %.1f GiB, after load %.1f GiB; cache %.1f GiB = %lld pages "
                  "of %lld B + %lld slots (%.0f%% of the free memory before load)\n",
                  free0 / 1073741824.0, free1 / 1073741824.0, cache / 1073741824.0,
                  (long long)o.stats.cache_pages_total, (long long)o.stats.cache_page_bytes,
                  (long long)o.stats.cache_slots_total, 100.0 * cache / (double)free0);
      g_summary["engine"]["free_before_load"] = free0;
      g_summary["engine"]["free_after_load"] = free1;
      g_summary["engine"]["cache_bytes"] = cache;
      g_summary["engine"]["cache_pages"] = o.stats.cache_pages_total;
    }
    double t0 = now_s();
    auto res = e.generate(reqs);
    double t1 = now_s();
    for (auto& r : res) o.tokens.push_back(r.outputs[0].token_ids);
    std::vector<Request> one{reqs[0]};
    double t2 = now_s();
    auto r1 = e.generate(one);
    o.single_s = now_s() - t2;
    o.batch_s = t1 - t0;
    expect(r1[0].outputs[0].token_ids == o.tokens[0], "engine " + backend + ": prompt 0 alone differs from batched");
    return o;
  };
  Out c = run("cpu");
  Out g = run("cuda");
  int64_t equal = 0, total = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    size_t same = 0;
    while (same < g.tokens[i].size() && same < c.tokens[i].size() && g.tokens[i][same] == c.tokens[i][same]) ++same;
    equal += (int64_t)same;
    total += (int64_t)c.tokens[i].size();
    expect(g.tokens[i] == c.tokens[i] && (int)c.tokens[i].size() == n_new,
           "engine prompt " + std::to_string(i) + ": cuda and cpu differ at token " + std::to_string(same));
  }
  const double toks = (double)reqs.size() * n_new;
  std::printf("engine: cuda = cpu for %lld/%lld greedy tokens; batch of %zu: cuda %.1f tok/s, cpu %.1f tok/s; "
              "one request: cuda %.1f tok/s, cpu %.1f tok/s\n",
              (long long)equal, (long long)total, reqs.size(), toks / g.batch_s, toks / c.batch_s, n_new / g.single_s,
              n_new / c.single_s);
  g_summary["engine"]["tokens_equal"] = equal;
  g_summary["engine"]["tokens"] = total;
  g_summary["engine"]["cuda_batch_tok_s"] = toks / g.batch_s;
  g_summary["engine"]["cpu_batch_tok_s"] = toks / c.batch_s;
  g_summary["engine"]["cuda_single_tok_s"] = n_new / g.single_s;
  g_summary["engine"]["cpu_single_tok_s"] = n_new / c.single_s;

  // A full load on the device: 32 sequences at once, 96 requests; every one must finish by length.
  {
    EngineConfig cfg;
    cfg.model_dir = dir;
    cfg.backend = "cuda";
    cfg.dtype = "float32";
    cfg.max_num_seqs = 32;
    Engine e(cfg);
    std::vector<Request> many;
    for (int i = 0; i < 96; ++i) many.push_back(reqs[i % reqs.size()]);
    double t0 = now_s();
    auto res = e.generate(many);
    double dt = now_s() - t0;
    int64_t ok = 0, toks = 0;
    for (size_t i = 0; i < res.size(); ++i) {
      toks += (int64_t)res[i].outputs[0].token_ids.size();
      ok += res[i].outputs[0].finish == Finish::kLength &&
            res[i].outputs[0].token_ids == g.tokens[i % reqs.size()];
    }
    EngineStats st = e.stats();
    std::printf("engine cuda full load: %zu requests, 32 at once: %lld/%zu finished by length with the tokens of "
                "the single runs; %.1f tok/s; %lld steps, %lld preemptions\n",
                many.size(), (long long)ok, many.size(), toks / dt, (long long)st.steps, (long long)st.preemptions);
    expect(ok == (int64_t)many.size(), "engine cuda full load");
    g_summary["engine"]["full_load"] = {{"requests", many.size()}, {"ok", ok}, {"tok_s", toks / dt},
                                        {"steps", st.steps}, {"preemptions", st.preemptions}};
  }

  // Sampling on the device (Backend::sample_rows, from the decode graphs) against the host sampler on the same
  // device's logits: seeded temperature / top-k / top-p / min-p requests and n > 1 give the same tokens with
  // EngineConfig::device_sampling on and off, and with it on the tokens were picked on the device, and decode
  // steps took their tokens from the previous step's picks there (launched before the host read that step).
  {
    std::vector<Request> sampled;
    for (size_t i = 0; i < 24; ++i) {
      Request q = reqs[i % reqs.size()];
      q.params.temperature = 0.5f + 0.1f * (float)(i % 8);
      q.params.seed = 1000 + i;
      if (i % 4 == 1) q.params.top_k = 3 + (int)i;
      if (i % 3 == 2) q.params.top_p = 0.7f + 0.02f * (float)(i % 12);  // 0.74 … 0.92
      if (i % 5 == 3) q.params.min_p = 0.05f;
      if (i == 7) q.params.n = 3;
      sampled.push_back(q);
    }
    // The requests with device sampling off (index 0) and on (1): every output's tokens, the tokens picked on the
    // device, the fed steps, the tokens generated.
    struct OnOff {
      std::vector<std::vector<int32_t>> toks[2];
      int64_t picked[2] = {0, 0}, fed[2] = {0, 0}, total[2] = {0, 0};
      int64_t same() const {
        int64_t n = 0;
        for (size_t i = 0; i < toks[0].size() && i < toks[1].size(); ++i) n += toks[0][i] == toks[1][i];
        return n;
      }
    };
    auto run_on_off = [&](const std::vector<Request>& set) {
      OnOff r;
      for (int on = 0; on < 2; ++on) {
        EngineConfig cfg;
        cfg.model_dir = dir;
        cfg.backend = "cuda";
        cfg.max_num_seqs = 8;
        cfg.device_sampling = on == 1;
        Engine e(cfg);
        for (auto& g : e.generate(set))
          for (auto& o : g.outputs) r.toks[on].push_back(o.token_ids), r.total[on] += (int64_t)o.token_ids.size();
        r.picked[on] = e.stats().device_sampled_tokens;
        r.fed[on] = e.stats().fed_steps;
      }
      return r;
    };
    const OnOff s = run_on_off(sampled);
    const auto& toks = s.toks;
    const auto& picked = s.picked;
    const auto& fed = s.fed;
    const int64_t same = s.same();
    std::printf("engine cuda sampling: %lld/%zu sampled outputs the same with the picks on the device (%lld tokens "
                "picked there, %lld steps fed from the step before) and on the host\n",
                (long long)same, toks[0].size(), (long long)picked[1], (long long)fed[1]);
    expect(same == (int64_t)toks[0].size() && !toks[0].empty(), "engine cuda: device sampling != host sampling");
    expect(picked[0] == 0 && picked[1] > 0, "engine cuda: device-sampled token counts");
    expect(fed[0] == 0 && fed[1] > 0, "engine cuda: fed decode steps");
    g_summary["engine"]["device_sampling"] = {{"outputs", toks[0].size()}, {"same", same}, {"picked", picked[1]},
                                              {"fed_steps", fed[1]}};
    // Logit processors applied on the device as edits (bias, penalties, a min_tokens mask): the same tokens as
    // the host sampler's processors, every token picked on the device.
    std::vector<Request> proc = sampled;
    for (size_t i = 0; i < proc.size(); ++i) {
      SamplingParams& p = proc[i].params;
      if (i % 4 == 0) p.repetition_penalty = 1.25f;
      if (i % 4 == 1) p.frequency_penalty = 0.6f, p.presence_penalty = 0.3f;
      if (i % 4 == 2) p.logit_bias = {{(int32_t)(i * 37 % 1000), 4.0f}, {(int32_t)(i * 91 % 1000), -100.0f}};
      if (i % 4 == 3) p.min_tokens = 5, p.stop_token_ids = {(int32_t)(i * 13 % 1000)};
    }
    const OnOff ps = run_on_off(proc);
    const auto& ptoks = ps.toks;
    const int64_t ppicked = ps.picked[1], ptotal = ps.total[1], psame = ps.same();
    std::printf("engine cuda logit processors: %lld/%zu outputs the same with the edits on the device (%lld of %lld "
                "tokens picked there, %lld steps fed: their pending tokens edited there) and on the host\n",
                (long long)psame, ptoks[0].size(), (long long)ppicked, (long long)ptotal, (long long)ps.fed[1]);
    expect(ps.fed[1] > 0, "engine cuda: no fed steps with logit processors");
    expect(psame == (int64_t)ptoks[0].size() && !ptoks[0].empty(), "engine cuda: device logit edits != host processors");
    expect(ppicked == ptotal, "engine cuda: tokens with logit processors not all picked on the device");
    g_summary["engine"]["device_logit_edits"] = {{"outputs", ptoks[0].size()}, {"same", psame}, {"picked", ppicked}};

    // Logprobs on the device (Backend::logprob_rows, opt-in until this check passes: DEEPINFER_CUDA_ON=devlogprobs),
    // with and without logit processors: the same tokens and the same logprobs, bit for bit, as the host computes
    // from the rows' logits; every token picked on the device and steps fed.
    std::vector<Request> lpq = proc;
    for (size_t i = 0; i < lpq.size(); ++i) lpq[i].params.logprobs = i % 3 == 0 ? 20 : i % 3 == 1 ? 0 : 4;
    std::vector<std::vector<TokenLogprobs>> lps[2];
    std::vector<std::vector<int32_t>> ltoks[2];
    int64_t lpicked = 0, lfed = 0, ltotal = 0;
    for (int on = 0; on < 2; ++on) {
      EngineConfig cfg;
      cfg.model_dir = dir;
      cfg.backend = "cuda";
      cfg.max_num_seqs = 8;
      cfg.device_sampling = on == 1;
      const EnvAppend env("DEEPINFER_CUDA_ON", "devlogprobs");
      Engine e(cfg);
      for (auto& g : e.generate(lpq))
        for (auto& o : g.outputs) lps[on].push_back(o.logprobs), ltoks[on].push_back(o.token_ids);
      if (on) lpicked = e.stats().device_sampled_tokens, lfed = e.stats().fed_steps;
    }
    int64_t lsame = 0, lentries = 0;
    for (size_t i = 0; i < lps[0].size() && i < lps[1].size(); ++i) {
      bool same = ltoks[0][i] == ltoks[1][i] && lps[0][i].size() == lps[1][i].size() &&
                  lps[0][i].size() == ltoks[0][i].size();
      for (size_t t = 0; same && t < lps[0][i].size(); ++t) {
        const TokenLogprobs &a = lps[0][i][t], &b = lps[1][i][t];
        same = std::memcmp(&a.logprob, &b.logprob, 4) == 0 && a.top == b.top;
        lentries += (int64_t)b.top.size();
      }
      lsame += same;
      ltotal += (int64_t)ltoks[1][i].size();
    }
    std::printf("engine cuda logprobs: %lld/%zu outputs with the same tokens and logprobs (bitwise; %lld top entries) "
                "from the device (%lld of %lld tokens picked there, %lld steps fed) and from the host\n",
                (long long)lsame, lps[0].size(), (long long)lentries, (long long)lpicked, (long long)ltotal,
                (long long)lfed);
    expect(lsame == (int64_t)lps[0].size() && !lps[0].empty(), "engine cuda: device logprobs != host logprobs");
    expect(lpicked == ltotal && lfed > 0, "engine cuda: logprob rows not all picked on the device, or no fed steps");
    g_summary["engine"]["device_logprobs"] = {{"outputs", lps[0].size()}, {"same", lsame}, {"picked", lpicked},
                                              {"fed_steps", lfed}};

    // Grammar masks on the device (Backend::mask_rows, opt-in until this check passes: DEEPINFER_CUDA_ON=devmasks):
    // structured requests (JSON schema, JSON object, regex, a grammar; with logprobs and processors) give the same
    // tokens and logprobs with the masks on the device as on the host, every structured token picked there.
    std::vector<Request> sq;
    const char* kinds[4][2] = {
        {"j", R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},"n":{"type":"integer"}},"required":["name","n"]})"},
        {"o", ""},
        {"r", "(Amen|Selah)\\. [0-9]{1,3} [a-z ]{0,20}!"},
        {"g", "root ::= \"light\" (\" and \" word)* \".\"\nword ::= [a-z]+\n"}};
    for (size_t i = 0; i < 16; ++i) {
      Request q = sampled[i % sampled.size()];
      q.params.n = 1;
      q.params.max_tokens = 48;
      const int k = (int)(i % 4);
      q.params.structured = {k == 0 ? StructuredKind::kJsonSchema : k == 1 ? StructuredKind::kJsonObject
                             : k == 2 ? StructuredKind::kRegex : StructuredKind::kGrammar, kinds[k][1]};
      if (i % 3 == 0) q.params.logprobs = 5;
      if (i % 5 == 1) q.params.repetition_penalty = 1.2f;
      sq.push_back(q);
    }
    std::vector<Completion> sout[2];
    int64_t spicked = 0, stotal = 0;
    for (int on = 0; on < 2; ++on) {
      EngineConfig cfg;
      cfg.model_dir = dir;
      cfg.backend = "cuda";
      cfg.max_num_seqs = 8;
      cfg.device_sampling = on == 1;
      const EnvAppend env("DEEPINFER_CUDA_ON", "devlogprobs,devmasks");
      Engine e(cfg);
      for (auto& g : e.generate(sq))
        for (auto& o : g.outputs) sout[on].push_back(o), stotal += on ? (int64_t)o.token_ids.size() : 0;
      if (on) spicked = e.stats().device_sampled_tokens;
    }
    int64_t ssame = 0, serr = 0;
    for (size_t i = 0; i < sout[0].size() && i < sout[1].size(); ++i) {
      const Completion &a = sout[0][i], &b = sout[1][i];
      bool same = a.token_ids == b.token_ids && a.text == b.text && a.finish == b.finish &&
                  a.logprobs.size() == b.logprobs.size();
      for (size_t t = 0; same && t < a.logprobs.size(); ++t)
        same = std::memcmp(&a.logprobs[t].logprob, &b.logprobs[t].logprob, 4) == 0 && a.logprobs[t].top == b.logprobs[t].top;
      ssame += same;
      serr += a.finish == Finish::kError || b.finish == Finish::kError;
    }
    std::printf("engine cuda grammar masks: %lld/%zu structured outputs the same (tokens, text, logprobs) with the "
                "masks on the device (%lld of %lld tokens picked there) and on the host; %lld errors\n",
                (long long)ssame, sout[0].size(), (long long)spicked, (long long)stotal, (long long)serr);
    expect(ssame == (int64_t)sout[0].size() && !sout[0].empty() && serr == 0,
           "engine cuda: device grammar masks != host grammar masks");
    expect(spicked == stotal, "engine cuda: structured tokens not all picked on the device");
    g_summary["engine"]["device_masks"] = {{"outputs", sout[0].size()}, {"same", ssame}, {"picked", spicked}};
  }
}


// ---- 4. the fast path: weights as stored ----
// e4m3fn → float (bias 7; exponent 0 subnormal; 0x7F / 0xFF NaN are never generated here).
float e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float v = e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
  return s ? -v : v;
}
float e2m1_value(uint8_t n) {
  static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (n & 8) ? -mag[n & 7] : mag[n & 7];
}
float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

void stored_section(const std::string& root, CpuBackend& cpu, int n_new) {
  CudaBackend fast(0, CudaWeights::Stored);
  std::mt19937 g(1234);
  // (a) linear(): each stored format and batch size against the CPU on the dequantized weight and a
  // bf16-rounded x. The bf16-activation paths differ from it only in summation order; the large-M fp8
  // path also rounds x to e4m3 (3 mantissa bits), hence its looser bound.
  struct Case {
    WeightFormat fmt;
    int64_t N, K;
  };
  for (Case c : {Case{WeightFormat::BF16, 264, 320}, Case{WeightFormat::FP8, 392, 512}, Case{WeightFormat::FP8, 200, 192},
                 Case{WeightFormat::FP4, 136, 256}}) {
    const int64_t N = c.N, K = c.K;
    std::vector<uint8_t> data, scale_b;
    std::vector<float> scale_f, wf(N * K);
    std::uniform_int_distribution<int> byte(0, 255);
    if (c.fmt == WeightFormat::BF16) {
      auto v = randv(g, N * K);
      data.resize(2 * N * K);
      for (int64_t i = 0; i < N * K; ++i) {
        wf[i] = bf16_round(v[i]);
        uint32_t u;
        std::memcpy(&u, &wf[i], 4);
        const uint16_t h = (uint16_t)(u >> 16);
        std::memcpy(&data[2 * i], &h, 2);
      }
    } else if (c.fmt == WeightFormat::FP8) {
      const int64_t gr = (N + 127) / 128, gc = (K + 127) / 128;
      data.resize(N * K);
      for (auto& b : data) do b = (uint8_t)byte(g); while ((b & 0x7F) == 0x7F);
      for (int64_t i = 0; i < gr * gc; ++i) scale_f.push_back(std::ldexp(1.0f, -6 - (int)(i % 3)));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) wf[n * K + k] = e4m3_value(data[n * K + k]) * scale_f[(n / 128) * gc + k / 128];
    } else {
      data.resize(N * K / 2);
      for (auto& b : data) b = (uint8_t)byte(g);
      for (int64_t i = 0; i < N * K / 32; ++i) scale_b.push_back((uint8_t)(120 + i % 5));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t b = data[(n * K + k) / 2];
          wf[n * K + k] = e2m1_value(k % 2 ? b >> 4 : b & 15) * std::ldexp(1.0f, scale_b[n * K / 32 + k / 32] - 127);
        }
    }
    const char* on_env = std::getenv("DEEPINFER_CUDA_ON");
    const bool e4m3_decode = on_env && ("," + std::string(on_env) + ",").find(",gemv_e4m3,") != std::string::npos;
    StoredWeight sw{c.fmt, N, K, data.data(), c.fmt == WeightFormat::FP8 ? (const void*)scale_f.data()
                                                : c.fmt == WeightFormat::FP4 ? (const void*)scale_b.data()
                                                                             : nullptr,
                    128, 128};
    expect(fast.takes_stored(sw), "stored: the cuda backend should take this format");
    WeightPtr wg = fast.make_weight(sw);
    WeightPtr wc = cpu.make_weight(wf.data(), N, K);
    for (int64_t M : {1, 3, 4, 8, 64}) {
      const int64_t ldx = K + 8;
      auto x = randv(g, M * ldx);
      std::vector<float> xr(x);
      for (auto& v : xr) v = bf16_round(v);
      std::vector<float> yc(M * N);
      cpu.linear(xr.data(), M, ldx, *wc, yc.data(), N);
      Buffer<float> xd(fast, x), yd(fast, M * N);
      fast.linear(xd.data(), M, ldx, *wg, yd.data(), N);
      auto y = yd.to_host();
      double num = 0, den = 0;
      for (int64_t i = 0; i < M * N; ++i) num += (y[i] - yc[i]) * (double)(y[i] - yc[i]), den += yc[i] * (double)yc[i];
      const double nmse = num / std::max(den, 1e-30);
      // e4m3 activations: the fp8 GEMMs above M = 4, and every M with DEEPINFER_CUDA_ON=gemv_e4m3 (the decode GEMV)
      const bool fp8_act = c.fmt == WeightFormat::FP8 && (M > 4 || e4m3_decode) && K % 128 == 0;
      const double tol = fp8_act ? 5e-3 : 1e-9;
      const char* fname = c.fmt == WeightFormat::BF16 ? "bf16" : c.fmt == WeightFormat::FP8 ? "fp8" : "fp4";
      std::printf("stored linear %-4s N=%-4lld K=%-4lld M=%-3lld: nmse %.2e (tol %.0e)\n", fname, (long long)N,
                  (long long)K, (long long)M, nmse, tol);
      expect(nmse <= tol, std::string("stored linear ") + fname + " M=" + std::to_string(M));
    }
  }
  // (b) the fixtures with weights as stored: BF16-compute bounds against the reference.
  std::vector<std::string> dirs;
  for (auto& e : fs::directory_iterator(root + "/tests/fixtures/v4"))
    if (fs::exists(e.path() / "ref.safetensors")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& dir : dirs) {
    const std::string name = fs::path(dir).filename();
    LoadedModel m = load_model(dir + "/model", fast);
    const int64_t V = m.v4->config().vocab_size;
    double worst_median = 0, worst_agree = 1;
    for (const auto& r : read_refs(dir)) {
      const int64_t T = (int64_t)r.ids.size();
      for (int64_t step : {T, (int64_t)1}) {
        auto out = run_schedule(*m.v4, fast, r.ids, step == 1 ? 13 : T, step);
        ErrStats e = compare(out, r.logits, V);
        worst_median = std::max(worst_median, e.median);
        worst_agree = std::min(worst_agree, e.argmax_agree);
      }
    }
    std::printf("stored fixture %-16s: worst median rel %.2e, worst argmax agreement %.3f\n", name.c_str(),
                worst_median, worst_agree);
    expect(worst_median < 0.05 && worst_agree >= 0.85, "stored fixture " + name + ": outside the BF16 bounds");
    g_summary["stored"]["fixtures"][name] = {{"worst_median_rel", worst_median}, {"worst_argmax_agree", worst_agree}};
  }
  // (c) nano: greedy tokens with weights as stored (bf16) against the CPU, and the decode speed.
  const std::string dir = root + "/models/nano-v4";
  nlohmann::json ref = nlohmann::json::parse(std::ifstream(dir + "/greedy_reference.json"));
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : ref) prompts.push_back(r["prompt_ids"].get<std::vector<int32_t>>());
  LoadedModel mg = load_model(dir, fast);
  LoadedModel mc = load_model(dir, cpu);
  GreedyRun gr = greedy(*mg.v4, fast, prompts, n_new);
  GreedyRun cr = greedy(*mc.v4, cpu, prompts, std::min(n_new, 64));
  int64_t same_total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    size_t same = 0;
    while (same < cr.out[i].size() && gr.out[i][same] == cr.out[i][same]) ++same;
    same_total += (int64_t)same;
  }
  std::vector<std::vector<int32_t>> one{prompts[0]};
  GreedyRun g1 = greedy(*mg.v4, fast, one, n_new);
  std::printf("stored nano: greedy tokens equal to the cpu's before the first difference: %lld of %zu×%zu; batch of "
              "%zu %.2f ms/step, one sequence %.2f ms/token\n",
              (long long)same_total, prompts.size(), cr.out[0].size(), prompts.size(),
              1e3 * gr.decode_s / (n_new - 1), 1e3 * g1.decode_s / (n_new - 1));
  g_summary["stored"]["nano"] = {{"tokens_equal_prefix", same_total},
                                 {"batch_ms_per_step", 1e3 * gr.decode_s / (n_new - 1)},
                                 {"single_ms_per_token", 1e3 * g1.decode_s / (n_new - 1)}};

  // (d) the profiler (deepinfer bench --profile): a profiled greedy run on one sequence accounts every
  // step's device work to named ops, and its results equal the unprofiled run's (profiling only adds
  // events).
  fast.set_profiling(true);
  GreedyRun gp = greedy(*mg.v4, fast, one, 16);
  fast.set_profiling(false);
  const Backend::Profile prof = fast.take_profile();
  bool has_linear = false, has_attention = false;
  for (const auto& o : prof.ops) has_linear |= o.op == "linear", has_attention |= o.op == "sink_attention";
  expect(prof.calls > 0 && prof.busy_ms > 0 && prof.gap_ms >= 0 && has_linear && has_attention,
         "profile of a stored nano run: calls, device time, linear and sink_attention recorded");
  const size_t np = std::min(gp.out[0].size(), g1.out[0].size());
  expect(std::equal(gp.out[0].begin(), gp.out[0].begin() + np, g1.out[0].begin()),
         "profiled greedy tokens equal the unprofiled run's");
  std::printf("stored nano profile (16 tokens): %lld calls (%lld graph steps), device busy %.3f ms, gaps %.3f ms, "
              "top op %s %.3f ms\n",
              (long long)prof.calls, (long long)prof.graph_steps, prof.busy_ms, prof.gap_ms, prof.ops.empty() ? "-" : prof.ops[0].op.c_str(),
              prof.ops.empty() ? 0.0 : prof.ops[0].ms);
  expect(fast.take_profile().calls == 0, "take_profile resets the totals");

  // (e) CUDA graphs (Backend::graph_begin): the decode steps above ran from captured graphs (the profile
  // times them as "graph"); the same runs op by op (DEEPINFER_CUDA_OFF=graphs) give bitwise the same
  // tokens, and a fixture's decode schedule bitwise the same logits — over batch sizes 10 and 1 and entry
  // capacities crossed as the sequences grow (nano: 256 new tokens, CSA every 4, HCA every 16).
  expect(prof.graph_steps > 0, "stored decode steps run from CUDA graphs (profiled inside the graph, op by op)");
  CudaBackend plain(device_with(EnvAppend("DEEPINFER_CUDA_OFF", "graphs")), CudaWeights::Stored);
  {
    LoadedModel mp = load_model(dir, plain);
    GreedyRun pr = greedy(*mp.v4, plain, prompts, n_new);
    GreedyRun p1 = greedy(*mp.v4, plain, one, n_new);
    expect(pr.out == gr.out && p1.out == g1.out, "graphs: greedy tokens equal the op-by-op run's (batch and single)");
    // (f) pipelined decode (step N+1 recorded before step N's logits are read; ids patched in at launch)
    int np_b = 0, np_1 = 0;
    GreedyRun qb = greedy(*mg.v4, fast, prompts, n_new, &np_b);
    GreedyRun q1 = greedy(*mg.v4, fast, one, n_new, &np_1);
    expect(np_b > n_new / 2 && np_1 > n_new / 2, "pipelined: most decode steps were prepared ahead (" +
                                                     std::to_string(np_b) + ", " + std::to_string(np_1) + " of " +
                                                     std::to_string(n_new - 1) + ")");
    expect(qb.out == gr.out && q1.out == g1.out, "pipelined: greedy tokens equal the step-by-step run's (batch and single)");
    int np_plain = 0;
    GreedyRun qp = greedy(*mp.v4, plain, one, 8, &np_plain);
    expect(np_plain == 0 && std::equal(qp.out[0].begin(), qp.out[0].end(), g1.out[0].begin()),
           "pipelined without graphs: nothing prepared ahead, the same tokens");
    std::printf("graphs nano: batch of %zu %.3f ms/step with graphs, %.3f op by op; one sequence %.3f vs %.3f "
                "ms/token\n",
                prompts.size(), 1e3 * gr.decode_s / (n_new - 1), 1e3 * pr.decode_s / (n_new - 1),
                1e3 * g1.decode_s / (n_new - 1), 1e3 * p1.decode_s / (n_new - 1));
    g_summary["stored"]["graphs"] = {{"batch_ms_per_step", 1e3 * gr.decode_s / (n_new - 1)},
                                     {"batch_ms_per_step_no_graphs", 1e3 * pr.decode_s / (n_new - 1)},
                                     {"single_ms_per_token", 1e3 * g1.decode_s / (n_new - 1)},
                                     {"single_ms_per_token_no_graphs", 1e3 * p1.decode_s / (n_new - 1)}};
  }
  for (const auto& fdir : dirs) {
    LoadedModel a = load_model(fdir + "/model", fast), b = load_model(fdir + "/model", plain);
    for (const auto& r : read_refs(fdir)) {
      auto with = run_schedule(*a.v4, fast, r.ids, 5, 1), without = run_schedule(*b.v4, plain, r.ids, 5, 1);
      expect(with == without, "graphs: " + fs::path(fdir).filename().string() +
                                  " decode logits bitwise equal to the op-by-op run's");
    }
  }

  // (g) fuseattn: the attention block's q/kv/indexer-q norm + rope (and kv's window / ring copies) in one
  // norm_rope launch give bitwise the logits of the unfused kernels (DEEPINFER_CUDA_OFF=fuseattn), graphs
  // on in both: nano's greedy tokens, the fixtures' prefill + decode logits.
  CudaBackend unfused(device_with(EnvAppend("DEEPINFER_CUDA_OFF", "fuseattn")), CudaWeights::Stored);
  {
    LoadedModel mu = load_model(dir, unfused);
    GreedyRun ur = greedy(*mu.v4, unfused, prompts, n_new);
    expect(ur.out == gr.out, "fuseattn: greedy tokens equal the unfused kernels' (batch)");
  }
  for (const auto& fdir : dirs) {
    LoadedModel a = load_model(fdir + "/model", fast), b = load_model(fdir + "/model", unfused);
    for (const auto& r : read_refs(fdir)) {
      auto with = run_schedule(*a.v4, fast, r.ids, 5, 1), without = run_schedule(*b.v4, unfused, r.ids, 5, 1);
      expect(with == without, "fuseattn: " + fs::path(fdir).filename().string() +
                                  " prefill + decode logits bitwise equal to the unfused kernels'");
    }
  }

  // (h) branches (Backend::fork, opt-in DEEPINFER_CUDA_ON=branches): the router captured on a side stream beside the
  // shared expert, joined by a full edge before the routed experts (which read the routing before their PDL wait)
  // — the same kernels in another graph shape: bitwise the tokens and logits of the one-chain graphs.
  CudaBackend branched(device_with(EnvAppend("DEEPINFER_CUDA_ON", "branches")), CudaWeights::Stored);
  {
    LoadedModel mb = load_model(dir, branched);
    GreedyRun br = greedy(*mb.v4, branched, prompts, n_new);
    GreedyRun b1 = greedy(*mb.v4, branched, one, n_new);
    int np = 0;
    GreedyRun bq = greedy(*mb.v4, branched, prompts, n_new, &np);
    expect(br.out == gr.out && b1.out == g1.out && bq.out == gr.out,
           "branches: greedy tokens equal the one-chain graphs' (batch, single, pipelined)");
    // (the one-chain backend ran more kinds of steps: its count bounds what a correct branched run may have)
    expect(branched.graph_fallbacks() <= fast.graph_fallbacks(),
           "branches: steps fell back to op by op (" + std::to_string(branched.graph_fallbacks()) + " against " +
               std::to_string(fast.graph_fallbacks()) + " with one chain)");
    std::printf("branches nano: batch of %zu %.3f ms/step (one chain %.3f); one sequence %.3f ms/token (%.3f)\n",
                prompts.size(), 1e3 * br.decode_s / (n_new - 1), 1e3 * gr.decode_s / (n_new - 1),
                1e3 * b1.decode_s / (n_new - 1), 1e3 * g1.decode_s / (n_new - 1));
  }
  for (const auto& fdir : dirs) {
    LoadedModel a = load_model(fdir + "/model", fast), b = load_model(fdir + "/model", branched);
    for (const auto& r : read_refs(fdir)) {
      auto one_chain = run_schedule(*a.v4, fast, r.ids, 5, 1), two = run_schedule(*b.v4, branched, r.ids, 5, 1);
      expect(one_chain == two, "branches: " + fs::path(fdir).filename().string() +
                                   " decode logits bitwise equal to the one-chain graphs'");
    }
  }
  expect(branched.graph_fallbacks() <= fast.graph_fallbacks(), "branches: the fixtures' steps ran from their graphs");
}

// ---- DeepSeek-V4.1 ----

// 4a. V4.1's ops (hc_mix, kv_qdq, engram_gate) and the V4 ops in the forms only V4.1 uses
// (compress_windows without ape, indexer_scores without key_rows), CUDA against CPU, odd shapes.
void v41_op_checks(CpuBackend& cpu, CudaBackend& gpu) {
  std::mt19937 g(4141);
  std::vector<OpCase> cases;
  struct HcShape {
    int hc;
    int64_t D, M;
  };
  for (HcShape sh : {HcShape{4, 64, 5}, HcShape{3, 50, 7}, HcShape{2, 48, 1}, HcShape{1, 33, 3}, HcShape{4, 600, 9},
                     HcShape{8, 20, 2}}) {
    const int hc = sh.hc;
    const int64_t D = sh.D, M = sh.M, mix = (2 + hc) * hc;
    auto X = randv(g, M * hc * D), fn = randv(g, mix * hc * D, -0.1f, 0.1f), base = randv(g, mix), sc = randv(g, 3),
         w = randv(g, M * hc, 0.0f, 1.0f);
    const std::string shape = " hc=" + std::to_string(hc) + " D=" + std::to_string(D) + " M=" + std::to_string(M);
    cases.push_back({"hc_mix" + shape, [=](Backend& be) {
                       Buffer<float> Xb(be, X), F(be, fn), B(be, base), S(be, sc), Wt(be, w);
                       Buffer<float> u(be, M * D), pre(be, M * hc), post(be, M * hc), comb(be, M * hc * hc);
                       be.hc_mix(Xb.data(), M, hc, D, Wt.data(), F.data(), B.data(), S.data(), 20, 1e-6f, 1e-20f,
                                 u.data(), pre.data(), post.data(), comb.data());
                       std::vector<float> r;
                       for (auto* b : {&u, &pre, &post, &comb}) {
                         auto h = b->to_host();
                         r.insert(r.end(), h.begin(), h.end());
                       }
                       return r;
                     }, 1e-5});
    // Collapse only (the final rows): a fixed multiply-then-add order on both sides.
    cases.push_back({"hc_mix collapse only" + shape, [=](Backend& be) {
                       Buffer<float> Xb(be, X), Wt(be, w), u(be, M * D);
                       be.hc_mix(Xb.data(), M, hc, D, Wt.data(), nullptr, nullptr, nullptr, 0, 1e-6f, 1e-20f, u.data(),
                                 nullptr, nullptr, nullptr);
                       return u.to_host();
                     }, 1e-6});
  }
  for (KvQdq f : {KvQdq::Fp8Pow2x32, KvQdq::Fp4Pow2x32, KvQdq::Fp4E4m3x16}) {
    const int bs = kv_qdq_block(f);
    const int64_t nb = 53, n = nb * bs;
    // Blocks over many magnitudes (1e-9 .. 1e4), one all-zero block, one with a single non-zero.
    std::vector<float> x = randv(g, n);
    std::uniform_real_distribution<float> mag(-9.0f, 4.0f);
    for (int64_t b = 0; b < nb; ++b) {
      const float s = std::pow(10.0f, mag(g));
      for (int i = 0; i < bs; ++i) x[b * bs + i] *= s;
    }
    std::fill(x.begin() + 3 * bs, x.begin() + 4 * bs, 0.0f);
    std::fill(x.begin() + 5 * bs, x.begin() + 6 * bs, 0.0f);
    x[5 * bs + 7] = -3.5f;
    cases.push_back({"kv_qdq format " + std::to_string((int)f) + " (bitwise)", [=](Backend& be) {
                       Buffer<float> Xb(be, x);
                       be.kv_qdq(Xb.data(), n, f);
                       return Xb.to_host();
                     }, 0.0});
  }
  for (HcShape sh : {HcShape{4, 37, 5}, HcShape{2, 300, 3}, HcShape{3, 64, 1}}) {
    const int hc = sh.hc;
    const int64_t D = sh.D, M = sh.M;
    auto X = randv(g, M * hc * D), kv = randv(g, M * (hc + 1) * D), w = randv(g, hc * D);
    cases.push_back({"engram_gate hc=" + std::to_string(hc) + " D=" + std::to_string(D), [=](Backend& be) {
                       Buffer<float> Xb(be, X), KV(be, kv), Wt(be, w);
                       be.engram_gate(Xb.data(), M, hc, D, KV.data(), Wt.data(), 1e-20);
                       return Xb.to_host();
                     }, 1e-6});
  }
  {  // ratio-2 grouping: compress_windows without ape, straddling a step boundary, then pooling
    const int m = 2, width = 20;
    const int64_t n = 7, p0 = 5, ld = width + 3;  // positions 5..11: groups 2 (4, 5), 3, 4, 5
    auto rkv = randv(g, 2 * width), rg = randv(g, 2 * width), kv = randv(g, n * ld), gate = randv(g, n * ld);
    std::vector<int32_t> wins{2, 3, 4, 5};
    cases.push_back({"compress_windows (no ape) + pool, ratio 2", [=](Backend& be) {
                       Buffer<float> RK(be, rkv), RG(be, rg), KV(be, kv), GT(be, gate);
                       Buffer<int32_t> Wd(be, wins);
                       const int64_t nw = (int64_t)wins.size();
                       Buffer<float> skv(be, nw * 2 * width), sg(be, nw * 2 * width), out(be, nw * width);
                       be.compress_windows(RK.data(), RG.data(), KV.data(), GT.data(), ld, p0, nullptr, m, width,
                                           false, Wd.data(), nullptr, nw, skv.data(), sg.data());
                       be.compress_pool(skv.data(), sg.data(), nw, 2, width, out.data());
                       auto a = out.to_host(), b = sg.to_host();
                       a.insert(a.end(), b.begin(), b.end());
                       return a;
                     }, 1e-6});
  }
  {  // indexer over contiguous keys (key_rows null), 8 heads × 32 as the fixtures
    const int64_t M = 5, hI = 8, dI = 32, nk = 19;
    auto q = randv(g, M * hI * dI), gm = randv(g, M * hI), K = randv(g, nk * dI);
    std::vector<int32_t> nv{1, 19, 7, 0, 12};
    cases.push_back({"indexer_scores (key_rows null)", [=](Backend& be) {
                       Buffer<float> Q(be, q), G(be, gm), Kb(be, K), S(be, M * nk);
                       Buffer<int32_t> N(be, nv);
                       be.indexer_scores(Q.data(), G.data(), M, (int)hI, (int)dI, Kb.data(), nullptr, 0, nk, N.data(),
                                         1.0f / std::sqrt(32.0f), S.data());
                       return S.to_host();
                     }, 1e-5});
  }
  run_op_cases(cases, cpu, gpu, "v41_ops");
}

// 4b. The V4.1 reference fixtures (tests/fixtures/v41, float64 references of the spec) on the GPU:
// the CPU test's schedules and bounds (test_model_v41_reference.cc), bitwise equality across
// schedules and between batched and alone, and the distance to the CPU backend.
// Cheap diagnostics of a failing V4.1 sequence: the first position whose relative error exceeds
// 1e-4 and the error there, the largest error and its position, how many positions exceed 1e-4.
// A discrete decision that flips (a QAT rounding near its midpoint, a top-k / candidate-block
// boundary) shows as a jump at a first position; compare it with the fixture's report.json
// ("fragile": kind, layer, position, relative margin). Also stored in the JSON summary.
void v41_divergence(const std::string& what, const char* against, const std::vector<float>& out,
                    const std::vector<float>& ref, int64_t V) {
  if (out.size() != ref.size() || ref.empty()) return;
  const auto rel = testref::v41_rel_per_position(out, ref, V);
  int64_t first = -1, above = 0, worst = 0;
  for (int64_t t = 0; t < (int64_t)rel.size(); ++t) {
    if (rel[t] > 1e-4) {
      if (first < 0) first = t;
      ++above;
    }
    if (rel[t] > rel[worst]) worst = t;
  }
  if (first >= 0) {
    std::printf("%-44s %s: first position with rel > 1e-4: %lld (rel %.3e, previous position %.3e); max rel %.3e at "
                "%lld; %lld of %zu positions > 1e-4\n",
                what.c_str(), against, (long long)first, rel[first], first > 0 ? rel[first - 1] : 0.0, rel[worst],
                (long long)worst, (long long)above, rel.size());
  } else {
    std::printf("%-44s %s: no position with rel > 1e-4 (max rel %.3e at %lld)\n", what.c_str(), against, rel[worst],
                (long long)worst);
  }
  g_summary["v41_divergence"][what][against] = {{"first_pos_above_1e-4", first},
                                                {"rel_at_first", first >= 0 ? rel[first] : 0.0},
                                                {"max_rel", rel[worst]},
                                                {"max_pos", worst},
                                                {"positions_above_1e-4", above}};
}

void v41_fixtures(const std::string& root, CpuBackend& cpu, CudaBackend& gpu) {
  const auto dirs = testref::fixture_dirs(fs::path(root) / "tests/fixtures/v41", nullptr);
  expect(dirs.size() >= 3, "V4.1: fewer than 3 fixtures under tests/fixtures/v41");
  for (const auto& dir : dirs) {
    const std::string name = fs::path(dir).filename();
    LoadedModel mg = load_model(dir + "/model", gpu);
    LoadedModel mc = load_model(dir + "/model", cpu);
    expect(mg.v41 != nullptr, name + ": not loaded as V4.1 on the GPU");
    if (!mg.v41) continue;
    expect(mg.unused.empty(), name + ": unused tensors");
    const int64_t V = mg.vocab_size();
    auto refs = read_refs(dir);
    expect(!refs.empty(), name + ": no reference sequences");
    nlohmann::json report;
    if (std::ifstream rf(dir + "/report.json"); rf.good()) report = nlohmann::json::parse(rf);
    const bool fallback = std::getenv("DEEPINFER_V41_NO_FLIP_FALLBACK") == nullptr;
    double worst_median = 0, worst_max = 0, worst_agree = 1, worst_vs_cpu = 0;
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto& r = refs[k];
      const int64_t T = (int64_t)r.ids.size();
      struct Mode {
        const char* name;
        int64_t first, step;
      };
      std::vector<float> full, cpu_out;
      // The logits this sequence is checked against: the reference, or, when the GPU's difference
      // is fully explained by QAT roundings that report.json lists as within 1e-5 of their
      // midpoints (tests/unit/v41_flips.h), the CPU with those same roundings flipped. Anything
      // else still fails (DEEPINFER_V41_NO_FLIP_FALLBACK=1: always the reference).
      const std::vector<float>* target = &r.logits;
      std::string against = "ref";
      testref::V41Explanation ex;
      for (Mode mode : {Mode{"full", T, T}, Mode{"decode", 13, 1}, Mode{"chunked", 5, 7}, Mode{"chunked", 1, 4}}) {
        const std::string what = "v41 " + name + " seq " + std::to_string(k) + " " + mode.name + "(" +
                                 std::to_string(mode.first) + "," + std::to_string(mode.step) + ")";
        auto out = sequence_logits(mg, r.ids, mode.first, mode.step);
        expect(out.size() == r.logits.size(), what + ": logits size");
        if (out.size() != r.logits.size()) continue;
        if (full.empty()) {
          full = out;
          cpu_out = sequence_logits(mc, r.ids, T, T);
          ErrStats c = compare(out, cpu_out, V);
          worst_vs_cpu = std::max(worst_vs_cpu, c.max);
          std::printf("%-44s gpu vs cpu: median rel %.2e max %.2e argmax %.3f\n", what.c_str(), c.median, c.max,
                      c.argmax_agree);
          ErrStats e = compare(out, r.logits, V);
          if (e.median > 1e-5 || e.max > 1e-3 || e.argmax_agree < 0.99) {
            std::printf("%-44s gpu vs ref: median rel %.2e max %.2e argmax %.3f: outside the bounds\n", what.c_str(),
                        e.median, e.max, e.argmax_agree);
            v41_divergence(what, "gpu vs cpu", out, cpu_out, V);
            v41_divergence(what, "gpu vs ref", out, r.logits, V);
            if (fallback && mc.v41) {
              ex = testref::v41_explain(mc, report, k, r.ids, out, cpu_out);
              for (const auto& f : ex.flips) std::printf("%-44s QAT flip on the GPU: %s\n", what.c_str(), f.c_str());
              if (ex.unexplained_from < 0 && !ex.flips.empty()) {
                target = &ex.cpu;
                against = "cpu+flips";
                g_summary["v41_explained_flips"][name + " seq " + std::to_string(k)] = ex.flips;
              } else {
                std::printf("%-44s NOT explained by listed QAT flips from position %lld on\n", what.c_str(),
                            (long long)ex.unexplained_from);
              }
            }
          }
        } else {
          expect(std::memcmp(full.data(), out.data(), out.size() * sizeof(float)) == 0,
                 what + ": not bitwise equal to the full forward");
        }
        ErrStats e = compare(out, *target, V);
        std::printf("%-44s gpu vs %s: median rel %.2e max %.2e max abs %.2e argmax %.3f\n", what.c_str(),
                    against.c_str(), e.median, e.max, e.max_abs, e.argmax_agree);
        expect(e.median <= 1e-5, what + ": median (vs " + against + ")");
        expect(e.max <= 1e-3, what + ": max (vs " + against + ")");
        expect(e.argmax_agree >= 0.99, what + ": argmax (vs " + against + ")");
        if (e.median > 1e-5 || e.max > 1e-3 || e.argmax_agree < 0.99) v41_divergence(what, "gpu vs target", out, *target, V);
        worst_median = std::max(worst_median, e.median);
        worst_max = std::max(worst_max, e.max);
        worst_agree = std::min(worst_agree, e.argmax_agree);
      }
    }
    g_summary["v41_fixtures"][name] = {{"worst_median_rel", worst_median},
                                       {"worst_max_rel", worst_max},
                                       {"worst_argmax_agree", worst_agree},
                                       {"worst_max_rel_vs_cpu", worst_vs_cpu}};
  }
  if (dirs.empty()) return;

  // Batched vs alone on the GPU (first fixture, the CPU test's schedules): bitwise.
  LoadedModel m = load_model(dirs.front() + "/model", gpu);
  DeepseekV41Model& model = *m.v41;
  const int64_t V = m.vocab_size();
  auto refs = read_refs(dirs.front());
  std::vector<std::vector<int32_t>> seqs;
  for (auto& r : refs) seqs.push_back(r.ids);
  seqs.push_back(std::vector<int32_t>(refs[0].ids.begin(), refs[0].ids.begin() + 29));
  struct Sched {
    int64_t first, step;
  };
  std::vector<Sched> sched{{9, 4}, {1, 1}, {30, 11}, {17, 3}};
  sched.resize(seqs.size(), {5, 2});
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < seqs.size(); ++i) alone.push_back(sequence_logits(m, seqs[i], sched[i].first, sched[i].step));
  std::vector<V41SeqState> states;
  for (size_t i = 0; i < seqs.size(); ++i) states.push_back(model.new_state());
  std::vector<int64_t> done(seqs.size(), 0);
  std::vector<std::vector<float>> batched(seqs.size());
  for (;;) {
    std::vector<V41SeqChunk> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t T = (int64_t)seqs[i].size();
      if (done[i] >= T) continue;
      const int64_t n = done[i] == 0 ? std::min(sched[i].first, T) : std::min(sched[i].step, T - done[i]);
      batch.push_back({&states[i], std::span<const int32_t>(seqs[i].data() + done[i], n), true});
      who.push_back(i);
      done[i] += n;
    }
    if (batch.empty()) break;
    auto l = model.forward(batch);
    size_t off = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t n = batch[b].tokens.size() * V;
      batched[who[b]].insert(batched[who[b]].end(), l.begin() + off, l.begin() + off + n);
      off += n;
    }
  }
  bool same = true;
  for (size_t i = 0; i < seqs.size(); ++i)
    same = same && alone[i].size() == batched[i].size() &&
           std::memcmp(alone[i].data(), batched[i].data(), alone[i].size() * sizeof(float)) == 0;
  std::printf("v41 batched vs alone on the GPU (%s, %zu sequences): %s\n", fs::path(dirs.front()).filename().c_str(),
              seqs.size(), same ? "bitwise equal" : "DIFFERENT");
  expect(same, "v41 batched vs alone on the GPU");
  g_summary["v41_batched_bitwise_equal"] = same;
}

// 4c. The engine driving V4.1 on cuda (states in device memory): greedy tokens equal to the engine on
// cpu, and seeded sampling batched with chunked prefill and preemption equal to each request alone.
void v41_engine(const std::string& root, int threads) {
  const std::string dir = root + "/tests/fixtures/v41/tiny_hf/model";
  auto request = [](std::mt19937& g, int len, int max_tokens, std::optional<uint64_t> seed, float temperature) {
    Request r;
    r.prompt_ids.push_back(0);
    for (int i = 1; i < len; ++i) r.prompt_ids.push_back(3 + (int32_t)(g() % 380));
    r.params.max_tokens = max_tokens;
    r.params.temperature = temperature;
    r.params.seed = seed;
    r.params.ignore_eos = true;
    return r;
  };
  auto config = [&](const std::string& backend) {
    EngineConfig cfg;
    cfg.model_dir = dir;
    cfg.backend = backend;
    cfg.dtype = "float32";  // token identity with the cpu needs the float32 weights
    cfg.threads = threads;
    return cfg;
  };
  std::mt19937 g(3);
  std::vector<Request> greedy;
  for (int len : {21, 70, 5, 130}) greedy.push_back(request(g, len, 24, std::nullopt, 0.0f));
  std::vector<std::vector<int32_t>> tok_cpu, tok_gpu;
  {
    Engine e(config("cpu"));
    for (auto& r : e.generate(greedy)) tok_cpu.push_back(r.outputs[0].token_ids);
  }
  {
    Engine e(config("cuda"));
    for (auto& r : e.generate(greedy)) tok_gpu.push_back(r.outputs[0].token_ids);
  }
  int64_t equal = 0, total = 0;
  for (size_t i = 0; i < greedy.size(); ++i) {
    size_t same = 0;
    while (same < tok_gpu[i].size() && same < tok_cpu[i].size() && tok_gpu[i][same] == tok_cpu[i][same]) ++same;
    equal += (int64_t)same;
    total += (int64_t)tok_cpu[i].size();
    expect(tok_gpu[i] == tok_cpu[i] && tok_cpu[i].size() == 24,
           "v41 engine prompt " + std::to_string(i) + ": cuda and cpu greedy tokens differ at " + std::to_string(same));
  }
  std::printf("v41 engine: cuda = cpu for %lld/%lld greedy tokens\n", (long long)equal, (long long)total);
  g_summary["v41_engine"]["greedy_equal"] = equal;
  g_summary["v41_engine"]["greedy_tokens"] = total;

  // Seeded sampling on cuda: alone, then 5 together with a 16-token step and room for 3 sequences
  // and 3 pages (the budget of test_e2e_v41_engine), so long prompts preempt each other.
  std::mt19937 g2(7);
  std::vector<Request> reqs;
  for (int len : {250, 251, 40, 252, 253}) reqs.push_back(request(g2, len, 10, 100 + len, 0.8f));
  std::vector<std::vector<int32_t>> alone;
  {
    Engine e(config("cuda"));
    for (auto& r : reqs) alone.push_back(e.generate({r})[0].outputs[0].token_ids);
  }
  EngineConfig cfg = config("cuda");
  cfg.max_batched_tokens = 16;
  cfg.max_num_seqs = 3;
  cfg.cache_bytes = 3 * (10LL * 8 * 64 * 4 + 2 * 2 * 64 * 4) + 3 * 256 * ((64 + 32) * 4 / 2 * 2 + (64 + 32) * 4);
  Engine e(cfg);
  auto res = e.generate(reqs);
  int64_t ok = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    ok += res[i].outputs[0].finish == Finish::kLength && res[i].outputs[0].token_ids == alone[i];
  const int64_t preemptions = e.stats().preemptions;
  std::printf("v41 engine cuda: %lld/%zu seeded requests batched (16-token steps, %lld preemptions) = alone\n",
              (long long)ok, reqs.size(), (long long)preemptions);
  expect(ok == (int64_t)reqs.size(), "v41 engine cuda: batched with preemption differs from alone");
  expect(preemptions > 0, "v41 engine cuda: the budget was meant to force preemption");
  g_summary["v41_engine"]["batched_equal_alone"] = ok;
  g_summary["v41_engine"]["preemptions"] = preemptions;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root = ".", out;
  int tokens = 256, threads = 0, decode_only = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--root") root = v;
    else if (a == "--tokens") tokens = std::stoi(v);
    else if (a == "--threads") threads = std::stoi(v);
    else if (a == "--out") out = v;
    else if (a == "--decode-only") decode_only = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    CudaBackend gpu(0, CudaWeights::Float32);
    if (decode_only > 0) {  // for a profiler: load nano, decode one sequence, nothing else
      LoadedModel m = load_model(root + "/models/nano-v4", gpu);
      std::vector<std::vector<int32_t>> one{{0, 1169, 265, 2134}};
      GreedyRun r = greedy(*m.v4, gpu, one, decode_only);
      std::printf("decode-only: %d tokens, %.3f ms/token\n", decode_only, 1e3 * r.decode_s / (decode_only - 1));
      return 0;
    }
    CpuBackend cpu(threads);
    auto section = [&](const char* name, const std::function<void()>& f) {
      double t0 = now_s();
      try {
        f();
      } catch (const std::exception& e) {
        std::printf("FAIL: %s: exception: %s\n", name, e.what());
        ++g_failures;
      }
      std::printf("time: %s %.1f s\n", name, now_s() - t0);
      std::fflush(stdout);
    };
    section("ops", [&] { op_checks(cpu, gpu); });
    section("fixtures", [&] { fixtures(root, cpu, gpu); });
    section("nano", [&] { nano(root, cpu, gpu, tokens); });
    section("engine", [&] { engine_section(root, gpu, tokens, threads); });
    section("stored", [&] { stored_section(root, cpu, tokens); });
    section("v41 ops", [&] { v41_op_checks(cpu, gpu); });
    section("v41 fixtures", [&] { v41_fixtures(root, cpu, gpu); });
    section("v41 engine", [&] { v41_engine(root, threads); });
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    ++g_failures;
  }
  g_summary["failures"] = g_failures;
  if (!out.empty()) std::ofstream(out) << g_summary.dump(1) << "\n";
  std::printf("%s (%d failures)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
