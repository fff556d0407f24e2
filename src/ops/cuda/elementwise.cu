// RMSNorm, interleaved RoPE, clamped SwiGLU and compressor softmax pooling (float32, op-table
// semantics of src/ops/cpu/cpu_backend.cc). Memory-bound: 16-byte accesses where the shape allows.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

#include <algorithm>

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

// One block per row; the row is read twice (sum of squares, then scale): the second read hits L1/L2.
__global__ void rms_norm_kernel(const float* x, int64_t D, int64_t ld, const float* __restrict__ w, float eps,
                                float* y, bf16* __restrict__ yb) {
  DI_PDL_WAIT();
  __shared__ float red[32];
  const int64_t m = blockIdx.x;
  const float* xr = x + m * ld;
  float* yr = y + m * ld;
  // float4 only on 16-byte aligned rows (x may be a column slice of a wider buffer)
  const bool vec = (D % 4 == 0) && (ld % 4 == 0) && ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 16 == 0) &&
                   (!w || (uintptr_t)w % 16 == 0);
  float ss = 0.0f;
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = detail::block_sum(ss, red);
  const float r = rsqrtf(ss / (float)D + eps);
  __syncthreads();
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      float4 v = *reinterpret_cast<const float4*>(xr + i);
      if (w) {
        const float4 g = *reinterpret_cast<const float4*>(w + i);
        v.x = g.x * (v.x * r), v.y = g.y * (v.y * r), v.z = g.z * (v.z * r), v.w = g.w * (v.w * r);
      } else {
        v.x *= r, v.y *= r, v.z *= r, v.w *= r;
      }
      *reinterpret_cast<float4*>(yr + i) = v;
      if (yb) {
        *reinterpret_cast<__nv_bfloat162*>(yb + m * D + i) = __floats2bfloat162_rn(v.x, v.y);
        *reinterpret_cast<__nv_bfloat162*>(yb + m * D + i + 2) = __floats2bfloat162_rn(v.z, v.w);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = w ? w[i] * (xr[i] * r) : xr[i] * r;
      yr[i] = v;
      if (yb) yb[m * D + i] = __float2bfloat16_rn(v);
    }
  }
}

// Many short rows (per-head q norm: D = 512, M = T·H): one warp a row.
__global__ void rms_norm_warp_kernel(const float* x, int64_t M, int64_t D, int64_t ld, const float* __restrict__ w,
                                     float eps, float* y, bf16* __restrict__ yb) {
  DI_PDL_WAIT();
  const int64_t m = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (m >= M) return;
  const float* xr = x + m * ld;
  float* yr = y + m * ld;
  float ss = 0.0f;
  for (int64_t i = lane * 4; i < D; i += 128) {
    const float4 v = *reinterpret_cast<const float4*>(xr + i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = detail::warp_sum(ss);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int64_t i = lane * 4; i < D; i += 128) {
    float4 v = *reinterpret_cast<const float4*>(xr + i);
    if (w) {
      const float4 g = *reinterpret_cast<const float4*>(w + i);
      v.x = g.x * (v.x * r), v.y = g.y * (v.y * r), v.z = g.z * (v.z * r), v.w = g.w * (v.w * r);
    } else {
      v.x *= r, v.y *= r, v.z *= r, v.w *= r;
    }
    *reinterpret_cast<float4*>(yr + i) = v;
    if (yb) {
      *reinterpret_cast<__nv_bfloat162*>(yb + m * D + i) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(yb + m * D + i + 2) = __floats2bfloat162_rn(v.z, v.w);
    }
  }
}

// smallk rms_norm: the same thread ↔ element mapping and the same sums as rms_norm_kernel (256 threads a
// row, float4 c of thread t at 4t + 1024c) and rms_norm_warp_kernel (a warp a row, 4·lane + 128c), with
// the row and the weights held in registers: every load of x and w is issued before the reduction, the
// row is read once. The two-pass kernels wait for their loads one loop trip at a time (loops of run-time
// length), which made a one-row decode norm cost 5–7 µs. Bitwise the results of the kernels they replace.
template <int NC>
__global__ void __launch_bounds__(256) rms_norm_reg_kernel(const float* x, int64_t D, int64_t ld,
                                                           const float* __restrict__ w, float eps, float* y,
                                                           bf16* __restrict__ yb) {
  DI_PDL_WAIT();
  __shared__ float red[32];
  const int64_t m = blockIdx.x;
  detail::rms_norm_row_256<NC>(x + m * ld, D, w, eps, y + m * ld, yb ? yb + m * D : nullptr, red);
}

// Warp-a-row twin (D ≤ 128·NC). WPB warps a block: 1 for a single decode row (no idle warps), 8 else.
template <int NC>
__global__ void rms_norm_warp_reg_kernel(const float* x, int64_t M, int64_t D, int64_t ld, const float* __restrict__ w,
                                         float eps, float* y, bf16* __restrict__ yb) {
  DI_PDL_WAIT();
  const int64_t m = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (m >= M) return;
  detail::rms_norm_row_warp<NC>(x + m * ld, D, w, eps, y + m * ld, yb ? yb + m * D : nullptr, threadIdx.x & 31);
}

// One interleaved RoPE pair rotated by the angle (cs, sn); rope_kernel and norm_rope_kernel share it
// (one expression, so one contraction into FMAs: the same bits).
__device__ __forceinline__ float2 rope_rotate(float2 p, float cs, float sn) {
  return make_float2(p.x * cs - p.y * sn, p.y * cs + p.x * sn);
}

// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim,
                            const int32_t* __restrict__ pos, const float* __restrict__ inv_freq, bool inverse) {
  DI_PDL_WAIT();
  const int half = rope_dim / 2;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= M * heads * half) return;
  const int i = (int)(t % half);
  const int64_t mh = t / half;
  const int h = (int)(mh % heads);
  const int64_t m = mh / heads;
  const float ang = (float)pos[m] * inv_freq[i];
  float sn, cs;
  sincosf(ang, &sn, &cs);
  if (inverse) sn = -sn;
  float2* v = reinterpret_cast<float2*>(x + m * ld + (int64_t)h * head_dim + (head_dim - rope_dim)) + i;
  *v = rope_rotate(*v, cs, sn);
}

