// Sink attention on tensor cores (attention_mma): the Backend::sink_attention contract (f32 q, keys and
// out; K = V: one shared KV head for all H query heads) with the two products as bf16 GEMMs with f32
// accumulation on mma.sync m16n8k16:  S = Q[64 heads, d]·Kᵀ[d, keys] and O = P[64 heads, keys]·V[keys, d].
//
// Work split (docs/cuda-notes.md, "Attention on tensor cores (attention_mma)"):
//  - grid (M·8, ⌈H/64⌉), clusters of 8 CTAs = one query × one group of 64 heads. Cluster rank
//    r = 2·split + half: `half` owns columns [half·d/2, half·d/2 + d/2) of q, keys and out; `split`
//    (0..3) owns a contiguous range of 32-key tiles. The number of splits used by a query, and its
//    ranges, depend only on that query's key count (batch invariance).
//  - per 32-key tile, each CTA gathers its half of the 32 key rows (f32, cp.async, one tile ahead) into
//    shared memory, converts them to bf16, computes the partial S over its half of d (warp = 16 heads ×
//    16 keys), and the two halves exchange partial S through distributed shared memory (one cluster
//    barrier a tile, S double-buffered); both sum in the fixed order half0 + half1, so both see the
//    same S and compute the same online softmax (f32, the sink enters at the end). P is rounded to
//    bf16 for P·V (warp = all 64 heads × d/16 columns; O stays in f32 registers: 64 at d = 512).
//  - at the end each split's (max, sum, O) is merged in split order through distributed shared
//    memory: CTA (split j, half) finalizes heads 16j .. 16j+15 of its half of the columns.
// Heads beyond H in the last group are zero rows (computed, not stored).
// That is v1 (sink_attention_mma_v1). v2 (sink_attention_mma, further down) keeps the arithmetic and puts
// both halves of d in one CTA of 512 threads: no per-tile cluster barrier (docs/cuda-notes.md,
// "Prefill attention v2").
#include <cooperative_groups.h>

#include <climits>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/cuda/wgmma_bits.cuh"

namespace deepinfer::cuda {
namespace {
namespace cg = cooperative_groups;

constexpr int AM_NT = 256;  // threads
constexpr int AM_KT = 32;   // keys per tile
constexpr int AM_HB = 64;   // heads per cluster (mma M)
constexpr int AM_KS = 4;    // key splits per query (cluster = 2 halves × AM_KS)
constexpr int AM_CS = 2 * AM_KS;
// A split gets at least AM_TMIN tiles: splits = min(4, ⌈tiles / AM_TMIN⌉). The cluster's 8 CTAs are
// resident whatever the count, so an idle split only wastes its slot: 1 (every split busy from 4 tiles on).
constexpr int AM_TMIN = 1;
constexpr int AM_SPS = AM_KT + 4;  // S row stride (floats)
constexpr int AM_PPS = AM_KT + 8;  // P row stride (bf16): 80 B, ldmatrix rows in distinct bank groups

// Shared memory layout (bytes) for half width DH = d/2.
struct AmLayout {
  int q, k, stg, s, p, cr, ml, wt, total;
  __host__ __device__ constexpr explicit AmLayout(int DH)
      : q(0),
        k(q + AM_HB * (DH + 8) * 2),
        stg(k + AM_KT * (DH + 8) * 2),
        s(stg + AM_KT * DH * 4),
        p(s + 2 * AM_HB * AM_SPS * 4),
        cr(p + AM_HB * AM_PPS * 2),
        ml(cr + AM_HB * 4),
        wt(ml + AM_HB * 2 * 4),
        total(wt + AM_HB * (AM_KS + 1) * 4) {}
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}
// d[4] += a[4]·b[2]: m16n8k16, A row-major bf16, B col-major bf16, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low 16 bits)
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Every kernel of this file gives the same bits because they share these two rules (one definition each):
// a query's keys and the tile range [t0, t1) of key split `split` — n = window + entry keys, T = ⌈n / 32⌉ tiles,
// ns = min(4, ⌈T / AM_TMIN⌉) splits, split j gets tiles [⌊j·T/ns⌋, ⌊(j+1)·T/ns⌋) (a function of n only: batch
// invariant); splits ≥ ns are empty.
struct AmKeys {
  int64_t lo, e0;  // first window row, first entry index
  int nw, n, T, ns, t0, t1;
};
__device__ __forceinline__ AmKeys am_keys(const int32_t* win_lo, const int32_t* win_hi, const int64_t* ent_off,
                                          int64_t m, int split) {
  AmKeys k;
  k.lo = win_lo[m];
  k.nw = win_hi[m] - win_lo[m];
  k.e0 = ent_off ? ent_off[m] : 0;
  const int ne = ent_off ? (int)(ent_off[m + 1] - k.e0) : 0;
  k.n = k.nw + ne;
  k.T = (k.n + AM_KT - 1) / AM_KT;
  k.ns = max(1, min(AM_KS, (k.T + AM_TMIN - 1) / AM_TMIN));
  k.t0 = split < k.ns ? (int)((int64_t)split * k.T / k.ns) : k.T;
  k.t1 = split < k.ns ? (int)((int64_t)(split + 1) * k.T / k.ns) : k.T;
  return k;
}
// and the merge's weights for one head from its splits' (max mj, sum lj) and its sink: w_j = exp(mj − mx), 0 for
// an empty split, mx = max(sink, mj), L = exp(sink − mx) + Σ lj·w_j in split order; wt[0..AM_KS) = w, wt[AM_KS] = 1/L.
__device__ __forceinline__ void am_merge_weights(float sink, const float (&mj)[AM_KS], const float (&lj)[AM_KS],
                                                 float* wt) {
  float mx = sink;
#pragma unroll
  for (int j = 0; j < AM_KS; ++j) mx = fmaxf(mx, mj[j]);
  float Lsum = expf(sink - mx);
#pragma unroll
  for (int j = 0; j < AM_KS; ++j) {
    const float w = mj[j] == -INFINITY ? 0.0f : expf(mj[j] - mx);
    Lsum = fmaf(lj[j], w, Lsum);
    wt[j] = w;
  }
  wt[AM_KS] = 1.0f / Lsum;
}

// D = d (64, 128, 256, 512); DH = D/2 columns per CTA.
template <int D>
__global__ void __cluster_dims__(AM_CS, 1, 1) __launch_bounds__(AM_NT, 2)
    sink_attn_mma_kernel(const float* __restrict__ q, int64_t ldq, int H, const float* __restrict__ win,
                         const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi,
                         const float* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                         const int64_t* __restrict__ ent_off, const float* __restrict__ sinks, float scale,
                         float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int DH = D / 2;
  constexpr int QS = DH + 8;             // Q / K row stride (bf16): (DH+8)·2 B ≡ 16 mod 32 B
  constexpr int KSTEPS = DH / 16;        // S: k-steps over this half of d
  constexpr int NTILES = DH / 8;         // P·V: n8 tiles over this half of d
  constexpr int WC = NTILES >= 8 ? 8 : NTILES;  // warps along the columns
  constexpr int WH = 8 / WC;             // warps along the heads
  constexpr int MT = 4 / WH;             // m16 tiles a warp owns in P·V
  constexpr int NT = NTILES / WC;        // n8 tiles a warp owns in P·V
  static_assert(D % 64 == 0 && D <= 512 && WH * WC == 8 && MT >= 1 && NT >= 1, "shape");
  constexpr AmLayout L(DH);

  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem + L.q);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L.k);
  float* Stg = reinterpret_cast<float*>(smem + L.stg);
  float* Sp = reinterpret_cast<float*>(smem + L.s);
  bf16* Ps = reinterpret_cast<bf16*>(smem + L.p);
  float* Cr = reinterpret_cast<float*>(smem + L.cr);
  float* ML = reinterpret_cast<float*>(smem + L.ml);
  float* Wt = reinterpret_cast<float*>(smem + L.wt);

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int half = rank & 1, split = rank >> 1;
  const int64_t m = blockIdx.x / AM_CS;
  const int g0 = blockIdx.y * AM_HB;  // first head of this group
  const int hv = min(AM_HB, H - g0);  // valid heads in the group
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const int c0 = half * DH;           // first column of this half

  // this query's keys and this split's tile range (a function of the key count only)
  const AmKeys kr = am_keys(win_lo, win_hi, ent_off, m, split);
  const int64_t lo = kr.lo, e0 = kr.e0;
  const int nw = kr.nw, n = kr.n, T = kr.T, ns = kr.ns, t0 = kr.t0, t1 = kr.t1;
  const int NI = (T + ns - 1) / ns;  // iterations (same on every rank of the cluster)

  auto issue = [&](int t) {  // cp.async of tile t's rows (this half's columns) into Stg
    constexpr int CPR = DH / 4;  // 16-byte chunks a row
    for (int idx = tid; idx < AM_KT * CPR; idx += AM_NT) {
      const int r = idx / CPR, ch = idx % CPR;
      const int i = t * AM_KT + r;
      if (i >= n) continue;
      const float* src = i < nw ? win + (lo + i) * (int64_t)D : ent + (int64_t)ent_idx[e0 + i - nw] * D;
      detail::cp_async16(Stg + r * DH + ch * 4, src + c0 + ch * 4);
    }
    detail::cp_async_commit();
  };
  if (t0 < t1) issue(t0);

  // q (f32, any stride) → bf16 rows of Qs; heads ≥ hv are zero
  for (int idx = tid; idx < AM_HB * (DH / 2); idx += AM_NT) {
    const int h = idx / (DH / 2), c = 2 * (idx % (DH / 2));
    float a = 0.0f, b = 0.0f;
    if (h < hv) {
      const float* qr = q + m * ldq + (int64_t)(g0 + h) * D + c0 + c;
      a = qr[0], b = qr[1];
    }
    *reinterpret_cast<uint32_t*>(Qs + h * QS + c) = pack_bf16(a, b);
  }

  // fragment coordinates
  const int gq = lane >> 2, cq = lane & 3;  // accumulator row / column pair
  const int lr = lane & 7, lj = lane >> 3;  // ldmatrix: row in 8×8 matrix, matrix index
  // S phase: warp = head tile sh (16 heads) × key half sk (16 keys)
  const int sh = wp & 3, sk = wp >> 2;
  // P·V phase: warp = head tiles [ph·MT, +MT) × n8 tiles [pc·NT, +NT)
  const int ph = wp / WC, pc = wp % WC;
  float o[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][j][e] = 0.0f;
  // online softmax state of head 8·wp + u held by lane u (u < 8): 2 registers instead of 16
  float mreg = -INFINITY, lreg = 0.0f;

