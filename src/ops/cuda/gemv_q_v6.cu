// GEMV v6 (gemv_q_v6): decode GEMV y[M, N] = x[M, K] · dequant(W)[N, K]ᵀ, M ≤ 8 a launch, for bf16 and
// fp8 e4m3 (128×128 f32 block scales) weights. Design, byte counts and predictions: docs/cuda-notes.md,
// "GEMV v6". What changes against v3/v5 (both measured near 45 % of HBM at 33 MB, ALU-bound decode):
//
// * fp8 decode in hardware: `cvt.rn.f16x2.e4m3x2` turns two e4m3 bytes into two f16 (exact, subnormals
//   included): one instruction per two weights instead of v3's byte_perm/shift/mask/multiply chain.
//   The MMA is then f16 × f16 (m16n8k16, f32 accumulate), so x is staged as f16: each 128-k block of a
//   row is bf16-rounded (as v3/v5 do) and multiplied by a power of two 2^(14−E) (E = exponent of the
//   block's largest |x|) so it lies in [2^14, 2^15) at most: a bf16 value then converts to f16 exactly
//   (down to 2^-31 of the block's max). The weight's block scale s and the 2^(E−14) factor are applied
//   to the f32 partial sum of each 128-k step once (acc += s·f · Σ), not to every weight.
// * Weights stream through a register ring of NB steps a warp (step = 128 bytes of 16 rows = 4 loads of
//   16 bytes a lane, 2 KiB a warp): step j is computed and step j + NB issued into its registers right
//   away, so NB = 4 steps (8 KiB a warp, 128 KiB an SM at 2 blocks) stay in flight without batch gaps.
// * Every SM streams, also for small N: K is split into S slices (power of two ≤ 64, from (fmt, N, K)
//   only) until tiles·S ≥ 2048; slices of a tile are spread over the ranks of a thread-block cluster
//   (CS ≤ 8, first up to 4; each rank stages only its K-range of x, ≤ ~4096 k) and the warps of a block
//   (SW = S / CS ≤ 8).
//   The partial sums are added in a fixed order: warp slices 0..SW−1 through shared memory, then ranks
//   0..CS−1 on rank 0 through distributed shared memory. No atomics.
// * Grid: CS = 1: persistent, min(tile groups, 2 blocks × SMs), blocks loop over tile groups; CS > 1:
//   one cluster per tile group (short K ranges, one round).
//
// Batch invariance: an output's sum is, per slice, the step chain in k order (fp8: an MMA chain over the
// step's 128 k from zero, then one FMA into the slice sum), then slices in order, then ranks in order;
// the schedule depends only on (fmt, N, K). MMA column m depends only on x row m, and the f16 pre-scale
// of x row m only on row m. So row m's bits are the same for every M (M > 8: launches of 8 rows).
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
namespace cg = cooperative_groups;
using detail::cdiv, detail::u4get, detail::mma16816, detail::mma16816_f16, detail::e4m3x4_f16;
using detail::x8_bf16, detail::x8_f16_prescaled;

constexpr int G6_WARPS = 8, G6_NT = G6_WARPS * 32;
constexpr int G6_BPS = 2;          // blocks an SM (launch bound: ≤ 128 registers)
constexpr int G6_NB = 4;           // steps in flight a warp (register ring)
constexpr int G6_MAXS = 64;        // slices a tile: SW ≤ 8 warps × CS ≤ 8 ranks
constexpr int G6_KR = 4096;        // k of x a cluster rank stages, about (8 rows × 8 KiB f16/bf16)
constexpr int G6_XU = 4;           // x staging: units of 8 k a thread loads before converting
constexpr int G6_FS = 40;          // f16 pre-scale factors a row (steps of a rank's K-range, ≤ 5120 / 128)
constexpr size_t G6_SMEM_MAX = 227 * 1024;

