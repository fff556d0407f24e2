// Vocabulary from a HuggingFace tokenizer.json with a byte-level BPE model: vocab strings use the
// GPT-2 alias alphabet (each byte shown as a printable code point), so map them back to bytes.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "grammar/grammar.h"
#include "util/error.h"

namespace deepinfer::grammar {

namespace {

// GPT-2 bytes_to_unicode, inverted: alias code point -> byte (-1 if not an alias).
std::vector<int> alias_to_byte() {
  std::vector<int> inv(512, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = printable ? b : 256 + extra++;
    inv[cp] = b;
  }
  return inv;
}

bool decode_alias(const std::string& s, const std::vector<int>& inv, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp;
    if (c < 0x80) { cp = c; i += 1; }
    else if ((c >> 5) == 6 && i + 1 < s.size()) { cp = ((c & 31) << 6) | (s[i + 1] & 63); i += 2; }
    else return false;  // aliases are all below U+0200
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out += static_cast<char>(inv[cp]);
  }
  return true;
}

}  // namespace

std::shared_ptr<const Vocabulary> load_vocab_from_tokenizer_json(const std::string& path,
                                                                 int32_t logits_width,
                                                                 const std::string& eos_token) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("grammar: cannot open tokenizer file '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error("grammar: bad tokenizer file '" + path + "': " + e.what());
  }
  if (!j.contains("model") || !j["model"].contains("vocab") || !j["model"]["vocab"].is_object())
    throw Error("grammar: tokenizer file '" + path + "' has no model.vocab");
  auto inv = alias_to_byte();
  std::vector<std::string> bytes;
  std::vector<bool> special;
  auto put = [&](int64_t id, std::string b, bool sp) {
    if (id < 0 || id >= logits_width) throw Error("grammar: token id out of range in '" + path + "'");
    if ((size_t)id >= bytes.size()) { bytes.resize(id + 1); special.resize(id + 1, true); }
    bytes[id] = std::move(b);
    special[id] = sp;
  };
  std::string b;
  for (auto& [s, id] : j["model"]["vocab"].items()) {
    // A string outside the alias alphabet cannot be emitted as bytes: never allow it.
    bool ok = decode_alias(s, inv, b);
    put(id.get<int64_t>(), ok ? b : s, !ok);
  }
  int32_t eos = -1;
  if (j.contains("added_tokens"))
    for (auto& t : j["added_tokens"]) {
      std::string content = t.value("content", "");
      int64_t id = t.value("id", -1);
      put(id, content, true);
      if (content == eos_token) eos = static_cast<int32_t>(id);
    }
  return Vocabulary::create(std::move(bytes), std::move(special), eos, logits_width);
}

}  // namespace deepinfer::grammar
