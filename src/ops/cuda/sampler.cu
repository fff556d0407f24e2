// GPU sampler: greedy, or temperature + top-k + top-p with a counter-based uniform (sample_uniform).
// One block a row: radix-select the candidate set (≤ 1024 largest logits, ties to the lower id),
// bitonic-sort it best first, scan the masses, cut at top-p, draw.
#include <cub/block/block_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {

constexpr int SNT = 1024, SCAP = 1024;

__global__ void __launch_bounds__(SNT) sample_kernel(const float* __restrict__ logits, int64_t V, int64_t ld,
                                                     const float* __restrict__ temperature,
                                                     const int32_t* __restrict__ top_k, const float* __restrict__ top_p,
                                                     const uint64_t* __restrict__ seed,
                                                     const uint64_t* __restrict__ counter, int32_t* __restrict__ out) {
  DI_PDL_WAIT();
  using ScanI = cub::BlockScan<int, SNT>;
  using ScanF = cub::BlockScan<float, SNT>;
  __shared__ union {
    typename ScanI::TempStorage i;
    typename ScanF::TempStorage f;
  } tmp;
  __shared__ float red[32];
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base_eq, s_base_out, s_cut, s_tok;
  __shared__ unsigned long long ck[SCAP];  // (~order key) << 32 | id: ascending = best first
  __shared__ float cum[SCAP];
  const int64_t b = blockIdx.x;
  const float* row = logits + b * ld;
  const int tid = threadIdx.x;
  const float T = temperature[b];

  if (!(T > 0.0f)) {  // greedy
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t i = tid; i < V; i += SNT) {
      const float v = row[i];
      if (v > bv || bi == 0x7fffffff) bv = v, bi = (int)i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    __shared__ float wv[32];
    __shared__ int wi[32];
    if ((tid & 31) == 0) wv[tid >> 5] = bv, wi[tid >> 5] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < SNT / 32; ++w)
        if (wv[w] > bv || (wv[w] == bv && wi[w] < bi)) bv = wv[w], bi = wi[w];
      out[b] = bi;
    }
    return;
  }

  const int tk = top_k[b];
  const int k = (int)min((int64_t)((tk >= 1 && tk <= SCAP) ? tk : SCAP), V);
  // max logit and the full-vocabulary mass (used when top-k is off)
  float mx = -INFINITY;
  for (int64_t i = tid; i < V; i += SNT) mx = fmaxf(mx, row[i]);
  mx = detail::block_max(mx, red);
  const float zmax = mx / T;
  float zs = 0.0f;
  for (int64_t i = tid; i < V; i += SNT) zs += expf(row[i] / T - zmax);
  zs = detail::block_sum(zs, red);

  // radix select of the k-th largest key
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    for (int64_t i = tid; i < V; i += SNT) {
      const uint32_t key = detail::f32_order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int c = 0, dsel = 0;
      for (int dg = 255; dg >= 0; --dg) {
        if (c + hist[dg] >= remaining) {
          dsel = dg;
          break;
        }
        c += hist[dg];
      }
      s_remaining = remaining - c;
      s_prefix = prefix | ((uint32_t)dsel << shift);
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  ck[tid] = ~0ull;
  if (tid == 0) s_base_eq = 0, s_base_out = 0;
  __syncthreads();
  for (int64_t base = 0; base < V; base += SNT) {
    const int64_t i = base + tid;
    uint32_t key = 0;
    if (i < V) key = detail::f32_order_key(row[i]);
    const int eq = (i < V && key == prefix) ? 1 : 0;
    int eq_rank, eq_tot;
    ScanI(tmp.i).ExclusiveSum(eq, eq_rank, eq_tot);
    __syncthreads();
    const int be = s_base_eq, bo = s_base_out;
    const int take = (i < V) && (key > prefix || (eq && be + eq_rank < remaining)) ? 1 : 0;
    int pos, tot;
    ScanI(tmp.i).ExclusiveSum(take, pos, tot);
    if (take) ck[bo + pos] = ((unsigned long long)(~key) << 32) | (unsigned long long)i;
    __syncthreads();
    if (tid == 0) s_base_eq = be + eq_tot, s_base_out = bo + tot;
    __syncthreads();
    if (s_base_out >= k) break;
  }
  // bitonic sort, ascending composite key = best first, ties to the lower id
  for (int size = 2; size <= SCAP; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const int p = tid ^ stride;
      if (p > tid) {
        const bool up = (tid & size) == 0;
        const unsigned long long a = ck[tid], c = ck[p];
        if ((a > c) == up) ck[tid] = c, ck[p] = a;
      }
    }
  }
  __syncthreads();
  const bool valid = tid < k;
  const int id = valid ? (int)(ck[tid] & 0xffffffffull) : 0;
  const float mass = valid ? expf(row[id] / T - zmax) : 0.0f;
  float incl, total;
  ScanF(tmp.f).InclusiveSum(mass, incl, total);
  cum[tid] = incl;
  if (tid == 0) s_cut = k - 1, s_tok = 0x7fffffff;
  __syncthreads();
  const float denom = (tk >= 1 && tk <= SCAP) ? total : zs;
  const float p = top_p[b];
  if (p < 1.0f) {
    const float thr = p * denom;
    if (valid && incl >= thr && (tid == 0 || cum[tid - 1] < thr)) atomicMin(&s_cut, tid);
  }
  __syncthreads();
  const int cut = s_cut;
  const float target = sample_uniform(seed[b], counter[b]) * cum[cut];
  if (tid <= cut && cum[tid] > target && (tid == 0 || cum[tid - 1] <= target)) atomicMin(&s_tok, tid);
  __syncthreads();
  if (tid == 0) {
    const int j = s_tok == 0x7fffffff ? cut : s_tok;
    out[b] = (int32_t)(ck[j] & 0xffffffffull);
  }
}

}  // namespace