struct G6Params {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  const float* ws;
  int64_t ldws;
  int64_t N, K;
  float* y;
  int64_t ldy;
  int M;       // rows of this launch (≤ 8)
  int sps;     // steps a slice
  int sw, cs;  // slices a tile inside a block (warps), cluster ranks (K-ranges)
  int rounds;  // tile groups (8 / sw tiles each)
  int kr;      // k a rank covers: sw · sps · k a step
  int xs_u4;   // row stride of the x staging, 16-byte units
  int64_t xg, yg, wg, sg;  // groups (blockIdx.z): offsets of group 1 in x, y (elements), w, ws (bytes)
  // fused SwiGLU (dense, N = 2I): a round's first tpb/2 tiles are gate rows, the last tpb/2 the matching
  // up rows, and y[m, i] (row stride ldy) = swiglu_clamp(gate, up) for the gate rows i of the round
  int fuse;
  int64_t I;
  float lim;
};

// First row of tile q (of tpb) in round rnd; ≥ N: no rows (a fused round past the last gate tile).
template <bool FUSE>
__device__ __forceinline__ int64_t g6_n0(const G6Params& p, int rnd, int tpb, int q) {
  if constexpr (!FUSE) return ((int64_t)rnd * tpb + q) * 16;
  const int h = tpb / 2;
  const int64_t gi = (int64_t)rnd * h + q % h;  // the gate tile of the pair
  if (gi * 16 >= p.I) return p.N;
  return (q < h ? 0 : p.I) + gi * 16;
}

template <WFmt WF>
struct G6Fmt {
  static constexpr int KSTEP = WF == WFmt::BF16 ? 64 : 128;  // k a step (128 bytes of a row)
};

// 16 bytes read once: not kept in L1, L2 asked for the 256-byte span (the row's next step).
__device__ __forceinline__ uint4 g6_ld(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// The same for the loads issued before griddepcontrol.wait: detail::ld_early_u4_l2 / ld_early_f32 (not .nc).
using detail::ld_early_f32, detail::ld_early_u4_l2;

// A warp's rows in a round: row n0 + g (a), n0 + g + 8 (b) at this lane's byte 16t, null past N; fp8: the
// tile's row of block scales.
struct G6Rows {
  const uint8_t* a;
  const uint8_t* b;
  const float* s;
};
template <WFmt WF>
__device__ __forceinline__ G6Rows g6_rows(const G6Params& p, int64_t n0, int g, int t) {
  const int64_t rb = WF == WFmt::BF16 ? p.K * 2 : p.K;  // row bytes
  const int64_t nA = n0 + g, nB = nA + 8;
  const uint8_t* w = p.w + blockIdx.z * p.wg;
  const float* ws = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(p.ws) + blockIdx.z * p.sg);
  G6Rows r;
  r.a = nA < p.N ? w + nA * rb + t * 16 : nullptr;
  r.b = nB < p.N ? w + nB * rb + t * 16 : nullptr;
  r.s = WF == WFmt::FP8_B128 && n0 < p.N ? ws + (n0 / 128) * p.ldws : nullptr;
  return r;
}
// One step st of a warp: bytes [128·st + 64h + 16t, +16) of rows a, b for h = 0, 1 (wv[2h] row a,
// wv[2h + 1] row b); fp8: the step's block scale (128 k = one block). Nothing is loaded when !ok (the
// slot is not computed) or past N (rows that are not stored: stale registers are harmless there).
template <WFmt WF, bool EARLY = false>
__device__ __forceinline__ void g6_load(const G6Rows& r, int st, bool ok, uint4 (&wv)[4], float& sc) {
  if (!ok) return;
  const int64_t o = (int64_t)st * 128;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (r.a) wv[2 * h] = EARLY ? ld_early_u4_l2(r.a + o + 64 * h) : g6_ld(r.a + o + 64 * h);
    if (r.b) wv[2 * h + 1] = EARLY ? ld_early_u4_l2(r.b + o + 64 * h) : g6_ld(r.b + o + 64 * h);
  }
  if constexpr (WF == WFmt::FP8_B128) sc = EARLY ? ld_early_f32(r.s + st) : __ldg(r.s + st);
}

