// Host model of hc_fast_kernel's index math (src/ops/cuda/hc.cu, "hcfast"), no GPU needed. Checks:
// (1) the ticket → item mapping is a bijection onto {A(t, s)} ∪ {F(t, k)} and every F(t, ·) ticket is larger
//     than every A(t, ·) ticket (an F item only waits on items already taken: no deadlock);
// (2) an A item's threads cover each (row, value) of the tile exactly once (4 rows × RV values a thread plus
//     the sum of squares of row vg), for hc = 1..4;
// (3) the F item's staged partials: thread t = r·NV + v reads 32 distinct banks for every slice (pitch);
// (4) shared memory of A and F fits and the partials fit in u's row (S·NV ≤ D) for the shapes taken.
// Build and run: ctest -R CudaHcFastModel (or g++ -O2 -std=c++17 tests/cuda/hc_fast_model.cc && ./a.out).
// Keep it in step with the kernel.
#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "host_check.h"

namespace {
constexpr int Q_NT = 128, Q_BM = 128, Q_FR = 4, Q_L = 128, Q_LP = Q_L + 4;
using host_check::fails;

int hcq_pitch(int S, int nv) { return S * nv + (((nv - S * nv) % 32) + 32) % 32; }

void tickets(int64_t M, int S) {
  const int nA = S, nF = Q_BM / Q_FR, T = (int)((M + Q_BM - 1) / Q_BM);
  const int64_t items = (int64_t)T * (nA + nF);
  std::vector<int64_t> a_max(T, -1), f_min(T, INT64_MAX);
  std::set<std::pair<int, int>> seenA, seenF;
  for (int64_t item = 0; item < items; ++item) {
    bool isA;
    int tile, k;
    if (item < nA) {
      isA = true, tile = 0, k = (int)item;
    } else {
      const int64_t j = item - nA;
      const int r = (int)(1 + j / (nA + nF)), q = (int)(j % (nA + nF));
      if (r < T && q < nA) isA = true, tile = r, k = q;
      else isA = false, tile = r - 1, k = r < T ? q - nA : q;
    }
    CHECK(tile >= 0 && tile < T, "tile range M=%lld item %lld\n", (long long)M, (long long)item);
    if (isA) {
      CHECK(k >= 0 && k < nA && seenA.insert({tile, k}).second, "A item twice/out of range\n");
      a_max[tile] = std::max<int64_t>(a_max[tile], item);
    } else {
      CHECK(k >= 0 && k < nF && seenF.insert({tile, k}).second, "F item twice/out of range\n");
      f_min[tile] = std::min<int64_t>(f_min[tile], item);
    }
  }
  CHECK((int64_t)seenA.size() == (int64_t)T * nA && (int64_t)seenF.size() == (int64_t)T * nF, "items missing\n");
  for (int t = 0; t < T; ++t) CHECK(a_max[t] < f_min[t], "F before A in tile %d\n", t);
}

void a_mapping(int hc) {
  const int MIX = (2 + hc) * hc, NV = MIX + 1, RV = (MIX + 3) / 4;
  std::vector<int> cnt(Q_BM * NV, 0);
  for (int tid = 0; tid < Q_NT; ++tid) {
    const int warp = tid >> 5, lane = tid & 31, rg = lane & 7, vg = lane >> 3, rbase = warp * 32 + rg;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < RV; ++j)
        if (vg * RV + j < MIX) ++cnt[(rbase + 8 * i) * NV + vg * RV + j];
    ++cnt[(rbase + 8 * vg) * NV + MIX];
  }
  for (int c : cnt) CHECK(c == 1, "hc=%d: a (row, value) computed %d times\n", hc, c);
}

void f_banks(int S, int nv) {
  const int P = hcq_pitch(S, nv);
  CHECK(P >= S * nv && P % 32 == nv % 32, "pitch\n");
  for (int s = 0; s < S; ++s)
    for (int w = 0; w * 32 < Q_FR * nv; ++w) {
      std::set<int> banks;
      int n = 0;
      for (int t = w * 32; t < std::min(w * 32 + 32, Q_FR * nv); ++t, ++n) banks.insert((t / nv * P + s * nv + t % nv) % 32);
      CHECK((int)banks.size() == n, "bank conflict S=%d nv=%d s=%d warp %d\n", S, nv, s, w);
    }
}
}  // namespace

int main() {
  for (int64_t M : {1, 7, 128, 129, 300, 1024, 4096})
    for (int S : {1, 2, 24, 128, 224}) tickets(M, S);
  for (int hc = 1; hc <= 4; ++hc) a_mapping(hc);
  for (auto sn : {std::pair<int, int>{128, 25}, {224, 25}, {24, 16}, {1, 9}, {2, 4}}) f_banks(sn.first, sn.second);
  // shared memory (hc = 4): A (128 + 24) rows of Q_LP floats, F 4 pitches; both ≤ 227 KB, 2 blocks an SM
  const size_t a = (size_t)(Q_BM + 24) * Q_LP * 4, f4096 = (size_t)Q_FR * hcq_pitch(128, 25) * 4,
               f7168 = (size_t)Q_FR * hcq_pitch(224, 25) * 4;
  CHECK(a <= 113 * 1024 && f4096 <= 113 * 1024 && f7168 <= 113 * 1024, "shared memory > half an SM\n");
  CHECK(128 * 25 <= 4096 && 224 * 25 <= 7168, "partials do not fit u's row\n");
  printf("A %zu B, F %zu / %zu B\n", a, f4096, f7168);
  printf(fails ? "FAILED (%d)\n" : "all checks passed\n", fails);
  return fails ? 1 : 0;
}
