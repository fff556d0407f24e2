// GEMV v5 (gemv_q_v5): decode GEMV y[M, N] = bf16(x)[M, K] · dequant(W)[N, K]ᵀ for bf16 and fp8 e4m3
// (128×128 f32 block scales) weights, built for latency: every 16-byte weight load of a warp's work is in
// flight before any of it is used, no clusters, no split-K across blocks. Design, byte counts and
// predictions: docs/cuda-notes.md, "GEMV v5".
//
// * Tile = 16 weight rows; lane (g, t) = (lane / 4, lane % 4) loads rows g and g + 8. Chunk = 64 bytes
//   of a row (64 k fp8, 32 k bf16): lane t loads bytes [16t, 16t + 16) of it. One chunk of a tile feeds
//   4 (fp8) or 2 (bf16) mma.sync.m16n8k16 with the batch as the n8 side (rows ≥ M are zero columns).
//   The k order inside an MMA is free as long as A and B agree; with this mapping x is read in its
//   natural order (lane (g, t) reads x row g at the same 16 (fp8) / 8 (bf16) k it loaded weights for).
// * Work item of a warp = (tile, K-slice). S slices a tile (power of two ≤ 16) chosen from (fmt, N, K)
//   only: split K until tiles·S ≥ 2048 items, so that small N still has ~16 warps an SM in flight.
//   A block (16 warps, one an SM) takes 16 / S tiles a round; its warps reduce the S partials in slice
//   order through shared memory. A slice is walked in batches of 8 chunks: 16 loads of 16 bytes a
//   lane, issued together, then 4–32 MMAs.
// * x: staged once a block as bf16 rows (row stride padded so the fragment reads are conflict free);
//   the first batch's weight loads are issued before the staging, so they overlap it.
// * Dequantization as v3 (bf16_bits.cuh): e4m3 bits placed into bf16 (value·2^-120), times bf16(2^120·s)
//   (two factors when s > 2^7). Exact for power-of-two scales.
//
// Batch invariance: an output's sum is the MMA chain over the chunks of each slice in order, then the
// slices 0..S−1 in order; S, the slice bounds and the tile shape depend only on (fmt, N, K). MMA column
// j depends only on x row j. So row m's result is bitwise the same for every M and position (M > 8 and
// long K run as launches of fewer rows: also row-independent).
#include <algorithm>

#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
using detail::fp8_mma, detail::u4get, detail::mma16816, detail::pack_bf16, detail::pow2_bf16x2;

constexpr int G5_WARPS = 16, G5_NT = G5_WARPS * 32;
constexpr int G5_B = 8;               // chunks a batch (2 rows × 8 = 16 loads of 16 bytes a lane)
constexpr int G5_ITEMS = 2048;        // split K until tiles · S reaches this (≈ 16 warps × 128 SMs)
constexpr int G5_MAXS = 16;           // slices a tile (≤ warps a block)
constexpr int G5_XU = 4;              // x staging: units of 8 k a thread loads before converting
constexpr int G5_RED = G5_WARPS * 128;  // floats of the slice reduction buffer (a warp's 16×8 fragment)
constexpr size_t G5_SMEM_MAX = 227 * 1024;  // H100/H200 opt-in limit (the launcher checks the device's)

struct G5Params {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  const float* ws;
  int64_t ldws;
  int64_t N, K;
  float* y;
  int64_t ldy;
  int M;       // rows of this launch (≤ 8)
  int S, cps;  // slices a tile, chunks a slice
  int nch;     // chunks of K (ceil(K bytes / 64))
  int rounds;  // ceil(tiles / (16 / S))
  int xs_u4;   // row stride of the x staging, 16-byte units
};

// Weights: 16 bytes read once, L2 asked for the 256-byte span (detail::ld_early_u4_l2: not .nc, see there).
using detail::ld_early_u4_l2;