// norm_rope: a warp per head vector of one of up to kNormRopeMax tensors (blocks of 4 warps; tensor t
// owns warps [first[t], first[t+1]) in (row, head) order). The norm has rms_norm_warp_reg_kernel's lane ↔
// element mapping (float4 at 4·lane + 128c) and sums, the rotation rope_kernel's angle and rope_rotate,
// so the result is bitwise that of rms_norm + rope (the model's unfused path on this backend). The rope
// pairs sit inside one lane's float4 (even offsets), so no data moves between lanes. A gather tensor
// (x_rows) only moves rows: x_rows[m] → out rows (copy_rows' bits trivially).
template <int NC>
__global__ void __launch_bounds__(128) norm_rope_kernel(NormRopeArgs a, int64_t M, const int32_t* __restrict__ pos,
                                                        float eps, bool inverse) {
  DI_PDL_WAIT();
  const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  // the tensor by constant indices only (a run-time index into the parameters would copy them all to
  // local memory)
  int t = 0;
#pragma unroll
  for (int k = 1; k <= kNormRopeMax; ++k) t += k <= a.n && gw >= a.first[k];
  if (t >= a.n) return;
  NormRopeTensor z = a.t[0];
  int64_t base = 0;
#pragma unroll
  for (int k = 1; k < kNormRopeMax; ++k)
    if (t == k) z = a.t[k], base = a.first[k];
  const int64_t mh = gw - base, m = mh / z.heads;
  const int h = (int)(mh % z.heads), D = z.head_dim;
  float* xr = z.x + (z.x_rows ? (int64_t)z.x_rows[m] : m) * z.ld + (int64_t)h * D;
  float4 v[NC], g[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int i = lane * 4 + c * 128;
    if (i < D) {
      v[c] = *reinterpret_cast<const float4*>(xr + i);
      if (z.w) g[c] = __ldg(reinterpret_cast<const float4*>(z.w + i));
    }
  }
  if (z.norm) {
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (lane * 4 + c * 128 < D) ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
    ss = detail::warp_sum(ss);
    const float r = rsqrtf(ss / (float)D + eps);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (z.w) {
        v[c].x = g[c].x * (v[c].x * r), v[c].y = g[c].y * (v[c].y * r);
        v[c].z = g[c].z * (v[c].z * r), v[c].w = g[c].w * (v[c].w * r);
      } else {
        v[c].x *= r, v[c].y *= r, v[c].z *= r, v[c].w *= r;
      }
    }
  }
  const int r0 = D - z.rope_dim;  // first rotated channel (even)
  const float p = z.rope_dim ? (float)pos[m] : 0.0f;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int i = lane * 4 + c * 128;
    if (i >= D) continue;
    if (z.rope_dim && i + 2 >= r0) {
      float sn, cs;
      if (i >= r0) {
        sincosf(p * z.inv_freq[(i - r0) / 2], &sn, &cs);
        if (inverse) sn = -sn;
        const float2 q = rope_rotate(make_float2(v[c].x, v[c].y), cs, sn);
        v[c].x = q.x, v[c].y = q.y;
      }
      sincosf(p * z.inv_freq[(i + 2 - r0) / 2], &sn, &cs);
      if (inverse) sn = -sn;
      const float2 q = rope_rotate(make_float2(v[c].z, v[c].w), cs, sn);
      v[c].z = q.x, v[c].w = q.y;
    }
    if (!z.x_rows) *reinterpret_cast<float4*>(xr + i) = v[c];  // a gather leaves x alone
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (!z.out[k]) continue;
      const int64_t row = z.out_rows[k] ? (int64_t)z.out_rows[k][m] : m;
      if (row >= 0) *reinterpret_cast<float4*>(z.out[k] + row * z.out_ld[k] + (int64_t)h * D + i) = v[c];
    }
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gu, int64_t M, int64_t I, float lim,
                              const float* __restrict__ rs, float* __restrict__ act, bf16* __restrict__ ab) {
  DI_PDL_WAIT();
  const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (t >= M * I) return;
  const int64_t m = t / I, i = t % I;
  const float4 g = *reinterpret_cast<const float4*>(gu + m * 2 * I + i);
  const float4 u = *reinterpret_cast<const float4*>(gu + m * 2 * I + I + i);
  const float s = rs ? rs[m] : 1.0f;
  const float gi[4] = {g.x, g.y, g.z, g.w}, ui[4] = {u.x, u.y, u.z, u.w};
  float o[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o[k] = detail::swiglu_clamp_one(gi[k], ui[k], lim, s);
  }
  if (act) *reinterpret_cast<float4*>(act + t) = make_float4(o[0], o[1], o[2], o[3]);
  if (ab) {
    *reinterpret_cast<__nv_bfloat162*>(ab + t) = __floats2bfloat162_rn(o[0], o[1]);
    *reinterpret_cast<__nv_bfloat162*>(ab + t + 2) = __floats2bfloat162_rn(o[2], o[3]);
  }
}

