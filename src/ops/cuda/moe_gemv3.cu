// Routed experts at decode, fp4 weights (e2m1 + ue8m0 1×32 scales as stored): moe_gemv3, moe_gemv2's
// successor with the same results bit for bit. Design notes, byte counts and predictions:
// docs/cuda-notes.md, "MoE decode GEMV v3 (moe_gemv3)".
//
// What Nsight Compute said about moe_gemv2 (session 5, T = 1 w13: 32.4 µs, DRAM 36 %): issue slots 46 %
// busy with 16 warps an SM (116 registers), the integer ALU pipe (half rate) the busiest, 49 % excess
// global sectors from the x staging, and per 32-row item two block barriers around a 256-thread
// reduction, so the 16 warps idle while it runs. What changes here:
// * 32 warps (1024 threads, ≤ 64 registers): warp w takes tile w / 16 (16 rows) and the 64-byte chunks
//   c ≡ w (mod 16) of every row. moe_gemv2's warp w % 16 did the same chunks for both tiles, each tile
//   its own MMA chain, so every chain and the slice order of the reduction are unchanged: same bits.
//   8 warps a scheduler instead of 4 to hide the LDS → decode → HMMA latencies.
// * One block barrier an item: a warp stores only the accumulator columns < mmr (the run's x rows) in a
//   double-buffered partial-sum area; after the barrier the last 16·mmr (fused) or rows·mmr threads add
//   the 16 slices in order (as moe_gemv2) and write y while the other warps start the next item.
// * x staged with coalesced loads (consecutive lanes, consecutive 16 bytes: a warp instruction reads
//   512 contiguous bytes; lane pairs swap halves to build gemv_q's fragment-order units), once per
//   distinct x: consecutive runs reading the same x rows (every run of w13 at T = 1) share a buffer; the
//   block's first two distinct x are staged up front, while the first bulk copies fly.
// * Fewer integer-ALU instructions in the loop: the e2m1 word's shift by 8 is a high multiply and the
//   scale factor one multiply-add (both on the FMA pipe), with the same bits as before.
// * w2's shape (K = 2048, not fused): 64-row items, two tiles a warp (tiles w / 16 and w / 16 + 2, one set
//   of x loads), so that a warp's item is more than one 128-k chunk.
// Loads, ring and items are moe_gemv2's (one TMA bulk copy a weight row and a scale row, issued by lanes
// 0..3 (0..7 for 64 rows) of warps 0..7; a ring of S stages; block b takes items [b·n/G, (b+1)·n/G)), with
// 3 stages for K = 4096 when one x row serves every slot (w13 at T = 1).
//
// Batch invariance: an output is its tile's chain over the chunks of slice s in ascending order, then
// slices 0..15 added in order: depends on (N, K) only (moe_gemv2's argument, unchanged).
#include <algorithm>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::smem_u32, detail::mbar_init, detail::mbar_expect, detail::mbar_wait, detail::bulk_load;
using detail::mma16816, detail::bmul2, detail::pack_bf16, detail::pow2_bf16x2, detail::u4get;

constexpr int V3_WARPS = 32, V3_NT = V3_WARPS * 32;
constexpr int V3_SLICES = 16;       // K slices (warps a tile)
constexpr int V3_ROWS = 32;         // weight rows an item (two 16-row tiles)
constexpr int V3_PAD = 64;          // shared-memory bytes after each weight row
constexpr int V3_MAXS = 6;          // ring stages at most
constexpr int V3_MAXSLOTS = 64;     // T·topk a launch
constexpr int V3_MAXRUN = 8;        // slots a run (the MMA's n8 side)
constexpr size_t V3_SMEM = 224 * 1024;  // dynamic shared memory budget (+ ~2.5 KiB static ≤ the 227 KiB opt-in)

struct V3Params {
  const float* x;
  int64_t ldx;
  const uint8_t* w;   // expert e's rows at w + e·w_stride, [N, K/2] bytes
  const uint8_t* ws;  // its e8m0 scales at ws + e·s_stride, [N, K/32] bytes
  int64_t w_stride, s_stride;
  int64_t N, K;
  float* y;
  int64_t ldy;
  const int32_t* sel;  // [slots]
  int slots, topk, x_per_slot;
  int fuse;  // y = swiglu(gate, up)[slot, I]
  int64_t I;
  float lim;
  int mmr, stages, xbufs, nred;  // x rows a buffer (= run cap), ring stages, x buffers, partial-sum buffers
  uint32_t shift8;               // 1 << 24, as a parameter: w >> 8 stays a high multiply (FMA pipe)
};