// One warp's work item: tile rows [n0, n0 + 16), chunks [c0, c1).
struct G5Item {
  int64_t n0;
  int c0, c1;
};
__device__ __forceinline__ G5Item g5_item(const G5Params& p, int round, int warp) {
  const int tpr = G5_WARPS / p.S;
  const int64_t tile = (int64_t)round * tpr + warp / p.S;
  const int s = warp % p.S;
  G5Item it;
  it.n0 = tile * 16;
  it.c0 = min(p.nch, s * p.cps);
  it.c1 = min(p.nch, (s + 1) * p.cps);
  if (it.n0 >= p.N) it.c1 = it.c0;  // tile past N (last round): no work
  return it;
}

// The batch of chunks [cb, cb + 8) ∩ [cb, c1): weights of rows g, g + 8 (zero past N / K / c1) and, fp8,
// the tile's f32 scale bits of each chunk.
template <WFmt WF>
__device__ __forceinline__ void g5_load(const G5Params& p, const G5Item& it, int cb, int g, int t, uint4 (&wv)[G5_B][2],
                                        uint32_t (&sc)[G5_B / 2]) {
  const int64_t kb = WF == WFmt::BF16 ? p.K * 2 : p.K;  // row bytes
  const int64_t nA = it.n0 + g, nB = nA + 8;
  const uint8_t* rA = p.w + nA * kb + t * 16;
  const uint8_t* rB = p.w + nB * kb + t * 16;
#pragma unroll
  for (int j = 0; j < G5_B; ++j) {
    const int c = cb + j;
    const int64_t off = (int64_t)c * 64;
    const bool ok = c < it.c1 && off + t * 16 < kb;
    wv[j][0] = ok && nA < p.N ? ld_early_u4_l2(rA + off) : make_uint4(0, 0, 0, 0);
    wv[j][1] = ok && nB < p.N ? ld_early_u4_l2(rB + off) : make_uint4(0, 0, 0, 0);
    // fp8: chunk c = k [64c, 64c + 64), scale column c / 2 (cb is even: one scale per chunk pair)
    if constexpr (WF == WFmt::FP8_B128)
      if (j % 2 == 0) sc[j / 2] = c < it.c1 ? __float_as_uint(__ldg(p.ws + (it.n0 / 128) * p.ldws + c / 2)) : 0u;
  }
}

// The MMAs of one batch, chunks in order. xs: x row g (bf16), or null for rows ≥ M (zero columns).
template <WFmt WF>
__device__ __forceinline__ void g5_compute(const G5Item& it, int cb, const uint4* xrow, int t, const uint4 (&wv)[G5_B][2],
                                           const uint32_t (&sc)[G5_B / 2], float (&acc)[4]) {
#pragma unroll
  for (int j = 0; j < G5_B; ++j) {
    const int c = cb + j;
    if (c >= it.c1) break;  // warp-uniform
    const uint4& w0 = wv[j][0];
    const uint4& w1 = wv[j][1];
    if constexpr (WF == WFmt::BF16) {
      // chunk c = k [32c, 32c + 32): lane t's 8 k at 32c + 8t = x unit 4c + t
      const uint4 X = xrow ? xrow[c * 4 + t] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        mma16816(acc, u4get(w0, 2 * i), u4get(w1, 2 * i), u4get(w0, 2 * i + 1), u4get(w1, 2 * i + 1), u4get(X, 2 * i),
                 u4get(X, 2 * i + 1));
    } else {
      // lane t's 16 k at 64c + 16t = x units 8c + 2t, +1; MMA i: w word i (k 4i..4i+3) → pairs (0,1), (2,3)
      uint4 X[2];
      X[0] = xrow ? xrow[c * 8 + 2 * t] : make_uint4(0, 0, 0, 0);
      X[1] = xrow ? xrow[c * 8 + 2 * t + 1] : make_uint4(0, 0, 0, 0);
      const float s = __uint_as_float(sc[j / 2]);
      // value·2^-120 × bf16(2^120·s); two factors when 2^120·s would overflow bf16 (tile-uniform branch)
      if (s > 128.0f) fp8_mma<true>(acc, w0, w1, X, pow2_bf16x2(60), pack_bf16(s * 0x1p60f, s * 0x1p60f));
      else fp8_mma<false>(acc, w0, w1, X, pack_bf16(s * 0x1p120f, s * 0x1p120f), 0u);
    }
  }
}

