// Manifold-constrained hyper-connections: pre (RMS over hc·D, (2+hc)·hc mixes, sigmoid / softmax +
// Sinkhorn, collapse), post (mix back into hc streams) and the final head reduction. float32 like the
// CPU twin. hc_pre / hc_head: one block handles R rows so the fn matrix (24 × 16384 f32 = 1.5 MiB for
// V4-Flash) is read from L2 once per R rows instead of once per row.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

constexpr int NT = 256, NW = NT / 32;

template <int HC, int R, bool HEAD>
__global__ void __launch_bounds__(NT) hc_pre_kernel(const float* __restrict__ X, int64_t M, int64_t D,
                                                    const float* __restrict__ fn, const float* __restrict__ base,
                                                    const float* __restrict__ scale, int iters, float hc_eps,
                                                    float norm_eps, float* __restrict__ u, float* __restrict__ post,
                                                    float* __restrict__ comb) {
  DI_PDL_WAIT();
  constexpr int MIX = HEAD ? HC : (2 + HC) * HC;
  constexpr int NV = MIX + 1;  // mixes + sum of squares
  __shared__ float part[NW][R * NV];
  __shared__ float tot[R * NV];
  __shared__ float pre_s[R][HC];
  const int64_t W = (int64_t)HC * D;
  const int64_t m0 = (int64_t)blockIdx.x * R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float acc[R][NV];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < NV; ++k) acc[r][k] = 0.0f;

  for (int64_t i = threadIdx.x * 4; i < W; i += NT * 4) {
    float4 xv[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      xv[r] = (m0 + r < M) ? *reinterpret_cast<const float4*>(X + (m0 + r) * W + i) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r][MIX] += xv[r].x * xv[r].x + xv[r].y * xv[r].y + xv[r].z * xv[r].z + xv[r].w * xv[r].w;
#pragma unroll
    for (int k = 0; k < MIX; ++k) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(fn + (int64_t)k * W + i));
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][k] += f.x * xv[r].x + f.y * xv[r].y + f.z * xv[r].z + f.w * xv[r].w;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const float v = detail::warp_sum(acc[r][k]);
      if (lane == 0) part[warp][r * NV + k] = v;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < R * NV; t += NT) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) s += part[w][t];
    tot[t] = s;
  }
  __syncthreads();
  if (threadIdx.x < R && m0 + threadIdx.x < M) {
    const int r = threadIdx.x;
    const int64_t m = m0 + r;
    const float* mu = tot + r * NV;
    const float rr = rsqrtf(mu[MIX] / (float)W + norm_eps);
    auto sig = [](float x) { return 1.0f / (1.0f + expf(-x)); };
    for (int j = 0; j < HC; ++j) pre_s[r][j] = sig(mu[j] * rr * scale[0] + base[j]) + hc_eps;
    if constexpr (!HEAD) {
      for (int j = 0; j < HC; ++j) post[m * HC + j] = 2.0f * sig(mu[HC + j] * rr * scale[1] + base[HC + j]);
      float C[HC][HC];
      for (int j = 0; j < HC; ++j) {
        float mx = -INFINITY;
        for (int k = 0; k < HC; ++k) {
          const float v = mu[2 * HC + j * HC + k] * rr * scale[2] + base[2 * HC + j * HC + k];
          C[j][k] = v;
          mx = fmaxf(mx, v);
        }
        float s = 0.0f;
        for (int k = 0; k < HC; ++k) s += (C[j][k] = expf(C[j][k] - mx));
        for (int k = 0; k < HC; ++k) C[j][k] = C[j][k] / s + hc_eps;
      }
      auto col_norm = [&] {
        for (int k = 0; k < HC; ++k) {
          float s = 0.0f;
          for (int j = 0; j < HC; ++j) s += C[j][k];
          for (int j = 0; j < HC; ++j) C[j][k] /= (s + hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int j = 0; j < HC; ++j) {
          float s = 0.0f;
          for (int k = 0; k < HC; ++k) s += C[j][k];
          for (int k = 0; k < HC; ++k) C[j][k] /= (s + hc_eps);
        }
      };
      col_norm();
      for (int it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
      }
      for (int j = 0; j < HC; ++j)
        for (int k = 0; k < HC; ++k) comb[m * HC * HC + j * HC + k] = C[j][k];
    }
  }
  __syncthreads();
  // collapse: u[m, i] = Σ_j pre_j · X[m, j, i]
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t m = m0 + r;
    if (m >= M) break;
    const float* xr = X + m * W;
    for (int64_t i = threadIdx.x * 4; i < D; i += NT * 4) {
      float4 o = make_float4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < HC; ++j) {
        const float p = pre_s[r][j];
        const float4 v = *reinterpret_cast<const float4*>(xr + (int64_t)j * D + i);
        o.x += p * v.x, o.y += p * v.y, o.z += p * v.z, o.w += p * v.w;
      }
      *reinterpret_cast<float4*>(u + m * D + i) = o;
    }
  }
}

template <int HC>
__global__ void hc_post_kernel(const float* __restrict__ X, const float* __restrict__ y, const float* __restrict__ post,
                               const float* __restrict__ comb, int64_t M, int64_t D, float* __restrict__ out) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t D4 = D / 4;
  if (t >= M * D4) return;
  const int64_t m = t / D4, i = (t % D4) * 4;
  float4 xv[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) xv[j] = *reinterpret_cast<const float4*>(X + (m * HC + j) * D + i);
  const float4 yv = *reinterpret_cast<const float4*>(y + m * D + i);
  const float* C = comb + m * HC * HC;
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    const float pk = post[m * HC + k];
    float4 o = make_float4(pk * yv.x, pk * yv.y, pk * yv.z, pk * yv.w);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const float c = C[j * HC + k];
      o.x += c * xv[j].x, o.y += c * xv[j].y, o.z += c * xv[j].z, o.w += c * xv[j].w;
    }
    *reinterpret_cast<float4*>(out + (m * HC + k) * D + i) = o;
  }
}

// ---- hc_pre / hc_head v3: two kernels, every row's reduction order fixed by (hc, D) alone ----------
// Canonical order (batch invariance): the hc·D columns of a row are cut into S slices of L columns
// (L from hc_plan, which sees hc and D only). For each of the NV = MIX + 1 values of a row (the MIX dot
// products with fn and the sum of squares) and each slice, one fmaf chain runs over the slice's
// columns in increasing order (x, y, z, w of each float4), starting from 0. Kernel A writes these S·NV
// partials into the row's own u[m, 0 : S·NV) (u is scratch until kernel B overwrites it: S·NV ≤ D by
// construction). Kernel B (one block per row) adds them over s = 0..S−1 in order, then does the
// coefficients, the collapse into u and the Sinkhorn (16 lanes of warp 0, one matrix entry a lane).
// Which thread computes which chain differs by M (row mode / value mode below), the chains do not.
constexpr int A_NT = 128;         // kernel A block
constexpr int A_RT_ROW = A_NT;    // row mode: a thread owns one row (all NV values) → 128 rows a block
constexpr int A_RT_VAL = A_NT / 32;  // value mode: a warp owns one row, a lane one value → 4 rows a block
constexpr int B_NT = 1024;        // kernel B block (one row)
constexpr int kMaxSmem = 227 * 1024;

using detail::cp_async16, detail::cp_async_commit, detail::cp_async_wait, detail::cp_async_wait_all;
// Programmatic dependent launch (sm_90): A lets B's blocks start early; B waits for A's completion and
// memory before it reads the partials (a no-op when B was launched without the attribute).
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

template <int HC, bool HEAD>
struct HcDims {
  static constexpr int MIX = HEAD ? HC : (2 + HC) * HC;
  static constexpr int NV = MIX + 1;  // mixes + sum of squares
};

// Kernel A: block (row tile, slice s). fn[:, slice] and X[tile rows, slice] staged in shared memory
// (rows padded by 4 floats: conflict-free float4 reads with a row per lane), then the chains.
template <int HC, bool HEAD, bool ROWMODE>
__global__ void __launch_bounds__(A_NT) hc_partials_kernel(const float* __restrict__ X, int64_t M, int64_t D,
                                                           const float* __restrict__ fn, int L,
                                                           float* __restrict__ part) {
  DI_PDL_WAIT();
  constexpr int MIX = HcDims<HC, HEAD>::MIX, NV = HcDims<HC, HEAD>::NV;
  constexpr int RT = ROWMODE ? A_RT_ROW : A_RT_VAL;
  extern __shared__ float4 hc_smem4[];
  float* Fs = reinterpret_cast<float*>(hc_smem4);  // [MIX][LP]
  const int LP = L + 4;
  float* Xs = Fs + MIX * LP;  // [RT][LP]
  const int64_t K = (int64_t)HC * D;
  const int s = blockIdx.y;
  const int64_t k0 = (int64_t)s * L;
  const int len4 = (int)(min((int64_t)L, K - k0) / 4);
  const int64_t m0 = (int64_t)blockIdx.x * RT;
  const int rows = (int)min((int64_t)RT, M - m0);
  pdl_launch_dependents();
  for (int idx = threadIdx.x; idx < MIX * len4; idx += A_NT) {
    const int v = idx / len4, c = idx - v * len4;
    cp_async16(Fs + v * LP + 4 * c, fn + (int64_t)v * K + k0 + 4 * c);
  }
  for (int idx = threadIdx.x; idx < rows * len4; idx += A_NT) {
    const int r = idx / len4, c = idx - r * len4;
    cp_async16(Xs + r * LP + 4 * c, X + (m0 + r) * K + k0 + 4 * c);
  }
  cp_async_wait_all();
  __syncthreads();
  if constexpr (ROWMODE) {
    const int r = threadIdx.x;
    if (r >= rows) return;
    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[v] = 0.0f;
    const float* xr = Xs + r * LP;
    for (int c = 0; c < len4; ++c) {
      const float4 x = *reinterpret_cast<const float4*>(xr + 4 * c);
#pragma unroll
      for (int v = 0; v < MIX; ++v) {
        const float4 f = *reinterpret_cast<const float4*>(Fs + v * LP + 4 * c);  // broadcast
        acc[v] = fmaf(f.x, x.x, acc[v]);
        acc[v] = fmaf(f.y, x.y, acc[v]);
        acc[v] = fmaf(f.z, x.z, acc[v]);
        acc[v] = fmaf(f.w, x.w, acc[v]);
      }
      acc[MIX] = fmaf(x.x, x.x, acc[MIX]);
      acc[MIX] = fmaf(x.y, x.y, acc[MIX]);
      acc[MIX] = fmaf(x.z, x.z, acc[MIX]);
      acc[MIX] = fmaf(x.w, x.w, acc[MIX]);
    }
    float* o = part + (m0 + r) * D + (int64_t)s * NV;
#pragma unroll
    for (int v = 0; v < NV; ++v) o[v] = acc[v];
  } else {
    constexpr int NQ = (NV + 31) / 32;
    const int r = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (r >= rows) return;
    float acc[NQ];
    const float* fr[NQ];
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
      acc[q] = 0.0f;
      fr[q] = Fs + min(lane + 32 * q, MIX - 1) * LP;
    }
    const float* xr = Xs + r * LP;
    // unrolled (smallk): the next columns' shared-memory loads issue ahead of this column's 4 dependent
    // FMAs instead of after them (decode: 32 columns a slice on one warp); the chains are unchanged
#pragma unroll 8
    for (int c = 0; c < len4; ++c) {
      const float4 x = *reinterpret_cast<const float4*>(xr + 4 * c);  // broadcast
#pragma unroll
      for (int q = 0; q < NQ; ++q) {
        const float4 fv = *reinterpret_cast<const float4*>(fr[q] + 4 * c);
        const float4 f = (lane + 32 * q < MIX) ? fv : x;  // value MIX: the sum of squares
        acc[q] = fmaf(f.x, x.x, acc[q]);
        acc[q] = fmaf(f.y, x.y, acc[q]);
        acc[q] = fmaf(f.z, x.z, acc[q]);
        acc[q] = fmaf(f.w, x.w, acc[q]);
      }
    }
    float* o = part + (m0 + r) * D + (int64_t)s * NV;
#pragma unroll
    for (int q = 0; q < NQ; ++q)
      if (lane + 32 * q < NV) o[lane + 32 * q] = acc[q];
  }
}

