// CPU ops against independent float64 formulations written here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/cpu/cpu_backend.h"

using namespace deepinfer;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(CpuOps, SinkhornCombIsDoublyStochastic) {
  CpuBackend be(2);
  const int hc = 4, D = 32, M = 5, mix = (2 + hc) * hc;
  auto X = randn(M * hc * D, 1), fn = randn(mix * hc * D, 2, 0.3f), base = randn(mix, 3), scale = randn(3, 4);
  std::vector<float> u(M * D), post(M * hc), comb(M * hc * hc);
  be.hc_pre(X.data(), M, hc, D, fn.data(), base.data(), scale.data(), 20, 1e-6f, 1e-6f, u.data(), post.data(),
            comb.data());
  for (int m = 0; m < M; ++m) {
    for (int k = 0; k < hc; ++k) {  // the last step is a column normalisation: exact column sums
      double col = 0;
      for (int j = 0; j < hc; ++j) col += comb[m * hc * hc + j * hc + k];
      EXPECT_NEAR(col, 1.0, 1e-5);
    }
    for (int j = 0; j < hc; ++j) {
      double row = 0;
      for (int k = 0; k < hc; ++k) row += comb[m * hc * hc + j * hc + k];
      EXPECT_NEAR(row, 1.0, 1e-2);  // rows converge more slowly than the exactly normalised columns
    }
    for (int j = 0; j < hc; ++j) {
      EXPECT_GT(post[m * hc + j], 0.0f);
      EXPECT_LT(post[m * hc + j], 2.0f);
    }
  }
}

TEST(CpuOps, HcPreCollapseMatchesFloat64) {
  CpuBackend be(1);
  const int hc = 3, D = 16, M = 2, mix = (2 + hc) * hc;
  auto X = randn(M * hc * D, 5), fn = randn(mix * hc * D, 6, 0.3f), base = randn(mix, 7), scale = randn(3, 8);
  std::vector<float> u(M * D), post(M * hc), comb(M * hc * hc);
  be.hc_pre(X.data(), M, hc, D, fn.data(), base.data(), scale.data(), 20, 1e-6f, 1e-6f, u.data(), post.data(),
            comb.data());
  for (int m = 0; m < M; ++m) {
    double ss = 0;
    for (int i = 0; i < hc * D; ++i) ss += (double)X[m * hc * D + i] * X[m * hc * D + i];
    double r = 1.0 / std::sqrt(ss / (hc * D) + 1e-6);
    std::vector<double> pre(hc);
    for (int j = 0; j < hc; ++j) {
      double mu = 0;
      for (int i = 0; i < hc * D; ++i) mu += (double)fn[j * hc * D + i] * X[m * hc * D + i];
      pre[j] = 1.0 / (1.0 + std::exp(-(mu * r * scale[0] + base[j]))) + 1e-6;
      double mp = 0;
      for (int i = 0; i < hc * D; ++i) mp += (double)fn[(hc + j) * hc * D + i] * X[m * hc * D + i];
      EXPECT_NEAR(post[m * hc + j], 2.0 / (1.0 + std::exp(-(mp * r * scale[1] + base[hc + j]))), 1e-5);
    }
    for (int i = 0; i < D; ++i) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += pre[j] * X[m * hc * D + j * D + i];
      EXPECT_NEAR(u[m * D + i], s, 1e-5);
    }
  }
}

TEST(CpuOps, RopeInverseUndoesForwardAndLeavesNopeChannels) {
  CpuBackend be(2);
  const int M = 7, H = 3, d = 32, r = 8;
  auto x = randn(M * H * d, 9), orig = x;
  std::vector<int32_t> pos(M);
  for (int m = 0; m < M; ++m) pos[m] = 1000 * m + 3;
  std::vector<float> inv_freq{1.0f, 0.1f, 0.01f, 0.001f};
  be.rope(x.data(), M, H * d, H, d, r, pos.data(), inv_freq.data(), false);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d - r; ++c) ASSERT_EQ(x[(m * H + h) * d + c], orig[(m * H + h) * d + c]);
  // pair 0 of row 1, head 0 against the complex rotation
  {
    const float* o = &orig[(1 * H + 0) * d + d - r];
    double a = pos[1] * 1.0;
    EXPECT_NEAR(x[(1 * H) * d + d - r], o[0] * std::cos(a) - o[1] * std::sin(a), 2e-3);
    EXPECT_NEAR(x[(1 * H) * d + d - r + 1], o[1] * std::cos(a) + o[0] * std::sin(a), 2e-3);
  }
  be.rope(x.data(), M, H * d, H, d, r, pos.data(), inv_freq.data(), true);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], orig[i], 1e-5);
}

TEST(CpuOps, SinkAttentionMatchesFloat64) {
  CpuBackend be(2);
  const int M = 3, H = 2, d = 16, nwin = 10, nent = 6;
  auto q = randn(M * H * d, 10), win = randn(nwin * d, 11), ent = randn(nent * d, 12), sinks = randn(H, 13);
  std::vector<int32_t> lo{0, 2, 5}, hi{3, 7, 10};
  std::vector<int32_t> idx{0, 5, 1, 2, 3};
  std::vector<int64_t> off{0, 2, 2, 5};  // query 1 has no compressed entries
  std::vector<float> out(M * H * d);
  const float scale = 0.25f;
  be.sink_attention(q.data(), M, H * d, H, d, win.data(), lo.data(), hi.data(), ent.data(), idx.data(), off.data(),
                    sinks.data(), scale, out.data(), H * d);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < H; ++h) {
      std::vector<const float*> keys;
      for (int i = lo[m]; i < hi[m]; ++i) keys.push_back(&win[i * d]);
      for (int64_t i = off[m]; i < off[m + 1]; ++i) keys.push_back(&ent[idx[i] * d]);
      std::vector<double> s;
      double den = std::exp((double)sinks[h]);
      for (auto k : keys) {
        double v = 0;
        for (int c = 0; c < d; ++c) v += (double)q[(m * H + h) * d + c] * k[c];
        s.push_back(std::exp(v * scale));
        den += s.back();
      }
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (size_t i = 0; i < keys.size(); ++i) o += s[i] / den * keys[i][c];
        EXPECT_NEAR(out[(m * H + h) * d + c], o, 1e-5);
      }
    }
}

TEST(CpuOps, CompressPoolIgnoresAbsentSlots) {
  CpuBackend be(1);
  const int S = 4, d = 3;
  std::vector<float> kv{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const float ninf = -INFINITY;
  std::vector<float> gate{ninf, ninf, ninf, 0, 0, 0, 0, 0, 0, std::log(2.0f), std::log(2.0f), std::log(2.0f)};
  std::vector<float> out(d);
  be.compress_pool(kv.data(), gate.data(), 1, S, d, out.data());
  // slots 1, 2, 3 with weights 1/4, 1/4, 2/4
  for (int c = 0; c < d; ++c) EXPECT_NEAR(out[c], 0.25 * kv[3 + c] + 0.25 * kv[6 + c] + 0.5 * kv[9 + c], 1e-5);
}