template <WFmt WF>
__global__ void __launch_bounds__(G5_NT, 1) gemv5_kernel(const G5Params p) {
  extern __shared__ uint4 g5_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  uint4* xs = g5_smem;                                                             // [M][xs_u4] bf16
  float* red = reinterpret_cast<float*>(g5_smem + (size_t)p.M * p.xs_u4);          // [16 warps][128]

  // Programmatic dependent launch (gemv_q_v5_pdl; no-ops otherwise): let the next PDL launch start
  // its blocks as SMs free up, and read nothing another kernel may have written (x; y is written
  // later) before the previous grid has completed. The weights are read before that wait.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  int rnd = blockIdx.x;
  G5Item it = g5_item(p, rnd, warp);
  uint4 wv[G5_B][2];
  uint32_t sc[G5_B / 2];
  g5_load<WF>(p, it, it.c0, g, t, wv, sc);  // in flight while x is staged
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  // x rows → bf16, natural k order, zero past K up to the chunk grid (units of 8 k). Flat over (row,
  // unit), 4 units a thread a step with all loads first: 2 dependent L2 round trips for 8 rows of
  // K = 4096 (fp8 then spills 8 bytes here, in the prologue only; none in the main loop).
  {
    const int units = p.nch * (WF == WFmt::BF16 ? 4 : 8), total = p.M * units;
    for (int i0 = tid; i0 < total; i0 += G5_XU * G5_NT) {
      float4 a[G5_XU], b[G5_XU];
#pragma unroll
      for (int q = 0; q < G5_XU; ++q) {
        const int i = i0 + q * G5_NT, m = i / units;
        const int64_t k = (int64_t)(i - m * units) * 8;
        a[q] = b[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < total && k < p.K) {
          const float* xr = p.x + m * p.ldx + k;
          a[q] = *reinterpret_cast<const float4*>(xr), b[q] = *reinterpret_cast<const float4*>(xr + 4);
        }
      }
#pragma unroll
      for (int q = 0; q < G5_XU; ++q) {
        const int i = i0 + q * G5_NT, m = i / units;
        if (i < total)
          xs[(size_t)m * p.xs_u4 + (i - m * units)] =
              make_uint4(pack_bf16(a[q].x, a[q].y), pack_bf16(a[q].z, a[q].w), pack_bf16(b[q].x, b[q].y),
                         pack_bf16(b[q].z, b[q].w));
      }
    }
  }
  __syncthreads();
  const uint4* xrow = g < p.M ? xs + (size_t)g * p.xs_u4 : nullptr;

  for (;;) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (it.c0 < it.c1) {
      for (int cb = it.c0;;) {
        g5_compute<WF>(it, cb, xrow, t, wv, sc, acc);
        cb += G5_B;
        if (cb >= it.c1) break;
        g5_load<WF>(p, it, cb, g, t, wv, sc);
      }
    }
    // fragment: c0, c1 = (row g, columns 2t, 2t + 1), c2, c3 = row g + 8
    if (p.S == 1) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t n = it.n0 + g + 8 * (r >> 1);
        const int m = 2 * t + (r & 1);
        if (m < p.M && n < p.N) p.y[m * p.ldy + n] = acc[r];
      }
    } else {
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp * 128 + r * 32 + lane] = acc[r];
      __syncthreads();
      const int tpr = G5_WARPS / p.S;
      for (int e = tid; e < tpr * 128; e += G5_NT) {
        const int q = e / 128, r = (e / 32) % 4, ln = e % 32;
        float v = red[(q * p.S) * 128 + (e % 128)];
        for (int s = 1; s < p.S; ++s) v += red[(q * p.S + s) * 128 + (e % 128)];
        const int64_t n = ((int64_t)rnd * tpr + q) * 16 + (ln >> 2) + 8 * (r >> 1);
        const int m = 2 * (ln & 3) + (r & 1);
        if (m < p.M && n < p.N) p.y[m * p.ldy + n] = v;
      }
      __syncthreads();  // red is rewritten next round
    }
    rnd += gridDim.x;
    if (rnd >= p.rounds) break;
    it = g5_item(p, rnd, warp);
    g5_load<WF>(p, it, it.c0, g, t, wv, sc);
  }
}

