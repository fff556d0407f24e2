// Prefill routed experts on fp8 tensor cores (fp4 weights; the backend's path for T ≥ 2048 tokens). Design,
// numerics and measurements: docs/cuda-notes.md, "MoE prefill experts on fp8 MMAs".
//
// Numerics (those of DeepSeek's own fp4 expert GEMM): x is quantized per token and 128-k block to e4m3 with a
// power-of-two scale (moe_quant_fp8: s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(x / s)). The weights
// stay e2m1 + one e8m0 exponent per 32 k in memory; in registers each row is re-expressed as e4m3 codes with
// one power-of-two factor for the whole row: code = e4m3(e2m1 · 2^(d − 6)), d = e_group − e_max + 12 (e_max
// the row's largest e8m0 byte), factor 2^(e_max − 133) — exact for d ≥ −2, i.e. unless the row's groups span
// more than 14 binades (smaller groups then round to e4m3's subnormals). A 128-k block's 4 wgmma k32 steps
// accumulate in a fresh f32 fragment, which is then added to the result times the token's x scale s
// (promotion every 128 k, as DeepSeek's fp8 GEMMs do: the tensor cores' own fp8 sums keep few bits); the
// row factor multiplies the result once at the end. So y = 2^(e_max − 133)·Σ_blocks s·Σ_k code·q with exact
// products; only f32 sums round, in a fixed order, and a token's row does not depend on the other tokens of
// its tile (batch invariant within this path).
//
// Block = 2 warpgroups (256 threads), work item = (tile of ≤ 128 token rows of one expert, 256 weight rows),
// the tiles of moe_group_par (tile_m 128). Warp w (0..7) owns block weight rows 128·mt + 16w .. + 15 of its
// warpgroup's two m64 tiles mt, which share one fresh fragment; w13 (SwiGLU): row 128·mt + 16w + r, r < 8 = gate
// row 128·nb + 64·mt + 8w + r, r ≥ 8 = the matching up row, so one thread holds the gate and the up value of
// each of its outputs.
// k order: in a stage of 128 k, thread t of a quad takes the 16 weight bytes [16t, 16t + 16) of its rows (k
// 32t..32t+31, one e8m0 group); word j (k 32t + 8j..) gives A registers a0/a1 (k +0..3) and a2/a3 (k +4..7) of
// wgmma step j. x is stored in the matching order (moe_fp8_pos in moe_grouped.h): k = 32t + 8j + 4h + i of a
// block at byte 32j + 16h + 4t + i — step j's core matrices, filled by plain 16-byte copies.
#include <cuda_fp8.h>

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

// ---------------------------------------------------------------------------------------------------------
// Expert GEMM
// ---------------------------------------------------------------------------------------------------------
constexpr int MF_NT = 256;                       // 2 warpgroups
constexpr int MF_BN = 256;                       // weight rows a block: 2 m64 tiles a warpgroup (w13: 128 gate + 128 up)
constexpr int MF_MR = 128;                       // token rows a tile
constexpr int MF_KC = 128;                       // k a stage (one x scale block)
constexpr int MF_NST = 6;                        // stages (MF_PD = 4 in flight)
constexpr int MF_XSTEP = MF_MR * 32;             // x bytes of one k32 step: [8-row group][core][row][16 B]
constexpr int MF_WOFF = 4 * MF_XSTEP;            // fp4 weights: 64 B a row (LDS.128 at 16t: conflict-free)
constexpr int MF_SOFF = MF_WOFF + MF_BN * 64;    // e8m0: 4 B a row
constexpr int MF_XSOFF = MF_SOFF + MF_BN * 4;    // x scales: f32 a token row, in mf_xs_pos order
constexpr int MF_STAGE = MF_XSOFF + 640;         // (4 × 36 floats, padded to 128 bytes)
constexpr int MF_SMEM = MF_NST * MF_STAGE;
constexpr int MF_LUT_D0 = 16, MF_LUT_N = 29;     // code tables for d = −16..12
static_assert(MF_STAGE % 128 == 0 && MF_SMEM <= 227 * 1024, "moe_expert_fp8: shared memory");

struct MfParams {
  const uint8_t* xq;
  const float* xs;
  const int32_t* gather;
  const uint8_t* w;
  const uint8_t* ws;
  int64_t w_stride, s_stride;
  int64_t N, K, I;
  int swiglu;
  float lim;
  const int2* tiles;
  const int32_t* n_tiles;
  const int32_t* offsets;
  void* y;
  int64_t ldy;
  int* ctr;  // (persistent kernel) [0] items claimed past the grid, [1] blocks finished; zero between launches
};

// Token column c's x scale in a stage: the 32 columns of quad thread t (8jj + 2t + e) contiguous, in float4s of
// two n8 blocks, each thread's run 36 floats apart (the 4 runs start in different banks): 8 LDS.128 a promotion.
__device__ __forceinline__ int mf_xs_pos(int c) { return ((c >> 1) & 3) * 36 + (c >> 3) * 2 + (c & 1); }

