// GEMV v8 (gemv_q_v8): decode GEMV y[M, N] = bf16(x)[M, K] · dequant(W)[N, K]ᵀ for M ≤ 8 rows a launch,
// bf16 and fp8 e4m3 (128×128 f32 block scales) weights. Design, byte counts and predictions:
// docs/cuda-notes.md, "GEMV v8". What changes against v6 (2–3× the measured streaming floor, Nsight: DRAM
// 8–29 %, waiting on loads) and v7 (~50 address instructions a 16-byte load in its SASS):
//
// * Weights move by bulk copies (cp.async.bulk, the copy engine) into a ring of R stages of 32 KiB in
//   shared memory: a stage is 8·TPS rows × SB bytes, SB = min(row bytes, 4 KiB), TPS = 4 KiB / SB tiles of
//   8 rows; one contiguous copy where the rows are whole (row bytes ≤ 4 KiB), else 8 copies of 4 KiB, plus
//   the stage's fp8 block scales. Copies are that large on purpose: an SM completes about one bulk copy
//   every ~270 ns up to 4 KiB whatever the ring depth (`floor perf bulk` op cases, s7-run5), so 1 KiB
//   copies (the first version) capped an SM at ~9 GB/s. One producer thread issues every stage of the
//   block's range; the first R stages are requested before any griddepcontrol.wait (weights are
//   constant), so in a step graph they stream while the previous kernel runs.
// * 16 consumer warps: WPT = 16 / TPS warps a tile, warp w takes 256 bytes of each of its tile's 8 rows
//   (4 units of 64 bytes, each its own MMA chain from zero: four independent chains a stage). The MMA is
//   m16n8k16 with x as A (rows m < M of 16; the rest zero) and the weight rows as the n8 columns: lane
//   (g, t) reads 16 bytes of weight row g and its x row g (fp8: hardware e4m3 → f16, x staged as f16 with
//   v6's per-block power-of-two pre-scale, the block scale applied once a unit; bf16 as stored). A warp
//   frees a stage with an mbarrier arrive, no block barrier a stage.
// * A block (one an SM) owns a contiguous range of tile groups (TPS tiles; groups: of (group, tile group);
//   fused SwiGLU: TPS gate tiles, then their TPS up tiles). When a group of tiles is done the WPT warps'
//   sums of each tile are added in warp order through shared memory (one named barrier).
//
// Measured (docs/cuda-notes.md "GEMV v8", s7-run3/4): within ±10 % of v6, not faster in the model step,
// so the backend takes it only with DEEPINFER_CUDA_ON=gemv_v8.
//
// Batch invariance: an output's sum is, per warp, its units in k order (fp8: an MMA chain over 64 k from
// zero, then one FMA into the warp's sum; bf16: a chain over 32 k, then an add), then its tile's warps in
// order.
// That depends on K only; MMA row m depends on x row m only, so row m's bits are the same for every
// M ≤ 8 (M > 8: launches of 8 rows), every grid and every ring depth.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/bf16_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv, detail::u4get, detail::mma16816, detail::mma16816_f16, detail::e4m3x4_f16;
using detail::smem_u32, detail::mbar_init, detail::mbar_expect, detail::mbar_wait, detail::mbar_arrive, detail::bulk_load;
using detail::x8_bf16, detail::x8_f16_prescaled;

constexpr int G8_CW = 16;                 // consumer warps
constexpr int G8_NC = G8_CW * 32;         // consumer threads
constexpr int G8_NT = G8_NC + 32;         // + one producer warp
constexpr int G8_SBMAX = 4096;            // bytes of a row in a stage at most
constexpr int G8_STAGE = 8 * G8_SBMAX;    // weight bytes of a stage: 8·TPS rows × SB = 32 KiB
constexpr int G8_RMAX = 16;               // ring stages at most
constexpr int G8_KMAX = 8192;             // x of 8 rows in shared memory (f16/bf16: 128 KiB at K = 8192)
constexpr int G8_FS = G8_KMAX / 128;      // fp8: x pre-scale factors a row
constexpr int G8_TPSMAX = 4;              // tiles a stage at most (row bytes 1024)
constexpr size_t G8_SMEM_MAX = 227 * 1024;
// fixed part of the dynamic shared memory: barriers, warp sums [2][16][64], gate sums [4 · 64], x factors
constexpr size_t G8_OFF_RED = 2 * G8_RMAX * 8, G8_OFF_GATE = G8_OFF_RED + 2 * G8_CW * 64 * 4,
                 G8_OFF_FS = G8_OFF_GATE + G8_TPSMAX * 64 * 4, G8_OFF_X = G8_OFF_FS + G8_FS * 8 * 4;

