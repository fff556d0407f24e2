// Exact parity with Hugging Face `tokenizers` on the committed corpus (tests/data/tokenizer/).
// References come from scripts/tokenizer/make_reference.py; every id sequence is compared whole.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/json.h"

using deepinfer::tokenizer::ParseSpecial;
using deepinfer::tokenizer::Tokenizer;
using nlohmann::json;

namespace {

const std::string kData = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/tokenizer/";

std::vector<std::string> read_gz_lines(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return {};
  std::string all;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, size_t(n));
  gzclose(f);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t e = all.find('\n', pos);
    if (e == std::string::npos) e = all.size();
    lines.push_back(all.substr(pos, e - pos));
    pos = e + 1;
  }
  return lines;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> out;
    for (const std::string& l : read_gz_lines(kData + "corpus.jsonl.gz"))
      out.push_back(json::parse(l).get<std::string>());
    return out;
  }();
  return c;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

void check_tokenizer(const std::string& name) {
  const auto& texts = corpus();
  ASSERT_GT(texts.size(), 20000u) << "corpus missing: run scripts/tokenizer/make_reference.py";
  Tokenizer tok = Tokenizer::from_file(kData + name);
  auto lines = read_gz_lines(kData + name + "/ref.jsonl.gz");
  ASSERT_FALSE(lines.empty()) << "no references for " << name;
  json header = json::parse(lines[0]);
  ASSERT_EQ(header["count"].get<size_t>(), texts.size()) << "references are for another corpus";
  ASSERT_GE(lines.size(), texts.size() + 1);

  size_t compared[4] = {0, 0, 0, 0}, bad[4] = {0, 0, 0, 0};
  int shown = 0;
  auto report = [&](const char* what, size_t i, const std::string& got, const std::string& want) {
    if (shown++ < 8)
      ADD_FAILURE() << name << " " << what << " mismatch on corpus line " << i << " "
                    << json(texts[i]).dump() << "\n  got  " << got << "\n  want " << want;
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    json r = json::parse(lines[i + 1]);
    auto a = r["a"].get<std::vector<int32_t>>();
    auto s = r.contains("s") ? r["s"].get<std::vector<int32_t>>() : a;
    auto n = r.contains("n") ? r["n"].get<std::vector<int32_t>>() : a;
    std::string d = r.contains("d") ? r["d"].get<std::string>() : texts[i];
    const std::vector<int32_t>* want[3] = {&a, &s, &n};
    const ParseSpecial modes[3] = {ParseSpecial::kAll, ParseSpecial::kNonSpecialOnly,
                                   ParseSpecial::kNone};
    const char* mname[3] = {"encode", "encode(special as text)", "encode(no added tokens)"};
    for (int k = 0; k < 3; ++k) {
      auto got = tok.encode(texts[i], false, modes[k]);
      ++compared[k];
      if (got != *want[k]) {
        ++bad[k];
        report(mname[k], i, show(got), show(*want[k]));
      }
    }
    ++compared[3];
    std::string got = tok.decode(a, false);
    if (got != d) {
      ++bad[3];
      report("decode", i, json(got).dump(), json(d).dump());
    }
  }
  size_t dec_cases = 0, dec_bad = 0;
  for (size_t l = texts.size() + 1; l < lines.size(); ++l) {
    if (lines[l].empty()) continue;
    json r = json::parse(lines[l]);
    auto ids = r["ids"].get<std::vector<int32_t>>();
    ++dec_cases;
    std::string d = tok.decode(ids, false), ds = tok.decode(ids, true);
    if (d != r["d"].get<std::string>() || ds != r["ds"].get<std::string>()) {
      ++dec_bad;
      if (shown++ < 8)
        ADD_FAILURE() << name << " decode of " << show(ids) << "\n  got  " << json(d).dump()
                      << " / " << json(ds).dump() << "\n  want " << r["d"].dump() << " / "
                      << r["ds"].dump();
    }
  }
  std::printf("[parity] %s (HF tokenizers %s): %zu strings; mismatches: encode %zu, "
              "special-as-text %zu, no-added-tokens %zu, decode %zu; %zu random-id decodes, %zu "
              "mismatches\n",
              name.c_str(), header.value("tokenizers_version", "?").c_str(), compared[0], bad[0],
              bad[1], bad[2], bad[3], dec_cases, dec_bad);
  EXPECT_EQ(bad[0] + bad[1] + bad[2] + bad[3] + dec_bad, 0u);
}

}  // namespace

TEST(TokenizerParity, DeepSeekV3) { check_tokenizer("deepseek-v3"); }
TEST(TokenizerParity, DeepSeekV4) { check_tokenizer("deepseek-v4"); }
TEST(TokenizerParity, AnthropicLegacyNFKC) { check_tokenizer("anthropic-legacy"); }

// Batch encoding (all threads) gives the same ids as one-by-one encoding.
TEST(TokenizerParity, BatchEqualsSequential) {
  Tokenizer tok = Tokenizer::from_file(kData + "deepseek-v3");
  const std::vector<std::string>& texts = corpus();  // batch memoizes pre-tokens per thread
  auto batch = tok.encode_batch(texts, false, ParseSpecial::kAll, 4);
  ASSERT_EQ(batch.size(), texts.size());
  size_t bad = 0;
  for (size_t i = 0; i < texts.size(); ++i) bad += batch[i] != tok.encode(texts[i]);
  EXPECT_EQ(bad, 0u);
  auto with = tok.encode_batch(texts, true, ParseSpecial::kNone, 2);
  for (size_t i = 0; i < texts.size(); i += 97) EXPECT_EQ(with[i], tok.encode(texts[i], true, ParseSpecial::kNone));
}
