// The kernel timeline's summary (util/kernel_timeline.h, what `deepinfer bench --kernel-trace` prints): marginal
// times and idle gaps add up to the span whatever the overlaps, against a brute-force sweep of a random timeline,
// and kernel names come out short.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "util/kernel_timeline.h"

using namespace deepinfer;

namespace {

KernelRecord rec(const char* name, uint64_t s, uint64_t e) {
  KernelRecord r;
  r.name = name, r.start_ns = s, r.end_ns = e;
  return r;
}

}  // namespace

// A hand-made stream: b starts early (under a), c after an idle gap, d inside c, e after d.
TEST(KernelTimeline, MarginalTimesByHand) {
  const KernelTimeline t = summarize_kernels(
      {rec("c", 5000, 8000), rec("a", 0, 2000), rec("b", 1500, 3000), rec("d", 6000, 7000), rec("e", 7500, 9000)});
  EXPECT_EQ(t.kernels, 5);
  EXPECT_DOUBLE_EQ(t.span_us, 9.0);
  EXPECT_DOUBLE_EQ(t.idle_us, 2.0);  // 3000 .. 5000
  std::map<std::string, KernelSummaryRow> by;
  for (const auto& r : t.rows) by[r.name] = r;
  EXPECT_DOUBLE_EQ(by["a"].marginal_us, 2.0);
  EXPECT_DOUBLE_EQ(by["b"].marginal_us, 1.0);
  EXPECT_DOUBLE_EQ(by["b"].early_us, 0.5);
  EXPECT_DOUBLE_EQ(by["c"].marginal_us, 3.0);
  EXPECT_DOUBLE_EQ(by["c"].idle_us, 2.0);
  EXPECT_DOUBLE_EQ(by["d"].marginal_us, 0.0);  // ends inside c
  EXPECT_DOUBLE_EQ(by["d"].dur_us, 1.0);
  EXPECT_DOUBLE_EQ(by["e"].marginal_us, 1.0);
  EXPECT_DOUBLE_EQ(by["e"].early_us, 0.5);
  EXPECT_EQ(t.rows.front().name, "c");  // by marginal time
}

// Random overlapping timelines: Σ marginal + idle = span, and the idle time is what a 1 ns sweep finds uncovered.
TEST(KernelTimeline, MarginalAndIdleAddUpToTheSpan) {
  std::mt19937 g(7);
  for (int it = 0; it < 200; ++it) {
    std::vector<KernelRecord> v;
    uint64_t t = 1000;
    const int n = 1 + (int)(g() % 40);
    for (int i = 0; i < n; ++i) {
      t += g() % 300;
      v.push_back(rec(i % 3 == 0 ? "x" : i % 3 == 1 ? "y" : "z", t - std::min<uint64_t>(t, g() % 200), t + g() % 500));
    }
    const KernelTimeline s = summarize_kernels(v);
    double marg = 0;
    for (const auto& r : s.rows) marg += r.marginal_us;
    EXPECT_NEAR(marg + s.idle_us, s.span_us, 1e-9) << it;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& r : v) lo = std::min(lo, r.start_ns), hi = std::max(hi, r.end_ns);
    int64_t uncovered = 0;
    for (uint64_t x = lo; x < hi; ++x) {
      bool cov = false;
      for (const auto& r : v) cov = cov || (x >= r.start_ns && x < r.end_ns);
      uncovered += !cov;
    }
    EXPECT_NEAR(s.idle_us, 1e-3 * (double)uncovered, 1e-9) << it;
    EXPECT_NEAR(s.span_us, 1e-3 * (double)(hi - lo), 1e-9) << it;
  }
}

TEST(KernelTimeline, ShortKernelNames) {
  // void deepinfer::cuda::(anonymous namespace)::gemv_kernel<4, 2>(float const*, long)
  EXPECT_EQ(short_kernel_name("_ZN9deepinfer4cuda12_GLOBAL__N_111gemv_kernelILi4ELi2EEEvPKfl"), "gemv_kernel<4, 2>");
  // deepinfer::cuda::(anonymous namespace)::mask_rows_kernel(float*, long, long)
  EXPECT_EQ(short_kernel_name("_ZN9deepinfer4cuda12_GLOBAL__N_116mask_rows_kernelEPfll"), "mask_rows_kernel");
  EXPECT_EQ(short_kernel_name("plain_c_kernel"), "plain_c_kernel");
  EXPECT_EQ(short_kernel_name(nullptr), "?");
}