  for (int it = 0; it < NI; ++it) {
    const int t = t0 + it;
    const bool valid = t < t1;  // uniform over the pair of halves
    float* Sb = Sp + (it & 1) * AM_HB * AM_SPS;
    const int nv = valid ? min(AM_KT, n - t * AM_KT) : 0;
    if (valid) {
      detail::cp_async_wait<0>();
      __syncthreads();  // Stg filled (all threads' copies); Qs written; previous P·V done with Ks
      for (int idx = tid; idx < AM_KT * (DH / 4); idx += AM_NT) {  // f32 → bf16; rows ≥ nv are zeros
        const int r = idx / (DH / 4), c = 4 * (idx % (DH / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < nv) v = *reinterpret_cast<const float4*>(Stg + r * DH + c);
        *reinterpret_cast<uint2*>(Ks + r * QS + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
      }
      __syncthreads();  // Ks ready, Stg free
      if (t + 1 < t1) issue(t + 1);
      // partial S over this half: rows 16·sh .., keys 16·sk ..
      float acc[2][4] = {};
      const bf16* qa = Qs + (16 * sh + lr + 8 * (lj & 1)) * QS + 8 * (lj >> 1);
      const bf16* kb = Ks + (16 * sk + lr + 8 * (lj >> 1)) * QS + 8 * (lj & 1);
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4], b[4];
        ldsm_x4(a, qa + 16 * ks);
        ldsm_x4(b, kb + 16 * ks);
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = 16 * sk + 8 * j + 2 * cq;
        *reinterpret_cast<float2*>(Sb + (16 * sh + gq) * AM_SPS + col) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(Sb + (16 * sh + gq + 8) * AM_SPS + col) = make_float2(acc[j][2], acc[j][3]);
      }
    }
    cluster.sync();  // both halves' partial S visible (and the pair's previous reads of this buffer done)
    if (valid) {
      const float* S0 = cluster.map_shared_rank(Sb, (unsigned)(rank & ~1));
      const float* S1 = cluster.map_shared_rank(Sb, (unsigned)(rank | 1));
#pragma unroll
      for (int u = 0; u < 8; ++u) {  // head h = 8·wp + u, lane = key
        const int h = 8 * wp + u;
        float s = -INFINITY;
        if (lane < nv) s = __fmul_rn(__fadd_rn(S0[h * AM_SPS + lane], S1[h * AM_SPS + lane]), scale);
        const float mo = __shfl_sync(0xffffffffu, mreg, u), lo_ = __shfl_sync(0xffffffffu, lreg, u);
        const float mn = fmaxf(mo, detail::warp_max(s));
        const float p = s == -INFINITY ? 0.0f : expf(s - mn);
        const float c = mn == -INFINITY ? 1.0f : expf(mo - mn);  // 0 while nothing was seen
        const float ln = fmaf(lo_, c, detail::warp_sum(p));
        if (lane == u) mreg = mn, lreg = ln;
        Ps[h * AM_PPS + lane] = __float2bfloat16_rn(p);
        if (lane == 0) Cr[h] = c;
      }
      __syncthreads();  // Ps, Cr ready
      // O = O·c + P·V over this tile
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r0 = 16 * (ph * MT + i) + gq;
        const float ca = Cr[r0], cb = Cr[r0 + 8];
#pragma unroll
        for (int j = 0; j < NT; ++j) o[i][j][0] *= ca, o[i][j][1] *= ca, o[i][j][2] *= cb, o[i][j][3] *= cb;
      }
#pragma unroll
      for (int ks = 0; ks < AM_KT / 16; ++ks) {
        uint32_t a[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
          ldsm_x4(a[i], Ps + (16 * (ph * MT + i) + lr + 8 * (lj & 1)) * AM_PPS + 16 * ks + 8 * (lj >> 1));
        if constexpr (NT % 2 == 0) {
#pragma unroll
          for (int j = 0; j < NT; j += 2) {
            uint32_t b[4];  // keys 16ks + lr + 8(lj&1), columns 8(pc·NT + j) + 8(lj>>1)
            ldsm_x4_t(b, Ks + (16 * ks + lr + 8 * (lj & 1)) * QS + 8 * (pc * NT + j) + 8 * (lj >> 1));
#pragma unroll
            for (int i = 0; i < MT; ++i) {
              mma_bf16(o[i][j], a[i], b[0], b[1]);
              mma_bf16(o[i][j + 1], a[i], b[2], b[3]);
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            uint32_t b[2];  // lanes 0..15 give the addresses
            ldsm_x2_t(b, Ks + (16 * ks + lr + 8 * (lj & 1)) * QS + 8 * (pc * NT + j));
#pragma unroll
            for (int i = 0; i < MT; ++i) mma_bf16(o[i][j], a[i], b[0], b[1]);
          }
        }
      }
    }
  }

  // this split's partial (max, sum, O) into shared memory; O over Qs/Ks/Stg (no longer used)
  detail::cp_async_wait<0>();
  __syncthreads();
  float* Op = reinterpret_cast<float*>(smem);  // [64][DH]
  if (lane < 8) ML[2 * (8 * wp + lane)] = mreg, ML[2 * (8 * wp + lane) + 1] = lreg;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r0 = 16 * (ph * MT + i) + gq, col = 8 * (pc * NT + j) + 2 * cq;
      *reinterpret_cast<float2*>(Op + r0 * DH + col) = make_float2(o[i][j][0], o[i][j][1]);
      *reinterpret_cast<float2*>(Op + (r0 + 8) * DH + col) = make_float2(o[i][j][2], o[i][j][3]);
    }
  cluster.sync();
  // merge: this CTA finalizes heads [16·split, +16) of its half, splits taken in order 0..3
  constexpr int HPS = AM_HB / AM_KS;
  const int hb = HPS * split;
  if (tid < HPS) {
    const int h = hb + tid;
    const float sink = g0 + h < H ? sinks[g0 + h] : 0.0f;
    float mj[AM_KS], lj[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) {
      const float* mlj = cluster.map_shared_rank(ML, (unsigned)(2 * j + half));
      mj[j] = mlj[2 * h], lj[j] = mlj[2 * h + 1];
    }
    am_merge_weights(sink, mj, lj, Wt + tid * (AM_KS + 1));
  }
  __syncthreads();
  {
    const float* opr[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) opr[j] = cluster.map_shared_rank(Op, (unsigned)(2 * j + half));
    for (int idx = tid; idx < HPS * (DH / 4); idx += AM_NT) {
      const int hl = idx / (DH / 4), c = 4 * (idx % (DH / 4));
      const int h = hb + hl;
      if (h >= hv) continue;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < AM_KS; ++j) {
        const float wj = Wt[hl * (AM_KS + 1) + j];
        if (wj == 0.0f) continue;  // an empty split (or one outweighed to 0): its O is 0
        const float4 v = *reinterpret_cast<const float4*>(opr[j] + h * DH + c);
        a.x = fmaf(v.x, wj, a.x), a.y = fmaf(v.y, wj, a.y), a.z = fmaf(v.z, wj, a.z), a.w = fmaf(v.w, wj, a.w);
      }
      const float inv = Wt[hl * (AM_KS + 1) + AM_KS];
      float* orow = out + m * ldo + (int64_t)(g0 + h) * D + c0 + c;
      orow[0] = __fmul_rn(a.x, inv), orow[1] = __fmul_rn(a.y, inv), orow[2] = __fmul_rn(a.z, inv),
      orow[3] = __fmul_rn(a.w, inv);
    }
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int D>
cudaError_t am_launch(const float* q, int64_t M, int64_t ldq, int H, const float* win, const int32_t* win_lo,
                      const int32_t* win_hi, const float* ent, const int32_t* ent_idx, const int64_t* ent_off,
                      const float* sinks, float scale, float* out, int64_t ldo, cudaStream_t s) {
  constexpr AmLayout L(D / 2);
  // (its attributes, L.total of dynamic shared memory and the max-shared carveout: am_attrs, once)
  const int64_t bx = M * AM_CS;
  if (bx > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)bx, (unsigned)((H + AM_HB - 1) / AM_HB));
  sink_attn_mma_kernel<D><<<grid, AM_NT, L.total, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks,
                                                      scale, out, ldo);
  return cudaGetLastError();
}

// Set once (init_kernel_attributes): L.total bytes of dynamic shared memory, and the largest carveout so
// that two CTAs (2 × 106.5 KB at d = 512) fit an SM.
template <int D>
cudaError_t am_attrs() {
  constexpr AmLayout L(D / 2);
  return detail::first_error({detail::set_max_dynamic_smem(sink_attn_mma_kernel<D>, (size_t)L.total),
                              cudaFuncSetAttribute(sink_attn_mma_kernel<D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   (int)cudaSharedmemCarveoutMaxShared)});
}

template <int D>
int am_max_clusters() {
  constexpr AmLayout L(D / 2);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(AM_CS * 1024, 1, 1);
  cfg.blockDim = dim3(AM_NT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)L.total;
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, sink_attn_mma_kernel<D>, &cfg) != cudaSuccess) return -1;
  return n;
}


// ---- v2: one CTA of 512 threads per (query, 64 heads, key split), clusters of AM_KS ----
// v1 (above) puts the two halves of d in two CTAs and exchanges partial S through distributed shared
// memory with a cluster barrier (all 8 CTAs) on every 32-key tile; the measured prefill ran at 51
// TFLOP/s, latency-bound (docs/cuda-notes.md, "Prefill attention v2"). v2 puts both halves in one CTA
// (warps 0–7: columns [0, d/2), warps 8–15: [d/2, d)), so the per-tile exchange is a __syncthreads and
// local shared memory, the softmax runs once per CTA (16 warps × 4 heads instead of 2 × 8 warps × 8
// heads), the keys are double-buffered in bf16 (the next tile's conversion overlaps P·V; three barriers
// a tile), the pool rows are loaded a tile ahead (v1 waited on one index load per copy), and q is loaded
// with 16 load pairs in flight a thread. The cluster of AM_KS CTAs only meets for the final merge. Every arithmetic step (bf16 rounding, MMA k-order, the two halves'
// sum, online softmax, merge order) is v1's, so v2 equals v1 bitwise (tested). Same registers a thread
// and threads an SM as v1 (one CTA of 512 instead of two of 256).
constexpr int A2_NT = 512;

