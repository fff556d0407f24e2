// The deepinfer command on a DeepSeek-V4.1 model directory, unchanged: `logits` (full and
// prefill + chunked) reproduces the reference fixture's logits, `inspect` lists the tensors, and a
// malformed V4.1 config fails with an error naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/safetensors.h"

using namespace deepinfer;
namespace fs = std::filesystem;

namespace {

const std::string kExe = std::string(DEEPINFER_BINARY_DIR) + "/deepinfer";
const std::string kFix = std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/v41/tiny_published";

int run(const std::string& args, const std::string& out_file) {
  return std::system((kExe + " " + args + " > " + out_file + " 2>&1").c_str());
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST(CliV41, LogitsOnAV41DirectoryMatchTheReference) {
  ASSERT_TRUE(fs::exists(kExe)) << "build the deepinfer target first";
  auto ref = SafetensorsFile::open(kFix + "/ref.safetensors");
  const TensorView* ids = ref->find("ids_1");
  const TensorView* lg = ref->find("logits_1");
  ASSERT_TRUE(ids && lg);
  const auto tmp = fs::temp_directory_path();
  const std::string ids_file = (tmp / "deepinfer_v41_ids.json").string();
  {
    std::ofstream f(ids_file);
    f << "[";
    for (int64_t i = 0; i < ids->numel(); ++i) {
      int64_t v;
      std::memcpy(&v, ids->data + 8 * i, 8);
      f << (i ? "," : "") << v;
    }
    f << "]";
  }
  for (const std::string extra : {"", " --prefill 5 --chunk 3"}) {
    SCOPED_TRACE(extra);
    const std::string out = (tmp / "deepinfer_v41_logits.safetensors").string();
    fs::remove(out);
    ASSERT_EQ(run("logits --model " + kFix + "/model --ids-file " + ids_file + " --out " + out + extra,
                  (tmp / "deepinfer_v41_log.txt").string()),
              0)
        << slurp((tmp / "deepinfer_v41_log.txt").string());
    auto got = SafetensorsFile::open(out);
    const TensorView* l = got->find("logits");
    ASSERT_TRUE(l);
    ASSERT_EQ(l->shape, lg->shape);
    const float* a = reinterpret_cast<const float*>(l->data);
    const float* b = reinterpret_cast<const float*>(lg->data);
    double num = 0, den = 0;
    for (int64_t i = 0; i < lg->numel(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5);
  }
}

TEST(CliV41, InspectAndBadConfig) {
  const auto tmp = fs::temp_directory_path();
  const std::string log = (tmp / "deepinfer_v41_inspect.txt").string();
  ASSERT_EQ(run("inspect --model " + kFix + "/model", log), 0);
  EXPECT_NE(slurp(log).find("layers.1.engram.embed.weight"), std::string::npos);

  // A copy of the fixture whose config lost kv_source_layer_ids.
  const fs::path bad = tmp / "deepinfer_v41_bad";
  fs::remove_all(bad);
  fs::copy(kFix + "/model", bad);
  std::string cfg = slurp((bad / "config.json").string());
  const std::string key = "\"kv_source_layer_ids\"";
  size_t p = cfg.find(key);
  ASSERT_NE(p, std::string::npos);
  cfg.replace(p, key.size(), "\"kv_source_layer_idz\"");
  std::ofstream((bad / "config.json").string()) << cfg;
  const std::string ids_file = (tmp / "deepinfer_v41_ids2.json").string();
  std::ofstream(ids_file) << "[0, 5, 6]";
  EXPECT_NE(run("logits --model " + bad.string() + " --ids-file " + ids_file + " --out " + (tmp / "x.st").string(), log), 0);
  EXPECT_NE(slurp(log).find("kv_source_layer_ids"), std::string::npos) << slurp(log);
  fs::remove_all(bad);
}
