// GEMV v8 (gemv_q_v8): decode GEMV y[M, N] = bf16(x)[M, K] · dequant(W)[N, K]ᵀ for M ≤ 8 rows a launch,
// bf16 and fp8 e4m3 (128×128 f32 block scales) weights. Design, byte counts and predictions:
// docs/cuda-notes.md, "GEMV v8". What changes against v6 (2–3× the measured streaming floor, Nsight: DRAM
// 8–29 %, waiting on loads) and v7 (~50 address instructions a 16-byte load in its SASS):
//
// * Weights move by bulk copies (cp.async.bulk, the copy engine) into a ring of R stages in shared
//   memory: a stage is 16 rows × 1 KiB of each row (contiguous 1 KiB pieces of HBM, not 64-byte pieces of
//   8 rows as v6's register loads), plus the stage's fp8 block scales. One producer thread issues them
//   (17 instructions a 16 KiB stage), so no register or issue slot holds the bytes in flight, and the
//   first R stages are requested before griddepcontrol.wait: the weights are constant, so in a step graph
//   they stream while the previous kernel still runs.
// * 8 consumer warps share each stage (warp w: 128 k of the stage, fp8 = one scale block); a lane reads
//   16 bytes of rows g and g + 8 from shared memory and runs m16n8k16 MMAs with the ≤ 8 x rows as the
//   n8 columns (fp8: hardware e4m3 → f16, x staged as f16 with v6's per-block power-of-two pre-scale;
//   bf16: as stored). A warp frees a stage with an mbarrier arrive, no block barrier a stage.
// * A block (one an SM) owns a contiguous range of 16-row tiles (groups: of (group, tile)); at a tile's
//   end the 8 warps' sums are added in warp order through shared memory (one named barrier a tile).
//
// Batch invariance: an output's sum is, per warp, its 128-k pieces in k order (fp8: an MMA chain over
// 128 k from zero, then one FMA into the warp's sum; bf16: one MMA chain), then warps 0..7 in order.
// That depends on K only; MMA column m depends on x row m only, so row m's bits are the same for every
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
using detail::cdiv, detail::u4get, detail::mma16816, detail::pack_bf16, detail::e4m3x4_f16;
using detail::smem_u32, detail::mbar_init, detail::mbar_expect, detail::mbar_wait, detail::bulk_load;

constexpr int G8_CW = 8;                  // consumer warps
constexpr int G8_NT = (G8_CW + 1) * 32;   // + one producer warp
constexpr int G8_SB = 1024;               // bytes of a row in a stage
constexpr int G8_RS = G8_SB + 64;         // a stage row in shared memory (≡ 64 mod 128: conflict-free reads)
constexpr int G8_RMAX = 16;               // ring stages at most
constexpr int G8_KMAX = 8192;             // x of 8 rows in shared memory (f16/bf16: 128 KiB at K = 8192)
constexpr int G8_FS = G8_KMAX / 128;      // fp8: x pre-scale factors a row
constexpr size_t G8_SMEM_MAX = 227 * 1024;
// fixed part of the dynamic shared memory: barriers, warp sums [2][8][128], gate sums [128], x factors
constexpr size_t G8_OFF_RED = 2 * G8_RMAX * 8, G8_OFF_GATE = G8_OFF_RED + 2 * G8_CW * 128 * 4,
                 G8_OFF_FS = G8_OFF_GATE + 128 * 4, G8_OFF_X = G8_OFF_FS + G8_FS * 8 * 4;

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
  int64_t items;           // tiles (fused: tile pairs) over all groups
  int64_t ipg;             // items a group
  int tpi;                 // tiles an item: 1, fused 2 (gate tile, then its up tile)
  int spt;                 // stages a tile (row bytes / 1 KiB)
  int R;                   // ring stages
  int stage_bytes;         // a ring stage: 16 rows × G8_RS + the fp8 scales, 128-byte multiple
  int xrs;                 // x row stride in shared memory, bytes
  int xoff;                // ring offset (after x), bytes
  float lim;               // fused SwiGLU: y[m, i] = swiglu_clamp(gate row i, up row I + i), I = N / 2
};

