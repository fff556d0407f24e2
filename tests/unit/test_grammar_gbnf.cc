// GBNF parsing and matching (llama.cpp dialect), and the limits that keep hostile specs bounded.
#include <gtest/gtest.h>

#include <chrono>

#include "grammar/grammar.h"
#include "util/error.h"

using namespace deepinfer::grammar;

namespace {

std::shared_ptr<const Vocabulary> byte_vocab() {
  std::vector<std::string> t(257);
  std::vector<bool> sp(257, false);
  for (int b = 0; b < 256; ++b) t[b + 1] = std::string(1, static_cast<char>(b));
  sp[0] = true;
  return Vocabulary::create(t, sp, 0, 257);
}

bool full(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  Matcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

const char* kArith = R"G(# arithmetic, as in llama.cpp's grammars/arithmetic.gbnf
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)G";

TEST(GrammarGbnf, Arithmetic) {
  auto g = compile({SpecKind::Gbnf, kArith}, byte_vocab());
  EXPECT_TRUE(full(g, "1+2= 3\n"));
  EXPECT_TRUE(full(g, "(a+b)*c= x_1\n(1)=2\n"));
  EXPECT_TRUE(full(g, "((((1))))=1\n"));
  EXPECT_FALSE(full(g, "1+= 3\n"));
  EXPECT_FALSE(full(g, "(1= 3\n"));
  EXPECT_FALSE(full(g, "1=3"));
  EXPECT_FALSE(full(g, ""));
}

TEST(GrammarGbnf, LiteralsClassesRepetition) {
  auto v = byte_vocab();
  auto g = compile({SpecKind::Gbnf, "root ::= \"\\x41\\u00e9\" [^a-y\\n]{2,3} (\"|\" | \"\\\"\")? .\n"}, v);
  EXPECT_TRUE(full(g, "A\xc3\xa9zz|\xe4\xb8\x80"));
  EXPECT_TRUE(full(g, "A\xc3\xa9" "ZZZ\"q"));
  EXPECT_FALSE(full(g, "A\xc3\xa9" "za|q"));
  EXPECT_FALSE(full(g, "A\xc3\xa9" "zzzz|q"));
  auto list = compile({SpecKind::Gbnf, "root ::= item (\",\" item)*\nitem ::= \"[\" root? \"]\" | [0-9]\n"}, v);
  EXPECT_TRUE(full(list, "[1,[2,[]]],3"));
  EXPECT_FALSE(full(list, "[1,[2,[]],3"));
}

TEST(GrammarGbnf, Errors) {
  auto v = byte_vocab();
  for (const char* s : {"", "a ::= \"x\"", "root ::= undefined_rule", "root ::= \"x\"\nroot ::= \"y\"",
                        "root ::= \"unterminated", "root ::= [a-", "root ::= a\na ::= a \"x\" | \"y\"", "root ::= (\"x\"",
                        "root ::= \"x\"{5,2}", "root ::= <tok>", "root ::= \"\\q\""})
    EXPECT_THROW(compile({SpecKind::Gbnf, s}, v), deepinfer::Error) << s;
  // An empty-language root compiles but allows nothing, not even EOS.
  auto g = compile({SpecKind::Gbnf, "root ::= x\nx ::= \"a\" x"}, v);
  Matcher m(g);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("a"));
}

template <class F>
double seconds(F f) {
  auto t = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(GrammarLimits, HostileSpecsFailFastOrStayBounded) {
  auto v = byte_vocab();
  Limits lim;
  lim.compile_seconds = 2;
  std::string deep(100000, '[');
  std::string parens = std::string(5000, '(') + "a" + std::string(5000, ')');
  std::string big_enum = "{\"enum\":[";
  for (int i = 0; i < 20000; ++i) big_enum += (i ? ",\"" : "\"") + std::to_string(i * 7919) + "\"";
  big_enum += "]}";
  std::string nested_schema;
  for (int i = 0; i < 2000; ++i) nested_schema += "{\"items\":";
  nested_schema += "true" + std::string(2000, '}');
  struct H {
    SpecKind k;
    std::string text;
    bool must_fail;
  } cases[] = {
      {SpecKind::JsonSchema, deep, true},
      {SpecKind::JsonSchema, nested_schema, true},
      {SpecKind::Regex, parens, true},
      {SpecKind::Regex, "(a{1000}){1000}", true},
      {SpecKind::Regex, "((a|b)*c{0,100}){0,100}", false},
      {SpecKind::Regex, "(x+x+)+y", false},                       // catastrophic for backtrackers, linear here
      {SpecKind::Regex, "[\\s\\S]*a[\\s\\S]{20}", false},          // exponential DFA: hits the state limit or compiles
      {SpecKind::JsonSchema, big_enum, false},
      {SpecKind::JsonSchema, R"({"type":"string","maxLength":100000000})", true},
      {SpecKind::JsonSchema, R"({"type":"array","minItems":1000000000})", true},
      {SpecKind::Gbnf, "root ::= a\na ::= b b b b\nb ::= c c c c\nc ::= d d d d\nd ::= e e e e\ne ::= f f f f\nf ::= g g g g\ng ::= h h h h\nh ::= i i i i\ni ::= j j j j\nj ::= k k k k\nk ::= \"x\"{100}", true},
      {SpecKind::JsonSchema, R"({"$ref":"#"})", false},           // infinite recursion: empty language
      {SpecKind::JsonSchema, R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", false},
  };
  for (auto& c : cases) {
    bool failed = false;
    double t = seconds([&] {
      try {
        auto g = compile({c.k, c.text}, v, lim);
        Matcher m(g);
        std::vector<uint32_t> w(v->mask_words());
        m.fill_mask(w.data());
      } catch (const deepinfer::Error&) {
        failed = true;
      }
    });
    // Not asserted (shared CI machines): the compile_seconds limit is what bounds it.
    if (t > 4.0) std::printf("slow hostile case (%.1f s): %s\n", t, c.text.substr(0, 80).c_str());
    if (c.must_fail) EXPECT_TRUE(failed) << c.text.substr(0, 80);
  }
}

TEST(GrammarLimits, AmbiguousGrammarStaysBounded) {
  auto v = byte_vocab();
  // Exponentially ambiguous: every split of a run of 'a' is a parse. Stacks are shared, so the
  // live set stays small; a hard cap turns a blow-up into an error instead of memory growth.
  auto g = compile({SpecKind::Gbnf, "root ::= x*\nx ::= \"a\" | \"a\" x \"b\"?"}, v);
  Matcher m(g);
  bool ok = true;
  try {
    for (int i = 0; i < 2000 && ok; ++i) ok = m.accept_bytes("a");
  } catch (const deepinfer::Error&) {
    ok = true;
  }
  EXPECT_TRUE(ok);
}

}  // namespace
