#pragma once
// A kernel timeline (Backend::take_kernel_trace: every kernel's device start and end, graph replays included) and
// where a serial step's time goes in it. In a stream of kernels whose successors start early (programmatic
// dependent launch), a kernel's own duration overlaps its neighbours', so durations do not add up to the step;
// what does is each kernel's *marginal* time — how far its end moves the latest end so far — plus the idle gaps
// where nothing runs: Σ marginal + Σ idle = the span from the first start to the last end.
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

struct KernelRecord {
  std::string name;  // short_kernel_name of the symbol
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t graph_node = 0;  // 0 outside graphs
  uint32_t stream = 0;      // the stream it ran on (a step graph's side chain: another)
  int64_t blocks = 0;       // grid size
  int32_t threads = 0;      // block size
};

struct KernelSummaryRow {
  std::string name;
  int64_t calls = 0;
  double dur_us = 0;       // Σ (end − start)
  double marginal_us = 0;  // Σ how far its end moved the latest end
  double idle_us = 0;      // Σ idle time just before it (nothing running)
  double early_us = 0;     // Σ how long it started before the latest end (overlap with what ran before)
};

struct KernelTimeline {
  std::vector<KernelSummaryRow> rows;  // by marginal time, largest first
  double span_us = 0, idle_us = 0;     // first start to last end; Σ idle
  int64_t kernels = 0;
};

// The summary of records (any order; sorted by start, then end, here).
KernelTimeline summarize_kernels(std::vector<KernelRecord> recs);

// "deepinfer::cuda::(anonymous namespace)::gemv_q_v6_kernel<4, 2>(float const*, …)" → "gemv_q_v6_kernel<4, 2>":
// the demangled symbol without namespaces and parameters (the mangled name itself when it does not demangle).
std::string short_kernel_name(const char* mangled);

}  // namespace deepinfer