// The MMAs of one step (local step ls of the rank's K-range). xrow: this lane's x row g, or null (rows
// ≥ M: zero B columns). fp8: an f16 MMA chain over the step's 128 k from zero, then acc += s·f·Σ with f
// the pre-scale factors of x rows 2t, 2t + 1 (the columns of this lane's accumulators).
template <WFmt WF>
__device__ __forceinline__ void g6_compute(int ls, const uint4* xrow, const float* fs, int t, const uint4 (&wv)[4],
                                           float sc, float (&acc)[4]) {
  if constexpr (WF == WFmt::BF16) {
    // chunk h = k [64·ls + 32h, +32): lane t's 8 k at +8t = x unit 8·ls + 4h + t
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 X = xrow ? xrow[ls * 8 + 4 * h + t] : make_uint4(0, 0, 0, 0);
      const uint4& w0 = wv[2 * h];
      const uint4& w1 = wv[2 * h + 1];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        mma16816(acc, u4get(w0, 2 * i), u4get(w1, 2 * i), u4get(w0, 2 * i + 1), u4get(w1, 2 * i + 1), u4get(X, 2 * i),
                 u4get(X, 2 * i + 1));
    }
  } else {
    float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // chunk h = k [128·ls + 64h, +64): lane t's 16 k at +16t = x units 16·ls + 8h + 2t, +1; MMA i takes
      // weight word i (k 4i..4i+3): A pairs (4i, 4i+1), (4i+2, 4i+3) against x words 2(i%2), 2(i%2)+1
      uint4 X[2];
      X[0] = xrow ? xrow[ls * 16 + 8 * h + 2 * t] : make_uint4(0, 0, 0, 0);
      X[1] = xrow ? xrow[ls * 16 + 8 * h + 2 * t + 1] : make_uint4(0, 0, 0, 0);
      const uint4& w0 = wv[2 * h];
      const uint4& w1 = wv[2 * h + 1];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t a0, a1, a2, a3;
        e4m3x4_f16(u4get(w0, i), a0, a2);
        e4m3x4_f16(u4get(w1, i), a1, a3);
        mma16816_f16(blk, a0, a1, a2, a3, u4get(X[i / 2], 2 * (i % 2)), u4get(X[i / 2], 2 * (i % 2) + 1));
      }
    }
    const float2 f = *reinterpret_cast<const float2*>(fs + ls * 8 + 2 * t);
    const float f0 = sc * f.x, f1 = sc * f.y;
    acc[0] = fmaf(f0, blk[0], acc[0]), acc[1] = fmaf(f1, blk[1], acc[1]);
    acc[2] = fmaf(f0, blk[2], acc[2]), acc[3] = fmaf(f1, blk[3], acc[3]);
  }
}

// x rows [M, kb0 + klen) → shared memory, natural k order. bf16: bf16(x). fp8: f16(bf16(x) · 2^(14−E))
// per 128-k block (16 units of 8 k, handled by 16 consecutive lanes: their max via shuffles), the factor
// 2^(E−14) to fs[block · 8 + m].
template <WFmt WF>
__device__ __forceinline__ void g6_stage_x(const G6Params& p, uint4* xs, float* fs, int64_t kb0, int klen) {
  const int tid = threadIdx.x;
  const int units = klen / 8, total = p.M * units;  // units % 16 == 0 (klen % 128 == 0)
  if constexpr (WF == WFmt::FP8_B128)
    for (int i = tid; i < G6_FS * 8; i += G6_NT)
      if (i % 8 >= p.M) fs[i] = 0.0f;  // columns of absent rows: finite
  for (int base = 0; base < total; base += G6_XU * G6_NT) {
    float4 a[G6_XU], b[G6_XU];
#pragma unroll
    for (int q = 0; q < G6_XU; ++q) {
      const int i = base + q * G6_NT + tid;
      a[q] = b[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < total) {
        const int m = i / units;
        const float* xr = p.x + blockIdx.z * p.xg + m * p.ldx + kb0 + (int64_t)(i - m * units) * 8;
        a[q] = *reinterpret_cast<const float4*>(xr), b[q] = *reinterpret_cast<const float4*>(xr + 4);
      }
    }
#pragma unroll
    for (int q = 0; q < G6_XU; ++q) {
      const int i = base + q * G6_NT + tid;
      const int m = i / units, u = i - m * units;
      uint4 o;
      if constexpr (WF == WFmt::BF16) {
        o = x8_bf16(a[q], b[q]);
      } else {
        // (all lanes take part: total % 16 == 0, so a 16-lane group is entirely in or out of range)
        float f;
        o = x8_f16_prescaled(a[q], b[q], f);
        if (i < total && u % 16 == 0) fs[(u / 16) * 8 + m] = f;
      }
      if (i < total) xs[(size_t)m * p.xs_u4 + u] = o;
    }
  }
}

