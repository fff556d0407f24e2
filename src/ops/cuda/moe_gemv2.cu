// Routed experts at decode, fp4 weights (e2m1 + ue8m0 1×32 scales as stored): moe_gemv2. Design notes,
// byte counts and predictions: docs/cuda-notes.md, "MoE decode GEMV v2 (moe_gemv2)". The same kernel with
// F8 = 2 or 4 is moe_gemv2_fp8 (the backend's default since session 12): x quantized to e4m3 per 128-k block,
// e4m3 wgmma, its own staging and compute blocks below ("MoE decode experts on fp8 MMAs" in the notes).
//
// Why a new kernel: gemv_q_grouped (v3 and v4) reads fp4 experts at ~23 % of HBM at T = 1 and T = 8 alike
// (so not a launch or bytes-in-flight limit alone: v4 has > 100 KiB in flight an SM). Per weight byte it
// issues the e2m1 decode (≈ 17 instructions a 4-byte word) plus address math, per-row byte loads of
// the scales, prefetches, and a block + cluster reduction every 32 KiB. Here the loads cost almost
// no issue slots and the reduction comes once per 32 rows × K:
//
// * Work item = (run, 32 weight rows × all of K). A run = ≤ mmr slots of one expert (slot order; the
//   weight is read once for them). fused SwiGLU: the rows are gate rows 16·rg.. and up rows I + 16·rg..
//   (tile 0 / tile 1), else rows 32·rg... Items are ordered run-major; block b of G takes the contiguous
//   range [b·n/G, (b+1)·n/G) (one block an SM, G = SMs), so x is restaged only when the run changes.
// * Loads (session 7: whole row blocks): an item's 32 rows (fused: its 16 gate rows and 16 up rows) are
//   contiguous in the expert's [N, K/2] weight and [N, K/32] scales, so lane 0 of warp 0 moves them in 2
//   (fused: 4) bulk copies; moe_gemv2_rows keeps the session-5 form: one TMA bulk copy a weight row (K/2
//   bytes) and one a scale row (K/32 bytes), issued by lane 0 of each warp (2 rows a warp) after a block
//   barrier, completing on the stage's mbarrier (its one
//   arrival, with the byte count, made by thread 0 before that barrier); a ring of S stages (2 for
//   K = 4096, 4–5 for K = 2048): ≥ 70 KiB in flight an SM, no registers held for it. Weight rows are
//   padded by 64 bytes in shared memory so the two rows of an 8-lane phase hit different banks, scale
//   rows by 16 so a warp's 8 rows of scale bytes sit in 8 banks.
// * Compute: 16 warps; warp w takes the 64-byte chunks c = w, w + 16, … of every row (chunk = 128 k):
//   lane (g, t) reads 16 bytes (one 32-k scale block) of rows g and g + 8 of each tile and does gemv_q's
//   fp4 step (fp4_mma: exact decode by bit placement, × 2^(e8m0 − 1) in bf16, m16n8k16 with the run's
//   ≤ 8 x rows as the n8 side). x is staged as bf16 in the fragment order of gemv_q (fill_x).
// * Fixed-order reduction: warps 0..15 added in order through shared memory (one barrier), then the
//   outputs written (or swiglu_clamp_one of gate and up: the same bits as swiglu_clamp on the unfused y).
//
// Batch invariance: an output's value is the chain of its warp's chunks in ascending order, then warps
// 0..15 in order; that depends on (N, K) only. MMA column j depends on x row j only, rows ≥ the run's
// size are zero columns, and the run grouping, mmr, the stage count and the grid change no summation.
// So a slot's result is bitwise the same whatever the other tokens picked (and for every T), and the
// fused act equals swiglu_clamp of the unfused output bitwise. (Not the same bits as gemv_q_grouped:
// other k split.)
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/cuda/wgmma_bits.cuh"

