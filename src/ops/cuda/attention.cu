// Sink attention over (sliding window ∪ selected compressed entries), the lightning-indexer scores and
// the per-row top-k that picks the compressed entries. K = V: one d-wide bf16 row per key, shared by
// all heads (MQA), so a block takes 8 heads of one query and every key row it stages in shared memory
// is used by those 8 heads.
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <mma.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
using namespace nvcuda;

constexpr int ATT_HG = 8, ATT_CH = 32;

// DV = d / 256. v1 kept one key's partial dot per lane and reduced it across the warp for every key
// (32 unrolled reductions, 255 registers and a 1.5 KB spill: 2.7 ms for 64 decode queries). v2: the
// scores of a 32-key chunk are computed lane-per-key (lane r: q·k_r over all d, q broadcast from
// shared memory, key rows padded by 16 bytes so the 8 lanes of a quarter-warp hit distinct banks),
// then P·V runs channel-parallel (lane owns channels v·256 + lane·8 .. +8) with p_r broadcast by shuffle.
template <int DV>
__global__ void __launch_bounds__(256) sink_attn_kernel(const bf16* __restrict__ q, int64_t ldq, int H,
                                                        const bf16* __restrict__ win, const int32_t* __restrict__ win_lo,
                                                        const int32_t* __restrict__ win_hi,
                                                        const bf16* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                                                        const int64_t* __restrict__ ent_off,
                                                        const float* __restrict__ sinks, float scale,
                                                        float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int d = DV * 256, VPR = d / 8, KLD = d + 8;  // 16-byte vectors a key row; padded row
  __shared__ __align__(16) bf16 ks[ATT_CH * KLD];
  __shared__ __align__(16) bf16 qsm[ATT_HG * d];
  const int64_t m = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y * ATT_HG + warp;
  const int lo = win_lo[m], nw = win_hi[m] - lo;
  const int64_t e0 = ent_off ? ent_off[m] : 0;
  const int ne = ent_off ? (int)(ent_off[m + 1] - e0) : 0;
  const int n = nw + ne;
  for (int t = lane; t < VPR; t += 32)
    *reinterpret_cast<uint4*>(qsm + warp * d + t * 8) =
        *reinterpret_cast<const uint4*>(q + m * ldq + (int64_t)h * d + t * 8);

  float o[DV][8];
#pragma unroll
  for (int v = 0; v < DV; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[v][i] = 0.0f;
  float mrun = sinks[h], l = 1.0f;  // the sink: exp(sink − mrun) = 1 in the denominator
  const bf16* qw = qsm + warp * d;

  for (int c0 = 0; c0 < n; c0 += ATT_CH) {
    __syncthreads();
    for (int t = threadIdx.x; t < ATT_CH * VPR; t += 256) {
      const int r = t / VPR, c = t % VPR, j = c0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (j < n) {
        const bf16* src = j < nw ? win + (int64_t)(lo + j) * d : ent + (int64_t)ent_idx[e0 + (j - nw)] * d;
        val = *reinterpret_cast<const uint4*>(src + c * 8);
      }
      *reinterpret_cast<uint4*>(ks + r * KLD + c * 8) = val;
    }
    __syncthreads();
    // scores: lane ↔ key c0 + lane
    const bf16* kr = ks + lane * KLD;
    float dot = 0.0f;
#pragma unroll 4
    for (int c = 0; c < VPR; ++c) {
      const uint4 kv = *reinterpret_cast<const uint4*>(kr + c * 8);
      const uint4 qv = *reinterpret_cast<const uint4*>(qw + c * 8);
      const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kv);
      const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&qv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 kf = __bfloat1622float2(k2[i]), qf = __bfloat1622float2(q2[i]);
        dot += qf.x * kf.x;
        dot += qf.y * kf.y;
      }
    }
    const float sv = (c0 + lane < n) ? scale * dot : -INFINITY;
    const float mnew = fmaxf(mrun, detail::warp_max(sv));
    const float alpha = expf(mrun - mnew);
    const float p = expf(sv - mnew);  // 0 for masked keys
    l = l * alpha + detail::warp_sum(p);
#pragma unroll
    for (int v = 0; v < DV; ++v)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[v][i] *= alpha;
    const int nr = min(ATT_CH, n - c0);
    for (int r = 0; r < nr; ++r) {
      const float pr = __shfl_sync(0xffffffffu, p, r);
#pragma unroll
      for (int v = 0; v < DV; ++v) {
        const uint4 raw = *reinterpret_cast<const uint4*>(ks + r * KLD + v * 256 + lane * 8);
        const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(b2[i]);
          o[v][2 * i] += pr * f.x;
          o[v][2 * i + 1] += pr * f.y;
        }
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

// ---- tensor-core variant (experimental): MQA means all heads of a query share the keys, so per query
// S = Q[heads, d]·K[keys, d]ᵀ and O = P·V are small GEMMs. Block = one query × 32 heads, 8 warps,
// 32-key chunks; Q, the key chunk and the f32 O accumulator live in shared memory (WMMA fragments are
// opaque, so the per-row online-softmax rescale is done on O in shared memory). P is rounded to bf16
// before P·V (as [OFF] does), the row sums stay f32.
constexpr int TC_HB = 32, TC_CH = 32;

template <int D>
__global__ void __launch_bounds__(256) sink_attn_tc_kernel(const bf16* __restrict__ q, int64_t ldq,
                                                           const bf16* __restrict__ win,
                                                           const int32_t* __restrict__ win_lo,
                                                           const int32_t* __restrict__ win_hi,
                                                           const bf16* __restrict__ ent,
                                                           const int32_t* __restrict__ ent_idx,
                                                           const int64_t* __restrict__ ent_off,
                                                           const float* __restrict__ sinks, float scale,
                                                           float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int LQ = D + 8, LO = D + 4, LS = TC_CH + 4, LP = TC_CH + 8, VPR = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);                   // [TC_HB][LQ]
  bf16* Ks = Qs + TC_HB * LQ;                                 // [TC_CH][LQ]
  float* Os = reinterpret_cast<float*>(Ks + TC_CH * LQ);      // [TC_HB][LO]
  float* Ss = Os + TC_HB * LO;                                // [TC_HB][LS]
  bf16* Ps = reinterpret_cast<bf16*>(Ss + TC_HB * LS);        // [TC_HB][LP]
  float* st = reinterpret_cast<float*>(Ps + TC_HB * LP);      // mrun[TC_HB], l[TC_HB], alpha[TC_HB]
  float *mrun = st, *lsum = st + TC_HB, *alpha = st + 2 * TC_HB;
  const int64_t m = blockIdx.x;
  const int h0 = blockIdx.y * TC_HB;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lo = win_lo[m], nw = win_hi[m] - lo;
  const int64_t e0 = ent_off ? ent_off[m] : 0;
  const int ne = ent_off ? (int)(ent_off[m + 1] - e0) : 0;
  const int n = nw + ne;
  for (int t = tid; t < TC_HB * VPR; t += 256) {
    const int r = t / VPR, c = t % VPR;
    *reinterpret_cast<uint4*>(Qs + r * LQ + c * 8) =
        *reinterpret_cast<const uint4*>(q + m * ldq + (int64_t)(h0 + r) * D + c * 8);
  }
  for (int t = tid; t < TC_HB * LO; t += 256) Os[t] = 0.0f;
  if (tid < TC_HB) mrun[tid] = sinks[h0 + tid], lsum[tid] = 1.0f;
  for (int c0 = 0; c0 < n; c0 += TC_CH) {
    __syncthreads();
    for (int t = tid; t < TC_CH * VPR; t += 256) {
      const int r = t / VPR, c = t % VPR, j = c0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (j < n) {
        const bf16* src = j < nw ? win + (int64_t)(lo + j) * D : ent + (int64_t)ent_idx[e0 + (j - nw)] * D;
        val = *reinterpret_cast<const uint4*>(src + c * 8);
      }
      *reinterpret_cast<uint4*>(Ks + r * LQ + c * 8) = val;
    }
    __syncthreads();
    if (warp < 4) {  // S tile (hi, kj) of 16×16, full d
      const int hi = warp >> 1, kj = warp & 1;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll 4
      for (int kk = 0; kk < D; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, Qs + hi * 16 * LQ + kk, LQ);
        wmma::load_matrix_sync(fb, Ks + kj * 16 * LQ + kk, LQ);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(Ss + hi * 16 * LS + kj * 16, acc, LS, wmma::mem_row_major);
    }
    __syncthreads();
    // online softmax: warp w owns heads 4w..4w+3, lane = key
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = warp * 4 + i;
      const float sv = (c0 + lane < n) ? scale * Ss[h * LS + lane] : -INFINITY;
      const float mo = mrun[h];
      const float mnew = fmaxf(mo, detail::warp_max(sv));
      const float p = expf(sv - mnew);
      const float ps = detail::warp_sum(p);
      Ps[h * LP + lane] = __float2bfloat16_rn(p);
      if (lane == 0) {
        const float a = expf(mo - mnew);
        alpha[h] = a;
        lsum[h] = lsum[h] * a + ps;
        mrun[h] = mnew;
      }
    }
    __syncthreads();
    for (int t = tid; t < TC_HB * D; t += 256) {
      const int h = t / D, c = t % D;
      Os[h * LO + c] *= alpha[h];
    }
    __syncthreads();
    // O += P·V: 2 × (D/16) output tiles, spread over the 8 warps
    for (int tile = warp; tile < 2 * (D / 16); tile += 8) {
      const int hi = tile / (D / 16), dj = tile % (D / 16);
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, Os + hi * 16 * LO + dj * 16, LO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < TC_CH; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, Ps + hi * 16 * LP + kk, LP);
        wmma::load_matrix_sync(fb, Ks + kk * LQ + dj * 16, LQ);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(Os + hi * 16 * LO + dj * 16, acc, LO, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int t = tid; t < TC_HB * (D / 4); t += 256) {
    const int h = t / (D / 4), c = (t % (D / 4)) * 4;
    const float inv = 1.0f / lsum[h];
    const float* o = Os + h * LO + c;
    *reinterpret_cast<float4*>(out + m * ldo + (int64_t)(h0 + h) * D + c) =
        make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
  }
}

template <int D>
constexpr size_t tc_smem() {
  return (size_t)(TC_HB + TC_CH) * (D + 8) * 2 + (size_t)TC_HB * (D + 4) * 4 + (size_t)TC_HB * (TC_CH + 4) * 4 +
         (size_t)TC_HB * (TC_CH + 8) * 2 + 3 * TC_HB * 4;
}

// ---- lightning indexer: one block = one query × 64 keys; 4 warps, warp w owns keys 16w..16w+16 ----
constexpr int IDX_KT = 64;

__global__ void __launch_bounds__(128) indexer_kernel(const bf16* __restrict__ qI, const float* __restrict__ gamma,
                                                      int hI, int dI, const bf16* __restrict__ K,
                                                      const int32_t* __restrict__ key_rows, int64_t n_keys,
                                                      const int32_t* __restrict__ n_vis, float qk_scale,
                                                      float* __restrict__ score) {
  DI_PDL_WAIT();
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

// A pass's digit: the first digit d, from 255 down, whose bins d..255 together hold ≥ `remaining` keys,
// and what remains inside it. Threads 0..255 take digit 255 − tid (a suffix sum as warp scans plus the
// 8 warp totals): the choice of the thread-0 loop it replaces (2.8 µs a pass at 256 serial steps),
// in a few hundred cycles. Called by every thread of the block (it synchronizes); wsum: 8 ints.
__device__ __forceinline__ void tk_pick_digit(const int* hist, int remaining, uint32_t prefix, int shift, int* wsum,
                                              uint32_t* s_prefix, int* s_remaining) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int dg = 255 - tid;
  int v = tid < 256 ? hist[dg] : 0, incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (tid < 256 && lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (tid < 256) {
    for (int w = 0; w < warp; ++w) incl += wsum[w];
    const int excl = incl - v;
    if (excl < remaining && incl >= remaining) *s_prefix = prefix | ((uint32_t)dg << shift), *s_remaining = remaining - excl;
  }
}

__global__ void __launch_bounds__(TK_NT) topk_kernel(const float* __restrict__ score, int64_t n, int64_t ld,
                                                     const int32_t* __restrict__ n_valid, int topk,
                                                     int32_t* __restrict__ idx, int32_t* __restrict__ count) {
  DI_PDL_WAIT();
  using Scan = cub::BlockScan<int, TK_NT>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base_eq, s_base_out, wsum[8];
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
    tk_pick_digit(hist, remaining, prefix, shift, wsum, &s_prefix, &s_remaining);
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

// Long rows (the CSA candidate list at long context: n = 262144 at 1M tokens): a cluster of TK_CL
// blocks per row. Each block histograms its slice; the digit choice sums the TK_CL histograms in rank
// order through distributed shared memory; the compaction gives each block its output offset from the
// counts of the blocks before it, so the indices still come out ascending. v1 (one block per row) took
// 404 µs for 4 rows of 262144.
constexpr int TK_CL = 8;

__global__ void __cluster_dims__(TK_CL, 1, 1) __launch_bounds__(TK_NT)
    topk_cluster_kernel(const float* __restrict__ score, int64_t n, int64_t ld, const int32_t* __restrict__ n_valid,
                        int topk, int32_t* __restrict__ idx, int32_t* __restrict__ count) {
  DI_PDL_WAIT();
  namespace cg = cooperative_groups;
  using Scan = cub::BlockScan<int, TK_NT>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256], ghist[256];
  __shared__ int cnt[2];  // this block's {#key > T, #key == T}
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base_eq, s_base_out, wsum[8];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int64_t m = blockIdx.x / TK_CL;
  const float* row = score + m * ld;
  const int64_t nv = n_valid ? min((int64_t)max(n_valid[m], 0), n) : n;
  const int k = (int)min((int64_t)topk, nv);
  int32_t* out = idx + m * (int64_t)topk;
  const int64_t per = (nv + TK_CL - 1) / TK_CL;
  const int64_t lo = min(nv, rank * per), hi = min(nv, lo + per);
  if (rank == 0) {
    for (int j = k + threadIdx.x; j < topk; j += TK_NT) out[j] = -1;
    if (count && threadIdx.x == 0) count[m] = k;
  }
  if (k == 0) return;  // uniform over the cluster
  if (k == nv) {
    for (int64_t j = lo + threadIdx.x; j < hi; j += TK_NT) out[j] = (int32_t)j;
    return;
  }
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int j = threadIdx.x; j < 256; j += TK_NT) hist[j] = 0;
    __syncthreads();
    for (int64_t i = lo + threadIdx.x; i < hi; i += TK_NT) {
      const uint32_t key = detail::f32_order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    cluster.sync();
    for (int j = threadIdx.x; j < 256; j += TK_NT) {
      int t = 0;
      for (int b = 0; b < TK_CL; ++b) t += cluster.map_shared_rank(hist, b)[j];
      ghist[j] = t;
    }
    __syncthreads();
    tk_pick_digit(ghist, remaining, prefix, shift, wsum, &s_prefix, &s_remaining);
    cluster.sync();  // nobody clears its histogram while another block still reads it
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  // this block's counts, then its offsets from the blocks before it
  int gt = 0, eq = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += TK_NT) {
    const uint32_t key = detail::f32_order_key(row[i]);
    gt += key > prefix;
    eq += key == prefix;
  }
  int tot_gt, tot_eq;
  {
    int dummy;
    Scan(scan_tmp).ExclusiveSum(gt, dummy, tot_gt);
    __syncthreads();
    Scan(scan_tmp).ExclusiveSum(eq, dummy, tot_eq);
  }
  if (threadIdx.x == 0) cnt[0] = tot_gt, cnt[1] = tot_eq;
  cluster.sync();
  if (threadIdx.x == 0) {
    int e_before = 0, out_before = 0;
    for (int b = 0; b < rank; ++b) {
      const int* c = cluster.map_shared_rank(cnt, b);
      const int take_eq = max(0, min(c[1], remaining - e_before));
      out_before += c[0] + take_eq;
      e_before += c[1];
    }
    s_base_eq = e_before, s_base_out = out_before;
  }
  cluster.sync();  // remote counts read: blocks may now leave
  for (int64_t b = lo; b < hi; b += TK_NT) {
    const int64_t i = b + threadIdx.x;
    uint32_t key = 0;
    if (i < hi) key = detail::f32_order_key(row[i]);
    const int e = (i < hi && key == prefix) ? 1 : 0;
    int eq_rank, eq_tot;
    Scan(scan_tmp).ExclusiveSum(e, eq_rank, eq_tot);
    __syncthreads();
    const int base_eq = s_base_eq, base_out = s_base_out;
    const int take = (i < hi) && (key > prefix || (e && base_eq + eq_rank < remaining)) ? 1 : 0;
    int pos, tot;
    Scan(scan_tmp).ExclusiveSum(take, pos, tot);
    if (take) out[base_out + pos] = (int32_t)i;
    __syncthreads();
    if (threadIdx.x == 0) s_base_eq = base_eq + eq_tot, s_base_out = base_out + tot;
    __syncthreads();
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

cudaError_t sink_attention_tc(const bf16* q, int64_t M, int64_t ldq, int H, int d, const bf16* win,
                              const int32_t* win_lo, const int32_t* win_hi, const bf16* ent, const int32_t* ent_idx,
                              const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                              cudaStream_t s) {
  if (H % TC_HB || ldq % 8 || ldo % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  dim3 grid((unsigned)M, (unsigned)(H / TC_HB));
  // (the kernels' shared-memory attribute: init_kernel_attributes)
  auto go = [&](auto kern, size_t smem) -> cudaError_t {
    kern<<<grid, 256, smem, s>>>(q, ldq, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo);
    return cudaGetLastError();
  };
  if (d == 512) return go(sink_attn_tc_kernel<512>, tc_smem<512>());
  if (d == 256) return go(sink_attn_tc_kernel<256>, tc_smem<256>());
  return cudaErrorNotSupported;
}

cudaError_t indexer_scores(const bf16* qI, const float* gamma, int64_t M, int hI, int dI, const bf16* K,
                           const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                           float* score, cudaStream_t s) {
  if (hI % 16 || dI % 16 || hI * dI > 16384) return cudaErrorInvalidValue;
  if (M <= 0 || n_keys <= 0) return cudaSuccess;
  const size_t smem = (size_t)(hI + IDX_KT) * (dI + 8) * sizeof(bf16) + (size_t)hI * (IDX_KT + 4) * sizeof(float);
  // (shared-memory attribute: all the device allows, set by init_kernel_attributes)
  dim3 grid((unsigned)cdiv(n_keys, IDX_KT), (unsigned)M);
  indexer_kernel<<<grid, 128, smem, s>>>(qI, gamma, hI, dI, K, key_rows, n_keys, n_vis, qk_scale, score);
  return cudaGetLastError();
}

cudaError_t topk_rows(const float* score, int64_t M, int64_t n, int64_t ld, const int32_t* n_valid, int topk,
                      int32_t* idx, int32_t* count, cudaStream_t s) {
  if (topk <= 0) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  if (n > 32768)
    topk_cluster_kernel<<<(unsigned)(M * TK_CL), TK_NT, 0, s>>>(score, n, ld, n_valid, topk, idx, count);
  else
    topk_kernel<<<(unsigned)M, TK_NT, 0, s>>>(score, n, ld, n_valid, topk, idx, count);
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_attention() {
  return first_error({set_max_dynamic_smem(sink_attn_tc_kernel<512>, tc_smem<512>()),
                      set_max_dynamic_smem(sink_attn_tc_kernel<256>, tc_smem<256>()),
                      set_max_dynamic_smem(indexer_kernel, (size_t)1 << 30)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
