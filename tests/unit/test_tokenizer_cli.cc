// `deepinfer tokenize` / `deepinfer detokenize` end to end (the built executable), checked against
// the HF references of the parity corpus.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "util/json.h"

using nlohmann::json;

namespace {

const std::string kData = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/tokenizer/";
const std::string kExe = std::string(DEEPINFER_BINARY_DIR) + "/deepinfer";

std::vector<std::string> gz_lines(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string all;
  if (f) {
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, size_t(n));
    gzclose(f);
  }
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t e = all.find('\n', pos);
    if (e == std::string::npos) e = all.size();
    out.push_back(all.substr(pos, e - pos));
    pos = e + 1;
  }
  return out;
}

// Runs the CLI with `input` on stdin; returns stdout lines and sets rc.
std::vector<std::string> run(const std::string& args, const std::string& input, int& rc) {
  // Per-process names: ctest runs each test in its own process, possibly several at once.
  auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  std::string in = (dir / ("deepinfer_cli_in." + tag + ".jsonl")).string();
  std::string out = (dir / ("deepinfer_cli_out." + tag + ".jsonl")).string();
  std::ofstream(in, std::ios::binary) << input;
  std::string cmd = kExe + " " + args + " < " + in + " > " + out + " 2>/dev/null";
  rc = std::system(cmd.c_str());
  std::vector<std::string> lines;
  {
    std::ifstream f(out, std::ios::binary);
    for (std::string l; std::getline(f, l);) lines.push_back(l);
  }
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  return lines;
}

}  // namespace

TEST(TokenizerCli, TokenizeMatchesHfAndRoundTrips) {
  ASSERT_TRUE(std::filesystem::exists(kExe)) << "build the deepinfer target first";
  auto corpus = gz_lines(kData + "corpus.jsonl.gz");
  auto refs = gz_lines(kData + "deepseek-v3/ref.jsonl.gz");
  ASSERT_GT(corpus.size(), 2000u);
  std::string input;
  const size_t n = 2000;
  for (size_t i = 0; i < n; ++i) input += corpus[i] + "\n";
  int rc = 0;
  // PATH may be the directory or the file itself.
  auto out = run("tokenize --tokenizer " + kData + "deepseek-v3", input, rc);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(out.size(), n);
  std::string back;
  for (size_t i = 0; i < n; ++i) {
    json want = json::parse(refs[i + 1])["a"];
    ASSERT_EQ(json::parse(out[i]), want) << "line " << i;
    back += out[i] + "\n";
  }
  auto dec = run("detokenize --tokenizer " + kData + "deepseek-v3/tokenizer.json.gz", back, rc);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(dec.size(), n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(json::parse(dec[i]), json::parse(corpus[i])) << "line " << i;
}

TEST(TokenizerCli, SpecialTokenFlags) {
  ASSERT_TRUE(std::filesystem::exists(kExe)) << "build the deepinfer target first";
  int rc = 0;
  auto a = run("tokenize --tokenizer " + kData + "deepseek-v3", "\"Hello\"\n", rc);
  auto b = run("tokenize --tokenizer " + kData + "deepseek-v3 --add-special-tokens", "\"Hello\"\n", rc);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  json ja = json::parse(a[0]), jb = json::parse(b[0]);
  ASSERT_EQ(jb.size(), ja.size() + 1);
  EXPECT_EQ(jb[0], 0);  // BOS only with --add-special-tokens
  EXPECT_NE(ja[0], 0);
  auto d = run("detokenize --tokenizer " + kData + "deepseek-v3", "[0,19923,1]\n", rc);
  auto ds = run("detokenize --tokenizer " + kData + "deepseek-v3 --skip-special-tokens", "[0,19923,1]\n", rc);
  ASSERT_EQ(d.size(), 1u);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(json::parse(d[0]), "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>");
  EXPECT_EQ(json::parse(ds[0]), "Hello");
}

TEST(TokenizerCli, BadInputFails) {
  ASSERT_TRUE(std::filesystem::exists(kExe)) << "build the deepinfer target first";
  int rc = 0;
  run("tokenize --tokenizer " + kData + "deepseek-v3", "not json\n", rc);
  EXPECT_NE(rc, 0);
  run("tokenize --tokenizer " + kData + "deepseek-v3", "[1,2]\n", rc);
  EXPECT_NE(rc, 0);
  run("detokenize --tokenizer " + kData + "deepseek-v3", "\"text\"\n", rc);
  EXPECT_NE(rc, 0);
  run("tokenize --tokenizer /nonexistent", "\"x\"\n", rc);
  EXPECT_NE(rc, 0);
  run("tokenize", "\"x\"\n", rc);
  EXPECT_NE(rc, 0);
}