// Shared memory layout (bytes), full width D. The merge's O [64][D] f32 reuses [0, s).
struct A2Layout {
  int q, k, stg, s, p, cr, ml, wt, total;
  __host__ __device__ constexpr explicit A2Layout(int D)
      : q(0),
        k(q + AM_HB * (D + 8) * 2),
        stg(k + 2 * AM_KT * (D + 8) * 2),
        s(stg + AM_KT * D * 4),
        p(s + 2 * AM_HB * AM_SPS * 4),
        cr(p + AM_HB * AM_PPS * 2),
        ml(cr + AM_HB * 4),
        wt(ml + AM_HB * 2 * 4),
        total(wt + (AM_HB / AM_KS) * (AM_KS + 1) * 4) {}
};

template <int D>
__global__ void __cluster_dims__(AM_KS, 1, 1) __launch_bounds__(A2_NT, 1)
    sink_attn_mma2_kernel(const float* __restrict__ q, int64_t ldq, int H, const float* __restrict__ win,
                          const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi,
                          const float* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                          const int64_t* __restrict__ ent_off, const float* __restrict__ sinks, float scale,
                          float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int DH = D / 2;
  constexpr int QS = D + 8;              // Q / K row stride (bf16): (D+8)·2 B ≡ 16 mod 128 B
  constexpr int KSTEPS = DH / 16;        // S: k-steps over one half of d
  constexpr int NTILES = DH / 8;         // P·V: n8 tiles over one half of d
  constexpr int WC = NTILES >= 8 ? 8 : NTILES;  // warps of a half along the columns
  constexpr int WH = 8 / WC;             // warps of a half along the heads
  constexpr int MT = 4 / WH;             // m16 tiles a warp owns in P·V
  constexpr int NT = NTILES / WC;        // n8 tiles a warp owns in P·V
  constexpr int CPR = D / 4;             // 16-byte chunks a key row
  constexpr int RPP = A2_NT / CPR;       // key rows a copy pass covers (4 at d = 512 .. 32 at d = 64)
  constexpr int PASSES = AM_KT / RPP;    // copy passes a tile (8 .. 1)
  static_assert(D % 64 == 0 && D <= 512 && WH * WC == 8 && MT >= 1 && NT >= 1 && PASSES * RPP == AM_KT, "shape");
  constexpr A2Layout L(D);
  static_assert(AM_HB * D * 4 <= L.s, "merge O must fit below S");

  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem + L.q);    // [64][QS] both halves
  bf16* Ks0 = reinterpret_cast<bf16*>(smem + L.k);   // [2][32][QS]: tile t in buffer t & 1
  float* Stg = reinterpret_cast<float*>(smem + L.stg);  // [32][D] f32 copy target
  float* Sp = reinterpret_cast<float*>(smem + L.s);  // [2 halves][64][AM_SPS] partial S
  bf16* Ps = reinterpret_cast<bf16*>(smem + L.p);
  float* Cr = reinterpret_cast<float*>(smem + L.cr);
  float* ML = reinterpret_cast<float*>(smem + L.ml);
  float* Wt = reinterpret_cast<float*>(smem + L.wt);

  cg::cluster_group cluster = cg::this_cluster();
  const int split = (int)cluster.block_rank();
  const int64_t m = blockIdx.x / AM_KS;
  const int g0 = blockIdx.y * AM_HB;
  const int hv = min(AM_HB, H - g0);
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const int hf = wp >> 3, wl = wp & 7;  // half of d, warp within the half
  const int c0 = hf * DH;

  // keys and split ranges: v1's (a function of the key count only)
  const AmKeys kr = am_keys(win_lo, win_hi, ent_off, m, split);
  const int64_t lo = kr.lo, e0 = kr.e0;
  const int nw = kr.nw, n = kr.n, T = kr.T, ns = kr.ns, t0 = kr.t0, t1 = kr.t1;

  // A thread copies chunk ch of rows r0 + k·RPP of a tile into Stg and later converts exactly those
  // chunks: its own cp.async.wait covers them, and it may copy the next tile into them as soon as it
  // has converted them (no barrier). Pool rows: lane i of every warp loads the row of key 32·t + i one
  // tile ahead (one coalesced load a warp), the copy takes them by shuffle.
  const int ch = tid % CPR, r0 = tid / CPR;
  auto row_of = [&](int t) -> int {
    const int i = t * AM_KT + lane;
    return i >= n ? 0 : i < nw ? (int)(lo + i) : ent_idx[e0 + i - nw];
  };
  auto copy = [&](int t, int rowreg) {  // all lanes (shuffles)
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      const int r = r0 + k * RPP, i = t * AM_KT + r;
      const int row = __shfl_sync(0xffffffffu, rowreg, r);
      if (i < n) detail::cp_async16(Stg + r * D + ch * 4, (i < nw ? win : ent) + (int64_t)row * D + ch * 4);
    }
    detail::cp_async_commit();
  };
  auto convert = [&](int t) {  // own chunks of tile t, f32 → bf16 into Ks buffer t & 1; rows ≥ nv are zeros
    const int nv = min(AM_KT, n - t * AM_KT);
    bf16* Kb = Ks0 + (t & 1) * AM_KT * QS;
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      const int r = r0 + k * RPP;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < nv) v = *reinterpret_cast<const float4*>(Stg + r * D + ch * 4);
      *reinterpret_cast<uint2*>(Kb + r * QS + ch * 4) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  };
  int rnext = 0;  // rows of tile t + 2 while tile t is processed (t0 + 1 in the prologue)
  if (t0 < t1) {
    const int r = row_of(t0);
    if (t0 + 1 < t1) rnext = row_of(t0 + 1);
    copy(t0, r);
  }

  // q (f32, any stride) → bf16; heads ≥ hv are zero. U (≤ 16) load pairs in flight a thread before the stores.
  {
    constexpr int QP = D / 2;             // column pairs a row
    constexpr int HPP = A2_NT / QP;       // heads a pass
    constexpr int QPASS = AM_HB / HPP;    // passes
    constexpr int U = QPASS < 16 ? QPASS : 16;
    const int c = 2 * (tid % QP), hr = tid / QP;
    for (int j0 = 0; j0 < QPASS; j0 += U) {
      float2 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int h = hr + (j0 + u) * HPP;
        v[u] = make_float2(0.0f, 0.0f);
        if (h < hv) {
          const float* qr = q + m * ldq + (int64_t)(g0 + h) * D + c;
          v[u] = make_float2(qr[0], qr[1]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        *reinterpret_cast<uint32_t*>(Qs + (hr + (j0 + u) * HPP) * QS + c) = pack_bf16(v[u].x, v[u].y);
    }
  }

  const int gq = lane >> 2, cq = lane & 3;
  const int lr = lane & 7, lj = lane >> 3;
  const int sh = wl & 3, sk = wl >> 2;     // S: 16 heads × 16 keys of this half's columns
  const int ph = wl / WC, pc = wl % WC;    // P·V: head tiles [ph·MT, +MT) × n8 tiles [pc·NT, +NT)
  float o[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][j][e] = 0.0f;
  float mreg = -INFINITY, lreg = 0.0f;  // softmax state of head 4·wp + u held by lane u (u < 4)

  if (t0 < t1) {  // tile t0 into Ks buffer t0 & 1, tile t0 + 1 on its way
    detail::cp_async_wait<0>();
    convert(t0);
    if (t0 + 1 < t1) {
      copy(t0 + 1, rnext);
      rnext = t0 + 2 < t1 ? row_of(t0 + 2) : 0;
    }
  }
  __syncthreads();  // Qs and the first tile ready
  // Per tile: S | barrier | softmax | barrier | P·V, then the next tile's conversion (other buffer, so it
  // overlaps the slower warps' P·V) and the copy of the one after | barrier. Three barriers a tile.
  for (int t = t0; t < t1; ++t) {
    const int nv = min(AM_KT, n - t * AM_KT);
    const bf16* Ks = Ks0 + (t & 1) * AM_KT * QS;
    {
      float acc[2][4] = {};
      const bf16* qa = Qs + (16 * sh + lr + 8 * (lj & 1)) * QS + c0 + 8 * (lj >> 1);
      const bf16* kb = Ks + (16 * sk + lr + 8 * (lj >> 1)) * QS + c0 + 8 * (lj & 1);
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4], b[4];
        ldsm_x4(a, qa + 16 * ks);
        ldsm_x4(b, kb + 16 * ks);
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
      }
      float* Sb = Sp + hf * AM_HB * AM_SPS;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = 16 * sk + 8 * j + 2 * cq;
        *reinterpret_cast<float2*>(Sb + (16 * sh + gq) * AM_SPS + col) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(Sb + (16 * sh + gq + 8) * AM_SPS + col) = make_float2(acc[j][2], acc[j][3]);
      }
    }
    __syncthreads();  // both halves' partial S ready
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // head h = 4·wp + u, lane = key; v1's arithmetic
      const int h = 4 * wp + u;
      float s = -INFINITY;
      if (lane < nv) s = __fmul_rn(__fadd_rn(Sp[h * AM_SPS + lane], Sp[(AM_HB + h) * AM_SPS + lane]), scale);
      const float mo = __shfl_sync(0xffffffffu, mreg, u), lo_ = __shfl_sync(0xffffffffu, lreg, u);
      const float mn = fmaxf(mo, detail::warp_max(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - mn);
      const float cf = mn == -INFINITY ? 1.0f : expf(mo - mn);
      const float ln = fmaf(lo_, cf, detail::warp_sum(p));
      if (lane == u) mreg = mn, lreg = ln;
      Ps[h * AM_PPS + lane] = __float2bfloat16_rn(p);
      if (lane == 0) Cr[h] = cf;
    }
    __syncthreads();  // Ps, Cr ready
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int rr = 16 * (ph * MT + i) + gq;
      const float ca = Cr[rr], cb = Cr[rr + 8];
#pragma unroll
      for (int j = 0; j < NT; ++j) o[i][j][0] *= ca, o[i][j][1] *= ca, o[i][j][2] *= cb, o[i][j][3] *= cb;
    }
