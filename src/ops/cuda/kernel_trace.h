#pragma once
// Kernel timeline through CUPTI's activity API (Backend::kernel_trace_start): every kernel's device start and
// end, those of graph replays included, without changing how they are launched (CUPTI's concurrent-kernel
// records keep kernels overlapping, programmatic dependent launch included). The GPU machines have no Nsight
// Systems; this is what shows where a decode step's time goes between its ~20 kernels a layer.
//
// CUPTI is loaded at run time (dlopen: DEEPINFER_CUPTI=path, else libcupti.so.13 / libcupti.so on the loader's
// path and under /usr/local/cuda), so the engine never depends on it. Its activity buffers are handed back
// through callbacks that carry no context, so there is one tracer a process (the one started last).
#include <memory>
#include <string>
#include <vector>

#include "util/kernel_timeline.h"

namespace deepinfer::cuda {

class KernelTracer {
 public:
  // Loads CUPTI and starts recording kernels; null (and *why) when it cannot.
  static std::unique_ptr<KernelTracer> start(std::string* why);
  ~KernelTracer();
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;
  // Kernels that start while the window is open are kept (the others are dropped as their buffers return).
  void window(bool open);
  // Flushes CUPTI's buffers and returns the kept kernels (by start), forgetting them.
  std::vector<KernelRecord> take();

  struct Impl;

 private:
  explicit KernelTracer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::cuda