__device__ __forceinline__ uint32_t mf_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// e2m1 nibbles 0..3 of v → four e4m3 codes through the row block's table (magnitudes 0..7): the magnitude
// by byte permute, the sign by permute's sign-replicate mode (nibble bit 3 set → 0xff, else 0x80: bit 0
// of each byte is the sign) shifted to bit 7.
__device__ __forceinline__ uint32_t mf_dec4(uint32_t v, uint2 lut) {
  const uint32_t mag = mf_prmt(lut.x, lut.y, v & 0x7777u);
  const uint32_t sgn = mf_prmt(0x80808080u, 0x80808080u, v);
  return mag | ((sgn << 7) & 0x80808080u);
}
// 2^(E − 127) as f32 (E an e8m0-style exponent, possibly ≤ 0)
__device__ __forceinline__ float mf_pow2(int E) {
  return E >= 1 ? __uint_as_float((uint32_t)min(E, 255) << 23) : ldexpf(1.0f, E - 127);
}
// A row's stage: its four e8m0 bytes s4 → the code table of thread t's group (emax: the row's largest byte).
__device__ __forceinline__ uint2 mf_row_lut(uint32_t s4, int t, const uint2* lut, int emax) {
  const int d = max((int)((s4 >> (8 * t)) & 0xffu) - emax + 12, -MF_LUT_D0);
  return lut[d + MF_LUT_D0];
}

// Block weight row b = 128·mt + 16·warp + r (m-tile mt of warpgroup warp / 4) of 256-row block nb → matrix row;
// w13 (sw): r < 8 the gate row 128·nb + 64·mt + 8·warp + r, r ≥ 8 its up row (I rows on), so one thread holds both
// halves of its SwiGLU outputs.
__device__ __forceinline__ int64_t mf_grow(bool sw, int64_t I, int nb, int b) {
  if (!sw) return (int64_t)nb * MF_BN + b;
  const int bb = b & 127;
  const int64_t i = (int64_t)nb * (MF_BN / 2) + 64 * (b >> 7) + 8 * (bb >> 4) + (bb & 7);
  return (bb & 8) ? I + i : i;
}
// Code table of the e2m1 magnitudes (entry tid = 8·idx + m): e4m3(e2m1(m) · 2^(d − 6)) at d = idx − 16.
__device__ __forceinline__ void mf_lut_fill(uint2* lut, int tid) {
  const int idx = tid >> 3, m = tid & 7, ee = m >> 1, mm = m & 1;
  const float val = ee == 0 ? 0.5f * (float)mm : ldexpf(1.0f + 0.5f * (float)mm, ee - 1);
  reinterpret_cast<uint8_t*>(lut)[tid] =
      (uint8_t)__nv_cvt_float_to_fp8(ldexpf(val, idx - MF_LUT_D0 - 6), __NV_SATFINITE, __NV_E4M3);
}
// A weight row's largest e8m0 byte (ssrc: the row's K / 32 scale bytes).
__device__ __forceinline__ int mf_row_emax(const uint8_t* ssrc, int64_t K) {
  uint32_t m = 0;
  if ((K / 32) % 16 == 0 && reinterpret_cast<uintptr_t>(ssrc) % 16 == 0) {  // 16-byte loads, 8 in flight
    const uint4* sp = reinterpret_cast<const uint4*>(ssrc);
#pragma unroll 8
    for (int64_t i = 0; i < K / 512; ++i) {
      const uint4 v = __ldg(sp + i);
      m = __vmaxu4(__vmaxu4(m, v.x), __vmaxu4(v.y, __vmaxu4(v.z, v.w)));
    }
  } else {
    const uint32_t* sp = reinterpret_cast<const uint32_t*>(ssrc);
#pragma unroll 8
    for (int64_t i = 0; i < K / 128; ++i) m = __vmaxu4(m, __ldg(sp + i));
  }
  m = __vmaxu4(m, m >> 16);
  return (int)max(m & 0xffu, (m >> 8) & 0xffu);
}
// Promotion of a 128-k block's fresh fragment: acc += tmp · the token columns' x scales (xsc in mf_xs_pos order).
template <int NC>
__device__ __forceinline__ void mf_promote(float (&acc)[64], const float (&tmp)[64], const float* xsc, int t) {
#pragma unroll
  for (int i = 0; i < NC / 16; ++i) {  // n8 blocks 2i and 2i + 1
    const float4 c = *reinterpret_cast<const float4*>(xsc + 36 * t + 4 * i);
    float* a = acc + 8 * i;
    const float* u = tmp + 8 * i;
    a[0] = fmaf(u[0], c.x, a[0]), a[1] = fmaf(u[1], c.y, a[1]), a[2] = fmaf(u[2], c.x, a[2]), a[3] = fmaf(u[3], c.y, a[3]);
    a[4] = fmaf(u[4], c.z, a[4]), a[5] = fmaf(u[5], c.w, a[5]), a[6] = fmaf(u[6], c.z, a[6]), a[7] = fmaf(u[7], c.w, a[7]);
  }
}
// Epilogue: acc[mt][4jj + r] · the row factor → block weight row 128·mt + 16·warp + g + 8·(r / 2), token column
// 8jj + 2t + r % 2 (warp 0..7: the block's MMA warps).
template <int NC>
__device__ __forceinline__ void mf_epilogue(const MfParams& p, const float (&acc)[2][64], const int (&emax)[2][2],
                                            int nrows, int r0, int nb, int warp, int g, int t) {
  const bool sw = p.swiglu != 0;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const float fa = mf_pow2(emax[mt][0] - 6), fb = mf_pow2(emax[mt][1] - 6);
#pragma unroll
    for (int jj = 0; jj < NC / 8; ++jj) {
      if (8 * jj >= nrows) break;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = jj * 8 + 2 * t + (r & 1);
        if (col >= nrows) continue;
        const int64_t yrow = (int64_t)(r0 + col) * p.ldy;
        if (sw) {
          if (r < 2)
            reinterpret_cast<bf16*>(p.y)[yrow + (int64_t)nb * (MF_BN / 2) + 64 * mt + 8 * warp + g] =
                __float2bfloat16_rn(
                    detail::swiglu_clamp_one(acc[mt][4 * jj + r] * fa, acc[mt][4 * jj + r + 2] * fb, p.lim, 1.0f));
        } else {
          reinterpret_cast<float*>(p.y)[yrow + (int64_t)nb * MF_BN + 128 * mt + 16 * warp + g + 8 * (r >> 1)] =
              acc[mt][4 * jj + r] * (r < 2 ? fa : fb);
        }
      }
    }
  }
}

