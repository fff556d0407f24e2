// Decode linear for fp8 (FP8_B128) weights on e4m3 tensor cores: gemv_e4m3 (cuda_ops.h; docs/cuda-notes.md
// "GEMV e4m3"). What the GEMVs before it (v3..v8) spend their time on is making MMA operands out of stored
// weights; here there is nothing to make: the weights go from HBM into shared memory by 2-D tensor copies with
// the 128-byte swizzle, and wgmma reads them there as its A operand (m64, K-major) as they are. x is quantized
// per token and 128-k block to e4m3 with a power-of-two scale (DeepSeek's act_quant, quant_act_kernel's
// numerics) into the B operand (n8: ≤ 8 tokens). A box of weights = 128 rows × 128 k = 16 KiB = one scale
// block: its 8 MMAs (2 m64 halves × 4 k32 steps) go into fragments of their own, whose sums are added in f32 and
// promoted once by ws(box) · s_x(token, k block).
//
// Work: an item = a tile of 128 output rows (nb = 2 boxes a k block with the fused SwiGLU: the gate rows and
// their up rows) × one of sp splits of K. CTA c takes split s = c % sp and part c / sp of the P parts of the
// tiles (a contiguous range), so its x staging is one k range (per group). With sp > 1 an item's partial sums go
// to a workspace; the item's last CTA to arrive (a counter a tile) adds the sp partials in split order 0..sp−1
// and writes y: a fixed order, so the bits depend on (N, K, G, the SM count) only, never on M, the other rows of
// the batch or the arrival order. (Clusters of sp CTAs reducing in shared memory were tried, s13-run5: the
// cluster shape cost a second wave of CTAs.)
//
// Block: warps 0–3 are the consumer warpgroup (x staging, MMAs, promotion, epilogue); warp 4's lane 0 is the
// producer (tensor copies into a ring of 16 KiB slots, full / empty mbarriers). The producer starts at once
// (weights are constant), so the first ring fills while the previous kernel of a step graph finishes; the
// consumers read the weight scales before griddepcontrol.wait and x after it.
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types (the function comes from the runtime)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/cuda/wgmma_bits.cuh"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
using detail::smem_u32;

constexpr int GE_BOX = 128 * 128;          // bytes a box: 128 rows × 128 k (e4m3), 128-byte swizzle
constexpr int GE_THREADS = 160;            // 4 consumer warps + the producer warp
constexpr int GE_RING = 8;                 // ring slots: 128 KiB of weights in flight an SM (a power of two: slot = i % 8)
constexpr int GE_KS_MAX = 64;              // k blocks an item (x staging ≤ 64 KiB)
constexpr int GE_SC_MAX = 2048;            // weight scales a CTA keeps (its boxes)
constexpr size_t GE_SMEM_MAX = 227 * 1024;

struct GeParams {
  const float* x;        // x[m, g·xg + k], row stride ldx
  int64_t ldx, xg;
  float* y;              // y[m, g·yg + n] (row stride ldy); fused: act[m, n] for n < N/2
  int64_t ldy, yg;
  const float* ws;       // scales [ceil(N/128), ldws] a group, groups sg floats apart
  int64_t ldws, sg;
  int* ctr;              // [tiles] arrival counters (zero between launches)
  float* part;           // [tiles][sp][nb][8 tokens][128 rows] partial sums (sp > 1)
  int M, N, K, G;        // N: rows a group (fused: 2I, gate over up)
  int ks, sp, P, tiles_g, tiles;
  int ablate;            // op-test timing ablations (GemvE4m3Plan::ablate; the results are wrong): 1 no MMAs, 2 no x
                         // staging, 4 no epilogue
  int half;              // fused: N / 2 (the first up row), else 0
  float lim;
};