__device__ __forceinline__ float hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// Per-row coefficient math shared by kernel B and the prefill finish kernel: one definition, so a row's
// bits do not depend on which of them ran it (batch invariance).
__device__ __forceinline__ float hc_rr(float sumsq, int64_t K, float norm_eps) {
  return (float)(1.0 / sqrt((double)sumsq / (double)K + (double)norm_eps));
}
__device__ __forceinline__ float hc_logit(float mu, float rr, float sc, float b) { return mu * rr * sc + b; }
// Sinkhorn on HC·HC lanes of a warp: lane gb + j·HC + k holds C[j][k] (logit in, comb out); sums in the
// CPU twin's order (k, resp. j, increasing). Every lane of the warp must call it (full-mask shuffles).
template <int HC>
__device__ __forceinline__ float hc_sinkhorn_lanes(float c, int gb, int j, int k, int iters, float hc_eps) {
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < HC; ++q) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, gb + j * HC + q));
  c = expf(c - mx);
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < HC; ++q) sum += __shfl_sync(0xffffffffu, c, gb + j * HC + q);
  c = c / sum + hc_eps;
  auto col_norm = [&] {
    float cs = 0.0f;
#pragma unroll
    for (int q = 0; q < HC; ++q) cs += __shfl_sync(0xffffffffu, c, gb + q * HC + k);
    c = c / (cs + hc_eps);
  };
  auto row_norm = [&] {
    float rs = 0.0f;
#pragma unroll
    for (int q = 0; q < HC; ++q) rs += __shfl_sync(0xffffffffu, c, gb + j * HC + q);
    c = c / (rs + hc_eps);
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  return c;
}

// Kernel B: one block per row. X is loaded before the wait on A (it does not depend on A).
template <int HC, bool HEAD>
__global__ void __launch_bounds__(B_NT) hc_finish_kernel(const float* __restrict__ X, int64_t D, int S,
                                                         const float* __restrict__ base,
                                                         const float* __restrict__ scale, int iters, float hc_eps,
                                                         float norm_eps, float* u, float* __restrict__ post,
                                                         float* __restrict__ comb) {
  DI_PDL_WAIT();
  constexpr int MIX = HcDims<HC, HEAD>::MIX, NV = HcDims<HC, HEAD>::NV;
  extern __shared__ float pbuf[];  // [S][NV]
  __shared__ float mu_s[NV];
  __shared__ float pre_s[HC];
  __shared__ float rr_s;
  const int64_t m = blockIdx.x;
  const int64_t K = (int64_t)HC * D, D4 = D / 4;
  const float* xr = X + m * K;
  float* ur = u + m * D;
  const int t = threadIdx.x;
  float4 xv[HC];
  if (t < D4) {
#pragma unroll
    for (int j = 0; j < HC; ++j) xv[j] = __ldg(reinterpret_cast<const float4*>(xr + (int64_t)j * D) + t);
  }
  pdl_wait();
  for (int i = t; i < S * NV; i += B_NT) pbuf[i] = ur[i];
  __syncthreads();  // every partial is in shared memory before any u write below
  if (t < NV) {
    float a = 0.0f;
    for (int s = 0; s < S; ++s) a += pbuf[s * NV + t];
    mu_s[t] = a;
  }
  __syncthreads();
  if (t < HC) {
    const float rr = hc_rr(mu_s[MIX], K, norm_eps);
    pre_s[t] = hc_sigmoid(hc_logit(mu_s[t], rr, scale[0], base[t])) + hc_eps;
    if (t == 0) rr_s = rr;
  }
  __syncthreads();
  float pre[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) pre[j] = pre_s[j];
  // collapse: u[m, i] = Σ_j pre_j · X[m, j, i]
  for (int64_t i4 = t; i4 < D4; i4 += B_NT) {
    if (i4 != t) {
#pragma unroll
      for (int j = 0; j < HC; ++j) xv[j] = __ldg(reinterpret_cast<const float4*>(xr + (int64_t)j * D) + i4);
    }
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      o.x = fmaf(pre[j], xv[j].x, o.x);
      o.y = fmaf(pre[j], xv[j].y, o.y);
      o.z = fmaf(pre[j], xv[j].z, o.z);
      o.w = fmaf(pre[j], xv[j].w, o.w);
    }
    reinterpret_cast<float4*>(ur)[i4] = o;
  }
  if constexpr (!HEAD) {
    if (t >= 32) return;
    const float rr = rr_s;
    const int lane = t;
    if (lane < HC) post[m * HC + lane] = 2.0f * hc_sigmoid(hc_logit(mu_s[HC + lane], rr, scale[1], base[HC + lane]));
    if constexpr (HC * HC <= 32) {
      // lane l = j·HC + k holds C[j][k]; sums in the CPU twin's order (k, resp. j, increasing)
      const bool act = lane < HC * HC;
      const int l = act ? lane : 0, j = l / HC, k = l % HC;
      const float c = hc_sinkhorn_lanes<HC>(hc_logit(mu_s[2 * HC + l], rr, scale[2], base[2 * HC + l]), 0, j, k,
                                            iters, hc_eps);
      if (act) comb[m * HC * HC + lane] = c;
    } else if (lane == 0) {  // hc > 5: serial (not a V4 shape)
      float C[HC][HC];
      for (int j = 0; j < HC; ++j) {
        float mx = -INFINITY;
        for (int k = 0; k < HC; ++k) {
          const float v = mu_s[2 * HC + j * HC + k] * rr * scale[2] + base[2 * HC + j * HC + k];
          C[j][k] = v;
          mx = fmaxf(mx, v);
        }
        float sm = 0.0f;
        for (int k = 0; k < HC; ++k) sm += (C[j][k] = expf(C[j][k] - mx));
        for (int k = 0; k < HC; ++k) C[j][k] = C[j][k] / sm + hc_eps;
      }
      auto col_norm = [&] {
        for (int k = 0; k < HC; ++k) {
          float sm = 0.0f;
          for (int j = 0; j < HC; ++j) sm += C[j][k];
          for (int j = 0; j < HC; ++j) C[j][k] /= (sm + hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int j = 0; j < HC; ++j) {
          float sm = 0.0f;
          for (int k = 0; k < HC; ++k) sm += C[j][k];
          for (int k = 0; k < HC; ++k) C[j][k] /= (sm + hc_eps);
        }
      };
      col_norm();
      for (int it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
      }
      for (int j = 0; j < HC; ++j)
        for (int k = 0; k < HC; ++k) comb[m * HC * HC + j * HC + k] = C[j][k];
    }
  }
}

// smallk finish (NV ≤ 32: hc_head, hc_pre with hc ≤ 4): hc_finish_kernel's operations in the same order,
// with less of the single row's serial tail. The partials are staged with all their loads in flight (up
// to 4 a thread); warp 0 then does everything up to the collapse: lanes < NV run the slice sums (the
// same left-to-right chains, unrolled so the shared-memory loads run ahead of the adds), the row's rr and
// pre follow on the same warp after a __syncwarp (two __syncthreads in all instead of three), and the
// Sinkhorn runs on warp 0 while the other warps do the collapse. Bitwise hc_finish_kernel.
template <int HC, bool HEAD>
__global__ void __launch_bounds__(B_NT) hc_finish2_kernel(const float* __restrict__ X, int64_t D, int S,
                                                          const float* __restrict__ base,
                                                          const float* __restrict__ scale, int iters, float hc_eps,
                                                          float norm_eps, float* u, float* __restrict__ post,
                                                          float* __restrict__ comb) {
  DI_PDL_WAIT();
  constexpr int MIX = HcDims<HC, HEAD>::MIX, NV = HcDims<HC, HEAD>::NV;
  static_assert(NV <= 32, "warp 0 holds the row's values");
  extern __shared__ float pbuf[];  // [S][NV]
  __shared__ float mu_s[NV];
  __shared__ float pre_s[HC];
  const int64_t m = blockIdx.x;
  const int64_t K = (int64_t)HC * D, D4 = D / 4;
  const float* xr = X + m * K;
  float* ur = u + m * D;
  const int t = threadIdx.x;
  float4 xv[HC];
  if (t < D4) {
#pragma unroll
    for (int j = 0; j < HC; ++j) xv[j] = __ldg(reinterpret_cast<const float4*>(xr + (int64_t)j * D) + t);
  }
  pdl_wait();
  const int n = S * NV;
  for (int i0 = 0; i0 < n; i0 += 4 * B_NT) {  // 4 loads in flight a thread, then the stores
    float pv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * B_NT + t;
      if (i < n) pv[q] = ur[i];
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * B_NT + t;
      if (i < n) pbuf[i] = pv[q];
    }
  }
  __syncthreads();  // every partial is in shared memory before any u write below
  float rr = 0.0f;
  if (t < 32) {
    if (t < NV) {
      float a = 0.0f;
#pragma unroll 16
      for (int s = 0; s < S; ++s) a += pbuf[s * NV + t];
      mu_s[t] = a;
    }
    __syncwarp();
    rr = hc_rr(mu_s[MIX], K, norm_eps);
    if (t < HC) pre_s[t] = hc_sigmoid(hc_logit(mu_s[t], rr, scale[0], base[t])) + hc_eps;
  }
  __syncthreads();
  float pre[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) pre[j] = pre_s[j];
  // collapse: u[m, i] = Σ_j pre_j · X[m, j, i]
  for (int64_t i4 = t; i4 < D4; i4 += B_NT) {
    if (i4 != t) {
#pragma unroll
      for (int j = 0; j < HC; ++j) xv[j] = __ldg(reinterpret_cast<const float4*>(xr + (int64_t)j * D) + i4);
    }
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      o.x = fmaf(pre[j], xv[j].x, o.x);
      o.y = fmaf(pre[j], xv[j].y, o.y);
      o.z = fmaf(pre[j], xv[j].z, o.z);
      o.w = fmaf(pre[j], xv[j].w, o.w);
    }
    reinterpret_cast<float4*>(ur)[i4] = o;
  }
  if constexpr (!HEAD) {
    static_assert(HC * HC <= 32, "one Sinkhorn entry a lane");
    if (t >= 32) return;
    const int lane = t;
    if (lane < HC) post[m * HC + lane] = 2.0f * hc_sigmoid(hc_logit(mu_s[HC + lane], rr, scale[1], base[HC + lane]));
    const bool act = lane < HC * HC;
    const int l = act ? lane : 0, j = l / HC, k = l % HC;
    const float c = hc_sinkhorn_lanes<HC>(hc_logit(mu_s[2 * HC + l], rr, scale[2], base[2 * HC + l]), 0, j, k,
                                          iters, hc_eps);
    if (act) comb[m * HC * HC + lane] = c;
  }
}