#pragma unroll
    for (int ks = 0; ks < AM_KT / 16; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        ldsm_x4(a[i], Ps + (16 * (ph * MT + i) + lr + 8 * (lj & 1)) * AM_PPS + 16 * ks + 8 * (lj >> 1));
      if constexpr (NT % 2 == 0) {
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t b[4];
          ldsm_x4_t(b, Ks + (16 * ks + lr + 8 * (lj & 1)) * QS + c0 + 8 * (pc * NT + j) + 8 * (lj >> 1));
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma_bf16(o[i][j], a[i], b[0], b[1]);
            mma_bf16(o[i][j + 1], a[i], b[2], b[3]);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          uint32_t b[2];
          ldsm_x2_t(b, Ks + (16 * ks + lr + 8 * (lj & 1)) * QS + c0 + 8 * (pc * NT + j));
#pragma unroll
          for (int i = 0; i < MT; ++i) mma_bf16(o[i][j], a[i], b[0], b[1]);
        }
      }
    }
    if (t + 1 < t1) {
      detail::cp_async_wait<0>();  // own chunks of tile t + 1
      convert(t + 1);
      if (t + 2 < t1) {
        copy(t + 2, rnext);
        rnext = t + 3 < t1 ? row_of(t + 3) : 0;
      }
    }
    __syncthreads();  // tile t + 1 converted; P·V of tile t done with its buffer and with Ps, Cr
  }

  // this split's (max, sum, O [64][D]) into shared memory over Qs/Ks/Stg (every P·V done: last barrier)
  float* Op = reinterpret_cast<float*>(smem);
  if (lane < 4) ML[2 * (4 * wp + lane)] = mreg, ML[2 * (4 * wp + lane) + 1] = lreg;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int rr = 16 * (ph * MT + i) + gq, col = c0 + 8 * (pc * NT + j) + 2 * cq;
      *reinterpret_cast<float2*>(Op + rr * D + col) = make_float2(o[i][j][0], o[i][j][1]);
      *reinterpret_cast<float2*>(Op + (rr + 8) * D + col) = make_float2(o[i][j][2], o[i][j][3]);
    }
  cluster.sync();
  // merge (v1's formula and order): this CTA finalizes heads [16·split, +16), all D columns
  constexpr int HPS = AM_HB / AM_KS;
  const int hb = HPS * split;
  if (tid < HPS) {
    const int h = hb + tid;
    const float sink = g0 + h < H ? sinks[g0 + h] : 0.0f;
    float mj[AM_KS], lj[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) {
      const float* mlj = cluster.map_shared_rank(ML, (unsigned)j);
      mj[j] = mlj[2 * h], lj[j] = mlj[2 * h + 1];
    }
    am_merge_weights(sink, mj, lj, Wt + tid * (AM_KS + 1));
  }
  __syncthreads();
  {
    const float* opr[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) opr[j] = cluster.map_shared_rank(Op, (unsigned)j);
    for (int idx = tid; idx < HPS * (D / 4); idx += A2_NT) {
      const int hl = idx / (D / 4), c = 4 * (idx % (D / 4));
      const int h = hb + hl;
      if (h >= hv) continue;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < AM_KS; ++j) {
        const float wj = Wt[hl * (AM_KS + 1) + j];
        if (wj == 0.0f) continue;
        const float4 v = *reinterpret_cast<const float4*>(opr[j] + h * D + c);
        a.x = fmaf(v.x, wj, a.x), a.y = fmaf(v.y, wj, a.y), a.z = fmaf(v.z, wj, a.z), a.w = fmaf(v.w, wj, a.w);
      }
      const float inv = Wt[hl * (AM_KS + 1) + AM_KS];
      float* orow = out + m * ldo + (int64_t)(g0 + h) * D + c;
      orow[0] = __fmul_rn(a.x, inv), orow[1] = __fmul_rn(a.y, inv), orow[2] = __fmul_rn(a.z, inv),
      orow[3] = __fmul_rn(a.w, inv);
    }
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int D>
cudaError_t a2_launch(const float* q, int64_t M, int64_t ldq, int H, const float* win, const int32_t* win_lo,
                      const int32_t* win_hi, const float* ent, const int32_t* ent_idx, const int64_t* ent_off,
                      const float* sinks, float scale, float* out, int64_t ldo, cudaStream_t s) {
  constexpr A2Layout L(D);
  // (its attributes, L.total of dynamic shared memory and the max-shared carveout: a2_attrs, once)
  const int64_t bx = M * AM_KS;
  if (bx > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)bx, (unsigned)((H + AM_HB - 1) / AM_HB));
  sink_attn_mma2_kernel<D><<<grid, A2_NT, L.total, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off,
                                                        sinks, scale, out, ldo);
  return cudaGetLastError();
}

// Set once (init_kernel_attributes): L.total bytes of dynamic shared memory (218 KB at d = 512: one CTA an SM)
// and the largest carveout.
template <int D>
cudaError_t a2_attrs() {
  constexpr A2Layout L(D);
  return detail::first_error({detail::set_max_dynamic_smem(sink_attn_mma2_kernel<D>, (size_t)L.total),
                              cudaFuncSetAttribute(sink_attn_mma2_kernel<D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   (int)cudaSharedmemCarveoutMaxShared)});
}

template <int D>
int a2_max_clusters() {
  constexpr A2Layout L(D);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(AM_KS * 1024, 1, 1);
  cfg.blockDim = dim3(A2_NT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)L.total;
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, sink_attn_mma2_kernel<D>, &cfg) != cudaSuccess) return -1;
  return n;
}


// ---- v3: v2's arithmetic on warpgroup MMAs, for prefill (d = 512; docs/cuda-notes.md, "Prefill attention v3") ----
// v2 spends ~8 k cycles a 32-key tile (s9-run1: 16 warps of mma.sync, the softmax one head a warp with full
// warp reductions, three CTA barriers) and ~17 k of fixed cost a CTA. v3 keeps v2's grid, clusters, splits
// and merge, and so its bits, with two warpgroups of 128 threads: warpgroup h computes half h of S's partial
// sum (16 wgmma m64n32k16 over its 256 columns, the k16 chain mma.sync ran) and the P·V columns [256h, +256)
// (2 wgmma m64n256k16, P from registers, V the same key tile read through a transposed descriptor). The
// partial S halves meet through shared memory (one barrier); each warpgroup then runs the whole softmax
// in registers (its threads hold rows gq and gq + 8 of their warp's 16 heads, 8 keys each): the max over
// a quad, and warp_sum's butterfly tree (keys paired by bit 4, 3, 2, 1, 0 in that order) rebuilt from
// in-thread adds and two quad shuffles, so every sum is v2's. Keys: cp.async into an f32 staging tile two
// tiles ahead (16-byte chunks swizzled by row), converted by the thread that copied them into the bf16
// tile of 8×8 core matrices that both wgmma operands read, while the tile's S runs. Q: 64 heads × 512
// bf16 in the same core matrices. Shared memory 212.8 KB (one CTA an SM), 256 threads.
constexpr int A3_NT = 256;
constexpr int A3_OPS = 512 + 8;  // merge: O row stride (floats): rows 32 B apart in the banks
struct A3Layout {                // bytes
  static constexpr int q = 0;                       // Q [64 heads][512] bf16: core (cg, hg) at (cg·8 + hg)·128
  static constexpr int k = q + 64 * 512 * 2;        // 2 tiles [32 keys][512] bf16: core (cg, kg) at (cg·4 + kg)·128
  static constexpr int stg = k + 2 * 32 * 512 * 2;  // [32][512] f32: chunk c of row r at r·2048 + (c ^ (r & 7))·16
  static constexpr int sx = stg + 32 * 512 * 4;     // partial S [2 halves][64][40] f32
  static constexpr int ml = sx + 2 * 64 * 40 * 4;   // [64][2]: the split's (max, sum) a head
  static constexpr int wt = ml + 64 * 2 * 4;        // merge weights [16][AM_KS + 1]
  static constexpr int total = wt + (AM_HB / AM_KS) * (AM_KS + 1) * 4;
};
static_assert(64 * A3_OPS * 4 <= A3Layout::sx, "merge O must fit below the partial S");

// v3's merge of one float4 of a head's output: the splits' O in split order, each × its weight (wt[j]; 0: an empty
// split, or one outweighed to 0 — its O is 0 and is skipped), then × 1/L (wt[AM_KS]); stored at orow (16-byte
// aligned when al16).
__device__ __forceinline__ void a3_merge_store(const float4 (&v)[AM_KS], const float* wt, float* orow, bool al16) {
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < AM_KS; ++j) {
    const float wj = wt[j];
    if (wj == 0.0f) continue;
    a.x = fmaf(v[j].x, wj, a.x), a.y = fmaf(v[j].y, wj, a.y), a.z = fmaf(v[j].z, wj, a.z), a.w = fmaf(v[j].w, wj, a.w);
  }
  const float inv = wt[AM_KS];
  const float4 r = make_float4(__fmul_rn(a.x, inv), __fmul_rn(a.y, inv), __fmul_rn(a.z, inv), __fmul_rn(a.w, inv));
  if (al16) *reinterpret_cast<float4*>(orow) = r;
  else orow[0] = r.x, orow[1] = r.y, orow[2] = r.z, orow[3] = r.w;
}

