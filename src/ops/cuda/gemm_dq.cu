// Our own tensor-core GEMM with dequantization on load (bf16 / e4m3 128×128 / e2m1 1×32 weights,
// bf16 / e4m3 1×128 activations): tiles are converted to bf16 in shared memory, exactly (all scales
// are powers of two), and multiplied with mma.sync through WMMA, float32 accumulate. The same kernel
// runs dense and grouped (MoE experts, tiles from moe_group). First version: one shared-memory stage,
// 64×128×64 tiles, 8 warps of 32×32. The wgmma/TMA rewrite is the next step (docs/cuda-notes.md).
#include <mma.h>

#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/cuda/moe_grouped.h"

namespace deepinfer::cuda {
namespace {
using namespace nvcuda;
using detail::cdiv;

constexpr int BM = 64, BN = 128, BK = 64, LDS = BK + 8, NT = 256;
constexpr int CLD = 36;  // per-warp f32 staging, 32×32 tile

struct alignas(16) SmemTiles {
  bf16 a[BM * LDS];
  bf16 b[BN * LDS];
};
union SmemAll {
  SmemTiles t;
  float c[8][32 * CLD];
};

__device__ __forceinline__ void store8_bf16(bf16* dst, const float* v) {
  __align__(16) bf16 t[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) t[i] = __float2bfloat16_rn(v[i]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(t);
}

// Loads the A tile rows [r0, r0+BM) ∩ [.., r_end) at k0 into smem as bf16.
template <AFmt AF>
__device__ __forceinline__ void load_a(bf16* sa, const void* x, const float* xs_t, int64_t m_total, int64_t ldx,
                                       const int32_t* gather, int64_t r0, int64_t r_end, int64_t k0) {
  const int tid = threadIdx.x;
  if constexpr (AF == AFmt::BF16) {
    // 64 rows × 64 bf16 = 512 16-byte vectors, two a thread
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int v = tid + it * NT, row = v >> 3, c8 = (v & 7) * 8;
      const int64_t r = r0 + row;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < r_end) {
        const int64_t src = gather ? gather[r] : r;
        val = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(x) + src * ldx + k0 + c8);
      }
      *reinterpret_cast<uint4*>(sa + row * LDS + c8) = val;
    }
  } else {
    // 64 rows × 64 bytes = 256 vectors of 16 e4m3, one a thread
    const int row = tid >> 2, c16 = (tid & 3) * 16;
    const int64_t r = r0 + row;
    float f[16];
    if (r < r_end) {
      const int64_t src = gather ? gather[r] : r;
      const uint4 val = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(x) + src * ldx + k0 + c16);
      const float sc = xs_t[(k0 / 128) * m_total + src];
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&val);
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = detail::e4m3_to_f32(b[i]) * sc;
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = 0.0f;
    }
    store8_bf16(sa + row * LDS + c16, f);
    store8_bf16(sa + row * LDS + c16 + 8, f + 8);
  }
}

template <WFmt WF>
__device__ __forceinline__ void load_b(bf16* sb, const void* w, const void* scale, int64_t ldws, int64_t N, int64_t K,
                                       int64_t n0, int64_t k0) {
  const int tid = threadIdx.x;
  if constexpr (WF == WFmt::BF16) {
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int v = tid + it * NT, row = v >> 3, c8 = (v & 7) * 8;
      const int64_t n = n0 + row;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (n < N) val = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(w) + n * K + k0 + c8);
      *reinterpret_cast<uint4*>(sb + row * LDS + c8) = val;
    }
  } else if constexpr (WF == WFmt::FP8_B128) {
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int v = tid + it * NT, row = v >> 2, c16 = (v & 3) * 16;
      const int64_t n = n0 + row;
      float f[16];
      if (n < N) {
        const uint4 val = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w) + n * K + k0 + c16);
        const float sc = static_cast<const float*>(scale)[(n / 128) * ldws + k0 / 128];
        const uint8_t* b = reinterpret_cast<const uint8_t*>(&val);