cudaError_t sample(const float* logits, int64_t B, int64_t V, int64_t ld, const float* temperature,
                   const int32_t* top_k, const float* top_p, const uint64_t* seed, const uint64_t* counter,
                   int32_t* out, cudaStream_t s) {
  if (V <= 0 || V > 0x7fffffff) return cudaErrorInvalidValue;
  if (B <= 0) return cudaSuccess;
  sample_kernel<<<(unsigned)B, SNT, 0, s>>>(logits, V, ld, temperature, top_k, top_p, seed, counter, out);
  return cudaGetLastError();
}

namespace {
constexpr int ANT = 512;
// Better of two (value, id) candidates: the larger value, then the lower id; id −1 = none yet.
__device__ __forceinline__ void better(float& bv, int& bi, float ov, int oi) {
  if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
}
__global__ void __launch_bounds__(ANT) argmax_rows_kernel(const float* __restrict__ x, int64_t N, int64_t ld,
                                                          int32_t* __restrict__ out) {
  DI_PDL_WAIT();
  const float* row = x + (int64_t)blockIdx.x * ld;
  float bv = -INFINITY;
  int bi = -1;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < N; i += ANT) {  // ascending ids: strict > keeps the lowest
    const float v = row[i];
    bad |= isnan(v) || v == INFINITY;
    if (v > bv) bv = v, bi = (int)i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
  __shared__ float wv[ANT / 32];
  __shared__ int wi[ANT / 32];
  if ((threadIdx.x & 31) == 0) wv[threadIdx.x >> 5] = bv, wi[threadIdx.x >> 5] = bi;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    for (int w = 1; w < ANT / 32; ++w) better(bv, bi, wv[w], wi[w]);
    out[blockIdx.x] = bad ? -2 : bi;
  }
}
}  // namespace

cudaError_t argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out, cudaStream_t s) {
  if (M <= 0) return cudaSuccess;
  argmax_rows_kernel<<<(unsigned)M, ANT, 0, s>>>(x, N, ld, out);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
