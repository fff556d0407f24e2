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
  DI_PDL_WAIT();
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

// smallk route: one warp per token as route_kernel, with J = ⌈E/32⌉ score registers a lane (8 for
// E = 256, not 32: a quarter of the per-pick scan) and each top-k pick as two warp reductions (REDUX:
// max of the order key, then the lowest id holding it) instead of a 5-step shuffle butterfly of 3 values.
// Same scores, same picks (largest score + bias, ties to the lower id), same weight sums: bitwise route_kernel.
template <int J>
__global__ void __launch_bounds__(64) route2_kernel(const float* __restrict__ logits, int64_t T, int E, int K,
                                                    int scoring, const float* __restrict__ bias,
                                                    const int32_t* __restrict__ tid2eid,
                                                    const int32_t* __restrict__ tokens, bool normalize,
                                                    float route_scale, int32_t* __restrict__ sel,
                                                    float* __restrict__ wsel) {
  DI_PDL_WAIT();
  const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* lg = logits + t * E;
  float sc[J], b[J];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < J; ++j) {  // logits and bias loads all in flight before any use
    const int e = lane + 32 * j;
    sc[j] = e < E ? lg[e] : -INFINITY;
    b[j] = (e < E && !tid2eid) ? bias[e] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < J; ++j) mx = fmaxf(mx, sc[j]);
  if (scoring == (int)Scoring::Softmax) {
    mx = detail::warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (lane + 32 * j < E) s += (sc[j] = expf(sc[j] - mx));
    s = detail::warp_sum(s);
#pragma unroll
    for (int j = 0; j < J; ++j) sc[j] /= s;
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (lane + 32 * j < E)
        sc[j] = scoring == (int)Scoring::SqrtSoftplus ? sqrtf(softplusf(sc[j])) : 1.0f / (1.0f + expf(-sc[j]));
  }
  float wk[16];
  int ek[16];
  if (tid2eid) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      if (k < K) {
        const int e = tid2eid[(int64_t)tokens[t] * K + k];
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j)
          if (lane + 32 * j == e) v = sc[j];
        v = __shfl_sync(0xffffffffu, v, e & 31);
        ek[k] = e, wk[k] = v;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j) b[j] = lane + 32 * j < E ? sc[j] + b[j] : -INFINITY;
    uint32_t taken = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) {  // unrolled: ek/wk stay in registers
      if (k < K) {
        float bv = -INFINITY, sv = 0.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int e = lane + 32 * j;
          if (e < E && !(taken >> j & 1u) && (b[j] > bv || bi == 0x7fffffff)) bv = b[j], sv = sc[j], bi = e;
        }
        // key 0: no candidate in this lane (every real key, −inf included, is above 0)
        const uint32_t key = bi == 0x7fffffff ? 0u : detail::f32_order_key(bv);
        const uint32_t kmax = __reduce_max_sync(0xffffffffu, key);
        bi = (int)__reduce_min_sync(0xffffffffu, key == kmax ? (uint32_t)bi : 0xffffffffu);
        sv = __shfl_sync(0xffffffffu, sv, bi & 31);  // the winner is its lane's own best
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        ek[k] = bi, wk[k] = sv;
      }
    }
  }
  if (lane == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (k < K) sum += wk[k];
    const float f = route_scale / (normalize ? sum + 1e-20f : 1.0f);
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (k < K) {
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
  DI_PDL_WAIT();
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
  DI_PDL_WAIT();
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

// smallk combine: one float4 column a thread, CB_NT columns a block, so a decode token (D = 4096)
// spreads over 8 blocks instead of one block looping 4 times. The K slots' rows and weights are put in
// expert order once a block (a slot's rank = how many slots sort before it: the stable order of the
// insertion sort above), then each thread issues its K row loads together and adds them in that order
// with the same expression as combine_kernel: bitwise its results.
constexpr int CB_NT = 128;
template <int KM>
__global__ void __launch_bounds__(CB_NT) combine2_kernel(const float* __restrict__ ye, const int32_t* __restrict__ sel,
                                                         const float* __restrict__ wsel,
                                                         const int32_t* __restrict__ slot_row, int K, int64_t D,
                                                         int64_t nb, const float* __restrict__ shared,
                                                         float* __restrict__ out) {
  DI_PDL_WAIT();
  __shared__ int64_t row_s[KM];
  __shared__ float w_s[KM];
  const int64_t t = blockIdx.x / nb, cb = blockIdx.x % nb;
  if (threadIdx.x < K) {
    const int k = threadIdx.x;
    const int e = sel[t * K + k];
    int rank = 0;
    for (int q = 0; q < K; ++q) {
      const int eq = sel[t * K + q];
      rank += (eq < e || (eq == e && q < k)) ? 1 : 0;
    }
    row_s[rank] = slot_row ? slot_row[t * K + k] : t * K + k;
    w_s[rank] = wsel[t * K + k];
  }
  __syncthreads();
  const int64_t i4 = cb * CB_NT + threadIdx.x;
  if (i4 >= D / 4) return;
  float4 v[KM];
#pragma unroll
  for (int k = 0; k < KM; ++k)
    if (k < K) v[k] = __ldg(reinterpret_cast<const float4*>(ye + row_s[k] * D) + i4);
  float4 sh = make_float4(0, 0, 0, 0);
  if (shared) sh = __ldg(reinterpret_cast<const float4*>(shared + t * D) + i4);
  float4 o = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < KM; ++k) {
    if (k < K) {
      const float w = w_s[k];
      o.x += v[k].x * w, o.y += v[k].y * w, o.z += v[k].z * w, o.w += v[k].w * w;
    }
  }
  if (shared) o.x += sh.x, o.y += sh.y, o.z += sh.z, o.w += sh.w;
  reinterpret_cast<float4*>(out + t * D)[i4] = o;
}

}  // namespace