#pragma unroll
        for (int i = 0; i < 16; ++i) f[i] = detail::e4m3_to_f32(b[i]) * sc;
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) f[i] = 0.0f;
      }
      store8_bf16(sb + row * LDS + c16, f);
      store8_bf16(sb + row * LDS + c16 + 8, f + 8);
    }
  } else {
    // FP4: 128 rows × 32 bytes (64 values); one 16-byte vector (32 values, one e8m0 scale) a thread
    const int row = tid >> 1, c32 = (tid & 1) * 32;
    const int64_t n = n0 + row;
    float f[32];
    if (n < N) {
      const uint4 val =
          *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w) + n * (K / 2) + (k0 + c32) / 2);
      const float sc = detail::e8m0_to_f32(static_cast<const uint8_t*>(scale)[n * (K / 32) + (k0 + c32) / 32]);
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&val);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        f[2 * i] = detail::e2m1_to_f32(b[i] & 0xF) * sc;
        f[2 * i + 1] = detail::e2m1_to_f32(b[i] >> 4) * sc;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) f[i] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) store8_bf16(sb + row * LDS + c32 + 8 * q, f + 8 * q);
  }
}

// One 64×128 output tile: rows [r0, r_end) (≤ 64) of the (grouped) row space, columns [n0, n0+128).
template <AFmt AF, WFmt WF>
__device__ __forceinline__ void gemm_tile(SmemAll& sm, const void* x, const float* xs_t, int64_t m_total, int64_t ldx,
                                          const int32_t* gather, int64_t r0, int64_t r_end, const void* w,
                                          const void* wscale, int64_t ldws, int64_t N, int64_t K, int64_t n0, float* y,
                                          int64_t ldy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp >> 2, wn = warp & 3;  // 2 × 4 warps, 32×32 each
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();
    load_a<AF>(sm.t.a, x, xs_t, m_total, ldx, gather, r0, r_end, k0);
    load_b<WF>(sm.t.b, w, wscale, ldws, N, K, n0, k0);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], sm.t.a + (wm * 32 + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], sm.t.b + (wn * 32 + j * 16) * LDS + kk, LDS);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  __syncthreads();  // tiles are dead: the staging area overlays them
  float* c = sm.c[warp];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::store_matrix_sync(c + i * 16 * CLD + j * 16, acc[i][j], CLD, wmma::mem_row_major);
  __syncwarp();
  const int64_t col = n0 + wn * 32 + lane;
  if (col < N) {
    for (int rr = 0; rr < 32; ++rr) {
      const int64_t r = r0 + wm * 32 + rr;
      if (r < r_end) y[r * ldy + col] = c[rr * CLD + lane];
    }
  }
}

template <AFmt AF, WFmt WF>
__global__ void __launch_bounds__(NT) gemm_dq_kernel(const void* x, const float* xs_t, int64_t M, int64_t ldx,
                                                     const void* w, const void* ws, int64_t ldws, int64_t N,
                                                     int64_t K, float* y, int64_t ldy) {
  DI_PDL_WAIT();
  __shared__ SmemAll sm;
  const int64_t n0 = (int64_t)blockIdx.x * BN, r0 = (int64_t)blockIdx.y * BM;
  gemm_tile<AF, WF>(sm, x, xs_t, M, ldx, nullptr, r0, min(r0 + BM, M), w, ws, ldws, N, K, n0, y, ldy);
}

template <WFmt WF>
__global__ void __launch_bounds__(NT) gemm_grouped_kernel(const bf16* x, int64_t ldx, const int32_t* gather,
                                                          int64_t K, const uint8_t* w, const uint8_t* ws, int64_t ldws,
                                                          int64_t w_stride, int64_t s_stride, int64_t N,
                                                          const int2* tile_info, const int32_t* n_tiles,
                                                          const int32_t* offsets, float* y, int64_t ldy,
                                                          bool small_to_gemv) {
  DI_PDL_WAIT();
  __shared__ SmemAll sm;
  if ((int)blockIdx.y >= *n_tiles) return;
  const int2 t = tile_info[blockIdx.y];
  const int e = t.x;
  const int64_t r0 = t.y, r_end = min((int64_t)t.y + BM, (int64_t)offsets[e + 1]);
  if (small_to_gemv && r_end - r0 <= 4) return;  // gemv_grouped_kernel's
  const int64_t n0 = (int64_t)blockIdx.x * BN;
  gemm_tile<AFmt::BF16, WF>(sm, x, nullptr, 0, ldx, gather, r0, r_end, w + e * w_stride,
                            ws ? ws + e * s_stride : nullptr, ldws, N, K, n0, y, ldy);
}

// ---- decode path (M ≤ 4): warp-per-output-row GEMV streaming W with 16-byte loads; x dequantized to
// f32 in shared memory. v1 sent M = 1 through the 64×128 tile kernel: N/128 blocks, 97 µs for a
// 1024×4096 weight. Each output is one fixed-order chain per lane then a fixed butterfly, whatever M.
constexpr int GV_WARPS = 8;

