// libFuzzer target over the structured-output compilers (regex, JSON Schema, GBNF) and the matcher:
// any spec must compile or throw deepinfer::Error (never crash, hang, leak or throw anything else),
// and a compiled grammar's masks must agree with accept_token along a walk the input steers.
// Input: byte 0 picks the kind (regex, JSON Schema, GBNF, JSON object), the rest is the spec text.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "util/error.h"

using namespace deepinfer::grammar;

namespace {

// A small byte-level vocabulary: every single byte plus JSON-ish multi-byte tokens (so the trie
// has depth), one EOS. 64-bit-word boundaries are crossed (width 300).
std::shared_ptr<const Vocabulary> make_vocab() {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, (char)b));
  for (const char* t : {"{\"", "\":", "\": ", "\",", "\"}", "true", "false", "null", "12", "-1", "0.5", "e+", "  ",
                        "\n ", "ab", "abc", "[{", "}]", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\\u00", "\\\"",
                        "name", "type", "aa", "aaa", "aaaa"})
    toks.push_back(t);
  std::vector<bool> special(toks.size(), false);
  toks.push_back("<eos>");
  special.push_back(true);
  return Vocabulary::create(toks, special, (int32_t)toks.size() - 1, 300);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const Vocabulary> vocab = make_vocab();  // harness only: built once
  if (size < 1) return 0;
  static constexpr SpecKind kinds[4] = {SpecKind::Regex, SpecKind::JsonSchema, SpecKind::Gbnf, SpecKind::JsonObject};
  Spec spec{kinds[data[0] & 3], std::string(reinterpret_cast<const char*>(data + 1), size - 1)};
  // Tighter than the defaults so that one input stays well under the fuzzer's timeout.
  Limits lim;
  lim.max_nfa_states = 200000;
  lim.max_dfa_states = 20000;
  lim.max_repeat = 2000;
  lim.compile_seconds = 2;
  std::shared_ptr<const Grammar> g;
  try {
    g = compile(spec, vocab, lim);
  } catch (const deepinfer::Error&) {
    return 0;
  }
  try {
    Matcher m(g);
    std::vector<uint32_t> mask(vocab->mask_words());
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
    for (int step = 0; step < 24; ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->logits_width(); ++id)
        if (mask[id >> 5] >> (id & 31) & 1) allowed.push_back(id);
      // Spot-check the mask against accept_token (both directions) on a few ids.
      for (int k = 0; k < 4; ++k) {
        int32_t id = (int32_t)((h >> (8 * k)) % (uint64_t)vocab->size());
        bool in = mask[id >> 5] >> (id & 31) & 1;
        Matcher probe = m;
        if (probe.accept_token(id) != in) std::abort();
      }
      if (allowed.empty()) break;
      int32_t pick = allowed[h % allowed.size()];
      h = (h ^ (uint64_t)pick) * 1099511628211ull;
      if (!m.accept_token(pick)) std::abort();  // the mask allowed it
      if (m.is_terminated()) break;
    }
    if (m.num_tokens() > 0) m.rollback(1);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
