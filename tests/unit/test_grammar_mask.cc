// Brute-force mask check on the real DeepSeek vocabulary: along seeded random walks, every
// token's mask bit must equal the verdict of feeding its bytes one by one through the matcher
// (character-level simulation, no trie, no cached token sets), and EOS must follow can_end().
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "grammar/testing.h"

using namespace deepinfer::grammar;

namespace {

std::shared_ptr<const Vocabulary> vocab() {
  static auto v = load_vocab_from_tokenizer_json(
      DEEPINFER_SOURCE_DIR "/tests/data/grammar/deepseek-v3/tokenizer.json", 129280);
  return v;
}

TEST(GrammarMask, VocabularyLoads) {
  auto v = vocab();
  EXPECT_EQ(v->logits_width(), 129280);
  EXPECT_EQ(v->size(), 128815u);
  EXPECT_EQ(v->eos_id(), 1);
  EXPECT_TRUE(v->is_special(0));
  // A leading-space token is stored as raw bytes, not the GPT-2 alias "Ġ".
  auto t = testkit::greedy_tokenize(*v, " hello");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(v->token(t[0]), " hello");
}

struct Case {
  SpecKind kind;
  const char* text;
};

const Case kCases[] = {
    {SpecKind::Regex, "[a-z]{2,5}(-[0-9]+)?"},
    {SpecKind::Regex, "(\\+|-)?\\d{1,3}(\\.\\d{2})? (USD|EUR)"},
    {SpecKind::Regex, "[^\"]{0,12}\u00e9\u4e2d"},
    {SpecKind::JsonObject, ""},
    {SpecKind::JsonSchema, R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"enum":["a","b","c d"]},"maxItems":3}},"required":["name"]})"},
    {SpecKind::JsonSchema, R"({"type":"array","prefixItems":[{"type":"number","exclusiveMinimum":-2,"maximum":3},{"type":"boolean"}],"items":{"type":"null"}})"},
    {SpecKind::JsonSchema, R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"})"},
    {SpecKind::JsonSchema, R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"},"code":{"type":"string","pattern":"^[A-Z]{2}\\d+$","maxLength":6}},"additionalProperties":{"type":"integer"}})"},
    {SpecKind::Gbnf, "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n"},
    {SpecKind::Gbnf, "root ::= \"say \" word (\" \" word){0,3} \".\"\nword ::= [a-z\\u00e0-\\u00ff]+\n"},
};

class MaskCheck : public ::testing::TestWithParam<int> {};

TEST_P(MaskCheck, EqualsCharacterLevelSimulation) {
  const Case& c = kCases[GetParam()];
  auto v = vocab();
  auto g = compile({c.kind, c.text}, v);
  size_t diffs = 0, steps = 0;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    Matcher m(g), ref(g);
    std::mt19937_64 rng(seed * 7919 + GetParam());
    std::vector<uint32_t> mask(v->mask_words());
    for (int step = 0; step < 10; ++step) {
      m.fill_mask(mask.data());
      ++steps;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v->logits_width(); ++id) {
        bool got = mask[id >> 5] >> (id & 31) & 1;
        bool want;
        if (id >= (int32_t)v->size()) want = false;
        else if (id == v->eos_id()) want = ref.can_end();
        else if (v->is_special(id)) want = false;
        else {
          want = ref.accept_bytes(v->token(id));
          if (want) ref.rollback(1);
        }
        if (got != want && diffs++ < 5)
          ADD_FAILURE() << "spec " << c.text << " seed " << seed << " step " << step << " token " << id
                        << " '" << (id < (int32_t)v->size() ? v->token(id) : "") << "' mask=" << got;
        if (got && id != v->eos_id()) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      // Prefer short tokens half the time so walks get past string bodies into structure.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2) {
        std::vector<int32_t> shorts;
        for (int32_t id : allowed)
          if (v->token(id).size() <= 2) shorts.push_back(id);
        if (!shorts.empty()) pick = shorts[rng() % shorts.size()];
      }
      ASSERT_TRUE(m.accept_token(pick));
      ASSERT_TRUE(ref.accept_token(pick));
    }
  }
  EXPECT_EQ(diffs, 0u) << "over " << steps << " masks";
}

INSTANTIATE_TEST_SUITE_P(Specs, MaskCheck, ::testing::Range(0, (int)(sizeof(kCases) / sizeof(kCases[0]))));

}  // namespace