// The stage geometry of a weight shape: SB = min(row bytes, 4 KiB) bytes of each row, TPS = 4 KiB / SB
// tiles of 8 rows (so a stage is always 32 KiB of weights), WPT = 16 / TPS warps a tile, each warp 256
// bytes of each of its tile's rows (4 units of 64 bytes).
struct G8Geo {
  int sb, tps, wpt, spt;
};
__host__ __device__ inline G8Geo g8_geo(WFmt f, int64_t K) {
  const int64_t rowb = f == WFmt::BF16 ? 2 * K : K;
  G8Geo g;
  g.sb = (int)(rowb < G8_SBMAX ? rowb : G8_SBMAX);
  g.tps = G8_SBMAX / g.sb;
  g.wpt = G8_CW / g.tps;
  g.spt = (int)(rowb / g.sb);
  return g;
}

struct G8Params {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  const uint8_t* ws;  // fp8 block scales (bytes)
  int64_t ldws;       // floats a scale row
  int64_t N, K;
  float* y;
  int64_t ldy;
  int M;
  int64_t xg, yg, wg, sg;  // group g's offsets: x, y (elements), w, ws (bytes)
  int64_t items;           // tile groups (TPS tiles; fused: TPS gate tiles + their TPS up tiles) over all groups
  int64_t ipg;             // items a group
  int tpi;                 // tile groups an item: 1, fused 2 (the gate tiles, then their up tiles)
  G8Geo geo;
  int R;                   // ring stages
  int stage_bytes;         // a ring stage: 8·TPS rows × SB (row stride SB) + the fp8 scales, 128-byte multiple
  int xrs;                 // x row stride in shared memory, bytes
  int xoff;                // ring offset (after x), bytes
  float lim;               // fused SwiGLU: y[m, i] = swiglu_clamp(gate row i, up row I + i), I = N / 2
};