// FUSE: the fused SwiGLU (its own instantiation: the plain kernel's registers are unchanged)
template <WFmt WF, bool FUSE>
__global__ void __launch_bounds__(G6_NT, G6_BPS) gemv6_kernel(const G6Params p) {
  // No DI_PDL_WAIT first: the first NB steps of weights (constant) are loaded before it, so in a step graph
  // they stream while the previous kernel runs; x (written by it) is read only after the wait.
  constexpr int KSTEP = G6Fmt<WF>::KSTEP;
  extern __shared__ uint4 g6_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rank = blockIdx.x;  // cluster dims (cs, 1, 1): rank = K-range
  const int tpb = G6_WARPS / p.sw, tl = warp / p.sw, sl = warp % p.sw;
  const int64_t kb0 = (int64_t)rank * p.kr;
  const int klen = (int)max((int64_t)0, min((int64_t)p.kr, p.K - kb0));
  const int gst0 = rank * (p.kr / KSTEP);                // global step of the rank's first step
  const int lst0 = sl * p.sps;                           // this warp's steps, local to the rank
  const int lst1r = min(lst0 + p.sps, klen / KSTEP);
  uint4* xs = g6_smem;                                                         // [M][xs_u4]
  float* red = reinterpret_cast<float*>(g6_smem + (size_t)p.M * p.xs_u4);      // [8 warps][128]
  float* part = red + G6_WARPS * 128;                                          // [tpb][128] block sums
  float* fs = part + G6_WARPS * 128;                                           // [G6_FS][8] x factors

  int rnd = blockIdx.y;
  int64_t n0 = g6_n0<FUSE>(p, rnd, tpb, tl);
  int lst1 = n0 < p.N ? lst1r : lst0;  // a tile past N (last group): no steps
  uint4 wv[G6_NB][4];
  float sc[G6_NB];
#pragma unroll
  for (int q = 0; q < G6_NB; ++q) {
    sc[q] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[q][i] = make_uint4(0, 0, 0, 0);
  }
  G6Rows rows = g6_rows<WF>(p, n0, g, t);
  // the first steps are in flight while the previous kernel finishes and x is staged
#pragma unroll
  for (int q = 0; q < G6_NB; ++q) g6_load<WF, true>(rows, gst0 + lst0 + q, lst0 + q < lst1, wv[q], sc[q]);
  DI_PDL_WAIT();
  g6_stage_x<WF>(p, xs, fs, kb0, klen);
  __syncthreads();
  const uint4* xrow = g < p.M ? xs + (size_t)g * p.xs_u4 : nullptr;

  for (;;) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = lst0; j0 < lst1; j0 += G6_NB) {
#pragma unroll
      for (int q = 0; q < G6_NB; ++q) {
        const int j = j0 + q;
        if (j < lst1) {  // warp-uniform
          g6_compute<WF>(j, xrow, fs, t, wv[q], sc[q], acc);
          g6_load<WF>(rows, gst0 + j + G6_NB, j + G6_NB < lst1, wv[q], sc[q]);
        }
      }
    }
    // fragment: acc 0, 1 = (row g, x rows 2t, 2t + 1), acc 2, 3 = row g + 8
    // fused: every tile's sums to part (each element written and then read by one thread; rank 0 of a
    // cluster adds the ranks in place), then the block pairs gate element e with up element e + 64·tpb
    auto store = [&](int e, float v) {  // element e of the [tpb][4][32] fragment image
      if constexpr (FUSE) {
        part[e] = v;
        return;
      }
      const int q = e / 128, r = (e / 32) % 4, ln = e % 32;
      const int64_t n = ((int64_t)rnd * tpb + q) * 16 + (ln >> 2) + 8 * (r >> 1);
      const int m = 2 * (ln & 3) + (r & 1);
      if (m < p.M && n < p.N) p.y[blockIdx.z * p.yg + m * p.ldy + n] = v;
    };
    auto emit = [&] {  // (fused; every thread of the block)
      __syncthreads();
      const int h = tpb / 2;
      for (int e = tid; e < h * 128; e += G6_NT) {
        const int q = e / 128, r = (e / 32) % 4, ln = e % 32;
        const int64_t i = ((int64_t)rnd * h + q) * 16 + (ln >> 2) + 8 * (r >> 1);
        const int m = 2 * (ln & 3) + (r & 1);
        if (m < p.M && i < p.I) p.y[m * p.ldy + i] = detail::swiglu_clamp_one(part[e], part[e + h * 128], p.lim, 1.0f);
      }
      __syncthreads();  // part is rewritten next round
    };
    if (p.sw == 1 && p.cs == 1) {
#pragma unroll
      for (int r = 0; r < 4; ++r) store(warp * 128 + r * 32 + lane, acc[r]);
      if constexpr (FUSE) emit();
    } else {
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp * 128 + r * 32 + lane] = acc[r];
      __syncthreads();
      for (int e = tid; e < tpb * 128; e += G6_NT) {  // slices of a tile in order
        const int q = e / 128;
        float v = red[q * p.sw * 128 + e % 128];
        for (int s = 1; s < p.sw; ++s) v += red[(q * p.sw + s) * 128 + e % 128];
        if (p.cs == 1) store(e, v);
        else part[e] = v;
      }
      if (FUSE && p.cs == 1) emit();
      if (p.cs > 1) {  // then the ranks in order, on rank 0
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();
        if (rank == 0) {
          for (int e = tid; e < tpb * 128; e += G6_NT) {
            float v = part[e];
            for (int r = 1; r < p.cs; ++r) v += cluster.map_shared_rank(part, r)[e];
            store(e, v);
          }
          if constexpr (FUSE) emit();
        }
        cluster.sync();  // part stays readable until rank 0 is done
      } else {
        __syncthreads();  // red is rewritten next round
      }
    }
    rnd += gridDim.y;
    if (rnd >= p.rounds) break;
    n0 = g6_n0<FUSE>(p, rnd, tpb, tl);
    lst1 = n0 < p.N ? lst1r : lst0;
    rows = g6_rows<WF>(p, n0, g, t);