// Pipeline: every thread copies its part of a stage with cp.async and arrives on the stage's `full` mbarrier
// when its copies land (cp.async.mbarrier.arrive.noinc, 256 arrivals); a warpgroup waits on `full`, then for
// each of its two m64 tiles decodes, issues the 4 MMAs, waits for them and promotes; after both it arrives
// on `empty` (256 arrivals). Copies for stage s + MF_PD go out at stage s into the buffer of stage
// s + MF_PD − MF_NST = s − 2, so a warpgroup may run up to a stage ahead of the other. (A first version with a
// block barrier each stage serialized decode, MMAs and promotion: s11-run1; making the warpgroups take turns
// on the tensor cores by named barriers was 12-15 % slower than letting them run free: s11-run9.)
constexpr int MF_PD = MF_NST - 2;  // stages issued ahead

// PERSIST (session 14; the backend's default since session 15): one block an SM walks the items (tile, 256-row
// block) of the non-persistent grid, item = tile · nblk + nb: block b starts at item b, then claims the next by an
// atomic counter (items cost 1× to 4× each other: a static stride left SMs idle and lost 7-14 %, s14-run8); the last
// block to finish zeroes the counter. At the end of an item's main loop it reads the next item, issues that item's
// first MF_PD stages and loads its rows' e8m0 maxima, then runs this item's epilogue, so the next item's copies fly
// during the epilogue instead of after a block start. The ring's stages count on across items (global stage G:
// buffer G % MF_NST). The arithmetic a row is the same: the same bits. s15-run1 (T = 4096, alternating with the
// grid form): w13 2246 against 2340 µs, w2 1296 against 1326; T = 16384: 7684 / 4532 against 8090 / 4647.
// SPLIT (session 14: a 128-column tile's MMAs as two n64 halves, one promoted while the other runs) was bitwise
// the same and 20 % slower (s15-run1: w13 2819 against 2340 µs at T = 4096); removed (branch moe_fp8_split).
template <bool PERSIST>
__global__ void __launch_bounds__(MF_NT, 1) moe_expert_fp8_kernel(const MfParams p) {
  DI_PDL_WAIT();
  extern __shared__ __align__(128) uint8_t mf_smem[];
  __shared__ int64_t s_xrow[MF_MR];
  __shared__ uint2 s_lut[MF_LUT_N];
  __shared__ __align__(8) uint64_t s_full[MF_NST], s_empty[MF_NST];
  __shared__ int s_emax[MF_BN];
  __shared__ int s_next;

  const int nblk = (int)(p.N / MF_BN);
  const int n_items = nblk * *p.n_tiles;
  int item = PERSIST ? (int)blockIdx.x : (int)blockIdx.y * nblk + (int)blockIdx.x;
  auto finish = [&]() {  // (persistent) the last block out zeroes the counter for the next launch
    if (PERSIST && threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(p.ctr + 1, 1) == (int)gridDim.x - 1) p.ctr[0] = 0, p.ctr[1] = 0;
    }
  };
  if (item >= n_items) {
    finish();
    return;
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t K = p.K, I = p.I;
  const bool sw = p.swiglu != 0;
  const int64_t wrow_bytes = K / 2, nsb = K / 128;
  const int nst = (int)(K / MF_KC);
  const uint32_t smem0 = detail::smem_u32(mf_smem);
  if (tid < MF_LUT_N * 8) mf_lut_fill(s_lut, tid);
  if (tid < MF_NST) {
    detail::mbar_init(detail::smem_u32(&s_full[tid]), MF_NT);
    detail::mbar_init(detail::smem_u32(&s_empty[tid]), MF_NT);
  }

  // The item's copy sources (this thread's part of every stage): weights rows tid / 4 + 64i (i < 4), 16-byte
  // piece tid % 4; e8m0 of row tid; x scale of token row tid (tid < 128); x rows 16·warp + 8u + lane % 8, pieces
  // lane / 8 + 4v (piece 2j + h = step j, core h): a warp instruction covers 8 rows × 64 contiguous bytes.
  int e, r0, nrows, nb;
  const uint8_t* wsrc[4];
  const uint8_t* ssrc;
  const float* xssrc;
  const uint8_t* xsrc[2];
  bool xon[2], xson;
  const uint32_t wdst = MF_WOFF + (tid >> 2) * 64 + (tid & 3) * 16;
  uint32_t xdst[2][2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int row = 16 * warp + 8 * u + (lane & 7);
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int pc = (lane >> 3) + 4 * v;
      xdst[u][v] = (uint32_t)((pc >> 1) * MF_XSTEP + (row >> 3) * 256 + (pc & 1) * 128 + (row & 7) * 16);
    }
  }
  // item → (e, r0, nrows, nb) and its x rows in s_xrow (the caller syncs before src())
  auto load_item = [&](int it) {
    const int2 ti = p.tiles[it / nblk];
    e = ti.x, r0 = ti.y, nb = it % nblk;
    nrows = min(MF_MR, p.offsets[e + 1] - r0);
    if (tid < MF_MR) s_xrow[tid] = tid < nrows ? (int64_t)(p.gather ? p.gather[r0 + tid] : r0 + tid) : 0;
  };
  auto grow = [&](int b) { return mf_grow(sw, I, nb, b); };
  auto src = [&]() {
    const uint8_t* wb = p.w + (int64_t)e * p.w_stride;
#pragma unroll
    for (int i = 0; i < 4; ++i) wsrc[i] = wb + grow((tid >> 2) + 64 * i) * wrow_bytes + (tid & 3) * 16;
    ssrc = p.ws + (int64_t)e * p.s_stride + grow(tid) * (K / 32);
    xson = tid < nrows;
    xssrc = p.xs + s_xrow[tid & (MF_MR - 1)] * nsb;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int row = 16 * warp + 8 * u + (lane & 7);
      xon[u] = row < nrows;
      xsrc[u] = p.xq + s_xrow[row] * K + (lane >> 3) * 16;
    }
  };
  // stage st of the current item, global stage gs, into buffer gs % MF_NST (after that buffer's previous stage,
  // gs − MF_NST, was released by all 256 threads)
  auto issue = [&](int st, int gs) {
    const int buf = gs % MF_NST, use = gs / MF_NST;
    if (use > 0) detail::mbar_wait(detail::smem_u32(&s_empty[buf]), (use - 1) & 1);
    const uint32_t base = smem0 + buf * MF_STAGE;
    const int64_t wo = (int64_t)st * (MF_KC / 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) detail::cp_async16(base + wdst + i * (64 * 64), wsrc[i] + wo);
#pragma unroll
    for (int u = 0; u < 2; ++u)
      if (xon[u]) {
        detail::cp_async16(base + xdst[u][0], xsrc[u] + (int64_t)st * MF_KC);
        detail::cp_async16(base + xdst[u][1], xsrc[u] + (int64_t)st * MF_KC + 64);
      }
    detail::cp_async4(base + MF_SOFF + tid * 4, ssrc + (int64_t)st * 4);
    if (xson) detail::cp_async4(base + MF_XSOFF + mf_xs_pos(tid) * 4, xssrc + st);
    detail::cp_async_mbar_arrive(detail::smem_u32(&s_full[buf]));
  };

  load_item(item);
  __syncthreads();  // (barriers, tables, s_xrow)
  src();
  for (int st = 0; st < MF_PD && st < nst; ++st) issue(st, st);
  s_emax[tid] = mf_row_emax(ssrc, K);  // (while the first stages' copies are in flight)
  __syncthreads();

  int g0 = 0;  // the item's first global stage
  // The main loop and the epilogue, compiled for each wgmma N (32, 64 or 128 token columns). Returns the next item
  // (≥ n_items: none), whose first stages are already issued.
  auto run = [&](auto ncl) -> int {
    constexpr int NC = decltype(ncl)::value;
    float acc[2][64], tmp[64];
#pragma unroll
    for (int r = 0; r < 64; ++r) acc[0][r] = acc[1][r] = tmp[r] = 0.0f;
    int emax[2][2];  // [m-tile][row g, g + 8]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) emax[mt][0] = s_emax[128 * mt + 16 * warp + g], emax[mt][1] = s_emax[128 * mt + 16 * warp + g + 8];
    if (PERSIST && tid == 0) s_next = (int)gridDim.x + atomicAdd(p.ctr, 1);  // (read after this item's loop)
#pragma unroll 1
    for (int s = 0; s < nst; ++s) {
      const int gs = g0 + s, buf = gs % MF_NST;
      detail::mbar_wait(detail::smem_u32(&s_full[buf]), (gs / MF_NST) & 1);
      detail::fence_proxy_async_smem();  // the copies (generic proxy) → this warpgroup's wgmma reads
      const uint8_t* base = mf_smem + buf * MF_STAGE;
      const float* xsc = reinterpret_cast<const float*>(base + MF_XSOFF);
      // tile mt's A fragments: this thread's rows g, g + 8 of the m-tile, 4 k32 steps
      auto decode = [&](int mt, uint32_t (&A)[4][4]) {
        const int rA = 128 * mt + 16 * warp + g, rB = rA + 8;  // this thread's block weight rows
        const uint4 wa = *reinterpret_cast<const uint4*>(base + MF_WOFF + rA * 64 + 16 * t);
        const uint4 wbv = *reinterpret_cast<const uint4*>(base + MF_WOFF + rB * 64 + 16 * t);
        const uint2 la = mf_row_lut(*reinterpret_cast<const uint32_t*>(base + MF_SOFF + rA * 4), t, s_lut, emax[mt][0]);
        const uint2 lb = mf_row_lut(*reinterpret_cast<const uint32_t*>(base + MF_SOFF + rB * 4), t, s_lut, emax[mt][1]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t va = detail::u4get(wa, j), vb = detail::u4get(wbv, j);
          A[j][0] = mf_dec4(va, la), A[j][1] = mf_dec4(vb, lb);
          A[j][2] = mf_dec4(va >> 16, la), A[j][3] = mf_dec4(vb >> 16, lb);
        }
      };
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t A[4][4];
        decode(mt, A);
        detail::wgmma_fence();
        const uint32_t xb = smem0 + buf * MF_STAGE;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          detail::wgmma_e4m3_n<NC>(tmp, A[j], detail::wgmma_desc(xb + j * MF_XSTEP, 128, 256), j);
        detail::wgmma_commit();
        if (mt == 0 && s + MF_PD < nst) issue(s + MF_PD, gs + MF_PD);
        detail::wgmma_wait<0>();
        detail::wgmma_fence_acc(tmp);
        mf_promote<NC>(acc[mt], tmp, xsc, t);
      }
      detail::mbar_arrive(detail::smem_u32(&s_empty[buf]));  // this thread is done with the stage's buffer
    }
    const int cr0 = r0, cnrows = nrows, cnb = nb;
    int next = n_items;
    if constexpr (PERSIST) {
      __syncthreads();  // (every thread is past its use of s_emax and of this item's copies; s_next)
      next = s_next;
      if (next < n_items) {  // the next item's start under this item's epilogue
        load_item(next);
        __syncthreads();     // (s_xrow)
        src();
        for (int st = 0; st < MF_PD && st < nst; ++st) issue(st, g0 + nst + st);
        s_emax[tid] = mf_row_emax(ssrc, K);
      }
    }
    mf_epilogue<NC>(p, acc, emax, cnrows, cr0, cnb, warp, g, t);
    return next;
  };
  // Three wgmma widths only: the padding columns cost MMA time the kernel has to spare, while 8 widths of a
  // ~1000-instruction loop cost instruction fetch (s11-run12, one process, alternating: w13 2315 / 2307 µs with 3
  // widths vs 2477 / 2496 with 8, w2 1305 vs 1508 / 1550).
  while (true) {
    const int ncols = (nrows + 15) & ~15;  // rows rounded up to the wgmma N step
    int next;
    switch (ncols <= 32 ? 32 : ncols <= 64 ? 64 : 128) {
      case 32: next = run(std::integral_constant<int, 32>{}); break;
      case 64: next = run(std::integral_constant<int, 64>{}); break;
      default: next = run(std::integral_constant<int, 128>{}); break;
    }
    if (!PERSIST || next >= n_items) break;
    item = next, g0 += nst;
    __syncthreads();  // (the next item's s_emax)
  }
  finish();
}