namespace deepinfer::cuda {
namespace {
using detail::smem_u32, detail::mbar_init, detail::mbar_expect, detail::mbar_wait, detail::bulk_load;
using detail::fp4_mma, detail::pack_bf16, detail::pow2_bf16x2, detail::u4get;

constexpr int MV_WARPS = 16, MV_NT = MV_WARPS * 32;
constexpr int MV_ROWS = 32;                        // weight rows a tile pair (two 16-row tiles); an item: 1 or 2 pairs
constexpr int MV_PAD = 64;                         // shared-memory bytes after each weight row
constexpr int MV_MAXS = 6;                         // ring stages at most
constexpr int MV_MAXSLOTS = 64;                    // T·topk a launch
constexpr int MV_MAXRUN = 8;                       // slots a run (the MMA's n8 side)
constexpr int MV_RED = 2 * 128;                    // a warp's partial sums of a tile pair: [tile][4][32]
constexpr int MV_RED8 = 32;                        // F8: a k split's sums of a tile pair and token: [tile][16 rows]
constexpr size_t MV_SMEM = 224 * 1024;  // dynamic shared memory budget (+ 2.5 KiB static ≤ the 227 KiB opt-in)

struct MvParams {
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
  int mmr, stages;  // x staging rows (= run cap), ring stages
  int contig;       // 1: an item's rows in 2–4 bulk copies of whole 16/32-row blocks (unpadded rows in
                    // shared memory); 0: one copy a row and a scale row (padded rows), the session-5 form
  int nred;         // partial-sum buffers (2 where shared memory allows: one block barrier an item, not 2)
  int early;        // 0: everything after the PDL wait; 1: sel was written ≥ 2 launches back (routing and the
                    // first stages' copies before the wait); 2: x too (its staging also before the wait)
  int pairs;        // tile pairs an item (2: 64-row items, unfused with block copies only; session 8: at K = 2048
                    // an item is one 128-k chunk a warp, so the per-item work was ~40 % of its instructions)
};

// x rows of a run → bf16 in shared memory, in gemv_q's fp4 fragment order: unit ((c·4 + q)·mmr + m)·4 + t
// holds x[m][128c + 32t + 8q + (0, 4, 1, 5, 2, 6, 3, 7)].
__device__ __forceinline__ void mv_stage_x(uint4* xs, const float* __restrict__ x, const int64_t* xoff, int rows,
                                           int mmr, int K) {
  constexpr int B = 4;  // units a thread loads before converting
  const int units = K / 8, total = rows * units;
  for (int i0 = threadIdx.x; i0 < total; i0 += B * MV_NT) {
    float4 a[B], b[B];
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int idx = i0 + j * MV_NT;
      if (idx < total) {
        const int m = idx / units, u = idx - m * units;
        const float* xr = x + xoff[m] + (int64_t)u * 8;
        a[j] = *reinterpret_cast<const float4*>(xr), b[j] = *reinterpret_cast<const float4*>(xr + 4);
      }
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int idx = i0 + j * MV_NT;
      if (idx < total) {
        const int m = idx / units, u = idx - m * units;
        const int c = u >> 4, t = (u >> 2) & 3, q = u & 3;
        xs[((c * 4 + q) * mmr + m) * 4 + t] = make_uint4(pack_bf16(a[j].x, b[j].x), pack_bf16(a[j].y, b[j].y),
                                                         pack_bf16(a[j].z, b[j].z), pack_bf16(a[j].w, b[j].w));
      }
    }
  }
}

// F8 = NT (moe_gemv2_fp8): the x rows of a run (≤ NT = 2 or 4 tokens u) → the wgmma B operands in shared memory,
// quantized as quant_act_kernel's moe_quant_fp8 does (DeepSeek's activation quantization: e4m3 with a scale 2^e per
// token and 128-k block). B of chunk pair cp (chunks 2cp + h), step j (k32): N = 8·NT columns n = 4NT·h + 4u + q ×
// 32 k-slots, K-major core matrices (8 columns × 16 bytes; LBO 128 between the k halves, SBO 256 between 8-column
// groups), at xb + (4cp + j)·256·NT. Column n holds token u's x only in the k-slots its A side takes from lane t = q
// (4q..4q+3: k 32q + 8j + 0, 2, 4, 6 of chunk 2cp + h; 16 + 4q..: the odd k), zeros elsewhere — so a column sums
// one 32-k scale group of one token. xe[u·(K/128) + c] = (6 + e) << 23: the block's part of the promotion factor's
// exponent field. One warp a (token, 128-k block); even lanes write whole 16-byte rows (the zeros too, and token
// 0's warps the rows of absent tokens), so the area needs no clearing.
template <int NT>
__device__ __forceinline__ void mv_stage_x8(uint8_t* xb, uint32_t* xe, const float* __restrict__ x, const int64_t* xoff,
                                            int rows, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = K / 128;
  auto row_at = [&](int c, int j, int u, int q) {  // (column 4NT·(c % 2) + 4u + q, k half 0) of step (c / 2, j)
    const int n = 4 * NT * (c & 1) + 4 * u + q;
    return xb + ((c >> 1) * 4 + j) * (256 * NT) + (n >> 3) * 256 + (n & 7) * 16;
  };
  for (int task = warp; task < rows * nb; task += MV_WARPS) {
    const int u = task / nb, c = task - u * nb;
    const float4 v = *reinterpret_cast<const float4*>(x + xoff[u] + c * 128 + lane * 4);
    const int e = detail::act_block_exp(v);
    const float inv = __uint_as_float((uint32_t)(127 - e) << 23);
    auto q8 = [inv](float f) { return (uint32_t)__nv_cvt_float_to_fp8(f * inv, __NV_SATFINITE, __NV_E4M3); };
    // lane l: k 4l..4l+3 of the block = group q = l / 8, word j = (l / 2) % 4, weights 4·(l % 2) + 0..3 of the
    // word: its even k (x, z) are k-slots 4q + 2·(l % 2) + 0, 1, its odd k (y, w) the same + 16
    uint32_t lo = q8(v.x) | q8(v.z) << 8, hi = q8(v.y) | q8(v.w) << 8;
    lo |= __shfl_down_sync(0xffffffffu, lo, 1) << 16;
    hi |= __shfl_down_sync(0xffffffffu, hi, 1) << 16;
    if ((lane & 1) == 0) {
      const int q = lane >> 3, j = (lane >> 1) & 3;
      uint4 rl = make_uint4(0, 0, 0, 0), rh = rl;
      (q == 0 ? rl.x : q == 1 ? rl.y : q == 2 ? rl.z : rl.w) = lo;
      (q == 0 ? rh.x : q == 1 ? rh.y : q == 2 ? rh.z : rh.w) = hi;
      uint8_t* r = row_at(c, j, u, q);
      *reinterpret_cast<uint4*>(r) = rl;
      *reinterpret_cast<uint4*>(r + 128) = rh;
      if (u == 0)
        for (int ua = rows; ua < NT; ++ua) {  // absent tokens' columns: zeros
          uint8_t* z = row_at(c, j, ua, q);
          *reinterpret_cast<uint4*>(z) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(z + 128) = make_uint4(0, 0, 0, 0);
        }
    }
    if (lane == 0) xe[u * nb + c] = (uint32_t)(6 + e) << 23;
  }
}

template <int F8>  // 0: bf16 x (moe_gemv2); 2 or 4: e4m3 x, runs of ≤ F8 tokens (moe_gemv2_fp8)
__global__ void __launch_bounds__(MV_NT, 1) moe_gemv2_kernel(const MvParams p) {
  // p.early > 0 (moe_gemv2_early): with programmatic edges this grid starts only after its predecessor has
  // passed its own wait, so what was written ≥ 2 launches back is complete. The routing, the first S
  // stages' copies (weights: constant) and, early == 2, x's staging then run before the wait, while the
  // predecessor's last blocks finish. Nothing is written to global memory before the wait.
  if (p.early == 0) DI_PDL_WAIT();
  extern __shared__ __align__(128) uint8_t mv_smem[];
  __shared__ __align__(8) uint64_t full[MV_MAXS];
  __shared__ int s_sel[MV_MAXSLOTS], s_lead[MV_MAXSLOTS], s_run_e[MV_MAXSLOTS];
  __shared__ uint8_t s_run_n[MV_MAXSLOTS], s_run_slot[MV_MAXSLOTS][MV_MAXRUN];
  __shared__ int s_nruns;
  __shared__ int64_t s_xoff[MV_MAXRUN], s_yoff[MV_MAXRUN];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int S = p.stages, mmr = p.mmr, slots = p.slots;
  const int K = (int)p.K;
  // Shared-memory bytes a weight row and a scale row. Row copies: padded (the two rows of an 8-lane phase
  // in different banks, a warp's 8 rows of scale bytes in 8 banks). Block copies: the rows as stored
  // (2-way conflicts on the weight loads, 8-way on the scale bytes) for 16–32× fewer copies: s7's GEMV v8
  // and floor measurements put the cost of a bulk copy near its count, not its bytes.
  const int SB = K / 32;  // scale bytes a row
  const int RS = p.contig ? K / 2 : K / 2 + MV_PAD;
  const int SS = p.contig ? SB : SB + 16;
  const int IR = MV_ROWS * p.pairs;  // rows an item
  const int stage_bytes = IR * (RS + SS);
  uint8_t* ring = mv_smem;  // [S][IR rows × RS | IR rows × SS]
  uint4* xs = reinterpret_cast<uint4*>(mv_smem + (size_t)S * stage_bytes);
  uint8_t* xq8 = reinterpret_cast<uint8_t*>(xs);                         // F8: the B operands (4·F8·K bytes),
  uint32_t* xe8 = reinterpret_cast<uint32_t*>(xq8 + (size_t)4 * F8 * K);  // then [F8][K/128] exponent bits
  // partial sums: [nred][16 warps][pairs · MV_RED] (F8: [nred][8 k splits][pairs · F8 · MV_RED8])
  float* red = reinterpret_cast<float*>(mv_smem + (size_t)S * stage_bytes +
                                        (F8 ? 4 * F8 * K + F8 * (K / 32) : 2 * mmr * K));
  const int wred = p.pairs * (F8 ? F8 * MV_RED8 : MV_RED);  // floats a warp (F8: a k split) an item

  // Runs: slot s leads a run when the number of earlier slots with its expert is a multiple of mmr; the
  // run holds that slot and the next ≤ mmr − 1 slots with the expert (slot order). Runs ordered by leader.
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
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the inits, seen by the copy engine
  __syncthreads();

  const int RG = p.fuse ? (int)(p.I / 16) : (int)(p.N / IR);  // items a run
  const int64_t nitems = (int64_t)s_nruns * RG;
  const int64_t i0 = nitems * blockIdx.x / gridDim.x, i1 = nitems * (blockIdx.x + 1) / gridDim.x;
  const int nq = (int)(i1 - i0);
  if (nq <= 0) {  // (block-uniform; nothing issued)
    if (p.early) DI_PDL_WAIT();
    return;
  }

  // Item q's IR (32 or 64) weight rows and their scale rows → stage q % S. The stage's one arrival, with the
  // byte count, is made by thread 0 before a block barrier that precedes every copy of the phase; then lane
  // 0 of warp 0 copies the item's row blocks (row copies, 32-row items only: lane 0 of warp w copies rows 2w,
  // 2w + 1; a bulk copy takes uniform operands: one issuing lane a warp, no lane loop).
  const uint32_t stage_tx = (uint32_t)(IR * (K / 2 + SB));
  auto expect = [&](int q) { mbar_expect(smem_u32(&full[q % S]), stage_tx); };
  auto issue = [&](int q) {
    if (lane != 0) return;
    const int64_t it = i0 + q;
    const int run = (int)(it / RG), rg = (int)(it % RG), st = q % S;
    uint8_t* sw = ring + (size_t)st * stage_bytes;
    const uint32_t bar = smem_u32(&full[st]);
    const int64_t e = s_run_e[run];
    if (p.contig) {  // warp 0: the item's one (two, fused) contiguous row blocks and their scale rows
      if (warp != 0) return;
      const int nb = p.fuse ? 2 : 1, rb = IR / nb;
      for (int b = 0; b < nb; ++b) {
        const int64_t n = p.fuse ? b * p.I + (int64_t)rg * 16 : (int64_t)rg * IR;
        bulk_load(smem_u32(sw + b * rb * RS), p.w + e * p.w_stride + n * (K / 2), (uint32_t)(rb * (K / 2)), bar);
        bulk_load(smem_u32(sw + IR * RS + b * rb * SS), p.ws + e * p.s_stride + n * SB, (uint32_t)(rb * SB), bar);
      }
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int L = 2 * warp + h;  // row of the item: tile L / 16, row L % 16
      const int64_t n = p.fuse ? (L >> 4) * p.I + (int64_t)rg * 16 + (L & 15) : (int64_t)rg * MV_ROWS + L;
      bulk_load(smem_u32(sw + L * RS), p.w + e * p.w_stride + n * (K / 2), (uint32_t)(K / 2), bar);
      bulk_load(smem_u32(sw + MV_ROWS * RS + L * SS), p.ws + e * p.s_stride + n * SB, (uint32_t)SB, bar);
    }
  };
  // A run's x rows (and its output offsets); x is restaged only when its rows change (w13 at T = 1: all six
  // runs read token 0's row, staged once). Block-uniform; its first barrier: the previous item's reducers
  // are done with s_yoff and every warp with xs.
  int cur = -1, cur_rows = 0;
  auto set_run = [&](int run) {
    const int rows = s_run_n[run];
    int diff = 0;
    __syncthreads();
    if (tid < rows) {
      const int j = s_run_slot[run][tid];
      const int64_t xo = (int64_t)(p.x_per_slot ? j : j / p.topk) * p.ldx;
      diff = cur < 0 || rows != cur_rows || s_xoff[tid] != xo;
      s_xoff[tid] = xo;
      s_yoff[tid] = (int64_t)j * p.ldy;
    }
    if (__syncthreads_or(diff)) {
      if constexpr (F8) {
        mv_stage_x8<F8>(xq8, xe8, p.x, s_xoff, rows, K);
        detail::fence_proxy_async_smem();  // (st.shared → the wgmma's operand reads)
      } else {
        mv_stage_x(xs, p.x, s_xoff, rows, mmr, K);
      }
      __syncthreads();
    }
    cur = run, cur_rows = rows;
  };
  // The first run's x goes before the first copies: issued after them, its loads queue behind a whole
  // ring of weight bytes an SM (s8-run1, Nsight Compute on T = 1 w13: ~9 % of the warps' time waiting on x
  // there). early == 1 (x is the predecessor's output): one stage's copies before the wait, then x, then
  // the rest of the ring.
  if (p.early != 1) set_run((int)(i0 / RG));
  if (tid == 0)
    for (int q = 0; q < S && q < nq; ++q) expect(q);
  __syncthreads();
  const int pre = p.early == 1 ? 1 : S;  // stages issued before x's staging
  for (int q = 0; q < pre && q < nq; ++q) issue(q);
  if (p.early) DI_PDL_WAIT();
  if (p.early == 1) {
    set_run((int)(i0 / RG));
    for (int q = pre; q < S && q < nq; ++q) issue(q);
  }

  const int nch = K / 128;  // 64-byte chunks a row
  // item i0 + q = (run, rg), its stage st and the stage's phase parity, advanced by counters (64-bit
  // divisions cost ~100 instructions a warp an item)
  int run = (int)(i0 / RG), rg = (int)(i0 % RG), st = 0;
  uint32_t ph = 0;
  for (int q = 0; q < nq; ++q) {
    const int rows = s_run_n[run];
    if (run != cur) set_run(run);  // (block-uniform)
    float* rd = red + (size_t)(p.nred == 2 ? (q & 1) : 0) * (F8 ? MV_WARPS / 2 : MV_WARPS) * wred;
    mbar_wait(smem_u32(&full[st]), ph);

    if constexpr (F8) {
    // e4m3 wgmma (m64nNk32, N = 8·F8, A from registers). Warpgroup wg = warp / 4 takes the chunk pairs cp ≡ wg
    // (mod 4); its warp wl = warp % 4 holds tile wl % 2 (rows g, g + 8 of it) of chunk 2cp + wl / 2, so the 64
    // A rows are 2 tiles × 2 chunks and B's columns (mv_stage_x8) are chunk half h × token u × group q: a warp
    // reads the n8 blocks of its half (h = wl / 2). Lane (g, t) reads, as the bf16 form, the 16 bytes of group t
    // in its rows; word j is step j's A (e2m1x8_e4m3: lo = k-slots 4t.., hi = 16 + 4t..), which the B columns
    // (h, u, t) meet alone. A chunk's 4 steps accumulate in a fresh fragment, then promoted by 2^(e8m0(row,
    // group) − 121 + e_x(token, chunk)) — exact products, the factor's exponent field built by one IMAD — into
    // the f32 sums (chunks ascending). In n8 block b of its half, lanes t, t ^ 1 hold groups {0, 1} and {2, 3}
    // of token 2b + t / 2 (columns 2t, 2t + 1): added, one shuffle, the sum of the 4 groups.
    constexpr int NB = F8 / 2;  // n8 blocks a chunk half
    const int wg = warp >> 2, rt = warp & 1, hh = (warp >> 1) & 1, ks = 2 * wg + hh;  // ks: the k split
    const uint32_t* xel[NB];                                                         // tokens of this lane's columns
#pragma unroll
    for (int bb = 0; bb < NB; ++bb) xel[bb] = xe8 + min(2 * bb + (t >> 1), rows - 1) * nch + hh;
    const uint32_t ssel = 0x4440u + 2 * (t & 1);  // e8m0 byte of column 2t (+ 1: 2t + 1)
    // B descriptor of step (cp, j): the low word + (4cp + j)·256·F8 bytes (the address field does not carry out)
    const uint64_t desc0 = detail::wgmma_desc(smem_u32(xq8), 128, 256);
    const uint32_t dlo = (uint32_t)desc0, dhi = (uint32_t)(desc0 >> 32);
    const int ncp = nch / 2;
    for (int pr = 0; pr < p.pairs; ++pr) {
      const uint8_t* wl = ring + (size_t)st * stage_bytes + (pr * MV_ROWS + rt * 16 + g) * RS + hh * 64 + t * 16;
      const uint8_t* sl = ring + (size_t)st * stage_bytes + IR * RS + (pr * MV_ROWS + rt * 16 + g) * SS + hh * 4;
      float acc[NB][4], z[64];  // (z: m64nN, 4·F8 used; step 0 overwrites it)
#pragma unroll
      for (int bb = 0; bb < NB; ++bb)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[bb][r] = 0.0f;
      for (int cp = wg; cp < ncp; cp += 4) {
        const uint4 wa = *reinterpret_cast<const uint4*>(wl + cp * 128);
        const uint4 wb = *reinterpret_cast<const uint4*>(wl + cp * 128 + 8 * RS);
        const uint32_t sa = *reinterpret_cast<const uint32_t*>(sl + 8 * cp);
        const uint32_t sb = *reinterpret_cast<const uint32_t*>(sl + 8 * cp + 8 * SS);
        uint32_t A[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          detail::e2m1x8_e4m3(u4get(wa, j), A[j][0], A[j][2]);
          detail::e2m1x8_e4m3(u4get(wb, j), A[j][1], A[j][3]);
        }
        detail::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
          detail::wgmma_e4m3_n<8 * F8>(z, A[j], (uint64_t)dhi << 32 | (dlo + (uint32_t)(4 * cp + j) * (16 * F8)), j);
        detail::wgmma_commit();
        uint32_t xec[NB];
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) xec[bb] = xel[bb][2 * cp];
        detail::wgmma_wait<0>();
        detail::wgmma_fence_acc(z);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint32_t b = __byte_perm(r < 2 ? sa : sb, 0u, ssel + (r & 1)) * (1u << 23);
#pragma unroll
          for (int bb = 0; bb < NB; ++bb)
            acc[bb][r] = fmaf(hh ? z[4 * (NB + bb) + r] : z[4 * bb + r], __uint_as_float(b + xec[bb]), acc[bb][r]);
        }
      }
#pragma unroll
      for (int bb = 0; bb < NB; ++bb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = acc[bb][2 * h] + acc[bb][2 * h + 1];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          // [k split][pair][tile][token][row]: F8 · 32 floats a k split and pair
          if ((t & 1) == 0)
            rd[ks * wred + pr * F8 * MV_RED8 + rt * 16 * F8 + (2 * bb + (t >> 1)) * 16 + h * 8 + g] = v;
        }
    }
    } else {
    // This lane's 16 bytes of chunk 0 in row g of tile 0 (+ 16·RS: tile 1, + 8·RS: row g + 8), its scale
    // byte, and its x unit (columns ≥ rows read row rows − 1: valid values whose outputs are not stored;
    // an MMA column depends on its own B column only)
    const uint4* xl = xs + min(g, rows - 1) * 4 + t;
    for (int pr = 0; pr < p.pairs; ++pr) {  // (each pair's sums from zero: the same chains as 32-row items)
    const uint8_t* wl = ring + (size_t)st * stage_bytes + (pr * MV_ROWS + g) * RS + t * 16;
    const uint8_t* sl = ring + (size_t)st * stage_bytes + IR * RS + (pr * MV_ROWS + g) * SS + t;
    float acc[2][4];
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[rt][r] = 0.0f;
    for (int c = warp; c < nch; c += MV_WARPS) {
      // all shared loads of the chunk first (both tiles), then the decode and MMAs
      uint4 X[4], wv[2][2];
      int e[2][2];
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) X[qq] = xl[(c * 4 + qq) * mmr * 4];
#pragma unroll
      for (int rt = 0; rt < 2; ++rt) {
        const uint8_t* wp = wl + rt * 16 * RS + c * 64;
        const uint8_t* sp = sl + rt * 16 * SS + 4 * c;
        wv[rt][0] = *reinterpret_cast<const uint4*>(wp);
        wv[rt][1] = *reinterpret_cast<const uint4*>(wp + 8 * RS);
        e[rt][0] = (int)sp[0] - 1, e[rt][1] = (int)sp[8 * SS] - 1;
      }
      // value·2^-126 × 2^(b−1); b > 128 needs a second factor 2^(b−128). One warp-uniform branch a chunk
      // (mma.sync needs the whole warp on one path); both paths give the same bits, every product exact.
      if (!__any_sync(0xffffffffu, max(max(e[0][0], e[0][1]), max(e[1][0], e[1][1])) > 127)) {
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
          fp4_mma<false>(acc[rt], wv[rt][0], wv[rt][1], X, pow2_bf16x2(e[rt][0]), pow2_bf16x2(e[rt][1]), 0u, 0u);
      } else {
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
          fp4_mma<true>(acc[rt], wv[rt][0], wv[rt][1], X, pow2_bf16x2(min(e[rt][0], 127)),
                        pow2_bf16x2(min(e[rt][1], 127)), pow2_bf16x2(max(e[rt][0] - 127, 0)),
                        pow2_bf16x2(max(e[rt][1] - 127, 0)));
      }
    }
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int r = 0; r < 4; ++r) rd[warp * wred + pr * MV_RED + (rt * 4 + r) * 32 + lane] = acc[rt][r];
    }
    }
    // thread 0 has seen stage st's phase complete (its wait above): the next phase's arrival may go now
    if (tid == 0 && q + S < nq) expect(q + S);
    __syncthreads();  // every warp is done with stage st and has stored its sums
    if (q + S < nq) issue(q + S);

    // element el of the [tile][4][32] fragment image: lane (gg, tt), register r → row gg + 8·(r / 2),
    // column (run row) 2·tt + r % 2. Only the run's columns are summed (T = 1: 1 in 8).
    if constexpr (F8) {  // rd image: [k split 0..7][pair][tile][token < F8][row] (32·F8 floats a pair)
      if (!p.fuse) {
        if (tid < p.pairs * 32 * F8) {
          const int pr = tid / (32 * F8), i = tid - pr * (32 * F8), rt = i / (16 * F8), col = (i >> 4) % F8,
                    row = i & 15;
          if (col < rows) {
            float v = rd[pr * F8 * MV_RED8 + i];
#pragma unroll
            for (int w = 1; w < MV_WARPS / 2; ++w) v += rd[w * wred + pr * F8 * MV_RED8 + i];
            p.y[s_yoff[col] + (int64_t)rg * IR + pr * MV_ROWS + rt * 16 + row] = v;
          }
        }
      } else if (tid < 16 * F8) {  // tile 0 = gate rows, tile 1 = the matching up rows
        const int col = tid >> 4, row = tid & 15;
        if (col < rows) {
          float gt = rd[tid], up = rd[16 * F8 + tid];
#pragma unroll
          for (int w = 1; w < MV_WARPS / 2; ++w) gt += rd[w * wred + tid], up += rd[w * wred + 16 * F8 + tid];
          p.y[s_yoff[col] + (int64_t)rg * 16 + row] = detail::swiglu_clamp_one(gt, up, p.lim, 1.0f);
        }
      }
    } else if (!p.fuse) {
      if (tid < wred) {
        const int pr = tid >> 8, rt = (tid >> 7) & 1, r = (tid >> 5) & 3, ln = tid & 31;
        const int row = (ln >> 2) + 8 * (r >> 1), col = 2 * (ln & 3) + (r & 1);
        if (col < rows) {
          float v = rd[tid];
#pragma unroll
          for (int w = 1; w < MV_WARPS; ++w) v += rd[w * wred + tid];
          p.y[s_yoff[col] + (int64_t)rg * IR + pr * MV_ROWS + rt * 16 + row] = v;
        }
      }
    } else if (tid < 128) {  // tile 0 = gate rows, tile 1 = the matching up rows
      const int r = tid >> 5, ln = tid & 31;
      const int row = (ln >> 2) + 8 * (r >> 1), col = 2 * (ln & 3) + (r & 1);
      if (col < rows) {
        float gt = rd[tid], up = rd[128 + tid];
#pragma unroll
        for (int w = 1; w < MV_WARPS; ++w) gt += rd[w * wred + tid], up += rd[w * wred + 128 + tid];
        p.y[s_yoff[col] + (int64_t)rg * 16 + row] = detail::swiglu_clamp_one(gt, up, p.lim, 1.0f);
      }
    }
    // One buffer: red is rewritten by the next item, so every reducer must be done first. Two: item q + 2
    // rewrites this one after the next item's barrier, which the reducers reach after their sums (x and
    // s_yoff change only in set_run, behind its own barrier).
    if (p.nred == 1) __syncthreads();
    if (++rg == RG) rg = 0, ++run;
    if (++st == S) st = 0, ph ^= 1u;
  }
}