__global__ void compress_pool_kernel(const float* __restrict__ kv, const float* __restrict__ gate, int64_t W, int S,
                                     int d, float* __restrict__ out) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= W * d) return;
  const int64_t w = t / d;
  const int c = (int)(t % d);
  float mx = -INFINITY;
  for (int s = 0; s < S; ++s) mx = fmaxf(mx, gate[(w * S + s) * d + c]);
  float den = 0.0f, num = 0.0f;
  for (int s = 0; s < S; ++s) {
    const float g = gate[(w * S + s) * d + c];
    if (g == -INFINITY) continue;
    const float p = expf(g - mx);
    den += p;
    num += p * kv[(w * S + s) * d + c];
  }
  out[w * d + c] = num / den;
}

// smallk compress_pool: a block per (window, 32 columns). The S gate and kv rows of those columns are
// staged in shared memory by all 256 threads (every load in flight at once, instead of one dependent
// load per loop trip of a single thread: S = 128 at decode made one call ~19 µs); the 8 warps take the
// max over slot groups (order-free), then warp 0 runs each column's den / num chains in slot order with
// compress_pool_kernel's expressions: bitwise its results.
constexpr int CP_NT = 256, CP_C = 32, CP_MAXS = 128;  // S ≤ 128: 32 KiB of staging
__global__ void __launch_bounds__(CP_NT) compress_pool2_kernel(const float* __restrict__ kv,
                                                               const float* __restrict__ gate, int S, int d,
                                                               int64_t ncb, float* __restrict__ out) {
  DI_PDL_WAIT();
  __shared__ float gs[CP_MAXS][CP_C], ks[CP_MAXS][CP_C];
  __shared__ float mx_s[CP_NT / 32][CP_C];
  const int64_t w = blockIdx.x / ncb;
  const int c0 = (int)(blockIdx.x % ncb) * CP_C;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int c = c0 + lane;
  const int n = S * CP_C;
  for (int i0 = 0; i0 < n; i0 += 4 * CP_NT) {  // 4 rows of each a thread in flight, then the stores
    float gv[4], kvv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * CP_NT + t, sl = i / CP_C, cc = c0 + i % CP_C;
      if (i < n && cc < d) {
        const int64_t off = (w * S + sl) * (int64_t)d + cc;
        gv[q] = gate[off], kvv[q] = kv[off];
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * CP_NT + t;
      if (i < n && c0 + i % CP_C < d) gs[i / CP_C][i % CP_C] = gv[q], ks[i / CP_C][i % CP_C] = kvv[q];
    }
  }
  __syncthreads();
  float mx = -INFINITY;
  if (c < d)
    for (int sl = warp; sl < S; sl += CP_NT / 32) mx = fmaxf(mx, gs[sl][lane]);
  mx_s[warp][lane] = mx;
  __syncthreads();
  if (warp != 0 || c >= d) return;
#pragma unroll
  for (int q = 1; q < CP_NT / 32; ++q) mx = fmaxf(mx, mx_s[q][lane]);
  float den = 0.0f, num = 0.0f;
#pragma unroll 8
  for (int sl = 0; sl < S; ++sl) {
    const float g = gs[sl][lane];
    if (g == -INFINITY) continue;
    const float p = expf(g - mx);
    den += p;
    num += p * ks[sl][lane];
  }
  out[w * d + c] = num / den;
}

}  // namespace

