#pragma once
// Each kernel file's part of init_kernel_attributes (cuda_ops.h): sets the function attributes of its
// big-shared-memory kernels on the current device. Defined next to the kernels (they are file-local).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>

namespace deepinfer::cuda::detail {
// Max dynamic shared memory of `kern`: `bytes`, capped at what the device allows next to the kernel's
// static shared memory (a launch that needs more then fails, as it would have without the attribute).
template <class Kern>
cudaError_t set_max_dynamic_smem(Kern* kern, size_t bytes) {
  int dev = 0, optin = 0;
  cudaFuncAttributes fa{};
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kern);
  if (e != cudaSuccess) return e;
  const size_t room = (size_t)optin > fa.sharedSizeBytes ? (size_t)optin - fa.sharedSizeBytes : 0;
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)std::min(bytes, room));
}
// The first error of a list of attribute calls.
inline cudaError_t first_error(std::initializer_list<cudaError_t> es) {
  for (cudaError_t e : es)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t init_attributes_gemv_q();
cudaError_t init_attributes_gemv_q_v6();
cudaError_t init_attributes_gemv_q_v8();
cudaError_t init_attributes_gemv_e4m3();
cudaError_t init_attributes_moe_grouped();
cudaError_t init_attributes_moe_fp8();
cudaError_t init_attributes_moe_gemv2();
cudaError_t init_attributes_attention_mma();
cudaError_t init_attributes_attention();
cudaError_t init_attributes_gemm_dq();
cudaError_t init_attributes_f32_ops();
cudaError_t init_attributes_hc();
cudaError_t init_attributes_indexer_mma();
cudaError_t init_attributes_sampler();
}  // namespace deepinfer::cuda::detail