// QS (session 15): q loaded once a cluster — CTA `split` loads and converts the heads [16·split, +16) and stores
// them into the Q tile of every CTA of the cluster (distributed shared memory), a quarter of the q reads of QS =
// false; the same bf16 values in the same places: the same bits.
template <bool QS>
__global__ void __cluster_dims__(AM_KS, 1, 1) __launch_bounds__(A3_NT, 1)
    sink_attn_mma3_kernel(const float* __restrict__ q, int64_t ldq, int H, const float* __restrict__ win,
                          const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi,
                          const float* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                          const int64_t* __restrict__ ent_off, const float* __restrict__ sinks, float scale,
                          float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int D = 512;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
  float* Stg = reinterpret_cast<float*>(smem + A3Layout::stg);
  float* Sx = reinterpret_cast<float*>(smem + A3Layout::sx);
  float* ML = reinterpret_cast<float*>(smem + A3Layout::ml);
  float* Wt = reinterpret_cast<float*>(smem + A3Layout::wt);

  cg::cluster_group cluster = cg::this_cluster();
  const int split = (int)cluster.block_rank();
  const int64_t m = blockIdx.x / AM_KS;
  const int g0 = blockIdx.y * AM_HB;
  const int hv = min(AM_HB, H - g0);
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  // warpgroup (= half of d; read through a lane-0 shuffle so the compiler knows it is warp-uniform and keeps the
  // wgmma descriptors in uniform registers), warp in it (heads 16wq ..)
  const int wg = __shfl_sync(0xffffffffu, wp >> 2, 0), wq = wp & 3;
  const int gq = lane >> 2, cq = lane & 3;  // accumulator row / column pair
  const int rA = 16 * wq + gq, rB = rA + 8;  // this thread's two heads (within the group of 64)

  // keys and split ranges: v2's
  const AmKeys kr = am_keys(win_lo, win_hi, ent_off, m, split);
  const int64_t lo = kr.lo, e0 = kr.e0;
  const int nw = kr.nw, n = kr.n, T = kr.T, ns = kr.ns, t0 = kr.t0, t1 = kr.t1;

  // Copies: warp wp moves columns [64wp, +64) of all 32 rows, lane = (row r & 7, 16-byte chunk j of 4): a warp
  // instruction reads 8 rows × 64 contiguous bytes. Row 8g + (lane & 7) for g = 0..3; its index is loaded one
  // copy ahead (ridx). The thread converts exactly the chunks it copied: no barrier before the staging reuse.
  // Every per-chunk offset is a per-thread base plus a compile-time immediate (the XOR swizzle only touches
  // bits the immediates leave alone): ~5 instructions a chunk.
  const int l7 = lane & 7, j4 = lane >> 3;
  const int coff = (16 * wp + j4) * 4;  // source float offset of chunk kk = 0 (+16 a kk)
  // staging float offset of row l7, chunk kk (+8·D a g): (4kk + j4) ^ l7 = 4(kk ^ (l7 >> 2)) + (j4 ^ (l7 & 3)), i.e.
  // 16kk ± 16 for even / odd kk when l7 ≥ 4: two bases and immediates
  const int sb = l7 * D + 64 * wp + 4 * (j4 ^ (l7 & 3)), sx16 = (l7 >> 2) * 16;
  const int soffE = sb + sx16, soffO = sb - sx16;
  auto soff = [&](int kk) { return ((kk & 1) ? soffO : soffE) + 16 * kk; };
  // bf16 tile byte offset of row l7, chunk kk = 0: core (cg = 8wp + j4/2, kg) (+1024 a kk, +128 a g)
  const int koff = ((8 * wp + (j4 >> 1)) * 4) * 128 + l7 * 16 + (j4 & 1) * 8;
  int ridx[4];
  auto load_rows = [&](int t) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int i = t * AM_KT + 8 * g + l7;
      ridx[g] = i >= n ? 0 : i < nw ? (int)(lo + i) : ent_idx[e0 + i - nw];
    }
  };
  auto copy = [&](int t) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int i = t * AM_KT + 8 * g + l7;
      if (i < n) {
        const float* src = (i < nw ? win : ent) + (int64_t)ridx[g] * D + coff;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) detail::cp_async16(Stg + soff(kk) + g * 8 * D, src + 16 * kk);
      }
    }
    detail::cp_async_commit();
  };
  auto convert = [&](int t) {  // own chunks of tile t → bf16 core matrices of buffer t & 1; rows ≥ nv zeros
    const int nv = min(AM_KT, n - t * AM_KT);
    unsigned char* Kb = smem + A3Layout::k + (t & 1) * (32 * 512 * 2) + koff;
    if (nv == AM_KT) {  // every tile but a list's last: no row checks, the 4 loads of a row in flight together
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        float4 v[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) v[kk] = *reinterpret_cast<const float4*>(Stg + soff(kk) + g * 8 * D);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          *reinterpret_cast<uint2*>(Kb + kk * 1024 + g * 128) =
              make_uint2(pack_bf16(v[kk].x, v[kk].y), pack_bf16(v[kk].z, v[kk].w));
      }
      return;
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const bool ok = 8 * g + l7 < nv;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok) v = *reinterpret_cast<const float4*>(Stg + soff(kk) + g * 8 * D);
        *reinterpret_cast<uint2*>(Kb + kk * 1024 + g * 128) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
      }
    }
  };
  if (t0 < t1) {
    load_rows(t0);
    copy(t0);
    if (t0 + 1 < t1) load_rows(t0 + 1);
  }

  // q (f32, any stride) → bf16 core matrices; heads ≥ hv are zeros. Warp wp: columns [64wp, +64), 16 at a
  // time; lane = (head & 7, 16-byte chunk j of 4): a warp instruction reads 8 head rows × 64 contiguous
  // bytes and stores two whole core matrices. 32 items a thread in 2 passes of 16 loads (QS: this CTA's 2 head
  // groups only, 8 items, each stored into the 4 CTAs).
  if constexpr (QS) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");  // this CTA runs (others may store into it)
    const float* qm = q + m * ldq + (int64_t)g0 * D;
    const bool al16 = ((uintptr_t)qm & 15) == 0 && (ldq & 3) == 0;
    const int h7 = lane >> 2, jq = lane & 3;
    float4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int hg = 2 * split + (u & 1), sp = 4 * wp + (u >> 1), h = 8 * hg + h7;
      const float* src = qm + (int64_t)h * D + 16 * sp + 4 * jq;
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h < hv) {
        if (al16) v[u] = *reinterpret_cast<const float4*>(src);
        else v[u] = make_float4(src[0], src[1], src[2], src[3]);
      }
    }
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every CTA of the cluster has started
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int hg = 2 * split + (u & 1), sp = 4 * wp + (u >> 1), cgq = 2 * sp + (jq >> 1);
      const uint32_t a = sbase + A3Layout::q + (cgq * 8 + hg) * 128 + h7 * 16 + (jq & 1) * 8;
      const uint32_t lo = pack_bf16(v[u].x, v[u].y), hi = pack_bf16(v[u].z, v[u].w);
#pragma unroll
      for (int j = 0; j < AM_KS; ++j) {
        uint32_t ra;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(j));
        asm volatile("st.shared::cluster.v2.b32 [%0], {%1, %2};\n" ::"r"(ra), "r"(lo), "r"(hi) : "memory");
      }
    }
    // the stores released to the cluster (acquired before the first MMA below); generic → async proxy for the
    // wgmmas that read them
    asm volatile("fence.proxy.async;\nbarrier.cluster.arrive.release.aligned;\n" ::: "memory");
  } else {
    const float* qm = q + m * ldq + (int64_t)g0 * D;
    const bool al16 = ((uintptr_t)qm & 15) == 0 && (ldq & 3) == 0;
    const int h7 = lane >> 2, jq = lane & 3;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      float4 v[16];  // 16 loads in flight a thread
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        const int hg = u & 7, sp = 4 * wp + 2 * pass + (u >> 3), h = 8 * hg + h7;
        const float* src = qm + (int64_t)h * D + 16 * sp + 4 * jq;
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < hv) {
          if (al16) v[u] = *reinterpret_cast<const float4*>(src);
          else v[u] = make_float4(src[0], src[1], src[2], src[3]);
        }
      }
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        const int hg = u & 7, sp = 4 * wp + 2 * pass + (u >> 3), cgq = 2 * sp + (jq >> 1);
        *reinterpret_cast<uint2*>(smem + A3Layout::q + (cgq * 8 + hg) * 128 + h7 * 16 + (jq & 1) * 8) =
            make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
      }
    }
  }

  float o[128];  // O [64 heads][256 columns of this half]: d[4j + r] as in the accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float mA = -INFINITY, lA = 0.0f, mB = -INFINITY, lB = 0.0f;  // softmax state of heads rA, rB

  if (t0 < t1) {
    detail::cp_async_wait<0>();
    convert(t0);
    if (t0 + 1 < t1) {
      copy(t0 + 1);
      if (t0 + 2 < t1) load_rows(t0 + 2);
    }
  }
  if constexpr (QS) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // every CTA's q stores
  detail::fence_proxy_async_smem();
  __syncthreads();  // Q and the first tile ready

  // descriptors of k-step 0 of this half (a k-step adds 16 columns = 2 core-matrix columns: +2048 B in Q, +1024 B
  // in a key tile, i.e. +128 / +64 in the start address field, bits 0..13 of address / 16; shared addresses stay
  // below 2^18, so the field never carries)
  const uint64_t dq0 = detail::wgmma_desc(sbase + A3Layout::q + 32 * wg * 1024, 1024, 128);
  const uint64_t dk00 = detail::wgmma_desc(sbase + A3Layout::k + 32 * wg * 512, 512, 128);  // buffer 0
  const uint32_t ka = sbase + A3Layout::k;
  for (int t = t0; t < t1; ++t) {
    const int nv = min(AM_KT, n - t * AM_KT);
    const uint32_t kb = ka + (t & 1) * (32 * 512 * 2);
    const uint64_t dk0 = dk00 + (uint64_t)((t & 1) * (32 * 512 * 2 / 16));
    // S partial of this half: 16 k-steps (columns 256wg + 16ks), the chain of v2's mma.sync
    float sacc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) sacc[i] = 0.0f;
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) detail::wgmma_ss_n32(sacc, dq0 + (uint64_t)(ks * 128), dk0 + (uint64_t)(ks * 64));
    detail::wgmma_commit();
    if (t + 1 < t1) {  // the next tile into the other buffer while S runs (P·V of tile t − 1 is done with it)
      detail::cp_async_wait<0>();
      convert(t + 1);
      detail::fence_proxy_async_smem();
      if (t + 2 < t1) {
        copy(t + 2);
        if (t + 3 < t1) load_rows(t + 3);
      }
    }
    detail::wgmma_wait<0>();
    detail::wgmma_fence_acc(sacc);
    {  // exchange the halves' partial S
      float* Sw = Sx + wg * (64 * 40);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<float2*>(Sw + rA * 40 + 8 * j + 2 * cq) = make_float2(sacc[4 * j], sacc[4 * j + 1]);
        *reinterpret_cast<float2*>(Sw + rB * 40 + 8 * j + 2 * cq) = make_float2(sacc[4 * j + 2], sacc[4 * j + 3]);
      }
    }
    __syncthreads();
    float sA[8], sB[8];  // keys 8j + 2cq + e at [2j + e]
    {
      const float* So = Sx + (wg ^ 1) * (64 * 40);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = *reinterpret_cast<const float2*>(So + rA * 40 + 8 * j + 2 * cq);
        const float2 b = *reinterpret_cast<const float2*>(So + rB * 40 + 8 * j + 2 * cq);
        const float oa[2] = {a.x, a.y}, ob[2] = {b.x, b.y};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * cq + e;
          const float h0a = wg == 0 ? sacc[4 * j + e] : oa[e], h1a = wg == 0 ? oa[e] : sacc[4 * j + e];
          const float h0b = wg == 0 ? sacc[4 * j + 2 + e] : ob[e], h1b = wg == 0 ? ob[e] : sacc[4 * j + 2 + e];
          sA[2 * j + e] = key < nv ? __fmul_rn(__fadd_rn(h0a, h1a), scale) : -INFINITY;
          sB[2 * j + e] = key < nv ? __fmul_rn(__fadd_rn(h0b, h1b), scale) : -INFINITY;
        }
      }
    }
    // online softmax (v2's arithmetic): max over the quad, the sum as warp_sum's tree
    float cfA, cfB;
    uint32_t pa[2][4];
    {
      auto row = [&](float (&s)[8], float& mrow, float& lrow, float& cf) {
        float mt = s[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) mt = fmaxf(mt, s[i]);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(mrow, mt);
        // expf then select (no branch around it): s = −inf gives expf(−inf) = 0 or, with mn = −inf, NaN, and
        // either way the select's 0 — v2's values
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float e = expf(s[i] - mn);
          s[i] = s[i] == -INFINITY ? 0.0f : e;
        }
        const float ec = expf(mrow - mn);
        cf = mn == -INFINITY ? 1.0f : ec;
        // key bits: 4, 3 = j (in-thread), 2, 1 = cq (lane bits 1, 0), 0 = e (in-thread)
        float u0 = __fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6]));
        float u1 = __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7]));
        u0 = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 2));
        u1 = __fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 2));
        u0 = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 1));
        u1 = __fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 1));
        lrow = fmaf(lrow, cf, __fadd_rn(u0, u1));
        mrow = mn;
      };
      row(sA, mA, lA, cfA);
      row(sB, mB, lB, cfB);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {  // A fragment of keys [16ks, +16): n8 blocks 2ks, 2ks + 1
        pa[ks][0] = pack_bf16(sA[4 * ks], sA[4 * ks + 1]);
        pa[ks][1] = pack_bf16(sB[4 * ks], sB[4 * ks + 1]);
        pa[ks][2] = pack_bf16(sA[4 * ks + 2], sA[4 * ks + 3]);
        pa[ks][3] = pack_bf16(sB[4 * ks + 2], sB[4 * ks + 3]);
      }
    }
    // O·cf, skipped where it cannot change O: a split's first tile (O = +0) and warps whose 16 heads all kept
    // their max (cf = 1)
    if (t != t0 && __any_sync(0xffffffffu, cfA != 1.0f || cfB != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) o[4 * j] *= cfA, o[4 * j + 1] *= cfA, o[4 * j + 2] *= cfB, o[4 * j + 3] *= cfB;
    }
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)  // V: keys [16ks, +16) (K), columns [256wg, +256) (N)
      detail::wgmma_rs_n256_tb(o, pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3],
                               detail::wgmma_desc(kb + (32 * wg) * 512 + (2 * ks) * 128, 128, 512));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_acc(o);
    __syncthreads();  // tile t + 1 converted; every warpgroup done with this tile's buffer and the partial S
  }

  // this split's (max, sum, O [64][512]) into shared memory over Q and the key tiles
  float* Op = reinterpret_cast<float*>(smem);
  if (wg == 0 && cq == 0) ML[2 * rA] = mA, ML[2 * rA + 1] = lA, ML[2 * rB] = mB, ML[2 * rB + 1] = lB;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = 256 * wg + 8 * j + 2 * cq;
    *reinterpret_cast<float2*>(Op + rA * A3_OPS + col) = make_float2(o[4 * j], o[4 * j + 1]);
    *reinterpret_cast<float2*>(Op + rB * A3_OPS + col) = make_float2(o[4 * j + 2], o[4 * j + 3]);
  }
  cluster.sync();
  // merge (v1's formula and order): this CTA finalizes heads [16·split, +16), all D columns. Remote shared
  // memory through mapa + ld.shared::cluster (generic loads queued behind the LSU's global traffic in s10-run2).
  constexpr int HPS = AM_HB / AM_KS;
  const int hb = HPS * split;
  const uint32_t ml_loc = (uint32_t)__cvta_generic_to_shared(ML), op_loc = sbase;
  auto remote = [](uint32_t a, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
  };
  if (tid < HPS) {
    const int h = hb + tid;
    const float sink = g0 + h < H ? sinks[g0 + h] : 0.0f;
    float mj[AM_KS], lj[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j)
      asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(mj[j]), "=f"(lj[j])
                   : "r"(remote(ml_loc + 8 * h, j)));
    am_merge_weights(sink, mj, lj, Wt + tid * (AM_KS + 1));
  }
  __syncthreads();
  {
    uint32_t opr[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) opr[j] = remote(op_loc, j);
    float* ob = out + m * ldo + (int64_t)g0 * D;
    const bool al16 = ((uintptr_t)ob & 15) == 0 && (ldo & 3) == 0;
    constexpr int ITEMS = HPS * (D / 4) / A3_NT;  // 8 float4 a thread
    float4 vv[ITEMS][AM_KS];  // every remote load issued before the first use (one round trip, not eight)
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int idx = tid + it * A3_NT, hl = idx / (D / 4), c = 4 * (idx % (D / 4));
#pragma unroll
      for (int j = 0; j < AM_KS; ++j)
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(vv[it][j].x), "=f"(vv[it][j].y), "=f"(vv[it][j].z), "=f"(vv[it][j].w)
                     : "r"(opr[j] + (uint32_t)(((hb + hl) * A3_OPS + c) * 4)));
    }
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int idx = tid + it * A3_NT, hl = idx / (D / 4), c = 4 * (idx % (D / 4));
      if (hb + hl < hv) a3_merge_store(vv[it], Wt + hl * (AM_KS + 1), ob + (int64_t)(hb + hl) * D + c, al16);
    }
  }
  // no CTA leaves while another still reads its shared memory: every remote load above has returned (its value
  // was used) before the arrive, so a relaxed arrive suffices (no wait for this CTA's output stores)
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