// Ring stages for (K, mmr): as many as the budget holds (≤ MV_MAXS); < 2 means the shape does not fit.
// Shared-memory bytes of one ring stage (an item's rows, padded as the row copies lay them out), of x (bf16
// rows; F8: the B operands and exponents of ≤ 2 tokens) and of one partial-sum buffer
int64_t mv_stage_bytes(int64_t K, int pairs) { return (int64_t)pairs * MV_ROWS * (K / 2 + MV_PAD + K / 32 + 16); }
int mv_nt(int mmr) { return mmr <= 2 ? 2 : 4; }  // F8: tokens a B set (runs of ≤ 4)
int64_t mv_x_bytes(int64_t K, int mmr, bool f8) {
  return f8 ? 4 * mv_nt(mmr) * K + mv_nt(mmr) * (K / 32) : (int64_t)mmr * K * 2;
}
int64_t mv_red_bytes(int pairs, int mmr, bool f8) {
  return f8 ? (int64_t)MV_WARPS / 2 * pairs * mv_nt(mmr) * MV_RED8 * 4 : (int64_t)MV_WARPS * pairs * MV_RED * 4;
}
int mv_stages(int64_t K, int mmr, int pairs = 1, bool f8 = false) {
  const int64_t stage = mv_stage_bytes(K, pairs);
  const int64_t room = (int64_t)MV_SMEM - mv_x_bytes(K, mmr, f8) - mv_red_bytes(pairs, mmr, f8);
  return room < 2 * stage ? 0 : (int)std::min<int64_t>(MV_MAXS, room / stage);
}
size_t mv_smem_bytes(int64_t K, int mmr, int stages, int nred, int pairs, bool f8) {
  return (size_t)(stages * mv_stage_bytes(K, pairs) + mv_x_bytes(K, mmr, f8) + nred * mv_red_bytes(pairs, mmr, f8));
}
// A second partial-sum buffer where the stages leave room for it (never at the cost of a stage)
int mv_nred(int64_t K, int mmr, int stages, int pairs, bool f8) {
  return mv_smem_bytes(K, mmr, stages, 2, pairs, f8) <= MV_SMEM ? 2 : 1;
}
int mv_mmr(int64_t T) {
  const int64_t m = std::min<int64_t>(MV_MAXRUN, std::max<int64_t>(1, T));
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}
}  // namespace

