// DeepSeek-V4.1's ops on the GPU (float32, any shape): single-pass mHC (hc_mix), the KV QAT
// simulations (kv_qdq) and the Engram gate. Each computes the formula of its CPU twin in
// src/ops/cpu/cpu_backend.cc; every output row is reduced in one fixed order (batch invariant).
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

constexpr int NT = 256, NW = NT / 32;
constexpr int MAX_HC = 16;  // V41Config allows hc_mult ≤ 16
constexpr int KC = 8;       // mHC mixes accumulated per pass over the row

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum of a double in a fixed order (lanes by xor tree, then warps 0, 1, ...); every
// thread gets the result. red: NW doubles of shared memory.
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  double t = 0;
  for (int i = 0; i < NW; ++i) t += red[i];
  return t;
}

// ---- single-pass mHC: one block per row ----
__global__ void __launch_bounds__(NT) hc_mix_kernel(const float* __restrict__ X, int hc, int64_t D,
                                                    const float* w, const float* __restrict__ fn,
                                                    const float* __restrict__ base, const float* __restrict__ scale,
                                                    int iters, float hc_eps, float norm_eps, float* __restrict__ u,
                                                    float* pre, float* __restrict__ post, float* __restrict__ comb) {
  DI_PDL_WAIT();
  __shared__ float wsh[MAX_HC];                      // this row's collapse weights
  __shared__ float mu[(2 + MAX_HC) * MAX_HC];        // mixes · rms
  __shared__ float part[NW][KC];
  __shared__ double red[NW];
  const int64_t m = blockIdx.x, W = (int64_t)hc * D;
  const float* xr = X + m * W;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // w is read before anything is written, so pre may be the same buffer as w.
  if (threadIdx.x < hc) wsh[threadIdx.x] = w[m * hc + threadIdx.x];
  if (fn) {
    const int mix = (2 + hc) * hc;
    // Inverse RMS over hc·D in double, as the CPU's inv_rms.
    double ss = 0;
    for (int64_t i = threadIdx.x; i < W; i += NT) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss, red);
    const float r = (float)(1.0 / sqrt(ss / (double)W + (double)norm_eps));
    for (int k0 = 0; k0 < mix; k0 += KC) {
      float acc[KC];
#pragma unroll
      for (int k = 0; k < KC; ++k) acc[k] = 0.0f;
      for (int64_t i = threadIdx.x; i < W; i += NT) {
        const float xv = xr[i];
#pragma unroll
        for (int k = 0; k < KC; ++k)
          if (k0 + k < mix) acc[k] = fmaf(__ldg(fn + (int64_t)(k0 + k) * W + i), xv, acc[k]);
      }
#pragma unroll
      for (int k = 0; k < KC; ++k) {
        const float v = detail::warp_sum(acc[k]);
        if (lane == 0) part[warp][k] = v;
      }
      __syncthreads();
      if (threadIdx.x < KC && k0 + threadIdx.x < mix) {
        float s = 0.0f;
        for (int i = 0; i < NW; ++i) s += part[i][threadIdx.x];
        mu[k0 + threadIdx.x] = s * r;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {  // the coefficients, in the CPU's order (hc_coeffs)
      auto sig = [](float x) { return 1.0f / (1.0f + expf(-x)); };
      for (int j = 0; j < hc; ++j) {
        pre[m * hc + j] = sig(mu[j] * scale[0] + base[j]) + hc_eps;
        post[m * hc + j] = 2.0f * sig(mu[hc + j] * scale[1] + base[hc + j]);
      }
      float* C = comb + m * hc * hc;  // row j = input stream, column k = output stream
      for (int j = 0; j < hc; ++j) {
        float mx = -INFINITY;
        for (int k = 0; k < hc; ++k) {
          const float v = mu[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
          C[j * hc + k] = v;
          mx = fmaxf(mx, v);
        }
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) s += (C[j * hc + k] = expf(C[j * hc + k] - mx));
        for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / s + hc_eps;
      }
      auto col_norm = [&] {
        for (int k = 0; k < hc; ++k) {
          float s = 0.0f;
          for (int j = 0; j < hc; ++j) s += C[j * hc + k];
          for (int j = 0; j < hc; ++j) C[j * hc + k] /= (s + hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int j = 0; j < hc; ++j) {
          float s = 0.0f;
          for (int k = 0; k < hc; ++k) s += C[j * hc + k];
          for (int k = 0; k < hc; ++k) C[j * hc + k] /= (s + hc_eps);
        }
      };
      col_norm();
      for (int it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
      }
    }
  }
  __syncthreads();
  // Collapse with the known weights; separate multiply and add in the CPU's order (no fma), so the
  // same X and w give the CPU's bits.
  for (int64_t i = threadIdx.x; i < D; i += NT) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s = __fadd_rn(s, __fmul_rn(wsh[j], xr[(int64_t)j * D + i]));
    u[m * D + i] = s;
  }
}

// ---- KV QAT simulations: one thread per block of 16 or 32 values; exact (frexp / ldexp / rint and
// IEEE division), so the GPU gives the CPU's bits ----
__device__ __forceinline__ float round_grid_f(float v, int mbits, int emin) {
  if (v == 0.0f) return 0.0f;
  int e;
  frexpf(v, &e);
  const int q = max(e - 1, emin) - mbits;
  return ldexpf(rintf(ldexpf(v, -q)), q);
}
__device__ __forceinline__ double round_grid_d(double v, int mbits, int emin) {
  if (v == 0.0) return 0.0;
  int e;
  frexp(v, &e);
  const int q = max(e - 1, emin) - mbits;
  return ldexp(rint(ldexp(v, -q)), q);
}
__device__ __forceinline__ float pow2_ceil(double x) {
  int e;
  const double f = frexp(x, &e);
  return (float)ldexp(1.0, f == 0.5 ? e - 1 : e);
}

__global__ void kv_qdq_kernel(float* __restrict__ x, int64_t nb, int fmt) {
  DI_PDL_WAIT();
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  const int bs = fmt == 2 ? 16 : 32;
  float* v = x + b * bs;
  float amax = 0.0f;
  for (int i = 0; i < bs; ++i) amax = fmaxf(amax, fabsf(v[i]));
  float s, lim;
  int mbits, emin;
  if (fmt == 0) {  // FP8 E4M3, power-of-two scale
    s = pow2_ceil(fmax((double)amax, 1e-4) / 448.0), lim = 448.0f, mbits = 3, emin = -6;
  } else if (fmt == 1) {  // FP4 E2M1, power-of-two scale
    s = pow2_ceil(fmax((double)amax, 6.0 * ldexp(1.0, -126)) / 6.0), lim = 6.0f, mbits = 1, emin = 0;
  } else {  // FP4 E2M1, E4M3 scale (RNE cast of amax / 6, saturating at 448)
    s = (float)round_grid_d(fmin(fmax((double)amax, 6.0 * ldexp(1.0, -9)) / 6.0, 448.0), 3, -6);
    lim = 6.0f, mbits = 1, emin = 0;
  }
  for (int i = 0; i < bs; ++i) v[i] = round_grid_f(fminf(fmaxf(v[i] / s, -lim), lim), mbits, emin) * s;
}

// ---- Engram gate: one block per (row, stream), reductions and the update in double ----
__global__ void __launch_bounds__(NT) engram_gate_kernel(float* __restrict__ X, int hc, int64_t D,
                                                         const float* __restrict__ kv, const float* __restrict__ w,
                                                         double eps) {
  DI_PDL_WAIT();
  __shared__ double red[NW];
  __shared__ double gate_s;
  const int64_t t = blockIdx.x / hc;
  const int j = (int)(blockIdx.x % hc);
  float* x = X + (t * hc + j) * D;
  const float* key = kv + (t * (hc + 1) + j) * D;
  const float* value = kv + (t * (hc + 1) + hc) * D;
  const float* wj = w + (int64_t)j * D;
  double dotv = 0, xx = 0, kk = 0;
  for (int64_t c = threadIdx.x; c < D; c += NT) {
    const double xv = x[c], kc = key[c];
    dotv += xv * wj[c] * kc;
    xx += xv * xv;
    kk += kc * kc;
  }
  dotv = block_sum_d(dotv, red);
  xx = block_sum_d(xx, red);
  kk = block_sum_d(kk, red);
  if (threadIdx.x == 0) {
    const double s = dotv / sqrt(xx / D + eps) / sqrt(kk / D + eps) / sqrt((double)D);
    gate_s = 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(s), 1e-6)), s)));
  }
  __syncthreads();
  const double g = gate_s;
  for (int64_t c = threadIdx.x; c < D; c += NT) x[c] = (float)__dadd_rn((double)x[c], __dmul_rn(g, (double)value[c]));
}

}  // namespace

cudaError_t hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn, const float* base,
                   const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* pre,
                   float* post, float* comb, cudaStream_t s) {
  if (hc < 1 || hc > MAX_HC) return cudaErrorNotSupported;
  if (M <= 0 || D <= 0) return cudaSuccess;
  hc_mix_kernel<<<(unsigned)M, NT, 0, s>>>(X, hc, D, w, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, pre,
                                           post, comb);
  return cudaGetLastError();
}

cudaError_t kv_qdq(float* x, int64_t n, int format, cudaStream_t s) {
  if (format < 0 || format > 2) return cudaErrorInvalidValue;
  const int64_t nb = n / (format == 2 ? 16 : 32);
  if (nb <= 0) return cudaSuccess;
  kv_qdq_kernel<<<(unsigned)cdiv(nb, 128), 128, 0, s>>>(x, nb, format);
  return cudaGetLastError();
}

cudaError_t engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps,
                        cudaStream_t s) {
  if (M <= 0 || hc <= 0 || D <= 0) return cudaSuccess;
  engram_gate_kernel<<<(unsigned)(M * hc), NT, 0, s>>>(X, hc, D, kv, w, eps);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
