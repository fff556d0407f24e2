// Tokenizer behaviour beyond corpus parity: loading errors, the invalid-UTF-8 rule, special-token
// safety, post-processing, the streaming detokenizer.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

using deepinfer::Error;
using deepinfer::tokenizer::ParseSpecial;
using deepinfer::tokenizer::StreamDecoder;
using deepinfer::tokenizer::Tokenizer;
namespace utf8 = deepinfer::tokenizer::utf8;
using nlohmann::json;

namespace {

const std::string kData = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/tokenizer/";

std::string gz_read(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return {};
  std::string all;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, size_t(n));
  gzclose(f);
  return all;
}

std::vector<std::string> lines_of(const std::string& all) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t e = all.find('\n', pos);
    if (e == std::string::npos) e = all.size();
    if (e > pos) out.push_back(all.substr(pos, e - pos));
    pos = e + 1;
  }
  return out;
}

const Tokenizer& v3() {
  static const Tokenizer t = Tokenizer::from_file(kData + "deepseek-v3");
  return t;
}
const Tokenizer& v4() {
  static const Tokenizer t = Tokenizer::from_file(kData + "deepseek-v4");
  return t;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> out;
    for (const auto& l : lines_of(gz_read(kData + "corpus.jsonl.gz")))
      out.push_back(json::parse(l).get<std::string>());
    return out;
  }();
  return c;
}

// A tiny valid tokenizer.json to mutate.
json tiny() {
  json vocab = json::object();
  // byte-level symbols for 'a', 'b', and merged "ab"
  vocab["a"] = 0;
  vocab["b"] = 1;
  vocab["ab"] = 2;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", 3}, {"content", "<s>"}, {"special", true},
                                                 {"lstrip", false}, {"rstrip", false},
                                                 {"normalized", false}, {"single_word", false}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                                     {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", json{{"type", "ByteLevel"}}},
              {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

void expect_error(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_json(text);
    ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(TokenizerLoad, TinyTokenizerWorks) {
  Tokenizer t = Tokenizer::from_json(tiny().dump());
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t.encode("a<s>b"), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 3, 0}), "ab<s>a");
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 3, 0}, true), "aba");
  EXPECT_EQ(t.vocab_size(), 4u);
}

TEST(TokenizerLoad, MalformedFilesGiveClearErrors) {
  expect_error("{not json", "invalid JSON");
  expect_error("[1,2]", "top level");
  json j = tiny();
  j.erase("model");
  expect_error(j.dump(), "missing \"model\"");
  j = tiny();
  j["model"]["type"] = "WordPiece";
  expect_error(j.dump(), "unsupported model type");
  j = tiny();
  j["model"]["merges"] = json::array({"a c"});
  expect_error(j.dump(), "not in vocab");
  j = tiny();
  j["model"]["merges"] = json::array({"ab"});
  expect_error(j.dump(), "expected \"A B\"");
  j = tiny();
  j["model"]["vocab"]["x"] = "seven";
  expect_error(j.dump(), "is not an integer");
  j = tiny();
  j["model"]["vocab"]["x"] = -4;
  expect_error(j.dump(), "out of range");
  j = tiny();
  j["added_tokens"][0]["content"] = "";
  expect_error(j.dump(), "non-empty");
  j = tiny();
  j["added_tokens"][0].erase("id");
  expect_error(j.dump(), "missing \"id\"");
  j = tiny();
  j["pre_tokenizer"] = json{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                            {"behavior", "Isolated"}};
  expect_error(j.dump(), "regex pattern rejected");
  j = tiny();
  j["pre_tokenizer"] = json{{"type", "Metaspace"}};
  expect_error(j.dump(), "unsupported pre_tokenizer");
  j = tiny();
  j["decoder"] = json{{"type", "WordPiece"}};
  expect_error(j.dump(), "unsupported decoder");
  j = tiny();
  j["normalizer"] = json{{"type", "BertNormalizer"}};
  expect_error(j.dump(), "unsupported normalizer");
  j = tiny();
  j["model"]["byte_fallback"] = true;
  expect_error(j.dump(), "byte_fallback");
  j = tiny();
  j["model"]["merges"] = 5;
  expect_error(j.dump(), "merges must be an array");
}