template <WFmt WF>
__device__ __forceinline__ void gv_weights(const void* w, const void* ws, int64_t ldws, int64_t K, int64_t n, int64_t k,
                                           float* f) {
  if constexpr (WF == WFmt::BF16) {  // 8 values
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(w) + n * K + k));
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __bfloat1622float2(b2[i]);
      f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
  } else if constexpr (WF == WFmt::FP8_B128) {  // 16 values
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w) + n * K + k));
    const float sc = static_cast<const float*>(ws)[(n / 128) * ldws + k / 128];
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = detail::e4m3_to_f32(b[i]) * sc;
  } else {  // 32 values
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w) + n * (K / 2) + k / 2));
    const float sc = detail::e8m0_to_f32(static_cast<const uint8_t*>(ws)[n * (K / 32) + k / 32]);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      f[2 * i] = detail::e2m1_to_f32(b[i] & 0xF) * sc;
      f[2 * i + 1] = detail::e2m1_to_f32(b[i] >> 4) * sc;
    }
  }
}

template <AFmt AF, WFmt WF, int MM>
__global__ void __launch_bounds__(GV_WARPS * 32) gemv_kernel(const void* x, const float* xs_t, int64_t M, int64_t K,
                                                             int64_t ldx, const void* w, const void* ws, int64_t ldws,
                                                             int64_t N, float* y, int64_t ldy) {
  DI_PDL_WAIT();
  extern __shared__ float xsm[];  // [MM][K]
  for (int64_t i = threadIdx.x; i < MM * K; i += blockDim.x) {
    const int64_t m = i / K, k = i % K;
    float v = 0.0f;
    if (m < M) {
      if constexpr (AF == AFmt::BF16)
        v = __bfloat162float(static_cast<const bf16*>(x)[m * ldx + k]);
      else
        v = detail::e4m3_to_f32(static_cast<const uint8_t*>(x)[m * ldx + k]) * xs_t[(k / 128) * M + m];
    }
    xsm[i] = v;
  }
  __syncthreads();
  constexpr int VL = WF == WFmt::BF16 ? 8 : WF == WFmt::FP8_B128 ? 16 : 32;  // values a 16-byte load
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t n = (int64_t)blockIdx.x * GV_WARPS + warp; n < N; n += (int64_t)gridDim.x * GV_WARPS) {
    float acc[MM];
#pragma unroll
    for (int m = 0; m < MM; ++m) acc[m] = 0.0f;
#pragma unroll 2
    for (int64_t k = lane * VL; k < K; k += 32 * VL) {
      float f[VL];
      gv_weights<WF>(w, ws, ldws, K, n, k, f);
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        const float* xr = xsm + m * K + k;
#pragma unroll
        for (int i = 0; i < VL; i += 4) {
          const float4 xv = *reinterpret_cast<const float4*>(xr + i);
          acc[m] += f[i] * xv.x + f[i + 1] * xv.y + f[i + 2] * xv.z + f[i + 3] * xv.w;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MM; ++m) {
      const float v = detail::warp_sum(acc[m]);
      if (lane == 0 && m < M) y[m * ldy + n] = v;
    }
  }
}

template <AFmt AF, WFmt WF>
cudaError_t launch_gemv(const void* x, const float* xs_t, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N,
                        float* y, int64_t ldy, cudaStream_t s) {
  const size_t smem = (size_t)4 * K * sizeof(float);
  // (max dynamic shared memory 160 KiB for every MM: gemv_attrs, once)
  const unsigned blocks = (unsigned)std::min<int64_t>(cdiv(N, GV_WARPS), 132 * 4);
  const int T = GV_WARPS * 32;
  if (M == 1)
    gemv_kernel<AF, WF, 1><<<blocks, T, smem / 4, s>>>(x, xs_t, M, K, ldx, W.w, W.scale, W.ldws, N, y, ldy);
  else if (M == 2)
    gemv_kernel<AF, WF, 2><<<blocks, T, smem / 2, s>>>(x, xs_t, M, K, ldx, W.w, W.scale, W.ldws, N, y, ldy);
  else
    gemv_kernel<AF, WF, 4><<<blocks, T, smem, s>>>(x, xs_t, M, K, ldx, W.w, W.scale, W.ldws, N, y, ldy);
  return cudaGetLastError();
}

// Grouped decode path: tiles (experts) with ≤ 4 rows run as a GEMV over the expert's weight rows;
// tiles with more rows are left to the tile kernel (each kernel skips the other's tiles).
constexpr int GG_ROWS = 8;  // output rows a warp

