// Loading tokenizer.json / tokenizer_config.json into Tokenizer::Impl, with validation: every
// malformed or unsupported input is a deepinfer::Error naming the offending field.
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>

#include "tokenizer/impl.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::tokenizer {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// MergeMap / TokenTrie
void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  count_ = 0;
}

void MergeMap::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((count_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(count_ + 1, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(s.key & 0xffffffffu), s.rank, s.id);
  }
  uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  size_t h = hash(key);
  while (slots_[h].key != kEmpty && slots_[h].key != key) h = (h + 1) & mask_;
  if (slots_[h].key == kEmpty) ++count_;
  slots_[h] = Slot{key, rank, id};
}

void TokenTrie::add(const std::string& s, int32_t token_index) {
  if (s.empty()) return;
  first_[uint8_t(s[0])] = true;
  int32_t n = 0;
  for (char ch : s) {
    uint8_t c = uint8_t(ch);
    int32_t next = -1;
    for (auto& [k, v] : nodes_[n].kids)
      if (k == c) next = v;
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_[n].kids.emplace_back(c, next);
      nodes_.emplace_back();
    }
    n = next;
  }
  if (nodes_[n].token < 0) nodes_[n].token = token_index;  // first added token with that text wins
}

size_t TokenTrie::longest(const char* text, size_t len, size_t i, int32_t& token_index) const {
  size_t best = 0;
  int32_t n = 0;
  for (size_t j = i; j < len; ++j) {
    uint8_t c = uint8_t(text[j]);
    int32_t next = -1;
    for (auto& [k, v] : nodes_[n].kids)
      if (k == c) {
        next = v;
        break;
      }
    if (next < 0) break;
    n = next;
    if (nodes_[n].token >= 0) {
      best = j + 1 - i;
      token_index = nodes_[n].token;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
namespace {

// GPT-2's byte <-> "visible character" table used by the ByteLevel pre-tokenizer and decoder.
struct ByteLevelTable {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = keep ? uint32_t(b) : uint32_t(256 + n++);
    }
    for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = uint8_t(b);
  }
};

void append_cp(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// Decodes valid UTF-8 into code points (input was validated by the JSON parser).
bool next_cp(const std::string& s, size_t& i, uint32_t& cp) {
  if (i >= s.size()) return false;
  uint8_t c = uint8_t(s[i]);
  int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += n;
  return true;
}

// The bytes HF's ByteLevel decoder yields for one token string: the mapped bytes when every
// character is in the byte-level alphabet, else the token's own UTF-8 bytes.
std::string bytelevel_decode(const ByteLevelTable& t, const std::string& tok, bool* all_mapped) {
  std::string out;
  size_t i = 0;
  uint32_t cp;
  while (next_cp(tok, i, cp)) {
    auto it = t.cp_to_byte.find(cp);
    if (it == t.cp_to_byte.end()) {
      if (all_mapped) *all_mapped = false;
      return tok;
    }
    out += char(it->second);
  }
  if (all_mapped) *all_mapped = true;
  return out;
}

[[noreturn]] void fail(const std::string& what) { throw Error("tokenizer.json: " + what); }

const json& need(const json& j, const char* key, const char* where) {
  if (!j.is_object() || !j.contains(key)) fail(std::string(where) + ": missing \"" + key + "\"");
  return j.at(key);
}

bool get_bool(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j.at(key).is_null()) return dflt;
  if (!j.at(key).is_boolean()) fail(std::string("\"") + key + "\" must be a boolean");
  return j.at(key).get<bool>();
}

std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

SplitBehavior parse_behavior(const json& j) {
  std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("pre_tokenizer Split: unknown behavior " + j.dump());
}

std::unique_ptr<Regex> parse_pattern(const json& p, const char* where) {
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
    return std::make_unique<Regex>(p["Regex"].get<std::string>(), false);
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return std::make_unique<Regex>(p["String"].get<std::string>(), true);
  fail(std::string(where) + ": pattern must be {\"Regex\": ...} or {\"String\": ...}");
}

// GPT-2 pre-tokenization pattern of HF's ByteLevel pre-tokenizer (use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void parse_normalizer(const json& j, std::vector<NormalizerStep>& out) {
  if (j.is_null()) return;
  std::string type = need(j, "type", "normalizer").is_string() ? j["type"].get<std::string>() : "";
  NormalizerStep s;
  if (type == "Sequence") {
    const json& list = need(j, "normalizers", "normalizer Sequence");
    if (!list.is_array()) fail("normalizer Sequence: \"normalizers\" must be an array");
    for (const json& n : list) parse_normalizer(n, out);
    return;
  } else if (type == "NFC") {
    s.kind = NormalizerStep::kNFC;
  } else if (type == "NFD") {
    s.kind = NormalizerStep::kNFD;
  } else if (type == "NFKC") {
    s.kind = NormalizerStep::kNFKC;
  } else if (type == "NFKD") {
    s.kind = NormalizerStep::kNFKD;
  } else if (type == "Prepend") {
    s.kind = NormalizerStep::kPrepend;
    const json& p = need(j, "prepend", "normalizer Prepend");
    if (!p.is_string()) fail("normalizer Prepend: \"prepend\" must be a string");
    s.a = p.get<std::string>();
  } else if (type == "Replace") {
    const json& p = need(j, "pattern", "normalizer Replace");
    const json& c = need(j, "content", "normalizer Replace");
    if (!c.is_string()) fail("normalizer Replace: \"content\" must be a string");
    s.b = c.get<std::string>();
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      s.kind = NormalizerStep::kReplace;
      s.a = p["String"].get<std::string>();
      if (s.a.empty()) fail("normalizer Replace: empty pattern");
    } else {
      s.kind = NormalizerStep::kReplaceRegex;
      s.re = parse_pattern(p, "normalizer Replace");
    }
  } else {
    fail("unsupported normalizer type \"" + type + "\"");
  }
  out.push_back(std::move(s));
}

