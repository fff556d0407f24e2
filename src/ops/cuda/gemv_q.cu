// Decode-time GEMV on tensor cores, weights read once in their stored format (bf16 / e4m3 with 128×128
// f32 block scales / e2m1 with 1×32 e8m0 scales), f32 activations rounded to bf16 on the way into shared
// memory. Two kernels: v3 (below, M ≤ 8 a launch, short-lived blocks; `gemv_q_v3`, and the shapes v4
// does not take) and v4 (at the end of the file: long-lived blocks with a cp.async ring, M ≤ 32 a
// launch; `gemv_q`, `gemv_q_grouped`). Design notes and predictions: docs/cuda-notes.md, "GEMV v3" and
// "GEMV v4". The notes below are v3's; v4 keeps its fragment mapping and dequantization.
//
// Shape of the work: y[m, n] = Σ_k bf16(x[m, k]) · W[n, k] is an [N, K] × [K, ≤ 8] product, i.e. one
// mma.sync.m16n8k16 per 16 weight rows × 16 k with the batch as the n8 side. CUDA-core FMAs could not
// keep up at M = 8 (fp4 at 4.27 TB/s is 8.5·10¹² weights/s × 8 rows = 2× the f32 FMA rate); the tensor
// core takes the multiply-adds and the CUDA cores only dequantize.
//
// * Block = 8 warps, 32 weight rows (two 16-row tiles); the 8 warps split the block's K-slice in
//   interleaved chunks (a chunk = one 16-byte load per thread per row: 32 / 64 / 128 k for bf16 / fp8 /
//   fp4); each thread keeps 2 tiles × 2 chunks × 2 rows = 8 16-byte loads in flight.
// * Lane (g, t) = (lane / 4, lane % 4) loads rows g and g + 8 of a tile. The k order inside one MMA is a
//   free choice as long as A and B agree, so each thread's 16 loaded bytes map to whole MMA fragments
//   without shuffles, and x is stored in shared memory in exactly the order the B fragments want
//   (one conflict-free 16-byte shared load gives two MMAs' B).
// * Dequantization is exact (bit placement + one bf16x2 multiply by a power of two):
//   e4m3 byte → bf16 bits (s, eeee, mmm0000) = value·2^-120, × bf16(2^120·scale);
//   e2m1 nibble → bf16 bits (s, 0…0ee, m000000) = value·2^-126, × 2^(e8m0 − 1).
// * x staging: the block's K-slice of its ≤ 8 rows, f32 → bf16 once per block; blocks loop over row
//   groups so the fill is amortized for large N.
// * Split-K over a thread-block cluster (CS ≤ 8 blocks along K) when N alone gives too few blocks;
//   partial sums are combined in a fixed order (warps 0..7, then cluster ranks 0..CS-1 through
//   distributed shared memory). CS and the chunking depend only on (format, N, K).
//
// Batch invariance: the summation order of every output depends only on (format, N, K): the MMA's
// column j depends only on B column j (row j of x), rows ≥ M are zero columns, and nothing in the
// schedule depends on M (or, grouped, on how many slots share an expert). So a row's result is bitwise
// the same for M = 1 and M = 8, and a routed slot's result is bitwise gemv_q of its row alone.
#include <cooperative_groups.h>

#include <algorithm>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
namespace cg = cooperative_groups;
using detail::cdiv;
using detail::fp8_mma, detail::fp4_mma, detail::u4get, detail::mma16816, detail::bmul2, detail::pack_bf16, detail::pow2_bf16x2, detail::e4m3x4_raw,
    detail::e2m1x8_raw;

constexpr int GQ_WARPS = 8, GQ_NT = GQ_WARPS * 32;
constexpr int GQ_RT = 2;  // 16-row tiles per block
constexpr int GQ_U = 2;   // chunks per warp per batch
constexpr int GQ_KSLICE = 4096;  // max k per block (x staging ≤ 8 rows × 4096 × 2 B = 64 KiB)
constexpr int GQ_RED = GQ_RT * 128;  // outputs of a block's row group (RT tiles × 16 rows × 8 cols)

template <WFmt WF>
struct GqFmt {
  static constexpr int VPT = WF == WFmt::BF16 ? 8 : WF == WFmt::FP8_B128 ? 16 : 32;  // values a 16-byte load
  static constexpr int NQ = VPT / 8;  // 16-byte x units a thread reads per chunk (8 bf16 each)
  static constexpr int CK = 4 * VPT;  // k a warp covers per chunk
};

