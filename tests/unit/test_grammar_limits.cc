// Every bound on hostile input is a clear deepinfer::Error naming the limit: spec size, nesting,
// enum size, repetition counts, NFA and DFA state counts, compile time.
#include <gtest/gtest.h>

#include "grammar/grammar.h"
#include "util/error.h"

using namespace deepinfer::grammar;

namespace {

std::shared_ptr<const Vocabulary> byte_vocab() {
  std::vector<std::string> t = {"<eos>"};
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, (char)b));
  std::vector<bool> sp(t.size(), false);
  sp[0] = true;
  return Vocabulary::create(t, sp, 0, 257);
}

// Compiles (and takes one mask); returns the error message, "" if it succeeded.
std::string error_of(SpecKind k, const std::string& text, const Limits& lim) {
  try {
    auto g = compile({k, text}, byte_vocab(), lim);
    Matcher m(g);
    std::vector<uint32_t> w(g->vocab().mask_words());
    m.fill_mask(w.data());
    return "";
  } catch (const deepinfer::Error& e) {
    return e.what();
  }
}

#define EXPECT_ERROR_HAS(call, needle)                                     \
  do {                                                                     \
    std::string msg_ = (call);                                             \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "got: '" << msg_ << "'"; \
  } while (0)

}  // namespace

TEST(GrammarLimits, SpecSize) {
  Limits lim;
  lim.max_spec_bytes = 100;
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, std::string(101, 'a'), lim), "spec larger than the limit");
  EXPECT_EQ(error_of(SpecKind::Regex, std::string(100, 'a'), lim), "");
}

TEST(GrammarLimits, Nesting) {
  Limits lim;
  lim.max_nesting = 10;
  std::string schema;
  for (int i = 0; i < 11; ++i) schema += "{\"items\":";
  schema += "true" + std::string(11, '}');
  EXPECT_ERROR_HAS(error_of(SpecKind::JsonSchema, schema, lim), "nesting deeper than 10");
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, std::string(11, '(') + "a" + std::string(11, ')'), lim), "nest");
  EXPECT_EQ(error_of(SpecKind::Regex, std::string(9, '(') + "a" + std::string(9, ')'), lim), "");
}

TEST(GrammarLimits, EnumSize) {
  Limits lim;
  lim.max_enum_values = 1000;
  std::string e = "{\"enum\":[0";
  for (int i = 1; i < 1001; ++i) e += "," + std::to_string(i);
  EXPECT_ERROR_HAS(error_of(SpecKind::JsonSchema, e + "]}", lim), "enum has 1001 values, above the limit of 1000");
  lim.max_enum_values = 1001;
  EXPECT_EQ(error_of(SpecKind::JsonSchema, e + "]}", lim), "");
}

TEST(GrammarLimits, RepetitionCount) {
  Limits lim;
  lim.max_repeat = 50;
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, "a{51}", lim), "repetition count above limit");
  EXPECT_ERROR_HAS(error_of(SpecKind::JsonSchema, R"({"type":"string","maxLength":51})", lim), "limit");
}

TEST(GrammarLimits, AutomatonStates) {
  Limits lim;
  lim.max_nfa_states = 500;
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, "(abcdefghij){60}", lim), "NFA state limit");
  Limits dfa;
  dfa.max_dfa_states = 300;  // [ab]*a[ab]{n}: the DFA needs 2^(n+1) states
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, "[ab]*a[ab]{12}", dfa), "DFA state limit");
  EXPECT_EQ(error_of(SpecKind::Regex, "[ab]*a[ab]{4}", dfa), "");
}

TEST(GrammarLimits, CompileTime) {
  Limits lim;
  lim.compile_seconds = 0;  // already past the deadline at the first check
  lim.max_dfa_states = 1 << 20;
  EXPECT_ERROR_HAS(error_of(SpecKind::Regex, "[ab]*a[ab]{14}", lim), "compile time limit exceeded");
}
// Live parse stacks (the "too ambiguous" cap): test_grammar_gbnf.cc, AmbiguousGrammarStaysBounded.