void parse_pretokenizer(const json& j, std::vector<PreTokenizerStep>& out) {
  if (j.is_null()) return;
  const json& t = need(j, "type", "pre_tokenizer");
  std::string type = t.is_string() ? t.get<std::string>() : "";
  if (type == "Sequence") {
    const json& list = need(j, "pretokenizers", "pre_tokenizer Sequence");
    if (!list.is_array()) fail("pre_tokenizer Sequence: \"pretokenizers\" must be an array");
    for (const json& p : list) parse_pretokenizer(p, out);
    return;
  }
  PreTokenizerStep s;
  if (type == "Split") {
    s.kind = PreTokenizerStep::kSplit;
    s.re = parse_pattern(need(j, "pattern", "pre_tokenizer Split"), "pre_tokenizer Split");
    s.behavior = parse_behavior(need(j, "behavior", "pre_tokenizer Split"));
    s.invert = get_bool(j, "invert", false);
  } else if (type == "ByteLevel") {
    s.kind = PreTokenizerStep::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) s.re = std::make_unique<Regex>(kGpt2Pattern);
  } else {
    fail("unsupported pre_tokenizer type \"" + type + "\"");
  }
  out.push_back(std::move(s));
}

bool decoder_is_bytelevel(const json& j) {
  if (j.is_null()) return false;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array()) {
    bool found = false;
    for (const json& d : j["decoders"]) {
      if (decoder_is_bytelevel(d)) {
        found = true;
      } else {
        fail("unsupported decoder in Sequence: " + d.value("type", std::string("?")));
      }
    }
    return found;
  }
  fail("unsupported decoder type \"" + type + "\" (only ByteLevel)");
}