// ---- hc_pre prefill path ("hc_gemm"): the 25 dot products per row as a blocked pass over X ----------
// Same chains and the same order as v3 (so a row's bits match its M = 1 launch): for each (row, value)
// one thread walks all hc·D columns in increasing order, an fmaf chain restarted from 0 at every slice
// boundary (multiples of L), and adds each finished slice partial to its running total in slice order
// (v3's kernel B adds the same partials in the same order). A block owns BM rows and all columns, so fn
// is staged once per BM rows (fn re-read from L2 per block, not per row) and X is streamed once.
// Thread t: row r = t % BM, value group g = t / BM (G groups of NQ = ⌈NV / G⌉ values; for BM = 32 a
// warp is a group, so the fn loads are shared-memory broadcasts). A thread's NQ chains each advance by 4
// dependent FMAs per float4 column (≥ 16 cycles), issuing 5·NQ + 1 instructions: few rows a block
// (small M) → small NQ, more threads; 32 rows → NQ = 7, one warp per scheduler. The sum of squares is value MIX with "fn row"
// = the thread's own X row; values past NV point at the X row too and are dropped.
// Columns go through shared memory in chunks of 32 (L is a multiple of 32, so slice ends are chunk
// ends), P_ST stages deep with cp.async: (MIX + BM) rows of 32 floats, pitch 36 (8 consecutive rows
// land in distinct 16-byte bank groups). The NV totals of row m go to u[m, 0 : NV) (scratch, as in v3);
// the finish kernel turns them into pre/post/comb and overwrites u with the collapse.
constexpr int P_KT = 32, P_LP = P_KT + 4, P_ST = 8;
constexpr int F_NT = 256, F_BR = 16;  // finish kernel: 256 threads, 16 rows a block
// hc_pre would use the prefill path from here on. Measured in the model on the H200 (s4 run 5): a 4096-row
// hc_pre took 0.72 ms on this path against 0.52 ms on v3, so it is off (no M reaches this) until it wins;
// the tests still run it through hc_pre_gemm.
constexpr int64_t kGemmMinRows = INT64_MAX;

