// Host emulation of hc_gemm_kernel (src/ops/cuda/hc.cu)'s index math vs v3's chain order (bitwise).
// Build: g++ -O2 -ffp-contract=off tests/cuda/hc_gemm_model.cc && ./a.out
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>
#include <algorithm>
#include <limits>
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t slice_len(int hc, int64_t D, int nv) {
  const int64_t K = (int64_t)hc * D;
  if (D < nv) return 0;
  int64_t L = std::min<int64_t>(K, std::max<int64_t>(128, (hc * nv + 31) / 32 * 32));
  while (cdiv(K, L) * nv > D) L = std::min<int64_t>(K, L + 32);
  return L;
}
const int P_KT = 32, P_LP = 36, P_ST = 8;
bool run(int hc, int64_t D, int64_t M, int BM, int P_G) {
  const int MIX = (2 + hc) * hc, NV = MIX + 1, NQ = (NV + P_G - 1) / P_G, NT = P_G * BM, SROWS = MIX + BM, STAGE = SROWS * P_LP;
  const int64_t K = hc * D, L = slice_len(hc, D, NV);
  std::mt19937 g(1); std::normal_distribution<float> nd;
  std::vector<float> X(M * K), fn(MIX * K);
  for (auto& v : X) v = nd(g);
  for (auto& v : fn) v = 0.02f * nd(g);
  // v3 reference
  std::vector<float> ref(M * NV);
  for (int64_t m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) {
      float tot = 0;
      for (int64_t k0 = 0; k0 < K; k0 += L) {
        float a = 0;
        for (int64_t k = k0; k < std::min(K, k0 + L); ++k) {
          const float x = X[m * K + k], f = v < MIX ? fn[v * K + k] : x;
          a = std::fmaf(f, x, a);
        }
        tot += a;
      }
      ref[m * NV + v] = tot;
    }
  std::vector<float> out(M * D, NAN);
  const int nch = (int)cdiv(K, P_KT);
  for (int64_t b = 0; b < cdiv(M, BM); ++b) {
    const int64_t m0 = b * BM;
    const int rows = (int)std::min<int64_t>(BM, M - m0);
    std::vector<float> sm(P_ST * STAGE, NAN);
    std::vector<std::vector<float>> acc(NT, std::vector<float>(NQ, 0.f)), tot = acc;
    for (int ch = 0; ch < nch; ++ch) {
      float* st = sm.data() + (ch % P_ST) * STAGE;
      std::fill(st, st + STAGE, NAN);  // stale data must not be read
      const int64_t c0 = (int64_t)ch * P_KT;
      const int n4l = (int)std::min<int64_t>(P_KT, K - c0) / 4;
      for (int t = 0; t < NT; ++t)
        for (int idx = t; idx < SROWS * (P_KT / 4); idx += NT) {
          const int row = idx / (P_KT / 4), c = idx % (P_KT / 4);
          if (c >= n4l) continue;
          for (int e = 0; e < 4; ++e) {
            if (row < MIX) st[row * P_LP + 4 * c + e] = fn[row * K + c0 + 4 * c + e];
            else if (row - MIX < rows) st[row * P_LP + 4 * c + e] = X[(m0 + row - MIX) * K + c0 + 4 * c + e];
          }
        }
      const int64_t cend = std::min<int64_t>((int64_t)(ch + 1) * P_KT, K);
      const int n4 = (int)(cend - c0) / 4;
      for (int t = 0; t < NT; ++t) {
        const int r = t % BM, gq = t / BM;
        const float* xs = st + (MIX + r) * P_LP;
        for (int c = 0; c < P_KT / 4; ++c)
          if (c < n4)
            for (int q = 0; q < NQ; ++q) {
              const int v = gq * NQ + q, foff = (v < MIX ? v : MIX + r) * P_LP;
              for (int e = 0; e < 4; ++e) acc[t][q] = std::fmaf(st[foff + 4 * c + e], xs[4 * c + e], acc[t][q]);
            }
        if (cend % L == 0 || cend == K)
          for (int q = 0; q < NQ; ++q) tot[t][q] += acc[t][q], acc[t][q] = 0;
      }
    }
    for (int t = 0; t < NT; ++t) {
      const int r = t % BM, gq = t / BM;
      if (r < rows)
        for (int q = 0; q < NQ; ++q)
          if (gq * NQ + q < NV) out[(m0 + r) * D + gq * NQ + q] = tot[t][q];
    }
  }
  int bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) {
      const float a = out[m * D + v], e = ref[m * NV + v];
      if (!(std::memcmp(&a, &e, 4) == 0)) ++bad;
    }
  printf("G=%d hc=%d D=%ld M=%ld BM=%d L=%ld: %s (%d bad)\n", P_G, hc, (long)D, (long)M, BM, (long)L, bad ? "FAIL" : "bitwise ok", bad);
  return bad == 0;
}
#include <cstring>
int main() {
  bool ok = true;
  const int cfg[3][2] = {{32, 4}, {16, 5}, {8, 9}};  // (BM, G) as launch_pre_gemm picks them
  for (auto& c : cfg) {
    ok &= run(4, 4096, c[0] + 5, c[0], c[1]);
    ok &= run(3, 1000, 2 * c[0] + 1, c[0], c[1]);
    ok &= run(4, 100, 40, c[0], c[1]);
    ok &= run(2, 64, 7, c[0], c[1]);
    ok &= run(1, 256, 9, c[0], c[1]);
  }
  return ok ? 0 : 1;
}