cudaError_t rms_norm_v1(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y,
                        bf16* y_bf16, cudaStream_t s) {
  if (M <= 0) return cudaSuccess;
  if (D <= 1024 && D % 4 == 0 && ld % 4 == 0) {
    rms_norm_warp_kernel<<<(unsigned)cdiv(M * 32, 256), 256, 0, s>>>(x, M, D, ld, w, eps, y, y_bf16);
  } else {
    rms_norm_kernel<<<(unsigned)M, 256, 0, s>>>(x, D, ld, w, eps, y, y_bf16);
  }
  return cudaGetLastError();
}

int rms_norm_kind(int64_t D, int64_t ld, const void* x, const void* y, const void* w) {
  if (D <= 1024 && D % 4 == 0 && ld % 4 == 0)  // the warp kernel's shape condition (its float4 accesses assume
    return D <= 256 ? 1 : D <= 512 ? 2 : 3;     // aligned rows there too)
  // rms_norm_kernel's float4 condition, evaluated here so the register kernel only sees aligned rows
  const bool vec = (D % 4 == 0) && (ld % 4 == 0) && ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 16 == 0) &&
                   (!w || (uintptr_t)w % 16 == 0);
  if (!vec) return 0;
  return D <= 2048 ? 4 : D <= 4096 ? 5 : D <= 8192 ? 6 : 0;
}

cudaError_t rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y,
                     bf16* y_bf16, cudaStream_t s) {
  if (M <= 0) return cudaSuccess;
  const int kind = rms_norm_kind(D, ld, x, y, w);
  if (kind >= 1 && kind <= 3) {
    const int nt = M == 1 ? 32 : 256;
    const unsigned blocks = (unsigned)cdiv(M * 32, nt);
    if (kind == 1)
      rms_norm_warp_reg_kernel<2><<<blocks, nt, 0, s>>>(x, M, D, ld, w, eps, y, y_bf16);
    else if (kind == 2)
      rms_norm_warp_reg_kernel<4><<<blocks, nt, 0, s>>>(x, M, D, ld, w, eps, y, y_bf16);
    else
      rms_norm_warp_reg_kernel<8><<<blocks, nt, 0, s>>>(x, M, D, ld, w, eps, y, y_bf16);
    return cudaGetLastError();
  }
  if (kind == 4)
    rms_norm_reg_kernel<2><<<(unsigned)M, 256, 0, s>>>(x, D, ld, w, eps, y, y_bf16);
  else if (kind == 5)
    rms_norm_reg_kernel<4><<<(unsigned)M, 256, 0, s>>>(x, D, ld, w, eps, y, y_bf16);
  else if (kind == 6)
    rms_norm_reg_kernel<8><<<(unsigned)M, 256, 0, s>>>(x, D, ld, w, eps, y, y_bf16);
  else
    rms_norm_kernel<<<(unsigned)M, 256, 0, s>>>(x, D, ld, w, eps, y, y_bf16);
  return cudaGetLastError();
}

cudaError_t rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
                 const float* inv_freq, bool inverse, cudaStream_t s) {
  if (rope_dim % 2 || rope_dim > head_dim || ld % 2 || head_dim % 2) return cudaErrorInvalidValue;
  const int64_t n = M * heads * (rope_dim / 2);
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(x, M, ld, heads, head_dim, rope_dim, pos, inv_freq, inverse);
  return cudaGetLastError();
}