template <int HC, int BM, int G>
__global__ void __launch_bounds__(G * BM, 1) hc_gemm_kernel(const float* __restrict__ X, int64_t M, int64_t D,
                                                           const float* __restrict__ fn, int L,
                                                           float* __restrict__ tot_out) {
  DI_PDL_WAIT();
  constexpr int MIX = HcDims<HC, false>::MIX, NV = HcDims<HC, false>::NV;
  constexpr int NQ = (NV + G - 1) / G, NT = G * BM, SROWS = MIX + BM, STAGE = SROWS * P_LP;
  extern __shared__ float4 hc_smem4[];
  float* sm = reinterpret_cast<float*>(hc_smem4);  // [P_ST][MIX + BM][P_LP]
  const int64_t K = (int64_t)HC * D;
  const int nch = (int)((K + P_KT - 1) / P_KT);
  const int64_t m0 = (int64_t)blockIdx.x * BM;
  const int rows = (int)min((int64_t)BM, M - m0);
  const int t = threadIdx.x, r = t % BM, g = t / BM;
  auto load = [&](int ch) {
    if (ch < nch) {
      float* st = sm + (ch % P_ST) * STAGE;
      const int64_t c0 = (int64_t)ch * P_KT;
      const int n4 = (int)min((int64_t)P_KT, K - c0) / 4;
      for (int idx = t; idx < SROWS * (P_KT / 4); idx += NT) {
        const int row = idx / (P_KT / 4), c = idx % (P_KT / 4);
        if (c >= n4) continue;
        if (row < MIX)
          cp_async16(st + row * P_LP + 4 * c, fn + (int64_t)row * K + c0 + 4 * c);
        else if (row - MIX < rows)
          cp_async16(st + row * P_LP + 4 * c, X + (m0 + row - MIX) * K + c0 + 4 * c);
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
  };
  int foff[NQ];  // per value slot: its row in a stage
#pragma unroll
  for (int q = 0; q < NQ; ++q) {
    const int v = g * NQ + q;
    foff[q] = (v < MIX ? v : MIX + r) * P_LP;
  }
  float acc[NQ], tot[NQ];
#pragma unroll
  for (int q = 0; q < NQ; ++q) acc[q] = tot[q] = 0.0f;
#pragma unroll
  for (int i = 0; i < P_ST - 1; ++i) load(i);
  for (int ch = 0; ch < nch; ++ch) {
    cp_async_wait<P_ST - 2>();
    __syncthreads();        // chunk ch visible to all; stage (ch - 1) % P_ST free again
    load(ch + P_ST - 1);    // into the stage computed last iteration
    const float* st = sm + (ch % P_ST) * STAGE;
    const float* xs = st + (MIX + r) * P_LP;
    const int64_t cend = min((int64_t)(ch + 1) * P_KT, K);
    const int n4 = (int)(cend - (int64_t)ch * P_KT) / 4;
#pragma unroll
    for (int c = 0; c < P_KT / 4; ++c) {
      if (c < n4) {
        const float4 x = *reinterpret_cast<const float4*>(xs + 4 * c);
#pragma unroll
        for (int q = 0; q < NQ; ++q) {
          const float4 f = *reinterpret_cast<const float4*>(st + foff[q] + 4 * c);
          acc[q] = fmaf(f.x, x.x, acc[q]);
          acc[q] = fmaf(f.y, x.y, acc[q]);
          acc[q] = fmaf(f.z, x.z, acc[q]);
          acc[q] = fmaf(f.w, x.w, acc[q]);
        }
      }
    }
    if (cend % L == 0 || cend == K) {  // slice end: partial into the running total, in slice order
#pragma unroll
      for (int q = 0; q < NQ; ++q) {
        tot[q] += acc[q];
        acc[q] = 0.0f;
      }
    }
  }
  cp_async_wait_all();
  if (r < rows) {
#pragma unroll
    for (int q = 0; q < NQ; ++q)
      if (g * NQ + q < NV) tot_out[(m0 + r) * D + g * NQ + q] = tot[q];
  }
}

// Finish: F_BR rows a block. Totals → shared memory (before any u write), rr/pre per row, the collapse
// u = Σ_j pre_j·X_j over all threads (4 float4 columns a thread in flight), then post and the Sinkhorn
// on HC·HC lanes a row (2 rows a warp for hc = 3, 4).
template <int HC>
__global__ void __launch_bounds__(F_NT) hc_gemm_finish_kernel(const float* __restrict__ X, int64_t M, int64_t D,
                                                              const float* __restrict__ base,
                                                              const float* __restrict__ scale, int iters,
                                                              float hc_eps, float norm_eps, float* __restrict__ u,
                                                              float* __restrict__ post, float* __restrict__ comb) {
  DI_PDL_WAIT();
  constexpr int MIX = HcDims<HC, false>::MIX, NV = HcDims<HC, false>::NV;
  constexpr int LPR = HC * HC <= 1 ? 1 : HC * HC <= 4 ? 4 : 16, RPW = 32 / LPR;  // Sinkhorn lanes a row
  static_assert(F_NT / 32 * RPW >= F_BR, "one Sinkhorn pass covers the block's rows");
  __shared__ float mu_s[F_BR][NV];
  __shared__ float pre_s[F_BR][HC];
  __shared__ float rr_s[F_BR];
  const int64_t m0 = (int64_t)blockIdx.x * F_BR;
  const int rows = (int)min((int64_t)F_BR, M - m0);
  const int64_t K = (int64_t)HC * D, D4 = D / 4;
  const int t = threadIdx.x;
  for (int i = t; i < rows * NV; i += F_NT) mu_s[i / NV][i % NV] = u[(m0 + i / NV) * D + i % NV];
  __syncthreads();
  if (t < rows * HC) {
    const int r = t / HC, j = t % HC;
    const float rr = hc_rr(mu_s[r][MIX], K, norm_eps);
    pre_s[r][j] = hc_sigmoid(hc_logit(mu_s[r][j], rr, scale[0], base[j])) + hc_eps;
    if (j == 0) rr_s[r] = rr;
  }
  __syncthreads();
  // collapse, same fmaf order as kernel B: o = 0, then j = 0..HC-1
  constexpr int U = 4;
  const int64_t n = (int64_t)rows * D4;
  for (int64_t b = t; b < n; b += (int64_t)F_NT * U) {
    float4 xv[U][HC];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t idx = b + (int64_t)q * F_NT;
      if (idx < n) {
        const int64_t r = idx / D4, i4 = idx % D4;
#pragma unroll
        for (int j = 0; j < HC; ++j)
          xv[q][j] = __ldg(reinterpret_cast<const float4*>(X + (m0 + r) * K + (int64_t)j * D) + i4);
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t idx = b + (int64_t)q * F_NT;
      if (idx < n) {
        const int64_t r = idx / D4, i4 = idx % D4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          const float p = pre_s[r][j];
          o.x = fmaf(p, xv[q][j].x, o.x);
          o.y = fmaf(p, xv[q][j].y, o.y);
          o.z = fmaf(p, xv[q][j].z, o.z);
          o.w = fmaf(p, xv[q][j].w, o.w);
        }
        reinterpret_cast<float4*>(u + (m0 + r) * D)[i4] = o;
      }
    }
  }
  // post and Sinkhorn: row rw = warp·RPW + lane / LPR; all lanes shuffle, only live rows write
  const int lane = t & 31, rw = (t >> 5) * RPW + lane / LPR, gb = lane / LPR * LPR, l0 = lane % LPR;
  const bool live = rw < rows;
  const int rs = live ? rw : 0;
  const float rr = rr_s[rs];
  if (live && l0 < HC)
    post[(m0 + rw) * HC + l0] = 2.0f * hc_sigmoid(hc_logit(mu_s[rs][HC + l0], rr, scale[1], base[HC + l0]));
  const bool act = l0 < HC * HC;
  const int l = act ? l0 : 0, j = l / HC, k = l % HC;
  const float c = hc_sinkhorn_lanes<HC>(hc_logit(mu_s[rs][2 * HC + l], rr, scale[2], base[2 * HC + l]), gb, j, k,
                                        iters, hc_eps);
  if (live && act) comb[(m0 + rw) * HC * HC + l] = c;
}

// ---- hc_pre prefill path "hcfast": one fused, ticketed kernel (X from HBM once, again from L2) ------
// v3's operations exactly (so every row is bitwise its M = 1 row), with two changes of schedule:
// * A items (row tile of 128 rows, slice s): v3 kernel A's chains, but as a register outer product: a
//   warp owns 32 rows; lane = row group rg (8) × value group vg (4); a thread runs 4 rows × RV values
//   (+ the sum of squares of its row vg): per column quad 4 + RV + 1 LDS.128 for 4·(4·RV + 1) FFMA
//   (v3 row mode: 25 LDS.128 for 100 FFMA, shared-memory bound). The slice is staged in 4 cp.async
//   groups of 32 columns so compute on the first overlaps the rest. Partials go to u[m, s·NV + v] as in
//   v3, coalesced through shared memory; then the tile's counter is bumped.
// * F items (4 rows of a tile) replace kernel B (one 1024-thread block a row, a ~3 µs Sinkhorn tail each,
//   1 block an SM): wait for the tile's S A items, stage the rows' S·NV partials (all loads in flight),
//   sum them in slice order (one thread a (row, value), same left-to-right adds as B), rr / pre / post /
//   Sinkhorn with B's helpers, and the collapse re-reading X while it is still in L2.
// Items are taken in ticket order (atomic counter, not blockIdx): A(0), A(1), F(0), A(2), F(1), …, so an
// F item only waits on items with smaller tickets, already running (no deadlock), and a tile's X is
// re-read by its F items about one tile (8 MB) of A work later. sync[0] = ticket, sync[1 + t] = tile t's
// finished A items; zeroed by the launcher.
constexpr int Q_BM = 128, Q_FR = 4, Q_L = 128, Q_LP = Q_L + 4, Q_CH = 4;
// from here on the backend takes hcfast (predicted ≥ 2× v3 from M ≈ 512; docs/cuda-notes.md)
constexpr int64_t kHcFastMinRows = 512;

template <int HC>
struct HcFast {
  static constexpr int MIX = (2 + HC) * HC, NV = MIX + 1, RV = (MIX + 3) / 4;
  static constexpr int LPR = HC * HC <= 1 ? 1 : HC * HC <= 4 ? 4 : 16, RPW = 32 / LPR;  // Sinkhorn lanes a row
};
// F's staged partials: row pitch P ≡ NV (mod 32) makes thread t = r·NV + v read bank (t + s·NV) mod 32
__host__ __device__ inline int hcq_pitch(int S, int nv) { return S * nv + (((nv - S * nv) % 32) + 32) % 32; }
size_t hcq_smem(int mix, int S, int nv) {
  const size_t a = (size_t)(Q_BM + mix) * Q_LP * sizeof(float);
  const size_t f = (size_t)Q_FR * hcq_pitch(S, nv) * sizeof(float);
  return std::max(a, f);
}

// NT = 128: a warp owns 32 rows of the A tile (a thread 4 rows × RV values; 158 registers, 2 blocks = 8 warps an
// SM: latency-bound, s10-run8). NT = 256 (session 15): a warp owns 16 rows (a thread 2 rows × RV values), 16 warps
// an SM in the same shared memory. The chains, partial layout and F items are the same: the same bits.
template <int HC, int NT>
__global__ void __launch_bounds__(NT, 2) hc_fast_kernel(const float* __restrict__ X, int64_t M, int64_t D,
                                                          const float* __restrict__ fn,
                                                          const float* __restrict__ base,
                                                          const float* __restrict__ scale, int iters, float hc_eps,
                                                          float norm_eps, float* u, float* __restrict__ post,
                                                          float* __restrict__ comb, int* sync) {
  DI_PDL_WAIT();
  using Q = HcFast<HC>;
  constexpr int MIX = Q::MIX, NV = Q::NV, RV = Q::RV;
  extern __shared__ float4 hc_smem4[];
  float* sm = reinterpret_cast<float*>(hc_smem4);
  __shared__ int item_s;
  __shared__ float mu_s[Q_FR][NV];
  __shared__ float pre_s[Q_FR][HC];
  __shared__ float rr_s[Q_FR];
  const int64_t K = (int64_t)HC * D, D4 = D / 4;
  const int S = (int)(K / Q_L), nA = S, nF = Q_BM / Q_FR;
  const int T = (int)((M + Q_BM - 1) / Q_BM);
  const int t = threadIdx.x;
  if (t == 0) item_s = atomicAdd(sync, 1);
  __syncthreads();
  const int item = item_s;
  // ticket → (A or F, tile, index): round 0 = A(0); round r in [1, T) = A(r) then F(r − 1); round T = F(T − 1)
  bool isA;
  int tile, k;
  if (item < nA) {
    isA = true, tile = 0, k = item;
  } else {
    const int j = item - nA, r = 1 + j / (nA + nF), q = j % (nA + nF);
    if (r < T && q < nA) isA = true, tile = r, k = q;
    else isA = false, tile = r - 1, k = r < T ? q - nA : q;
  }
  const int64_t m0 = (int64_t)tile * Q_BM;
  if (isA) {
    const int rows = (int)min((int64_t)Q_BM, M - m0);
    float* Xs = sm;                  // [Q_BM][Q_LP]
    float* Fs = sm + Q_BM * Q_LP;    // [MIX][Q_LP]
    const int64_t k0 = (int64_t)k * Q_L;
    constexpr int C4 = Q_L / Q_CH / 4;  // float4 columns a chunk (8)
#pragma unroll
    for (int ch = 0; ch < Q_CH; ++ch) {
      for (int idx = t; idx < (Q_BM + MIX) * C4; idx += NT) {
        const int row = idx / C4, c = ch * C4 + idx % C4;
        if (row < Q_BM) {
          if (row < rows) cp_async16(Xs + row * Q_LP + 4 * c, X + (m0 + row) * K + k0 + 4 * c);
        } else {
          cp_async16(Fs + (row - Q_BM) * Q_LP + 4 * c, fn + (int64_t)(row - Q_BM) * K + k0 + 4 * c);
        }
      }
      cp_async_commit();
    }
    constexpr int RPT = Q_BM / (NT / 32) / 8;  // rows a thread (4 or 2)
    const int warp = t >> 5, lane = t & 31, rg = lane & 7, vg = lane >> 3;
    // the thread's rows: rbase + 8·i, i < RPT; its sum of squares: row rbase + 8·(vg % RPT), kept when vg < RPT
    const int rbase = warp * (8 * RPT) + rg;
    const float* xr = Xs + rbase * Q_LP;
    const float* xq = Xs + (rbase + 8 * (vg % RPT)) * Q_LP;
    const float* fr[RV];
#pragma unroll
    for (int j = 0; j < RV; ++j) fr[j] = Fs + min(vg * RV + j, MIX - 1) * Q_LP;
    float acc[RPT][RV], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
      for (int j = 0; j < RV; ++j) acc[i][j] = 0.0f;
    auto wait_chunk = [](int ch) {  // groups complete in order: chunk ch landed when ≤ Q_CH − 1 − ch pending
      switch (ch) {
        case 0: cp_async_wait<3>(); break;
        case 1: cp_async_wait<2>(); break;
        case 2: cp_async_wait<1>(); break;
        default: cp_async_wait<0>(); break;
      }
    };
    static_assert(Q_CH == 4, "wait_chunk");
#pragma unroll
    for (int ch = 0; ch < Q_CH; ++ch) {
      wait_chunk(ch);
      __syncthreads();
#pragma unroll 2
      for (int c = ch * C4; c < (ch + 1) * C4; ++c) {
        float4 x[RPT], f[RV];
#pragma unroll
        for (int i = 0; i < RPT; ++i) x[i] = *reinterpret_cast<const float4*>(xr + 8 * i * Q_LP + 4 * c);
#pragma unroll
        for (int j = 0; j < RV; ++j) f[j] = *reinterpret_cast<const float4*>(fr[j] + 4 * c);
        const float4 y = *reinterpret_cast<const float4*>(xq + 4 * c);
#pragma unroll
        for (int i = 0; i < RPT; ++i)
#pragma unroll
          for (int j = 0; j < RV; ++j) {  // v3's chain: fmaf(f, x, acc) over x, y, z, w
            acc[i][j] = fmaf(f[j].x, x[i].x, acc[i][j]);
            acc[i][j] = fmaf(f[j].y, x[i].y, acc[i][j]);
            acc[i][j] = fmaf(f[j].z, x[i].z, acc[i][j]);
            acc[i][j] = fmaf(f[j].w, x[i].w, acc[i][j]);
          }
        ss = fmaf(y.x, y.x, ss);
        ss = fmaf(y.y, y.y, ss);
        ss = fmaf(y.z, y.z, ss);
        ss = fmaf(y.w, y.w, ss);
      }
    }
    __syncthreads();  // every warp is done with Xs: reuse it for the partials [Q_BM][NV]
    float* Ps = sm;
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
      for (int j = 0; j < RV; ++j)
        if (vg * RV + j < MIX) Ps[(rbase + 8 * i) * NV + vg * RV + j] = acc[i][j];
    if (vg < RPT) Ps[(rbase + 8 * vg) * NV + MIX] = ss;
    __syncthreads();
    for (int idx = t; idx < rows * NV; idx += NT) {
      const int r = idx / NV, v = idx - r * NV;
      u[(m0 + r) * D + (int64_t)k * NV + v] = Ps[idx];
    }
    __threadfence();  // this thread's partials visible device-wide before the tile counter moves
    __syncthreads();
    if (t == 0) atomicAdd(sync + 1 + tile, 1);
    return;
  }
  // ---- F item: rows m0 + 4k … of tile `tile`
  const int64_t f0 = m0 + (int64_t)k * Q_FR;
  const int rows = (int)max((int64_t)0, min((int64_t)Q_FR, M - f0));
  if (rows == 0) return;
  if (t == 0) {
    const volatile int* cnt = sync + 1 + tile;
    while (*cnt < nA) __nanosleep(256);
    __threadfence();
  }
  __syncthreads();
  const int SN = S * NV, P = hcq_pitch(S, NV);
  float* Pb = sm;  // [Q_FR][P]
  for (int r = 0; r < rows; ++r) {
    const float* src = u + (f0 + r) * D;
#pragma unroll 4
    for (int i = t; i < SN; i += NT) Pb[r * P + i] = __ldcg(src + i);
  }
  __syncthreads();  // all partials read before any u write below
  if (t < rows * NV) {
    const int r = t / NV, v = t - r * NV;
    const float* pr = Pb + r * P + v;
    float a = 0.0f;
#pragma unroll 16
    for (int s = 0; s < S; ++s) a += pr[s * NV];  // B's order: from 0, slices in order
    mu_s[r][v] = a;
  }
  __syncthreads();
  if (t < rows * HC) {
    const int r = t / HC, j = t % HC;
    const float rr = hc_rr(mu_s[r][MIX], K, norm_eps);
    pre_s[r][j] = hc_sigmoid(hc_logit(mu_s[r][j], rr, scale[0], base[j])) + hc_eps;
    if (j == 0) rr_s[r] = rr;
  }
  __syncthreads();
  // post and Sinkhorn first (warps 0 … rows/RPW), B's helpers; all lanes shuffle, live rows write
  {
    constexpr int LPR = Q::LPR, RPW = Q::RPW;
    const int lane = t & 31, rw = (t >> 5) * RPW + lane / LPR, gb = lane / LPR * LPR, l0 = lane % LPR;
    if ((t >> 5) * RPW < rows) {  // warp-uniform
      const bool live = rw < rows;
      const int rs = live ? rw : 0;
      const float rr = rr_s[rs];
      if (live && l0 < HC)
        post[(f0 + rw) * HC + l0] = 2.0f * hc_sigmoid(hc_logit(mu_s[rs][HC + l0], rr, scale[1], base[HC + l0]));
      const bool act = l0 < HC * HC;
      const int l = act ? l0 : 0, j = l / HC, kk = l % HC;
      const float c = hc_sinkhorn_lanes<HC>(hc_logit(mu_s[rs][2 * HC + l], rr, scale[2], base[2 * HC + l]), gb, j,
                                            kk, iters, hc_eps);
      if (live && act) comb[(f0 + rw) * HC * HC + l] = c;
    }
  }
  // collapse, B's fmaf order (o = 0, then j = 0 … HC − 1); U float4 outputs (U·HC loads) in flight a thread
  constexpr int U = NT == 256 ? 4 : 8;  // (the same loads in flight a block; 8 at 256 threads spilled)
  const int64_t n = (int64_t)rows * D4;
  for (int64_t b = t; b < n; b += (int64_t)NT * U) {
    float4 xv[U][HC];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t idx = b + (int64_t)q * NT;
      if (idx < n) {
        const int64_t r = idx / D4, i4 = idx % D4;
#pragma unroll
        for (int j = 0; j < HC; ++j)
          xv[q][j] = __ldg(reinterpret_cast<const float4*>(X + (f0 + r) * K + (int64_t)j * D) + i4);
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t idx = b + (int64_t)q * NT;
      if (idx < n) {
        const int64_t r = idx / D4, i4 = idx % D4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          const float p = pre_s[r][j];
          o.x = fmaf(p, xv[q][j].x, o.x);
          o.y = fmaf(p, xv[q][j].y, o.y);
          o.z = fmaf(p, xv[q][j].z, o.z);
          o.w = fmaf(p, xv[q][j].w, o.w);
        }
        reinterpret_cast<float4*>(u + (f0 + r) * D)[i4] = o;
      }
    }
  }
}

