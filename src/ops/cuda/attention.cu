// Sink attention over (sliding window ∪ selected compressed entries), the lightning-indexer scores and
// the per-row top-k that picks the compressed entries. K = V: one d-wide bf16 row per key, shared by
// all heads (MQA), so a block takes 8 heads of one query and every key row it stages in shared memory
// is used by those 8 heads.
#include <cub/block/block_scan.cuh>
#include <mma.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
using namespace nvcuda;

constexpr int ATT_HG = 8, ATT_CH = 32;

// DV = d / 256: each lane holds DV vectors of 8 channels (channels v·256 + lane·8 .. +8).
template <int DV>
__global__ void __launch_bounds__(256) sink_attn_kernel(const bf16* __restrict__ q, int64_t ldq, int H,
                                                        const bf16* __restrict__ win, const int32_t* __restrict__ win_lo,
                                                        const int32_t* __restrict__ win_hi,
                                                        const bf16* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                                                        const int64_t* __restrict__ ent_off,
                                                        const float* __restrict__ sinks, float scale,
                                                        float* __restrict__ out, int64_t ldo) {
  constexpr int d = DV * 256, VPR = d / 8;  // 16-byte vectors a key row
  __shared__ __align__(16) bf16 ks[ATT_CH * d];
  const int64_t m = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y * ATT_HG + warp;
  const int lo = win_lo[m], nw = win_hi[m] - lo;
  const int64_t e0 = ent_off ? ent_off[m] : 0;
  const int ne = ent_off ? (int)(ent_off[m + 1] - e0) : 0;
  const int n = nw + ne;

  float qv[DV][8];
#pragma unroll
  for (int v = 0; v < DV; ++v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(q + m * ldq + (int64_t)h * d + v * 256 + lane * 8);
    const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) qv[v][i] = __bfloat162float(b[i]);
  }
  float o[DV][8];
#pragma unroll
  for (int v = 0; v < DV; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[v][i] = 0.0f;
  float mrun = sinks[h], l = 1.0f;  // the sink: exp(sink − mrun) = 1 in the denominator

  for (int c0 = 0; c0 < n; c0 += ATT_CH) {
    __syncthreads();
    for (int t = threadIdx.x; t < ATT_CH * VPR; t += 256) {
      const int r = t / VPR, c = t % VPR, j = c0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (j < n) {
        const bf16* src = j < nw ? win + (int64_t)(lo + j) * d : ent + (int64_t)ent_idx[e0 + (j - nw)] * d;
        val = *reinterpret_cast<const uint4*>(src + c * 8);
      }
      *reinterpret_cast<uint4*>(ks + r * d + c * 8) = val;
    }
    __syncthreads();
    float s[ATT_CH];
    float cmax = -INFINITY;
#pragma unroll
    for (int r = 0; r < ATT_CH; ++r) {
      float part = 0.0f;
#pragma unroll
      for (int v = 0; v < DV; ++v) {
        const uint4 raw = *reinterpret_cast<const uint4*>(ks + r * d + v * 256 + lane * 8);
        const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) part += qv[v][i] * __bfloat162float(b[i]);
      }
      s[r] = (c0 + r < n) ? scale * detail::warp_sum(part) : -INFINITY;
      cmax = fmaxf(cmax, s[r]);
    }
    const float mnew = fmaxf(mrun, cmax);
    const float alpha = expf(mrun - mnew);
    l *= alpha;
#pragma unroll
    for (int v = 0; v < DV; ++v)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[v][i] *= alpha;
#pragma unroll
    for (int r = 0; r < ATT_CH; ++r) {
      const float p = expf(s[r] - mnew);  // 0 for masked keys
      l += p;
#pragma unroll
      for (int v = 0; v < DV; ++v) {
        const uint4 raw = *reinterpret_cast<const uint4*>(ks + r * d + v * 256 + lane * 8);
        const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[v][i] += p * __bfloat162float(b[i]);
      }
    }
    mrun = mnew;
  }
  const float inv = 1.0f / l;
  float* op = out + m * ldo + (int64_t)h * d;