template <bool QS>
cudaError_t a3_launch(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win, const int32_t* win_lo,
                      const int32_t* win_hi, const float* ent, const int32_t* ent_idx, const int64_t* ent_off,
                      const float* sinks, float scale, float* out, int64_t ldo, cudaStream_t s) {
  // (its max dynamic shared memory attribute, A3Layout::total: a3_attrs, once)
  if (d != 512 || !sink_attention_mma_supported(H, d, win, ent)) return cudaErrorNotSupported;
  if (M <= 0) return cudaSuccess;
  const int64_t bx = M * AM_KS;
  if (bx > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)bx, (unsigned)((H + AM_HB - 1) / AM_HB));
  sink_attn_mma3_kernel<QS><<<grid, A3_NT, A3Layout::total, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx,
                                                              ent_off, sinks, scale, out, ldo);
  return cudaGetLastError();
}

// Set once (init_kernel_attributes): A3Layout::total bytes of dynamic shared memory.
cudaError_t a3_attrs() {
  cudaError_t e = detail::set_max_dynamic_smem(sink_attn_mma3_kernel<false>, (size_t)A3Layout::total);
  return e != cudaSuccess ? e : detail::set_max_dynamic_smem(sink_attn_mma3_kernel<true>, (size_t)A3Layout::total);
}

int a3_max_clusters() {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(AM_KS * 1024, 1, 1);
  cfg.blockDim = dim3(A3_NT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)A3Layout::total;
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, sink_attn_mma3_kernel<false>, &cfg) != cudaSuccess) return -1;
  return n;
}


// ---- attdec: v2's arithmetic on 8× the CTAs, for decode (docs/cuda-notes.md, "Decode attention on many CTAs") ----
// v2 gives a query 4 CTAs (one per key split), each walking its ~5 tiles one after the other: at M = 1 four SMs
// work and the rest idle (24.8 µs a call). attdec keeps every rounding and every order of v2, so it gives the
// same bits (tested) and the backend may choose between the two by M without breaking batch invariance, and
// spreads a query over 8 × ⌈H/16⌉ CTAs: cluster rank = 2·split + half (v2's 4 splits, v1's halves of d) and
// blockIdx.y = a group of 16 heads (one m16 tile; a head's arithmetic does not depend on the other rows of
// its tile). Per CTA all tiles of the split are staged at once (f32 rows of its half of d, up to 5 tiles a
// chunk; more keys take more chunks) and the tile chain of v2 is cut where it is not a chain:
//  - S of every tile at once (v2's fragments and k-order; B read from the f32 rows and rounded to bf16 as
//    v2's conversion does), the two halves' partial S exchanged once through distributed shared memory;
//  - the running max is a prefix max of the tiles' maxima (fmaxf is exact and order-free), so p = exp(s − m_t)
//    and the tile sums are computed for all tiles at once; only the scalar l chain and O's
//    (o·c_t + P_t·V_t) chain stay sequential: 2 MMAs and a multiply a tile;
//  - the merge is v2's (splits in order 0..3, same formula), each CTA finalizing 4 heads of its half.
constexpr int AD_NT = 256;           // threads (8 warps)
constexpr int AD_HG = 16;            // heads a CTA (one m16 tile)
constexpr int AD_CS = 2 * AM_KS;     // cluster: split × half
constexpr int AD_HPS = AD_HG / AM_KS;  // heads a CTA finalizes in the merge
constexpr int AD_CT = 5;             // 32-key tiles staged at once: a 640-key query's split (20 tiles / 4) in one chunk
constexpr int AD_CT_NARROW = 2;      // (sink_attention_dec_narrow: two CTAs an SM at d = 512)

// Shared memory layout (bytes) for half width DH and CT tiles a chunk.
struct AdLayout {
  int k, q, sp, sc, p, mt, ct, sm, ml, wt, rows, total;
  __host__ __device__ constexpr AdLayout(int DH, int CT)
      : k(0),                                          // [CT·32][DH + 8] f32 key rows; merge: O [16][DH] f32
        q(k + CT * AM_KT * (DH + 8) * 4),              // [16][DH + 8] bf16
        sp(q + AD_HG * (DH + 8) * 2),                  // [16][CT·32 + 4] f32 this half's partial S
        sc(sp + AD_HG * (CT * AM_KT + 4) * 4),         // [16][CT·32 + 4] f32 scaled S (both halves)
        p(sc + AD_HG * (CT * AM_KT + 4) * 4),          // [16][CT·32 + 8] bf16 P
        mt(p + AD_HG * (CT * AM_KT + 8) * 2),          // [16][CT] tile max, then running max
        ct(mt + AD_HG * CT * 4),                       // [16][CT] correction factor of each tile
        sm(ct + AD_HG * CT * 4),                       // [16][CT] sum of p of each tile
        ml(sm + AD_HG * CT * 4),                       // [16][2] softmax state (m, l) of the split
        wt(ml + AD_HG * 2 * 4),                        // [4][AM_KS + 1] merge weights, 1/sum
        rows(wt + AD_HPS * (AM_KS + 1) * 4),           // [CT·32] pool row of each key of the chunk
        total(rows + CT * AM_KT * 4) {}
};