// ---- hc_pre decode path "hcdec" (M ≤ 8, hc ≤ 4): one kernel instead of v3's A + B ----------------
// v3's operations exactly (so every row is bitwise its v3 / M = 1 row): block s = slice s runs kernel A's
// value-mode chains for every row (warp = row, lane = value, fmaf over the slice's columns in order from 0)
// and writes them where A does (u[m, s·NV + v]); the last M blocks to arrive (ticket in sync[0]) become the
// finishers of rows 0 … M − 1 and run kernel B's (finish2's) code for their row: partials staged in shared
// memory, slice sums in order on warp 0, rr / pre, then post + Sinkhorn on warp 0 while warps 1 … 7 do the
// collapse with B's fmaf order. What changes is the schedule:
// * the fn slice (24 × 128 f32 = 12 KB a block, constant) and base / scale are loaded before
//   griddepcontrol.wait (not .nc: ptxas would hoist the wait above .nc loads, see gemv_q_v6.cu), so in a
//   step graph with programmatic edges the 1.5 MB of fn stream from HBM over 128 SMs while the previous
//   kernel finishes; X (written by that kernel) is read after the wait;
// * no second launch, no 1024-thread block a row, no launch gap between A and B.
// sync[0] = arrivals (atomicInc wrapping at S: 0 between launches), sync[1] = generation (bumped by the last
// arrival when M > 1; the other finishers wait for it to change). Both are touched only after the wait, so
// back-to-back launches (programmatic edges) see the previous launch's final values. No co-residency needed:
// only the last M arrivals wait (on the < M blocks not yet arrived); every other block exits after arriving,
// so those can always be scheduled.
constexpr int DEC_NT = 256, DEC_MAXM = DEC_NT / 32, DEC_FQ = 4;  // 256 threads, ≤ 8 rows, ≤ 4 float4 of fn a thread
constexpr int DEC_PL = 16;         // finisher: partial loads in flight a thread (16 · 256 ≥ 128 · 25)
constexpr int DEC_SYNC_INTS = 32;  // sync[0..1] used; room to grow