bool moe_gemv2_ok(WeightRef W, int64_t T, int topk, int64_t N, int64_t K, int64_t w_stride, int64_t s_stride) {
  const int64_t slots = T * topk;
  return W.fmt == WFmt::FP4_B32 && W.w && W.scale && T > 0 && topk > 0 && slots <= MV_MAXSLOTS && N > 0 &&
         N % MV_ROWS == 0 && K >= 512 && K % 512 == 0 && K <= 65536 && w_stride % 16 == 0 && s_stride % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.w) % 16 == 0 && reinterpret_cast<uintptr_t>(W.scale) % 16 == 0 &&
         mv_stages(K, mv_mmr(T)) >= 2;
}
bool moe_gemv2_fp8_ok(WeightRef W, int64_t T, int topk, int64_t N, int64_t K, int64_t w_stride, int64_t s_stride) {
  return moe_gemv2_ok(W, T, topk, N, K, w_stride, s_stride) && mv_stages(K, std::min(4, mv_mmr(T)), 1, true) >= 2;
}

static cudaError_t mv_run(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                          int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit,
                          float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan, bool contig, int early,
                          bool pairs, bool f8 = false) {
  if (early < 0 || early > 2) return cudaErrorInvalidValue;
  if (!(f8 ? moe_gemv2_fp8_ok : moe_gemv2_ok)(W, T, topk, N, K, w_stride, s_stride)) return cudaErrorNotSupported;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;
  if (swiglu && limit <= 0.0f) return cudaErrorInvalidValue;
  int sms = plan && plan->sms > 0 ? plan->sms : 0;  // (only the SM count is taken from a plan)
  if (sms == 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  MvParams p = {};
  p.x = x, p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale);
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.y = y, p.ldy = ldy;
  p.sel = sel, p.slots = (int)(T * topk), p.topk = topk, p.x_per_slot = x_per_slot ? 1 : 0;
  p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
  p.mmr = f8 ? std::min(4, mv_mmr(T)) : mv_mmr(T);  // (F8: B columns = 2 chunks × ≤ 4 tokens × 4 groups)
  p.contig = contig ? 1 : 0;
  // 64-row items where a 64-row stage still leaves a ring of 2 (w2: K = 2048); the fused w13's pairs are
  // gate and up tiles, the row copies form moves 2 rows a warp: 32-row items there
  p.pairs = pairs && !swiglu && contig && N % (2 * MV_ROWS) == 0 && mv_stages(K, p.mmr, 2, f8) >= 2 ? 2 : 1;
  p.stages = mv_stages(K, p.mmr, p.pairs, f8);
  p.nred = mv_nred(K, p.mmr, p.stages, p.pairs, f8);
  p.early = early;
  // (the max dynamic shared memory attribute MV_SMEM: set by init_kernel_attributes)
  (!f8 ? moe_gemv2_kernel<0> : mv_nt(p.mmr) == 2 ? moe_gemv2_kernel<2> : moe_gemv2_kernel<4>)<<<
      sms, MV_NT, mv_smem_bytes(K, p.mmr, p.stages, p.nred, p.pairs, f8), s>>>(p);
  return cudaGetLastError();
}