// CT = 5 (the backend's): 205.6 KB at d = 512, one CTA an SM; CT = 2 (`sink_attention_dec_narrow`, for the
// perf comparison): 87.9 KB, two CTAs an SM, a 640-key split in 3 chunks. Same bits either way.
template <int D, int CT>
__global__ void __cluster_dims__(AD_CS, 1, 1) __launch_bounds__(AD_NT, CT <= 2 ? 2 : 1)
    sink_attn_dec_kernel(const float* __restrict__ q, int64_t ldq, int H, const float* __restrict__ win,
                         const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi,
                         const float* __restrict__ ent, const int32_t* __restrict__ ent_idx,
                         const int64_t* __restrict__ ent_off, const float* __restrict__ sinks, float scale,
                         float* __restrict__ out, int64_t ldo) {
  DI_PDL_WAIT();
  constexpr int DH = D / 2;
  constexpr int KC = CT * AM_KT;           // keys a chunk
  constexpr int KS = DH + 8;               // f32 key row stride ≡ 8 mod 32 words: S's float2 reads conflict-free
  constexpr int QS = DH + 8;               // bf16 q row stride: (DH+8)·2 B ≡ 16 mod 128 B (ldmatrix)
  constexpr int SS = KC + 4;               // S row stride (floats)
  constexpr int PS = KC + 8;               // P row stride (bf16): ≡ 16 mod 32 B, ldmatrix rows in distinct bank groups
  constexpr int KSTEPS = DH / 16;          // S: k-steps over this half (v2's)
  constexpr int NTILES = DH / 8;           // P·V: n8 tiles of this half
  constexpr int NTW = (NTILES + 7) / 8;    // n8 tiles a warp
  constexpr int CPR = DH / 4;              // 16-byte chunks a key half-row
  constexpr int SN8 = KC / 8;              // S: n8 key tiles a chunk
  constexpr int SPW = (SN8 + 7) / 8;       // ... a warp
  constexpr int QP = DH / 2;               // q column pairs a head
  constexpr int QPT = (AD_HG * QP + AD_NT - 1) / AD_NT;  // q pairs a thread
  constexpr int PAIRS = (AD_HG * CT + 7) / 8;             // softmax (head, tile) pairs a warp
  static_assert(D % 64 == 0 && D <= 512 && KC <= AD_NT && AM_KT == 32, "shape");
  constexpr AdLayout L(DH, CT);
  static_assert(AD_HG * DH * 4 <= L.q, "merge O must fit over the key rows");

  extern __shared__ __align__(16) unsigned char smem[];
  float* Kf = reinterpret_cast<float*>(smem + L.k);
  bf16* Qs = reinterpret_cast<bf16*>(smem + L.q);
  float* Sp = reinterpret_cast<float*>(smem + L.sp);
  float* Sc = reinterpret_cast<float*>(smem + L.sc);
  bf16* Ps = reinterpret_cast<bf16*>(smem + L.p);
  float* Mt = reinterpret_cast<float*>(smem + L.mt);
  float* Ct = reinterpret_cast<float*>(smem + L.ct);
  float* Sm = reinterpret_cast<float*>(smem + L.sm);
  float* ML = reinterpret_cast<float*>(smem + L.ml);
  float* Wt = reinterpret_cast<float*>(smem + L.wt);
  int* Rows = reinterpret_cast<int*>(smem + L.rows);

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int hf = rank & 1, split = rank >> 1;
  const int64_t m = blockIdx.x / AD_CS;
  const int g0 = blockIdx.y * AD_HG;
  const int hv = min(AD_HG, H - g0);
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const int c0 = hf * DH;

  // keys and split ranges: v2's (a function of the key count only)
  const AmKeys kr = am_keys(win_lo, win_hi, ent_off, m, split);
  const int64_t lo = kr.lo, e0 = kr.e0;
  const int nw = kr.nw, n = kr.n, T = kr.T, ns = kr.ns, t0 = kr.t0, t1 = kr.t1;
  const int NCH = ((T + ns - 1) / ns + CT - 1) / CT;  // chunks of the longest split: the same on every rank

  // Chunk c: tiles [t0 + c·CT, +ntc), keys [kb, kb + kv) of them valid (< n). Pool rows first (one load a
  // key), then this half's columns of every valid row by cp.async; rows kv .. ntc·32 become zeros (v2's
  // zero rows: P·V never sees stale shared memory).
  auto chunk_tiles = [&](int c) { return max(0, min(t1 - (t0 + c * CT), CT)); };
  auto stage = [&](int c, int ntc) {
    const int kb = (t0 + c * CT) * AM_KT;
    const int kv = max(0, min(n - kb, ntc * AM_KT));
    if (tid < kv) {
      const int i = kb + tid;
      Rows[tid] = i < nw ? (int)(lo + i) : ent_idx[e0 + i - nw];
    }
    __syncthreads();
    for (int idx = tid; idx < kv * CPR; idx += AD_NT) {
      const int r = idx / CPR, ch = idx % CPR;
      detail::cp_async16(Kf + r * KS + ch * 4, (kb + r < nw ? win : ent) + (int64_t)Rows[r] * D + c0 + ch * 4);
    }
    detail::cp_async_commit();
    for (int idx = tid; idx < (ntc * AM_KT - kv) * CPR; idx += AD_NT) {
      const int r = kv + idx / CPR, ch = idx % CPR;
      *reinterpret_cast<float4*>(Kf + r * KS + ch * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    return kv;
  };

  // q (f32, any stride: scalar loads) of the group's 16 heads, this half: loads in flight before chunk 0's rows
  float2 qv[QPT];
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int idx = tid + u * AD_NT, h = idx / QP, c = 2 * (idx % QP);
    qv[u] = make_float2(0.0f, 0.0f);
    if (idx < AD_HG * QP && h < hv) {
      const float* qr = q + m * ldq + (int64_t)(g0 + h) * D + c0 + c;
      qv[u] = make_float2(qr[0], qr[1]);
    }
  }
  if (tid < AD_HG) ML[2 * tid] = -INFINITY, ML[2 * tid + 1] = 0.0f;
  int ntc = NCH > 0 ? chunk_tiles(0) : 0;
  int kv = NCH > 0 ? stage(0, ntc) : 0;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const int idx = tid + u * AD_NT, h = idx / QP, c = 2 * (idx % QP);
    if (idx < AD_HG * QP) *reinterpret_cast<uint32_t*>(Qs + h * QS + c) = pack_bf16(qv[u].x, qv[u].y);
  }

  const int gq = lane >> 2, cq = lane & 3;
  const int lr = lane & 7, lj = lane >> 3;
  const float* S0 = cluster.map_shared_rank(Sp, (unsigned)(rank & ~1));  // half 0 first, as v2
  const float* S1 = cluster.map_shared_rank(Sp, (unsigned)(rank | 1));
  float o[NTW][4];
#pragma unroll
  for (int u = 0; u < NTW; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[u][e] = 0.0f;

  for (int c = 0; c < NCH; ++c) {
    if (c > 0) {
      ntc = chunk_tiles(c);
      kv = stage(c, ntc);
    }
    detail::cp_async_wait<0>();
    __syncthreads();  // key rows, zero rows, Qs ready
    // partial S over this half of every tile of the chunk: warp = n8 key tiles wp, wp + 8, ...; v2's k-order
    {
      float acc[SPW][4] = {};
      const bf16* qa = Qs + (lr + 8 * (lj & 1)) * QS + 8 * (lj >> 1);
      const int nn8 = ntc * (AM_KT / 8);
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t a[4];
        ldsm_x4(a, qa + 16 * ks);
#pragma unroll
        for (int i = 0; i < SPW; ++i) {
          const int j = wp + 8 * i;
          if (j < nn8) {
            const float* kr = Kf + (8 * j + gq) * KS + 16 * ks + 2 * cq;
            const float2 x = *reinterpret_cast<const float2*>(kr);
            const float2 y = *reinterpret_cast<const float2*>(kr + 8);
            mma_bf16(acc[i], a, pack_bf16(x.x, x.y), pack_bf16(y.x, y.y));
          }
        }
      }
#pragma unroll
      for (int i = 0; i < SPW; ++i) {
        const int j = wp + 8 * i;
        if (j < nn8) {
          const int col = 8 * j + 2 * cq;
          *reinterpret_cast<float2*>(Sp + gq * SS + col) = make_float2(acc[i][0], acc[i][1]);
          *reinterpret_cast<float2*>(Sp + (gq + 8) * SS + col) = make_float2(acc[i][2], acc[i][3]);
        }
      }
    }
    cluster.sync();  // both halves' partial S visible
    // (a) per (head, tile): s = (S0 + S1)·scale (−inf past the keys), the tile max. All of a warp's remote
    // loads first, then its PAIRS max reductions side by side (each is detail::warp_max's butterfly).
    {
      float sv[PAIRS], mx[PAIRS];
#pragma unroll
      for (int k = 0; k < PAIRS; ++k) {
        const int pr = wp + 8 * k, h = pr / CT, t = pr % CT, key = t * AM_KT + lane;
        sv[k] = -INFINITY;
        if (pr < AD_HG * CT && t < ntc && key < kv)
          sv[k] = __fmul_rn(__fadd_rn(S0[h * SS + key], S1[h * SS + key]), scale);
        mx[k] = sv[k];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], o));
#pragma unroll
      for (int k = 0; k < PAIRS; ++k) {
        const int pr = wp + 8 * k, h = pr / CT, t = pr % CT;
        if (pr < AD_HG * CT && t < ntc) {
          Sc[h * SS + t * AM_KT + lane] = sv[k];
          if (lane == 0) Mt[h * CT + t] = mx[k];
        }
      }
    }
    __syncthreads();
    // (b) per head, tiles in order: running max and correction factor (v2's formulas)
    if (tid < AD_HG) {
      float mo = ML[2 * tid];
      for (int t = 0; t < ntc; ++t) {
        const float mn = fmaxf(mo, Mt[tid * CT + t]);
        Ct[tid * CT + t] = mn == -INFINITY ? 1.0f : expf(mo - mn);
        Mt[tid * CT + t] = mn;
        mo = mn;
      }
      ML[2 * tid] = mo;
    }
    __syncthreads();
    // (c) per (head, tile): p = exp(s − m_t), its sum (detail::warp_sum's butterfly, PAIRS side by side), P in bf16
    {
      float pv[PAIRS], sm[PAIRS];
#pragma unroll
      for (int k = 0; k < PAIRS; ++k) {
        const int pr = wp + 8 * k, h = pr / CT, t = pr % CT;
        pv[k] = 0.0f;
        if (pr < AD_HG * CT && t < ntc) {
          const float s = Sc[h * SS + t * AM_KT + lane];
          pv[k] = s == -INFINITY ? 0.0f : expf(s - Mt[h * CT + t]);
        }
        sm[k] = pv[k];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) sm[k] += __shfl_xor_sync(0xffffffffu, sm[k], o);
#pragma unroll
      for (int k = 0; k < PAIRS; ++k) {
        const int pr = wp + 8 * k, h = pr / CT, t = pr % CT;
        if (pr < AD_HG * CT && t < ntc) {
          Ps[h * PS + t * AM_KT + lane] = __float2bfloat16_rn(pv[k]);
          if (lane == 0) Sm[h * CT + t] = sm[k];
        }
      }
    }
    __syncthreads();
    // (d) per head: l = l·c_t + sum_t in tile order (read by the merge after later barriers)
    if (tid < AD_HG) {
      float l = ML[2 * tid + 1];
      for (int t = 0; t < ntc; ++t) l = fmaf(l, Ct[tid * CT + t], Sm[tid * CT + t]);
      ML[2 * tid + 1] = l;
    }
    // O = O·c_t + P_t·V_t, tiles in order (v2's chain per element): warp = n8 column tiles [wp·NTW, +NTW).
    // A tile's fragments are all loaded before its MMAs, so the chain waits on shared memory once a tile.
    for (int t = 0; t < ntc; ++t) {
      const float ca = Ct[gq * CT + t], cb = Ct[(gq + 8) * CT + t];
      uint32_t a[2][4], b[2][NTW][2];
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int k0 = t * AM_KT + 16 * ks;
        ldsm_x4(a[ks], Ps + (lr + 8 * (lj & 1)) * PS + k0 + 8 * (lj >> 1));
        const float* vr = Kf + (k0 + 2 * cq) * KS + gq;
#pragma unroll
        for (int u = 0; u < NTW; ++u) {
          const int jn = wp * NTW + u;
          if (NTILES % 8 == 0 || jn < NTILES) {
            const float* v = vr + 8 * jn;
            b[ks][u][0] = pack_bf16(v[0], v[KS]);
            b[ks][u][1] = pack_bf16(v[8 * KS], v[9 * KS]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < NTW; ++u) o[u][0] *= ca, o[u][1] *= ca, o[u][2] *= cb, o[u][3] *= cb;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int u = 0; u < NTW; ++u)
          if (NTILES % 8 == 0 || wp * NTW + u < NTILES) mma_bf16(o[u], a[ks], b[ks][u][0], b[ks][u][1]);
    }
    if (c + 1 < NCH) cluster.sync();  // the other half is done reading this Sp; every warp done with Kf, Ps
  }

  // this split's (m, l) (ML) and O [16][DH] over the key rows
  detail::cp_async_wait<0>();
  __syncthreads();
  float* Op = reinterpret_cast<float*>(smem + L.k);
