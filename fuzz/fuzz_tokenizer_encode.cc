// libFuzzer target over encode / decode / streaming decode of the real DeepSeek-V4 tokenizer.
// Checks, besides memory safety (ASan/UBSan): decode(encode(x)) == x made valid (byte-level BPE
// with no normalizer is lossless), stream deltas concatenate to decode, and decode output is
// valid UTF-8.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

using namespace deepinfer::tokenizer;

static const Tokenizer& tok() {
  static const Tokenizer t = [] {
    const char* env = std::getenv("DEEPINFER_FUZZ_TOKENIZER");
    std::string path = env ? env : std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/')) +
                                       "/../tests/data/tokenizer/deepseek-v4";
    return Tokenizer::from_file(path);
  }();
  return t;
}

#define CHECK(c)                                              \
  do {                                                        \
    if (!(c)) {                                               \
      std::fprintf(stderr, "check failed: %s\n", #c);         \
      std::abort();                                           \
    }                                                         \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& t = tok();
  if (size == 0) return 0;
  uint8_t op = data[0];
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (op < 0xC0) {
    ParseSpecial mode = op % 3 == 0 ? ParseSpecial::kAll
                        : op % 3 == 1 ? ParseSpecial::kNonSpecialOnly
                                      : ParseSpecial::kNone;
    auto ids = t.encode(text, (op & 8) != 0, mode);
    std::string valid = utf8::to_valid(text);
    CHECK(utf8::is_valid(valid));
    std::string round = t.decode(ids, false);
    if (!(op & 8)) CHECK(round == valid);
    if (mode == ParseSpecial::kNone)
      for (int32_t id : ids) CHECK(!t.is_added(id));
    for (int32_t id : ids) CHECK(id >= 0 && size_t(id) < t.vocab_size());
  } else {
    // Interpret the bytes as little-endian 24-bit ids (some out of range on purpose).
    std::vector<int32_t> ids;
    for (size_t i = 1; i + 3 <= size; i += 3)
      ids.push_back(int32_t(data[i] | (data[i + 1] << 8) | ((data[i + 2] & 0x03) << 16)));
    bool skip = op & 1;
    std::string d = t.decode(ids, skip);
    CHECK(utf8::is_valid(d));
    StreamDecoder sd(t, skip);
    std::string acc;
    for (int32_t id : ids) {
      std::string delta = sd.push(id);
      CHECK(utf8::is_valid(delta));
      acc += delta;
    }
    acc += sd.finish();
    CHECK(acc == d);
  }
  return 0;
}