// ---------------------------------------------------------------------------------------------------------
// Expert GEMM, warp-specialized (session 14, opt-in: DEEPINFER_CUDA_ON=moe_fp8_ws; bitwise the kernel above)
// ---------------------------------------------------------------------------------------------------------
// Why it was tried: Nsight Compute on the kernel above (s14-run2, w13 at T = 4096) shows 643 instructions a warp a
// stage with 2 warps a scheduler, 31 % issue and the tensor pipe ~25 % busy; the decode, the cp.async issue
// (~17 % of the warp samples) and the promotion's scale loads sit on the MMA warps' path between wgmma waits.
// Here two producer warpgroups copy and decode into shared memory, in the wgmma A layout (K-major, no swizzle,
// the x layout), and two MMA warpgroups run shared × shared MMAs, promote and store: the same e4m3 codes, MMA
// shapes and sums, so the same bits. Measured slower (w13 2533 against 2250 µs at T = 4096, w2 1402 against
// 1247; s14-run6): the producers are latency-bound on their shared-memory loads behind the decoded stores (32 KB
// a stage that the register-A kernel never writes), and the MMA warps wait on them (docs/cuda-notes.md, session 14).
//   Producer thread p < 256 owns block row p: its 4 chunks of 16 bytes (k 32q..32q+31, e8m0 group q) a stage,
//   stored chunk-major in the raw ring, and its e8m0 word; it decodes the row into 8 cores (k32 step j, half h) of
//   16 bytes, one store each. It also copies x row p % 128 (half of its 16-byte pieces) and that row's scale.
//   Rings: x (+ raw weights) MW_NX = 4 stages, copies issued MW_PD = 3 ahead; decoded weights MW_NA = 2.
//   Barriers: full[s % 2] (256 producer arrivals: the stage's x landed, its weights decoded), empty[s % 4]
//   (256 MMA-thread arrivals). The producers decode stage s once s − 2 is released (its A buffer) and copy stage
//   s + 3 once s − 1 is released (its x buffer). Registers by setmaxnreg: producers 40, MMA warps 216.
constexpr int MW_NT = 512;                       // 2 producer warpgroups + 2 MMA warpgroups
constexpr int MW_NX = 4, MW_NA = 2, MW_PD = 3;
constexpr int MW_XS = 4 * MF_XSTEP;              // x of a stage (16 KB), then its scales
constexpr int MW_XSTAGE = MW_XS + 640;
constexpr int MW_RAW = MF_BN * 64 + MF_BN * 4;   // fp4 chunk-major [chunk q][row][16 B], then the rows' e8m0 words
constexpr int MW_ASTAGE = MF_BN * MF_KC;         // decoded e4m3: [m-tile][warpgroup c][k32 step j][8-row group][core h][row][16 B]
constexpr int MW_XOFF = 0, MW_AOFF = MW_NX * MW_XSTAGE, MW_ROFF = MW_AOFF + MW_NA * MW_ASTAGE;
constexpr int MW_SMEM = MW_ROFF + MW_NX * MW_RAW;
constexpr int MW_PREGS = 40, MW_CREGS = 216;     // setmaxnreg: 256 · 40 + 256 · 216 = 512 · 128, the launch allocation
static_assert(MW_XSTAGE % 128 == 0 && MW_ASTAGE % 1024 == 0 && MW_RAW % 128 == 0, "moe_expert_fp8_ws: alignment");
static_assert(MW_SMEM + 6 * 1024 <= 227 * 1024, "moe_expert_fp8_ws: shared memory");
static_assert(MW_PD < MW_NX && MW_NA <= MW_NX, "moe_expert_fp8_ws: rings");

