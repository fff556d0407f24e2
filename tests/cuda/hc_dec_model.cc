// Host model of hc_dec_kernel's index math (src/ops/cuda/hc.cu, "hcdec"), no GPU needed. Checks:
// (1) the early fn loads' stepped (row, column) equal idx / len4, idx % len4 and cover the slice once;
// (2) tickets from atomicInc(sync[0], S − 1) over launches of different S and M: each ticket once, the
//     counter back to 0 after every launch, the last M tickets finish rows 0 … M − 1 once each, the last
//     arrival row M − 1;
// (3) the finisher's partial staging (DEC_PL clamped loads, predicated stores) stores each of the S·NV
//     partials once; the collapse (warps 1 … 7, U float4 a trip) writes each float4 column once;
// (4) the shape rule on the model's shapes (V4-Flash D = 4096, V4 D = 7168) and some it must refuse.
// Build and run: ctest -R CudaHcDecModel (or g++ -O2 -std=c++17 tests/cuda/hc_dec_model.cc && ./a.out).
// Keep it in step with the kernel.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "host_check.h"

namespace {
constexpr int DEC_NT = 256, DEC_MAXM = DEC_NT / 32, DEC_FQ = 4, DEC_PL = 16, U = 5, CT = DEC_NT - 32;
constexpr size_t kMaxSmem = 227 * 1024;
using host_check::fails;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// hc.cu hc_slice_len / hc_a_smem / hcd_smem / hcd_shape_ok
int64_t slice_len(int hc, int64_t D, int nv) {
  const int64_t K = (int64_t)hc * D;
  if (D < nv) return 0;
  int64_t L = std::min<int64_t>(K, std::max<int64_t>(128, (hc * nv + 31) / 32 * 32));
  while (cdiv(K, L) * nv > D) L = std::min<int64_t>(K, L + 32);
  return L;
}
size_t a_smem(int mix, int rt, int64_t L) { return (size_t)(mix + rt) * (size_t)(L + 4) * sizeof(float); }
size_t d_smem(int mix, int nv, int64_t M, int64_t L, int64_t S) {
  return std::max((size_t)(mix + M) * (size_t)(L + 4), (size_t)(S * nv)) * sizeof(float);
}
bool shape_ok(int64_t M, int hc, int64_t D) {
  if (M < 1 || M > DEC_MAXM || hc < 1 || hc > 4 || D % 4) return false;
  const int nv = (2 + hc) * hc + 1, mix = nv - 1;
  const int64_t L = slice_len(hc, D, nv);
  if (L <= 0 || a_smem(mix, 4, L) > kMaxSmem) return false;
  const int64_t S = cdiv((int64_t)hc * D, L);
  return S >= M && (int64_t)mix * (L / 4) <= (int64_t)DEC_FQ * DEC_NT && d_smem(mix, nv, M, L, S) <= kMaxSmem;
}

void fn_loads(int mix, int len4) {
  std::vector<int> seen(mix * len4, 0);
  for (int t = 0; t < DEC_NT; ++t) {
    const int qd = DEC_NT / len4, qr = DEC_NT - qd * len4;
    int v = t / len4, c = t - v * len4;
    for (int q = 0; q < DEC_FQ; ++q) {
      const int idx = t + q * DEC_NT;
      CHECK(v == idx / len4 && c == idx % len4, "fn step mix=%d len4=%d t=%d q=%d\n", mix, len4, t, q);
      if (v < mix) ++seen[v * len4 + c];
      v += qd, c += qr;
      if (c >= len4) c -= len4, ++v;
    }
  }
  for (int i = 0; i < mix * len4; ++i) CHECK(seen[i] == 1, "fn coverage mix=%d len4=%d i=%d\n", mix, len4, i);
}

void tickets() {
  std::mt19937 rng(7);
  unsigned cnt = 0;  // sync[0], zero at the start
  for (int launch = 0; launch < 200; ++launch) {
    const int S = 1 + (int)(rng() % 300), M = 1 + (int)(rng() % std::min(S, DEC_MAXM));
    std::vector<int> order(S), rows(M, 0), seen(S, 0);
    for (int i = 0; i < S; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    int last_row = -1;
    for (int b : order) {
      (void)b;
      const unsigned old = cnt;
      cnt = old >= (unsigned)(S - 1) ? 0u : old + 1;  // atomicInc(&cnt, S − 1)
      const int tk = (int)old;
      CHECK(tk >= 0 && tk < S, "ticket %d of S=%d\n", tk, S);
      if (tk < 0 || tk >= S) continue;
      ++seen[tk];
      if (tk >= S - M) {
        ++rows[tk - (S - M)];
        if (tk == S - 1) last_row = tk - (S - M);
      }
    }
    CHECK(cnt == 0, "counter %u after launch %d\n", cnt, launch);
    for (int i = 0; i < S; ++i) CHECK(seen[i] == 1, "ticket %d seen %d times\n", i, seen[i]);
    for (int r = 0; r < M; ++r) CHECK(rows[r] == 1, "row %d finished %d times\n", r, rows[r]);
    CHECK(last_row == M - 1, "last arrival finishes row %d, not %d\n", last_row, M - 1);
  }
}

void staging(int n) {
  std::vector<int> seen(n, 0);
  for (int t = 0; t < DEC_NT; ++t)
    for (int i0 = 0; i0 < n; i0 += DEC_PL * DEC_NT)
      for (int q = 0; q < DEC_PL; ++q) {
        const int i = i0 + q * DEC_NT + t, li = std::min(i, n - 1);
        CHECK(li >= 0 && li < n, "load index %d of %d\n", li, n);
        if (i < n) ++seen[i];
      }
  for (int i = 0; i < n; ++i) CHECK(seen[i] == 1, "partial %d staged %d times (n=%d)\n", i, seen[i], n);
}

void collapse(int64_t D4) {
  std::vector<int> seen(D4, 0);
  for (int t = 32; t < DEC_NT; ++t)
    for (int64_t b = t - 32; b < D4; b += (int64_t)CT * U)
      for (int q = 0; q < U; ++q) {
        const int64_t i4 = b + (int64_t)q * CT;
        if (i4 < D4) ++seen[i4];
      }
  for (int64_t i = 0; i < D4; ++i) CHECK(seen[i] == 1, "collapse column %ld written %d times\n", (long)i, seen[i]);
}
}  // namespace

int main() {
  for (int hc = 1; hc <= 4; ++hc) {
    const int mix = (2 + hc) * hc;
    for (int len4 = 1; len4 <= 1024; ++len4)
      if (mix * len4 <= DEC_FQ * DEC_NT) fn_loads(mix, len4);
  }
  tickets();
  for (int n : {3200, 5600, 384, 100, 36, 16, 4096, 4097}) staging(n);
  for (int64_t D4 : {1024, 1792, 25, 128, 250, 1}) collapse(D4);
  for (int64_t M = 1; M <= 8; ++M) {
    CHECK(shape_ok(M, 4, 4096), "V4-Flash M=%ld refused\n", (long)M);
    CHECK(shape_ok(M, 4, 7168), "V4 M=%ld refused\n", (long)M);
    CHECK(slice_len(4, 4096, 25) == 128 && cdiv(4 * 4096, 128) == 128, "V4-Flash plan\n");
  }
  CHECK(shape_ok(3, 3, 1000) && shape_ok(5, 4, 7168) && shape_ok(7, 2, 512) && shape_ok(2, 1, 512) && shape_ok(4, 4, 100),
        "a test shape is refused\n");
  CHECK(!shape_ok(9, 4, 4096) && !shape_ok(1, 8, 4096) && !shape_ok(2, 2, 64) && !shape_ok(1, 4, 20) && !shape_ok(1, 4, 4098),
        "a shape that must fall back is taken\n");
  if (fails) {
    fprintf(stderr, "%d failures\n", fails);
    return 1;
  }
  printf("hc_dec model: fn load stepping, tickets, staging, collapse and shapes OK\n");
  return 0;
}