#pragma unroll
  for (int u = 0; u < NTW; ++u) {
    const int jn = wp * NTW + u;
    if (jn < NTILES) {
      const int col = 8 * jn + 2 * cq;
      *reinterpret_cast<float2*>(Op + gq * DH + col) = make_float2(o[u][0], o[u][1]);
      *reinterpret_cast<float2*>(Op + (gq + 8) * DH + col) = make_float2(o[u][2], o[u][3]);
    }
  }
  cluster.sync();
  // merge (v2's formula and order): heads [4·split, +4) of this half, splits 0..3 at ranks 2j + hf
  const int hb = AD_HPS * split;
  if (tid < AD_HPS) {
    const int h = hb + tid;
    const float sink = g0 + h < H ? sinks[g0 + h] : 0.0f;
    float mj[AM_KS], lj[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) {
      const float* mlj = cluster.map_shared_rank(ML, (unsigned)(2 * j + hf));
      mj[j] = mlj[2 * h], lj[j] = mlj[2 * h + 1];
    }
    am_merge_weights(sink, mj, lj, Wt + tid * (AM_KS + 1));
  }
  __syncthreads();
  {
    const float* opr[AM_KS];
#pragma unroll
    for (int j = 0; j < AM_KS; ++j) opr[j] = cluster.map_shared_rank(Op, (unsigned)(2 * j + hf));
    for (int idx = tid; idx < AD_HPS * (DH / 4); idx += AD_NT) {
      const int hl = idx / (DH / 4), c = 4 * (idx % (DH / 4));
      const int h = hb + hl;
      if (h >= hv) continue;
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < AM_KS; ++j) {
        const float wj = Wt[hl * (AM_KS + 1) + j];
        if (wj == 0.0f) continue;
        const float4 v = *reinterpret_cast<const float4*>(opr[j] + h * DH + c);
        a.x = fmaf(v.x, wj, a.x), a.y = fmaf(v.y, wj, a.y), a.z = fmaf(v.z, wj, a.z), a.w = fmaf(v.w, wj, a.w);
      }
      const float inv = Wt[hl * (AM_KS + 1) + AM_KS];
      float* orow = out + m * ldo + (int64_t)(g0 + h) * D + c0 + c;
      orow[0] = __fmul_rn(a.x, inv), orow[1] = __fmul_rn(a.y, inv), orow[2] = __fmul_rn(a.z, inv),
      orow[3] = __fmul_rn(a.w, inv);
    }
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int D, int CT>
cudaError_t ad_launch(const float* q, int64_t M, int64_t ldq, int H, const float* win, const int32_t* win_lo,
                      const int32_t* win_hi, const float* ent, const int32_t* ent_idx, const int64_t* ent_off,
                      const float* sinks, float scale, float* out, int64_t ldo, cudaStream_t s) {
  constexpr AdLayout L(D / 2, CT);
  // (attributes: ad_attrs, once)
  const int64_t bx = M * AD_CS;
  if (bx > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)bx, (unsigned)((H + AD_HG - 1) / AD_HG));
  sink_attn_dec_kernel<D, CT><<<grid, AD_NT, L.total, s>>>(q, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off,
                                                            sinks, scale, out, ldo);
  return cudaGetLastError();
}

template <int D, int CT>
cudaError_t ad_attrs() {
  constexpr AdLayout L(D / 2, CT);
  return detail::first_error({detail::set_max_dynamic_smem(sink_attn_dec_kernel<D, CT>, (size_t)L.total),
                              cudaFuncSetAttribute(sink_attn_dec_kernel<D, CT>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   (int)cudaSharedmemCarveoutMaxShared)});
}

template <int D, int CT>
int ad_max_clusters() {
  constexpr AdLayout L(D / 2, CT);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(AD_CS * 1024, 1, 1);
  cfg.blockDim = dim3(AD_NT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)L.total;
  int n = -1;
  if (cudaOccupancyMaxActiveClusters(&n, sink_attn_dec_kernel<D, CT>, &cfg) != cudaSuccess) return -1;
  return n;
}

}  // namespace

int sink_attention_mma_max_clusters(int d, int version) {
  switch (d) {
    case 64: return version == 1 ? am_max_clusters<64>() : a2_max_clusters<64>();
    case 128: return version == 1 ? am_max_clusters<128>() : a2_max_clusters<128>();
    case 256: return version == 1 ? am_max_clusters<256>() : a2_max_clusters<256>();
    case 512: return version == 1 ? am_max_clusters<512>() : version == 3 ? a3_max_clusters() : a2_max_clusters<512>();
    default: return -1;
  }
}

bool sink_attention_mma_supported(int H, int d, const float* win, const float* ent) {
  const bool dok = d == 64 || d == 128 || d == 256 || d == 512;
  return dok && H > 0 && ((uintptr_t)win % 16) == 0 && ((uintptr_t)ent % 16) == 0;
}

#define AM_ARGS q, M, ldq, H, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s
cudaError_t sink_attention_mma(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s) {
  if (!sink_attention_mma_supported(H, d, win, ent)) return cudaErrorNotSupported;
  if (M <= 0) return cudaSuccess;
  switch (d) {
    case 64: return a2_launch<64>(AM_ARGS);
    case 128: return a2_launch<128>(AM_ARGS);
    case 256: return a2_launch<256>(AM_ARGS);
    default: return a2_launch<512>(AM_ARGS);
  }
}

cudaError_t sink_attention_mma_v3(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                  const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                  const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                  float* out, int64_t ldo, cudaStream_t s) {
  return a3_launch<false>(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s);
}
cudaError_t sink_attention_mma_v3q(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                   const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                   const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                   float* out, int64_t ldo, cudaStream_t s) {
  return a3_launch<true>(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s);
}

cudaError_t sink_attention_mma_v1(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                  const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                  const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                  float* out, int64_t ldo, cudaStream_t s) {
  if (!sink_attention_mma_supported(H, d, win, ent)) return cudaErrorNotSupported;
  if (M <= 0) return cudaSuccess;
  switch (d) {
    case 64: return am_launch<64>(AM_ARGS);
    case 128: return am_launch<128>(AM_ARGS);
    case 256: return am_launch<256>(AM_ARGS);
    default: return am_launch<512>(AM_ARGS);
  }
}
cudaError_t sink_attention_dec(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s) {
  if (!sink_attention_mma_supported(H, d, win, ent)) return cudaErrorNotSupported;
  if (M <= 0) return cudaSuccess;
  switch (d) {
    case 64: return ad_launch<64, AD_CT>(AM_ARGS);
    case 128: return ad_launch<128, AD_CT>(AM_ARGS);
    case 256: return ad_launch<256, AD_CT>(AM_ARGS);
    default: return ad_launch<512, AD_CT>(AM_ARGS);
  }
}

cudaError_t sink_attention_dec_narrow(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                      const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                      const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                      float* out, int64_t ldo, cudaStream_t s) {
  if (d != 512)
    return sink_attention_dec(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s);
  if (!sink_attention_mma_supported(H, d, win, ent)) return cudaErrorNotSupported;
  if (M <= 0) return cudaSuccess;
  return ad_launch<512, AD_CT_NARROW>(AM_ARGS);
}

int sink_attention_dec_max_clusters(int d, bool narrow) {
  if (narrow && d == 512) return ad_max_clusters<512, AD_CT_NARROW>();
  switch (d) {
    case 64: return ad_max_clusters<64, AD_CT>();
    case 128: return ad_max_clusters<128, AD_CT>();
    case 256: return ad_max_clusters<256, AD_CT>();
    case 512: return ad_max_clusters<512, AD_CT>();
    default: return -1;
  }
}
#undef AM_ARGS
namespace detail {
cudaError_t init_attributes_attention_mma() {
  return first_error({am_attrs<64>(), am_attrs<128>(), am_attrs<256>(), am_attrs<512>(), a2_attrs<64>(),
                      a2_attrs<128>(), a2_attrs<256>(), a2_attrs<512>(), a3_attrs(), ad_attrs<64, AD_CT>(),
                      ad_attrs<128, AD_CT>(), ad_attrs<256, AD_CT>(), ad_attrs<512, AD_CT>(),
                      ad_attrs<512, AD_CT_NARROW>()});
}
}  // namespace detail

}  // namespace deepinfer::cuda