__global__ void __launch_bounds__(MW_NT, 1) moe_expert_fp8_ws_kernel(const MfParams p) {
  DI_PDL_WAIT();
  extern __shared__ __align__(1024) uint8_t mw_smem[];
  __shared__ int64_t s_xrow[MF_MR];
  __shared__ uint2 s_lut[MF_LUT_N];
  __shared__ __align__(8) uint64_t s_full[MW_NA], s_empty[MW_NX];
  __shared__ int s_emax[MF_BN];
  __shared__ int64_t s_grow[MF_BN];

  const int tile = blockIdx.y;
  if (tile >= *p.n_tiles) return;
  const int2 ti = p.tiles[tile];
  const int e = ti.x, r0 = ti.y;
  const int nrows = min(MF_MR, p.offsets[e + 1] - r0);
  const int ncols = (nrows + 15) & ~15;
  const int nb = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, g = lane >> 2, t = lane & 3;
  const int64_t K = p.K, I = p.I;
  const bool sw = p.swiglu != 0;
  const uint8_t* wb = p.w + (int64_t)e * p.w_stride;
  const uint8_t* sb = p.ws + (int64_t)e * p.s_stride;
  const int nst = (int)(K / MF_KC);
  const uint32_t smem0 = detail::smem_u32(mw_smem);

  if (tid < MF_MR) s_xrow[tid] = tid < nrows ? (int64_t)(p.gather ? p.gather[r0 + tid] : r0 + tid) : 0;
  if (tid < MF_LUT_N * 8) mf_lut_fill(s_lut, tid);
  if (tid < MF_BN) s_grow[tid] = mf_grow(sw, I, nb, tid);
  if (tid < MW_NA) detail::mbar_init(detail::smem_u32(&s_full[tid]), 256);
  if (tid < MW_NX) detail::mbar_init(detail::smem_u32(&s_empty[tid]), 256);
  __syncthreads();

  // producer: its copies (threads tid < 256: block row tid's 4 chunks of 16 bytes and its e8m0 word; x row
  // tid % 128, 16-byte pieces 4 (tid / 128) + 0..3, and the scale of row tid when tid < 128)
  const int pb = tid & (MF_BN - 1);
  const int64_t nsb = K / 128;
  const uint8_t* wsrc = wb + s_grow[pb] * (K / 2);
  const uint8_t* esrc = sb + s_grow[pb] * (K / 32);
  const int xr = tid & (MF_MR - 1), xh = (tid >> 7) & 1;
  const bool xon = xr < nrows;
  const uint8_t* xsrc = p.xq + s_xrow[xr] * K;
  const float* xssrc = p.xs + s_xrow[xr] * nsb;
  auto issue = [&](int st) {
    const uint32_t xb = smem0 + MW_XOFF + (st % MW_NX) * MW_XSTAGE;
    const uint32_t rb = smem0 + MW_ROFF + (st % MW_NX) * MW_RAW;
#pragma unroll
    for (int q = 0; q < 4; ++q) detail::cp_async16(rb + q * (MF_BN * 16) + 16 * pb, wsrc + (int64_t)st * (MF_KC / 2) + 16 * q);
    detail::cp_async4(rb + MF_BN * 64 + 4 * pb, esrc + (int64_t)st * 4);
    if (xon) {
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        const int pc = 4 * xh + pp;
        detail::cp_async16(xb + (pc >> 1) * MF_XSTEP + (xr >> 3) * 256 + (pc & 1) * 128 + (xr & 7) * 16,
                           xsrc + (int64_t)st * MF_KC + 16 * pc);
      }
      if (xh == 0) detail::cp_async4(xb + MW_XS + mf_xs_pos(xr) * 4, xssrc + st);
    }
    detail::cp_async_commit();
  };
  if (wg < 2) {
#pragma unroll 1
    for (int st = 0; st < MW_PD; ++st) {
      if (st < nst) issue(st);
      else detail::cp_async_commit();
    }
  } else {
    s_emax[tid - 256] = mf_row_emax(sb + s_grow[tid - 256] * (K / 32), K);  // (while those copies fly)
  }
  __syncthreads();

  if (wg < 2) {
    // ---- producer: the decode of each stage into the A ring, the copies MW_PD stages ahead ----
    const int pemax = s_emax[pb];
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(MW_PREGS));
#pragma unroll 1
    for (int s = 0; s < nst; ++s) {
      detail::cp_async_wait<MW_PD - 1>();  // this thread's copies of stage s
      if (s >= MW_NA) detail::mbar_wait(detail::smem_u32(&s_empty[(s - MW_NA) % MW_NX]), ((s - MW_NA) / MW_NX) & 1);
      const uint8_t* raw = mw_smem + MW_ROFF + (s % MW_NX) * MW_RAW;
      // row pb of A block pb / 64 (= 2·mt + c), 8-row group (pb % 64) / 8: core (j, h) of the row = 16 bytes, byte
      // 4q + i = k 32q + 8j + 4h + i, i.e. word q = chunk q's word j, half h — one 16-byte store
      uint8_t* a = mw_smem + MW_AOFF + (s % MW_NA) * MW_ASTAGE + (pb >> 6) * 4 * 2048 + ((pb >> 3) & 7) * 256 + (pb & 7) * 16;
      const uint32_t s4 = *reinterpret_cast<const uint32_t*>(raw + MF_BN * 64 + 4 * pb);
      uint2 lut[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) lut[q] = mf_row_lut(s4, q, s_lut, pemax);
      const uint2* rw = reinterpret_cast<const uint2*>(raw + 16 * pb);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {  // (words 2jj, 2jj + 1 of each chunk: 8-byte loads, within 40 registers)
        uint2 v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = rw[q * (MF_BN * 2) + jj];
#pragma unroll
        for (int j2 = 0; j2 < 2; ++j2)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint4 o;
            o.x = mf_dec4((j2 ? v[0].y : v[0].x) >> (16 * h), lut[0]);
            o.y = mf_dec4((j2 ? v[1].y : v[1].x) >> (16 * h), lut[1]);
            o.z = mf_dec4((j2 ? v[2].y : v[2].x) >> (16 * h), lut[2]);
            o.w = mf_dec4((j2 ? v[3].y : v[3].x) >> (16 * h), lut[3]);
            *reinterpret_cast<uint4*>(a + (2 * jj + j2) * 2048 + h * 128) = o;
          }
      }
      detail::fence_proxy_async_smem();  // the decoded bytes (generic proxy) → the wgmma reads
      detail::mbar_arrive(detail::smem_u32(&s_full[s % MW_NA]));
      if (s + MW_PD < nst) {
        if (s >= 1) detail::mbar_wait(detail::smem_u32(&s_empty[(s - 1) % MW_NX]), ((s - 1) / MW_NX) & 1);
        issue(s + MW_PD);
      } else {
        detail::cp_async_commit();
      }
    }
    return;
  }

  // ---- MMA warpgroups c = 0, 1: warp 4c + q owns block rows 128·mt + 16·(4c + q) + g (+ 8), as above ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MW_CREGS));
  const int c = wg - 2, warp = (tid - 256) >> 5;
  auto run = [&](auto ncl) {
    constexpr int NC = decltype(ncl)::value;
    float acc[2][64], tmp[64];
#pragma unroll
    for (int q = 0; q < 64; ++q) acc[0][q] = acc[1][q] = tmp[q] = 0.0f;
    int emax[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) emax[mt][0] = s_emax[128 * mt + 16 * warp + g], emax[mt][1] = s_emax[128 * mt + 16 * warp + g + 8];
#pragma unroll 1
    for (int s = 0; s < nst; ++s) {
      detail::mbar_wait(detail::smem_u32(&s_full[s % MW_NA]), (s / MW_NA) & 1);
      detail::fence_proxy_async_smem();  // (x by cp.async, generic proxy → wgmma)
      const uint32_t xb = smem0 + MW_XOFF + (s % MW_NX) * MW_XSTAGE;
      const uint32_t ab = smem0 + MW_AOFF + (s % MW_NA) * MW_ASTAGE;
      const float* xsc = reinterpret_cast<const float*>(mw_smem + MW_XOFF + (s % MW_NX) * MW_XSTAGE + MW_XS);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        detail::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
          detail::wgmma_e4m3_ss<NC>(tmp, detail::wgmma_desc(ab + ((2 * mt + c) * 4 + j) * 2048, 128, 256),
                                    detail::wgmma_desc(xb + j * MF_XSTEP, 128, 256), j);
        detail::wgmma_commit();
        detail::wgmma_wait<0>();
        detail::wgmma_fence_acc(tmp);
        mf_promote<NC>(acc[mt], tmp, xsc, t);
      }
      detail::mbar_arrive(detail::smem_u32(&s_empty[s % MW_NX]));
    }
    mf_epilogue<NC>(p, acc, emax, nrows, r0, nb, warp, g, t);
  };
  switch (ncols <= 32 ? 32 : ncols <= 64 ? 64 : 128) {
    case 32: run(std::integral_constant<int, 32>{}); break;
    case 64: run(std::integral_constant<int, 64>{}); break;
    default: run(std::integral_constant<int, 128>{}); break;
  }
}
}  // namespace