#pragma unroll
  for (int v = 0; v < DV; ++v) {
    float4* dst = reinterpret_cast<float4*>(op + v * 256 + lane * 8);
    dst[0] = make_float4(o[v][0] * inv, o[v][1] * inv, o[v][2] * inv, o[v][3] * inv);
    dst[1] = make_float4(o[v][4] * inv, o[v][5] * inv, o[v][6] * inv, o[v][7] * inv);
  }
}

// ---- lightning indexer: one block = one query × 64 keys; 4 warps, warp w owns keys 16w..16w+16 ----
constexpr int IDX_KT = 64;

__global__ void __launch_bounds__(128) indexer_kernel(const bf16* __restrict__ qI, const float* __restrict__ gamma,
                                                      int hI, int dI, const bf16* __restrict__ K,
                                                      const int32_t* __restrict__ key_rows, int64_t n_keys,
                                                      const int32_t* __restrict__ n_vis, float qk_scale,
                                                      float* __restrict__ score) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t m = blockIdx.y;
  const int64_t k0 = (int64_t)blockIdx.x * IDX_KT;
  const int64_t vis = min((int64_t)n_vis[m], n_keys);
  float* srow = score + m * n_keys;
  if (k0 >= vis) {
    for (int j = threadIdx.x; j < IDX_KT; j += blockDim.x)
      if (k0 + j < n_keys) srow[k0 + j] = -INFINITY;
    return;
  }
  const int LDQ = dI + 8, LDSS = IDX_KT + 4;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* kt = qs + hI * LDQ;
  float* ss = reinterpret_cast<float*>(kt + IDX_KT * LDQ);
  const int vpr = dI / 8;
  for (int t = threadIdx.x; t < hI * vpr; t += blockDim.x) {
    const int r = t / vpr, c = t % vpr;
    *reinterpret_cast<uint4*>(qs + r * LDQ + c * 8) =
        *reinterpret_cast<const uint4*>(qI + (m * hI + r) * (int64_t)dI + c * 8);
  }
  for (int t = threadIdx.x; t < IDX_KT * vpr; t += blockDim.x) {
    const int r = t / vpr, c = t % vpr;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (k0 + r < n_keys) {
      const int64_t row = key_rows ? (int64_t)key_rows[k0 + r] : k0 + r;
      val = *reinterpret_cast<const uint4*>(K + row * dI + c * 8);
    }
    *reinterpret_cast<uint4*>(kt + r * LDQ + c * 8) = val;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  for (int ht = 0; ht < hI / 16; ++ht) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < dI; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, qs + ht * 16 * LDQ + kk, LDQ);
      wmma::load_matrix_sync(fb, kt + warp * 16 * LDQ + kk, LDQ);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(ss + ht * 16 * LDSS + warp * 16, acc, LDSS, wmma::mem_row_major);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < IDX_KT; j += blockDim.x) {
    const int64_t w = k0 + j;
    if (w >= n_keys) continue;
    if (w >= vis) {
      srow[w] = -INFINITY;
      continue;
    }
    float acc = 0.0f;
    for (int h = 0; h < hI; ++h) acc += gamma[m * hI + h] * (fmaxf(ss[h * LDSS + j], 0.0f) * qk_scale);
    srow[w] = acc;
  }
}

// ---- top-k per row: 4-pass radix select on order-preserving keys, then an index-ordered compaction ----
constexpr int TK_NT = 1024;

