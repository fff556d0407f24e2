// compress_emit: a compressor's closing windows, from its ring (and the step's projections) to the cache
// rows, in one kernel: compress_windows → compress_pool → rms_norm → rope → copy_rows (Backend::compress_emit).
// A decode step pools every sequence's current window and keeps only those that close (the others' row is
// −1); the five unfused launches were ~5 µs each of mostly launch latency in the step's graph.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

struct CeParams {
  const float *ring_kv, *ring_gate, *kv, *gate;
  int64_t ld, p0;
  const float* ape;
  int m, width, overlap;
  const int32_t *win_ids, *ring_rows;
  const float* norm_w;
  float eps;
  int rope_dim;
  const int32_t* pos;
  const float* inv_freq;
  float* dst;
  const int32_t* dst_rows;
};

constexpr int CE_MAXW = 1024, CE_MAXT = 512;  // widest row; threads a block (≤ 128 registers)

// A block a window: thread c pools column c over the S slots (compress_windows' sources and ape, then
// compress_pool2's max and its den / num chains in slot order), the pooled row goes to shared memory;
// warp 0 normalizes it with rms_norm_warp_reg_kernel<NC>'s lane mapping and sums (lane holds columns
// 4·lane + 128·c), applies rope_kernel's rotation to the trailing rope_dim channels and writes the row.
// The expressions are those of the unfused kernels (so the bits should be theirs; the op test reports it).
template <int NC>
__global__ void __launch_bounds__(CE_MAXT) compress_emit_kernel(const CeParams p) {
  DI_PDL_WAIT();
  __shared__ float4 row4[CE_MAXW / 4];
  float* row = reinterpret_cast<float*>(row4);
  const int64_t w = blockIdx.x;
  const int64_t dr = p.dst_rows ? (int64_t)p.dst_rows[w] : w;
  if (dr < 0) return;  // a window that does not close in this step (or a stand-in): nothing is written
  const int m = p.m, width = p.width;
  const int S = p.overlap ? 2 * m : m;
  const int64_t cw = (p.overlap ? 2 : 1) * (int64_t)width, R = p.overlap ? 2 * m : m;
  const int64_t win = p.win_ids[w], r0 = p.ring_rows ? p.ring_rows[w] : 0;
  // slot s of this window: its source row (ring or step projection), column and ape row; absent: the
  // overlap half of window 0 (kv 0, gate −inf in compress_windows)
  auto slot = [&](int s, int c, int64_t& off, bool& ring, int& j, int& col) -> bool {
    int64_t pp;
    if (!p.overlap) {
      j = s, pp = win * m + j, col = c;
    } else if (s < m) {
      j = s, pp = (win - 1) * m + j, col = c;
      if (win == 0) return false;
    } else {
      j = s - m, pp = win * m + j, col = width + c;
    }
    ring = pp < p.p0;
    off = ring ? (r0 + pp % R) * cw + col : (pp - p.p0) * p.ld + col;
    return true;
  };
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float mx = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < S; ++s) {
      int64_t off;
      bool ring;
      int j, col;
      float g = -INFINITY;
      if (slot(s, c, off, ring, j, col)) {
        g = ring ? p.ring_gate[off] : p.gate[off];
        g = p.ape ? g + p.ape[(int64_t)j * cw + col] : g;
      }
      mx = fmaxf(mx, g);
    }
    float den = 0.0f, num = 0.0f;
#pragma unroll 4
    for (int s = 0; s < S; ++s) {
      int64_t off;
      bool ring;
      int j, col;
      if (!slot(s, c, off, ring, j, col)) continue;  // gate −inf: skipped by the pool
      float g = ring ? p.ring_gate[off] : p.gate[off];
      g = p.ape ? g + p.ape[(int64_t)j * cw + col] : g;
      if (g == -INFINITY) continue;
      const float k = ring ? p.ring_kv[off] : p.kv[off];
      const float e = expf(g - mx);
      den += e;
      num += e * k;
    }
    row[c] = num / den;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float4 v[NC], g[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int i = lane * 4 + c * 128;
    if (i < width) {
      v[c] = row4[i / 4];
      if (p.norm_w) g[c] = __ldg(reinterpret_cast<const float4*>(p.norm_w + i));
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < NC; ++c)
    if (lane * 4 + c * 128 < width) ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
  ss = detail::warp_sum(ss);
  const float r = rsqrtf(ss / (float)width + p.eps);
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int i = lane * 4 + c * 128;
    if (i < width) {
      float4 o = v[c];
      if (p.norm_w) {
        o.x = g[c].x * (o.x * r), o.y = g[c].y * (o.y * r), o.z = g[c].z * (o.z * r), o.w = g[c].w * (o.w * r);
      } else {
        o.x *= r, o.y *= r, o.z *= r, o.w *= r;
      }
      row4[i / 4] = o;
    }
  }
  __syncwarp();
  const int half = p.rope_dim / 2;
  const float fp = half > 0 ? (float)p.pos[w] : 0.0f;
  for (int i = lane; i < half; i += 32) {
    const float ang = fp * p.inv_freq[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    float2* q = reinterpret_cast<float2*>(row + (width - p.rope_dim)) + i;
    const float2 a = *q;
    *q = make_float2(a.x * cs - a.y * sn, a.y * cs + a.x * sn);
  }
  __syncwarp();
  float4* out = reinterpret_cast<float4*>(p.dst + dr * width);
  for (int i = lane; i < width / 4; i += 32) out[i] = row4[i];
}

}  // namespace

cudaError_t compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate, int64_t ld,
                          int64_t p0, const float* ape, int m, int width, bool overlap, const int32_t* win_ids,
                          const int32_t* ring_rows, int64_t nw, const float* norm_w, float eps, int rope_dim,
                          const int32_t* pos, const float* inv_freq, float* dst, const int32_t* dst_rows,
                          cudaStream_t s) {
  if (width < 4 || width > CE_MAXW || width % 4 || m < 1 || rope_dim < 0 || rope_dim % 2 || rope_dim > width ||
      reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(norm_w) % 16 || nw > 0x7fffffff)
    return cudaErrorNotSupported;
  if (nw <= 0) return cudaSuccess;
  CeParams p;
  p.ring_kv = ring_kv, p.ring_gate = ring_gate, p.kv = kv, p.gate = gate, p.ld = ld, p.p0 = p0, p.ape = ape;
  p.m = m, p.width = width, p.overlap = overlap ? 1 : 0, p.win_ids = win_ids, p.ring_rows = ring_rows;
  p.norm_w = norm_w, p.eps = eps, p.rope_dim = rope_dim, p.pos = pos, p.inv_freq = inv_freq;
  p.dst = dst, p.dst_rows = dst_rows;
  const unsigned nt = (unsigned)std::min<int64_t>(CE_MAXT, cdiv(width, 32) * 32);  // a thread a column (or two)
  // NC: rms_norm's choice for this width (its warp kernel's float4 chunks a lane)
  if (width <= 256)
    compress_emit_kernel<2><<<(unsigned)nw, nt, 0, s>>>(p);
  else if (width <= 512)
    compress_emit_kernel<4><<<(unsigned)nw, nt, 0, s>>>(p);
  else
    compress_emit_kernel<8><<<(unsigned)nw, nt, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
