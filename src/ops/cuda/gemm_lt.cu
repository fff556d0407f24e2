// cuBLASLt GEMMs: the bf16 baseline and the FP8 block-scaled path (1×128 activation scales,
// 128×128 weight scales). Row-major y = x·Wᵀ is computed as the column-major product
// yᵀ[N, M] = W[N, K]·xᵀ, i.e. A = W (transposed, K-contiguous rows), B = x.
#include <cublasLt.h>

#include <cstdio>
#include <mutex>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {

struct GemmContext {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 64ull << 20;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  bool used_bf16_out = false;
  bool used_own_fallback = false;
};

__global__ void widen_rows(const bf16* __restrict__ x, int64_t N, float* __restrict__ y, int64_t ldy) {
  DI_PDL_WAIT();
  const int64_t m = blockIdx.x;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) y[m * ldy + i] = __bfloat162float(x[m * N + i]);
}

GemmContext* gemm_context_create() {
  auto* c = new GemmContext;
  if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
    delete c;
    return nullptr;
  }
  if (cudaMalloc(&c->workspace, c->workspace_bytes) != cudaSuccess) {
    cublasLtDestroy(c->lt);
    delete c;
    return nullptr;
  }
  return c;
}

void gemm_context_destroy(GemmContext* c) {
  if (!c) return;
  cudaFree(c->workspace);
  cudaFree(c->scratch);
  cublasLtDestroy(c->lt);
  delete c;
}

namespace {

struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

#define LT_TRY(x)                                     \
  do {                                                \
    cublasStatus_t st_ = (x);                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) {               \
      if (getenv("DEEPINFER_LT_VERBOSE"))             \
        fprintf(stderr, "cublasLt %d at %s:%d\n", (int)st_, __FILE__, __LINE__); \
      return cudaErrorNotSupported;                   \
    }                                                 \
  } while (0)

cudaError_t run_lt(GemmContext* ctx, LtDescs& d, const void* A, const void* B, void* C, cudaStream_t s) {
  LT_TRY(cublasLtMatmulPreferenceCreate(&d.pref));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ctx->workspace_bytes, sizeof(ctx->workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int n = 0;
  LT_TRY(cublasLtMatmulAlgoGetHeuristic(ctx->lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &n));
  if (n == 0) return cudaErrorNotSupported;
  const float alpha = 1.0f, beta = 0.0f;
  LT_TRY(cublasLtMatmul(ctx->lt, d.op, &alpha, A, d.a, B, d.b, &beta, C, d.c, C, d.c, &heur.algo, ctx->workspace,
                        ctx->workspace_bytes, s));
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemm_bf16_lt(GemmContext* ctx, const bf16* x, int64_t M, int64_t K, int64_t ldx, const bf16* w,
                         int64_t N, float* y, int64_t ldy, cudaStream_t s) {
  if (!ctx || M <= 0 || N <= 0 || K <= 0) return cudaErrorInvalidValue;
  LtDescs d;
  LT_TRY(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, K, N, K));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, K, M, ldx));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, N, M, ldy));
  return run_lt(ctx, d, w, x, y, s);
}

static cudaError_t fp8_lt_bf16_out(GemmContext* ctx, const uint8_t* xq, const float* xs_t, int64_t M, int64_t K,
                                   const uint8_t* wq, const float* ws, int64_t N, float* y, int64_t ldy,
                                   cudaStream_t s);

cudaError_t gemm_fp8_block_lt(GemmContext* ctx, const uint8_t* xq, const float* xs_t, int64_t M, int64_t K,
                              const uint8_t* wq, const float* ws, int64_t ldws, int64_t N, float* y, int64_t ldy,
                              cudaStream_t s) {
  if (!ctx || M <= 0 || N <= 0 || K <= 0 || K % 128) return cudaErrorInvalidValue;
  if (ldws != (((K / 128) + 3) / 4) * 4) return cudaErrorNotSupported;  // cuBLASLt's padded grid
  LtDescs d;
  LT_TRY(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof(amode)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof(bmode)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs_t, sizeof(xs_t)));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, K, N, K));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, K, M, K));
  LT_TRY(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, N, M, ldy));
  cudaError_t e = run_lt(ctx, d, wq, xq, y, s);
  if (e != cudaErrorNotSupported) return e;
  e = fp8_lt_bf16_out(ctx, xq, xs_t, M, K, wq, ws, N, y, ldy, s);
  if (e != cudaErrorNotSupported) return e;
  // cuBLASLt has no block-scaled kernel for this shape (seen for M = 1 on the H200, CUDA 13.0):
  // our own kernel, exact for power-of-two scales (DeepSeek's ue8m0 scales are).
  ctx->used_own_fallback = true;
  return gemm_dq(AFmt::FP8_V128, xq, xs_t, M, K, K, WeightRef{WFmt::FP8_B128, wq, ws, ldws}, N, y, ldy, s);
}

static cudaError_t fp8_lt_bf16_out(GemmContext* ctx, const uint8_t* xq, const float* xs_t, int64_t M, int64_t K,
                                   const uint8_t* wq, const float* ws, int64_t N, float* y, int64_t ldy,
                                   cudaStream_t s) {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cudaError_t e;
  // Some cuBLASLt versions offer block-scaled FP8 only with a 16-bit output: bf16 into the context's
  // scratch, then widen (one extra pass over y: 6 bytes an element).
  const size_t need = (size_t)M * N * sizeof(bf16);
  if (ctx->scratch_bytes < need) {
    cudaFree(ctx->scratch);
    ctx->scratch = nullptr;
    ctx->scratch_bytes = 0;
    if (cudaMalloc(&ctx->scratch, need) != cudaSuccess) return cudaErrorMemoryAllocation;
    ctx->scratch_bytes = need;
  }
  LtDescs d2;
  LT_TRY(cublasLtMatmulDescCreate(&d2.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof(amode)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof(bmode)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws)));
  LT_TRY(cublasLtMatmulDescSetAttribute(d2.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs_t, sizeof(xs_t)));
  LT_TRY(cublasLtMatrixLayoutCreate(&d2.a, CUDA_R_8F_E4M3, K, N, K));
  LT_TRY(cublasLtMatrixLayoutCreate(&d2.b, CUDA_R_8F_E4M3, K, M, K));
  LT_TRY(cublasLtMatrixLayoutCreate(&d2.c, CUDA_R_16BF, N, M, N));
  e = run_lt(ctx, d2, wq, xq, ctx->scratch, s);
  if (e != cudaSuccess) return e;
  ctx->used_bf16_out = true;
  widen_rows<<<(unsigned)M, 256, 0, s>>>((const bf16*)ctx->scratch, N, y, ldy);
  return cudaGetLastError();
}

bool gemm_fp8_lt_used_bf16_out(const GemmContext* c) { return c && c->used_bf16_out; }
bool gemm_fp8_lt_used_own_fallback(const GemmContext* c) { return c && c->used_own_fallback; }

}  // namespace deepinfer::cuda
