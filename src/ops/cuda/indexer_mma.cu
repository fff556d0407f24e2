// The lightning indexer on tensor cores (mma.sync m16n8k16 bf16, f32 accumulation): the Backend::
// indexer_scores contract with q and K rounded to bf16. See cuda_ops.h (indexer_scores_mma) and
// docs/cuda-notes.md "Indexer on tensor cores (indexer_mma)".
//
// CTA = 4 queries × a run of key tiles of 128 keys, 8 warps; warp w owns query w/2 and keys
// (w%2)·64 .. +64 of each tile. The warp's product is keys × heads: A = 64 keys [64, dI] (4 m16 tiles),
// B = one query's heads [dI, 64] (8 n8 tiles; hI > 64 in chunks of 64, hI % 64 != 0 in chunks of 16).
// With keys on the rows and heads on the columns of the accumulator, the head sum of the epilogue is
// mostly in-thread (each thread holds 2 heads of every n8 tile) plus two quad shuffles.
//
// Batch invariance: score[m, w] is computed by one warp from q[m] (bf16 in shared memory), K[key w]
// (bf16) and γ[m] only, by the same instruction sequence wherever (m, w) lands: the accumulator of
// (key, head) is the mma chain over dI in k16 steps from 0 (each mma output element depends only on its
// A row and B column), the head sum is a fixed per-thread order (head chunks, n8 tiles, column 2q then
// 2q+1) followed by a fixed butterfly (xor 1, xor 2; IEEE addition is commutative, so all four lanes
// hold the same bits), then one multiply by qk_scale. The decode path (keys converted in the kernel)
// and the prefill path (keys pre-converted by gather_keys_bf16) round f32 → bf16 with the same
// round-to-nearest-even conversion, so they feed the tensor cores the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {

using detail::cdiv;

constexpr int IM_BQ = 4;          // queries per CTA
constexpr int IM_BN = 128;        // keys per tile
constexpr int IM_WK = 64;         // keys per warp
constexpr int IM_THREADS = 256;   // 8 warps: warp w → query w/2, keys (w%2)·64
constexpr int IM_KF32_MAXM = 8;   // M ≤ this: keys converted inside the kernel (decode), else pre-pass
constexpr int IM_QBATCH_F32K = 8;  // float4 loads in flight per thread in the q prologue (decode path:
constexpr int IM_QBATCH_BF16K = 16; //   its first key batch is in flight too; prefill path: q alone)
constexpr int IM_KBATCH = 16;     // float4 loads in flight per thread (f32 key tiles)

using detail::smem_u32;

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d += a·b, m16n8k16, bf16 in, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(  // no side effects: the compiler may move it among the fragment loads
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (cp.async: async_bits.cuh; src_bytes = 0 in cp_async16_zfill fills the 16 bytes with zeros, nothing is read)
using detail::cp_async16_zfill, detail::cp_async_commit, detail::cp_async_wait;

// Four floats → four bf16 (round to nearest even) as one 8-byte store. The one conversion used for q
// and for K on both paths (batch invariance).
__device__ __forceinline__ uint2 pack_bf16x4(float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  return u;
}

// Walks e = tid, tid + 256, ... over a [rows, cols] grid of elements with (r, c) kept incrementally
// (no division in the loop).
struct Walk {
  int r, c, sr, sc, cols;
  __device__ Walk(int tid, int cols_) : cols(cols_) {
    r = tid / cols;
    c = tid - r * cols;
    sr = IM_THREADS / cols;
    sc = IM_THREADS - sr * cols;
  }
  __device__ void next() {
    r += sr;
    c += sc;
    if (c >= cols) c -= cols, ++r;
  }
};

// Keys [n_keys, dI] f32 (gathered through key_rows) → Kb [n_keys, dI] bf16, contiguous.
__global__ void gather_keys_bf16(const float* __restrict__ K, const int32_t* __restrict__ key_rows, int64_t n_keys,
                                 int dI, bf16* __restrict__ Kb) {
  DI_PDL_WAIT();
  const int c4 = dI >> 2;
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_keys * c4) return;
  const int64_t w = e / c4;
  const int c = (int)(e - w * c4);
  const int64_t row = key_rows ? (int64_t)key_rows[w] : w;
  const float4 v = __ldg(reinterpret_cast<const float4*>(K + row * dI) + c);
  *reinterpret_cast<uint2*>(Kb + w * dI + 4 * c) = pack_bf16x4(v);
}

