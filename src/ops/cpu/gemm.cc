#include "ops/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/thread_pool.h"

namespace deepinfer {
namespace {

constexpr int NR = PackedMatrix::kNR;
constexpr int MR = 6;      // rows per micro-tile: 6 × 2 accumulators of 8 lanes = 12 ymm
constexpr int64_t KC = 256;  // k block: a 16 KB B sub-panel stays in L1 across the row loop
constexpr int64_t MC = 96;   // row block: its A rows (96 × KC floats) stay in L2 across panels

// c[r][j] (+)= Σ_k a[r][k]·b[k][j] as one fma chain per element, for r < mr, j < NR. The result is
// written to y (ldy) for j < nr; `first` starts from zero, else from the values in y.
void micro_scalar(int mr, int nr, int64_t kc, const float* a, int64_t lda, const float* b, float* y, int64_t ldy,
                  bool first) {
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) {
      float c = first ? 0.0f : y[r * ldy + j];
      for (int64_t k = 0; k < kc; ++k) c = std::fma(a[r * lda + k], b[k * NR + j], c);
      y[r * ldy + j] = c;
    }
}

template <int R>
__attribute__((target("avx2,fma"))) void micro_avx2(int nr, int64_t kc, const float* a, int64_t lda,
                                                    const float* b, float* y, int64_t ldy, bool first) {
  __m256 c0[R], c1[R];
  alignas(32) float tmp[R][NR];
  if (first) {
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  } else if (nr == NR) {
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm256_loadu_ps(y + r * ldy);
      c1[r] = _mm256_loadu_ps(y + r * ldy + 8);
    }
  } else {
    for (int r = 0; r < R; ++r) {
      std::memset(tmp[r], 0, sizeof(tmp[r]));
      std::memcpy(tmp[r], y + r * ldy, sizeof(float) * nr);
      c0[r] = _mm256_load_ps(tmp[r]);
      c1[r] = _mm256_load_ps(tmp[r] + 8);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
  if (nr == NR) {
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(y + r * ldy, c0[r]);
      _mm256_storeu_ps(y + r * ldy + 8, c1[r]);
    }
  } else {
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(tmp[r], c0[r]);
      _mm256_store_ps(tmp[r] + 8, c1[r]);
      std::memcpy(y + r * ldy, tmp[r], sizeof(float) * nr);
    }
  }
}

using MicroFn = void (*)(int, int64_t, const float*, int64_t, const float*, float*, int64_t, bool);
const MicroFn kAvx2[MR + 1] = {nullptr, micro_avx2<1>, micro_avx2<2>, micro_avx2<3>,
                               micro_avx2<4>, micro_avx2<5>, micro_avx2<6>};

bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

bool gemm_uses_avx2() {
  static const bool v = detect_avx2();  // a CPU fact, not state: computed once, never changes
  return v;
}

PackedMatrix pack_matrix(const float* w, int64_t N, int64_t K) {
  PackedMatrix p;
  p.N = N;
  p.K = K;
  const int64_t panels = (N + NR - 1) / NR;
  p.data.assign((size_t)(panels * K * NR), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    float* dst = p.data.data() + (n / NR) * K * NR + (n % NR);
    const float* src = w + n * K;
    for (int64_t k = 0; k < K; ++k) dst[k * NR] = src[k];
  }
  return p;
}

void gemm_packed(const float* x, int64_t M, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy,
                 ThreadPool* pool, GemmIsa isa) {
  const int64_t N = w.N, K = w.K, panels = (N + NR - 1) / NR;
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) std::fill(y + m * ldy, y + m * ldy + N, 0.0f);
    return;
  }
  const bool avx2 = isa != GemmIsa::Scalar && gemm_uses_avx2();
  // Threads own disjoint column panels; each element's k order is fixed, so the split is free.
  auto run = [&](int64_t p_begin, int64_t p_end) {
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min(KC, K - k0);
      for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t mc = std::min(MC, M - m0);
        for (int64_t p = p_begin; p < p_end; ++p) {
          const float* b = w.data.data() + (p * K + k0) * NR;
          const int nr = (int)std::min<int64_t>(NR, N - p * NR);
          for (int64_t r0 = m0; r0 < m0 + mc; r0 += MR) {
            const int mr = (int)std::min<int64_t>(MR, m0 + mc - r0);
            const float* a = x + r0 * ldx + k0;
            float* c = y + r0 * ldy + p * NR;
            if (avx2) kAvx2[mr](nr, kc, a, ldx, b, c, ldy, k0 == 0);
            else micro_scalar(mr, nr, kc, a, ldx, b, c, ldy, k0 == 0);
          }
        }
      }
    }
  };
  // Enough work per thread to pay for the hand-off.
  const int64_t flops_per_panel = 2 * M * K * NR;
  const int64_t min_panels = std::max<int64_t>(1, (int64_t)(1 << 18) / std::max<int64_t>(1, flops_per_panel));
  if (pool) pool->parallel_for(panels, run, min_panels);
  else run(0, panels);
}

}  // namespace deepinfer
