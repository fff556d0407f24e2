// GEMV v7 (gemv_q_v7): decode GEMV for one x row, y[n] = Σ_k bf16(x[k]) · dequant(W)[n, k], bf16 and fp8
// e4m3 (128×128 f32 block scales) weights, on CUDA cores with the load pattern of the measured streaming
// floor (tests/cuda/test_cuda_ops.cu, floor_stream_kernel: 99 % of HBM at 33 MB from a graph). Design and
// predictions: docs/cuda-notes.md, "GEMV v7".
//
// * A warp owns whole rows (rows w, w + T, w + 2T, ... for T warps in the grid): no split-K, so no
//   cross-warp or cross-block reduction. Lane l reads the 16-byte chunks l, l + 32, ... of a row (fp8: 16
//   k a chunk, bf16: 8 k), cpl = ceil(chunks / 32) "slots" a row a lane.
// * The warp's slots (row by row) are read in batches of 8 16-byte loads a lane, through a 2-deep
//   register ring: batch b + 1 is issued before batch b is computed, so 8–16 loads a lane stay in flight
//   (2 blocks of 8 warps an SM: 64–128 KiB an SM, the floor kernel's 128 KiB). Short rows share a batch
//   (wq_b, K = 1024 fp8: 4 rows a batch), long rows take several (wo_b, K = 8192: 2).
// * The first batch is issued before griddepcontrol.wait (weights are constant; the loads are not .nc,
//   which ptxas would hoist the wait above, see gemv_q_v6.cu), then x (written by the previous kernel) is
//   staged once per block as f32 bf16(x) in shared memory, 4 floats of padding every chunk so that the
//   lanes' 16-byte reads hit distinct banks.
// * fp8: cvt.rn.f16x2.e4m3x2 (exact), f16 → f32 (exact), 16 products bf16(x)·w (exact in f32) summed by
//   fmaf in k order from zero, then acc = fmaf(s, Σ, acc) with the chunk's block scale s (a 16-k chunk
//   lies in one 128-k block). bf16: w → f32 by a shift, acc = fmaf(x, w, acc) in k order.
// * Deterministic and batch invariant: a row's sum is lane l's chunks in order, then a fixed xor
//   butterfly; nothing depends on the grid, M or the device.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv, detail::e4m3x4_f16;

constexpr int G7_WARPS = 8, G7_NT = G7_WARPS * 32;
constexpr int G7_BPS = 2;  // blocks an SM (launch bound: ≤ 128 registers; the ring is 80)
constexpr int G7_NL = 8;   // loads a lane a batch
constexpr size_t G7_SMEM_MAX = 227 * 1024;

template <WFmt WF>
struct G7Fmt {
  static constexpr int KC = WF == WFmt::BF16 ? 8 : 16;  // k a 16-byte chunk
  static constexpr int XS = KC + 4;                       // floats of x a chunk in shared memory (padded)
};

struct G7Params {
  const float* x;
  const uint8_t* w;
  const float* ws;
  int64_t ldws;
  int64_t N, K;
  float* y;
  int C;    // 16-byte chunks a row
  int cpl;  // slots a row a lane: ceil(C / 32)
};

// Weights: 16 bytes read once, not kept in L1, not .nc (the floor kernel's load; see the header); block
// scales: reused by 128 rows, L1 cached (detail::ld_early_u4 / ld_early_f32).
using detail::ld_early_f32, detail::ld_early_u4;
__device__ __forceinline__ float2 g7_h2f(uint32_t h) {
  __half2 v;
  *reinterpret_cast<uint32_t*>(&v) = h;
  return __half22float2(v);
}

// A cursor over a warp's slots: row index ri of the warp (row n = n0 + ri·T), slot j of the row.
struct G7Cur {
  int64_t n;  // the row, ≥ N past the warp's last row
  int j;
};
__device__ __forceinline__ void g7_next(G7Cur& c, int cpl, int64_t T) {
  if (++c.j == cpl) c.j = 0, c.n += T;
}

