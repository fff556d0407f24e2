// MoE routing (sqrtsoftplus / sigmoid / softmax scores, bias-corrected top-k or hash routing), the
// grouping of routed slots by expert that feeds the grouped expert GEMM, and the combine.
// Semantics: DeepseekV4Model::moe in src/model/deepseek_v4.cc.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

constexpr int RT_MAXJ = 32;  // E ≤ 32·32

__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp per token.
__global__ void route_kernel(const float* __restrict__ logits, int64_t T, int E, int K, int scoring,
                             const float* __restrict__ bias, const int32_t* __restrict__ tid2eid,
                             const int32_t* __restrict__ tokens, bool normalize, float route_scale,
                             int32_t* __restrict__ sel, float* __restrict__ wsel) {
  const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* lg = logits + t * E;
  float sc[RT_MAXJ];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < RT_MAXJ; ++j) {
    const int e = lane + 32 * j;
    sc[j] = e < E ? lg[e] : -INFINITY;
    mx = fmaxf(mx, sc[j]);
  }
  if (scoring == (int)Scoring::Softmax) {
    mx = detail::warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < RT_MAXJ; ++j)
      if (lane + 32 * j < E) s += (sc[j] = expf(sc[j] - mx));
    s = detail::warp_sum(s);
#pragma unroll
    for (int j = 0; j < RT_MAXJ; ++j) sc[j] /= s;
  } else {
#pragma unroll
    for (int j = 0; j < RT_MAXJ; ++j)
      if (lane + 32 * j < E)
        sc[j] = scoring == (int)Scoring::SqrtSoftplus ? sqrtf(softplusf(sc[j])) : 1.0f / (1.0f + expf(-sc[j]));
  }
  float wk[16];
  int ek[16];
  if (tid2eid) {
    for (int k = 0; k < K; ++k) {
      const int e = tid2eid[(int64_t)tokens[t] * K + k];
      float v = 0.0f;
#pragma unroll
      for (int j = 0; j < RT_MAXJ; ++j)
        if (lane + 32 * j == e) v = sc[j];
      v = __shfl_sync(0xffffffffu, v, e & 31);
      ek[k] = e, wk[k] = v;
    }
  } else {
    float b[RT_MAXJ];
#pragma unroll
    for (int j = 0; j < RT_MAXJ; ++j) {
      const int e = lane + 32 * j;
      b[j] = e < E ? sc[j] + bias[e] : -INFINITY;
    }
    uint32_t taken = 0;
    for (int k = 0; k < K; ++k) {
      float bv = -INFINITY, sv = 0.0f;
      int bi = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < RT_MAXJ; ++j) {
        const int e = lane + 32 * j;
        if (e < E && !(taken >> j & 1u) && (b[j] > bv || bi == 0x7fffffff)) bv = b[j], sv = sc[j], bi = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const float os = __shfl_xor_sync(0xffffffffu, sv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, sv = os, bi = oi;
      }
      if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
      ek[k] = bi, wk[k] = sv;
    }
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += wk[k];
    const float f = route_scale / (normalize ? sum + 1e-20f : 1.0f);
    for (int k = 0; k < K; ++k) {
      sel[t * K + k] = ek[k];
      wsel[t * K + k] = wk[k] * f;
    }
  }
}

// One block: counts, offsets, tiles, then each expert's slots in ascending slot order.
__global__ void __launch_bounds__(1024) group_kernel(const int32_t* __restrict__ sel, int64_t slots, int E, int tile_m,
                                                     int32_t* __restrict__ offsets, int32_t* __restrict__ perm_tok,
                                                     int32_t* __restrict__ slot_row, int2* __restrict__ tile_info,
                                                     int32_t* __restrict__ n_tiles, int K) {
  extern __shared__ int cnt[];  // E + 1
  for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) atomicAdd(&cnt[sel[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, nt = 0;
    for (int e = 0; e < E; ++e) {
      const int c = cnt[e];
      offsets[e] = run;
      for (int r = 0; r < c; r += tile_m) tile_info[nt++] = make_int2(e, run + r);
      cnt[e] = run;
      run += c;
    }
    offsets[E] = run;
    *n_tiles = nt;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int cur = cnt[e];
    for (int64_t i = 0; i < slots; ++i)
      if (sel[i] == e) {
        slot_row[i] = cur;
        perm_tok[cur] = (int32_t)(i / K);
        ++cur;
      }
  }
}

__global__ void combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ sel,
                               const float* __restrict__ wsel, const int32_t* __restrict__ slot_row, int K, int64_t D,
                               const float* __restrict__ shared, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  int ord[16];
  for (int k = 0; k < K; ++k) ord[k] = k;
  for (int a = 1; a < K; ++a)  // insertion sort of the slots by expert id
    for (int b = a; b > 0 && sel[t * K + ord[b]] < sel[t * K + ord[b - 1]]; --b) {
      const int x = ord[b];
      ord[b] = ord[b - 1], ord[b - 1] = x;
    }
  for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
    float4 o = make_float4(0, 0, 0, 0);
    for (int k = 0; k < K; ++k) {
      const int s = ord[k];
      const float w = wsel[t * K + s];
      const int64_t r = slot_row ? slot_row[t * K + s] : t * K + s;
      const float4 v = *reinterpret_cast<const float4*>(ye + r * D + i);
      o.x += v.x * w, o.y += v.y * w, o.z += v.z * w, o.w += v.w * w;
    }
    if (shared) {
      const float4 v = *reinterpret_cast<const float4*>(shared + t * D + i);
      o.x += v.x, o.y += v.y, o.z += v.z, o.w += v.w;
    }
    *reinterpret_cast<float4*>(out + t * D + i) = o;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, int64_t T, int E, int K, Scoring scoring, const float* bias,
                      const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale, int32_t* sel,
                      float* wsel, cudaStream_t s) {
  if (E > 32 * RT_MAXJ || K > 16 || K > E || (!tid2eid && !bias) || (tid2eid && !tokens)) return cudaErrorInvalidValue;
  if (T <= 0) return cudaSuccess;
  route_kernel<<<(unsigned)cdiv(T * 32, 256), 256, 0, s>>>(logits, T, E, K, (int)scoring, bias, tid2eid, tokens,
                                                           normalize, route_scale, sel, wsel);
  return cudaGetLastError();
}

int64_t moe_max_tiles(int64_t slots, int E, int tile_m) { return slots / tile_m + E; }

cudaError_t moe_group(const int32_t* sel, int64_t T, int K, int E, int tile_m, int32_t* offsets, int32_t* perm_tok,
                      int32_t* slot_row, int2* tile_info, int32_t* n_tiles, cudaStream_t s) {
  if (E > 1024 || tile_m <= 0) return cudaErrorInvalidValue;
  group_kernel<<<1, 1024, (E + 1) * sizeof(int), s>>>(sel, T * K, E, tile_m, offsets, perm_tok, slot_row, tile_info,
                                                      n_tiles, K);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* ye, const int32_t* sel, const float* wsel, const int32_t* slot_row, int64_t T,
                        int K, int64_t D, const float* shared, float* out, cudaStream_t s) {
  if (K > 16 || D % 4) return cudaErrorInvalidValue;
  if (T <= 0) return cudaSuccess;
  combine_kernel<<<(unsigned)T, 256, 0, s>>>(ye, sel, wsel, slot_row, K, D, shared, out);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