// d = (acc ? d : 0) + A·B, m64n8k32 e4m3 × e4m3 → f32, A and B from shared memory (K-major, 128-byte swizzle).
__device__ __forceinline__ void wgmma_e4m3_ss_n8(float (&d)[4], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(acc)
      : "memory");
}
// Descriptor of a K-major operand in the 128-byte swizzle: rows of 128 bytes, 8-row atoms 1024 bytes apart
// (SBO), the atom 1024-byte aligned; a k32 step inside the atom adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t ge_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
// One box (128 k × 128 rows from (k0, row0) of group g) into shared memory, completing on `bar`.
__device__ __forceinline__ void ge_tma_box(uint32_t dst, const CUtensorMap* tm, int k0, int row0, int g, uint32_t bar) {
  if (g < 0) {  // a 2-D map (G = 1)
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(tm)), "r"(k0), "r"(row0), "r"(bar)
        : "memory");
    return;
  }
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tm)), "r"(k0), "r"(row0), "r"(g), "r"(bar)
      : "memory");
}
// mbarrier.arrive by lane 0, predicated inside the asm: no branch in the code around the asynchronous MMAs (a
// divergent branch there makes ptxas serialize them: C7518).
__device__ __forceinline__ void ge_arrive_lane0(uint32_t bar, int lane) {
  asm volatile("{\n.reg .pred p;\nsetp.eq.s32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar), "r"(lane)
               : "memory");
}
__device__ __forceinline__ void ge_bar_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// x[m < M, k range of split s in group g] → B: k block jb at xb + 1024·jb, token m's 128 bytes at row m, its
// 16-byte chunk c at chunk c ^ m (the 128-byte swizzle); xsc[8·jb + m] = 2^e. Tasks (m, jb) = t = m·ks + jb dealt to
// the 4 warps (t ≡ warp mod 4), 8 a warp at a time with all 8 loads first; no branch inside a run (tasks past the
// last redo the last one: the same bytes to the same place).
__device__ __forceinline__ void ge_stage_x(const GeParams& p, uint8_t* xb, float* xsc, int g, int s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ntask = p.M * p.ks;
  const float* x0 = p.x + (int64_t)g * p.xg + (int64_t)s * p.ks * 128 + lane * 4;
  for (int t0 = warp; t0 < ntask; t0 += 32) {
    float4 v[8];
    int mm[8], jj[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int t = min(t0 + 4 * i, ntask - 1);
      mm[i] = t / p.ks, jj[i] = t - mm[i] * p.ks;
      v[i] = *reinterpret_cast<const float4*>(x0 + mm[i] * p.ldx + jj[i] * 128);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int m = mm[i], jb = jj[i];
      const int e = detail::act_block_exp(v[i]);
      const float inv = __uint_as_float((uint32_t)(127 - e) << 23);
      auto q8 = [inv](float f) { return (uint32_t)__nv_cvt_float_to_fp8(f * inv, __NV_SATFINITE, __NV_E4M3); };
      const uint32_t w = q8(v[i].x) | q8(v[i].y) << 8 | q8(v[i].z) << 16 | q8(v[i].w) << 24;
      *reinterpret_cast<uint32_t*>(xb + jb * 1024 + m * 128 + (((lane >> 2) ^ m) << 4) + (lane & 3) * 4) = w;
      if (lane == 0) xsc[jb * 8 + m] = __uint_as_float((uint32_t)(127 + e) << 23);
    }
  }
}

