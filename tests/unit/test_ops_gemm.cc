// The CPU GEMM: correct against a float64 reference, and batch-invariant (a row's result does not
// depend on M, its position, the thread count or the kernel's vector width).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/gemm.h"
#include "util/thread_pool.h"

using namespace deepinfer;

namespace {
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
struct Shape {
  int64_t N, K;
};
const Shape kShapes[] = {{8, 64}, {16, 128}, {64, 64}, {192, 64}, {33, 17}, {512, 64}, {100, 300}, {1, 5}};
}  // namespace

TEST(Gemm, MatchesFloat64Reference) {
  ThreadPool pool(2);
  for (auto s : kShapes) {
    for (int64_t M : {1, 2, 5, 6, 7, 13, 64, 97}) {
      auto x = randn(M * s.K, 1), w = randn(s.N * s.K, 2);
      PackedMatrix p = pack_matrix(w.data(), s.N, s.K);
      std::vector<float> y(M * s.N);
      gemm_packed(x.data(), M, s.K, p, y.data(), s.N, &pool);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < s.K; ++k) {
            ref += (double)x[m * s.K + k] * w[n * s.K + k];
            mag += std::abs((double)x[m * s.K + k] * w[n * s.K + k]);
          }
          ASSERT_NEAR(y[m * s.N + n], ref, 1e-6 * mag + 1e-6) << "N=" << s.N << " K=" << s.K << " M=" << M;
        }
    }
  }
}

TEST(Gemm, RowResultIndependentOfBatchPositionThreadsAndIsa) {
  ThreadPool pool1(1), pool2(2);
  for (auto s : kShapes) {
    auto w = randn(s.N * s.K, 3);
    PackedMatrix p = pack_matrix(w.data(), s.N, s.K);
    auto row = randn(s.K, 4);
    std::vector<float> alone(s.N);
    gemm_packed(row.data(), 1, s.K, p, alone.data(), s.N, &pool1, GemmIsa::Scalar);
    for (int64_t M : {1, 2, 3, 6, 7, 12, 40, 150}) {
      auto x = randn(M * s.K, 5 + (uint32_t)M);
      const int64_t at = (M * 7) / 11;  // somewhere inside the batch
      std::memcpy(x.data() + at * s.K, row.data(), sizeof(float) * s.K);
      for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2})
        for (ThreadPool* pool : {&pool1, &pool2}) {
          std::vector<float> y(M * s.N);
          gemm_packed(x.data(), M, s.K, p, y.data(), s.N, pool, isa);
          ASSERT_EQ(0, std::memcmp(y.data() + at * s.N, alone.data(), sizeof(float) * s.N))
              << "N=" << s.N << " K=" << s.K << " M=" << M << " isa=" << (int)isa;
        }
    }
  }
}

TEST(Gemm, StridedInputAndOutput) {
  ThreadPool pool(2);
  const int64_t M = 9, N = 20, K = 30, ldx = 41, ldy = 27;
  auto x = randn(M * ldx, 7), w = randn(N * K, 8);
  PackedMatrix p = pack_matrix(w.data(), N, K);
  std::vector<float> y(M * ldy, 123.0f);
  gemm_packed(x.data(), M, ldx, p, y.data(), ldy, &pool);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += (double)x[m * ldx + k] * w[n * K + k];
      ASSERT_NEAR(y[m * ldy + n], ref, 1e-4);
    }
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], 123.0f) << "wrote past N";
  }
}