// The tile's first row and group. Fused: item = pair (gate rows 16i.., up rows I + 16i..).
struct G8Tile {
  int64_t grp, n0;
  bool up;
};
__device__ __forceinline__ G8Tile g8_tile(const G8Params& p, int64_t item, int sub) {
  G8Tile t;
  t.grp = item / p.ipg;
  const int64_t i = item - t.grp * p.ipg;
  t.up = sub == 1;
  t.n0 = p.tpi == 2 ? (t.up ? p.N / 2 : 0) + 16 * i : 16 * i;
  return t;
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
// c += A·B, m16n8k16, f16 in, f32 accumulate (fragment layout as mma16816).
__device__ __forceinline__ void mma16816_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// x rows [M, K] of group grp → shared memory (consumer threads only, tid < 256), natural k order, row
// stride xrs bytes. bf16: bf16(x). fp8: f16(bf16(x) · 2^(14−E)) per 128-k block (E: exponent of the
// block's largest |x|; 16 consecutive lanes own a block's 16 units of 8 k), 2^(E−14) to fs[block · 8 + m]
// (v6's staging: a bf16 value then converts to f16 exactly down to 2^-31 of its block's max).
template <WFmt WF>
__device__ __forceinline__ void g8_stage_x(const G8Params& p, int64_t grp, uint8_t* xs, float* fs, int tid) {
  const int units = (int)(p.K / 8), total = p.M * units;  // units % 16 == 0
  const float* xb = p.x + grp * p.xg;
  for (int base = 0; base < total; base += 256 * 4) {
    float4 a[4], b[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = base + q * 256 + tid;
      a[q] = b[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < total) {
        const int m = i / units;
        const float* xr = xb + m * p.ldx + (int64_t)(i - m * units) * 8;
        a[q] = *reinterpret_cast<const float4*>(xr), b[q] = *reinterpret_cast<const float4*>(xr + 4);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = base + q * 256 + tid;
      const int m = i / units, u = i - m * units;
      uint4 o;
      if constexpr (WF == WFmt::BF16) {
        o = make_uint4(pack_bf16(a[q].x, a[q].y), pack_bf16(a[q].z, a[q].w), pack_bf16(b[q].x, b[q].y),
                       pack_bf16(b[q].z, b[q].w));
      } else {
        float v[8] = {a[q].x, a[q].y, a[q].z, a[q].w, b[q].x, b[q].y, b[q].z, b[q].w};
        float mx = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__float2bfloat16_rn(v[j])), mx = fmaxf(mx, fabsf(v[j]));
        // (whole 16-lane groups are in or out of range: total % 16 == 0, and 256 · 4 % 16 == 0)
#pragma unroll
        for (int off = 8; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const int E = max((int)((__float_as_uint(mx) >> 23) & 0xFF) - 127, -110);  // zero / tiny blocks: −110
        const float upf = __uint_as_float((uint32_t)(127 + 14 - E) << 23);
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half2 hv = __floats2half2_rn(v[2 * j] * upf, v[2 * j + 1] * upf);
          h[j] = *reinterpret_cast<const uint32_t*>(&hv);
        }
        o = make_uint4(h[0], h[1], h[2], h[3]);
        if (i < total && u % 16 == 0) fs[(u / 16) * 8 + m] = __uint_as_float((uint32_t)(127 - 14 + E) << 23);
      }
      if (i < total) *reinterpret_cast<uint4*>(xs + (size_t)m * p.xrs + (size_t)u * 16) = o;
    }
  }
}

// One stage of a consumer warp: bytes [128·warp, +128) of each of the stage's 16 rows (fp8: 128 k = one
// scale block in two units of 64 k; bf16: 64 k in two units of 32 k); lane (g, t) reads bytes +16t (+64 a unit) of rows g, g + 8.
// kst: the stage's first k. xrow: x row g in shared memory, or null (g ≥ M: zero B columns).
template <WFmt WF>
__device__ __forceinline__ void g8_stage(const uint8_t* st, int warp, int g, int t, int64_t kst, const uint8_t* xrow,
                                         const float* fs, float (&acc)[4]) {
  const uint8_t* ra = st + g * G8_RS + 128 * warp + 16 * t;
  const uint8_t* rb = ra + 8 * G8_RS;
  if constexpr (WF == WFmt::BF16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // unit h: k [kst + 64·warp + 32h, +32); lane t's 8 k at +8t
      const uint4 w0 = lds128(ra + 64 * h), w1 = lds128(rb + 64 * h);
      const uint4 X = xrow ? lds128(xrow + 2 * (kst + 64 * warp + 32 * h + 8 * t)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        mma16816(acc, u4get(w0, 2 * i), u4get(w1, 2 * i), u4get(w0, 2 * i + 1), u4get(w1, 2 * i + 1), u4get(X, 2 * i),
                 u4get(X, 2 * i + 1));
    }
  } else {
    float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // unit h: k [kst + 128·warp + 64h, +64); lane t's 16 k at +16t; MMA i takes weight word i (k 4i..4i+3):
      // A pairs (4i, 4i+1), (4i+2, 4i+3) against x words 2(i%2), 2(i%2)+1 of X[i/2]
      const uint4 w0 = lds128(ra + 64 * h), w1 = lds128(rb + 64 * h);
      uint4 X[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (xrow) {
        const uint8_t* xp = xrow + 2 * (kst + 128 * warp + 64 * h + 16 * t);
        X[0] = lds128(xp), X[1] = lds128(xp + 16);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t a0, a1, a2, a3;
        e4m3x4_f16(u4get(w0, i), a0, a2);
        e4m3x4_f16(u4get(w1, i), a1, a3);
        mma16816_f16(blk, a0, a1, a2, a3, u4get(X[i / 2], 2 * (i % 2)), u4get(X[i / 2], 2 * (i % 2) + 1));
      }
    }
    // the block's scale (stage scales after the 16 rows: block warp of the stage) and x factors of rows 2t, 2t+1
    const float sc = reinterpret_cast<const float*>(st + 16 * G8_RS)[warp];
    const int64_t kb = kst / 128 + warp;
    const float2 f = *reinterpret_cast<const float2*>(fs + kb * 8 + 2 * t);
    const float f0 = sc * f.x, f1 = sc * f.y;
    acc[0] = fmaf(f0, blk[0], acc[0]), acc[1] = fmaf(f1, blk[1], acc[1]);
    acc[2] = fmaf(f0, blk[2], acc[2]), acc[3] = fmaf(f1, blk[3], acc[3]);
  }
}

template <WFmt WF, bool FUSE>
__global__ void __launch_bounds__(G8_NT, 1) gemv8_kernel(const G8Params p) {
  // No DI_PDL_WAIT first: the producer requests the first R stages of weights (constant) before any wait;
  // the consumers wait before they read x (written by the previous kernel).
  extern __shared__ __align__(128) uint8_t g8_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(g8_smem);
  uint64_t* empty = full + G8_RMAX;
  float* red = reinterpret_cast<float*>(g8_smem + G8_OFF_RED);    // [2][8 warps][128]
  float* gate = reinterpret_cast<float*>(g8_smem + G8_OFF_GATE);  // [128] fused: the gate tile's sums
  float* fs = reinterpret_cast<float*>(g8_smem + G8_OFF_FS);      // [G8_FS][8] fp8 x factors
  uint8_t* xs = g8_smem + G8_OFF_X;                               // [M][xrs]
  uint8_t* ring = g8_smem + p.xoff;                               // [R][stage_bytes]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t i0 = (int64_t)blockIdx.x * p.items / gridDim.x, i1 = (int64_t)(blockIdx.x + 1) * p.items / gridDim.x;
  const int64_t nst = (i1 - i0) * p.tpi * p.spt;  // stages of this block
  const int64_t rowb = WF == WFmt::BF16 ? 2 * p.K : p.K;
  if (tid == 0) {
    for (int i = 0; i < p.R; ++i) mbar_init(smem_u32(&full[i]), 1), mbar_init(smem_u32(&empty[i]), G8_CW);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the inits, seen by the copy engine
  }
  __syncthreads();

  if (warp == G8_CW) {  // the producer: lane 0 issues every stage of the block's range in order
    if (lane == 0) {
      const uint32_t tx = 16 * G8_SB + (WF == WFmt::FP8_B128 ? (G8_SB / 128) * 4 : 0);
      for (int64_t q = 0; q < nst; ++q) {
        const int slot = (int)(q % p.R);
        if (q >= p.R) mbar_wait(smem_u32(&empty[slot]), (uint32_t)((q / p.R - 1) & 1));
        const int64_t tq = q / p.spt;  // tile of the block's range
        const int s = (int)(q - tq * p.spt);
        const G8Tile tl = g8_tile(p, i0 + tq / p.tpi, (int)(tq % p.tpi));
        const uint32_t bar = smem_u32(&full[slot]);
        const uint32_t dst = smem_u32(ring + (size_t)slot * p.stage_bytes);
        const uint8_t* src = p.w + tl.grp * p.wg + tl.n0 * rowb + (int64_t)s * G8_SB;
        mbar_expect(bar, tx);
#pragma unroll 4
        for (int r = 0; r < 16; ++r) bulk_load(dst + r * G8_RS, src + r * rowb, G8_SB, bar);
        if constexpr (WF == WFmt::FP8_B128)
          bulk_load(dst + 16 * G8_RS,
                    p.ws + tl.grp * p.sg + ((tl.n0 / 128) * p.ldws + (int64_t)s * (G8_SB / 128)) * 4,
                    (G8_SB / 128) * 4, bar);
        if (q + 1 == std::min<int64_t>(p.R, nst)) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
      }
    } else {
      asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
    return;
  }

  // consumers (warps 0..7)
  DI_PDL_WAIT();
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* xrow = g < p.M ? xs + (size_t)g * p.xrs : nullptr;
  int64_t staged = -1, q = 0;
  int par = 0;
  for (int64_t it = i0; it < i1; ++it) {
    for (int sub = 0; sub < p.tpi; ++sub) {
      const G8Tile tl = g8_tile(p, it, sub);
      if (tl.grp != staged) {  // (every warp is past the last tile's barrier: x is free)
        g8_stage_x<WF>(p, tl.grp, xs, fs, tid);
        consumers_sync();
        staged = tl.grp;
      }
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int s = 0; s < p.spt; ++s, ++q) {
        const int slot = (int)(q % p.R);
        mbar_wait(smem_u32(&full[slot]), (uint32_t)((q / p.R) & 1));
        const int64_t kst = (int64_t)s * (WF == WFmt::BF16 ? G8_SB / 2 : G8_SB);
        g8_stage<WF>(ring + (size_t)slot * p.stage_bytes, warp, g, t, kst, xrow, fs, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));
      }
      // the tile's sums: warps in order. Fragment: acc 0, 1 = (row g, x rows 2t, 2t + 1), acc 2, 3 = row g + 8
      float* rp = red + par * (G8_CW * 128);
#pragma unroll
      for (int r = 0; r < 4; ++r) rp[warp * 128 + r * 32 + lane] = acc[r];
      consumers_sync();
      if (tid < 128) {
        float v = rp[tid];
#pragma unroll
        for (int w = 1; w < G8_CW; ++w) v += rp[w * 128 + tid];
        const int r = tid / 32, ln = tid % 32;
        const int row = (ln >> 2) + 8 * (r >> 1), m = 2 * (ln & 3) + (r & 1);
        if constexpr (FUSE) {
          if (!tl.up) gate[tid] = v;  // (read back by this thread for the up tile)
          else if (m < p.M) p.y[m * p.ldy + (tl.n0 - p.N / 2) + row] = detail::swiglu_clamp_one(gate[tid], v, p.lim, 1.0f);
        } else {
          if (m < p.M) p.y[tl.grp * p.yg + m * p.ldy + tl.n0 + row] = v;
        }
      }
      par ^= 1;  // red[par] is rewritten two tiles later, after another barrier
    }
  }
}

