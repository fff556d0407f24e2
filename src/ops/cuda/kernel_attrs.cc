// init_kernel_attributes (cuda_ops.h): once per device, from CudaBackend's constructor (and the op test),
// instead of attribute calls inside every launch.
#include "ops/cuda/kernel_attrs.h"

#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {

cudaError_t init_kernel_attributes() {
  using Init = cudaError_t (*)();
  const Init parts[] = {detail::init_attributes_gemv_q,        detail::init_attributes_moe_grouped,
                        detail::init_attributes_attention_mma, detail::init_attributes_attention,
                        detail::init_attributes_gemm_dq,       detail::init_attributes_f32_ops,
                        detail::init_attributes_hc,            detail::init_attributes_indexer_mma,
                        detail::init_attributes_gemv_q_v6,
                        detail::init_attributes_gemv_q_v8,
                        detail::init_attributes_moe_gemv2,       detail::init_attributes_gemv_e4m3,
                        detail::init_attributes_moe_fp8,       detail::init_attributes_sampler};
  for (Init f : parts)
    if (const cudaError_t e = f(); e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace deepinfer::cuda