#pragma unroll
    for (int q = 0; q < G6_NB; ++q) g6_load<WF>(rows, gst0 + lst0 + q, lst0 + q < lst1, wv[q], sc[q]);
  }
}

// The schedule of (fmt, N, K, groups): slices a tile S = cs · sw, steps a slice. Depends on nothing else.
struct G6Sched {
  int cs, sw, sps, kr;
};
G6Sched g6_schedule(WFmt f, int64_t N, int64_t K, int groups, const GemvV6Tune& t) {
  const int kstep = f == WFmt::BF16 ? 64 : 128;
  const int64_t tiles = groups * cdiv(N, 16), nst = K / kstep;
  int s = 1;
  while (s < G6_MAXS && tiles * s < t.items && nst >= 2 * s * (int64_t)std::max(1, t.min_steps))
    s *= 2;  // every slice keeps ≥ min_steps steps
  int cs = 1;
  while (cs < 8 && cdiv(K, cs) > G6_KR) cs *= 2;  // a rank stages ≤ ~4096 k of x
  // K over ranks first (up to 4): a block then holds more tiles (8 / sw), and the f32 x it reads from L2
  // (kr·M·4 bytes a block, 2/tiles-a-block × the weight bytes at M = 8) shrinks; clusters of 4 place
  // easily at 2 blocks an SM. Past 4 ranks, the warps of a block take the rest.
  cs = std::max(cs, std::min(s, std::clamp(t.ranks, 1, 4)));
  cs = std::max(cs, s / G6_WARPS);
  s = std::max(s, cs);
  G6Sched sc;
  sc.cs = cs, sc.sw = s / cs, sc.sps = (int)cdiv(nst, s);
  sc.kr = sc.sw * sc.sps * kstep;
  return sc;
}
size_t g6_smem_bytes(int rows, int xs_u4) {
  return (size_t)rows * xs_u4 * 16 + (size_t)(2 * G6_WARPS * 128 + G6_FS * 8) * sizeof(float);
}

}  // namespace