cudaError_t moe_gemv2(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk, int64_t K,
                      WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit, float* y,
                      int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  return mv_run(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, s, plan, true, 0,
                true);
}
cudaError_t moe_gemv2_early(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                            int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                            float limit, float* y, int64_t ldy, int early, cudaStream_t s, const GemvPlan* plan,
                            bool wide) {
  return mv_run(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, s, plan, true,
                early, wide);
}
cudaError_t moe_gemv2_rows(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                           int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                           float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan) {
  return mv_run(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, s, plan, false, 0,
                false);
}

cudaError_t moe_gemv2_fp8(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                          int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                          float limit, float* y, int64_t ldy, int early, cudaStream_t s, const GemvPlan* plan,
                          bool wide) {
  return mv_run(x, ldx, x_per_slot, sel, T, topk, K, W, w_stride, s_stride, N, swiglu, limit, y, ldy, s, plan, true,
                early, wide, true);
}

namespace detail {
cudaError_t init_attributes_moe_gemv2() {
  cudaError_t e = set_max_dynamic_smem(moe_gemv2_kernel<0>, MV_SMEM);
  if (e == cudaSuccess) e = set_max_dynamic_smem(moe_gemv2_kernel<2>, MV_SMEM);
  return e != cudaSuccess ? e : set_max_dynamic_smem(moe_gemv2_kernel<4>, MV_SMEM);
}
}  // namespace detail

}  // namespace deepinfer::cuda
