// libFuzzer target over tokenizer.json / tokenizer_config.json parsing: any input must either
// load or throw deepinfer::Error (never crash, hang or throw anything else); a loaded tokenizer
// must encode and decode a fixed probe string safely.
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  // Optional config after a NUL separator.
  size_t nul = all.find('\0');
  std::string_view tok = all.substr(0, nul), cfg = nul == std::string_view::npos ? "" : all.substr(nul + 1);
  try {
    auto t = deepinfer::tokenizer::Tokenizer::from_json(tok, cfg);
    auto ids = t.encode("Hello <s> wörld 123 \xF0\x9F\x98\x80 \xC3", true);
    (void)t.decode(ids, false);
    (void)t.decode(ids, true);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
