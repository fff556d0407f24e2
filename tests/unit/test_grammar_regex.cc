// Regex semantics against Python's `re` (verdicts in tests/data/grammar/regex_cases.json, made
// by scripts/grammar/gen_regex_cases.py): full match for regex specs, search for JSON Schema
// `pattern` inside a JSON string. Plus the constructs that must be refused.
#include <gtest/gtest.h>

#include <fstream>

#include "grammar/grammar.h"
#include "grammar/testing.h"
#include "util/error.h"

using namespace deepinfer::grammar;
using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Vocabulary> byte_vocab() {
  std::vector<std::string> t(257);
  std::vector<bool> sp(257, false);
  for (int b = 0; b < 256; ++b) t[b + 1] = std::string(1, static_cast<char>(b));
  sp[0] = true;
  return Vocabulary::create(t, sp, 0, 257);
}

TEST(GrammarRegex, MatchesPythonRe) {
  auto v = byte_vocab();
  std::ifstream f(DEEPINFER_SOURCE_DIR "/tests/data/grammar/regex_cases.json");
  ojson cases = ojson::parse(f);
  ASSERT_GT(cases.size(), 30u);
  int checked = 0, narrowed_rejects = 0;
  for (auto& c : cases) {
    std::string p = c["pattern"];
    auto full = compile({SpecKind::Regex, p}, v);
    ojson schema = {{"type", "string"}, {"pattern", p}};
    auto search = compile({SpecKind::JsonSchema, schema.dump()}, v);
    // \D \W \S are narrowed to ASCII on purpose (sound under both Python and JavaScript), so
    // on non-ASCII text they may reject what Python accepts; nothing else may differ.
    bool narrowed = p.find("\\D") != std::string::npos || p.find("\\W") != std::string::npos ||
                    p.find("\\S") != std::string::npos;
    for (auto& t : c["strings"]) {
      std::string s = t["s"];
      bool ascii = std::all_of(s.begin(), s.end(), [](char ch) { return (unsigned char)ch < 0x80; });
      auto check = [&](bool got, bool want, const char* mode) {
        if (got == want) return;
        if (!got && narrowed && !ascii) { ++narrowed_rejects; return; }
        ADD_FAILURE() << mode << " /" << p << "/ on '" << s << "': got " << got << ", Python says " << want;
      };
      Matcher m(full);
      check(m.accept_bytes(s) && m.can_end(), t["full"].get<bool>(), "fullmatch");
      Matcher j(search);
      check(j.accept_bytes(testkit::dump_python(ojson(s), false)) && j.can_end(), t["search"].get<bool>(), "search");
      ++checked;
    }
  }
  EXPECT_GT(checked, 2000);
  std::cout << checked << " strings, " << narrowed_rejects << " documented narrowings\n";
}

TEST(GrammarRegex, RefusesNonRegularAndAmbiguousSyntax) {
  auto v = byte_vocab();
  for (const char* p : {"(a)\\1", "a(?=b)", "a(?!b)", "(?<=a)b", "\\bword", "\\p{L}", "a{,3}", "(?i)a", "a++",
                        "[a", "(a", "a)", "*a", "a{3,2}", "x\\", "a**", "[z-a]", "\\q"})
    EXPECT_THROW(compile({SpecKind::Regex, p}, v), deepinfer::Error) << p;
}

TEST(GrammarRegex, Utf8AndEscapes) {
  auto v = byte_vocab();
  auto g = compile({SpecKind::Regex, "[\\u00e0-\\u00ff\\u{1F600}]+"}, v);
  Matcher m(g);
  EXPECT_TRUE(m.accept_bytes("\xc3\xa9\xf0\x9f\x98\x80"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("\xc3"  "\x80"));      // U+00C0 is outside the class
  EXPECT_TRUE(m.accept_bytes("\xc3"));               // a partial character is a viable prefix
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("\x80"));              // ... that must be completed correctly
}

}  // namespace