// (moe_quant_fp8 / moe_quant_fp8_bf16: gemm_dq.cu's quant_act_kernel, which quant_act_fp8 runs too.)

bool moe_expert_fp8_ok(WFmt f, int64_t N, int64_t K, bool swiglu) {
  (void)swiglu;  // swiglu: I = N / 2 a multiple of 128, the same condition
  return f == WFmt::FP4_B32 && K > 0 && K % MF_KC == 0 && N > 0 && N % MF_BN == 0;
}

cudaError_t moe_expert_gemm_fp8(const uint8_t* xq, const float* xs, const int32_t* gather, int64_t K, WeightRef W,
                                int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit,
                                const int2* tile_info, const int32_t* n_tiles, int64_t max_tiles,
                                const int32_t* offsets, void* y, int64_t ldy, cudaStream_t s, int kernel,
                                int* counter) {
  if (!moe_expert_fp8_ok(W.fmt, N, K, swiglu) || !W.scale || reinterpret_cast<uintptr_t>(xq) % 16 ||
      reinterpret_cast<uintptr_t>(W.w) % 16 || w_stride % 16 || reinterpret_cast<uintptr_t>(W.scale) % 4 ||
      s_stride % 4 || (K / 32) % 4)
    return cudaErrorInvalidValue;
  if (swiglu && !(limit > 0.0f)) return cudaErrorInvalidValue;
  if (max_tiles <= 0) return cudaSuccess;
  if (max_tiles > 65535) return cudaErrorInvalidValue;
  MfParams p = {};
  p.xq = xq, p.xs = xs, p.gather = gather;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale);
  p.w_stride = w_stride, p.s_stride = s_stride;
  p.N = N, p.K = K, p.I = N / 2;
  p.swiglu = swiglu ? 1 : 0, p.lim = limit;
  p.tiles = tile_info, p.n_tiles = n_tiles, p.offsets = offsets;
  p.y = y, p.ldy = ldy;
  const int64_t nblk = N / MF_BN;  // w13: 128 act columns a block, I / 128 = N / 256 blocks as well
  const dim3 grid((unsigned)nblk, (unsigned)max_tiles);
  if (kernel == 1) {
    moe_expert_fp8_ws_kernel<<<grid, MW_NT, MW_SMEM, s>>>(p);
  } else if (kernel == 2) {  // persistent: one block an SM (at most one an item), items claimed by p.ctr
    if (!counter) return cudaErrorInvalidValue;
    p.ctr = counter;
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    const int64_t items = nblk * max_tiles;
    moe_expert_fp8_kernel<true><<<(unsigned)std::max<int64_t>(1, std::min<int64_t>(sms, items)), MF_NT, MF_SMEM, s>>>(p);
  } else {
    moe_expert_fp8_kernel<false><<<grid, MF_NT, MF_SMEM, s>>>(p);
  }
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_moe_fp8() {
  cudaError_t e = set_max_dynamic_smem(moe_expert_fp8_kernel<false>, MF_SMEM);
  if (e == cudaSuccess) e = set_max_dynamic_smem(moe_expert_fp8_kernel<true>, MF_SMEM);
  return e != cudaSuccess ? e : set_max_dynamic_smem(moe_expert_fp8_ws_kernel, MW_SMEM);
}
}  // namespace detail

}  // namespace deepinfer::cuda
