#pragma once
// Batch-invariant float32 GEMM for the CPU backend: y[M, N] = x[M, K] · W[N, K]ᵀ.
//
// Why not OpenBLAS: its result for a row depends on M (M = 1 goes to a GEMV kernel and small
// M·N·K to "small matrix" kernels, each with its own summation order; measured on OpenBLAS 0.3.21),
// so a sequence would give different logits alone and inside a batch. Here every output element is
// one sequential chain of fused multiply-adds over k = 0..K-1, whatever M, the thread count, or the
// vector width (AVX2 and the scalar fallback give bitwise the same numbers).
#include <cstdint>
#include <vector>

namespace deepinfer {

class ThreadPool;

// W repacked once at load into panels of kGemmNR output columns, k-major: panel p holds
// W[p·NR + j][k] at data[(p·K + k)·NR + j], zero-padded past N.
struct PackedMatrix {
  static constexpr int kNR = 16;
  int64_t N = 0, K = 0;
  std::vector<float> data;  // [ceil(N / NR), K, NR]
};

PackedMatrix pack_matrix(const float* w, int64_t N, int64_t K);

enum class GemmIsa { Auto, Scalar, Avx2 };

// y (row stride ldy) = x (row stride ldx) · Wᵀ. pool may be null (single thread). `isa` forces a
// kernel (tests use it to check that all kernels agree bitwise); Avx2 falls back to Scalar when
// the CPU lacks it.
void gemm_packed(const float* x, int64_t M, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy,
                 ThreadPool* pool, GemmIsa isa = GemmIsa::Auto);

// True when the AVX2+FMA kernel is in use on this CPU (else the scalar fma path).
bool gemm_uses_avx2();

}  // namespace deepinfer
