// Seeded random generation under the mask for a set of schemas. The committed expectations
// (tests/data/grammar/generated_samples.json) were produced by scripts/grammar/validate_samples.py,
// which validated every completed output with Python's jsonschema (the judge). Here each sample
// must regenerate byte for byte (determinism) and be one that jsonschema accepted; every output
// must also parse as JSON. Set DEEPINFER_GRAMMAR_WRITE_SAMPLES=path to write fresh samples.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "grammar/grammar.h"
#include "grammar/testing.h"

using namespace deepinfer::grammar;
using ojson = nlohmann::ordered_json;

namespace {

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) { out += d[c >> 4]; out += d[c & 15]; }
  return out;
}

TEST(GrammarGenerated, SamplesValidateAndReproduce) {
  auto v = load_vocab_from_tokenizer_json(DEEPINFER_SOURCE_DIR "/tests/data/grammar/deepseek-v3/tokenizer.json", 129280);
  std::ifstream f(DEEPINFER_SOURCE_DIR "/tests/data/grammar/sample_schemas.json");
  ojson schemas = ojson::parse(f);
  ojson out = ojson::array();
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto g = compile({SpecKind::JsonSchema, schemas[i].dump()}, v);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      auto s = testkit::sample(g, seed * 1000 + i, 1500, 0.5);
      if (s.completed) {
        EXPECT_TRUE(ojson::accept(s.text)) << "schema " << i << " seed " << seed << ": " << s.text;
      }
      out.push_back({{"schema", i}, {"seed", seed}, {"completed", s.completed}, {"hex", hex(s.text)}, {"tokens", s.tokens.size()}});
    }
  }
  if (const char* path = std::getenv("DEEPINFER_GRAMMAR_WRITE_SAMPLES")) {
    std::ofstream(path) << out.dump(1);
    return;
  }
  std::ifstream e(DEEPINFER_SOURCE_DIR "/tests/data/grammar/generated_samples.json");
  ASSERT_TRUE(e.good()) << "run scripts/grammar/validate_samples.py";
  ojson expect = ojson::parse(e);
  ASSERT_EQ(expect.size(), out.size());
  int completed = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    EXPECT_EQ(out[k]["hex"], expect[k]["hex"]) << "sample " << k << " changed: regenerate and re-validate";
    if (expect[k]["completed"].get<bool>()) {
      ++completed;
      EXPECT_TRUE(expect[k]["valid"].get<bool>()) << "jsonschema rejected sample " << k << ": " << expect[k]["error"];
    }
  }
  EXPECT_GE(completed, (int)out.size() * 2 / 3);
}

}  // namespace