// constant data, before the wait: detail::ld_early_f4 / ld_early_f32 (not .nc)
using detail::ld_early_f32, detail::ld_early_f4;
// after the wait (activations of earlier kernels, read-only here): .nc, volatile so that they stay first
__device__ __forceinline__ float4 hc_ld4_nc(const float* p) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float hc_ld_nc(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void hc_st4(float* p, float4 v) {
  asm volatile("st.global.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void hc_fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ int hc_ld_volatile(const int* p) {
  int v;
  asm volatile("ld.volatile.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void hc_st_volatile(int* p, int v) {
  asm volatile("st.volatile.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// hc_dec_kernel's collapse of row r on warps 1 … 7 (t ≥ 32): u[r, i] = Σ_j pre_j · X[r, j, i], B's fmaf order;
// U float4 outputs (U·HC loads) in flight a thread. pre_s: the row's pre weights (shared memory).
template <int HC>
__device__ __forceinline__ void hc_dec_collapse(const float* X, int64_t D, float* u, int r, int t, const float* pre_s,
                                                float* us) {
  const int64_t K = (int64_t)HC * D;
  float pre[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) pre[j] = pre_s[j];
  const float* xr = X + (int64_t)r * K;
  float* ur = u + (int64_t)r * D;
  const int64_t D4 = D / 4;
  constexpr int U = 5, CT = DEC_NT - 32;  // 5 · 224 ≥ 1024: one trip at D = 4096
  for (int64_t b = t - 32; b < D4; b += (int64_t)CT * U) {
    float4 xv[U][HC];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t i4 = b + (int64_t)q * CT;
      if (i4 < D4) {
#pragma unroll
        for (int j = 0; j < HC; ++j) xv[q][j] = __ldg(reinterpret_cast<const float4*>(xr + (int64_t)j * D) + i4);
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int64_t i4 = b + (int64_t)q * CT;
      if (i4 < D4) {
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          o.x = fmaf(pre[j], xv[q][j].x, o.x);
          o.y = fmaf(pre[j], xv[q][j].y, o.y);
          o.z = fmaf(pre[j], xv[q][j].z, o.z);
          o.w = fmaf(pre[j], xv[q][j].w, o.w);
        }
        reinterpret_cast<float4*>(ur)[i4] = o;
        if (us) reinterpret_cast<float4*>(us)[i4] = o;
      }
    }
  }
}

// rms_norm_row_256<NC> (rms_norm_reg_kernel<NC>'s row: 256 threads, thread τ the float4s at 4τ + 1024c) on warps
// 1 … 7 of the block, t ≥ 32: warp 1 also plays warp 0's threads (τ = t − 32), so each τ's sum, each warp's
// warp_sum, the 8 warp sums in order and every output are those of the 256-thread kernel: the same bits. The warp
// sums meet in red behind named barrier 1 (the 224 threads; warp 0 is elsewhere).
template <int NC>
__device__ __forceinline__ void hc_norm_row_224(const float* xr, int64_t D, const float* __restrict__ w, float eps,
                                                float* yr, float* red, int t) {
  const int wp = t >> 5, lane = t & 31;
  float4 v[NC], g[NC], v0[NC], g0[NC];
  float ss = detail::rms_norm_part<NC, 1024>(xr, D, w, t, v, g), ss0 = 0.0f;
  if (wp == 1) ss0 = detail::rms_norm_part<NC, 1024>(xr, D, w, t - 32, v0, g0);
  ss = detail::warp_sum(ss);
  if (wp == 1) ss0 = detail::warp_sum(ss0);
  if (lane == 0) {
    red[wp] = ss;
    if (wp == 1) red[0] = ss0;
  }
  asm volatile("bar.sync 1, 224;\n" ::: "memory");
  const float tot = detail::warp_sum(lane < 8 ? red[lane] : 0.0f);
  const float rs = rsqrtf(tot / (float)D + eps);
  detail::rms_norm_out<NC, 1024>(v, g, w != nullptr, rs, D, t, yr, nullptr);
  if (wp == 1) detail::rms_norm_out<NC, 1024>(v0, g0, w != nullptr, rs, D, t - 32, yr, nullptr);
}

// hc_pre_norm (session 15): with NW > 0 (D ≤ 1024) or NB > 0 (1024 < D ≤ 8192) the finisher of row r then runs
// the rms_norm kernel that cuda::rms_norm picks for the shape (rms_norm_kind) — rms_norm_warp_reg_kernel<NW>'s row on
// warp 1, or rms_norm_reg_kernel<NB>'s on warps 1-7 (hc_norm_row_224) — on u[r] (the row it just collapsed, staged
// in shared memory) into h[r] with weights nw and epsilon neps, while warp 0 runs the Sinkhorn; so the model's
// rms_norm after hc_pre is not a launch of its own (the same code, detail::rms_norm_*: the same bits).
template <int HC, int NW, int NB>
__global__ void __launch_bounds__(DEC_NT) hc_dec_kernel(const float* X, int M, int64_t D, int L,
                                                        const float* fn, const float* base,
                                                        const float* scale, int iters, float hc_eps,
                                                        float norm_eps, float* u, float* __restrict__ post,
                                                        float* __restrict__ comb, int* sync,
                                                        const float* __restrict__ nw, float neps, float* h) {
  // No DI_PDL_WAIT first: the fn slice, base and scale (constant) are requested before it (DI_PDL_WAIT below).
  constexpr int MIX = HcDims<HC, false>::MIX, NV = HcDims<HC, false>::NV;
  static_assert(NV <= 32 && HC * HC <= 32, "warp 0 holds a row's values and its Sinkhorn");
  extern __shared__ float4 hc_smem4[];
  float* sm = reinterpret_cast<float*>(hc_smem4);
  const int LP = L + 4;  // kernel A's padded rows
  float* Fs = sm;             // [MIX][LP] fn slice
  float* Xs = sm + MIX * LP;  // [M][LP] X slice
  __shared__ float mu_s[NV];
  __shared__ float pre_s[HC];
  __shared__ int tk_s;
  const int64_t K = (int64_t)HC * D;
  const int S = (int)gridDim.x, s = (int)blockIdx.x, t = (int)threadIdx.x, lane = t & 31, w = t >> 5;
  const int64_t k0 = (int64_t)s * L;
  const int len4 = (int)(min((int64_t)L, K - k0) / 4);
  // float4 t + q·DEC_NT of the slice (row v, column c): MIX · len4 ≤ DEC_FQ · DEC_NT (launcher); (v, c) stepped
  // without a division per load, so the four requests leave back to back
  float4 fv[DEC_FQ];
  int fvv[DEC_FQ], fvc[DEC_FQ];
  {
    const int qd = DEC_NT / len4, qr = DEC_NT - qd * len4;
    int v = t / len4, c = t - v * len4;
#pragma unroll
    for (int q = 0; q < DEC_FQ; ++q) {
      fvv[q] = v, fvc[q] = c;
      v += qd, c += qr;
      if (c >= len4) c -= len4, ++v;
    }
  }
#pragma unroll
  for (int q = 0; q < DEC_FQ; ++q)
    if (fvv[q] < MIX) fv[q] = ld_early_f4(fn + (int64_t)fvv[q] * K + k0 + 4 * fvc[q]);
  // what B reads of base / scale, one register each on warp 0's lanes (indices clamped, as B's lanes use them)
  float b_pre = 0.0f, b_post = 0.0f, b_comb = 0.0f, sc0 = 0.0f, sc1 = 0.0f, sc2 = 0.0f;
  if (t < 32) {
    b_pre = ld_early_f32(base + min(lane, HC - 1));
    b_post = ld_early_f32(base + HC + min(lane, HC - 1));
    b_comb = ld_early_f32(base + 2 * HC + (lane < HC * HC ? lane : 0));
    sc0 = ld_early_f32(scale), sc1 = ld_early_f32(scale + 1), sc2 = ld_early_f32(scale + 2);
  }
  const int xr0 = t / len4, xc0 = t - xr0 * len4;  // this thread's first float4 of the X slice
  DI_PDL_WAIT();
  float4 x0;  // X (written by the previous kernel): the first thing requested after the wait
  if (xr0 < M) x0 = *reinterpret_cast<const float4*>(X + xr0 * K + k0 + 4 * xc0);
  int gen = 0;
  if (t == 0) gen = hc_ld_volatile(sync + 1);  // before this block's arrival (the fence below orders it)
#pragma unroll
  for (int q = 0; q < DEC_FQ; ++q)
    if (fvv[q] < MIX) *reinterpret_cast<float4*>(Fs + fvv[q] * LP + 4 * fvc[q]) = fv[q];
  if (xr0 < M) *reinterpret_cast<float4*>(Xs + xr0 * LP + 4 * xc0) = x0;
  for (int idx = t + DEC_NT; idx < M * len4; idx += DEC_NT) {  // only where M · len4 > DEC_NT (L > 128)
    const int r = idx / len4, c = idx - r * len4;
    *reinterpret_cast<float4*>(Xs + r * LP + 4 * c) = *reinterpret_cast<const float4*>(X + r * K + k0 + 4 * c);
  }
  __syncthreads();
  if (w < M && lane < NV) {  // kernel A, value mode, NQ = 1: the same chain
    const float* fr = Fs + min(lane, MIX - 1) * LP;
    const float* xr = Xs + w * LP;
    float acc = 0.0f;
#pragma unroll 8
    for (int c = 0; c < len4; ++c) {
      const float4 x = *reinterpret_cast<const float4*>(xr + 4 * c);  // broadcast
      const float4 fq = *reinterpret_cast<const float4*>(fr + 4 * c);
      const float4 f = lane < MIX ? fq : x;  // value MIX: the sum of squares
      acc = fmaf(f.x, x.x, acc);
      acc = fmaf(f.y, x.y, acc);
      acc = fmaf(f.z, x.z, acc);
      acc = fmaf(f.w, x.w, acc);
    }
    u[(int64_t)w * D + (int64_t)s * NV + lane] = acc;
  }
  __syncthreads();
  if (t == 0) {
    // arrival (cooperative groups' grid-sync pattern: barrier, then one thread's fence releases the block's
    // partial stores and orders thread 0's read of the generation before it); atomicInc wraps the counter
    // to 0 on the last arrival, so it is 0 again for the next launch without another store
    hc_fence_acq_rel();
    const int tk = (int)atomicInc(reinterpret_cast<unsigned*>(sync), (unsigned)(S - 1));
    if (tk == S - 1) {     // the last arrival: every block's partials are released before its arrival
      hc_fence_acq_rel();  // acquire them (and release the generation store below)
      if (M > 1) hc_st_volatile(sync + 1, (int)((unsigned)gen + 1u));  // frees the other finishers
    }
    tk_s = tk;
  }
  __syncthreads();
  const int tk = tk_s;
  if (tk < S - M) return;
  const int r = tk - (S - M);  // the row this block finishes
  if (t == 0 && tk != S - 1) {
    while (hc_ld_volatile(sync + 1) == gen) __nanosleep(32);
    hc_fence_acq_rel();
  }
  __syncthreads();
  // ---- finish row r: kernel B (finish2) with the row's partials from L2
  const int n = S * NV;
  const float* pr = u + (int64_t)r * D;
  float* Pb = sm;  // [S][NV] (the chains are done with Fs / Xs)
  for (int i0 = 0; i0 < n; i0 += DEC_PL * DEC_NT) {  // DEC_PL loads in flight a thread (one round at D = 4096)
    float pv[DEC_PL];
#pragma unroll
    for (int q = 0; q < DEC_PL; ++q)  // unpredicated (index clamped into the row): with a predicate each, ptxas
      pv[q] = __ldcg(pr + min(i0 + q * DEC_NT + t, n - 1));  // ran out of predicate registers and interleaved them with the stores
#pragma unroll
    for (int q = 0; q < DEC_PL; ++q) {
      const int i = i0 + q * DEC_NT + t;
      if (i < n) Pb[i] = pv[q];
    }
  }
  __syncthreads();  // every partial of row r is in shared memory before the collapse overwrites u[r]
  float rr = 0.0f;
  if (t < 32) {
    if (t < NV) {
      float a = 0.0f;
#pragma unroll 16
      for (int s2 = 0; s2 < S; ++s2) a += Pb[s2 * NV + t];
      mu_s[t] = a;
    }
    __syncwarp();
    rr = hc_rr(mu_s[MIX], K, norm_eps);
    if (t < HC) pre_s[t] = hc_sigmoid(hc_logit(mu_s[t], rr, sc0, b_pre)) + hc_eps;
  }
  __syncthreads();
  if (t < 32) {  // post and the Sinkhorn (B's lanes), while the other warps collapse
    if (lane < HC) post[(int64_t)r * HC + lane] = 2.0f * hc_sigmoid(hc_logit(mu_s[HC + lane], rr, sc1, b_post));
    const bool act = lane < HC * HC;
    const int l = act ? lane : 0, j = l / HC, k = l % HC;
    const float c = hc_sinkhorn_lanes<HC>(hc_logit(mu_s[2 * HC + l], rr, sc2, b_comb), 0, j, k, iters, hc_eps);
    if (act) comb[(int64_t)r * HC * HC + lane] = c;
    return;
  }
  // warps 1 … 7: the collapse, then (hc_pre_norm) the norm of the row, staged in shared memory (Pb's partials are
  // summed: free), without warp 0, so the norm runs while warp 0's Sinkhorn (the longer chain) still runs
  constexpr bool NORM = NW > 0 || NB > 0;
  float* us = NORM ? sm : nullptr;
  hc_dec_collapse<HC>(X, D, u, r, t, pre_s, us);
  if constexpr (NORM) {
    __shared__ float red[32];
    asm volatile("bar.sync 1, 224;\n" ::: "memory");  // the row staged by warps 1 … 7
    if constexpr (NB > 0) hc_norm_row_224<NB>(us, D, nw, neps, h + (int64_t)r * D, red, t);
    else if (t < 64) detail::rms_norm_row_warp<NW>(us, D, nw, neps, h + (int64_t)r * D, nullptr, t - 32);
  }
}
// hc_post v2 ("hcdec"): hc_post_kernel's per-element expressions unchanged (so the same bits), launched as
// blockIdx.y = row, 64-thread blocks over the row's float4 columns: 16 blocks (SMs) for one 4096-wide row
// instead of 4, no 64-bit division for (m, i), and post / comb read up front with X and y, so every load
// of a thread is in flight at once.
constexpr int POST_NT = 64;
template <int HC>
__global__ void __launch_bounds__(POST_NT, 8) hc_post2_kernel(const float* __restrict__ X, const float* __restrict__ y,
                                                           const float* __restrict__ post,
                                                           const float* __restrict__ comb, int64_t D,
                                                           float* __restrict__ out) {
  DI_PDL_WAIT();
  const int64_t m = blockIdx.y, D4 = D / 4;
  const int64_t i4 = (int64_t)blockIdx.x * POST_NT + threadIdx.x;
  if (i4 >= D4) return;
  const int64_t i = i4 * 4;
  // every load first, as volatile asm (nvcc otherwise sinks the later X / comb loads below the first FMAs,
  // which wait on the first loads: two or three round trips instead of one)
  float4 xv[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) xv[j] = hc_ld4_nc(X + (m * HC + j) * D + i);
  const float4 yv = hc_ld4_nc(y + m * D + i);
  float pv[HC], cv[HC * HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) pv[k] = hc_ld_nc(post + m * HC + k);
#pragma unroll
  for (int q = 0; q < HC * HC; ++q) cv[q] = hc_ld_nc(comb + m * HC * HC + q);
#pragma unroll
  for (int k = 0; k < HC; ++k) {  // hc_post_kernel's expressions (the same contractions: 4 FMUL + 16 FFMA a k)
    const float pk = pv[k];
    float4 o = make_float4(pk * yv.x, pk * yv.y, pk * yv.z, pk * yv.w);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const float c = cv[j * HC + k];
      o.x += c * xv[j].x, o.y += c * xv[j].y, o.z += c * xv[j].z, o.w += c * xv[j].w;
    }
    hc_st4(out + (m * HC + k) * D + i, o);
  }
}

// Slice length L (floats) from hc and D only: the smallest multiple of 32 (≥ 128) with S·NV ≤ D so the
// partials fit in the row's u. L = 0: no such L fits (D < NV), the caller uses the v1 kernel.
int64_t hc_slice_len(int hc, int64_t D, int nv) {
  const int64_t K = (int64_t)hc * D;
  if (D < nv) return 0;
  int64_t L = std::min<int64_t>(K, std::max<int64_t>(128, (hc * nv + 31) / 32 * 32));
  while (cdiv(K, L) * nv > D) L = std::min<int64_t>(K, L + 32);
  return L;
}
size_t hc_a_smem(int mix, int rt, int64_t L) { return (size_t)(mix + rt) * (size_t)(L + 4) * sizeof(float); }

// The kernels' shared-memory attribute (kMaxSmem, or what the device allows next to their static shared
// memory), set once by init_kernel_attributes.
template <int HC, bool HEAD>
cudaError_t hc_attrs() {
  cudaError_t e = detail::set_max_dynamic_smem(hc_partials_kernel<HC, HEAD, false>, (size_t)kMaxSmem);
  if constexpr (HcDims<HC, HEAD>::NV <= 32)
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_partials_kernel<HC, HEAD, true>, (size_t)kMaxSmem);
  if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_finish_kernel<HC, HEAD>, (size_t)kMaxSmem);
  if constexpr (HcDims<HC, HEAD>::NV <= 32)
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_finish2_kernel<HC, HEAD>, (size_t)kMaxSmem);
  if constexpr (!HEAD && HC <= 4) {
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_gemm_kernel<HC, 8, 9>, (size_t)kMaxSmem);
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_gemm_kernel<HC, 16, 5>, (size_t)kMaxSmem);
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_gemm_kernel<HC, 32, 4>, (size_t)kMaxSmem);
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_fast_kernel<HC, 128>, (size_t)kMaxSmem);
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_fast_kernel<HC, 256>, (size_t)kMaxSmem);
    if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 0, 0>, (size_t)kMaxSmem);
    if constexpr (HC >= 3) {
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 2, 0>, (size_t)kMaxSmem);
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 4, 0>, (size_t)kMaxSmem);
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 8, 0>, (size_t)kMaxSmem);
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 0, 2>, (size_t)kMaxSmem);
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 0, 4>, (size_t)kMaxSmem);
      if (e == cudaSuccess) e = detail::set_max_dynamic_smem(hc_dec_kernel<HC, 0, 8>, (size_t)kMaxSmem);
    }
  }
  return e;
}

