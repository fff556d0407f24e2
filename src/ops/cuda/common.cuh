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
// gemv_q_v5's SASS: ACQBULK first), which would keep the stream from starting before the previous kernel ends;
// inline PTX, volatile, so that they stay where they are written. _f4 / _u4: read once, not kept in L1;
// _u4_l2: also asks L2 for the whole 256-byte span (the warp reads the rest of it next).
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
__device__ __forceinline__ uint4 ld_early_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
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