template <WFmt WF>
__global__ void __launch_bounds__(GV_WARPS * 32) gemv_grouped_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                                     const int32_t* __restrict__ gather, int64_t K,
                                                                     const uint8_t* w, const uint8_t* ws, int64_t ldws,
                                                                     int64_t w_stride, int64_t s_stride, int64_t N,
                                                                     const int2* __restrict__ tile_info,
                                                                     const int32_t* __restrict__ n_tiles,
                                                                     const int32_t* __restrict__ offsets, float* y,
                                                                     int64_t ldy) {
  DI_PDL_WAIT();
  extern __shared__ float xsm[];  // [4][K]
  if ((int)blockIdx.y >= *n_tiles) return;
  const int2 t = tile_info[blockIdx.y];
  const int e = t.x;
  const int64_t r0 = t.y;
  const int rows = (int)min((int64_t)64, (int64_t)offsets[e + 1] - r0);
  if (rows > 4) return;  // the tile kernel's
  for (int64_t i = threadIdx.x; i < 4 * K; i += blockDim.x) {
    const int64_t m = i / K, k = i % K;
    float v = 0.0f;
    if (m < rows) {
      const int64_t src = gather ? gather[r0 + m] : r0 + m;
      v = __bfloat162float(x[src * ldx + k]);
    }
    xsm[i] = v;
  }
  __syncthreads();
  const uint8_t* we = w + e * w_stride;
  const uint8_t* se = ws ? ws + e * s_stride : nullptr;
  constexpr int VL = WF == WFmt::BF16 ? 8 : WF == WFmt::FP8_B128 ? 16 : 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nb = ((int64_t)blockIdx.x * GV_WARPS + warp) * GG_ROWS;
  for (int64_t n = nb; n < min(N, nb + GG_ROWS); ++n) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
    for (int64_t k = lane * VL; k < K; k += 32 * VL) {
      float f[VL];
      gv_weights<WF>(we, se, ldws, K, n, k, f);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float* xr = xsm + m * K + k;
#pragma unroll
        for (int i = 0; i < VL; i += 4) {
          const float4 xv = *reinterpret_cast<const float4*>(xr + i);
          acc[m] += f[i] * xv.x + f[i + 1] * xv.y + f[i + 2] * xv.z + f[i + 3] * xv.w;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float v = detail::warp_sum(acc[m]);
      if (lane == 0 && m < rows) y[(r0 + m) * ldy + n] = v;
    }
  }
}

template <AFmt AF>
cudaError_t launch_gemv_any(const void* x, const float* xs_t, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N,
                            float* y, int64_t ldy, cudaStream_t s) {
  switch (W.fmt) {
    case WFmt::BF16: return launch_gemv<AF, WFmt::BF16>(x, xs_t, M, K, ldx, W, N, y, ldy, s);
    case WFmt::FP8_B128: return launch_gemv<AF, WFmt::FP8_B128>(x, xs_t, M, K, ldx, W, N, y, ldy, s);
    default: return launch_gemv<AF, WFmt::FP4_B32>(x, xs_t, M, K, ldx, W, N, y, ldy, s);
  }
}

template <AFmt AF>
cudaError_t launch_dense(const void* x, const float* xs_t, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N,
                         float* y, int64_t ldy, cudaStream_t s) {
  dim3 grid((unsigned)cdiv(N, BN), (unsigned)cdiv(M, BM));
  switch (W.fmt) {
    case WFmt::BF16:
      gemm_dq_kernel<AF, WFmt::BF16><<<grid, NT, 0, s>>>(x, xs_t, M, ldx, W.w, W.scale, W.ldws, N, K, y, ldy);
      break;
    case WFmt::FP8_B128:
      gemm_dq_kernel<AF, WFmt::FP8_B128><<<grid, NT, 0, s>>>(x, xs_t, M, ldx, W.w, W.scale, W.ldws, N, K, y, ldy);
      break;
    case WFmt::FP4_B32:
      gemm_dq_kernel<AF, WFmt::FP4_B32><<<grid, NT, 0, s>>>(x, xs_t, M, ldx, W.w, W.scale, W.ldws, N, K, y, ldy);
      break;
  }
  return cudaGetLastError();
}