struct G8Layout {
  int R, stage_bytes, xrs, xoff;
  size_t smem;
};
G8Layout g8_layout(WFmt f, int64_t K, int M, int ring) {
  G8Layout l;
  l.stage_bytes = (int)cdiv(16 * G8_RS + (f == WFmt::FP8_B128 ? (G8_SB / 128) * 4 : 0), 128) * 128;
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
  return (f == WFmt::BF16 || f == WFmt::FP8_B128) && K > 0 && K <= G8_KMAX && rowb % G8_SB == 0 && N > 0 &&
         N % 16 == 0 && g8_layout(f, K, 8, 2).R >= 2;
}

static cudaError_t g8_run(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                          int64_t ldy, int G, int64_t xg, int64_t yg, int64_t wg, int64_t sg, cudaStream_t s,
                          const GemvPlan* plan, bool grouped, int ring, bool swiglu, float limit) {
  if (!gemv_q_v8_supported(W.fmt, N, K)) return cudaErrorNotSupported;
  if (swiglu && (N % 32 || limit <= 0.0f || G != 1)) return cudaErrorNotSupported;
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
  p.ipg = N / 16 / p.tpi;
  p.items = p.ipg * G;
  p.spt = (int)((W.fmt == WFmt::BF16 ? 2 * K : K) / G8_SB);
  p.lim = limit;
  const unsigned grid = (unsigned)std::min<int64_t>(p.items, std::max(sms, 1));
  for (int64_t m0 = 0; m0 < M; m0 += 8) {  // rows are independent: 8 at a time
    p.x = x + m0 * ldx, p.y = y + m0 * ldy;
    p.M = (int)std::min<int64_t>(8, M - m0);
    const G8Layout l = g8_layout(W.fmt, K, p.M, ring > 0 ? ring : 6);
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
bool gemv_q_v8_swiglu_ok(WFmt f, int64_t N, int64_t K) { return gemv_q_v8_supported(f, N, K) && N % 32 == 0; }
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
