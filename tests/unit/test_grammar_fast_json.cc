// parse_json_fast (the schema compiler's JSON parser) gives exactly what ordered_json::parse gives
// (values, number types, key order) and rejects what it rejects.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "grammar/ir.h"
#include "util/error.h"

using namespace deepinfer;
using namespace deepinfer::grammar;
using ojson = nlohmann::ordered_json;

namespace {

void same(const std::string& text) {
  SCOPED_TRACE(text.substr(0, 200));
  ojson want = ojson::parse(text);
  ojson got = parse_json_fast(text);
  EXPECT_EQ(got.dump(), want.dump());
  // Number types, recursively (dump() prints 1 and 1.0 differently, but not unsigned vs signed).
  std::function<void(const ojson&, const ojson&)> types = [&](const ojson& a, const ojson& b) {
    ASSERT_EQ(a.type(), b.type()) << a.dump();
    if (a.is_structured()) {
      ASSERT_EQ(a.size(), b.size());
      auto ia = a.begin();
      for (auto ib = b.begin(); ib != b.end(); ++ia, ++ib) types(*ia, *ib);
    }
  };
  types(got, want);
}

}  // namespace

TEST(FastJson, SameAsNlohmannOnEveryDataFile) {
  int files = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(DEEPINFER_SOURCE_DIR "/tests/data/grammar")) {
    if (e.path().extension() != ".json" || e.path().filename() == "tokenizer.json") continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    same(ss.str());
    ++files;
  }
  EXPECT_GT(files, 10);
}

TEST(FastJson, NumbersStringsAndDuplicates) {
  for (const char* t : {"0", "-0", "1", "-1", "18446744073709551615", "18446744073709551616", "-9223372036854775808",
                        "-9223372036854775809", "1.0", "1e3", "1E-3", "-0.0", "123.456e+7", "1e308",
                        R"("a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00 ü 中")", R"({"a":1,"b":2,"a":3})",
                        R"( [ 1 , { "x" : [ ] } , null , true , false ] )", "{}", "[]", R"("")"})
    same(t);
}

TEST(FastJson, RejectsWhatNlohmannRejects) {
  for (const char* t : {"", " ", "01", "1.", ".5", "-", "1e", "+1", "[1,]", "{\"a\":1,}", "{a:1}", "[1 2]", "tru",
                        "nul", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\x01\"",
                        "\"\xff\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"abc", "[1] 2",
                        "1e400", "{\"a\" 1}", "[", "{"}) {
    SCOPED_TRACE(t);
    EXPECT_THROW((void)parse_json_fast(t), Error);
    EXPECT_FALSE(ojson::accept(t));
  }
}
