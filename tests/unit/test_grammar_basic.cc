// Core matcher behaviour on a small hand-made vocabulary: masks, EOS, rollback, errors.
#include <gtest/gtest.h>

#include "grammar/grammar.h"
#include "util/error.h"

using namespace deepinfer::grammar;

namespace {

std::shared_ptr<const Vocabulary> small_vocab() {
  // id 0 = EOS (special), id 1 = another special, then byte-ish tokens.
  std::vector<std::string> t = {"<eos>", "<sp>", "a", "b", "ab", "abc", "c", "\"", "{", "}", ":", ",", " ",
                                "1", "12", "-", "x\"", "\"}", "true", "null", "[", "]", "0", ".", "5"};
  std::vector<bool> sp(t.size(), false);
  sp[0] = sp[1] = true;
  return Vocabulary::create(t, sp, 0, 40);
}

std::vector<int> allowed(Matcher& m) {
  std::vector<uint32_t> w(m.grammar().vocab().mask_words());
  m.fill_mask(w.data());
  std::vector<int> out;
  for (int i = 0; i < 40; ++i)
    if (w[i / 32] >> (i % 32) & 1) out.push_back(i);
  return out;
}

TEST(GrammarBasic, RegexMaskAndEos) {
  auto v = small_vocab();
  auto g = compile({SpecKind::Regex, "(ab)+c?"}, v);
  Matcher m(g);
  EXPECT_EQ(allowed(m), (std::vector<int>{2, 4, 5}));  // a, ab, abc
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_token(4));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(allowed(m), (std::vector<int>{0, 2, 4, 5, 6}));
  EXPECT_FALSE(m.accept_token(3));
  ASSERT_TRUE(m.accept_token(6));
  EXPECT_EQ(allowed(m), (std::vector<int>{0}));
  ASSERT_TRUE(m.accept_token(0));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_TRUE(allowed(m).empty());
  m.rollback(2);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_EQ(allowed(m), (std::vector<int>{0, 2, 4, 5, 6}));
  EXPECT_THROW(m.rollback(5), deepinfer::Error);
}

TEST(GrammarBasic, SpecialAndPaddingNeverAllowed) {
  auto v = small_vocab();
  auto g = compile({SpecKind::Regex, "[\\s\\S]*"}, v);
  Matcher m(g);
  auto a = allowed(m);
  EXPECT_EQ(std::count(a.begin(), a.end(), 1), 0);
  EXPECT_EQ(a.back(), 24);  // nothing past the vocabulary (padding ids 25..39)
  EXPECT_EQ(a.front(), 0);  // EOS: the empty string matches
  EXPECT_FALSE(m.accept_token(1));
  EXPECT_FALSE(m.accept_token(30));
}

TEST(GrammarBasic, RecursiveGbnfNeedsStack) {
  auto v = small_vocab();
  auto g = compile({SpecKind::Gbnf, "root ::= \"[\" root? \"]\""}, v);
  Matcher m(g);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.accept_token(20));
  EXPECT_EQ(allowed(m), (std::vector<int>{20, 21}));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.accept_token(21));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_token(21));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(allowed(m), (std::vector<int>{0}));
}

TEST(GrammarBasic, TokenCrossingRuleBoundary) {
  auto v = small_vocab();
  // "x\"" and "\"}" cross from the string body into the object structure.
  auto g = compile({SpecKind::JsonSchema, R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false})"}, v);
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes("{\"a\":\"x"));
  auto a = allowed(m);
  EXPECT_NE(std::find(a.begin(), a.end(), 16), a.end());  // x"
  EXPECT_NE(std::find(a.begin(), a.end(), 17), a.end());  // "}
  ASSERT_TRUE(m.accept_token(17));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarBasic, Errors) {
  auto v = small_vocab();
  EXPECT_THROW(compile({SpecKind::Regex, "(a"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::Regex, "(a)\\1"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::Regex, "a(?=b)"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::Gbnf, "root ::= x"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::Gbnf, "root ::= root \"a\" | \"b\""}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::JsonSchema, R"({"not":{}})"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::JsonSchema, R"({"type":"string","format":"no-such"})"}, v), deepinfer::Error);
  EXPECT_THROW(compile({SpecKind::JsonSchema, "{"}, v), deepinfer::Error);
}

TEST(GrammarBasic, CacheSharesCompiledGrammars) {
  auto v = small_vocab();
  GrammarCache c(v, 2);
  auto g1 = c.get({SpecKind::Regex, "a+"});
  auto g2 = c.get({SpecKind::Regex, "a+"});
  EXPECT_EQ(g1.get(), g2.get());
  c.get({SpecKind::Regex, "b+"});
  c.get({SpecKind::Regex, "c+"});
  EXPECT_EQ(c.size(), 2u);
  EXPECT_NE(c.get({SpecKind::Regex, "a+"}).get(), g1.get());  // evicted, recompiled
}

}  // namespace