struct GqParams {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  const uint8_t* ws;
  int64_t ldws, w_stride, s_stride;
  int64_t N, K;
  float* y;
  int64_t ldy;
  int M;                  // dense: rows of x / y (≤ 8)
  const int32_t* sel;     // grouped: sel[slots]
  int slots, topk, x_per_slot;
  int fuse;               // grouped w13: y = swiglu(gate, up)[slot, I]
  int64_t I;
  float lim;
  int kslice, row_groups, mmr;  // k per cluster rank; row groups; rows allocated in the x staging
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <WFmt WF>
__device__ __forceinline__ const uint8_t* wrow_ptr(const uint8_t* w, int64_t n, int64_t K, int64_t k) {
  if constexpr (WF == WFmt::BF16) return w + (n * K + k) * 2;
  else if constexpr (WF == WFmt::FP8_B128) return w + n * K + k;
  else return w + n * (K / 2) + k / 2;
}

// x rows → shared memory, bf16, in B-fragment order: unit (16 bytes) ((c·NQ + q)·mmr + m)·4 + t holds
// the 8 values of row m that thread t of chunk c reads as its q-th unit (FP4: order 0,4,1,5,2,6,3,7).
template <WFmt WF>
__device__ __forceinline__ void fill_x(uint4* xs, const float* __restrict__ x, const int64_t* xoff, int rows, int mmr,
                                       int64_t kbase, int kpad, int64_t K) {
  constexpr int NQ = GqFmt<WF>::NQ;
  const int units = kpad / 8;
  for (int m = 0; m < rows; ++m) {
    const float* xr = x + xoff[m];
    for (int u = threadIdx.x; u < units; u += GQ_NT) {
      const int64_t k = kbase + (int64_t)u * 8;
      float v[8];
      if (k < K) {
        const float4 a = *reinterpret_cast<const float4*>(xr + k), b = *reinterpret_cast<const float4*>(xr + k + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      uint4 o;
      if constexpr (WF == WFmt::FP4_B32) {
        o = make_uint4(pack_bf16(v[0], v[4]), pack_bf16(v[1], v[5]), pack_bf16(v[2], v[6]), pack_bf16(v[3], v[7]));
      } else {
        o = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
      }
      const int c = u / (4 * NQ), rem = u % (4 * NQ), t = rem / NQ, q = rem % NQ;  // powers of two
      xs[((c * NQ + q) * mmr + m) * 4 + t] = o;
    }
  }
}

template <WFmt WF, bool GROUPED>
// 3 blocks an SM (≤ 80 registers); fp4's dequantization needs more registers than that (it spilled 24
// bytes at 80), so it runs 2 blocks an SM.
__global__ void __launch_bounds__(GQ_NT, WF == WFmt::FP4_B32 ? 2 : 3) gemv_q_kernel(const GqParams p) {
  // Grouped: sel (written by the router) decides the weights, so wait first. Dense: the weights are
  // constant, so their first lines are asked for before the wait (below), while the previous kernel runs.
  if constexpr (GROUPED) DI_PDL_WAIT();
  constexpr int VPT = GqFmt<WF>::VPT, NQ = GqFmt<WF>::NQ, CK = GqFmt<WF>::CK;
  extern __shared__ uint4 gq_smem[];
  __shared__ int64_t s_xoff[8], s_yoff[8];
  __shared__ int s_rows;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank(), CS = (int)cluster.num_blocks();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

  const uint8_t* wb = p.w;
  const uint8_t* sb = p.ws;
  if constexpr (GROUPED) {
    // Slot s's expert e. The first slot of each run of ≤ 8 occurrences of e (slot order) computes them
    // all as one M ≤ 8 GEMV (the weight is read once); the other slots' blocks leave. The cluster shares
    // blockIdx.z, so it leaves as a whole.
    const int s = blockIdx.z, e = p.sel[s];
    int before = 0;
    for (int j = 0; j < s; ++j) before += p.sel[j] == e;
    if (before % 8) return;
    if (tid == 0) {
      int r = 0;
      for (int j = s; j < p.slots && r < 8; ++j)
        if (p.sel[j] == e) {
          s_xoff[r] = (int64_t)(p.x_per_slot ? j : j / p.topk) * p.ldx;
          s_yoff[r] = (int64_t)j * p.ldy;
          ++r;
        }
      s_rows = r;
    }
    wb += (int64_t)e * p.w_stride;
    if (sb) sb += (int64_t)e * p.s_stride;
  } else {
    if (tid < 8) s_xoff[tid] = tid * p.ldx, s_yoff[tid] = tid * p.ldy;
    if (tid == 0) s_rows = p.M;
  }

  const int64_t K = p.K, N = p.N;
  const int64_t kbase = (int64_t)rank * p.kslice;
  const int klen = (int)max((int64_t)0, min((int64_t)p.kslice, K - kbase));
  const int nch = (klen + CK - 1) / CK;
  auto tile_row = [&](int rg, int rt) -> int64_t {
    return p.fuse ? rt * p.I + (int64_t)rg * 16 : (int64_t)rg * (16 * GQ_RT) + rt * 16;
  };

  // Start the first batch's weight lines towards L2 while x is staged.
  if (blockIdx.x < (unsigned)p.row_groups) {
#pragma unroll
    for (int u = 0; u < GQ_U; ++u) {
      const int c = warp + GQ_WARPS * u;
      const int64_t kk = kbase + (int64_t)c * CK + t * VPT;
      if (c < nch && kk < K)
#pragma unroll
        for (int rt = 0; rt < GQ_RT; ++rt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t n = tile_row(blockIdx.x, rt) + g + 8 * h;
            if (n < N) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(wrow_ptr<WF>(wb, n, K, kk)));
          }
    }
  }
  if constexpr (!GROUPED) DI_PDL_WAIT();
  __syncthreads();
  const int rows = s_rows, mmr = p.mmr;
  uint4* xs = gq_smem;
  float* red = reinterpret_cast<float*>(gq_smem + (size_t)(p.kslice / 8) * mmr);  // [warps][RED]
  float* part = red + GQ_WARPS * GQ_RED;                                            // [RED] block sum
  float* fin = part + GQ_RED;                                                       // [RED] cluster sum
  fill_x<WF>(xs, p.x, s_xoff, rows, mmr, kbase, nch * CK, K);
  __syncthreads();

  for (int rg = blockIdx.x; rg < p.row_groups; rg += gridDim.x) {
    float acc[GQ_RT][4];
#pragma unroll
    for (int rt = 0; rt < GQ_RT; ++rt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[rt][r] = 0.0f;
    int64_t trow[GQ_RT];
#pragma unroll
    for (int rt = 0; rt < GQ_RT; ++rt) trow[rt] = tile_row(rg, rt);

    for (int c0 = warp; c0 < nch; c0 += GQ_WARPS * GQ_U) {
      uint4 wv[GQ_U][GQ_RT][2];
      uint32_t sc[GQ_U][GQ_RT][2];  // FP8: f32 bits of the tile's block scale; FP4: e8m0 byte per row
#pragma unroll
      for (int u = 0; u < GQ_U; ++u) {
        const int c = c0 + GQ_WARPS * u;
        const int64_t kk = kbase + (int64_t)c * CK + t * VPT;
        const bool ok = c < nch && kk < K;
#pragma unroll
        for (int rt = 0; rt < GQ_RT; ++rt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t n = trow[rt] + g + 8 * h;
            wv[u][rt][h] = (ok && n < N) ? ld_stream(wrow_ptr<WF>(wb, n, K, kk)) : make_uint4(0, 0, 0, 0);
            if constexpr (WF == WFmt::FP4_B32) sc[u][rt][h] = (ok && n < N) ? __ldg(sb + n * (K / 32) + kk / 32) : 127u;
          }
          if constexpr (WF == WFmt::FP8_B128) {
            const int64_t kc = kbase + (int64_t)c * CK;  // chunk start: one 128-k scale block
            sc[u][rt][0] = c < nch ? __float_as_uint(__ldg(reinterpret_cast<const float*>(sb) +
                                                           (trow[rt] / 128) * p.ldws + kc / 128))
                                   : 0u;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < GQ_U; ++u) {
        const int c = c0 + GQ_WARPS * u;
        if (c >= nch) break;  // warp-uniform
        uint4 X[NQ];
#pragma unroll
        for (int q = 0; q < NQ; ++q) X[q] = g < rows ? xs[((c * NQ + q) * mmr + g) * 4 + t] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int rt = 0; rt < GQ_RT; ++rt) {
          const uint4& w0 = wv[u][rt][0];
          const uint4& w1 = wv[u][rt][1];
          if constexpr (WF == WFmt::BF16) {
#pragma unroll
            for (int i = 0; i < 2; ++i)
              mma16816(acc[rt], u4get(w0, 2 * i), u4get(w1, 2 * i), u4get(w0, 2 * i + 1), u4get(w1, 2 * i + 1),
                       u4get(X[0], 2 * i), u4get(X[0], 2 * i + 1));
          } else if constexpr (WF == WFmt::FP8_B128) {
            // value·2^-120 × 2^120·s; split in two multiplies when 2^120·s would overflow bf16 (s > 2^7).
            // The branch is warp-uniform (one scale a tile and chunk).
            const float s = __uint_as_float(sc[u][rt][0]);
            if (s <= 128.0f)
              fp8_mma<false>(acc[rt], w0, w1, X, pack_bf16(s * 0x1p120f, s * 0x1p120f), 0u);
            else
              fp8_mma<true>(acc[rt], w0, w1, X, pow2_bf16x2(60), pack_bf16(s * 0x1p60f, s * 0x1p60f));
          } else {
            // value·2^-126 × 2^(b−1); b > 128 (scale > 2) needs a second factor: 2^127 · 2^(b−128)
            // (mma.sync needs the whole warp on one path: the branch is taken by all lanes if by any)
            const int e0 = (int)sc[u][rt][0] - 1, e1 = (int)sc[u][rt][1] - 1;
            if (!__any_sync(0xffffffffu, max(e0, e1) > 127))
              fp4_mma<false>(acc[rt], w0, w1, X, pow2_bf16x2(e0), pow2_bf16x2(e1), 0u, 0u);
            else
              fp4_mma<true>(acc[rt], w0, w1, X, pow2_bf16x2(min(e0, 127)), pow2_bf16x2(min(e1, 127)),
                            pow2_bf16x2(max(e0 - 127, 0)), pow2_bf16x2(max(e1 - 127, 0)));
          }
        }
      }
    }

    // Fixed-order reduction: warps 0..7 in this block, then cluster ranks 0..CS-1 on rank 0.
#pragma unroll
    for (int rt = 0; rt < GQ_RT; ++rt)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp * GQ_RED + (rt * 4 + r) * 32 + lane] = acc[rt][r];
    __syncthreads();
    if (tid < GQ_RED) {
      float v = red[tid];
#pragma unroll
      for (int w = 1; w < GQ_WARPS; ++w) v += red[w * GQ_RED + tid];
      part[tid] = v;
    }
    if (CS > 1) {
      cluster.sync();
      if (rank == 0 && tid < GQ_RED) {
        float v = part[tid];
        for (int r = 1; r < CS; ++r) v += cluster.map_shared_rank(part, r)[tid];
        fin[tid] = v;
      }
      cluster.sync();
    } else {
      if (tid < GQ_RED) fin[tid] = part[tid];
      __syncthreads();
    }
    if (rank == 0) {
      // element tid of the [RT][4][32] fragment image: lane (gg, tt), register r → row gg + 8·(r / 2),
      // column (x row) 2·tt + r % 2
      if (!p.fuse) {
        if (tid < GQ_RED) {
          const int rt = tid / 128, r = (tid / 32) % 4, ln = tid % 32;
          const int row = (ln >> 2) + 8 * (r >> 1), col = 2 * (ln & 3) + (r & 1);
          const int64_t n = tile_row(rg, rt) + row;  // (not trow[rt]: a run-time index would go to local memory)
          if (col < rows && n < N) p.y[s_yoff[col] + n] = fin[tid];
        }
      } else if (tid < 128) {  // tile 0 = gate rows, tile 1 = the matching up rows
        const int r = tid / 32, ln = tid % 32;
        const int row = (ln >> 2) + 8 * (r >> 1), col = 2 * (ln & 3) + (r & 1);
        const int64_t i = (int64_t)rg * 16 + row;
        if (col < rows && i < p.I) p.y[s_yoff[col] + i] = detail::swiglu_clamp_one(fin[tid], fin[128 + tid], p.lim, 1.0f);
      }
    }
  }
}

// The SM count a launch plans with: the plan's (made for this weight shape), else asked of the device
// (on every call: no process-global cache).
cudaError_t launch_sms(const GemvPlan* plan, WFmt f, int64_t N, int64_t K, bool grouped, int* sms) {
  if (plan && plan->sms > 0) {
    if (plan->fmt != f || plan->N != N || plan->K != K || plan->grouped != grouped) return cudaErrorInvalidValue;
    *sms = plan->sms;
    return cudaSuccess;
  }
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  return e;
}

constexpr size_t gq_smem_bytes(int kslice, int mmr) {
  return (size_t)kslice * 2 * mmr + (size_t)(GQ_WARPS + 2) * GQ_RED * sizeof(float);
}

// The schedule of a (format, N, K): cluster size and K-slice. Depends on nothing else (batch invariance).
struct GqPlan {
  int cs, kslice, row_groups;
};
template <WFmt WF>
GqPlan gq_plan(int64_t row_groups, int64_t K, int sms) {
  constexpr int CK = GqFmt<WF>::CK;
  int cs = 1;
  while ((int64_t)cs * GQ_KSLICE < K) cs *= 2;
  // more blocks for small N: split K further while every warp keeps ≥ one batch (2 chunks)
  while (cs < 8 && row_groups * cs < 2 * (int64_t)sms && cdiv(cdiv(K, 2 * cs), CK) >= 2 * GQ_WARPS) cs *= 2;
  const int kslice = (int)(cdiv(cdiv(K, cs), CK) * CK);
  return {cs, kslice, (int)row_groups};
}

// (the max dynamic shared memory attribute: gq_smem_bytes(GQ_KSLICE, 8), set by init_kernel_attributes)
template <WFmt WF, bool GROUPED>
cudaError_t gq_launch(GqParams p, int64_t z, int sms, cudaStream_t s) {
  const GqPlan pl = gq_plan<WF>(p.row_groups, p.K, sms);
  p.kslice = pl.kslice;
  const size_t smem = gq_smem_bytes(pl.kslice, p.mmr);
  // up to 4 waves of 3 blocks an SM; beyond that blocks loop over row groups (x staged once a block)
  const int64_t waves = std::max<int64_t>(1, 4 * 3 * (int64_t)sms / (pl.cs * z));
  const unsigned gx = (unsigned)std::min<int64_t>(p.row_groups, waves);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(gx, (unsigned)pl.cs, (unsigned)z);
  cfg.blockDim = dim3(GQ_NT, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = (unsigned)pl.cs;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, gemv_q_kernel<WF, GROUPED>, p);
}

bool gq_k_ok(WFmt f, int64_t K) {
  const int64_t q = f == WFmt::BF16 ? 8 : f == WFmt::FP8_B128 ? 128 : 32;
  return K > 0 && K % q == 0 && K <= 8 * (int64_t)GQ_KSLICE;
}

template <bool GROUPED>
cudaError_t gq_dispatch(WFmt f, const GqParams& p, int64_t z, int sms, cudaStream_t s) {
  switch (f) {
    case WFmt::BF16: return gq_launch<WFmt::BF16, GROUPED>(p, z, sms, s);
    case WFmt::FP8_B128: return gq_launch<WFmt::FP8_B128, GROUPED>(p, z, sms, s);
    default: return gq_launch<WFmt::FP4_B32, GROUPED>(p, z, sms, s);
  }
}

}  // namespace

namespace {
// gemv_q_v3, and with swiglu its fused epilogue (gemv_q_grouped_v3's: same tiles, plan and sums, so the
// act bits are swiglu_clamp's of the unfused y).
cudaError_t gemv_v3_dense(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, bool swiglu,
                          float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  if (!gq_k_ok(W.fmt, K) || ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16)
    return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (swiglu && (N % 32 || limit <= 0.0f)) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  int sms = 0;
  if (const cudaError_t e = launch_sms(plan, W.fmt, N, K, false, &sms); e != cudaSuccess) return e;
  for (int64_t m0 = 0; m0 < M; m0 += 8) {  // rows are independent (batch invariant): 8 at a time
    GqParams p = {};
    p.x = x + m0 * ldx, p.ldx = ldx;
    p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
    p.N = N, p.K = K, p.y = y + m0 * ldy, p.ldy = ldy;
    p.M = (int)std::min<int64_t>(8, M - m0);
    p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
    p.row_groups = (int)cdiv(N, 16 * GQ_RT);
    p.mmr = p.M <= 1 ? 1 : p.M <= 2 ? 2 : p.M <= 4 ? 4 : 8;
    const cudaError_t e = gq_dispatch<false>(W.fmt, p, 1, sms, s);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t gemv_q_v3(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan) {
  return gemv_v3_dense(x, M, K, ldx, W, N, false, 0.0f, y, ldy, s, plan);
}
cudaError_t gemv_q_v3_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan) {
  return gemv_v3_dense(x, M, K, ldx, W, N, true, limit, act, lda, s, plan);
}

cudaError_t gemv_q_grouped_v3(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                              int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                              float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  if (!gq_k_ok(W.fmt, K) || ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16 ||
      w_stride % 16 || topk <= 0)
    return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (swiglu && (N % 32 || limit <= 0.0f)) return cudaErrorInvalidValue;
  const int64_t slots = T * topk;
  if (slots <= 0 || N <= 0) return cudaSuccess;
  if (slots > 65535) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = launch_sms(plan, W.fmt, N, K, true, &sms); e != cudaSuccess) return e;
  GqParams p = {};
  p.x = x, p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.y = y, p.ldy = ldy;
  p.sel = sel, p.slots = (int)slots, p.topk = topk, p.x_per_slot = x_per_slot ? 1 : 0;
  p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
  // fused: row group rg = gate rows [16·rg, +16) and up rows I + [16·rg, +16); same count, same plan
  p.row_groups = (int)cdiv(N, 16 * GQ_RT);
  p.mmr = 8;  // rows per expert are known on the device only
  return gq_dispatch<true>(W.fmt, p, slots, sms, s);
}

// =================================================================================================
// GEMV v4 (docs/cuda-notes.md, "GEMV v4: design and predictions"): long-lived blocks with a cp.async
// ring, M ≤ 32.
//
// * Same chunk geometry and fragment mapping as v3 (a chunk = one 16-byte load per thread per row; lane
//   (g, t) loads rows g and g + 8 of each of the block's two 16-row tiles; x staged as bf16 in B order).
// * A block's work is a sequence of jobs (row group rg, batch b): warp w handles chunk c = w + 8·b of the
//   block's K-slice. Every thread copies its own 16-byte pieces of the next S − 1 jobs into a
//   shared-memory ring with cp.async (zero-filled when out of range) and reads back only what it copied
//   itself (the scale words, copied by one lane each, are shared within the warp: __syncwarp after the
//   wait). No block barrier in the stream of loads; the loads of later row groups stay in flight across
//   a row group's reduction.
// * The grid is one resident wave (SMs · blocks an SM / cluster size; cudaOccupancyMaxActiveClusters
//   for clusters of ≥ 4 when residency caps the grid; both from the caller's GemvPlan when given, else
//   queried on the call): each block loops over row groups rg = blockIdx.x + i·gridDim.x.
// * M ≤ 32: up to four n8 column groups (x rows 8j..8j+7) share each dequantized A fragment.
// * K-slice ≤ 2048 a cluster rank (x of 32 rows = 128 KiB), cluster ≤ 8 ranks: K ≤ 16384. fp4 needs
//   K % 128 == 0 (its four scale bytes of a row and chunk are one aligned word). Other shapes go to v3.
//
// Batch invariance: for each output, the MMA chain runs over chunks c = w, w + 8, … in order (warp w),
// then warps 0..7 and cluster ranks 0..CS−1 are added in order; CS and the K-slice depend only on
// (format, N, K, SM count). Column j of an MMA depends only on x row j; the ring depth, the grid, the
// number of column groups and the run grouping do not change any summation. So a row's result is
// bitwise the same for every M ≤ 32 (and in launches of 32 beyond), and a slot's is gemv_q of its row.
namespace {
constexpr int G4_WARPS = 8, G4_NT = G4_WARPS * 32, G4_RT = 2;
constexpr int G4_KSLICE = 2048;                          // max k per cluster rank
constexpr int G4_MAXM = 32;                              // rows a launch (4 column groups)
constexpr int G4_MAXCS = 8;                              // cluster ranks (portable limit)
constexpr int G4_STAGE_W = G4_WARPS * G4_RT * 2 * 32;    // uint4 a ring stage: 16 KiB of weights
constexpr int G4_STAGE_S = G4_WARPS * 32;                // u32 scale words a stage (1 KiB)
constexpr size_t G4_STAGE_BYTES = (size_t)G4_STAGE_W * 16 + (size_t)G4_STAGE_S * 4;
constexpr int G4_MAXS = 12;                              // ring stages at most

struct G4Params {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  const uint8_t* ws;
  int64_t ldws, w_stride, s_stride;
  int64_t N, K;
  float* y;
  int64_t ldy;
  int M;               // dense: rows of x / y (≤ 32)
  const int32_t* sel;  // grouped: sel[slots]
  int slots, topk, x_per_slot;
  int fuse;
  int64_t I;
  float lim;
  int kslice, row_groups, mmr, stages;  // mmr: rows allocated in the x staging = run cap (grouped)
};

using detail::smem_u32, detail::cp_async16_zfill, detail::cp_async4_zfill, detail::cp_async_commit, detail::cp_async_wait;
// wait until at most n groups are pending (n ≥ 11 waits for 11: stricter, still correct)
__device__ __forceinline__ void cp_wait_dyn(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    case 8: cp_async_wait<8>(); break;
    case 9: cp_async_wait<9>(); break;
    case 10: cp_async_wait<10>(); break;
    default: cp_async_wait<11>(); break;
  }
}

// x rows → shared memory as in fill_x (same unit order), rows flattened with k; eight units a thread
// loaded before any is converted (64 KiB of x in flight a block: M = 32 stages 256 KiB in 4 round trips).
template <WFmt WF>
__device__ __forceinline__ void fill_x4(uint4* xs, const float* __restrict__ x, const int64_t* xoff, int rows, int mmr,
                                        int64_t kbase, int kpad, int64_t K) {
  constexpr int NQ = GqFmt<WF>::NQ, B = 8;
  const int units = kpad / 8, total = rows * units;
  for (int i0 = threadIdx.x; i0 < total; i0 += B * G4_NT) {
    float4 a[B], b[B];
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int idx = i0 + i * G4_NT;
      a[i] = b[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (idx < total) {
        const int m = idx / units, u = idx - m * units;
        const int64_t k = kbase + (int64_t)u * 8;
        if (k < K) {
          const float* xr = x + xoff[m] + k;
          a[i] = *reinterpret_cast<const float4*>(xr), b[i] = *reinterpret_cast<const float4*>(xr + 4);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int idx = i0 + i * G4_NT;
      if (idx < total) {
        const int m = idx / units, u = idx - m * units;
        uint4 o;
        if constexpr (WF == WFmt::FP4_B32) {
          o = make_uint4(pack_bf16(a[i].x, b[i].x), pack_bf16(a[i].y, b[i].y), pack_bf16(a[i].z, b[i].z),
                         pack_bf16(a[i].w, b[i].w));
        } else {
          o = make_uint4(pack_bf16(a[i].x, a[i].y), pack_bf16(a[i].z, a[i].w), pack_bf16(b[i].x, b[i].y),
                         pack_bf16(b[i].z, b[i].w));
        }
        const int c = u / (4 * NQ), rem = u % (4 * NQ), t = rem / NQ, q = rem % NQ;
        xs[((c * NQ + q) * mmr + m) * 4 + t] = o;
      }
    }
  }
}

template <WFmt WF, bool GROUPED>
__global__ void __launch_bounds__(G4_NT, 2) gemv4_kernel(const G4Params p) {
  DI_PDL_WAIT();
  constexpr int VPT = GqFmt<WF>::VPT, NQ = GqFmt<WF>::NQ, CK = GqFmt<WF>::CK;
  extern __shared__ uint4 g4_smem[];
  __shared__ int64_t s_xoff[G4_MAXM], s_yoff[G4_MAXM];
  __shared__ int s_rows;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank(), CS = (int)cluster.num_blocks();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int mmr = p.mmr, S = p.stages;

  const uint8_t* wb = p.w;
  const uint8_t* sb = p.ws;
  if constexpr (GROUPED) {
    // The first slot of each run of ≤ mmr occurrences of expert e (slot order) computes the run; the
    // other slots' clusters leave (the cluster shares blockIdx.z).
    const int s = blockIdx.z, e = p.sel[s];
    int before = 0;
    for (int j = 0; j < s; ++j) before += p.sel[j] == e;
    if (before % mmr) return;
    if (tid == 0) {
      int r = 0;
      for (int j = s; j < p.slots && r < mmr; ++j)
        if (p.sel[j] == e) {
          s_xoff[r] = (int64_t)(p.x_per_slot ? j : j / p.topk) * p.ldx;
          s_yoff[r] = (int64_t)j * p.ldy;
          ++r;
        }
      s_rows = r;
    }
    wb += (int64_t)e * p.w_stride;
    if (sb) sb += (int64_t)e * p.s_stride;
  } else {
    if (tid < G4_MAXM) s_xoff[tid] = tid * p.ldx, s_yoff[tid] = tid * p.ldy;
    if (tid == 0) s_rows = p.M;
  }
  if (!sb) sb = wb;  // bf16: never read; a valid address for the zero-size copies

  const int64_t K = p.K, N = p.N;
  const int64_t kbase = (int64_t)rank * p.kslice;
  const int klen = (int)max((int64_t)0, min((int64_t)p.kslice, K - kbase));
  const int nch = (klen + CK - 1) / CK;
  const int nbat = max(1, (nch + G4_WARPS - 1) / G4_WARPS);  // jobs a row group (same for all warps)
  const int gx = (int)gridDim.x, bx = (int)blockIdx.x;
  const int nrg = bx < p.row_groups ? (p.row_groups - bx + gx - 1) / gx : 0;  // row groups bx, bx + gx, …
  const int njobs = nrg * nbat;
  auto tile_row = [&](int rg, int rt) -> int64_t {
    return p.fuse ? rt * p.I + (int64_t)rg * 16 : (int64_t)rg * (16 * G4_RT) + rt * 16;
  };

  uint4* xs = g4_smem;
  uint4* ringw = xs + (size_t)(p.kslice / 8) * mmr;
  uint32_t* rings = reinterpret_cast<uint32_t*>(ringw + (size_t)S * G4_STAGE_W);
  float* red = reinterpret_cast<float*>(rings + (size_t)S * G4_STAGE_S);

  // Job q's loads into ring stage q % S; one commit group a job (empty beyond the last job).
  auto issue = [&](int q) {
    if (q < njobs) {
      const int rg = (int)blockIdx.x + (q / nbat) * (int)gridDim.x, b = q % nbat, st = q % S;
      const int c = warp + G4_WARPS * b;
      const bool cok = c < nch;
      const int64_t kc = kbase + (int64_t)c * CK, kk = kc + t * VPT;
      uint4* wd = ringw + (size_t)st * G4_STAGE_W + warp * (G4_RT * 2 * 32) + lane;
#pragma unroll
      for (int rt = 0; rt < G4_RT; ++rt) {
        const int64_t trow = tile_row(rg, rt);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t n = trow + g + 8 * h;
          const bool ok = cok && kk < K && n < N;
          cp_async16_zfill(smem_u32(wd + (rt * 2 + h) * 32), ok ? (const void*)wrow_ptr<WF>(wb, n, K, kk) : (const void*)wb,
               ok ? 16 : 0);
        }
      }
      uint32_t* sd = rings + (size_t)st * G4_STAGE_S + warp * 32 + lane;
      if constexpr (WF == WFmt::FP8_B128) {
        if (lane < G4_RT) {  // lane rt: the tile's 128×128 block scale for this chunk (one 128-k block)
          const int64_t trow = tile_row(rg, lane);
          const bool ok = cok && trow < N;
          cp_async4_zfill(smem_u32(sd), ok ? (const void*)(sb + ((trow / 128) * p.ldws + kc / 128) * 4) : (const void*)sb,
              ok ? 4 : 0);
        }
      } else if constexpr (WF == WFmt::FP4_B32) {
        // lane L: row L % 16 of tile L / 16, its 4 e8m0 bytes of the chunk (byte t for thread t)
        const int64_t n = tile_row(rg, lane >> 4) + (lane & 15);
        const bool ok = cok && n < N;
        cp_async4_zfill(smem_u32(sd), ok ? (const void*)(sb + n * (K / 32) + kc / 32) : (const void*)sb, ok ? 4 : 0);
      }
    }
    cp_async_commit();
  };

  for (int q = 0; q < S - 1; ++q) issue(q);  // weight loads in flight while x is staged
  __syncthreads();                           // s_xoff, s_rows
  const int rows = s_rows, ncg = (rows + 7) / 8;
  const int REDN = G4_RT * ncg * 128;  // a block's outputs of one row group: [RT][ncg][4][32]
  // [2][REDN] block sums (double buffered: read remotely), after the warps' buffer [8][RT][≤ 2][128]
  float* part = red + G4_WARPS * G4_RT * (ncg > 2 ? 2 : ncg) * 128;
  fill_x4<WF>(xs, p.x, s_xoff, rows, mmr, kbase, nch * CK, K);
  __syncthreads();

  float acc[G4_RT][4][4];
#pragma unroll
  for (int rt = 0; rt < G4_RT; ++rt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[rt][j][r] = 0.0f;

  for (int q = 0; q < njobs; ++q) {
    __syncwarp();  // the warp's reads of stage (q − 1) % S are done before it is refilled
    issue(q + S - 1);
    cp_wait_dyn(S - 1);  // job q's group has landed (this thread's copies)
    __syncwarp();        // … and the scale words other lanes copied
    const int b = q % nbat, st = q % S, c = warp + G4_WARPS * b;
    if (c < nch) {  // warp-uniform
      const uint4* wsrc = ringw + (size_t)st * G4_STAGE_W + warp * (G4_RT * 2 * 32) + lane;
      uint4 wv[G4_RT][2];
#pragma unroll
      for (int rt = 0; rt < G4_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[rt][h] = wsrc[(rt * 2 + h) * 32];
      const uint32_t* ssrc = rings + (size_t)st * G4_STAGE_S + warp * 32;
      const uint4* xb = xs + (size_t)c * NQ * mmr * 4 + g * 4 + t;  // + (q·mmr + 8j)·4
      auto xload = [&](int qq, int j) -> uint4 {
        return 8 * j + g < rows ? xb[(qq * mmr + 8 * j) * 4] : make_uint4(0, 0, 0, 0);
      };
      if constexpr (WF == WFmt::BF16) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j >= ncg) break;
          const uint4 X = xload(0, j);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int rt = 0; rt < G4_RT; ++rt)
              mma16816(acc[rt][j], u4get(wv[rt][0], 2 * i), u4get(wv[rt][1], 2 * i), u4get(wv[rt][0], 2 * i + 1),
                       u4get(wv[rt][1], 2 * i + 1), u4get(X, 2 * i), u4get(X, 2 * i + 1));
        }
      } else if constexpr (WF == WFmt::FP8_B128) {
        // value·2^-120 × bf16(2^120·s), or × 2^60 × bf16(2^60·s) when s > 2^7 (warp-uniform: one scale a tile)
        uint32_t m1[G4_RT], m2[G4_RT];
        bool big[G4_RT];
#pragma unroll
        for (int rt = 0; rt < G4_RT; ++rt) {
          const float s = __uint_as_float(ssrc[rt]);
          big[rt] = s > 128.0f;
          m1[rt] = big[rt] ? pow2_bf16x2(60) : pack_bf16(s * 0x1p120f, s * 0x1p120f);
          m2[rt] = pack_bf16(s * 0x1p60f, s * 0x1p60f);
        }
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {
          uint32_t A[G4_RT][2][4];
#pragma unroll
          for (int rt = 0; rt < G4_RT; ++rt)
#pragma unroll
            for (int ii = 0; ii < 2; ++ii) {
              const int i = 2 * qq + ii;
              uint32_t a0, a1, a2, a3;
              e4m3x4_raw(u4get(wv[rt][0], i), a0, a2);
              e4m3x4_raw(u4get(wv[rt][1], i), a1, a3);
              a0 = bmul2(a0, m1[rt]), a1 = bmul2(a1, m1[rt]), a2 = bmul2(a2, m1[rt]), a3 = bmul2(a3, m1[rt]);
              if (big[rt])
                a0 = bmul2(a0, m2[rt]), a1 = bmul2(a1, m2[rt]), a2 = bmul2(a2, m2[rt]), a3 = bmul2(a3, m2[rt]);
              A[rt][ii][0] = a0, A[rt][ii][1] = a1, A[rt][ii][2] = a2, A[rt][ii][3] = a3;
            }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j >= ncg) break;
            const uint4 X = xload(qq, j);
#pragma unroll
            for (int ii = 0; ii < 2; ++ii)
#pragma unroll
              for (int rt = 0; rt < G4_RT; ++rt)
                mma16816(acc[rt][j], A[rt][ii][0], A[rt][ii][1], A[rt][ii][2], A[rt][ii][3], u4get(X, 2 * ii),
                         u4get(X, 2 * ii + 1));
          }
        }
      } else {
        // value·2^-126 × 2^(b−1); b > 128 needs a second factor 2^(b−128) (the branch is warp-uniform)
        uint32_t m1[G4_RT][2], m2[G4_RT][2];
        bool big[G4_RT];
#pragma unroll
        for (int rt = 0; rt < G4_RT; ++rt) {
          int e[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) e[h] = (int)((ssrc[rt * 16 + g + 8 * h] >> (8 * t)) & 0xFFu) - 1;
          big[rt] = __any_sync(0xffffffffu, max(e[0], e[1]) > 127);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            m1[rt][h] = pow2_bf16x2(min(e[h], 127)), m2[rt][h] = pow2_bf16x2(max(e[h] - 127, 0));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t r0[G4_RT][4], r1[G4_RT][4];
#pragma unroll
          for (int rt = 0; rt < G4_RT; ++rt) {
            e2m1x8_raw(u4get(wv[rt][0], i), r0[rt]);
            e2m1x8_raw(u4get(wv[rt][1], i), r1[rt]);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj)
              r0[rt][jj] = bmul2(r0[rt][jj], m1[rt][0]), r1[rt][jj] = bmul2(r1[rt][jj], m1[rt][1]);
            if (big[rt]) {
#pragma unroll
              for (int jj = 0; jj < 4; ++jj)
                r0[rt][jj] = bmul2(r0[rt][jj], m2[rt][0]), r1[rt][jj] = bmul2(r1[rt][jj], m2[rt][1]);
            }
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j >= ncg) break;
            const uint4 X = xload(i, j);
#pragma unroll
            for (int rt = 0; rt < G4_RT; ++rt) {
              mma16816(acc[rt][j], r0[rt][0], r1[rt][0], r0[rt][1], r1[rt][1], X.x, X.y);
              mma16816(acc[rt][j], r0[rt][2], r1[rt][2], r0[rt][3], r1[rt][3], X.z, X.w);
            }
          }
        }
      }
    }
    if (b == nbat - 1) {
      // Row group done: fixed-order reduction (warps 0..7, then cluster ranks 0..CS−1 on rank 0).
      const int i_rg = q / nbat, rg = (int)blockIdx.x + i_rg * (int)gridDim.x;
      // M > 16: the column groups go through the warps' buffer in two halves (it holds two groups).
      float* pp = part + (i_rg & 1) * REDN;
      const int halves = ncg > 2 ? 2 : 1, cgh = ncg > 2 ? 2 : ncg, REDH = G4_RT * cgh * 128;
      float* rw = red + warp * REDH;
      for (int hf = 0; hf < halves; ++hf) {
        if (hf) __syncthreads();  // the first half's sums have read the buffer
#pragma unroll
        for (int rt = 0; rt < G4_RT; ++rt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j >= ncg) break;
            const int jl = j - hf * cgh;  // this half's groups: jl ∈ [0, cgh)
            if (jl < 0 || jl >= cgh) continue;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              rw[((rt * cgh + jl) * 4 + r) * 32 + lane] = acc[rt][j][r];
              acc[rt][j][r] = 0.0f;
            }
          }
        __syncthreads();
        for (int el = tid; el < REDH; el += G4_NT) {
          const int rt = el / (cgh * 128), j = (el >> 7) % cgh + hf * cgh;
          if (j >= ncg) continue;  // (ncg = 3: the second half has one group)
          float v = red[el];
#pragma unroll
          for (int w = 1; w < G4_WARPS; ++w) v += red[w * REDH + el];
          pp[((rt * ncg + j) << 7) + (el & 127)] = v;  // entry of [RT][ncg][4][32]
        }
      }
      if (CS > 1) {
        cluster.sync();
        if (rank == 0)
          for (int e = tid; e < REDN; e += G4_NT) {
            float v = pp[e];
            for (int r = 1; r < CS; ++r) v += cluster.map_shared_rank(pp, r)[e];
            pp[e] = v;
          }
      }
      if (rank == 0) {
        __syncthreads();
        // entry e of [RT][ncg][4][32]: lane (gg, tt), register r → row gg + 8·(r / 2), column 8j + 2·tt + r % 2
        const int hsz = ncg * 128;  // entries of one tile
        if (!p.fuse) {
          for (int e = tid; e < REDN; e += G4_NT) {
            const int rt = e / hsz, j = (e >> 7) % ncg, r = (e >> 5) & 3, ln = e & 31;
            const int row = (ln >> 2) + 8 * (r >> 1), col = 8 * j + 2 * (ln & 3) + (r & 1);
            const int64_t n = tile_row(rg, rt) + row;
            if (col < rows && n < N) p.y[s_yoff[col] + n] = pp[e];
          }
        } else {  // tile 0 = gate rows, tile 1 = the matching up rows
          for (int e = tid; e < hsz; e += G4_NT) {
            const int j = e >> 7, r = (e >> 5) & 3, ln = e & 31;
            const int row = (ln >> 2) + 8 * (r >> 1), col = 8 * j + 2 * (ln & 3) + (r & 1);
            const int64_t i = (int64_t)rg * 16 + row;
            if (col < rows && i < p.I) p.y[s_yoff[col] + i] = detail::swiglu_clamp_one(pp[e], pp[hsz + e], p.lim, 1.0f);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (CS > 1) cluster.sync();  // rank 0's last reads of the other ranks' shared memory
}

struct G4Plan {
  int cs, kslice;
};
// The schedule of a (format, N, K) on a device with `sms` SMs; nothing else (batch invariance).
template <WFmt WF>
G4Plan g4_plan(int64_t row_groups, int64_t K, int sms) {
  constexpr int CK = GqFmt<WF>::CK;
  int cs = 1;
  while ((int64_t)cs * G4_KSLICE < K) cs *= 2;
  // small N: split K further (≥ 2 blocks an SM) while every warp keeps ≥ one chunk
  while (cs < G4_MAXCS && row_groups * cs < 2 * (int64_t)sms && cdiv(cdiv(K, 2 * cs), CK) >= G4_WARPS) cs *= 2;
  return {cs, (int)(cdiv(cdiv(K, cs), CK) * CK)};
}

// x staging + the warps' reduction buffer (≤ 2 column groups) + the double-buffered block sums
constexpr size_t g4_base_bytes(int kslice, int mmr) {
  const int ncg = (mmr + 7) / 8, cgh = ncg > 2 ? 2 : ncg;
  return (size_t)kslice * 2 * mmr + (size_t)(G4_WARPS * cgh + 2 * ncg) * G4_RT * 128 * sizeof(float);
}
constexpr size_t G4_SMEM_2 = 114688;  // dynamic shared memory of a block when two share an SM
constexpr size_t G4_SMEM_1 = 231424;  // one block an SM (227 KiB opt-in, less the static part)

bool g4_ok(const WeightRef& W, int64_t K) {
  const int64_t q = W.fmt == WFmt::BF16 ? 8 : 128;  // fp4: 128 for the aligned scale words
  return K > 0 && K % q == 0 && K <= (int64_t)G4_MAXCS * G4_KSLICE &&
         (W.fmt == WFmt::BF16 || reinterpret_cast<uintptr_t>(W.scale) % 4 == 0);
}

// A launch's shape: schedule (cs, kslice; from fmt, N, K, SMs) and ring / residency (from mmr).
struct G4Launch {
  int cs, kslice, stages, bps;
  size_t smem;
};
template <WFmt WF>
G4Launch g4_config(int64_t row_groups, int64_t K, int mmr, int sms) {
  const G4Plan pl = g4_plan<WF>(row_groups, K, sms);
  G4Launch L{pl.cs, pl.kslice, 0, 0, 0};
  const size_t base = g4_base_bytes(pl.kslice, mmr);
  if (base + 4 * G4_STAGE_BYTES <= G4_SMEM_2) {
    L.bps = 2, L.stages = (int)std::min<size_t>(8, (G4_SMEM_2 - base) / G4_STAGE_BYTES);
  } else {
    L.bps = 1, L.stages = (int)std::min<size_t>(G4_MAXS, (G4_SMEM_1 - base) / G4_STAGE_BYTES);
  }
  L.smem = base + (size_t)std::max(L.stages, 0) * G4_STAGE_BYTES;
  return L;
}
cudaLaunchConfig_t g4_cfg(const G4Launch& L, cudaLaunchAttribute* at, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(G4_NT, 1, 1);
  cfg.dynamicSmemBytes = L.smem;
  cfg.stream = s;
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = (unsigned)L.cs;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cfg;
}
// Clusters of this launch shape resident at once (runtime's answer; 0 when it has none).
template <WFmt WF, bool GROUPED>
int g4_resident_clusters(const G4Launch& L) {
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t cfg = g4_cfg(L, at, nullptr);
  cfg.gridDim = dim3(1, (unsigned)L.cs, 1);
  int q = 0;
  if (cudaOccupancyMaxActiveClusters(&q, gemv4_kernel<WF, GROUPED>, &cfg) != cudaSuccess || q <= 0) {
    cudaGetLastError();
    return 0;
  }
  return q;
}
int log2_pow2(int m) {
  int i = 0;
  while ((1 << i) < m) ++i;
  return i;
}

// (the kernel's attributes, set by init_kernel_attributes: max dynamic shared memory G4_SMEM_1, carveout
// 100 % shared so that two blocks of ≤ 112 KiB fit an SM; the weights bypass L1)
template <WFmt WF, bool GROUPED>
cudaError_t g4_launch(G4Params p, int64_t z, int64_t z_est, int sms, const GemvPlan* plan, cudaStream_t s) {
  const G4Launch L = g4_config<WF>(p.row_groups, p.K, p.mmr, sms);
  if (L.stages < 2) return cudaErrorInvalidValue;  // (cannot happen: base ≤ 168 KiB)
  p.kslice = L.kslice;
  p.stages = L.stages;
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t cfg = g4_cfg(L, at, s);
  // One resident wave: the clusters that fit at once, shared among the (estimated) active z slices.
  // A GPC has an even number of SMs, so SMs·blocks/CS is exact for CS ≤ 2. For CS ≥ 4 some block slots
  // of a GPC may hold no whole cluster: ask the runtime (or the plan, which asked once), but only when
  // the grid would be capped by residency (large N; small N launches one cluster a row group anyway).
  int clusters = std::max(1, L.bps * sms / L.cs);
  if (L.cs > 2 && (int64_t)p.row_groups * std::max<int64_t>(1, z_est) > clusters) {
    const int q = plan && plan->sms > 0 ? plan->clusters[log2_pow2(p.mmr)] : g4_resident_clusters<WF, GROUPED>(L);
    if (q > 0) clusters = std::min(clusters, q);
  }
  const int64_t gx = std::min<int64_t>(p.row_groups, std::max<int64_t>(1, clusters / std::max<int64_t>(1, z_est)));
  cfg.gridDim = dim3((unsigned)gx, (unsigned)L.cs, (unsigned)z);
  return cudaLaunchKernelEx(&cfg, gemv4_kernel<WF, GROUPED>, p);
}

// The plan's resident clusters per mmr (only where a launch may ask: cluster size ≥ 4).
template <WFmt WF, bool GROUPED>
void g4_plan_clusters(int64_t row_groups, int64_t K, int sms, GemvPlan* pl) {
  for (int i = 0; i < 6; ++i) {
    const G4Launch L = g4_config<WF>(row_groups, K, 1 << i, sms);
    pl->clusters[i] = L.cs > 2 && L.stages >= 2 ? g4_resident_clusters<WF, GROUPED>(L) : 0;
  }
}

template <bool GROUPED>
cudaError_t g4_dispatch(WFmt f, const G4Params& p, int64_t z, int64_t z_est, int sms, const GemvPlan* plan,
                        cudaStream_t s) {
  switch (f) {
    case WFmt::BF16: return g4_launch<WFmt::BF16, GROUPED>(p, z, z_est, sms, plan, s);
    case WFmt::FP8_B128: return g4_launch<WFmt::FP8_B128, GROUPED>(p, z, z_est, sms, plan, s);
    default: return g4_launch<WFmt::FP4_B32, GROUPED>(p, z, z_est, sms, plan, s);
  }
}
int pow2_ceil(int64_t m) {
  int r = 1;
  while (r < m) r *= 2;
  return r;
}
}  // namespace

int gemv_q_rows(WeightRef W, int64_t K) { return g4_ok(W, K) ? G4_MAXM : 8; }

namespace {
// gemv_q, and with swiglu gemv_q_grouped's fused epilogue (see gemv_v3_dense)
cudaError_t gemv_dense(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, bool swiglu,
                       float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  if (!g4_ok(W, K))  // (fp4 K % 128 != 0, K > 16384)
    return gemv_v3_dense(x, M, K, ldx, W, N, swiglu, limit, y, ldy, s, plan);
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16)
    return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (swiglu && (N % 32 || limit <= 0.0f)) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  int sms = 0;
  if (const cudaError_t e = launch_sms(plan, W.fmt, N, K, false, &sms); e != cudaSuccess) return e;
  for (int64_t m0 = 0; m0 < M; m0 += G4_MAXM) {  // rows are independent (batch invariant): 32 at a time
    G4Params p = {};
    p.x = x + m0 * ldx, p.ldx = ldx;
    p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
    p.N = N, p.K = K, p.y = y + m0 * ldy, p.ldy = ldy;
    p.M = (int)std::min<int64_t>(G4_MAXM, M - m0);
    p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
    p.row_groups = (int)cdiv(N, 16 * G4_RT);
    p.mmr = pow2_ceil(p.M);
    const cudaError_t e = g4_dispatch<false>(W.fmt, p, 1, 1, sms, plan, s);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t gemv_q(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                   cudaStream_t s, const GemvPlan* plan) {
  return gemv_dense(x, M, K, ldx, W, N, false, 0.0f, y, ldy, s, plan);
}
cudaError_t gemv_q_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                          float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan) {
  return gemv_dense(x, M, K, ldx, W, N, true, limit, act, lda, s, plan);
}

cudaError_t gemv_q_grouped(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                           int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                           float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  if (!g4_ok(W, K) || s_stride % 4)
    return gemv_q_grouped_v3(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, s,
                             plan);
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(W.w) % 16 || w_stride % 16 ||
      topk <= 0)
    return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (swiglu && (N % 32 || limit <= 0.0f)) return cudaErrorInvalidValue;
  const int64_t slots = T * topk;
  if (slots <= 0 || N <= 0) return cudaSuccess;
  if (slots > 65535) return cudaErrorInvalidValue;
  int sms = 0;
  if (const cudaError_t e = launch_sms(plan, W.fmt, N, K, true, &sms); e != cudaSuccess) return e;
  G4Params p = {};
  p.x = x, p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.y = y, p.ldy = ldy;
  p.sel = sel, p.slots = (int)slots, p.topk = topk, p.x_per_slot = x_per_slot ? 1 : 0;
  p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
  p.row_groups = (int)cdiv(N, 16 * G4_RT);
  // A run (the slots of one expert computed together) has ≤ T rows when a token's experts are distinct
  // (moe_route; linear_groups' sel[t, g] = g); it is capped at mmr in any case.
  p.mmr = pow2_ceil(std::min<int64_t>(G4_MAXM, T));
  // active z slices (runs) ≥ topk (a token's distinct experts) and ≥ slots / mmr
  const int64_t z_est = std::max<int64_t>(topk, cdiv(slots, p.mmr));
  return g4_dispatch<true>(W.fmt, p, slots, std::min<int64_t>(z_est, slots), sms, plan, s);
}

cudaError_t gemv_q_plan(WeightRef W, int64_t N, int64_t K, bool grouped, GemvPlan* plan) {
  GemvPlan pl;
  pl.fmt = W.fmt, pl.N = N, pl.K = K, pl.grouped = grouped;
  int sms = 0;
  if (const cudaError_t e = launch_sms(nullptr, W.fmt, N, K, grouped, &sms); e != cudaSuccess) return e;
  if (g4_ok(W, K) && N > 0) {
    const int64_t rg = cdiv(N, 16 * G4_RT);
    switch (W.fmt) {
      case WFmt::BF16:
        grouped ? g4_plan_clusters<WFmt::BF16, true>(rg, K, sms, &pl) : g4_plan_clusters<WFmt::BF16, false>(rg, K, sms, &pl);
        break;
      case WFmt::FP8_B128:
        grouped ? g4_plan_clusters<WFmt::FP8_B128, true>(rg, K, sms, &pl)
                : g4_plan_clusters<WFmt::FP8_B128, false>(rg, K, sms, &pl);
        break;
      default:
        grouped ? g4_plan_clusters<WFmt::FP4_B32, true>(rg, K, sms, &pl)
                : g4_plan_clusters<WFmt::FP4_B32, false>(rg, K, sms, &pl);
    }
  }
  pl.sms = sms;
  *plan = pl;
  return cudaSuccess;
}

namespace detail {
// init_kernel_attributes' part for this file.
template <WFmt WF, bool GROUPED>
cudaError_t gemv_attrs_one() {
  return first_error({set_max_dynamic_smem(gemv_q_kernel<WF, GROUPED>, gq_smem_bytes(GQ_KSLICE, 8)),
                      set_max_dynamic_smem(gemv4_kernel<WF, GROUPED>, G4_SMEM_1),
                      cudaFuncSetAttribute(gemv4_kernel<WF, GROUPED>, cudaFuncAttributePreferredSharedMemoryCarveout, 100)});
}
cudaError_t init_attributes_gemv_q() {
  return first_error({gemv_attrs_one<WFmt::BF16, false>(), gemv_attrs_one<WFmt::BF16, true>(),
                      gemv_attrs_one<WFmt::FP8_B128, false>(), gemv_attrs_one<WFmt::FP8_B128, true>(),
                      gemv_attrs_one<WFmt::FP4_B32, false>(), gemv_attrs_one<WFmt::FP4_B32, true>()});
}
}  // namespace detail

}  // namespace deepinfer::cuda
