// Routed experts for T > 8 tokens (decode batches 16..256 and prefill): a parallel, deterministic grouping
// of the routed slots by expert, and one grouped expert kernel that reads each (expert, 256-row) weight
// tile once per row tile in its stored format and multiplies it with all of that expert's rows on tensor
// cores. Design notes and predictions: docs/cuda-notes.md, "MoE grouped experts: design and predictions".
//
// Grouping (moe_group_par): three small launches, no host sync.
//   1. count: each warp takes a chunk of GR_CH consecutive slots and counts them per expert (warp match,
//      one shared-memory counter row per warp); the chunk's counts go to scratch[chunk, E].
//   2. scan (one block, a thread per expert): per-expert prefix over the chunks (in place), then a
//      block-wide exclusive scan over the experts gives offsets[E+1] and the tile list.
//   3. place: each warp walks its chunk again in slot order; a slot's grouped row is its expert's base
//      for the chunk + the number of earlier slots of the chunk with the same expert. So an expert's rows
//      are its slots in ascending slot (= token) order, whatever the thread timing: the outputs are
//      bitwise those of the single-block moe_group.
//
// Expert GEMM (moe_expert_gemm), one block (8 warps) per work item = (row tile of ≤ 8·NT8 rows of one
// expert, 256 weight rows):
// * The MMA is mma.sync.m16n8k16 bf16 → f32 with the weights as A (16 weight rows an MMA) and the
//   expert's rows as B (8 rows an n8 tile): a row tile of ≤ 8 rows costs one n8 tile, so decode (1..8
//   rows an expert) wastes nothing and prefill (64-row tiles) runs 8 n8 tiles per A fragment.
// * Weights and x both travel global → shared memory with cp.async in a 2- or 3-stage pipeline (a stage =
//   128 bytes of each of the 256 weight rows, i.e. 64 / 128 / 256 k for bf16 / fp8 / fp4, plus the
//   x rows' matching k range and, fp4, the e8m0 bytes). Warp w owns 32 weight rows (two m16 tiles; with
//   the fused SwiGLU: 16 gate rows and the matching 16 up rows) over the whole K, so no cross-warp
//   reduction; the x stage is shared by the 8 warps.
// * k order inside one MMA is free as long as A and B agree: in each 64-k chunk lane (g, t) owns k
//   [16t, 16t + 16) (stored positions); MMA i takes positions 16t + 4i + {0, 1} (a0 … b0) and + {2, 3}
//   (a2 … b1). So x is used as stored (cp.async, two 16-byte shared loads give 4 MMAs' B) and the weight
//   row slice a lane needs is one 16-byte (bf16: two) or 8-byte (fp4) shared load.
// * Dequantization is exact and in registers: e4m3 byte → bf16 bits (value·2^-120) × bf16(2^120·scale)
//   (as gemv_q); e2m1 nibbles → bf16x2 pairs {n_j, n_j+4} of each 8-k group (value·2^-126, gemv_q's
//   3-op decode) × 2^(e8m0 − 1), so fp4's x is stored in that pair order (k0 k4 k1 k5 k2 k6 k3 k7 in each
//   8 k): moe_x_to_bf16(pair_order) writes h so, and w13's epilogue writes act so when w2 is fp4.
// * Epilogue: f32 y[grouped row, N], or with the SwiGLU fused (gate and up accumulators of one lane hold
//   the same (row, column)) the bf16 act[grouped row, I] = bf16(swiglu_clamp_one(g, u)).
//
// Batch invariance: a grouped row's k summation order (stages, chunks, MMAs in program order) and the
// MMA column it occupies do not change its value, so a slot's y is independent of the other slots (and of
// NT8); the combine (moe_combine) then adds a token's experts in ascending id.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/cuda/moe_grouped.h"
#include "ops/cuda/wgmma_bits.cuh"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
using detail::u4get, detail::mma16816, detail::bmul2, detail::pack_bf16, detail::pow2_bf16x2, detail::e4m3x4_raw,
    detail::e2m1x8_raw;

// ---------------------------------------------------------------------------------------------------------
// Grouping
// ---------------------------------------------------------------------------------------------------------
constexpr int GR_WARPS = 8, GR_CH = 256;  // slots a warp-chunk

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// mode 0: count into scratch[chunk, E]; mode 1: place (scratch holds each chunk's exclusive prefix).
template <int MODE>
__global__ void __launch_bounds__(GR_WARPS * 32) group_chunks_kernel(const int32_t* __restrict__ sel, int64_t S, int E,
                                                                     int K, int32_t* __restrict__ scratch,
                                                                     const int32_t* __restrict__ offsets,
                                                                     int32_t* __restrict__ perm_tok,
                                                                     int32_t* __restrict__ slot_row) {
  DI_PDL_WAIT();
  extern __shared__ int gr_cnt[];  // [GR_WARPS][E]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t chunk = (int64_t)blockIdx.x * GR_WARPS + warp;
  const int64_t nchunks = (S + GR_CH - 1) / GR_CH;
  if (chunk >= nchunks) return;  // whole warps only: no block-wide barrier below
  const int64_t s0 = chunk * GR_CH, s1 = min(S, s0 + GR_CH);
  // the chunk's expert ids, every load in flight before the counters' init and the loop (smallk: one
  // load a loop trip made the batch-128 launch ~8 µs, an L2 round trip per 32 slots)
  int ev[GR_CH / 32];
#pragma unroll
  for (int q = 0; q < GR_CH / 32; ++q) {
    const int64_t i = s0 + q * 32 + lane;
    ev[q] = i < s1 ? sel[i] : -1;
  }
  int* cnt = gr_cnt + warp * E;
  for (int e = lane; e < E; e += 32) cnt[e] = MODE == 0 ? 0 : offsets[e] + scratch[chunk * E + e];
  __syncwarp();
#pragma unroll
  for (int q = 0; q < GR_CH / 32; ++q) {
    const int64_t b = s0 + q * 32;
    if (b >= s1) break;
    const int64_t i = b + lane;
    const int e = ev[q];
    const uint32_t m = __match_any_sync(0xffffffffu, e);
    const int leader = __ffs(m) - 1;
    if (MODE == 1 && e >= 0) {
      const int pos = cnt[e] + __popc(m & lanemask_lt());
      slot_row[i] = pos;
      perm_tok[pos] = (int32_t)(i / K);
    }
    __syncwarp();
    if (e >= 0 && lane == leader) cnt[e] += __popc(m);
    __syncwarp();
  }
  if (MODE == 0)
    for (int e = lane; e < E; e += 32) scratch[chunk * E + e] = cnt[e];
}