template <int HC, bool HEAD>
cudaError_t launch_pre_v3(const float* X, int64_t M, int64_t D, int64_t L, const float* fn, const float* base,
                          const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                          float* comb, cudaStream_t s, bool v1) {
  constexpr int MIX = HcDims<HC, HEAD>::MIX, NV = HcDims<HC, HEAD>::NV;
  const int64_t K = (int64_t)HC * D;
  const int S = (int)cdiv(K, L);
  const size_t smem_row = hc_a_smem(MIX, A_RT_ROW, L), smem_val = hc_a_smem(MIX, A_RT_VAL, L);
  // row mode from M > 32 on (fn slice shared by 128 rows); value mode below (more, lighter blocks)
  const bool rowmode = NV <= 32 && M > 32 && smem_row <= (size_t)kMaxSmem;
  cudaError_t e;
  if (rowmode) {
    if constexpr (NV <= 32) {  // NV registers of accumulators a thread: not for hc = 8
      auto k = hc_partials_kernel<HC, HEAD, true>;
      k<<<dim3((unsigned)cdiv(M, A_RT_ROW), (unsigned)S), A_NT, smem_row, s>>>(X, M, D, fn, (int)L, u);
    }
  } else {
    auto k = hc_partials_kernel<HC, HEAD, false>;
    k<<<dim3((unsigned)cdiv(M, A_RT_VAL), (unsigned)S), A_NT, smem_val, s>>>(X, M, D, fn, (int)L, u);
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  auto kb = hc_finish_kernel<HC, HEAD>;
  if constexpr (NV <= 32)
    if (!v1) kb = hc_finish2_kernel<HC, HEAD>;  // DEEPINFER_CUDA_OFF=smallk: v1 = hc_finish_kernel
  const size_t smem_b = (size_t)S * NV * sizeof(float);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)M, 1, 1);
  cfg.blockDim = dim3(B_NT, 1, 1);
  cfg.dynamicSmemBytes = smem_b;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, kb, X, D, S, base, scale, iters, hc_eps, norm_eps, u, post, comb);
  if (e != cudaSuccess) {  // no PDL here: plain stream order
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, kb, X, D, S, base, scale, iters, hc_eps, norm_eps, u, post, comb);
  }
  return e;
}

// Prefill path: BM rows a block, BM chosen so the grid covers the SMs (~120+ blocks) while fn is staged
// as rarely as possible. The mapping changes with M, the chains do not.
template <int HC>
cudaError_t launch_pre_gemm(const float* X, int64_t M, int64_t D, int64_t L, const float* fn, const float* base,
                            const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                            float* comb, cudaStream_t s) {
  constexpr int MIX = HcDims<HC, false>::MIX;
  auto go = [&](auto bm, auto g) {
    constexpr int BM = decltype(bm)::value, G = decltype(g)::value;
    const size_t smem = (size_t)P_ST * (MIX + BM) * P_LP * sizeof(float);
    hc_gemm_kernel<HC, BM, G><<<(unsigned)cdiv(M, BM), G * BM, smem, s>>>(X, M, D, fn, (int)L, u);
  };
  using std::integral_constant;
  if (M >= 32 * 120) go(integral_constant<int, 32>{}, integral_constant<int, 4>{});  // NQ = 7, 4 warps
  else if (M >= 16 * 120) go(integral_constant<int, 16>{}, integral_constant<int, 5>{});  // NQ = 5, 80 thr
  else go(integral_constant<int, 8>{}, integral_constant<int, 9>{});  // NQ = 3, 72 threads
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  hc_gemm_finish_kernel<HC><<<(unsigned)cdiv(M, F_BR), F_NT, 0, s>>>(X, M, D, base, scale, iters, hc_eps, norm_eps,
                                                                      u, post, comb);
  return cudaGetLastError();
}

// hcfast: the shapes it takes (hc ≤ 4, v3's slice length 128 with whole slices, fused kernel's shared
// memory) depend on hc and D only; its rows are bitwise v3's, so the M threshold is about speed only.
bool hcq_shape_ok(int hc, int64_t D) {
  if (hc < 1 || hc > 4 || D % 4) return false;
  const int nv = (2 + hc) * hc + 1;
  const int64_t K = (int64_t)hc * D;
  if (hc_slice_len(hc, D, nv) != Q_L || K % Q_L) return false;
  return hcq_smem(nv - 1, (int)(K / Q_L), nv) <= (size_t)kMaxSmem;
}

template <int HC>
cudaError_t launch_pre_fast(const float* X, int64_t M, int64_t D, const float* fn, const float* base,
                            const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                            float* comb, int* sync, cudaStream_t s, int nt) {
  using Q = HcFast<HC>;
  const int64_t K = (int64_t)HC * D, T = cdiv(M, Q_BM);
  const int S = (int)(K / Q_L);
  cudaError_t e = cudaMemsetAsync(sync, 0, (size_t)(1 + T) * sizeof(int), s);
  if (e != cudaSuccess) return e;
  const int64_t items = T * (S + Q_BM / Q_FR);
  const size_t smem = hcq_smem(Q::MIX, S, Q::NV);
  if (nt == 128)
    hc_fast_kernel<HC, 128><<<(unsigned)items, 128, smem, s>>>(X, M, D, fn, base, scale, iters, hc_eps, norm_eps, u,
                                                               post, comb, sync);
  else
    hc_fast_kernel<HC, 256><<<(unsigned)items, 256, smem, s>>>(X, M, D, fn, base, scale, iters, hc_eps, norm_eps, u,
                                                               post, comb, sync);
  return cudaGetLastError();
}

