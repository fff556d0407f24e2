#include "ops/select/backend_select.h"

#include "ops/cpu/cpu_backend.h"
#include "util/error.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace deepinfer {

bool cuda_available() {
#ifdef DEEPINFER_HAVE_CUDA
  return CudaBackend::device_count() > 0;
#else
  return false;
#endif
}

std::string resolve_backend(const std::string& requested) {
  if (requested.empty() || requested == "auto") return cuda_available() ? "cuda" : "cpu";
  if (requested == "cpu") return "cpu";
  if (requested == "cuda") {
#ifdef DEEPINFER_HAVE_CUDA
    if (!cuda_available()) throw Error("backend 'cuda' requested, but no CUDA device is available (no GPU or no driver)");
    return "cuda";
#else
    throw Error("backend 'cuda' requested, but this binary was built without CUDA (-DDEEPINFER_CUDA=OFF)");
#endif
  }
  throw Error("unknown backend '" + requested + "' (expected cuda, cpu or auto)");
}

std::unique_ptr<Backend> make_backend(const std::string& resolved, int threads, const std::string& dtype) {
  if (dtype != "auto" && dtype != "float32")
    throw Error("unknown dtype '" + dtype + "' (expected auto or float32)");
  if (resolved == "cpu") return std::make_unique<CpuBackend>(threads);
#ifdef DEEPINFER_HAVE_CUDA
  if (resolved == "cuda")
    return std::make_unique<CudaBackend>(0, dtype == "float32" ? CudaWeights::Float32 : CudaWeights::Stored);
#endif
  return make_backend(resolve_backend(resolved), threads, dtype);
}

}  // namespace deepinfer