// Block-wide exclusive scan (1024 threads); returns the exclusive prefix, *total gets the sum.
__device__ __forceinline__ int block_exscan(int v, int* red, int* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == 31) red[w] = inc;
  __syncthreads();
  if (w == 0) {
    int x = red[lane], xi = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, xi, o);
      if (lane >= o) xi += n;
    }
    red[32 + lane] = xi - x;  // exclusive prefix of the warp sums
    if (lane == 31) red[64] = xi;
  }
  __syncthreads();
  *total = red[64];
  return red[32 + w] + inc - v;
}

__global__ void __launch_bounds__(1024) group_scan_kernel(int64_t S, int E, int tile_m, int32_t* __restrict__ scratch,
                                                          int32_t* __restrict__ offsets, int2* __restrict__ tile_info,
                                                          int32_t* __restrict__ n_tiles) {
  DI_PDL_WAIT();
  __shared__ int red[65];
  const int e = threadIdx.x;
  const int64_t nchunks = (S + GR_CH - 1) / GR_CH;
  int run = 0;
  if (e < E) {
    int64_t c = 0;
    for (; c + 4 <= nchunks; c += 4) {  // four independent loads in flight
      const int v0 = scratch[c * E + e], v1 = scratch[(c + 1) * E + e], v2 = scratch[(c + 2) * E + e],
                v3 = scratch[(c + 3) * E + e];
      scratch[c * E + e] = run;
      scratch[(c + 1) * E + e] = run + v0;
      scratch[(c + 2) * E + e] = run + v0 + v1;
      scratch[(c + 3) * E + e] = run + v0 + v1 + v2;
      run += v0 + v1 + v2 + v3;
    }
    // the last ≤ 3 chunks (all of them at decode, T ≤ 128): loads first, then the stores (smallk: the
    // store between two loads kept them one L2 round trip apart)
    const int rem = (int)(nchunks - c);
    int v[3];
#pragma unroll
    for (int q = 0; q < 3; ++q)
      if (q < rem) v[q] = scratch[(c + q) * E + e];
#pragma unroll
    for (int q = 0; q < 3; ++q)
      if (q < rem) {
        scratch[(c + q) * E + e] = run;
        run += v[q];
      }
  }
  int total = 0;
  const int off = block_exscan(run, red, &total);
  const int nt = e < E ? (run + tile_m - 1) / tile_m : 0;
  int ntot = 0;
  const int toff = block_exscan(nt, red, &ntot);
  if (e < E) {
    offsets[e] = off;
    for (int r = 0; r < nt; ++r) tile_info[toff + r] = make_int2(e, off + r * tile_m);
  }
  if (e == 0) {
    offsets[E] = total;
    *n_tiles = ntot;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Expert GEMM
// ---------------------------------------------------------------------------------------------------------
constexpr int MG_WARPS = 8, MG_NT = MG_WARPS * 32;
constexpr int MG_BN = 256;        // weight rows a block
// Pipeline stages and blocks an SM by tile height: tiles of ≤ 32 rows (decode) run 2 stages and 2 blocks
// an SM (≤ 128 registers, ≤ 109 KiB of shared memory each), so one block's start and end overlap the
// other's stream; 64-row tiles (prefill) run 3 stages and one block an SM.
template <int NT8>
constexpr int mg_nst() {
  return NT8 <= 4 ? 2 : 3;
}
template <int NT8>
constexpr int mg_min_blocks() {
  return NT8 <= 4 ? 2 : 1;
}
constexpr int MG_WB = 128;        // weight bytes of one row a stage
constexpr int MG_WROW = MG_WB + 16;  // shared-memory bytes a weight row (16 of padding: no bank conflicts)

template <WFmt WF>
struct MgFmt {
  static constexpr int KC = WF == WFmt::BF16 ? 64 : WF == WFmt::FP8_B128 ? 128 : 256;  // k a stage
  static constexpr int XROW = KC * 2 + 16;                                             // bytes an x row
  static constexpr int SROW = WF == WFmt::FP4_B32 ? KC / 32 : 0;                       // e8m0 bytes a row
};
template <WFmt WF, int NT8>
constexpr int mg_stage_bytes() {
  return MG_BN * MG_WROW + 8 * NT8 * MgFmt<WF>::XROW + MG_BN * MgFmt<WF>::SROW;
}
template <WFmt WF, int NT8>
constexpr int mg_smem_bytes() {
  return mg_nst<NT8>() * mg_stage_bytes<WF, NT8>();
}

struct MgParams {
  const bf16* x;
  int64_t ldx;
  const int32_t* gather;
  const uint8_t* w;
  const uint8_t* ws;
  int64_t ldws, w_stride, s_stride;
  int64_t N, K, I;
  int swiglu;
  int act_pair;  // swiglu: act's column order (act_pos: 0 natural, 1 e2m1 pair order, 2 wg order)
  float lim;
  const int2* tiles;
  const int32_t* n_tiles;
  const int32_t* offsets;
  void* y;
  int64_t ldy;
};

using detail::cp_async16, detail::cp_async8, detail::cp_async4, detail::cp_async_commit, detail::cp_async_wait;
// Position of k (within its group of 8) in e2m1 pair order: k0 k4 k1 k5 k2 k6 k3 k7.
__host__ __device__ __forceinline__ int pair_pos(int k8) { return k8 < 4 ? 2 * k8 : 2 * (k8 - 4) + 1; }
// "wg order" (the tile-128 kernel's x): inside each 64-k chunk, pair-order position p = 16t + 4i + 2h + l
// moves to 16i + 8h + 2t + l, so 16-byte piece 2i + h is the wgmma stage's core-matrix row (step i, core h).
__host__ __device__ __forceinline__ int wg_pos(int p64) {
  return ((p64 >> 2) & 3) * 16 + ((p64 >> 1) & 1) * 8 + (p64 >> 4) * 2 + (p64 & 1);
}
// act column i → its stored position: order 0 natural, 1 pair order, 2 wg order
__host__ __device__ __forceinline__ int64_t act_pos(int64_t i, int order) {
  if (order == 0) return i;
  const int64_t pp = (i & ~(int64_t)7) | pair_pos((int)(i & 7));
  return order == 1 ? pp : (pp & ~(int64_t)63) | wg_pos((int)(pp & 63));
}

template <WFmt WF, int NT8>
__global__ void __launch_bounds__(MG_NT, mg_min_blocks<NT8>()) moe_expert_gemm_kernel(const MgParams p) {
  DI_PDL_WAIT();
  constexpr int KC = MgFmt<WF>::KC, XROW = MgFmt<WF>::XROW, SROW = MgFmt<WF>::SROW;
  constexpr int MR = 8 * NT8;  // rows a tile
  constexpr int MG_NST = mg_nst<NT8>();
  constexpr int STAGE = mg_stage_bytes<WF, NT8>();
  constexpr int XOFF = MG_BN * MG_WROW, SOFF = XOFF + MR * XROW;
  extern __shared__ __align__(16) uint8_t mg_smem[];
  __shared__ int64_t s_xrow[MR];

  const int tile = blockIdx.y;
  if (tile >= *p.n_tiles) return;
  const int2 ti = p.tiles[tile];
  const int e = ti.x, r0 = ti.y;
  const int nrows = min(MR, p.offsets[e + 1] - r0);
  const int nb = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t K = p.K, I = p.I;
  const bool sw = p.swiglu != 0;
  const uint8_t* wb = p.w + (int64_t)e * p.w_stride;
  const uint8_t* sb = p.ws ? p.ws + (int64_t)e * p.s_stride : nullptr;
  const int64_t wrow_bytes = WF == WFmt::BF16 ? 2 * K : WF == WFmt::FP8_B128 ? K : K / 2;

  // global weight row of shared-memory row r (0..255)
  auto grow = [&](int r) -> int64_t {
    return sw ? (r < MG_BN / 2 ? (int64_t)nb * (MG_BN / 2) + r : I + (int64_t)nb * (MG_BN / 2) + (r - MG_BN / 2))
              : (int64_t)nb * MG_BN + r;
  };
  if (tid < MR) {
    const int r = r0 + min(tid, max(nrows - 1, 0));
    s_xrow[tid] = (int64_t)(p.gather ? p.gather[r] : r) * p.ldx;
  }
  __syncthreads();

  // This thread's cp.async sources for the weights: 8 × 16 bytes a stage (rows tid / 8 + 32·i, piece tid % 8).
  const int wpiece = tid & 7;
  const uint8_t* wsrc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) wsrc[i] = wb + grow((tid >> 3) + 32 * i) * wrow_bytes + wpiece * 16;
  const uint8_t* ssrc = nullptr;  // fp4: this thread's row (tid) of e8m0 bytes
  if constexpr (WF == WFmt::FP4_B32) ssrc = sb + grow(tid) * (K / 32);

  auto issue = [&](int st, int buf) {
    uint8_t* base = mg_smem + buf * STAGE;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      cp_async16(base + ((tid >> 3) + 32 * i) * MG_WROW + wpiece * 16, wsrc[i] + (int64_t)st * MG_WB);
    constexpr int PPR = KC / 8;  // 16-byte pieces an x row
    for (int q = tid; q < MR * PPR; q += MG_NT) {
      const int row = q / PPR, pc = q % PPR;
      if (row < nrows)
        cp_async16(base + XOFF + row * XROW + pc * 16, p.x + s_xrow[row] + (int64_t)st * KC + pc * 8);
    }
    if constexpr (WF == WFmt::FP4_B32) cp_async8(base + SOFF + tid * SROW, ssrc + (int64_t)st * SROW);
  };

  float acc[2][NT8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][j][r] = 0.0f;
  const int ntact = (nrows + 7) >> 3;  // n8 tiles that hold rows (warp-uniform)
  // shared-memory weight rows of this warp's two m16 tiles
  const int trow0 = sw ? warp * 16 : warp * 32, trow1 = sw ? MG_BN / 2 + warp * 16 : warp * 32 + 16;

  const int nst = (int)(K / KC);
#pragma unroll
  for (int s = 0; s < MG_NST - 1; ++s) {
    if (s < nst) issue(s, s);
    cp_async_commit();
  }
  for (int s = 0; s < nst; ++s) {
    cp_async_wait<MG_NST - 2>();
    __syncthreads();  // stage s visible to all; stage s − 1's buffer free
    if (s + MG_NST - 1 < nst) issue(s + MG_NST - 1, (s + MG_NST - 1) % MG_NST);
    cp_async_commit();
    const uint8_t* base = mg_smem + (s % MG_NST) * STAGE;
    const uint8_t* xs = base + XOFF;

    // fp8: one scale a (tile, stage) (the tile's 16 rows lie in one 128-row block, the stage in one 128-k block)
    uint32_t f8c[2] = {0u, 0u}, f8c2[2] = {0u, 0u};
    bool f8big = false;
    if constexpr (WF == WFmt::FP8_B128) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int64_t n = grow(mt ? trow1 : trow0);
        const float sc = __ldg(reinterpret_cast<const float*>(sb) + (n / 128) * p.ldws + s);
        if (sc <= 128.0f) {
          f8c[mt] = pack_bf16(sc * 0x1p120f, sc * 0x1p120f);
          f8c2[mt] = pow2_bf16x2(0);
        } else {
          f8c[mt] = pow2_bf16x2(60);
          f8c2[mt] = pack_bf16(sc * 0x1p60f, sc * 0x1p60f);
          f8big = true;
        }
      }
    }

#pragma unroll
    for (int c = 0; c < KC / 64; ++c) {
      uint32_t A[2][4][4];  // [m tile][mma i][a0..a3]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = (mt ? trow1 : trow0) + g, rb = ra + 8;
        const uint8_t* pa = base + ra * MG_WROW;
        const uint8_t* pb = base + rb * MG_WROW;
        if constexpr (WF == WFmt::BF16) {
          const uint4 a_lo = *reinterpret_cast<const uint4*>(pa + c * 128 + t * 32);
          const uint4 a_hi = *reinterpret_cast<const uint4*>(pa + c * 128 + t * 32 + 16);
          const uint4 b_lo = *reinterpret_cast<const uint4*>(pb + c * 128 + t * 32);
          const uint4 b_hi = *reinterpret_cast<const uint4*>(pb + c * 128 + t * 32 + 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint4& va = i < 2 ? a_lo : a_hi;
            const uint4& vb = i < 2 ? b_lo : b_hi;
            A[mt][i][0] = u4get(va, 2 * (i & 1));
            A[mt][i][2] = u4get(va, 2 * (i & 1) + 1);
            A[mt][i][1] = u4get(vb, 2 * (i & 1));
            A[mt][i][3] = u4get(vb, 2 * (i & 1) + 1);
          }
        } else if constexpr (WF == WFmt::FP8_B128) {
          const uint4 va = *reinterpret_cast<const uint4*>(pa + c * 64 + t * 16);
          const uint4 vb = *reinterpret_cast<const uint4*>(pb + c * 64 + t * 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            uint32_t a0, a1, a2, a3;
            e4m3x4_raw(u4get(va, i), a0, a2);
            e4m3x4_raw(u4get(vb, i), a1, a3);
            const uint32_t c1 = f8c[mt];
            a0 = bmul2(a0, c1), a1 = bmul2(a1, c1), a2 = bmul2(a2, c1), a3 = bmul2(a3, c1);
            if (f8big) {  // block-uniform
              const uint32_t c2 = f8c2[mt];
              a0 = bmul2(a0, c2), a1 = bmul2(a1, c2), a2 = bmul2(a2, c2), a3 = bmul2(a3, c2);
            }
            A[mt][i][0] = a0, A[mt][i][1] = a1, A[mt][i][2] = a2, A[mt][i][3] = a3;
          }
        } else {
          const uint2 va = *reinterpret_cast<const uint2*>(pa + c * 32 + t * 8);
          const uint2 vb = *reinterpret_cast<const uint2*>(pb + c * 32 + t * 8);
          // e8m0 byte of this lane's 16 k (one 32-k group): value·2^-126 × 2^(b − 1); b > 128 needs two factors
          const int ea = (int)base[SOFF + ra * SROW + c * 2 + (t >> 1)] - 1;
          const int eb = (int)base[SOFF + rb * SROW + c * 2 + (t >> 1)] - 1;
          const uint32_t ca = pow2_bf16x2(min(ea, 127)), cb = pow2_bf16x2(min(eb, 127));
          const bool big = __any_sync(0xffffffffu, max(ea, eb) > 127);  // rare: scale > 2
          // x in pair order: the lane's stored positions 16t+4i+{0,1} hold k {w, w+4} of the 8-k group
          // i / 2 with w = 2(i % 2), +{2,3} hold w + 1: exactly the pairs e2m1x8_raw makes.
          uint32_t ra[2][4], rb[2][4];
          e2m1x8_raw(va.x, ra[0]), e2m1x8_raw(va.y, ra[1]), e2m1x8_raw(vb.x, rb[0]), e2m1x8_raw(vb.y, rb[1]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            A[mt][i][0] = bmul2(ra[i >> 1][2 * (i & 1)], ca), A[mt][i][2] = bmul2(ra[i >> 1][2 * (i & 1) + 1], ca);
            A[mt][i][1] = bmul2(rb[i >> 1][2 * (i & 1)], cb), A[mt][i][3] = bmul2(rb[i >> 1][2 * (i & 1) + 1], cb);
          }
          if (big) {  // warp-uniform; the second factors only here
            const uint32_t ca2 = pow2_bf16x2(max(ea - 127, 0)), cb2 = pow2_bf16x2(max(eb - 127, 0));
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              A[mt][i][0] = bmul2(A[mt][i][0], ca2), A[mt][i][2] = bmul2(A[mt][i][2], ca2);
              A[mt][i][1] = bmul2(A[mt][i][1], cb2), A[mt][i][3] = bmul2(A[mt][i][3], cb2);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < NT8; ++j) {
        if (j < ntact) {  // warp-uniform
          const uint8_t* px = xs + (j * 8 + g) * XROW + c * 128 + t * 32;
          const uint4 x0 = *reinterpret_cast<const uint4*>(px), x1 = *reinterpret_cast<const uint4*>(px + 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint4& xv = i < 2 ? x0 : x1;
            const uint32_t b0 = u4get(xv, 2 * (i & 1)), b1 = u4get(xv, 2 * (i & 1) + 1);
            mma16816(acc[0][j], A[0][i][0], A[0][i][1], A[0][i][2], A[0][i][3], b0, b1);
            mma16816(acc[1][j], A[1][i][0], A[1][i][1], A[1][i][2], A[1][i][3], b0, b1);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: lane (g, t), register r → weight row g + 8·(r / 2) of the m16 tile, x row 2t + r % 2 of the n8 tile.
#pragma unroll
  for (int j = 0; j < NT8; ++j) {
    if (j >= ntact) continue;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int col = j * 8 + 2 * t + (r & 1);
      if (col >= nrows) continue;
      const int64_t yrow = (int64_t)(r0 + col) * p.ldy;
      const int rr = g + 8 * (r >> 1);
      if (sw) {
        const int64_t i = act_pos((int64_t)nb * (MG_BN / 2) + warp * 16 + rr, p.act_pair);
        reinterpret_cast<bf16*>(p.y)[yrow + i] =
            __float2bfloat16_rn(detail::swiglu_clamp_one(acc[0][j][r], acc[1][j][r], p.lim, 1.0f));
      } else {
        float* y = reinterpret_cast<float*>(p.y);
        y[yrow + (int64_t)nb * MG_BN + warp * 32 + rr] = acc[0][j][r];
        y[yrow + (int64_t)nb * MG_BN + warp * 32 + 16 + rr] = acc[1][j][r];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Prefill expert GEMM on warpgroup MMA (tile_m = 128, fp4 weights): design and predictions in
// docs/cuda-notes.md, "MoE prefill experts on wgmma".
// * Block = 2 warpgroups (256 threads), work item = (tile of ≤ 128 rows of one expert, 256 weight rows), the
//   grid of moe_expert_gemm_kernel. Warpgroup q computes two m64 tiles (w13: gate rows 64q.. and the
//   matching up rows; w2: rows 128q.. and 128q+64..) × n token columns (n = the tile's rows rounded up to
//   16) with wgmma.m64nNk16: the weights as A from registers (each warp dequantizes its 16 rows of a tile
//   exactly as moe_expert_gemm_kernel does, same registers, same bits), the token rows as B from shared memory.
// * Same numerics and the same k order as the mma.sync kernel: wgmma step i of a 64-k chunk takes B's k
//   (2t + l) from stored position 16t + 4i + l and (8 + 2t + l) from 16t + 4i + 2 + l (t = 0..3, l = 0, 1),
//   i.e. exactly the products (and their pairing in A) of mma.sync number i. x arrives in "wg order"
//   (moe_x_to_bf16 order 2, or w13's act_order 2; see wg_pos), where 16-byte piece 2i + h of a 64-k chunk is
//   exactly core-matrix row (step i, core h): plain 16-byte copies put it in place. (Session 9: the first
//   version took pair-order x through registers and transposed it there; its 32-rows-a-warp-instruction
//   loads clogged the memory pipe, Nsight Compute: ~26 % of the warp samples, docs/cuda-notes.md.)
// * x stage layout (K-major, no swizzle): [k16 step j (8 a stage)][8-row group (16)][core h (2)][row (8)][16 B]
//   → LBO = 128 (core h → h + 1), SBO = 256 (8-row group), 4 KiB a step.
// * Pipeline: 4 stages of 128 k (x 32 KiB, weights 256 × (64 + 16) B, e8m0 256 × 4 B); weights and scales
//   by cp.async 3 stages ahead (48 KiB of weights in flight an SM: tiles of few rows are memory-bound), x by
//   cp.async 2 stages ahead (its buffer is read by wgmmas that may outlive the stage); A double-buffered in
//   registers, wgmma_wait<2> after each step keeps two steps in flight (the A of three steps live).
constexpr int MW_NT = 256, MW_BN = 256, MW_MR = 128, MW_KC = 128, MW_NST = 4;
constexpr int MW_WB = MW_KC / 2;        // fp4 bytes of a weight row a stage
constexpr int MW_WROW = MW_WB + 16;     // padded shared row
constexpr int MW_SROW = MW_KC / 32;     // e8m0 bytes of a row a stage
constexpr int MW_XSTEP = MW_MR * 32;    // bytes of one k16 step of x (128 rows × 16 k × 2 B)
constexpr int MW_XB = (MW_KC / 16) * MW_XSTEP;
constexpr int MW_WOFF = MW_XB, MW_SOFF = MW_WOFF + MW_BN * MW_WROW;
constexpr int MW_STAGE = MW_SOFF + MW_BN * MW_SROW;
constexpr int MW_SMEM = MW_NST * MW_STAGE;
static_assert(MW_SMEM <= 227 * 1024, "moe_expert_gemm_wg: shared memory");
static_assert(MW_STAGE % 128 == 0, "stage alignment");

__global__ void __launch_bounds__(MW_NT, 1) moe_expert_gemm_wg_kernel(const MgParams p) {
  DI_PDL_WAIT();
  extern __shared__ __align__(128) uint8_t mw_smem[];
  __shared__ int64_t s_xrow[MW_MR];

  const int tile = blockIdx.y;
  if (tile >= *p.n_tiles) return;
  const int2 ti = p.tiles[tile];
  const int e = ti.x, r0 = ti.y;
  const int nrows = min(MW_MR, p.offsets[e + 1] - r0);
  const int ncols = (nrows + 15) & ~15;  // wgmma N (block-uniform)
  const int nb = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wv = warp & 3;  // warpgroup, warp in it
  const int64_t K = p.K, I = p.I;
  const bool sw = p.swiglu != 0;
  const uint8_t* wb = p.w + (int64_t)e * p.w_stride;
  const uint8_t* sb = p.ws + (int64_t)e * p.s_stride;
  const int64_t wrow_bytes = K / 2;

  auto grow = [&](int r) -> int64_t {
    return sw ? (r < MW_BN / 2 ? (int64_t)nb * (MW_BN / 2) + r : I + (int64_t)nb * (MW_BN / 2) + (r - MW_BN / 2))
              : (int64_t)nb * MW_BN + r;
  };
  if (tid < MW_MR) s_xrow[tid] = tid < nrows ? (int64_t)(p.gather ? p.gather[r0 + tid] : r0 + tid) * p.ldx : 0;
  __syncthreads();

  // cp.async sources: weights 4 × 16 B a stage (rows tid / 4 + 64·i, piece tid % 4), e8m0 4 B (row tid)
  const int wpiece = tid & 3;
  const uint8_t* wsrc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) wsrc[i] = wb + grow((tid >> 2) + 64 * i) * wrow_bytes + wpiece * 16;
  const uint8_t* ssrc = sb + grow(tid) * (K / 32);
  // part q = 0..3 of a stage's weight copies: rows tid / 4 + 64·q (and the e8m0 bytes with part 3)
  auto issue_w_part = [&](int st, int buf, int q) {
    uint8_t* base = mw_smem + buf * MW_STAGE;
    cp_async16(base + MW_WOFF + ((tid >> 2) + 64 * q) * MW_WROW + wpiece * 16, wsrc[q] + (int64_t)st * MW_WB);
    if (q == 3) {
      cp_async4(base + MW_SOFF + tid * MW_SROW, ssrc + (int64_t)st * MW_SROW);
    }
  };
  auto issue_w = [&](int st, int buf) {
#pragma unroll
    for (int q = 0; q < 4; ++q) issue_w_part(st, buf, q);
  };
  // x (wg order: 16-byte piece pc = 8·xc + 2i + h of a row's 256-byte stage chunk is the core-matrix row
  // (step 4·xc + i, core h)) by cp.async, 8 pieces a thread: rows 16·warp + lane % 8 + 8·u (u = 0, 1), pieces
  // 4·pq + lane / 8 (pq = 0..3). A warp instruction covers 8 rows × 64 contiguous bytes in global memory (8
  // line requests; the register path's loads took 32 rows × 16 B) and 4 × 128 contiguous bytes of shared
  // memory (conflict-free). Rows ≥ nrows are not copied: they only feed the tile's unused token columns.
  const int xq = lane >> 3;
  const bf16* xsrc[2];
  bool xon[2];
  uint32_t xdst[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int row = 16 * warp + 8 * u + (lane & 7);
    xon[u] = row < nrows;
    xsrc[u] = p.x + s_xrow[row] + xq * 8;
    xdst[u] = (uint32_t)((row >> 3) * 256 + (xq & 1) * 128 + (row & 7) * 16 + (xq >> 1) * MW_XSTEP);
  }
  // part q = 0..3 of a stage's x copies: row u = q / 2, pieces 4·pq + xq for pq = 2·(q % 2) + {0, 1}
  // (piece 4·pq + xq → step 2·pq + xq / 2, core xq % 2)
  auto issue_x_part = [&](int st, int buf, int q) {
    const int u = q >> 1;
    if (!xon[u]) return;
    uint8_t* base = mw_smem + buf * MW_STAGE;
#pragma unroll
    for (int pq = 2 * (q & 1); pq < 2 * (q & 1) + 2; ++pq)
      cp_async16(base + xdst[u] + 2 * pq * MW_XSTEP, xsrc[u] + (int64_t)st * MW_KC + pq * 32);
  };
  auto issue_x = [&](int st, int buf) {
#pragma unroll
    for (int q = 0; q < 4; ++q) issue_x_part(st, buf, q);
  };

  // The main loop and the epilogue, compiled for each wgmma N (the tile's rows rounded up to 16): one branch
  // a block, none a step (the per-step switch over N cost ~5 branches an MMA step, Nsight Compute s9-run3).
  auto run = [&](auto ncl) {
  constexpr int NC = decltype(ncl)::value;
  float acc[2][64];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 64; ++r) acc[mt][r] = 0.0f;
  // shared weight rows of this warp's 16-row slice of its two m64 tiles
  const int trow0 = sw ? wg * 64 + wv * 16 : wg * 128 + wv * 16;
  const int trow1 = sw ? MW_BN / 2 + wg * 64 + wv * 16 : wg * 128 + 64 + wv * 16;
  const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(mw_smem);

  // Commit groups, in order: w0 x0 w1 x1 w2 | x2 w3 | x3 w4 | … (stage s issues x of s + 2 and the weights of
  // s + 3, one group each, empty past the end). x goes only 2 stages ahead: its buffer's last reader, a wgmma
  // of stage s − 2, has retired for both warpgroups once they pass stage s's barrier (each ran stage s − 1's
  // second step, whose wait_group 2 leaves only that stage's steps in flight), while stage s − 1's last
  // wgmmas may still read its buffer. Three groups follow x_s's.
  const int nst = (int)(K / MW_KC);
  for (int st = 0; st < MW_NST - 1; ++st) {
    if (st < nst) issue_w(st, st);
    cp_async_commit();
    if (st < 2) {
      if (st < nst) issue_x(st, st);
      cp_async_commit();
    }
  }
  // The copies of stage s (x of s + 2, then the weights of s + 3) are spread over its 8 wgmma steps, one part
  // a step after the step's wgmma is issued: issued as one burst at the stage's top they queued in the memory
  // pipe, and every warp then waited for its copies' address registers (Nsight Compute, session 9).
  for (int s = 0; s < nst; ++s) {
    cp_async_wait<3>();
    detail::fence_proxy_async_smem();  // this thread's copies (generic proxy) → the wgmma reads after the barrier
    __syncthreads();                   // stage s visible; stage s − 1's weights and stage s − 2's x free
    const int buf = s % MW_NST;
    const uint8_t* base = mw_smem + buf * MW_STAGE;
#pragma unroll
    for (int c = 0; c < MW_KC / 64; ++c) {
      uint2 va[2], vb[2];
      uint32_t ca[2], cb[2], ca2[2], cb2[2];
      bool big[2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = (mt ? trow1 : trow0) + g, rb = ra + 8;
        va[mt] = *reinterpret_cast<const uint2*>(base + MW_WOFF + ra * MW_WROW + c * 32 + t * 8);
        vb[mt] = *reinterpret_cast<const uint2*>(base + MW_WOFF + rb * MW_WROW + c * 32 + t * 8);
        const int ea = (int)base[MW_SOFF + ra * MW_SROW + c * 2 + (t >> 1)] - 1;
        const int eb = (int)base[MW_SOFF + rb * MW_SROW + c * 2 + (t >> 1)] - 1;
        ca[mt] = pow2_bf16x2(min(ea, 127)), cb[mt] = pow2_bf16x2(min(eb, 127));
        big[mt] = __any_sync(0xffffffffu, max(ea, eb) > 127);
        ca2[mt] = pow2_bf16x2(max(ea - 127, 0)), cb2[mt] = pow2_bf16x2(max(eb - 127, 0));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t A[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {  // as moe_expert_gemm_kernel: MMA i's A fragment, same bits
          uint32_t ra[4], rb[4];
          e2m1x8_raw((i >> 1) ? va[mt].y : va[mt].x, ra);
          e2m1x8_raw((i >> 1) ? vb[mt].y : vb[mt].x, rb);
          A[mt][0] = bmul2(ra[2 * (i & 1)], ca[mt]), A[mt][2] = bmul2(ra[2 * (i & 1) + 1], ca[mt]);
          A[mt][1] = bmul2(rb[2 * (i & 1)], cb[mt]), A[mt][3] = bmul2(rb[2 * (i & 1) + 1], cb[mt]);
          if (big[mt]) {  // warp-uniform
            A[mt][0] = bmul2(A[mt][0], ca2[mt]), A[mt][2] = bmul2(A[mt][2], ca2[mt]);
            A[mt][1] = bmul2(A[mt][1], cb2[mt]), A[mt][3] = bmul2(A[mt][3], cb2[mt]);
          }
        }
        const uint64_t desc = detail::wgmma_desc(smem0 + buf * MW_STAGE + (c * 4 + i) * MW_XSTEP, 128, 256);
        detail::wgmma_fence();
        detail::wgmma_rs2_n<NC>(acc[0], A[0], acc[1], A[1], desc);
        detail::wgmma_commit();
        const int j = c * 4 + i;  // the stage's step (a constant once unrolled)
        if (j < 4) {
          if (s + 2 < nst) issue_x_part(s + 2, (s + 2) % MW_NST, j);
          if (j == 3) cp_async_commit();
        } else {
          if (s + MW_NST - 1 < nst) issue_w_part(s + MW_NST - 1, (s + MW_NST - 1) % MW_NST, j - 4);
          if (j == 7) cp_async_commit();
        }
        detail::wgmma_wait<2>();  // step j − 2 done: its A registers may be rewritten (two steps in flight)
      }
    }
  }
  detail::wgmma_wait<0>();
  detail::wgmma_fence_acc(acc[0]);
  detail::wgmma_fence_acc(acc[1]);
  cp_async_wait<0>();

  // Epilogue: accumulator d[4j + r] of warp wv, lane (g, t) → row 16·wv + g + 8·(r / 2) of the m64 tile,
  // token column 8j + 2t + r % 2 (mma.sync's C layout per n8 block).
#pragma unroll
  for (int j = 0; j < NC / 8; ++j) {
    if (8 * j >= nrows) break;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int col = j * 8 + 2 * t + (r & 1);
      if (col >= nrows) continue;
      const int64_t yrow = (int64_t)(r0 + col) * p.ldy;
      const int rr = wv * 16 + g + 8 * (r >> 1);
      if (sw) {
        const int64_t i = act_pos((int64_t)nb * (MW_BN / 2) + wg * 64 + rr, p.act_pair);
        reinterpret_cast<bf16*>(p.y)[yrow + i] =
            __float2bfloat16_rn(detail::swiglu_clamp_one(acc[0][4 * j + r], acc[1][4 * j + r], p.lim, 1.0f));
      } else {
        float* y = reinterpret_cast<float*>(p.y);
        y[yrow + (int64_t)nb * MW_BN + wg * 128 + rr] = acc[0][4 * j + r];
        y[yrow + (int64_t)nb * MW_BN + wg * 128 + 64 + rr] = acc[1][4 * j + r];
      }
    }
  }
  };
  switch (ncols) {
    case 16: run(std::integral_constant<int, 16>{}); break;
    case 32: run(std::integral_constant<int, 32>{}); break;
    case 48: run(std::integral_constant<int, 48>{}); break;
    case 64: run(std::integral_constant<int, 64>{}); break;
    case 80: run(std::integral_constant<int, 80>{}); break;
    case 96: run(std::integral_constant<int, 96>{}); break;
    case 112: run(std::integral_constant<int, 112>{}); break;
    default: run(std::integral_constant<int, 128>{}); break;
  }
}

// y[M, K] bf16 (row stride K) = x[M, K] f32 (row stride ldx), each group of 8 k in pair order. K % 8 == 0.
__global__ void bf16_pair_rows_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                      bf16* __restrict__ y) {
  DI_PDL_WAIT();
  const int64_t g8 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = K / 8;
  if (g8 >= M * per) return;
  const int64_t m = g8 / per, k = (g8 % per) * 8;
  const float* xr = x + m * ldx + k;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = xr[i];
  uint4 o;
  o.x = pack_bf16(v[0], v[4]), o.y = pack_bf16(v[1], v[5]), o.z = pack_bf16(v[2], v[6]), o.w = pack_bf16(v[3], v[7]);
  *reinterpret_cast<uint4*>(y + m * K + k) = o;
}
// The same in wg order (K % 64 == 0): the four pair words of an 8-k group go to their wg positions.
__global__ void bf16_wg_rows_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                    bf16* __restrict__ y) {
  DI_PDL_WAIT();
  const int64_t g8 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = K / 8;
  if (g8 >= M * per) return;
  const int64_t m = g8 / per, k = (g8 % per) * 8;
  const float* xr = x + m * ldx + k;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = xr[i];
  bf16* yc = y + m * K + (k & ~(int64_t)63);
  const int p0 = (int)(k & 63);  // pair-order position of word j: p0 + 2j (holds k j and j + 4)
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<uint32_t*>(yc + wg_pos(p0 + 2 * j)) = pack_bf16(v[j], v[j + 4]);
}

template <WFmt WF, int NT8>
cudaError_t mg_launch(const MgParams& p, int64_t max_tiles, cudaStream_t s) {
  constexpr int smem = mg_smem_bytes<WF, NT8>();
  static_assert(smem <= 227 * 1024, "moe_expert_gemm: shared memory");
  // (its max dynamic shared memory attribute = smem: set once by init_kernel_attributes, mg_attrs)
  const int64_t nblk = p.swiglu ? (p.N / 2) / (MG_BN / 2) : p.N / MG_BN;
  const dim3 grid((unsigned)nblk, (unsigned)max_tiles);
  moe_expert_gemm_kernel<WF, NT8><<<grid, MG_NT, smem, s>>>(p);
  return cudaGetLastError();
}
cudaError_t mw_launch(const MgParams& p, int64_t max_tiles, cudaStream_t s) {
  cudaError_t e = cudaFuncSetAttribute(moe_expert_gemm_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MW_SMEM);
  if (e != cudaSuccess) return e;
  const int64_t nblk = p.swiglu ? (p.N / 2) / (MW_BN / 2) : p.N / MW_BN;
  moe_expert_gemm_wg_kernel<<<dim3((unsigned)nblk, (unsigned)max_tiles), MW_NT, MW_SMEM, s>>>(p);
  return cudaGetLastError();
}
template <WFmt WF, int NT8>
cudaError_t mg_attrs() {
  return detail::set_max_dynamic_smem(moe_expert_gemm_kernel<WF, NT8>, mg_smem_bytes<WF, NT8>());
}
template <WFmt WF>
cudaError_t mg_attrs_wf() {
  return detail::first_error({mg_attrs<WF, 1>(), mg_attrs<WF, 2>(), mg_attrs<WF, 4>(), mg_attrs<WF, 8>()});
}

template <WFmt WF>
cudaError_t mg_dispatch_nt(const MgParams& p, int tile_m, int64_t max_tiles, cudaStream_t s) {
  if (tile_m == 128) return WF == WFmt::FP4_B32 ? mw_launch(p, max_tiles, s) : cudaErrorInvalidValue;
  switch (tile_m) {
    case 8: return mg_launch<WF, 1>(p, max_tiles, s);
    case 16: return mg_launch<WF, 2>(p, max_tiles, s);
    case 32: return mg_launch<WF, 4>(p, max_tiles, s);
    case 64: return mg_launch<WF, 8>(p, max_tiles, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int64_t moe_group_scratch_ints(int64_t slots, int E) { return cdiv(std::max<int64_t>(slots, 1), GR_CH) * E; }

cudaError_t moe_group_par(const int32_t* sel, int64_t T, int K, int E, int tile_m, int32_t* offsets,
                          int32_t* perm_tok, int32_t* slot_row, int2* tile_info, int32_t* n_tiles, int32_t* scratch,
                          cudaStream_t s) {
  if (E <= 0 || E > 1024 || K <= 0 || tile_m <= 0 || T < 0) return cudaErrorInvalidValue;
  const int64_t S = T * K;
  if (S > INT32_MAX / 2) return cudaErrorInvalidValue;
  const int64_t nchunks = cdiv(S, GR_CH);
  const size_t smem = (size_t)GR_WARPS * E * sizeof(int);
  const unsigned blocks = (unsigned)cdiv(nchunks, GR_WARPS);
  if (blocks > 0) {
    group_chunks_kernel<0><<<blocks, GR_WARPS * 32, smem, s>>>(sel, S, E, K, scratch, nullptr, nullptr, nullptr);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  group_scan_kernel<<<1, 1024, 0, s>>>(S, E, tile_m, scratch, offsets, tile_info, n_tiles);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (blocks > 0)
    group_chunks_kernel<1><<<blocks, GR_WARPS * 32, smem, s>>>(sel, S, E, K, scratch, offsets, perm_tok, slot_row);
  return cudaGetLastError();
}

cudaError_t moe_x_to_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, int order, bf16* y, cudaStream_t s) {
  if (order == 0) return f32_to_bf16_rows(x, M, K, ldx, y, s);
  if (order < 0 || order > 2 || K % (order == 2 ? 64 : 8) || reinterpret_cast<uintptr_t>(y) % 16)
    return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  if (order == 1) bf16_pair_rows_kernel<<<(unsigned)cdiv(M * (K / 8), 256), 256, 0, s>>>(x, M, K, ldx, y);
  else bf16_wg_rows_kernel<<<(unsigned)cdiv(M * (K / 8), 256), 256, 0, s>>>(x, M, K, ldx, y);
  return cudaGetLastError();
}

int moe_grouped_tile_m(int64_t T) { return T <= 8 ? 8 : T <= 16 ? 16 : T <= 256 ? 32 : 64; }
// Measured on the H200 (s4 run a/b): the 128-row wgmma tiles are 1.5x slower than 64-row mma.sync at
// T = 512..1024 and ~5 % faster at T = 4096 (bitwise equal either way): wide tiles from T = 2048 on.
int moe_grouped_tile_m(int64_t T, bool wide) { return wide && T >= 2048 ? 128 : moe_grouped_tile_m(T); }

bool moe_expert_gemm_ok(WFmt f, int64_t N, int64_t K, bool swiglu) {
  const int64_t kc = f == WFmt::BF16 ? 64 : f == WFmt::FP8_B128 ? 128 : 256;
  if (K <= 0 || K % kc) return false;
  (void)swiglu;  // swiglu: I = N/2 a multiple of 128, the same condition
  return N > 0 && N % MG_BN == 0;
}

cudaError_t moe_expert_gemm(const bf16* x, int64_t ldx, const int32_t* gather, int64_t K, WeightRef W,
                            int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit,
                            int act_order, const int2* tile_info, const int32_t* n_tiles, int64_t max_tiles,
                            const int32_t* offsets, int tile_m, void* y, int64_t ldy, cudaStream_t s) {
  if (act_order < 0 || act_order > 2 || (act_order == 2 && (swiglu ? N / 2 : N) % 64)) return cudaErrorInvalidValue;
  if (!moe_expert_gemm_ok(W.fmt, N, K, swiglu) || ldx % 8 || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(W.w) % 16 || w_stride % 16)
    return cudaErrorInvalidValue;
  if (W.fmt != WFmt::BF16 && !W.scale) return cudaErrorInvalidValue;
  if (W.fmt == WFmt::FP4_B32 && (reinterpret_cast<uintptr_t>(W.scale) % 8 || s_stride % 8)) return cudaErrorInvalidValue;
  if (swiglu && !(limit > 0.0f)) return cudaErrorInvalidValue;
  if (max_tiles <= 0) return cudaSuccess;
  if (max_tiles > 65535) return cudaErrorInvalidValue;
  MgParams p = {};
  p.x = x, p.ldx = ldx, p.gather = gather;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.I = N / 2;
  p.swiglu = swiglu ? 1 : 0, p.lim = limit, p.act_pair = swiglu ? act_order : 0;
  p.tiles = tile_info, p.n_tiles = n_tiles, p.offsets = offsets;
  p.y = y, p.ldy = ldy;
  switch (W.fmt) {
    case WFmt::BF16: return mg_dispatch_nt<WFmt::BF16>(p, tile_m, max_tiles, s);
    case WFmt::FP8_B128: return mg_dispatch_nt<WFmt::FP8_B128>(p, tile_m, max_tiles, s);
    default: return mg_dispatch_nt<WFmt::FP4_B32>(p, tile_m, max_tiles, s);
  }
}

namespace detail {
cudaError_t init_attributes_moe_grouped() {
  return first_error({mg_attrs_wf<WFmt::BF16>(), mg_attrs_wf<WFmt::FP8_B128>(), mg_attrs_wf<WFmt::FP4_B32>()});
}
}  // namespace detail

}  // namespace deepinfer::cuda