// Post-processor -> ids added around a single sequence.
void parse_post_processor(const json& j, const Tokenizer::Impl& impl, std::vector<int32_t>& pre,
                          std::vector<int32_t>& post) {
  if (j.is_null()) return;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const json& p : need(j, "processors", "post_processor Sequence"))
      parse_post_processor(p, impl, pre, post);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = need(j, "single", "post_processor TemplateProcessing");
    const json& specials = j.value("special_tokens", json::object());
    bool seen_seq = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        seen_seq = true;
        continue;
      }
      if (!item.contains("SpecialToken")) fail("post_processor: bad template item " + item.dump());
      std::string name = item["SpecialToken"].value("id", "");
      if (!specials.contains(name) || !specials[name].contains("ids"))
        fail("post_processor: template names unknown special token " + name);
      for (const json& id : specials[name]["ids"]) (seen_seq ? post : pre).push_back(id.get<int32_t>());
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    pre.push_back(need(j, "cls", "post_processor")[1].get<int32_t>());
    post.push_back(need(j, "sep", "post_processor")[1].get<int32_t>());
    return;
  }
  fail("unsupported post_processor type \"" + type + "\"");
}

std::string read_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are, .gz files inflated
  if (!f) throw Error("tokenizer: cannot open " + path);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      gzclose(f);
      throw Error("tokenizer: read error in " + path);
    }
    if (n == 0) break;
    data.append(buf, size_t(n));
    if (data.size() > (size_t(1) << 31)) {
      gzclose(f);
      throw Error("tokenizer: " + path + " is too large");
    }
  }
  gzclose(f);
  return data;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    throw Error(std::string("tokenizer.json: invalid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("top level must be an object");
  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  static const ByteLevelTable kTable;  // constant table, built once (immutable)
  try {
    // ---- model ----
    const json& model = need(j, "model", "top level");
    std::string mtype = model.value("type", std::string("BPE"));
    if (mtype != "BPE") fail("unsupported model type \"" + mtype + "\" (only BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      // HF treats dropout 0.0 as no dropout at encode time.
      if (!model["dropout"].is_number() || model["dropout"].get<double>() != 0.0)
        fail("model.dropout is not supported (must be null)");
    }
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && !model[k].is_null() && model[k] != "")
        fail(std::string("model.") + k + " is not supported");
    if (get_bool(model, "byte_fallback", false)) fail("model.byte_fallback is not supported");
    m.ignore_merges = get_bool(model, "ignore_merges", false);
    const json& vocab = need(model, "vocab", "model");
    if (!vocab.is_object()) fail("model.vocab must be an object");
    int64_t max_id = -1;
    std::vector<std::pair<int32_t, const std::string*>> entries;
    entries.reserve(vocab.size());
    m.model_str_to_id.reserve(vocab.size() * 2);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) fail("model.vocab[\"" + it.key() + "\"] is not an integer");
      int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= INT32_MAX / 2) fail("model.vocab[\"" + it.key() + "\"]: id out of range");
      max_id = std::max(max_id, id);
      m.model_str_to_id[it.key()] = int32_t(id);
    }
    for (auto& [s, id] : m.model_str_to_id) entries.emplace_back(id, &s);
    // ---- added tokens ----
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      const json& at = j["added_tokens"];
      if (!at.is_array()) fail("added_tokens must be an array");
      for (const json& t : at) {
        AddedTokenInfo a;
        const json& id = need(t, "id", "added_tokens[]");
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX / 2)
          fail("added_tokens[]: bad id " + id.dump());
        a.id = id.get<int32_t>();
        const json& c = need(t, "content", "added_tokens[]");
        if (!c.is_string() || c.get<std::string>().empty())
          fail("added_tokens[]: content must be a non-empty string");
        a.content = c.get<std::string>();
        a.special = get_bool(t, "special", false);
        a.lstrip = get_bool(t, "lstrip", false);
        a.rstrip = get_bool(t, "rstrip", false);
        a.normalized = get_bool(t, "normalized", !a.special);
        a.single_word = get_bool(t, "single_word", false);
        max_id = std::max<int64_t>(max_id, a.id);
        m.added.push_back(std::move(a));
      }
    }
    // Ids need not be dense, but a wildly sparse table is refused (it would only waste memory).
    if (max_id >= (int64_t(1) << 24) || max_id >= 8 * int64_t(vocab.size() + m.added.size()) + 65536)
      fail("token ids are too sparse (largest id " + std::to_string(max_id) + ")");
    size_t n = size_t(max_id + 1);
    m.kind.assign(n, 0);
    std::vector<std::string> dec(n), str(n);
    for (auto& [id, s] : entries) {
      if (m.kind[id]) continue;  // duplicate id: keep the first seen string
      m.kind[id] = 1;
      str[id] = *s;
      dec[id] = bytelevel_decode(kTable, *s, nullptr);
    }
    // ---- merges ----
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      append_cp(ch, kTable.byte_to_cp[b]);
      auto it = m.model_str_to_id.find(ch);
      m.byte_id[b] = it == m.model_str_to_id.end() ? -1 : it->second;
    }
    const json& merges = need(model, "merges", "model");
    if (!merges.is_array()) fail("model.merges must be an array");
    m.merges.reserve(merges.size());
    int32_t rank = 0;
    for (const json& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("model.merges[" + std::to_string(rank) + "]: expected \"A B\", got \"" + s + "\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        fail("model.merges[" + std::to_string(rank) + "]: bad entry");
      }
      auto ia = m.model_str_to_id.find(a), ib = m.model_str_to_id.find(b),
           ic = m.model_str_to_id.find(a + b);
      if (ia == m.model_str_to_id.end() || ib == m.model_str_to_id.end())
        fail("model.merges[" + std::to_string(rank) + "]: token not in vocab");
      if (ic == m.model_str_to_id.end())
        fail("model.merges[" + std::to_string(rank) + "]: merged token not in vocab");
      m.merges.insert(ia->second, ib->second, rank, ic->second);
      ++rank;
    }
    if (m.ignore_merges)
      for (auto& [id, s] : entries) m.bytes_to_id.emplace(dec[id], id);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = m.model_str_to_id.find(model["unk_token"].get<std::string>());
      if (it == m.model_str_to_id.end()) fail("model.unk_token is not in the vocab");
      m.unk_id = it->second;
    }
    // ---- added tokens: tables ----
    for (size_t i = 0; i < m.added.size(); ++i) {
      const AddedTokenInfo& a = m.added[i];
      m.kind[a.id] = a.special ? 3 : 2;
      str[a.id] = a.content;
      dec[a.id] = bytelevel_decode(kTable, a.content, nullptr);
      m.added_str_to_id.emplace(a.content, a.id);
    }
    // ---- pipeline ----
    if (j.contains("normalizer")) parse_normalizer(j["normalizer"], m.normalizers);
    if (j.contains("pre_tokenizer")) parse_pretokenizer(j["pre_tokenizer"], m.pretokenizers);
    if (!decoder_is_bytelevel(j.value("decoder", json())))
      fail("a ByteLevel decoder is required");
    for (size_t i = 0; i < m.added.size(); ++i) {
      const AddedTokenInfo& a = m.added[i];
      if (a.normalized && m.has_normalizer())
        m.norm_trie.add(m.normalize(a.content), int32_t(i));
      else if (a.normalized)
        m.norm_trie.add(a.content, int32_t(i));
      else
        m.raw_trie.add(a.content, int32_t(i));
    }
    // ---- id tables ----
    m.dec_off.resize(n + 1);
    m.str_off.resize(n + 1);
    for (size_t i = 0; i < n; ++i) {
      m.dec_off[i] = uint32_t(m.dec_blob.size());
      m.dec_blob += dec[i];
      m.str_off[i] = uint32_t(m.str_blob.size());
      m.str_blob += str[i];
    }
    m.dec_off[n] = uint32_t(m.dec_blob.size());
    m.str_off[n] = uint32_t(m.str_blob.size());
    std::vector<int32_t> pre, post;
    parse_post_processor(j.value("post_processor", json()), m, pre, post);
    for (int32_t id : pre)
      if (id < 0 || size_t(id) >= n) fail("post_processor: id out of range");
    for (int32_t id : post)
      if (id < 0 || size_t(id) >= n) fail("post_processor: id out of range");
    m.prefix_ids = pre;
    m.suffix_ids = post;
  } catch (const json::exception& e) {
    throw Error(std::string("tokenizer.json: malformed: ") + e.what());
  }

  // ---- tokenizer_config.json ----
  if (!config_json.empty()) {
    json c;
    try {
      c = json::parse(config_json);
    } catch (const json::exception& e) {
      throw Error(std::string("tokenizer_config.json: invalid JSON: ") + e.what());
    }
    if (!c.is_object()) throw Error("tokenizer_config.json: top level must be an object");
    TokenizerConfig& cf = m.config;
    if (c.contains("bos_token")) cf.bos_token = token_content(c["bos_token"]);
    if (c.contains("eos_token")) cf.eos_token = token_content(c["eos_token"]);
    if (c.contains("pad_token")) cf.pad_token = token_content(c["pad_token"]);
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
      cf.has_add_bos_token = true;
      cf.add_bos_token = c["add_bos_token"].get<bool>();
    }
    if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) {
      cf.has_add_eos_token = true;
      cf.add_eos_token = c["add_eos_token"].get<bool>();
    }
    if (c.contains("model_max_length") && c["model_max_length"].is_number())
      cf.model_max_length = int64_t(std::min(c["model_max_length"].get<double>(), 9.0e18));
    if (c.contains("chat_template")) {
      const json& t = c["chat_template"];
      if (t.is_string()) {
        cf.chat_template = t.get<std::string>();
      } else if (t.is_array()) {
        for (const json& e : t)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
              e["template"].is_string())
            cf.chat_template = e["template"].get<std::string>();
      }
    }
  }
  auto lookup = [&](const std::string& s) -> int32_t {
    if (s.empty()) return -1;
    if (auto it = m.added_str_to_id.find(s); it != m.added_str_to_id.end()) return it->second;
    if (auto it = m.model_str_to_id.find(s); it != m.model_str_to_id.end()) return it->second;
    return -1;
  };
  m.bos = lookup(m.config.bos_token);
  m.eos = lookup(m.config.eos_token);
  m.pad = lookup(m.config.pad_token);
  if (m.config.has_add_bos_token || m.config.has_add_eos_token) {
    // transformers (Llama-style fast tokenizers) rebuild the post-processor from these flags.
    m.prefix_ids.clear();
    m.suffix_ids.clear();
    if (m.config.add_bos_token) {
      if (m.bos < 0) throw Error("tokenizer_config.json: add_bos_token set but bos_token unknown");
      m.prefix_ids.push_back(m.bos);
    }
    if (m.config.add_eos_token) {
      if (m.eos < 0) throw Error("tokenizer_config.json: add_eos_token set but eos_token unknown");
      m.suffix_ids.push_back(m.eos);
    }
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path), file;
  if (fs::is_directory(p, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.json.gz"})
      if (fs::is_regular_file(p / name, ec)) {
        file = p / name;
        break;
      }
    if (file.empty()) throw Error("tokenizer: no tokenizer.json in directory " + path);
  } else if (fs::is_regular_file(p, ec)) {
    file = p;
  } else {
    throw Error("tokenizer: no such file or directory: " + path);
  }
  std::string tok = read_file(file.string());
  std::string cfg;
  fs::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  for (const char* name : {"tokenizer_config.json", "tokenizer_config.json.gz"})
    if (fs::is_regular_file(dir / name, ec)) {
      cfg = read_file((dir / name).string());
      break;
    }
  try {
    return from_json(tok, cfg);
  } catch (const Error& e) {
    throw Error(file.string() + ": " + e.what());
  }
}

}  // namespace deepinfer::tokenizer