cudaError_t moe_route_v1(const float* logits, int64_t T, int E, int K, Scoring scoring, const float* bias,
                         const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                         int32_t* sel, float* wsel, cudaStream_t s) {
  if (E > 32 * RT_MAXJ || K > 16 || K > E || (!tid2eid && !bias) || (tid2eid && !tokens)) return cudaErrorInvalidValue;
  if (T <= 0) return cudaSuccess;
  route_kernel<<<(unsigned)cdiv(T * 32, 256), 256, 0, s>>>(logits, T, E, K, (int)scoring, bias, tid2eid, tokens,
                                                           normalize, route_scale, sel, wsel);
  return cudaGetLastError();
}

cudaError_t moe_route(const float* logits, int64_t T, int E, int K, Scoring scoring, const float* bias,
                      const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale, int32_t* sel,
                      float* wsel, cudaStream_t s) {
  if (E > 32 * RT_MAXJ || K > 16 || K > E || (!tid2eid && !bias) || (tid2eid && !tokens)) return cudaErrorInvalidValue;
  if (T <= 0) return cudaSuccess;
  const unsigned blocks = (unsigned)cdiv(T * 32, 64);  // 2 tokens a block: decode's one warp is not in a 256 block
  if (E <= 256)
    route2_kernel<8><<<blocks, 64, 0, s>>>(logits, T, E, K, (int)scoring, bias, tid2eid, tokens, normalize,
                                           route_scale, sel, wsel);
  else if (E <= 384)
    route2_kernel<12><<<blocks, 64, 0, s>>>(logits, T, E, K, (int)scoring, bias, tid2eid, tokens, normalize,
                                            route_scale, sel, wsel);
  else
    route2_kernel<RT_MAXJ><<<blocks, 64, 0, s>>>(logits, T, E, K, (int)scoring, bias, tid2eid, tokens, normalize,
                                                 route_scale, sel, wsel);
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

cudaError_t moe_combine_v1(const float* ye, const int32_t* sel, const float* wsel, const int32_t* slot_row, int64_t T,
                           int K, int64_t D, const float* shared, float* out, cudaStream_t s) {
  if (K > 16 || D % 4) return cudaErrorInvalidValue;
  if (T <= 0) return cudaSuccess;
  combine_kernel<<<(unsigned)T, 256, 0, s>>>(ye, sel, wsel, slot_row, K, D, shared, out);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* ye, const int32_t* sel, const float* wsel, const int32_t* slot_row, int64_t T,
                        int K, int64_t D, const float* shared, float* out, cudaStream_t s) {
  if (K > 16 || D % 4) return cudaErrorInvalidValue;
  if (T <= 0 || D == 0) return cudaSuccess;
  const int64_t nb = cdiv(D / 4, CB_NT);
  if (T * nb > 0x7fffffff) return moe_combine_v1(ye, sel, wsel, slot_row, T, K, D, shared, out, s);
  if (K <= 8)
    combine2_kernel<8><<<(unsigned)(T * nb), CB_NT, 0, s>>>(ye, sel, wsel, slot_row, K, D, nb, shared, out);
  else
    combine2_kernel<16><<<(unsigned)(T * nb), CB_NT, 0, s>>>(ye, sel, wsel, slot_row, K, D, nb, shared, out);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
