#pragma once
// Choosing the backend at run time (`--backend cuda|cpu`, EngineConfig::backend). The CUDA backend
// exists only in builds with DEEPINFER_CUDA; elsewhere asking for it is a clear error.
#include <memory>
#include <string>

#include "ops/backend.h"

namespace deepinfer {

// True when this binary was built with the CUDA backend and a CUDA device is present.
bool cuda_available();
// "cpu" or "cuda" for a requested name: "" and "auto" pick cuda when cuda_available(), else cpu.
// Throws Error for an unknown name, or for "cuda" when it is not available (saying why).
std::string resolve_backend(const std::string& requested);
// A new backend for a resolved name ("cpu": a CpuBackend with `threads` threads). dtype: "auto" (cuda:
// weights kept as stored, bf16 / fp8 / fp4) or "float32" (cuda: weights dequantized to float32, the cpu
// backend's numerics; the cpu backend always computes in float32). Throws Error for another dtype.
std::unique_ptr<Backend> make_backend(const std::string& resolved, int threads, const std::string& dtype = "auto");

}  // namespace deepinfer