// Issue one batch: slot u of the batch → wv[u], sc[u] (fp8). Nothing is loaded past the warp's rows or
// for a chunk past the row (those slots are not computed).
template <WFmt WF>
__device__ __forceinline__ void g7_load(const G7Params& p, G7Cur& c, int64_t T, int lane, uint4 (&wv)[G7_NL],
                                        float (&sc)[G7_NL]) {
  const int64_t rb = WF == WFmt::BF16 ? p.K * 2 : p.K;
#pragma unroll
  for (int u = 0; u < G7_NL; ++u) {
    const int ch = lane + 32 * c.j;
    if (c.n < p.N && ch < p.C) {
      wv[u] = ld_early_u4(p.w + c.n * rb + (int64_t)ch * 16);
      if constexpr (WF == WFmt::FP8_B128) sc[u] = ld_early_f32(p.ws + (c.n / 128) * p.ldws + ch / 8);
    }
    g7_next(c, p.cpl, T);
  }
}

// Compute one batch; a row's last slot ends it: butterfly, lane 0 stores.
template <WFmt WF>
__device__ __forceinline__ void g7_compute(const G7Params& p, G7Cur& c, int64_t T, int lane, const float* xs,
                                           const uint4 (&wv)[G7_NL], const float (&sc)[G7_NL], float& acc) {
  constexpr int XS = G7Fmt<WF>::XS;
#pragma unroll
  for (int u = 0; u < G7_NL; ++u) {
    if (c.n >= p.N) return;  // warp-uniform: past the warp's last row
    const int ch = lane + 32 * c.j;
    if (ch < p.C) {
      const float4* xv = reinterpret_cast<const float4*>(xs + ch * XS);
      const uint4 w = wv[u];
      if constexpr (WF == WFmt::BF16) {
        const float4 x0 = xv[0], x1 = xv[1];
        const float xk[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc = fmaf(xk[2 * i], __uint_as_float(ww[i] << 16), acc);
          acc = fmaf(xk[2 * i + 1], __uint_as_float(ww[i] & 0xFFFF0000u), acc);
        }
      } else {
        const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // word i: k 4i..4i+3
          const float4 xq = xv[i];
          uint32_t lo, hi;
          e4m3x4_f16(ww[i], lo, hi);
          const float2 a = g7_h2f(lo), b = g7_h2f(hi);
          s = fmaf(xq.x, a.x, s);
          s = fmaf(xq.y, a.y, s);
          s = fmaf(xq.z, b.x, s);
          s = fmaf(xq.w, b.y, s);
        }
        acc = fmaf(sc[u], s, acc);
      }
    }
    if (c.j == p.cpl - 1) {  // the row's last slot (warp-uniform)
      float v = acc;
#pragma unroll
      for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) p.y[c.n] = v;
      acc = 0.0f;
    }
    g7_next(c, p.cpl, T);
  }
}

template <WFmt WF>
__global__ void __launch_bounds__(G7_NT, G7_BPS) gemv7_kernel(const G7Params p) {
  // No DI_PDL_WAIT first: the first batch of weights (constant) is issued before it, so in a step graph
  // it streams while the previous kernel runs; x (written by that kernel) is read only after the wait.
  constexpr int KC = G7Fmt<WF>::KC, XS = G7Fmt<WF>::XS;
  extern __shared__ float4 g7_smem[];
  float* xs = reinterpret_cast<float*>(g7_smem);  // [C][XS]: chunk c's KC values of bf16(x), then padding
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t T = (int64_t)gridDim.x * G7_WARPS;
  const int64_t w0 = (int64_t)blockIdx.x * G7_WARPS + (tid >> 5);
  const int64_t rows = w0 < p.N ? (p.N - w0 + T - 1) / T : 0;  // rows of this warp
  const int64_t nb = (rows * p.cpl + G7_NL - 1) / G7_NL;           // its batches
  G7Cur cl{w0, 0}, cc{w0, 0};  // load and compute cursors
  uint4 wa[G7_NL], wb[G7_NL];
  float sa[G7_NL], sb[G7_NL];
#pragma unroll
  for (int u = 0; u < G7_NL; ++u) wa[u] = wb[u] = make_uint4(0, 0, 0, 0), sa[u] = sb[u] = 0.0f;
  if (nb > 0) g7_load<WF>(p, cl, T, lane, wa, sa);
  DI_PDL_WAIT();
  for (int i = tid; i < p.K / 4; i += G7_NT) {  // x → bf16 → f32, 4 k a thread
    const float4 v = reinterpret_cast<const float4*>(p.x)[i];
    const int k = 4 * i;
    *reinterpret_cast<float4*>(xs + (k / KC) * XS + k % KC) =
        make_float4(__bfloat162float(__float2bfloat16_rn(v.x)), __bfloat162float(__float2bfloat16_rn(v.y)),
                    __bfloat162float(__float2bfloat16_rn(v.z)), __bfloat162float(__float2bfloat16_rn(v.w)));
  }
  __syncthreads();
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; b += 2) {  // ping-pong: the ring's registers stay static
    if (b + 1 < nb) g7_load<WF>(p, cl, T, lane, wb, sb);
    g7_compute<WF>(p, cc, T, lane, xs, wa, sa, acc);
    if (b + 1 >= nb) break;
    if (b + 2 < nb) g7_load<WF>(p, cl, T, lane, wa, sa);
    g7_compute<WF>(p, cc, T, lane, xs, wb, sb, acc);
  }
}