__global__ void __launch_bounds__(TK_NT) topk_kernel(const float* __restrict__ score, int64_t n, int64_t ld,
                                                     const int32_t* __restrict__ n_valid, int topk,
                                                     int32_t* __restrict__ idx, int32_t* __restrict__ count) {
  using Scan = cub::BlockScan<int, TK_NT>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base_eq, s_base_out;
  const int64_t m = blockIdx.x;
  const float* row = score + m * ld;
  const int64_t nv = n_valid ? min((int64_t)max(n_valid[m], 0), n) : n;
  const int k = (int)min((int64_t)topk, nv);
  int32_t* out = idx + m * (int64_t)topk;
  for (int j = k + threadIdx.x; j < topk; j += TK_NT) out[j] = -1;
  if (count && threadIdx.x == 0) count[m] = k;
  if (k == 0) return;
  if (k == nv) {
    for (int j = threadIdx.x; j < k; j += TK_NT) out[j] = j;
    return;
  }
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int j = threadIdx.x; j < 256; j += TK_NT) hist[j] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < nv; i += TK_NT) {
      const uint32_t key = detail::f32_order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, dsel = 0;
      for (int dg = 255; dg >= 0; --dg) {
        if (cum + hist[dg] >= remaining) {
          dsel = dg;
          break;
        }
        cum += hist[dg];
      }
      s_remaining = remaining - cum;
      s_prefix = prefix | ((uint32_t)dsel << shift);
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix = the k-th largest key; take every key > prefix and the first `remaining` keys == prefix.
  if (threadIdx.x == 0) s_base_eq = 0, s_base_out = 0;
  __syncthreads();
  for (int64_t b = 0; b < nv; b += TK_NT) {
    const int64_t i = b + threadIdx.x;
    uint32_t key = 0;
    if (i < nv) key = detail::f32_order_key(row[i]);
    const int eq = (i < nv && key == prefix) ? 1 : 0;
    int eq_rank, eq_tot;
    Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_tot);
    __syncthreads();
    const int base_eq = s_base_eq, base_out = s_base_out;
    const int take = (i < nv) && (key > prefix || (eq && base_eq + eq_rank < remaining)) ? 1 : 0;
    int pos, tot;
    Scan(scan_tmp).ExclusiveSum(take, pos, tot);
    if (take) out[base_out + pos] = (int32_t)i;
    __syncthreads();
    if (threadIdx.x == 0) s_base_eq = base_eq + eq_tot, s_base_out = base_out + tot;
    __syncthreads();
    if (s_base_out >= k) break;
  }
}

}  // namespace

cudaError_t sink_attention(const bf16* q, int64_t M, int64_t ldq, int H, int d, const bf16* win,
                           const int32_t* win_lo, const int32_t* win_hi, const bf16* ent, const int32_t* ent_idx,
                           const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                           cudaStream_t s) {
  if (H % ATT_HG || ldq % 8 || ldo % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  dim3 grid((unsigned)M, (unsigned)(H / ATT_HG));
  if (d == 256)
    sink_attn_kernel<1><<<grid, 256, 0, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo);
  else if (d == 512)
    sink_attn_kernel<2><<<grid, 256, 0, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo);
  else
    return cudaErrorNotSupported;
  return cudaGetLastError();
}

cudaError_t indexer_scores(const bf16* qI, const float* gamma, int64_t M, int hI, int dI, const bf16* K,
                           const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                           float* score, cudaStream_t s) {
  if (hI % 16 || dI % 16 || hI * dI > 16384) return cudaErrorInvalidValue;
  if (M <= 0 || n_keys <= 0) return cudaSuccess;
  const size_t smem = (size_t)(hI + IDX_KT) * (dI + 8) * sizeof(bf16) + (size_t)hI * (IDX_KT + 4) * sizeof(float);
  static size_t configured = 0;
  if (smem > 48 * 1024 && smem > configured) {
    cudaError_t e = cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    configured = smem;
  }
  dim3 grid((unsigned)cdiv(n_keys, IDX_KT), (unsigned)M);
  indexer_kernel<<<grid, 128, smem, s>>>(qI, gamma, hI, dI, K, key_rows, n_keys, n_vis, qk_scale, score);
  return cudaGetLastError();
}

cudaError_t topk_rows(const float* score, int64_t M, int64_t n, int64_t ld, const int32_t* n_valid, int topk,
                      int32_t* idx, int32_t* count, cudaStream_t s) {
  if (topk <= 0) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  topk_kernel<<<(unsigned)M, TK_NT, 0, s>>>(score, n, ld, n_valid, topk, idx, count);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