// detail::e2m1x8_raw with the word's shift by 8 as a high multiply (m = 1 << 24 from a parameter, so the
// compiler keeps it on the FMA pipe): the same four bf16x2 values.
__device__ __forceinline__ void e2m1x8_raw_v3(uint32_t w, uint32_t m, uint32_t (&r)[4]) {
  const uint32_t w2 = __umulhi(w, m);
  r[0] = ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  r[1] = ((w & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
  r[2] = ((w2 & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  r[3] = ((w2 & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
}
// detail::fp4_mma (one 16-row tile × one 128-k chunk: rows g (w0) and g + 8 (w1), 8 MMAs), same bits.
template <bool BIG>
__device__ __forceinline__ void fp4_mma_v3(float (&acc)[4], const uint4& w0, const uint4& w1, const uint4 (&X)[4],
                                           uint32_t c0, uint32_t c1, uint32_t c0b, uint32_t c1b, uint32_t m) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t r0[4], r1[4];
    e2m1x8_raw_v3(u4get(w0, i), m, r0);
    e2m1x8_raw_v3(u4get(w1, i), m, r1);
#pragma unroll
    for (int j = 0; j < 4; ++j) r0[j] = bmul2(r0[j], c0), r1[j] = bmul2(r1[j], c1);
    if (BIG) {
#pragma unroll
      for (int j = 0; j < 4; ++j) r0[j] = bmul2(r0[j], c0b), r1[j] = bmul2(r1[j], c1b);
    }
    mma16816(acc, r0[0], r1[0], r0[1], r1[1], X[i].x, X[i].y);
    mma16816(acc, r0[2], r1[2], r0[3], r1[3], X[i].z, X[i].w);
  }
}
// pow2_bf16x2(b − 1) for a scale byte b ≤ 128, as one multiply-add: ((b + 126) << 7) in both halves.
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t b) { return b * 0x00800080u + 0x3F003F00u; }

// MMR: x rows a buffer (= the run cap, the launch's mmr); KC: K when it is 2048 or 4096 (V4-Flash's w2 and
// w13: constant offsets, the chunk loop unrolled), else 0 (K from the parameters). TPW: tiles a warp
// (2: 64-row items, warp w takes tiles w / 16 and w / 16 + 2, both chains on the same x loads; for w2,
// K = 2048 and not fused, where one 128-k chunk a tile and item would leave the per-item work a third of
// a warp's instructions).
template <int MMR, int KC, int TPW>
__global__ void __launch_bounds__(V3_NT, 1) moe_gemv3_kernel(const V3Params p) {
  DI_PDL_WAIT();
  extern __shared__ __align__(128) uint8_t v3_smem[];
  __shared__ __align__(8) uint64_t full[V3_MAXS];
  __shared__ int s_sel[V3_MAXSLOTS], s_lead[V3_MAXSLOTS], s_run_e[V3_MAXSLOTS];
  __shared__ uint8_t s_run_n[V3_MAXSLOTS], s_run_slot[V3_MAXSLOTS][V3_MAXRUN];
  __shared__ int s_nruns;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rt = warp >> 4, sl = warp & (V3_SLICES - 1);  // this warp's (first) tile and K slice
  constexpr int ROWS = V3_ROWS * TPW, TILES = 2 * TPW;       // an item's rows and 16-row tiles
  constexpr int mmr = MMR;
  const int S = p.stages, slots = p.slots;
  const int K = KC ? KC : (int)p.K;
  const int RS = K / 2 + V3_PAD;  // shared-memory bytes a weight row
  const int SB = K / 32;          // scale bytes a row
  const int SS = SB + 16;         // shared-memory bytes a scale row
  const int stage_bytes = ROWS * (RS + SS);
  const int xbuf_bytes = K * mmr * 2;  // bf16 [K/8 units][mmr][…] (gemv_q's fp4 fragment order)
  uint8_t* ring = v3_smem;
  uint8_t* xbase = v3_smem + (size_t)S * stage_bytes;
  float* red = reinterpret_cast<float*>(xbase + (size_t)p.xbufs * xbuf_bytes);

  // Runs (moe_gemv2's): slot s leads a run when the number of earlier slots with its expert is a multiple
  // of mmr; the run holds that slot and the next ≤ mmr − 1 slots with the expert. Runs ordered by leader.
  if (tid < S) mbar_init(smem_u32(&full[tid]), 1);
  if (tid < slots) s_sel[tid] = p.sel[tid];
  __syncthreads();
  if (tid < slots) {
    const int e = s_sel[tid];
    int before = 0;
    for (int j = 0; j < tid; ++j) before += s_sel[j] == e;
    s_lead[tid] = before % mmr == 0;
  }
  __syncthreads();
  if (tid < slots && s_lead[tid]) {
    int r = 0;
    for (int j = 0; j < tid; ++j) r += s_lead[j];
    const int e = s_sel[tid];
    int n = 0;
    for (int j = tid; j < slots && n < mmr; ++j)
      if (s_sel[j] == e) s_run_slot[r][n++] = (uint8_t)j;
    s_run_e[r] = e;
    s_run_n[r] = (uint8_t)n;
  }
  if (tid == 0) {
    int c = 0;
    for (int j = 0; j < slots; ++j) c += s_lead[j];
    s_nruns = c;
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();

  const int RG = p.fuse ? (int)(p.I / 16) : (int)(p.N / ROWS);  // items a run (fused: TPW = 1)
  const int nitems = s_nruns * RG;  // ≤ 64 · 2^24 / 16 (moe_gemv3_ok bounds N)
  const int i0 = (int)((int64_t)nitems * blockIdx.x / gridDim.x);
  const int i1 = (int)((int64_t)nitems * (blockIdx.x + 1) / gridDim.x);
  const int nq = i1 - i0;
  if (nq <= 0) return;  // (block-uniform)

  // Item (run, rg)'s ROWS weight rows and their scale rows → a stage: thread 0's one arrival with the byte
  // count before the block barrier that precedes the copies, then lanes 0..ROWS/8 − 1 of warps 0..7 copy
  // row L = (ROWS/8)·warp + lane (tile L / 16, row L % 16): the address math runs once for 4 or 8 rows,
  // and a bulk copy (uniform operands) costs a few instructions of the issuing warp, so two warps a
  // scheduler carry it instead of all 32. Items advance by counters (no divisions in the loop).
  const uint32_t stage_tx = (uint32_t)(ROWS * (K / 2 + SB));
  const uint32_t full0 = smem_u32(&full[0]), ring0 = smem_u32(ring);
  const bool copier = warp < 8 && lane < ROWS / 8;
  const int crow = (ROWS / 8) * warp + lane;                               // (copiers)
  const int64_t wrow = p.fuse ? (crow >> 4) * p.I + (crow & 15) : crow;  // + rg · 16 (fused) or rg · ROWS
  const int rg_rows = p.fuse ? 16 : ROWS;
  auto issue = [&](int run, int rg, int st) {
    if (!copier) return;
    const uint32_t sw = ring0 + (uint32_t)(st * stage_bytes), bar = full0 + 8u * (uint32_t)st;
    const int64_t e = s_run_e[run], n = wrow + (int64_t)rg * rg_rows;
    bulk_load(sw + crow * RS, p.w + e * p.w_stride + n * (K / 2), (uint32_t)(K / 2), bar);
    bulk_load(sw + ROWS * RS + crow * SS, p.ws + e * p.s_stride + n * SB, (uint32_t)SB, bar);
  };
  int run_i = i0 / RG, rg_i = i0 - run_i * RG;  // the next item to copy
  const int pre = min(S, nq);
  if (tid == 0)
    for (int q = 0; q < pre; ++q) mbar_expect(full0 + 8u * q, stage_tx);
  __syncthreads();
  for (int q = 0; q < pre; ++q) {
    issue(run_i, rg_i, q);
    if (++rg_i == RG) rg_i = 0, ++run_i;
  }

  // x: the rows a run reads (x[slot] or x[slot / topk]); two runs share a staged buffer when they read the
  // same rows in the same order (block-uniform comparisons on shared memory).
  auto xrow = [&](int slot) { return p.x_per_slot ? slot : slot / p.topk; };
  auto same_x = [&](int ra, int rb) {
    const int n = s_run_n[ra];
    if (n != s_run_n[rb]) return false;
    for (int j = 0; j < n; ++j)
      if (xrow(s_run_slot[ra][j]) != xrow(s_run_slot[rb][j])) return false;
    return true;
  };
  // Stage the x rows of run ra into buffer ba (and of run rb ≥ 0 into bb): float4 i of the rows (row m,
  // k = 4f) is read by consecutive threads; lanes 2i and 2i + 1 hold the two halves of unit u = f / 2
  // (x[8u..8u+3], x[8u+4..8u+7]) and swap one half each so that each writes 8 bytes of the unit
  // {x0,x4 | x1,x5 | x2,x6 | x3,x7}. Row lengths are multiples of 32 float4: a warp is all in or all out.
  auto stage_x = [&](int ra, int ba, int rb, int bb) {
    constexpr int B = 4;  // float4 a thread loads before converting
    const int q4 = K / 4;
    const int n0 = s_run_n[ra] * q4;
    const int total = n0 + (rb >= 0 ? s_run_n[rb] * q4 : 0);
    for (int base = 0; base < total; base += B * V3_NT) {
      float4 v[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const int i = base + j * V3_NT + tid;
        if (i < total) {
          const bool second = i >= n0;
          const int ii = i - (second ? n0 : 0), m = ii / q4, f = ii - m * q4;
          const float* xr = p.x + (int64_t)xrow(s_run_slot[second ? rb : ra][m]) * p.ldx + 4 * f;
          v[j] = *reinterpret_cast<const float4*>(xr);
        }
      }
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const int i = base + j * V3_NT + tid;
        if (i < total) {  // (warp-uniform)
          const bool second = i >= n0;
          const int ii = i - (second ? n0 : 0), m = ii / q4, f = ii - m * q4;
          const int h = f & 1, u = f >> 1;
          const float s0 = h ? v[j].x : v[j].z, s1 = h ? v[j].y : v[j].w;
          const float o0 = __shfl_xor_sync(0xffffffffu, s0, 1), o1 = __shfl_xor_sync(0xffffffffu, s1, 1);
          const uint2 wv = h ? make_uint2(pack_bf16(o0, v[j].z), pack_bf16(o1, v[j].w))
                             : make_uint2(pack_bf16(v[j].x, o0), pack_bf16(v[j].y, o1));
          const int c = u >> 4, tt = (u >> 2) & 3, qw = u & 3;
          const int unit = ((c * 4 + qw) * mmr + m) * 4 + tt;
          *reinterpret_cast<uint2*>(xbase + (size_t)(second ? bb : ba) * xbuf_bytes + (size_t)unit * 16 + 8 * h) = wv;
        }
      }
    }
  };
  int run_c = i0 / RG, rg_c = i0 - run_c * RG;  // the item being computed
  int buf_run0 = run_c, buf_run1 = -1;           // the runs whose x rows buffers 0 and 1 hold
  if (p.xbufs > 1)
    for (int r = run_c + 1; r <= (i1 - 1) / RG; ++r)
      if (!same_x(r, run_c)) {
        buf_run1 = r;
        break;
      }
  stage_x(buf_run0, 0, buf_run1, 1);
  __syncthreads();

  // This lane's offsets inside a stage: 16 bytes of row g of its tile at its slice's first chunk (+ 8·RS:
  // row g + 8), its scale byte; its partial sums' place; the x unit is set at each run change.
  const int nch = K / 128;  // 64-byte chunks a row
  const uint32_t m24 = p.shift8;
  const int w_off = (rt * 16 + g) * RS + t * 16 + sl * 64;
  const int s_off = ROWS * RS + (rt * 16 + g) * SS + t + sl * 4;  // (tile rt + 2j: + 32j rows)
  const int w1off = 8 * RS, s1off = 8 * SS;
  const int tile_f = V3_SLICES * 16 * mmr, slice_f = 16 * mmr;  // partial sums: [tile][slice][16 rows × mmr]
  float* const red_w = red + (rt * V3_SLICES + sl) * slice_f;
  const uint4* xl0 = nullptr;
  int cur_run = -1, cur_b = 0, rows = 1;
  int st = 0;
  uint32_t phase = 0;
  for (int q = 0; q < nq; ++q) {
    const int run = run_c, rg = rg_c;
    if (run != cur_run) {  // block-uniform
      int b = -1;
      if (buf_run0 == run || same_x(buf_run0, run)) b = 0;
      else if (buf_run1 >= 0 && (buf_run1 == run || same_x(buf_run1, run))) b = 1;
      if (b < 0) {  // every warp is past the previous item's barrier: nobody reads x until this one's compute
        b = p.xbufs > 1 ? cur_b ^ 1 : 0;
        stage_x(run, b, -1, 0);
        if (b) buf_run1 = run;
        else buf_run0 = run;
        __syncthreads();
      }
      cur_run = run, cur_b = b, rows = s_run_n[run];
      // x unit of lane (g, t) at its slice's first chunk; columns ≥ rows read row rows − 1 (valid values
      // whose outputs are not stored: an MMA column depends on its own x row only)
      xl0 = reinterpret_cast<const uint4*>(xbase + (size_t)b * xbuf_bytes) + min(g, rows - 1) * 4 + t + sl * 16 * mmr;
    }
    mbar_wait(full0 + 8u * st, phase);

    const uint8_t* stg = ring + (size_t)st * stage_bytes;
    const uint8_t* wl = stg + w_off;
    const uint8_t* sp = stg + s_off;
    const uint4* xl = xl0;
    float acc[TPW][4] = {};
    // One chunk of this warp's tiles: (a slice step is 16 chunks = 1024 bytes of a row, 64 scale bytes,
    // 256·mmr x units)
    auto chunk = [&](const uint8_t* wl, const uint8_t* sp, const uint4* xl) {
      uint4 X[4];
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) X[qq] = xl[qq * mmr * 4];
      uint4 w0[TPW], w1[TPW];
      uint32_t b0[TPW], b1[TPW], bmax = 0;
#pragma unroll
      for (int j = 0; j < TPW; ++j) {  // tile rt + 2j: 32j rows further
        w0[j] = *reinterpret_cast<const uint4*>(wl + 32 * j * RS);
        w1[j] = *reinterpret_cast<const uint4*>(wl + 32 * j * RS + w1off);
        b0[j] = sp[32 * j * SS], b1[j] = sp[32 * j * SS + s1off];
        bmax = max(bmax, max(b0[j], b1[j]));
      }
      // value·2^-126 × 2^(b−1); b > 128 needs a second factor 2^(b−128): one warp-uniform branch a chunk
      // (both paths give the same bits; mma.sync needs the whole warp on one path)
      if (!__any_sync(0xffffffffu, bmax > 128u)) {
#pragma unroll
        for (int j = 0; j < TPW; ++j)
          fp4_mma_v3<false>(acc[j], w0[j], w1[j], X, scale_bf16x2(b0[j]), scale_bf16x2(b1[j]), 0u, 0u, m24);
      } else {
#pragma unroll
        for (int j = 0; j < TPW; ++j) {
          const int e0 = (int)b0[j] - 1, e1 = (int)b1[j] - 1;
          fp4_mma_v3<true>(acc[j], w0[j], w1[j], X, pow2_bf16x2(min(e0, 127)), pow2_bf16x2(min(e1, 127)),
                           pow2_bf16x2(max(e0 - 127, 0)), pow2_bf16x2(max(e1 - 127, 0)), m24);
        }
      }
    };
    if constexpr (KC != 0) {  // K / 2048 chunks a slice, every slice the same count
#pragma unroll
      for (int j = 0; j < KC / 128 / V3_SLICES; ++j)
        chunk(wl + j * 64 * V3_SLICES, sp + j * 4 * V3_SLICES, xl + j * 16 * mmr * V3_SLICES);
    } else {
      for (int c = sl; c < nch; c += V3_SLICES, wl += 64 * V3_SLICES, sp += 4 * V3_SLICES, xl += 16 * mmr * V3_SLICES)
        chunk(wl, sp, xl);
    }
    // partial sums: lane (g, t) register r → row g + 8·(r / 2), column 2t + r % 2; columns < mmr kept
    const int rbuf = p.nred > 1 ? (q & 1) : 0;
    float* rb = red_w + rbuf * TILES * tile_f;
#pragma unroll
    for (int j = 0; j < TPW; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = 2 * t + (r & 1);
        if (col < mmr) rb[2 * j * tile_f + (g + 8 * (r >> 1)) * mmr + col] = acc[j][r];
      }
    // thread 0 has seen this stage's phase complete (its wait above): the next phase's arrival may go now
    const bool more = q + S < nq;
    if (tid == 0 && more) mbar_expect(full0 + 8u * st, stage_tx);
    __syncthreads();  // every warp is done with the stage and has stored its sums
    if (more) {
      issue(run_i, rg_i, st);
      if (++rg_i == RG) rg_i = 0, ++run_i;
    }
    if (++st == S) st = 0, phase ^= 1u;
    if (++rg_c == RG) rg_c = 0, ++run_c;

    // Item q's outputs: slices 0..15 in order (moe_gemv2's warps 0..15), then y or swiglu_clamp_one(gate, up).
    // Done by the last threads (the highest warps: not the copiers 0..7), output o = tid − (1024 − outputs).
    const float* rq = red + rbuf * TILES * tile_f;
    if (!p.fuse) {
      const int o = tid - (V3_NT - ROWS * mmr);
      if (o >= 0) {
        const int row = o / mmr, col = o - row * mmr;
        const float* e = rq + (row >> 4) * tile_f + (row & 15) * mmr + col;
        float v = e[0];
#pragma unroll
        for (int s = 1; s < V3_SLICES; ++s) v += e[s * slice_f];
        if (col < rows) p.y[(int64_t)s_run_slot[run][col] * p.ldy + (int64_t)rg * ROWS + row] = v;
      }
    } else if (tid >= V3_NT - 16 * mmr) {  // tile 0 = gate rows, tile 1 = the matching up rows
      const int o = tid - (V3_NT - 16 * mmr), row = o / mmr, col = o - row * mmr;
      const float* e = rq + row * mmr + col;
      float gt = e[0], up = e[tile_f];
#pragma unroll
      for (int s = 1; s < V3_SLICES; ++s) gt += e[s * slice_f], up += e[tile_f + s * slice_f];
      if (col < rows)
        p.y[(int64_t)s_run_slot[run][col] * p.ldy + (int64_t)rg * 16 + row] = detail::swiglu_clamp_one(gt, up, p.lim, 1.0f);
    }
    // one partial-sum buffer: its reads must end before the next item's stores
    if (p.nred == 1) __syncthreads();
  }
}

struct V3Layout {
  int stages = 0, xbufs = 1, nred = 1;
};
// Shared memory: S ring stages, xbufs x buffers, nred partial-sum buffers. First S ≥ 2, then two
// partial-sum buffers (one barrier an item), then two x buffers (not when one x row serves every slot),
// then as many stages as fit (≤ V3_MAXS).
V3Layout v3_layout(int64_t K, int mmr, bool one_x, int tpw) {
  const int64_t stage = V3_ROWS * tpw * (K / 2 + V3_PAD + K / 32 + 16);
  const int64_t xbuf = (int64_t)mmr * K * 2, red = (int64_t)2 * tpw * V3_SLICES * 16 * mmr * 4;
  for (int nred = 2; nred >= 1; --nred)
    for (int xb = one_x ? 1 : 2; xb >= 1; --xb) {
      const int64_t room = (int64_t)V3_SMEM - xb * xbuf - nred * red;
      if (room >= 2 * stage) {
        V3Layout l;
        l.stages = (int)std::min<int64_t>(V3_MAXS, room / stage), l.xbufs = xb, l.nred = nred;
        return l;
      }
    }
  return V3Layout{};
}
size_t v3_smem_bytes(int64_t K, int mmr, int tpw, const V3Layout& l) {
  return (size_t)l.stages * V3_ROWS * tpw * (K / 2 + V3_PAD + K / 32 + 16) + (size_t)l.xbufs * mmr * K * 2 +
         (size_t)l.nred * 2 * tpw * V3_SLICES * 16 * mmr * 4;
}
// Two tiles a warp (64-row items) for w2's shape: K = 2048, not fused, N % 64 == 0.
int v3_tpw(int64_t K, int64_t N, bool swiglu) { return K == 2048 && !swiglu && N % 64 == 0 ? 2 : 1; }
using V3Kernel = void (*)(V3Params);
template <int MMR>
V3Kernel v3_kernel_k(int64_t K, int tpw) {
  return K == 4096   ? moe_gemv3_kernel<MMR, 4096, 1>
         : K == 2048 ? (tpw == 2 ? moe_gemv3_kernel<MMR, 2048, 2> : moe_gemv3_kernel<MMR, 2048, 1>)
                     : moe_gemv3_kernel<MMR, 0, 1>;
}
V3Kernel v3_kernel(int mmr, int64_t K, int tpw) {
  return mmr == 1   ? v3_kernel_k<1>(K, tpw)
         : mmr == 2 ? v3_kernel_k<2>(K, tpw)
         : mmr == 4 ? v3_kernel_k<4>(K, tpw)
                    : v3_kernel_k<8>(K, tpw);
}
int v3_mmr(int64_t T) {
  const int64_t m = std::min<int64_t>(V3_MAXRUN, std::max<int64_t>(1, T));
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}
}  // namespace

bool moe_gemv3_ok(WeightRef W, int64_t T, int topk, int64_t N, int64_t K, int64_t w_stride, int64_t s_stride) {
  const int64_t slots = T * topk;
  return W.fmt == WFmt::FP4_B32 && W.w && W.scale && T > 0 && topk > 0 && slots <= V3_MAXSLOTS && N > 0 &&
         N <= (1 << 24) && N % V3_ROWS == 0 && K >= 512 && K % 512 == 0 && K <= 65536 && w_stride % 16 == 0 && s_stride % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.w) % 16 == 0 && reinterpret_cast<uintptr_t>(W.scale) % 16 == 0 &&
         v3_layout(K, v3_mmr(T), false, 1).stages >= 2 && v3_layout(K, v3_mmr(T), false, v3_tpw(K, N, false)).stages >= 2;
}