bool gemv_q_v6_supported(WFmt f, int64_t K) {
  return (f == WFmt::BF16 || f == WFmt::FP8_B128) && K > 0 && K % 128 == 0 && K <= 32768;
}

// Dense (G = 1) and groups: y[m, g·yg + n] = Σ_k bf16(x[m, g·xg + k]) · W_g[n, k] for g < G, W_g at
// W.w + g·wg bytes (scales + g·sg bytes); blockIdx.z = g.
// The default schedule, from the session-6 sweep at M = 1 (docs/cuda-notes.md, "Session 2026-12-03 (6)";
// weights cold): ≥ 1024 tiles (wq_b, the head) as before; otherwise slices of ≥ 4 steps, one rank up to
// 6 MB of weights (wq_a, wkv, a wo_a group: 6.6 µs against 7.8 with v3) and two ranks above (wo_b 18.1
// against 21.2, shared w13 12.4 against 14.9). A function of (fmt, N, K, G) only: batch invariant.
// Session 8 (sched 1): above 6 MB with < 1024 tiles, session 6's {1024, 4, 2} gave wo_b, the shared w13 and the
// wo_a groups 128 blocks of 8 warps (one an SM: 64 KiB of loads in flight, ~43 % of HBM); {2048, 4, 2} doubles
// the slices (256 blocks, two an SM), as wq_b has at 56 %.
GemvV6Tune g6_default_tune(WFmt f, int64_t N, int64_t K, int G, int sched) {
  const int64_t tiles = G * cdiv(N, 16), bytes = G * N * K * (f == WFmt::BF16 ? 2 : 1);
  if (tiles >= 1024) return GemvV6Tune{2048, 1, 4};
  if (bytes <= (int64_t)6 << 20) return GemvV6Tune{512, 4, 1};
  return sched == 0 ? GemvV6Tune{1024, 4, 2} : GemvV6Tune{2048, 4, 2};
}

