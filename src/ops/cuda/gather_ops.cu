// Index plumbing between device-side choices (top-k) and the ops that read them.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
__global__ void map_topk_kernel(const int32_t* __restrict__ idx, const int32_t* __restrict__ count, int topk,
                                const int32_t* __restrict__ rowmap, int64_t rowmap_ld,
                                const int64_t* __restrict__ out_off, int32_t* __restrict__ out) {
  DI_PDL_WAIT();
  const int64_t m = blockIdx.x;
  const int k = count[m];
  const int32_t* map = rowmap + m * rowmap_ld;
  for (int j = threadIdx.x; j < k; j += blockDim.x) out[out_off[m] + j] = map[idx[m * topk + j]];
}
__global__ void feed_tokens_kernel(int32_t* __restrict__ pack, int64_t T, int hc, const int32_t* __restrict__ feed,
                                   const int32_t* __restrict__ picks, int64_t V) {
  DI_PDL_WAIT();
  for (int64_t i = threadIdx.x; i < T; i += blockDim.x) {
    if (feed[i] < 0) continue;
    const int32_t p = picks[feed[i]], t = p >= 0 && p < V ? p : 0;
    pack[i] = t;
    for (int j = 0; j < hc; ++j) pack[T + i * hc + j] = t;
  }
}
}  // namespace

cudaError_t feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks, int64_t V,
                        cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  feed_tokens_kernel<<<1, 256, 0, s>>>(pack, T, hc, feed, picks, V);
  return cudaGetLastError();
}

cudaError_t map_topk(const int32_t* idx, const int32_t* count, int64_t M, int topk, const int32_t* rowmap,
                     int64_t rowmap_ld, const int64_t* out_off, int32_t* out, cudaStream_t s) {
  if (M <= 0) return cudaSuccess;
  map_topk_kernel<<<(unsigned)M, 256, 0, s>>>(idx, count, topk, rowmap, rowmap_ld, out_off, out);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