// ---- conversions / quantization ----
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, int64_t n, bf16* __restrict__ y) {
  DI_PDL_WAIT();
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<__nv_bfloat162*>(y + i) = a;
    *reinterpret_cast<__nv_bfloat162*>(y + i + 2) = b;
  } else {
    for (int64_t j = i; j < n; ++j) y[j] = __float2bfloat16_rn(x[j]);
  }
}

// One warp per 1×128 group, 4 values a lane.
// Activation quantization to e4m3, one warp a (row, 128-k block), lane l holding k 4l..4l+3: quant_act_fp8
// (FP8POS = false: bytes in natural order, scales k-block major sc[kb·M + m], x/sc clamped to ±448 first as [OFF]
// writes it) and moe_quant_fp8 (FP8POS: lane l's four bytes at moe_fp8_pos = 32j + 16h + 4t with t = l / 8,
// j = l / 2 % 4, h = l % 2, scales row major sc[m·K/128 + kb], no clamp: with satfinite the clamp only decides
// what a NaN becomes, and the expert path passes NaN on).
__device__ __forceinline__ float4 quant_load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 quant_load4(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
template <class T, bool FP8POS>
__global__ void quant_act_kernel(const T* __restrict__ x, int64_t M, int64_t K, int64_t ldx, uint8_t* __restrict__ q,
                                 float* __restrict__ sc) {
  DI_PDL_WAIT();
  const int64_t g = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t groups = K / 128;
  if (g >= M * groups) return;
  const int64_t m = g / groups, kb = g % groups;
  const float4 v = quant_load4(x + m * ldx + kb * 128 + lane * 4);
  const int e = detail::act_block_exp(v);  // scale 2^e
  const float s = __uint_as_float((uint32_t)(e + 127) << 23), inv = __uint_as_float((uint32_t)(127 - e) << 23);
  const float in[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float t = FP8POS ? in[i] * inv : fminf(fmaxf(in[i] * inv, -448.0f), 448.0f);
    packed |= (uint32_t)__nv_cvt_float_to_fp8(t, __NV_SATFINITE, __NV_E4M3) << (8 * i);
  }
  if constexpr (FP8POS) {
    const int t = lane >> 3, j = (lane >> 1) & 3, h = lane & 1;
    *reinterpret_cast<uint32_t*>(q + m * K + kb * 128 + 32 * j + 16 * h + 4 * t) = packed;
    if (lane == 0) sc[m * groups + kb] = s;
  } else {
    *reinterpret_cast<uint32_t*>(q + m * K + kb * 128 + lane * 4) = packed;
    if (lane == 0) sc[kb * M + m] = s;
  }
}

}  // namespace