// The schedule of (fmt, N, K): slices a tile and chunks a slice. Depends on nothing else.
void g5_schedule(WFmt f, int64_t N, int64_t nch, int* S, int* cps) {
  const int64_t tiles = cdiv(N, 16);
  int s = 1;
  // split while items are few and every slice keeps ≥ 2 chunks
  while (s < G5_MAXS && tiles * s < G5_ITEMS && cdiv(nch, 2 * s) >= 2) s *= 2;
  *S = s;
  *cps = (int)cdiv(nch, s);
  if (f == WFmt::FP8_B128) *cps += *cps % 2;  // slices start on a 128-k scale block (chunk pairs)
}

int g5_xs_u4(WFmt f, int64_t nch) {
  // row bytes = nch · 128 (fp8) / nch · 64 (bf16), padded by 16 (fp8) / 64 (bf16) bytes so that rows
  // g and g + 1 of a fragment read land on different banks
  return f == WFmt::BF16 ? (int)(cdiv(nch * 64, 128) * 8 + 4) : (int)(nch * 8 + 1);
}
size_t g5_smem_bytes(int rows, int xs_u4) { return (size_t)rows * xs_u4 * 16 + (size_t)G5_RED * sizeof(float); }

}  // namespace

static cudaError_t g5_run(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                   bool pdl, cudaStream_t s) {
  if (W.fmt != WFmt::BF16 && W.fmt != WFmt::FP8_B128) return cudaErrorNotSupported;
  // 16-byte lanes: a row's bytes must be a multiple of 16 (bf16 K % 8, fp8 K % 16); x read as float4
  if (K <= 0 || (W.fmt == WFmt::BF16 ? K % 8 : K % 16)) return cudaErrorNotSupported;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16) return cudaErrorInvalidValue;
  if (W.fmt == WFmt::FP8_B128 && (!W.scale || W.ldws < cdiv(K, 128))) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  int dev = 0, sms = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  const size_t smax = std::min<size_t>((size_t)optin, G5_SMEM_MAX);

  const int64_t nch = cdiv(W.fmt == WFmt::BF16 ? K * 2 : K, 64);
  const int xs_u4 = g5_xs_u4(W.fmt, nch);
  // rows a launch: 8, fewer when x of 8 rows does not fit shared memory (rows are independent, so the
  // split changes no bit)
  int rows = 8;
  while (rows > 1 && g5_smem_bytes(rows, xs_u4) > smax) rows /= 2;
  if (g5_smem_bytes(rows, xs_u4) > smax) return cudaErrorNotSupported;  // K too long for one row of x
  G5Params p = {};
  p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const float*>(W.scale), p.ldws = W.ldws;
  p.N = N, p.K = K, p.ldy = ldy;
  p.nch = (int)nch, p.xs_u4 = xs_u4;
  g5_schedule(W.fmt, N, nch, &p.S, &p.cps);
  p.rounds = (int)cdiv(cdiv(N, 16), G5_WARPS / p.S);
  const unsigned grid = (unsigned)std::min<int64_t>(p.rounds, sms);
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    p.x = x + m0 * ldx, p.y = y + m0 * ldy;
    p.M = (int)std::min<int64_t>(rows, M - m0);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid, 1, 1);
    cfg.blockDim = dim3(G5_NT, 1, 1);
    cfg.dynamicSmemBytes = g5_smem_bytes(p.M, xs_u4);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    e = W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv5_kernel<WFmt::BF16>, p)
                            : cudaLaunchKernelEx(&cfg, gemv5_kernel<WFmt::FP8_B128>, p);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gemv_q_v5(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s) {
  return g5_run(x, M, K, ldx, W, N, y, ldy, false, s);
}
cudaError_t gemv_q_v5_pdl(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, cudaStream_t s) {
  return g5_run(x, M, K, ldx, W, N, y, ldy, true, s);
}

namespace detail {
cudaError_t init_attributes_gemv_q_v5() {
  return first_error({set_max_dynamic_smem(gemv5_kernel<WFmt::BF16>, G5_SMEM_MAX),
                      set_max_dynamic_smem(gemv5_kernel<WFmt::FP8_B128>, G5_SMEM_MAX)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