template <int NB>  // boxes a k block: 1, or 2 with the fused SwiGLU (gate rows, up rows)
__global__ void __launch_bounds__(GE_THREADS, 1) gemv_e4m3_kernel(const __grid_constant__ CUtensorMap tm, const GeParams p) {
  extern __shared__ uint8_t ge_raw[];
  uint8_t* const sm = ge_raw + ((1024 - (smem_u32(ge_raw) & 1023)) & 1023);  // the swizzle atoms: 1024-aligned
  uint8_t* const ring = sm;                                                    // [ring][16 KiB]
  uint8_t* const xb = ring + (size_t)GE_RING * GE_BOX;                          // [ks][8][128] e4m3 (swizzled)
  float* const xsc = reinterpret_cast<float*>(xb + (size_t)p.ks * 1024);       // [ks][8]
  const int c = blockIdx.x, s = c % p.sp, pi = c / p.sp;
  // items of this CTA: tiles t0, t0 + 1, .. (a contiguous range)
  const int t0 = (int)((int64_t)pi * p.tiles / p.P), nit = (int)((int64_t)(pi + 1) * p.tiles / p.P) - t0;
  const int bpi = p.ks * NB, nbox = nit * bpi;
  float* const wsc = xsc + p.ks * 8;                                            // [nbox] weight scales
  uint64_t* const bars = reinterpret_cast<uint64_t*>(wsc + ((nbox + 1) & ~1));  // full[ring], empty[ring]
  int* const flag = reinterpret_cast<int*>(bars + 2 * GE_RING);
  const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + GE_RING);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 128) {
    for (int i = 0; i < GE_RING; ++i) detail::mbar_init(full0 + 8 * i, 1), detail::mbar_init(empty0 + 8 * i, 4);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 4) {  // producer
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm)) : "memory");
      for (int i = 0; i < nbox; ++i) {
        const int slot = i % GE_RING, round = i / GE_RING;
        detail::mbar_wait(empty0 + 8 * slot, (round & 1) ^ 1);
        const int it = i / bpi, r = i - it * bpi, j = r / NB, b = r - j * NB;
        const int tile = t0 + it, g = tile / p.tiles_g, tl = tile - g * p.tiles_g;
        detail::mbar_expect(full0 + 8 * slot, GE_BOX);
        ge_tma_box(smem_u32(ring + (size_t)slot * GE_BOX), &tm, (s * p.ks + j) * 128, b * p.half + tl * 128, p.G == 1 ? -1 : g,
                   full0 + 8 * slot);
      }
    }
    return;
  }
  // consumers: the weight scales of every box (constant: before the wait), B's absent token rows zero
  for (int i = tid; i < nbox; i += 128) {
    const int it = i / bpi, r = i - it * bpi, j = r / NB, b = r - j * NB;
    const int tile = t0 + it, g = tile / p.tiles_g, tl = tile - g * p.tiles_g;
    wsc[i] = detail::ld_early_f32(p.ws + g * p.sg + (int64_t)((b * p.half + tl * 128) / 128) * p.ldws + s * p.ks + j);
  }
  for (int i = tid; i < p.ks * 8; i += 128) {
    const int m = i & 7;
    if (m >= p.M) {
      uint4* row = reinterpret_cast<uint4*>(xb + (i >> 3) * 1024 + m * 128);
      for (int q = 0; q < 8; ++q) row[q] = make_uint4(0, 0, 0, 0);
      xsc[i] = 0.0f;
    }
  }
  DI_PDL_WAIT();
  const int g8 = lane >> 2, t4 = lane & 3;  // fragment: rows 16·warp + g8 (+ 8), token columns 2·t4, 2·t4 + 1
  const uint32_t ring_a = smem_u32(ring), xb_a = smem_u32(xb);
  int gx = -1;  // the group whose x is staged
  for (int it = 0; it < nit; ++it) {
    const int tile = t0 + it, g = tile / p.tiles_g, tl = tile - g * p.tiles_g;
    if (g != gx) {
      ge_bar_sync();  // every consumer is past its MMAs on the previous B
      if (!(p.ablate & 2)) ge_stage_x(p, xb, xsc, g, s);
      detail::fence_proxy_async_smem();  // (st.shared → the wgmma's operand reads)
      ge_bar_sync();
      gx = g;
    }
    // Box (j, b): 8 independent MMAs (2 m64 halves × 4 k32 steps, each into its own fragment: no dependent
    // chain), then their 4 k32 sums added in f32 and promoted by ws(box) · s_x(token, j); the slot handed back.
    // (Issuing the next box before this one's wait made ptxas serialize every MMA: C7514 / C7518.)
    float tot[NB][2][4] = {};
    for (int j = 0; j < p.ks; ++j) {
      const uint64_t db = ge_desc(xb_a + j * 1024);
      const float sx0 = xsc[j * 8 + 2 * t4], sx1 = xsc[j * 8 + 2 * t4 + 1];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int i = it * bpi + j * NB + b, slot = i % GE_RING;
        detail::mbar_wait(full0 + 8 * slot, (i / GE_RING) & 1);
        if (p.ablate & 1) {
          ge_arrive_lane0(empty0 + 8 * slot, lane);
          continue;
        }
        float z[2][4][4];
        detail::wgmma_fence();
        const uint32_t a0 = ring_a + slot * GE_BOX;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) wgmma_e4m3_ss_n8(z[h][kk], ge_desc(a0 + h * 8192 + kk * 32), db + 2 * kk, 0);
        detail::wgmma_commit();
        detail::wgmma_wait<0>();
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) detail::wgmma_fence_acc(z[h][kk]);
        ge_arrive_lane0(empty0 + 8 * slot, lane);
        const float f0 = wsc[i] * sx0, f1 = wsc[i] * sx1;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float sum = ((z[h][0][e] + z[h][1][e]) + z[h][2][e]) + z[h][3][e];
            tot[b][h][e] = fmaf(sum, (e & 1) ? f1 : f0, tot[b][h][e]);
          }
      }
    }
    // epilogue: value (b, h, i) is row 64h + 16·warp + g8 + 8·(i / 2) of the tile's box b, token 2·t4 + i % 2
    if (p.ablate & 4) continue;
    const int rows_g = NB == 2 ? p.half : p.N;
    float* const yg = p.y + (int64_t)g * p.yg;
    if (p.sp == 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = tl * 128 + 64 * h + 16 * warp + g8 + 8 * (e >> 1), m = 2 * t4 + (e & 1);
          if (row < rows_g && m < p.M)
            yg[(int64_t)m * p.ldy + row] =
                NB == 2 ? detail::swiglu_clamp_one(tot[0][h][e], tot[NB - 1][h][e], p.lim, 1.0f) : tot[0][h][e];
        }
      continue;
    }
    float* const pt = p.part + (size_t)tile * p.sp * NB * 1024;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          pt[(s * NB + b) * 1024 + (2 * t4 + (e & 1)) * 128 + 64 * h + 16 * warp + g8 + 8 * (e >> 1)] = tot[b][h][e];
    __threadfence();
    ge_bar_sync();
    if (tid == 0) *flag = atomicAdd(p.ctr + tile, 1) == p.sp - 1;
    ge_bar_sync();
    if (*flag) {  // the last of the tile's sp items: the sum in split order
      __threadfence();
      // thread tid: row tl·128 + tid of every token; the loads of a split all in flight, splits added in order
      float v[8][NB];
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int b = 0; b < NB; ++b)
          if (m < p.M) v[m][b] = __ldcg(pt + b * 1024 + m * 128 + tid);
      for (int ss = 1; ss < p.sp; ++ss)