cudaError_t moe_gemv3(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk, int64_t K,
                      WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit, float* y,
                      int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  if (!moe_gemv3_ok(W, T, topk, N, K, w_stride, s_stride)) return cudaErrorNotSupported;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (swiglu && limit <= 0.0f) return cudaErrorInvalidValue;
  int sms = plan && plan->sms > 0 ? plan->sms : 0;  // (only the SM count is taken from a plan)
  if (sms == 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  V3Params p = {};
  p.x = x, p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale);
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.y = y, p.ldy = ldy;
  p.sel = sel, p.slots = (int)(T * topk), p.topk = topk, p.x_per_slot = x_per_slot ? 1 : 0;
  p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
  p.mmr = v3_mmr(T);
  const bool one_x = x_per_slot ? T * topk == 1 : T == 1;  // every slot reads the same x row
  const int tpw = v3_tpw(K, N, swiglu);
  const V3Layout l = v3_layout(K, p.mmr, one_x, tpw);
  p.stages = l.stages, p.xbufs = l.xbufs, p.nred = l.nred;
  p.shift8 = 1u << 24;
  // (the max dynamic shared memory attribute V3_SMEM: set by init_kernel_attributes)
  v3_kernel(p.mmr, K, tpw)<<<sms, V3_NT, v3_smem_bytes(K, p.mmr, tpw, l), s>>>(p);
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_moe_gemv3() {
  for (int mmr : {1, 2, 4, 8})
    for (int64_t K : {4096, 2048, 512})
      for (int tpw : {1, 2})
        if (const cudaError_t e = set_max_dynamic_smem(v3_kernel(mmr, K, tpw), V3_SMEM); e != cudaSuccess) return e;
  return cudaSuccess;
}
}  // namespace detail

}  // namespace deepinfer::cuda