// NT: n8 tiles (heads) per chunk, 8 (hI % 64 == 0) or 2 (hI % 16 == 0). KF32: keys read as f32 rows
// through key_rows and converted here (single buffer); else from Kb (bf16, contiguous) by cp.async into
// two buffers, the next tile in flight while this one is multiplied. PQ (KF32 only): every query has its
// own key list (key_rows + m·key_ld, a decode step's keys: each sequence its own), so a tile holds 128
// keys of each of the CTA's 4 queries (512 rows); a warp multiplies its query's rows with the same
// instructions as with a shared list, so the bits of a score do not depend on the mode.
template <int NT, bool KF32, bool PQ = false>
__global__ void __launch_bounds__(IM_THREADS, 1)
    indexer_mma_kernel(const float* __restrict__ qI, const float* __restrict__ gamma, int64_t M, int hI, int dI,
                       const float* __restrict__ Kf, const int32_t* __restrict__ key_rows, int64_t key_ld,
                       const bf16* __restrict__ Kb, int64_t n_keys, const int32_t* __restrict__ n_vis,
                       float qk_scale, float* __restrict__ score, int tiles_per_split) {
  static_assert(KF32 || !PQ, "per-query key lists are read as f32 rows");
  constexpr int KR = PQ ? IM_BQ * IM_BN : IM_BN;  // key rows of a tile in shared memory
  DI_PDL_WAIT();
  extern __shared__ __align__(128) unsigned char smem[];
  const int LD = dI + 8;  // bf16 per shared row: 16 B of padding, ldmatrix phases hit 8 distinct bank groups
  bf16* qs = reinterpret_cast<bf16*>(smem);                    // [BQ·hI][LD]
  bf16* ks = qs + (size_t)IM_BQ * hI * LD;                     // [2][BN][LD] (PQ: [BQ·BN][LD])
  float* gs = reinterpret_cast<float*>(ks + (size_t)(PQ ? KR : 2 * IM_BN) * LD);  // [BQ][hI]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t m0 = (int64_t)blockIdx.x * IM_BQ;
  const int nq = (int)min((int64_t)IM_BQ, M - m0);
  const int64_t n_kt = (n_keys + IM_BN - 1) / IM_BN;
  const int64_t kt0 = (int64_t)blockIdx.y * tiles_per_split, kt1 = min(n_kt, kt0 + tiles_per_split);
  const int wq = warp >> 1, wkey = (warp & 1) * IM_WK;
  const bool wvalid = wq < nq;
  // visible keys per query, clamped to [0, n_keys]; every thread reads the ≤ 4 counts (no barrier needed)
  int64_t vis_max = 0, nv_w = 0;
#pragma unroll
  for (int i = 0; i < IM_BQ; ++i) {
    const int64_t v = i < nq ? min(max((int64_t)__ldg(n_vis + m0 + i), (int64_t)0), n_keys) : 0;
    vis_max = max(vis_max, v);
    if (i == wq) nv_w = v;
  }
  const int64_t lim = vis_max;  // key rows ≥ lim are multiplied by no warp: not read
  float* srow = score + (m0 + (wvalid ? wq : 0)) * n_keys;

  // f32 keys (decode path): batch `base` of tile kt's float4 elements into registers (rows ≥ lim: zero),
  // then converted into buffer 0. The first batch is in flight while the q prologue runs. PQ: row r is
  // key r % BN of query r / BN's list, zero past that query's visible keys.
  const int c4 = dI >> 2;
  float4 kv[KF32 ? IM_KBATCH : 1];
  auto fetch_f32 = [&](int64_t kt, int base) {
    const int64_t k0 = kt * IM_BN;
#pragma unroll
    for (int u = 0; u < (KF32 ? IM_KBATCH : 1); ++u) {
      const int e = base + u * IM_THREADS + tid, r = e / c4, c = e - r * c4;
      kv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r >= KR) continue;
      const int qi = PQ ? r / IM_BN : 0;
      const int64_t w = k0 + (PQ ? r - qi * IM_BN : r);
      const int64_t lr = !PQ ? lim : qi < nq ? min(max((int64_t)__ldg(n_vis + m0 + qi), (int64_t)0), n_keys) : 0;
      if (w < lr) {
        const int32_t* kr = PQ ? key_rows + (m0 + qi) * key_ld : key_rows;
        const int64_t row = kr ? (int64_t)__ldg(kr + w) : w;
        kv[u] = __ldg(reinterpret_cast<const float4*>(Kf + row * dI) + c);
      }
    }
  };
  auto store_f32 = [&](int base) {
#pragma unroll
    for (int u = 0; u < (KF32 ? IM_KBATCH : 1); ++u) {
      const int e = base + u * IM_THREADS + tid, r = e / c4, c = e - r * c4;
      if (r < KR) *reinterpret_cast<uint2*>(ks + (size_t)r * LD + 4 * c) = pack_bf16x4(kv[u]);
    }
  };
  if constexpr (KF32) {
    if (kt0 < kt1) fetch_f32(kt0, 0);
  }

  for (int i = tid; i < nq * hI; i += IM_THREADS) gs[i] = gamma[m0 * hI + i];
  // q rows of this tile's queries → bf16 in shared memory
  {
    const int total = nq * hI * c4;
    const float4* src = reinterpret_cast<const float4*>(qI + m0 * hI * dI);
    Walk wk(tid, c4);
    constexpr int QB = KF32 ? IM_QBATCH_F32K : IM_QBATCH_BF16K;
    for (int base = 0; base < total; base += IM_THREADS * QB) {
      float4 v[QB];
#pragma unroll
      for (int u = 0; u < QB; ++u) {
        const int e = base + u * IM_THREADS + tid;
        if (e < total) v[u] = __ldg(src + e);
      }
#pragma unroll
      for (int u = 0; u < QB; ++u) {
        const int e = base + u * IM_THREADS + tid;
        if (e < total) *reinterpret_cast<uint2*>(qs + (size_t)wk.r * LD + 4 * wk.c) = pack_bf16x4(v[u]);
        wk.next();
      }
    }
  }

  // bf16 keys (prefill path): tile kt → buffer b by cp.async (rows ≥ lim: zero-filled, nothing read).
  auto load_tile = [&](int64_t kt, int b) {
    const int64_t k0 = kt * IM_BN;
    if (k0 >= lim) return;  // no warp multiplies this tile
    bf16* dst = ks + (size_t)b * IM_BN * LD;
    const int c8 = dI >> 3, total = IM_BN * c8;
    const bf16* src = Kb + k0 * dI;  // the tile is contiguous in Kb
    Walk wk(tid, c8);
    for (int e = tid; e < total; e += IM_THREADS) {
      const bool ok = k0 + wk.r < lim;
      cp_async16_zfill(smem_u32(dst + (size_t)wk.r * LD + 8 * wk.c), ok ? (const void*)(src + (size_t)e * 8) : (const void*)Kb,
                 ok ? 16 : 0);
      wk.next();
    }
  };

  if constexpr (!KF32) {
    if (kt0 < kt1) load_tile(kt0, 0);
    cp_async_commit();
  }
  const int g = lane >> 2, q = lane & 3, mi = lane >> 3, r8 = lane & 7;
  for (int64_t kt = kt0; kt < kt1; ++kt) {
    const int b = KF32 ? 0 : (int)((kt - kt0) & 1);
    if constexpr (KF32) {
      __syncthreads();  // every warp is done with the previous tile
      if (kt * IM_BN < lim) {
        for (int base = 0; base < KR * c4; base += IM_THREADS * IM_KBATCH) {
          if (kt != kt0 || base != 0) fetch_f32(kt, base);
          store_f32(base);
        }
      }
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt visible; (bf16 path) every warp is done with buffer b^1
    if constexpr (!KF32) {
      if (kt + 1 < kt1) load_tile(kt + 1, b ^ 1);
      cp_async_commit();
    }
    if (!wvalid) continue;
    const int64_t kw = kt * IM_BN + wkey;  // the warp's first key
    if (kw >= nv_w) {  // nothing visible in the warp's slice
      for (int u = lane; u < IM_WK; u += 32)
        if (kw + u < n_keys) srow[kw + u] = -INFINITY;
      continue;
    }
    const bf16* kb = ks + ((size_t)b * IM_BN + (PQ ? wq * IM_BN : 0) + wkey) * LD;
    float slo[4] = {0.f, 0.f, 0.f, 0.f}, shi[4] = {0.f, 0.f, 0.f, 0.f};  // keys 16i+g, 16i+g+8
    for (int ch = 0; ch < hI; ch += 8 * NT) {
      float acc[4][NT][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
      const bf16* qb = qs + (size_t)(wq * hI + ch) * LD;
      const uint32_t bbase = smem_u32(qb + (size_t)((mi >> 1) * 8 + r8) * LD + (mi & 1) * 8);
      const uint32_t abase = smem_u32(kb + (size_t)((mi & 1) * 8 + r8) * LD + (mi >> 1) * 8);
#pragma unroll 2
      for (int kk = 0; kk < dI; kk += 16) {
        uint32_t bf[NT][2];
#pragma unroll
        for (int j = 0; j < NT; j += 2)
          ldsm_x4(bbase + (uint32_t)((j * 8 * LD + kk) * 2), bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1]);
        uint32_t af[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ldsm_x4(abase + (uint32_t)((i * 16 * LD + kk) * 2), af[i][0], af[i][1], af[i][2], af[i][3]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
      }
      // Σ_h γ_h · ReLU(s_h) over this thread's heads ch + 8j + 2q, +1 (qk_scale after the sum)
      const float* gq = gs + wq * hI + ch + 2 * q;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float2 g2 = *reinterpret_cast<const float2*>(gq + 8 * j);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          slo[i] = __fmaf_rn(g2.x, fmaxf(acc[i][j][0], 0.f), slo[i]);
          slo[i] = __fmaf_rn(g2.y, fmaxf(acc[i][j][1], 0.f), slo[i]);
          shi[i] = __fmaf_rn(g2.x, fmaxf(acc[i][j][2], 0.f), shi[i]);
          shi[i] = __fmaf_rn(g2.y, fmaxf(acc[i][j][3], 0.f), shi[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      slo[i] = __fadd_rn(slo[i], __shfl_xor_sync(0xffffffffu, slo[i], 1));
      shi[i] = __fadd_rn(shi[i], __shfl_xor_sync(0xffffffffu, shi[i], 1));
      slo[i] = __fadd_rn(slo[i], __shfl_xor_sync(0xffffffffu, slo[i], 2));
      shi[i] = __fadd_rn(shi[i], __shfl_xor_sync(0xffffffffu, shi[i], 2));
    }
    // Lane (g, q) stores key 32p + 16(q>>1) + 8(q&1) + g: each store instruction covers 32 consecutive keys.
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const float lo = (q & 2) ? slo[2 * p + 1] : slo[2 * p];
      const float hi = (q & 2) ? shi[2 * p + 1] : shi[2 * p];
      const float v = (q & 1) ? hi : lo;
      const int64_t w = kw + 32 * p + 16 * (q >> 1) + 8 * (q & 1) + g;
      if (w < n_keys) srow[w] = w < nv_w ? __fmul_rn(v, qk_scale) : -INFINITY;
    }
  }
  if constexpr (!KF32) cp_async_wait<0>();  // no copy outlives the block
}

size_t indexer_mma_smem(int hI, int dI, bool pq) {
  const size_t LD = (size_t)dI + 8;
  return ((size_t)IM_BQ * hI * LD + (size_t)(pq ? IM_BQ : 2) * IM_BN * LD) * 2 + (size_t)IM_BQ * hI * 4;
}

}  // namespace

size_t indexer_mma_workspace(int64_t M, int64_t n_keys, int dI, int64_t key_ld) {
  return M > IM_KF32_MAXM && n_keys > 0 && key_ld == 0 ? (size_t)n_keys * dI * sizeof(bf16) : 0;
}

cudaError_t indexer_scores_mma(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                               const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis,
                               float qk_scale, float* score, void* workspace, cudaStream_t s) {
  if (M <= 0 || n_keys <= 0) return cudaSuccess;
  if (hI <= 0 || dI <= 0 || hI % 16 != 0 || dI % 16 != 0) return cudaErrorNotSupported;
  if ((uintptr_t)qI % 16 != 0 || (uintptr_t)K % 16 != 0 || n_keys > INT32_MAX) return cudaErrorNotSupported;
  const bool pq = key_ld != 0;
  if (pq && (!key_rows || key_ld < n_keys)) return cudaErrorInvalidValue;
  int dev = 0, max_smem = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const size_t smem = indexer_mma_smem(hI, dI, pq);
  if (smem > (size_t)max_smem) return cudaErrorNotSupported;
  const bool kf32 = M <= IM_KF32_MAXM || pq;
  bf16* Kb = static_cast<bf16*>(workspace);
  if (!kf32) {
    if (!Kb) return cudaErrorInvalidValue;
    const int64_t n = n_keys * (dI / 4);
    gather_keys_bf16<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(K, key_rows, n_keys, dI, Kb);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  using Kern = void (*)(const float*, const float*, int64_t, int, int, const float*, const int32_t*, int64_t,
                        const bf16*, int64_t, const int32_t*, float, float*, int);
  const bool wide = hI % 64 == 0;
  Kern k = pq     ? (wide ? indexer_mma_kernel<8, true, true> : indexer_mma_kernel<2, true, true>)
           : kf32 ? (wide ? indexer_mma_kernel<8, true> : indexer_mma_kernel<2, true>)
                  : (wide ? indexer_mma_kernel<8, false> : indexer_mma_kernel<2, false>);
  // (its shared-memory attribute: all the device allows, set by init_kernel_attributes)
  // Grid: query tiles × key splits; split the keys until there are about two CTAs per SM (one CTA fits
  // an SM; the second wave hides the q prologue). Which CTA computes a score does not change its bits.
  const int64_t qt = cdiv(M, IM_BQ), n_kt = cdiv(n_keys, IM_BN);
  int64_t splits = std::min<int64_t>(n_kt, std::max<int64_t>(1, cdiv(2 * (int64_t)sms, qt)));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t tps = cdiv(n_kt, splits);
  splits = cdiv(n_kt, tps);
  if (qt > INT32_MAX) return cudaErrorNotSupported;
  k<<<dim3((unsigned)qt, (unsigned)splits), IM_THREADS, smem, s>>>(qI, gamma, M, hI, dI, K, key_rows, key_ld, Kb,
                                                                   n_keys, n_vis, qk_scale, score, (int)tps);
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_indexer_mma() {
  constexpr size_t all = (size_t)1 << 30;  // capped at the device's limit
  return first_error({set_max_dynamic_smem(indexer_mma_kernel<8, true>, all), set_max_dynamic_smem(indexer_mma_kernel<2, true>, all),
                      set_max_dynamic_smem(indexer_mma_kernel<8, false>, all),
                      set_max_dynamic_smem(indexer_mma_kernel<2, false>, all),
                      set_max_dynamic_smem(indexer_mma_kernel<8, true, true>, all),
                      set_max_dynamic_smem(indexer_mma_kernel<2, true, true>, all)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