#pragma unroll
        for (int m = 0; m < 8; ++m)
#pragma unroll
          for (int b = 0; b < NB; ++b)
            if (m < p.M) v[m][b] += __ldcg(pt + (ss * NB + b) * 1024 + m * 128 + tid);
      const int row = tl * 128 + tid;
#pragma unroll
      for (int m = 0; m < 8; ++m)
        if (m < p.M && row < rows_g)
          yg[(int64_t)m * p.ldy + row] = NB == 2 ? detail::swiglu_clamp_one(v[m][0], v[m][NB - 1], p.lim, 1.0f) : v[m][0];
      if (tid == 0) p.ctr[tile] = 0;  // ready for the next launch
    }
    ge_bar_sync();  // (flag reused by the next item)
  }
}

// Boxes the busiest CTA streams for split count sp, P CTAs a split (+ one box's worth an item for its
// epilogue, + one more for the reduction when split).
int64_t ge_cost(int64_t tiles, int64_t kb, int nb, int sp, int P) {
  return cdiv(tiles, P) * ((kb / sp) * nb + 1 + (sp > 1));
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
}  // namespace

cudaError_t tensor_map_u8(void* out, const void* base, int rank, const uint64_t* dims, const uint64_t* strides,
                          const uint32_t* box, int swizzle, int l2promo) {
  static_assert(sizeof(CUtensorMap) == 128, "tensor_map_u8 writes a 128-byte CUtensorMap");
  if (rank < 1 || rank > 5 || (swizzle != 0 && swizzle != 32 && swizzle != 64 && swizzle != 128))
    return cudaErrorInvalidValue;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess) return e;
  if (!fn || q != cudaDriverEntryPointSuccess) return cudaErrorNotSupported;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], estr[5];
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], estr[i] = 1;
  for (int i = 0; i + 1 < rank; ++i) st[i] = strides[i];
  CUtensorMap tmap;
  const CUresult r = reinterpret_cast<EncodeTiled>(fn)(
      &tmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, (cuuint32_t)rank, const_cast<void*>(base), d, st, b, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
      : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
      : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                      : CU_TENSOR_MAP_SWIZZLE_NONE,
      l2promo == 0   ? CU_TENSOR_MAP_L2_PROMOTION_NONE
      : l2promo == 1 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                     : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  memcpy(out, &tmap, sizeof tmap);
  return cudaSuccess;
}