size_t g7_smem_bytes(WFmt f, int64_t K) {
  return f == WFmt::BF16 ? (size_t)(K / 8) * G7Fmt<WFmt::BF16>::XS * 4 : (size_t)(K / 16) * G7Fmt<WFmt::FP8_B128>::XS * 4;
}

}  // namespace

bool gemv_q_v7_supported(WFmt f, int64_t K) {
  return (f == WFmt::BF16 || f == WFmt::FP8_B128) && K > 0 && K % 128 == 0 && K <= 32768;
}

static cudaError_t g7_run(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, cudaStream_t s, const GemvPlan* plan, bool pdl) {
  if (!gemv_q_v7_supported(W.fmt, K)) return cudaErrorNotSupported;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16)
    return cudaErrorInvalidValue;
  if (W.fmt == WFmt::FP8_B128 && (!W.scale || W.ldws < K / 128)) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  int sms = 0;
  if (plan && plan->sms > 0) {
    if (plan->fmt != W.fmt || plan->N != N || plan->K != K || plan->grouped) return cudaErrorInvalidValue;
    sms = plan->sms;
  } else {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const size_t smem = g7_smem_bytes(W.fmt, K);
  // 2 blocks an SM while their x fits (K ≤ ~18000 bf16, ~22000 fp8), else 1; one round of blocks
  const int bps = 2 * smem + 2048 <= G7_SMEM_MAX ? G7_BPS : 1;
  G7Params p = {};
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const float*>(W.scale), p.ldws = W.ldws;
  p.N = N, p.K = K;
  p.C = (int)((W.fmt == WFmt::BF16 ? 2 * K : K) / 16);
  p.cpl = (p.C + 31) / 32;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)std::min<int64_t>(cdiv(N, G7_WARPS), (int64_t)bps * sms), 1, 1);
  cfg.blockDim = dim3(G7_NT, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  for (int64_t m = 0; m < M; ++m) {  // rows are independent (meant for M = 1)
    p.x = x + m * ldx, p.y = y + m * ldy;
    const cudaError_t e = W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv7_kernel<WFmt::BF16>, p)
                                              : cudaLaunchKernelEx(&cfg, gemv7_kernel<WFmt::FP8_B128>, p);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gemv_q_v7(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan) {
  return g7_run(x, M, K, ldx, W, N, y, ldy, s, plan, false);
}
cudaError_t gemv_q_v7_pdl(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  return g7_run(x, M, K, ldx, W, N, y, ldy, s, plan, true);
}

namespace detail {
cudaError_t init_attributes_gemv_q_v7() {
  return first_error({set_max_dynamic_smem(gemv7_kernel<WFmt::BF16>, G7_SMEM_MAX),
                      set_max_dynamic_smem(gemv7_kernel<WFmt::FP8_B128>, G7_SMEM_MAX)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