TEST(TokenizerLoad, BadPathsAndConfig) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  auto dir = std::filesystem::temp_directory_path() / "deepinfer_tok_test_empty";
  std::filesystem::create_directories(dir);
  EXPECT_THROW(Tokenizer::from_file(dir.string()), Error);
  {
    std::ofstream(dir / "tokenizer.json") << "\x1f\x8b garbage";
  }
  EXPECT_THROW(Tokenizer::from_file(dir.string()), Error);
  {
    std::ofstream(dir / "tokenizer.json") << tiny().dump();
    std::ofstream(dir / "tokenizer_config.json") << "{\"add_bos_token\": true, \"bos_token\": \"<nope>\"}";
  }
  EXPECT_THROW(Tokenizer::from_file(dir.string()), Error);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(Tokenizer::from_json(tiny().dump(), "{oops"), Error);
}

TEST(TokenizerLoad, RealTokenizersMetadata) {
  EXPECT_EQ(v3().bos_id(), 0);
  EXPECT_EQ(v3().eos_id(), 1);
  EXPECT_EQ(v3().vocab_size(), 128815u);
  EXPECT_EQ(v4().vocab_size(), 129280u);
  EXPECT_EQ(v3().token_to_id("<｜User｜>").value_or(-1), 128803);
  EXPECT_EQ(v3().id_to_token(128803).value_or(""), "<｜User｜>");
  for (int32_t id : {0, 5, 100, 5000, 127999, 128000, 128814}) {
    auto s = v3().id_to_token(id);
    ASSERT_TRUE(s.has_value()) << id;
    EXPECT_EQ(v3().token_to_id(*s).value_or(-1), id);
  }
  EXPECT_FALSE(v3().id_to_token(200000).has_value());
  EXPECT_FALSE(v3().token_to_id("definitely not a token").has_value());
  EXPECT_TRUE(v3().is_special(0));
  EXPECT_FALSE(v3().is_special(128803));  // <｜User｜> is a non-special added token in V3
  EXPECT_TRUE(v3().is_added(128803));
  EXPECT_FALSE(v3().config().chat_template.empty());
}

// ---------------------------------------------------------------------------------------------
TEST(TokenizerPostProcess, AddSpecialTokensFollowsConfig) {
  const std::string text = "Hello world";
  auto plain = v3().encode(text);
  auto with = v3().encode(text, true);
  ASSERT_EQ(with.size(), plain.size() + 1);  // V3: add_bos_token = true
  EXPECT_EQ(with[0], v3().bos_id());
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), plain);
  EXPECT_EQ(v4().encode(text, true), v4().encode(text));  // V4: add_bos_token = false
  EXPECT_NE(plain.front(), v3().bos_id());
}