// hcdec: shapes it takes depend on (M, hc, D) only; the rows are v3's bits whatever path runs them. v3 must be
// what hc_pre runs for the shape (slice plan exists, kernel A's shared memory fits), the fn slice must fit the
// early registers (MIX · L ≤ 4 · DEC_FQ · DEC_NT floats: L = 128 for hc ≤ 4 with D ≥ 512), and S ≥ M (one
// finisher block a row).
size_t hcd_smem(int mix, int nv, int64_t M, int64_t L, int64_t S) {
  return std::max((size_t)(mix + M) * (size_t)(L + 4), (size_t)(S * nv)) * sizeof(float);
}
bool hcd_shape_ok(int64_t M, int hc, int64_t D) {
  if (M < 1 || M > DEC_MAXM || hc < 1 || hc > 4 || D % 4) return false;
  const int nv = (2 + hc) * hc + 1, mix = nv - 1;
  const int64_t L = hc_slice_len(hc, D, nv);
  if (L <= 0 || hc_a_smem(mix, A_RT_VAL, L) > (size_t)kMaxSmem) return false;
  const int64_t S = cdiv((int64_t)hc * D, L);
  return S >= M && S <= INT32_MAX && (int64_t)mix * (L / 4) <= (int64_t)DEC_FQ * DEC_NT &&
         hcd_smem(mix, nv, M, L, S) <= (size_t)kMaxSmem;
}

template <int HC>
cudaError_t launch_pre_dec(const float* X, int64_t M, int64_t D, const float* fn, const float* base,
                           const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                           float* comb, int* sync, cudaStream_t s, const float* nw = nullptr, float neps = 0.0f,
                           float* h = nullptr) {
  constexpr int MIX = HcDims<HC, false>::MIX, NV = HcDims<HC, false>::NV;
  const int64_t L = hc_slice_len(HC, D, NV), S = cdiv((int64_t)HC * D, L);
  const size_t smem = std::max(hcd_smem(MIX, NV, M, L, S), h ? (size_t)D * sizeof(float) : 0);  // (+ the staged row)
  auto go = [&](auto kernel) {
    kernel<<<(unsigned)S, DEC_NT, smem, s>>>(X, (int)M, D, (int)L, fn, base, scale, iters, hc_eps, norm_eps, u, post,
                                             comb, sync, nw, neps, h);
    return cudaGetLastError();
  };
  if (!h) return go(hc_dec_kernel<HC, 0, 0>);
  if constexpr (HC >= 3) {  // (the fused norm: hc_pre_dec_norm_ok; rms_norm's own kernel for the shape)
    switch (rms_norm_kind(D, D, u, h, nw)) {
      case 1: return go(hc_dec_kernel<HC, 2, 0>);
      case 2: return go(hc_dec_kernel<HC, 4, 0>);
      case 3: return go(hc_dec_kernel<HC, 8, 0>);
      case 4: return go(hc_dec_kernel<HC, 0, 2>);
      case 5: return go(hc_dec_kernel<HC, 0, 4>);
      case 6: return go(hc_dec_kernel<HC, 0, 8>);
    }
  }
  return cudaErrorNotSupported;
}

template <bool HEAD>
cudaError_t launch_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post, float* comb,
                       cudaStream_t s, int gemm = 0, bool v1 = false) {
  if (D % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  // v3 where the partials fit (D ≥ NV and kernel A's shared memory); the choice depends on hc and D
  // only, never on M, so a row's bits do not depend on the batch.
  const int nv = (HEAD ? hc : (2 + hc) * hc) + 1;
  const int64_t L = hc_slice_len(hc, D, nv);
  if (L > 0 && hc_a_smem(nv - 1, A_RT_VAL, L) <= (size_t)kMaxSmem) {
    // gemm: 0 = v3 only, 1 = prefill path from kGemmMinRows rows on, 2 = prefill path for any M (tests)
    if constexpr (!HEAD) {
      if (hc <= 4 && (gemm == 2 || (gemm == 1 && M >= kGemmMinRows))) {
        switch (hc) {
#define HC_GEMM(H)   case H: return launch_pre_gemm<H>(X, M, D, L, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, s);
          HC_GEMM(1)
          HC_GEMM(2)
          HC_GEMM(3)
          HC_GEMM(4)
#undef HC_GEMM
        }
      }
    }
    switch (hc) {
#define HC_V3(H) \
  case H: return launch_pre_v3<H, HEAD>(X, M, D, L, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, s, v1);
      HC_V3(1)
      HC_V3(2)
      HC_V3(3)
      HC_V3(4)
      HC_V3(8)
#undef HC_V3
      default:
        return cudaErrorNotSupported;
    }
  }
  switch (hc) {
#define HC_CASE(H, R)                                                                                      \
  case H:                                                                                                  \
    hc_pre_kernel<H, R, HEAD><<<(unsigned)cdiv(M, R), NT, 0, s>>>(X, M, D, fn, base, scale, iters, hc_eps, \
                                                                  norm_eps, u, post, comb);                \
    break;
    HC_CASE(1, 4)
    HC_CASE(2, 4)
    HC_CASE(3, 4)
    HC_CASE(4, 4)
    HC_CASE(8, 1)
#undef HC_CASE
    default:
      return cudaErrorNotSupported;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                   const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                   float* comb, cudaStream_t s, bool gemm) {
  return launch_pre<false>(X, M, hc, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, s,
                           gemm ? 1 : 0);
}

cudaError_t hc_pre_v1(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                      const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                      float* comb, cudaStream_t s, bool gemm) {
  return launch_pre<false>(X, M, hc, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, s,
                           gemm ? 1 : 0, true);
}

cudaError_t hc_head_v1(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, float hc_eps, float norm_eps, float* u, cudaStream_t s) {
  return launch_pre<true>(X, M, hc, D, fn, base, scale, 0, hc_eps, norm_eps, u, nullptr, nullptr, s, 0, true);
}

cudaError_t hc_pre_gemm(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                        const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                        float* comb, cudaStream_t s) {
  return launch_pre<false>(X, M, hc, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, s, 2);
}

bool hc_pre_fast_ok(int hc, int64_t D) { return hcq_shape_ok(hc, D); }
bool hc_pre_fast_use(int64_t M, int hc, int64_t D) { return M >= kHcFastMinRows && hcq_shape_ok(hc, D); }
int64_t hc_pre_fast_sync_ints(int64_t M) { return 1 + cdiv(std::max<int64_t>(M, 1), Q_BM); }

cudaError_t hc_pre_fast(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                        const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                        float* comb, int32_t* sync, cudaStream_t s, int nt) {
  if (!hcq_shape_ok(hc, D)) return cudaErrorNotSupported;
  if (nt != 128 && nt != 256) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  switch (hc) {
#define HC_FAST(H) \
  case H: return launch_pre_fast<H>(X, M, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, sync, s, nt);
    HC_FAST(1)
    HC_FAST(2)
    HC_FAST(3)
    HC_FAST(4)
#undef HC_FAST
  }
  return cudaErrorNotSupported;
}

bool hc_pre_dec_use(int64_t M, int hc, int64_t D) { return hcd_shape_ok(M, hc, D); }
bool hc_pre_dec_norm_ok(int64_t M, int hc, int64_t D, const float* u, const float* w, const float* h) {
  const auto al = [](const void* p) { return (uintptr_t)p % 16 == 0; };
  return hc >= 3 && hcd_shape_ok(M, hc, D) && rms_norm_kind(D, D, u, h, w) != 0 && al(u) && al(h) &&
         (!w || al(w)) && (size_t)D * sizeof(float) <= (size_t)kMaxSmem;
}
int64_t hc_pre_dec_sync_ints() { return DEC_SYNC_INTS; }

cudaError_t hc_pre_dec(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                       float* comb, int32_t* sync, cudaStream_t s, const float* norm_w, float eps, float* h) {
  if (!hcd_shape_ok(M, hc, D)) return cudaErrorNotSupported;
  if (h && !hc_pre_dec_norm_ok(M, hc, D, u, norm_w, h)) return cudaErrorNotSupported;
  switch (hc) {
#define HC_DEC(H)                                                                                                 \
  case H:                                                                                                         \
    return launch_pre_dec<H>(X, M, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, sync, s, \
                             norm_w, eps, h);
    HC_DEC(1)
    HC_DEC(2)
    HC_DEC(3)
    HC_DEC(4)
#undef HC_DEC
  }
  return cudaErrorNotSupported;
}

cudaError_t hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                    const float* scale, float hc_eps, float norm_eps, float* u, cudaStream_t s) {
  return launch_pre<true>(X, M, hc, D, fn, base, scale, 0, hc_eps, norm_eps, u, nullptr, nullptr, s);
}

cudaError_t hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                    int64_t D, float* out, cudaStream_t s) {
  if (D % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  if (M > 65535) return hc_post_v1(X, y, post, comb, M, hc, D, out, s);  // gridDim.y
  const dim3 grid((unsigned)cdiv(D / 4, POST_NT), (unsigned)M);
  switch (hc) {
    case 1: hc_post2_kernel<1><<<grid, POST_NT, 0, s>>>(X, y, post, comb, D, out); break;
    case 2: hc_post2_kernel<2><<<grid, POST_NT, 0, s>>>(X, y, post, comb, D, out); break;
    case 3: hc_post2_kernel<3><<<grid, POST_NT, 0, s>>>(X, y, post, comb, D, out); break;
    case 4: hc_post2_kernel<4><<<grid, POST_NT, 0, s>>>(X, y, post, comb, D, out); break;
    case 8: hc_post2_kernel<8><<<grid, POST_NT, 0, s>>>(X, y, post, comb, D, out); break;
    default: return cudaErrorNotSupported;
  }
  return cudaGetLastError();
}

cudaError_t hc_post_v1(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                       int64_t D, float* out, cudaStream_t s) {
  if (D % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  const unsigned blocks = (unsigned)cdiv(M * (D / 4), 256);
  switch (hc) {
    case 1: hc_post_kernel<1><<<blocks, 256, 0, s>>>(X, y, post, comb, M, D, out); break;
    case 2: hc_post_kernel<2><<<blocks, 256, 0, s>>>(X, y, post, comb, M, D, out); break;
    case 3: hc_post_kernel<3><<<blocks, 256, 0, s>>>(X, y, post, comb, M, D, out); break;
    case 4: hc_post_kernel<4><<<blocks, 256, 0, s>>>(X, y, post, comb, M, D, out); break;
    case 8: hc_post_kernel<8><<<blocks, 256, 0, s>>>(X, y, post, comb, M, D, out); break;
    default: return cudaErrorNotSupported;
  }
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_hc() {
  return first_error({hc_attrs<1, false>(), hc_attrs<2, false>(), hc_attrs<3, false>(), hc_attrs<4, false>(),
                      hc_attrs<8, false>(), hc_attrs<1, true>(), hc_attrs<2, true>(), hc_attrs<3, true>(),
                      hc_attrs<4, true>(), hc_attrs<8, true>()});
}
}  // namespace detail

}  // namespace deepinfer::cuda
