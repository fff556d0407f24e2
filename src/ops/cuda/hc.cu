// Manifold-constrained hyper-connections: pre (RMS over hc·D, (2+hc)·hc mixes, sigmoid / softmax +
// Sinkhorn, collapse), post (mix back into hc streams) and the final head reduction. float32 like the
// CPU twin. hc_pre / hc_head: one block handles R rows so the fn matrix (24 × 16384 f32 = 1.5 MiB for
// V4-Flash) is read from L2 once per R rows instead of once per row.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

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

template <bool HEAD>
cudaError_t launch_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post, float* comb,
                       cudaStream_t s) {
  if (D % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
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
                   float* comb, cudaStream_t s) {
  return launch_pre<false>(X, M, hc, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, s);
}

cudaError_t hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                    const float* scale, float hc_eps, float norm_eps, float* u, cudaStream_t s) {
  return launch_pre<true>(X, M, hc, D, fn, base, scale, 0, hc_eps, norm_eps, u, nullptr, nullptr, s);
}

cudaError_t hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
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

}  // namespace deepinfer::cuda
