#pragma once
// Small device helpers shared by the CUDA kernels (not a public header).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

// First statement of every kernel: programmatic dependent launch. In a step graph CudaBackend makes the
// edges between our kernels programmatic, so a kernel's blocks may start while its predecessor runs;
// they wait here, before touching any memory another kernel writes, until the predecessors are complete
// and their writes visible (so the order of reads and writes is that of the stream). Right after the
// wait the kernel lets its own successor launch (launch_dependents: it takes effect once every block of
// this grid has passed it or exited, so this grid is wholly resident and the successor cannot take its
// SMs away): the successor's blocks are placed, and may start reading their weights (constant memory of
// the model, see the GEMVs' prologues), while this kernel computes; at most two kernels of a chain
// overlap. Both are no-ops for an ordinary launch.
#define DI_PDL_WAIT() asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory")

namespace deepinfer::cuda::detail {

inline cudaError_t last_error() { return cudaGetLastError(); }

// Loads of constant data (weights, scales) that a kernel issues before griddepcontrol.wait, so they stream
// while the previous kernel still runs. Not .nc: with .nc loads ptxas hoisted the wait above them (nvcc 13.0,
// the SASS of session 4's gemv_q_v5: ACQBULK first), which would keep the stream from starting before the
// previous kernel ends; inline PTX, volatile, so that they stay where they are written. _f4 / _u4_l2: read once,
// not kept in L1; _u4_l2 also asks L2 for the whole 256-byte span (the warp reads the rest of it next).
__device__ __forceinline__ float ld_early_f32(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ld_early_f4(const float* p) {
  float4 v;
  asm volatile("ld.global.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_early_u4_l2(const void* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// DeepSeek's activation quantization (act_quant) of one 128-value block held by a warp, 4 values a lane: the
// block's scale exponent e = ceil(log2(max(amax, 1e-4) / 448)), from the bits (exact); the scale is 2^e and the
// e4m3 codes are x·2^-e. (quant_act_kernel in gemm_dq.cu, moe_gemv2_fp8's x staging.)
__device__ __forceinline__ int act_scale_exp(float amax) {
  const uint32_t bits = __float_as_uint(fmaxf(amax, 1e-4f) / 448.0f);
  return (int)((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) ? 1 : 0);
}
__device__ __forceinline__ int act_block_exp(const float4& v) {
  return act_scale_exp(warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)))));
}
// Block-wide sum of one float; all threads get the result. `red` holds ≥ 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.0f;
  return warp_sum(t);
}
// One row of rms_norm, in pieces shared by the kernels that must give the same bits: thread (or lane) τ holds the
// float4s at 4τ + SPAN·c, c < NC — SPAN = 128 for a warp a row (elementwise.cu's rms_norm_warp_reg_kernel<NC>,
// D ≤ 128·NC), 1024 for a 256-thread block a row (rms_norm_reg_kernel<NC>, D ≤ 1024·NC); rows 16-byte aligned.
// rms_norm_part: the loads and τ's sum of squares; then warp_sum / block_sum, r = rsqrt(ss/D + eps);
// rms_norm_out: y = w·(x·r) (w null: x·r) and yb (if given) y in bf16. hc_dec_kernel's fused norm runs these pieces
// on the row it collapsed, so the fused and the separate norm give the same bits.
template <int NC, int SPAN>
__device__ __forceinline__ float rms_norm_part(const float* xr, int64_t D, const float* __restrict__ w, int tau,
                                               float4 (&v)[NC], float4 (&g)[NC]) {
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int64_t i = tau * 4 + (int64_t)c * SPAN;
    if (i < D) {
      v[c] = *reinterpret_cast<const float4*>(xr + i);
      if (w) g[c] = __ldg(reinterpret_cast<const float4*>(w + i));
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < NC; ++c)
    if (tau * 4 + (int64_t)c * SPAN < D) ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
  return ss;
}
template <int NC, int SPAN>
__device__ __forceinline__ void rms_norm_out(const float4 (&v)[NC], const float4 (&g)[NC], bool has_w, float r,
                                             int64_t D, int tau, float* yr, __nv_bfloat16* __restrict__ ybr) {
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int64_t i = tau * 4 + (int64_t)c * SPAN;
    if (i < D) {
      float4 o = v[c];
      if (has_w) {
        o.x = g[c].x * (o.x * r), o.y = g[c].y * (o.y * r), o.z = g[c].z * (o.z * r), o.w = g[c].w * (o.w * r);
      } else {
        o.x *= r, o.y *= r, o.z *= r, o.w *= r;
      }
      *reinterpret_cast<float4*>(yr + i) = o;
      if (ybr) {
        *reinterpret_cast<__nv_bfloat162*>(ybr + i) = __floats2bfloat162_rn(o.x, o.y);
        *reinterpret_cast<__nv_bfloat162*>(ybr + i + 2) = __floats2bfloat162_rn(o.z, o.w);
      }
    }
  }
}
template <int NC>
__device__ __forceinline__ void rms_norm_row_warp(const float* xr, int64_t D, const float* __restrict__ w, float eps,
                                                  float* yr, __nv_bfloat16* __restrict__ ybr, int lane) {
  float4 v[NC], g[NC];
  const float ss = warp_sum(rms_norm_part<NC, 128>(xr, D, w, lane, v, g));
  rms_norm_out<NC, 128>(v, g, w != nullptr, rsqrtf(ss / (float)D + eps), D, lane, yr, ybr);
}
template <int NC>
__device__ __forceinline__ void rms_norm_row_256(const float* xr, int64_t D, const float* __restrict__ w, float eps,
                                                 float* yr, __nv_bfloat16* __restrict__ ybr, float* red) {
  float4 v[NC], g[NC];
  const float ss = block_sum(rms_norm_part<NC, 1024>(xr, D, w, (int)threadIdx.x, v, g), red);
  rms_norm_out<NC, 1024>(v, g, w != nullptr, rsqrtf(ss / (float)D + eps), D, (int)threadIdx.x, yr, ybr);
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  __nv_fp8_e4m3 v;
  v.__x = b;
  return (float)v;
}
// E2M1 nibble → value (bit 3 = sign), from the bits: no table (a run-time-indexed table lands in local
// memory and made the first FP4 GEMM 20× slower than bf16). 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_f32(uint32_t nib) {
  const uint32_t m = nib & 7u, e = m >> 1, f = m & 1u;
  const uint32_t bits = e ? (((e + 126u) << 23) | (f << 22)) : (f ? 0x3f000000u : 0u);
  return __uint_as_float(bits | ((nib & 8u) << 28));
}
// 2^(b − 127) for an e8m0 byte (255 = NaN).
__device__ __forceinline__ float e8m0_to_f32(uint8_t b) {
  if (b == 255) return __int_as_float(0x7fc00000);
  if (b == 0) return __int_as_float(0x00400000);  // 2^-127 (subnormal)
  return __int_as_float((int)b << 23);
}

// Clamped SwiGLU of one element: silu(min(g, lim)) · clamp(u, ±lim) · s. The one definition used by
// swiglu_clamp and by gemv_q_grouped's fused epilogue, so both give the same bits.
__device__ __forceinline__ float swiglu_clamp_one(float g, float u, float lim, float s) {
  const float a = fminf(g, lim);
  const float v = fminf(fmaxf(u, -lim), lim);
  return (a / (1.0f + expf(-a))) * v * s;
}

// Float → unsigned key whose unsigned order is the float order (NaN sorts high; callers avoid NaN).
// −0 and +0 get one key: they compare equal, so a tie between them goes to the lower index as on the CPU.
__device__ __forceinline__ uint32_t f32_order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace deepinfer::cuda::detail
