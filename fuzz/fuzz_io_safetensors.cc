// libFuzzer target: arbitrary bytes as a whole safetensors file image. The parser must either
// return a header whose every tensor lies inside the data section, or throw deepinfer::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    deepinfer::ParsedHeader h = deepinfer::parse_safetensors_image(data, size, "fuzz.safetensors");
    // Re-check the promises a caller relies on before it forms pointers.
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | data[i];
    const uint64_t data_size = size - 8 - hlen;
    for (const auto& t : h.tensors) {
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      if (t.begin > t.end || t.end > data_size || (t.end - t.begin) != n * deepinfer::dtype_size(t.dtype)) std::abort();
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