bool norm_rope_supported(const NormRopeTensor& z) {
  const auto al = [](const void* p) { return (uintptr_t)p % 16 == 0; };
  if (!z.x || z.heads < 1 || z.head_dim < 4 || z.head_dim > 1024 || z.head_dim % 4 || z.ld % 4 || !al(z.x)) return false;
  if (z.ld < (int64_t)z.heads * z.head_dim || (z.w && !al(z.w))) return false;
  if (z.rope_dim < 0 || z.rope_dim % 2 || z.rope_dim > z.head_dim || (z.rope_dim && !z.inv_freq)) return false;
  if (z.x_rows && (z.norm || z.rope_dim || z.rows < 0)) return false;
  for (int k = 0; k < 2; ++k)
    if (z.out[k] && (z.out_ld[k] % 4 || z.out_ld[k] < (int64_t)z.heads * z.head_dim || !al(z.out[k]))) return false;
  return true;
}

cudaError_t norm_rope(const NormRopeTensor* t, int n, int64_t M, const int32_t* pos, float eps, bool inverse,
                      cudaStream_t s) {
  if (n < 0 || n > kNormRopeMax || M < 0) return cudaErrorInvalidValue;
  NormRopeArgs a{};
  a.n = n;
  int D = 0;
  for (int i = 0; i < n; ++i) {
    if (!norm_rope_supported(t[i])) return cudaErrorInvalidValue;
    a.t[i] = t[i];
    a.first[i + 1] = a.first[i] + (t[i].x_rows ? t[i].rows : M) * t[i].heads;
    D = std::max(D, t[i].head_dim);
  }
  if (a.first[n] <= 0) return cudaSuccess;
  const unsigned blocks = (unsigned)cdiv(a.first[n], 4);  // 4 warps a block: a decode step's few rows spread
  if (D <= 128) norm_rope_kernel<1><<<blocks, 128, 0, s>>>(a, M, pos, eps, inverse);
  else if (D <= 256) norm_rope_kernel<2><<<blocks, 128, 0, s>>>(a, M, pos, eps, inverse);
  else if (D <= 512) norm_rope_kernel<4><<<blocks, 128, 0, s>>>(a, M, pos, eps, inverse);
  else norm_rope_kernel<8><<<blocks, 128, 0, s>>>(a, M, pos, eps, inverse);
  return cudaGetLastError();
}

cudaError_t swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale, float* act,
                         bf16* act_bf16, cudaStream_t s) {
  if (I % 4) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  swiglu_kernel<<<(unsigned)cdiv(M * I / 4, 256), 256, 0, s>>>(gu, M, I, limit, row_scale, act, act_bf16);
  return cudaGetLastError();
}

cudaError_t compress_pool_v1(const float* kv, const float* gate, int64_t W, int S, int d, float* out, cudaStream_t s) {
  if (W <= 0) return cudaSuccess;
  compress_pool_kernel<<<(unsigned)cdiv(W * d, 256), 256, 0, s>>>(kv, gate, W, S, d, out);
  return cudaGetLastError();
}

cudaError_t compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out, cudaStream_t s) {
  if (W <= 0 || d <= 0) return cudaSuccess;
  const int64_t ncb = cdiv(d, CP_C);
  // v1 for many windows of few slots (prefill CSA: W = T/4, S = 8): there its threads are all busy and a
  // block a 32-column window would stage 2 floats a thread. Same bits either way.
  if (S < 1 || S > CP_MAXS || (S < 32 && W * ncb > 1024) || W * ncb > 0x7fffffff)
    return compress_pool_v1(kv, gate, W, S, d, out, s);
  compress_pool2_kernel<<<(unsigned)(W * ncb), CP_NT, 0, s>>>(kv, gate, S, d, ncb, out);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda

namespace deepinfer::cuda {
namespace {
__global__ void f32_to_bf16_rows_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx, bf16* __restrict__ y) {
  DI_PDL_WAIT();
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y)
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < K; k += (int64_t)gridDim.x * blockDim.x)
      y[m * K + k] = __float2bfloat16_rn(x[m * ldx + k]);
}
}  // namespace

cudaError_t f32_to_bf16_rows(const float* x, int64_t M, int64_t K, int64_t ldx, bf16* y, cudaStream_t s) {
  if (M <= 0 || K <= 0) return cudaSuccess;
  const unsigned bx = (unsigned)std::min<int64_t>(detail::cdiv(K, 256), 64);
  f32_to_bf16_rows_kernel<<<dim3(bx, (unsigned)std::min<int64_t>(M, 65535)), 256, 0, s>>>(x, M, K, ldx, y);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