bool gemv_e4m3_ok(WeightRef W, int64_t N, int64_t K, int G, int64_t w_stride, int64_t s_stride, bool swiglu) {
  if (W.fmt != WFmt::FP8_B128 || !W.w || !W.scale || N <= 0 || K <= 0 || K % 128 || K > 65536 || G < 1 ||
      W.ldws < K / 128 || reinterpret_cast<uintptr_t>(W.w) % 16 || reinterpret_cast<uintptr_t>(W.scale) % 4 ||
      N >= (1 << 30))
    return false;
  if (G > 1 && (w_stride % 16 || w_stride < N * K || s_stride % 4)) return false;
  if (swiglu && (N % 256 || G != 1)) return false;  // (a gate tile and its up tile in one item)
  return true;
}

cudaError_t gemv_e4m3_plan(WeightRef W, int64_t N, int64_t K, int G, int64_t w_stride, int64_t s_stride, bool swiglu,
                           GemvE4m3Plan* plan, int sms, int split, int l2promo) {
  if (!plan || !gemv_e4m3_ok(W, N, K, G, w_stride, s_stride, swiglu)) return cudaErrorNotSupported;
  GemvE4m3Plan pl;
  if (sms <= 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const int nb = swiglu ? 2 : 1;
  const int64_t kb = K / 128, tiles_g = cdiv(swiglu ? N / 2 : N, 128), tiles = tiles_g * G;
  // the split: the fewest boxes on the busiest CTA; ties to fewer splits (less to add up)
  int best_sp = 0, best_P = 0;
  int64_t best = INT64_MAX;
  for (int sp = 1; sp <= kb && sp <= sms; sp *= 2) {
    if (kb % sp || kb / sp > GE_KS_MAX || (split > 0 && sp != split)) continue;
    const int P = (int)std::min<int64_t>(tiles, sms / sp);
    const int64_t c = ge_cost(tiles, kb, nb, sp, P), boxes = cdiv(tiles, P) * (kb / sp) * nb;
    if (boxes > GE_SC_MAX) continue;
    if (c < best) best = c, best_sp = sp, best_P = P;
  }
  if (!best_sp) return cudaErrorNotSupported;
  pl.fmt_ok = true;
  pl.w = W.w, pl.scale = W.scale, pl.ldws = W.ldws, pl.N = N, pl.K = K, pl.G = G, pl.swiglu = swiglu;
  pl.w_stride = G > 1 ? w_stride : N * K, pl.s_stride = s_stride;
  pl.sms = sms, pl.sp = best_sp, pl.P = best_P, pl.tiles = (int)tiles, pl.tiles_g = (int)tiles_g;
  pl.ks = (int)(kb / best_sp);
  const int64_t boxes = cdiv(tiles, best_P) * pl.ks * nb;
  const size_t rest = (size_t)pl.ks * 1024 + (size_t)pl.ks * 32 + (size_t)(boxes + 2) * 4 + 1024 /* align */ + 16;
  pl.ring = GE_RING;
  pl.smem = (size_t)GE_RING * GE_BOX + rest + 2 * 8 * GE_RING;
  if (pl.smem > GE_SMEM_MAX) return cudaErrorNotSupported;
  pl.work_bytes = (size_t)cdiv(tiles * 4, 256) * 256 + (best_sp > 1 ? (size_t)tiles * best_sp * nb * 1024 * 4 : 0);
  // the weight as a 3-D tensor of bytes {K, rows a group, G}, boxes of 128 × 128 × 1, 128-byte swizzle
  static_assert(sizeof(CUtensorMap) == sizeof(pl.tmap), "GemvE4m3Plan::tmap holds a CUtensorMap");
  const uint64_t dims[3] = {(uint64_t)K, (uint64_t)N, (uint64_t)G}, strides[2] = {(uint64_t)K, (uint64_t)pl.w_stride};
  const uint32_t box[3] = {128, 128, 1};
  if (const cudaError_t e = tensor_map_u8(pl.tmap, W.w, G == 1 ? 2 : 3, dims, strides, box, 128, l2promo); e != cudaSuccess)
    return e;
  *plan = pl;
  return cudaSuccess;
}

cudaError_t gemv_e4m3(const GemvE4m3Plan& pl, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, float limit,
                      void* work, cudaStream_t s) {
  if (!pl.fmt_ok) return cudaErrorInvalidValue;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16 || (pl.swiglu && limit <= 0.0f) || !work ||
      reinterpret_cast<uintptr_t>(work) % 256)
    return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  GeParams p = {};
  p.ldx = ldx, p.xg = pl.K, p.ldy = ldy, p.yg = pl.N;
  p.ws = static_cast<const float*>(pl.scale), p.ldws = pl.ldws, p.sg = pl.s_stride / 4;
  p.ctr = static_cast<int*>(work);
  p.part = reinterpret_cast<float*>(static_cast<char*>(work) + cdiv((int64_t)pl.tiles * 4, 256) * 256);
  p.N = (int)pl.N, p.K = (int)pl.K, p.G = pl.G;
  p.ks = pl.ks, p.sp = pl.sp, p.P = pl.P, p.tiles_g = pl.tiles_g, p.tiles = pl.tiles;
  p.half = pl.swiglu ? (int)(pl.N / 2) : 0;
  p.lim = limit;
  p.ablate = pl.ablate;
  CUtensorMap tm;
  memcpy(&tm, pl.tmap, sizeof tm);
  for (int64_t m0 = 0; m0 < M; m0 += 8) {  // rows are independent: 8 a launch
    p.x = x + m0 * ldx, p.y = y + m0 * ldy;
    p.M = (int)std::min<int64_t>(8, M - m0);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(pl.sp * pl.P), 1, 1);
    cfg.blockDim = dim3(GE_THREADS, 1, 1);
    cfg.dynamicSmemBytes = pl.smem;
    cfg.stream = s;
    const cudaError_t e = pl.swiglu ? cudaLaunchKernelEx(&cfg, gemv_e4m3_kernel<2>, tm, p)
                                    : cudaLaunchKernelEx(&cfg, gemv_e4m3_kernel<1>, tm, p);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

namespace detail {
cudaError_t init_attributes_gemv_e4m3() {
  return first_error({set_max_dynamic_smem(gemv_e4m3_kernel<1>, GE_SMEM_MAX),
                      set_max_dynamic_smem(gemv_e4m3_kernel<2>, GE_SMEM_MAX)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