cudaError_t f32_to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t threads = cdiv(n, 4);
  f32_to_bf16_kernel<<<(unsigned)cdiv(threads, 256), 256, 0, s>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t quant_act_fp8(const float* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc_t, cudaStream_t s) {
  if (K % 128 || ldx % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  const int64_t warps = M * (K / 128);
  quant_act_kernel<float, false><<<(unsigned)cdiv(warps * 32, 256), 256, 0, s>>>(x, M, K, ldx, q, sc_t);
  return cudaGetLastError();
}
template <class T>
static cudaError_t moe_quant_launch(const T* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc,
                                    cudaStream_t s) {
  if (M < 0 || K <= 0 || K % 128 || ldx < K || ldx % (16 / (int)sizeof(T)) ||
      reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(q) % 16)
    return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  const int64_t warps = M * (K / 128);
  quant_act_kernel<T, true><<<(unsigned)cdiv(warps * 32, 256), 256, 0, s>>>(x, M, K, ldx, q, sc);
  return cudaGetLastError();
}
cudaError_t moe_quant_fp8(const float* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc, cudaStream_t s) {
  return moe_quant_launch(x, M, K, ldx, q, sc, s);
}
cudaError_t moe_quant_fp8_bf16(const bf16* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc,
                               cudaStream_t s) {
  return moe_quant_launch(x, M, K, ldx, q, sc, s);
}

cudaError_t gemm_dq(AFmt afmt, const void* x, const float* xs_t, int64_t M, int64_t K, int64_t ldx, WeightRef W,
                    int64_t N, float* y, int64_t ldy, cudaStream_t s) {
  if (K % BK || N % 8) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  if (afmt == AFmt::FP8_V128 && !xs_t) return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (M <= 4 && 4 * K * sizeof(float) <= 160 * 1024)
    return afmt == AFmt::BF16 ? launch_gemv_any<AFmt::BF16>(x, xs_t, M, K, ldx, W, N, y, ldy, s)
                              : launch_gemv_any<AFmt::FP8_V128>(x, xs_t, M, K, ldx, W, N, y, ldy, s);
  return afmt == AFmt::BF16 ? launch_dense<AFmt::BF16>(x, xs_t, M, K, ldx, W, N, y, ldy, s)
                            : launch_dense<AFmt::FP8_V128>(x, xs_t, M, K, ldx, W, N, y, ldy, s);
}

cudaError_t gemm_grouped(const bf16* x, int64_t ldx, const int32_t* gather, int64_t K, WeightRef W, int64_t w_stride,
                         int64_t s_stride, int64_t N, const int2* tile_info, const int32_t* n_tiles, int64_t max_tiles,
                         const int32_t* offsets, float* y, int64_t ldy, cudaStream_t s) {
  if (K % BK || N % 8) return cudaErrorInvalidValue;
  if (max_tiles <= 0) return cudaSuccess;
  const auto* w = static_cast<const uint8_t*>(W.w);
  const auto* ws = static_cast<const uint8_t*>(W.scale);
  const bool gemv_ok = 4 * K * sizeof(float) <= 160 * 1024;
  dim3 grid((unsigned)cdiv(N, BN), (unsigned)max_tiles);
  dim3 ggrid((unsigned)cdiv(N, GV_WARPS * GG_ROWS), (unsigned)max_tiles);
  const size_t gsmem = 4 * K * sizeof(float);
  // (max dynamic shared memory 160 KiB: init_kernel_attributes)
  auto gv = [&](auto kern) -> cudaError_t {
    kern<<<ggrid, GV_WARPS * 32, gsmem, s>>>(x, ldx, gather, K, w, ws, W.ldws, w_stride, s_stride, N, tile_info,
                                             n_tiles, offsets, y, ldy);
    return cudaGetLastError();
  };
  cudaError_t e = cudaSuccess;
  switch (W.fmt) {
    case WFmt::BF16:
      gemm_grouped_kernel<WFmt::BF16><<<grid, NT, 0, s>>>(x, ldx, gather, K, w, ws, W.ldws, w_stride, s_stride, N,
                                                          tile_info, n_tiles, offsets, y, ldy, gemv_ok);
      if (gemv_ok) e = gv(gemv_grouped_kernel<WFmt::BF16>);
      break;
    case WFmt::FP8_B128:
      gemm_grouped_kernel<WFmt::FP8_B128><<<grid, NT, 0, s>>>(x, ldx, gather, K, w, ws, W.ldws, w_stride, s_stride, N,
                                                              tile_info, n_tiles, offsets, y, ldy, gemv_ok);
      if (gemv_ok) e = gv(gemv_grouped_kernel<WFmt::FP8_B128>);
      break;
    case WFmt::FP4_B32:
      gemm_grouped_kernel<WFmt::FP4_B32><<<grid, NT, 0, s>>>(x, ldx, gather, K, w, ws, W.ldws, w_stride, s_stride, N,
                                                             tile_info, n_tiles, offsets, y, ldy, gemv_ok);
      if (gemv_ok) e = gv(gemv_grouped_kernel<WFmt::FP4_B32>);
      break;
  }
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

namespace detail {
template <AFmt AF, WFmt WF>
cudaError_t gemv_attrs() {
  constexpr size_t b = 160 * 1024;
  return first_error({set_max_dynamic_smem(gemv_kernel<AF, WF, 1>, b), set_max_dynamic_smem(gemv_kernel<AF, WF, 2>, b),
                      set_max_dynamic_smem(gemv_kernel<AF, WF, 4>, b)});
}
cudaError_t init_attributes_gemm_dq() {
  constexpr size_t b = 160 * 1024;
  return first_error({gemv_attrs<AFmt::BF16, WFmt::BF16>(), gemv_attrs<AFmt::BF16, WFmt::FP8_B128>(),
                      gemv_attrs<AFmt::BF16, WFmt::FP4_B32>(), gemv_attrs<AFmt::FP8_V128, WFmt::BF16>(),
                      gemv_attrs<AFmt::FP8_V128, WFmt::FP8_B128>(), gemv_attrs<AFmt::FP8_V128, WFmt::FP4_B32>(),
                      set_max_dynamic_smem(gemv_grouped_kernel<WFmt::BF16>, b),
                      set_max_dynamic_smem(gemv_grouped_kernel<WFmt::FP8_B128>, b),
                      set_max_dynamic_smem(gemv_grouped_kernel<WFmt::FP4_B32>, b)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