static cudaError_t g6_run(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, bool grouped, int G, int64_t xg, int64_t yg, int64_t wg, int64_t sg,
                          cudaStream_t s, const GemvPlan* plan, const GemvV6Tune* tune = nullptr,
                          bool swiglu = false, float limit = 0.0f) {
  if (!gemv_q_v6_supported(W.fmt, K)) return cudaErrorNotSupported;
  if (ldx % 4 || xg % 4 || wg % 16 || sg % 4 || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(W.w) % 16 || G < 1 || G > 65535)
    return cudaErrorInvalidValue;
  if (W.fmt == WFmt::FP8_B128 && (!W.scale || W.ldws < K / 128)) return cudaErrorInvalidValue;
  if (M <= 0 || N <= 0) return cudaSuccess;
  int sms = 0;
  if (plan && plan->sms > 0) {
    if (plan->fmt != W.fmt || plan->N != N || plan->K != K || plan->grouped != grouped) return cudaErrorInvalidValue;
    sms = plan->sms;
  } else {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const G6Sched sc = g6_schedule(W.fmt, N, K, G, tune ? *tune : g6_default_tune(W.fmt, N, K, G, plan ? plan->v6_sched : 1));
  // fused: pairs of tiles a round (≥ 2 tiles a block), dense only
  if (swiglu && (N % 32 || limit <= 0.0f || G != 1 || G6_WARPS / sc.sw < 2)) return cudaErrorNotSupported;
  G6Params p = {};
  p.fuse = swiglu ? 1 : 0, p.I = N / 2, p.lim = limit;
  p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const float*>(W.scale), p.ldws = W.ldws;
  p.N = N, p.K = K, p.ldy = ldy;
  p.sps = sc.sps, p.sw = sc.sw, p.cs = sc.cs, p.kr = sc.kr;
  p.xg = xg, p.yg = yg, p.wg = wg, p.sg = sg;
  // row stride: + 1 unit (fp8: lanes read units 2t, 2t+1 of rows g) / + 4 units (bf16: unit t) keeps
  // the 8 lanes of a quarter-warp on distinct banks
  p.xs_u4 = sc.kr / 8 + (W.fmt == WFmt::BF16 ? 4 : 1);
  p.rounds = (int)cdiv(cdiv(N, 16), G6_WARPS / sc.sw);
  const int64_t gy =
      sc.cs == 1 ? std::min<int64_t>(p.rounds, std::max<int64_t>(1, (int64_t)G6_BPS * sms / G)) : p.rounds;
  if (gy > 65535) return cudaErrorNotSupported;
  for (int64_t m0 = 0; m0 < M; m0 += 8) {  // rows are independent: 8 at a time
    p.x = x + m0 * ldx, p.y = y + m0 * ldy;
    p.M = (int)std::min<int64_t>(8, M - m0);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)sc.cs, (unsigned)gy, (unsigned)G);
    cfg.blockDim = dim3(G6_NT, 1, 1);
    cfg.dynamicSmemBytes = g6_smem_bytes(p.M, p.xs_u4);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)sc.cs;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = sc.cs > 1 ? 1 : 0;
    const cudaError_t e =
        swiglu ? (W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv6_kernel<WFmt::BF16, true>, p)
                                      : cudaLaunchKernelEx(&cfg, gemv6_kernel<WFmt::FP8_B128, true>, p))
               : (W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv6_kernel<WFmt::BF16, false>, p)
                                      : cudaLaunchKernelEx(&cfg, gemv6_kernel<WFmt::FP8_B128, false>, p));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

bool gemv_q_v6_swiglu_ok(WFmt f, int64_t N, int64_t K) {
  // (both default schedules: a plan picks one)
  return gemv_q_v6_supported(f, K) && N > 0 && N % 32 == 0 &&
         G6_WARPS / g6_schedule(f, N, K, 1, g6_default_tune(f, N, K, 1, 0)).sw >= 2 &&
         G6_WARPS / g6_schedule(f, N, K, 1, g6_default_tune(f, N, K, 1, 1)).sw >= 2;
}
cudaError_t gemv_q_v6_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan) {
  return g6_run(x, M, K, ldx, W, N, act, lda, false, 1, 0, 0, 0, 0, s, plan, nullptr, true, limit);
}
cudaError_t gemv_q_v6(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan) {
  return g6_run(x, M, K, ldx, W, N, y, ldy, false, 1, 0, 0, 0, 0, s, plan);
}

cudaError_t gemv_q_v6_tuned(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                            int64_t ldy, cudaStream_t s, const GemvV6Tune& tune) {
  return g6_run(x, M, K, ldx, W, N, y, ldy, false, 1, 0, 0, 0, 0, s, nullptr, &tune);
}

cudaError_t gemv_q_v6_groups(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t w_stride,
                             int64_t s_stride, int G, int64_t N, float* y, int64_t ldy, cudaStream_t s,
                             const GemvPlan* plan) {
  if (W.fmt == WFmt::FP8_B128 && s_stride % 4) return cudaErrorInvalidValue;
  return g6_run(x, M, K, ldx, W, N, y, ldy, true, G, K, N, w_stride, W.fmt == WFmt::FP8_B128 ? s_stride : 0, s, plan);
}

namespace detail {
cudaError_t init_attributes_gemv_q_v6() {
  return first_error({set_max_dynamic_smem(gemv6_kernel<WFmt::BF16, false>, G6_SMEM_MAX),
                      set_max_dynamic_smem(gemv6_kernel<WFmt::FP8_B128, false>, G6_SMEM_MAX),
                      set_max_dynamic_smem(gemv6_kernel<WFmt::BF16, true>, G6_SMEM_MAX),
                      set_max_dynamic_smem(gemv6_kernel<WFmt::FP8_B128, true>, G6_SMEM_MAX)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