// ---------------------------------------------------------------------------------------------
// The lossy rule for invalid UTF-8 against CPython's bytes.decode("utf-8", "replace"), recorded
// by make_reference.py in utf8_lossy.jsonl.gz.
TEST(TokenizerUtf8, LossyRuleMatchesPython) {
  auto lines = lines_of(gz_read(kData + "utf8_lossy.jsonl.gz"));
  ASSERT_GT(lines.size(), 1000u);
  size_t bad = 0;
  for (const auto& l : lines) {
    json r = json::parse(l);
    std::string hex = r["hex"].get<std::string>(), bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += char(std::stoi(hex.substr(i, 2), nullptr, 16));
    std::string want = r["text"].get<std::string>();
    std::string got = utf8::to_valid(bytes);
    EXPECT_EQ(utf8::is_valid(bytes), got == bytes) << hex;
    if (got != want && bad++ < 5) ADD_FAILURE() << hex << ": got " << json(got).dump() << " want " << json(want).dump();
    // Encoding invalid input = encoding its repaired form.
    EXPECT_EQ(v3().encode(bytes), v3().encode(want)) << hex;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(TokenizerUtf8, DecodeIsAlwaysValid) {
  std::mt19937 rng(7);
  for (int k = 0; k < 2000; ++k) {
    std::vector<int32_t> ids;
    for (int i = 0, n = int(rng() % 12) + 1; i < n; ++i) ids.push_back(int32_t(rng() % 700));
    EXPECT_TRUE(utf8::is_valid(v3().decode(ids)));
  }
}

// ---------------------------------------------------------------------------------------------
// Safety: with ParseSpecial::kNone no text can produce an added (control) token.
TEST(TokenizerSafety, UntrustedTextNeverYieldsControlTokens) {
  for (const Tokenizer* t : {&v3(), &v4()}) {
    std::string all;
    for (const auto& a : t->added_tokens()) {
      all += a.content;
      all += " x";
      all += a.content;
      auto ids = t->encode(a.content, false, ParseSpecial::kNone);
      for (int32_t id : ids) ASSERT_FALSE(t->is_added(id)) << a.content << " -> " << id;
      EXPECT_EQ(t->decode(ids), a.content);  // the text survives as ordinary tokens
      auto parsed = t->encode(a.content, false, ParseSpecial::kAll);
      EXPECT_EQ(parsed, std::vector<int32_t>{a.id}) << a.content;
    }
    for (int32_t id : t->encode(all, false, ParseSpecial::kNone)) ASSERT_FALSE(t->is_added(id));
  }
  // and for the whole corpus (which embeds special-token strings)
  size_t n = 0;
  for (const auto& s : corpus()) {
    for (int32_t id : v4().encode(s, false, ParseSpecial::kNone)) ASSERT_FALSE(v4().is_added(id));
    ++n;
  }
  EXPECT_GT(n, 20000u);
}

// ---------------------------------------------------------------------------------------------
TEST(TokenizerRegex, TranslationFollowsOniguruma) {
  using deepinfer::tokenizer::Regex;
  Regex::Scratch sc;
  size_t b, e;
  // U+180E is not White_Space (Oniguruma), although PCRE2's \s matches it.
  Regex ws("\\s+");
  EXPECT_FALSE(ws.find("\xE1\xA0\x8E", 0, b, e, sc));
  EXPECT_TRUE(ws.find("a\xC2\x85", 0, b, e, sc));  // U+0085 is
  // U+1F6DC (Unicode 15 symbol) is \p{S}; U+31350 (Unicode 15 CJK) is \p{L}.
  Regex sym("^\\p{S}$"), let("^[^\\p{P}]\\p{L}$");
  EXPECT_TRUE(sym.find("\xF0\x9F\x9B\x9C", 0, b, e, sc));
  EXPECT_TRUE(let.find("a\xF0\xB1\x8D\x90", 0, b, e, sc));
}

// ---------------------------------------------------------------------------------------------
// Streaming: deltas are valid UTF-8 (never split a character) and concatenate to decode(ids).
TEST(TokenizerStream, DeltasConcatenateToDecode) {
  std::mt19937 rng(11);
  size_t cases = 0;
  auto check = [&](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
    StreamDecoder sd(t, skip);
    std::string acc;
    for (int32_t id : ids) {
      std::string d = sd.push(id);
      ASSERT_TRUE(utf8::is_valid(d));
      acc += d;
    }
    acc += sd.finish();
    ASSERT_EQ(acc, t.decode(ids, skip));
    ++cases;
  };
  const auto& c = corpus();
  for (size_t i = 0; i < c.size(); i += 7) check(v3(), v3().encode(c[i]), false);
  for (int k = 0; k < 3000; ++k) {  // random ids: many partial UTF-8 sequences and specials
    std::vector<int32_t> ids;
    for (int i = 0, n = int(rng() % 20) + 1; i < n; ++i)
      ids.push_back(rng() % 3 ? int32_t(rng() % 600) : int32_t(rng() % 129300));
    check(v4(), ids, false);
    check(v4(), ids, true);
  }
  EXPECT_GT(cases, 8000u);
}

TEST(TokenizerStream, HoldsIncompleteCharacter) {
  // "é" is split over two byte tokens in a byte-level vocab: first push yields nothing.
  auto ids = v3().encode("\xF0\x9F\x98\x80");  // U+1F600 😀
  StreamDecoder sd(v3());
  std::string acc;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string d = sd.push(ids[i]);
    if (i + 1 < ids.size()) EXPECT_TRUE(d.empty() || utf8::is_valid(d));
    acc += d;
  }
  EXPECT_EQ(acc + sd.finish(), "\xF0\x9F\x98\x80");
  StreamDecoder s2(v3());
  EXPECT_EQ(s2.push(v3().encode("\xC3\xA9")[0]) + s2.finish(), v3().decode(std::vector<int32_t>{v3().encode("\xC3\xA9")[0]}));
}