// A tile group's first row and weight group. Fused: item = (gate rows 8·TPS·i.., up rows I + 8·TPS·i..).
struct G8Tile {
  int64_t grp, n0;
  bool up;
};
__device__ __forceinline__ G8Tile g8_tile(const G8Params& p, int64_t item, int sub) {
  G8Tile t;
  t.grp = item / p.ipg;
  const int64_t i = item - t.grp * p.ipg;
  t.up = sub == 1;
  t.n0 = (t.up ? p.N / 2 : 0) + 8 * p.geo.tps * i;
  return t;
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(G8_NC) : "memory"); }
__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// x rows [M, K] of group grp → shared memory (consumer threads only), natural k order, row stride xrs
// bytes. bf16: bf16(x). fp8: f16(bf16(x) · 2^(14−E)) per 128-k block (E: exponent of the block's largest
// |x|; 16 consecutive lanes own a block's 16 units of 8 k), 2^(E−14) to fs[block · 8 + m] (v6's
// staging: a bf16 value then converts to f16 exactly down to 2^-31 of its block's max).
template <WFmt WF>
__device__ __forceinline__ void g8_stage_x(const G8Params& p, int64_t grp, uint8_t* xs, float* fs, int tid) {
  const int units = (int)(p.K / 8), total = p.M * units;  // units % 16 == 0
  const float* xb = p.x + grp * p.xg;
  for (int base = 0; base < total; base += G8_NC * 2) {
    float4 a[2], b[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int i = base + q * G8_NC + tid;
      a[q] = b[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < total) {
        const int m = i / units;
        const float* xr = xb + m * p.ldx + (int64_t)(i - m * units) * 8;
        a[q] = *reinterpret_cast<const float4*>(xr), b[q] = *reinterpret_cast<const float4*>(xr + 4);
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int i = base + q * G8_NC + tid;
      const int m = i / units, u = i - m * units;
      uint4 o;
      if constexpr (WF == WFmt::BF16) {
        o = x8_bf16(a[q], b[q]);
      } else {
        // (whole 16-lane groups are in or out of range: total % 16 == 0, and G8_NC % 16 == 0)
        float f;
        o = x8_f16_prescaled(a[q], b[q], f);
        if (i < total && u % 16 == 0) fs[(u / 16) * 8 + m] = f;
      }
      if (i < total) *reinterpret_cast<uint4*>(xs + (size_t)m * p.xrs + (size_t)u * 16) = o;
    }
  }
}

// One stage of a consumer warp: its tile j = warp / WPT of the stage (rows 8j..8j+7, row stride SB) and
// its piece pc = warp % WPT: bytes [256·pc, +256) of each row, 4 units of 64 bytes (fp8: 64 k, bf16:
// 32 k), each unit its own MMA chain from zero (four independent chains a stage); lane (g, t) reads bytes
// +16t of unit u of weight row g (the MMA's column g) and the same k of x row g (the MMA's row g; rows
// ≥ M are zero). fp8: a unit lies in one 128-k scale block: acc += s·f·chain. kst: the stage's first k.
// acc[j]: x row g, weight row 2t + j of the tile.
template <WFmt WF>
__device__ __forceinline__ void g8_stage(const uint8_t* st, const G8Geo& geo, int warp, int g, int t, int64_t kst,
                                         const uint8_t* xrow, const float* fs, float (&acc)[2]) {
  const int j = warp / geo.wpt, pc = warp - j * geo.wpt;
  const uint8_t* rw = st + (8 * j + g) * geo.sb + 256 * pc + 16 * t;
  uint4 w[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) w[u] = lds128(rw + 64 * u);
  if constexpr (WF == WFmt::BF16) {
    const int64_t kw = kst + 128 * pc;  // the piece's first k
    float c[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      // unit u: k [kw + 32u, +32); lane t's 8 k at +8t; MMA i takes weight words 2i, 2i + 1
      const uint4 X = xrow ? lds128(xrow + 2 * (kw + 32 * u + 8 * t)) : make_uint4(0, 0, 0, 0);
      c[u][0] = c[u][1] = c[u][2] = c[u][3] = 0.0f;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        mma16816(c[u], u4get(X, 2 * i), 0u, u4get(X, 2 * i + 1), 0u, u4get(w[u], 2 * i), u4get(w[u], 2 * i + 1));
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[0] += c[u][0], acc[1] += c[u][1];
  } else {
    const int64_t kw = kst + 256 * pc;
    const float* scs = reinterpret_cast<const float*>(st + 8 * geo.tps * geo.sb);  // the stage's block scales
    float c[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      // unit u: k [kw + 64u, +64); lane t's 16 k at +16t; MMA i takes weight word i (k 4i..4i+3) as B
      // (pairs (4i, 4i+1), (4i+2, 4i+3)) against x words 2(i%2), 2(i%2)+1 of X[i/2] as A
      uint4 X[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (xrow) {
        const uint8_t* xp = xrow + 2 * (kw + 64 * u + 16 * t);
        X[0] = lds128(xp), X[1] = lds128(xp + 16);
      }
      c[u][0] = c[u][1] = c[u][2] = c[u][3] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t b0, b1;
        e4m3x4_f16(u4get(w[u], i), b0, b1);
        mma16816_f16(c[u], u4get(X[i / 2], 2 * (i % 2)), 0u, u4get(X[i / 2], 2 * (i % 2) + 1), 0u, b0, b1);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t kb = (kw + 64 * u) / 128;
      const float f = scs[kb - kst / 128] * fs[kb * 8 + g];
      acc[0] = fmaf(f, c[u][0], acc[0]), acc[1] = fmaf(f, c[u][1], acc[1]);
    }
  }
}

template <WFmt WF, bool FUSE>
__global__ void __launch_bounds__(G8_NT, 1) gemv8_kernel(const G8Params p) {
  // No DI_PDL_WAIT first: the producer requests the first R stages of weights (constant) before any wait;
  // the consumers wait before they read x (written by the previous kernel).
  extern __shared__ __align__(128) uint8_t g8_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(g8_smem);
  uint64_t* empty = full + G8_RMAX;
  float* red = reinterpret_cast<float*>(g8_smem + G8_OFF_RED);    // [2][16 warps][64]
  float* gate = reinterpret_cast<float*>(g8_smem + G8_OFF_GATE);  // [TPS · 64] fused: the gate tiles' sums
  float* fs = reinterpret_cast<float*>(g8_smem + G8_OFF_FS);      // [G8_FS][8] fp8 x factors
  uint8_t* xs = g8_smem + G8_OFF_X;                               // [M][xrs]
  uint8_t* ring = g8_smem + p.xoff;                               // [R][stage_bytes]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const G8Geo geo = p.geo;
  const int64_t i0 = (int64_t)blockIdx.x * p.items / gridDim.x, i1 = (int64_t)(blockIdx.x + 1) * p.items / gridDim.x;
  const int64_t nst = (i1 - i0) * p.tpi * geo.spt;  // stages of this block
  const int64_t rowb = WF == WFmt::BF16 ? 2 * p.K : p.K;
  if (tid == 0) {
    for (int i = 0; i < p.R; ++i) mbar_init(smem_u32(&full[i]), 1), mbar_init(smem_u32(&empty[i]), G8_CW);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the inits, seen by the copy engine
  }
  __syncthreads();

  if (warp == G8_CW) {  // the producer: lane 0 issues every stage of the block's range in order
    if (lane == 0) {
      const int sb = geo.sb;
      const uint32_t sc_bytes = WF == WFmt::FP8_B128 ? (uint32_t)(sb / 128) * 4 : 0;
      const uint32_t wbytes = (uint32_t)(8 * geo.tps * sb);
      for (int64_t q = 0; q < nst; ++q) {
        const int slot = (int)(q % p.R);
        if (q >= p.R) mbar_wait(smem_u32(&empty[slot]), (uint32_t)((q / p.R - 1) & 1));
        const int64_t tq = q / geo.spt;  // tile group of the block's range
        const int s = (int)(q - tq * geo.spt);
        const G8Tile tl = g8_tile(p, i0 + tq / p.tpi, (int)(tq % p.tpi));
        const uint32_t bar = smem_u32(&full[slot]);
        const uint32_t dst = smem_u32(ring + (size_t)slot * p.stage_bytes);
        const uint8_t* src = p.w + tl.grp * p.wg + tl.n0 * rowb + (int64_t)s * sb;
        mbar_expect(bar, wbytes + sc_bytes);
        if (sb == rowb) {  // whole rows: the stage's 8·TPS rows are contiguous, one copy
          bulk_load(dst, src, wbytes, bar);
        } else {
          for (int r = 0; r < 8; ++r) bulk_load(dst + r * sb, src + r * rowb, sb, bar);
        }
        if constexpr (WF == WFmt::FP8_B128)  // (8·TPS ≤ 32 rows: one 128-row scale block)
          bulk_load(dst + wbytes, p.ws + tl.grp * p.sg + ((tl.n0 / 128) * p.ldws + (int64_t)s * (sb / 128)) * 4,
                    sc_bytes, bar);
        if (q + 1 == std::min<int64_t>(p.R, nst)) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
      }
    } else {
      asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
    return;
  }

  // consumers (warps 0..15)
  DI_PDL_WAIT();
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* xrow = g < p.M ? xs + (size_t)g * p.xrs : nullptr;
  int64_t staged = -1, q = 0;
  int par = 0;
  for (int64_t it = i0; it < i1; ++it) {
    for (int sub = 0; sub < p.tpi; ++sub) {
      const G8Tile tl = g8_tile(p, it, sub);
      if (tl.grp != staged) {  // (every warp is past the last tile group's barrier: x is free)
        g8_stage_x<WF>(p, tl.grp, xs, fs, tid);
        consumers_sync();
        staged = tl.grp;
      }
      float acc[2] = {0.0f, 0.0f};
      for (int s = 0; s < geo.spt; ++s, ++q) {
        const int slot = (int)(q % p.R);
        mbar_wait(smem_u32(&full[slot]), (uint32_t)((q / p.R) & 1));
        const int64_t kst = (int64_t)s * (WF == WFmt::BF16 ? geo.sb / 2 : geo.sb);
        g8_stage<WF>(ring + (size_t)slot * p.stage_bytes, geo, warp, g, t, kst, xrow, fs, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));
      }
      // the tile group's sums: for tile j, its WPT warps in order. Element e = 64j + 2·lane + j2: x row
      // m = (e % 64) / 8, weight row 8j + (e / 2) % 4 · 2 + j2
      float* rp = red + par * (G8_CW * 64);
      rp[warp * 64 + 2 * lane] = acc[0], rp[warp * 64 + 2 * lane + 1] = acc[1];
      consumers_sync();
      if (tid < 64 * geo.tps) {
        const int j = tid >> 6, e = tid & 63;
        float v = rp[j * geo.wpt * 64 + e];
        for (int w = 1; w < geo.wpt; ++w) v += rp[(j * geo.wpt + w) * 64 + e];
        const int m = e >> 3, row = 8 * j + 2 * ((e >> 1) & 3) + (e & 1);
        if constexpr (FUSE) {
          if (!tl.up) gate[tid] = v;  // (read back by this thread for the up tiles)
          else if (m < p.M) p.y[m * p.ldy + (tl.n0 - p.N / 2) + row] = detail::swiglu_clamp_one(gate[tid], v, p.lim, 1.0f);
        } else {
          if (m < p.M) p.y[tl.grp * p.yg + m * p.ldy + tl.n0 + row] = v;
        }
      }
      par ^= 1;  // red[par] is rewritten two tile groups later, after another barrier
    }
  }
}

struct G8Layout {
  int R, stage_bytes, xrs, xoff;
  size_t smem;
};
G8Layout g8_layout(WFmt f, int64_t K, int M, int ring) {
  G8Layout l;
  const G8Geo geo = g8_geo(f, K);
  l.stage_bytes = (int)cdiv(G8_STAGE + (f == WFmt::FP8_B128 ? (geo.sb / 128) * 4 : 0), 128) * 128;
  // x row stride ≡ 16 (fp8: lanes read 32 bytes at 32t) / 64 (bf16: 16 bytes at 16t) mod 128: conflict-free
  l.xrs = (int)(2 * K + (f == WFmt::BF16 ? 64 : 16));
  l.xoff = (int)cdiv((int64_t)G8_OFF_X + (int64_t)M * l.xrs, 128) * 128;
  const int64_t room = ((int64_t)G8_SMEM_MAX - l.xoff) / l.stage_bytes;
  l.R = (int)std::min<int64_t>({(int64_t)ring, (int64_t)G8_RMAX, room});
  l.smem = (size_t)l.xoff + (size_t)std::max(l.R, 0) * l.stage_bytes;
  return l;
}

}  // namespace

bool gemv_q_v8_supported(WFmt f, int64_t N, int64_t K) {
  const int64_t rowb = f == WFmt::BF16 ? 2 * K : K;
  if (!((f == WFmt::BF16 || f == WFmt::FP8_B128) && K > 0 && K <= G8_KMAX && rowb % 1024 == 0)) return false;
  // whole tile groups of 8·TPS rows, also for the fused SwiGLU's halves
  return N > 0 && N % (16 * g8_geo(f, K).tps) == 0 && g8_layout(f, K, 8, 2).R >= 2;
}

static cudaError_t g8_run(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, int G, int64_t xg, int64_t yg, int64_t wg, int64_t sg, cudaStream_t s,
                          const GemvPlan* plan, bool grouped, int ring, bool swiglu, float limit) {
  if (!gemv_q_v8_supported(W.fmt, N, K)) return cudaErrorNotSupported;
  if (swiglu && (limit <= 0.0f || G != 1)) return cudaErrorNotSupported;
  if (ldx % 4 || xg % 4 || wg % 16 || sg % 16 || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(W.w) % 16 || G < 1)
    return cudaErrorInvalidValue;
  if (W.fmt == WFmt::FP8_B128 &&
      (!W.scale || W.ldws < K / 128 || W.ldws % 4 || reinterpret_cast<uintptr_t>(W.scale) % 16))
    return cudaErrorInvalidValue;  // (scale rows are read by 16-byte bulk copies)
  if (M <= 0) return cudaSuccess;
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
  G8Params p = {};
  p.ldx = ldx;
  p.w = static_cast<const uint8_t*>(W.w), p.ws = static_cast<const uint8_t*>(W.scale), p.ldws = W.ldws;
  p.N = N, p.K = K, p.ldy = ldy;
  p.xg = xg, p.yg = yg, p.wg = wg, p.sg = sg;
  p.tpi = swiglu ? 2 : 1;
  p.geo = g8_geo(W.fmt, K);
  p.ipg = N / (8 * p.geo.tps) / p.tpi;
  p.items = p.ipg * G;
  p.lim = limit;
  const unsigned grid = (unsigned)std::min<int64_t>(p.items, std::max(sms, 1));
  for (int64_t m0 = 0; m0 < M; m0 += 8) {  // rows are independent: 8 at a time
    p.x = x + m0 * ldx, p.y = y + m0 * ldy;
    p.M = (int)std::min<int64_t>(8, M - m0);
    const G8Layout l = g8_layout(W.fmt, K, p.M, ring > 0 ? ring : 4);  // default: 4 stages of 32 KiB
    if (l.R < 2) return cudaErrorNotSupported;
    p.R = l.R, p.stage_bytes = l.stage_bytes, p.xrs = l.xrs, p.xoff = l.xoff;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid, 1, 1);
    cfg.blockDim = dim3(G8_NT, 1, 1);
    cfg.dynamicSmemBytes = l.smem;
    cfg.stream = s;
    const cudaError_t e =
        swiglu ? (W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv8_kernel<WFmt::BF16, true>, p)
                                      : cudaLaunchKernelEx(&cfg, gemv8_kernel<WFmt::FP8_B128, true>, p))
               : (W.fmt == WFmt::BF16 ? cudaLaunchKernelEx(&cfg, gemv8_kernel<WFmt::BF16, false>, p)
                                      : cudaLaunchKernelEx(&cfg, gemv8_kernel<WFmt::FP8_B128, false>, p));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gemv_q_v8(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan) {
  return g8_run(x, M, K, ldx, W, N, y, ldy, 1, 0, 0, 0, 0, s, plan, false, 0, false, 0.0f);
}
cudaError_t gemv_q_v8_ring(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                           int64_t ldy, cudaStream_t s, int ring) {
  return g8_run(x, M, K, ldx, W, N, y, ldy, 1, 0, 0, 0, 0, s, nullptr, false, ring, false, 0.0f);
}
bool gemv_q_v8_swiglu_ok(WFmt f, int64_t N, int64_t K) { return gemv_q_v8_supported(f, N, K); }
cudaError_t gemv_q_v8_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan) {
  return g8_run(x, M, K, ldx, W, N, act, lda, 1, 0, 0, 0, 0, s, plan, false, 0, true, limit);
}
cudaError_t gemv_q_v8_groups(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t w_stride,
                             int64_t s_stride, int G, int64_t N, float* y, int64_t ldy, cudaStream_t s,
                             const GemvPlan* plan) {
  return g8_run(x, M, K, ldx, W, N, y, ldy, G, K, N, w_stride, W.fmt == WFmt::FP8_B128 ? s_stride : 0, s, plan, true,
                0, false, 0.0f);
}

namespace detail {
cudaError_t init_attributes_gemv_q_v8() {
  return first_error({set_max_dynamic_smem(gemv8_kernel<WFmt::BF16, false>, G8_SMEM_MAX),
                      set_max_dynamic_smem(gemv8_kernel<WFmt::FP8_B128, false>, G8_SMEM_MAX),
                      set_max_dynamic_smem(gemv8_kernel<WFmt::BF16, true>, G8_SMEM_MAX),
                      set_max_dynamic_smem(gemv8_kernel<WFmt::FP8_B128, true>, G8_SMEM_MAX)});
}
}  // namespace detail

}  // namespace deepinfer::cuda
