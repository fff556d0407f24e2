// Checkpoint::in_memory: tensors whose bytes the Checkpoint owns go through the same naming, expert
// splitting and lookup as files, and a malformed tensor list is rejected with a message that names
// the checkpoint and the tensor.
#include <gtest/gtest.h>

#include <cstring>

#include "io/checkpoint.h"
#include "util/error.h"

using namespace deepinfer;

namespace {

std::shared_ptr<const std::vector<uint8_t>> bytes(size_t n, uint8_t fill = 0) {
  return std::make_shared<const std::vector<uint8_t>>(n, fill);
}

std::string error_of(std::vector<Checkpoint::MemoryTensor> t, nlohmann::json cfg = nlohmann::json::object()) {
  try {
    Checkpoint::in_memory("mem-test", cfg, std::move(t));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(InMemoryCheckpoint, ViewsSharedStorageUnderNativeNames) {
  auto pool = std::make_shared<std::vector<uint8_t>>(64);
  for (size_t i = 0; i < pool->size(); ++i) (*pool)[i] = (uint8_t)i;
  auto ck = Checkpoint::in_memory(
      "mem", {{"model_type", "deepseek_v4"}},
      {{"model.embed_tokens.weight", DType::BF16, {2, 4}, pool, 0},    // transformers naming
       {"layers.0.attn.wq_a.weight", DType::F8_E4M3, {4, 4}, pool, 8},  // overlaps the first: allowed
       {"model.layers.0.mlp.experts.gate_up_proj", DType::U8, {2, 4, 2}, pool, 32}});
  EXPECT_EQ(ck->dir(), "mem");
  EXPECT_EQ(ck->config()["model_type"], "deepseek_v4");
  const TensorView& e = ck->take("embed.weight");
  EXPECT_EQ(e.nbytes, 16u);
  EXPECT_EQ(e.data[3], 3);
  EXPECT_EQ(ck->take("layers.0.attn.wq_a.weight").data[0], 8);
  // stacked experts split into per-expert w1 / w3 views, as for files
  const TensorView& w3 = ck->take("layers.0.ffn.experts.1.w3.weight");
  EXPECT_EQ(w3.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w3.data[0], 32 + 8 + 4);
  EXPECT_EQ(ck->file_tensor_name("embed.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(ck->unused().size(), 3u);  // experts 0 w1/w3, 1 w1
  EXPECT_THROW(ck->take("head.weight"), Error);
}

TEST(InMemoryCheckpoint, RejectsMalformedTensorLists) {
  auto p = bytes(16);
  std::string e = error_of({{"a.weight", DType::F32, {2, 4}, p, 0}});  // 32 bytes > 16
  EXPECT_NE(e.find("mem-test"), std::string::npos) << e;
  EXPECT_NE(e.find("'a.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("storage of 16 bytes"), std::string::npos) << e;
  e = error_of({{"a.weight", DType::F32, {2}, p, 12}});  // bytes [12, 20)
  EXPECT_NE(e.find("[12, 20)"), std::string::npos) << e;
  e = error_of({{"a.weight", DType::F32, {-1, 2}, p, 0}});
  EXPECT_NE(e.find("negative dimension"), std::string::npos) << e;
  e = error_of({{"a.weight", DType::F32, {1}, nullptr, 0}});
  EXPECT_NE(e.find("no storage"), std::string::npos) << e;
  e = error_of({{"", DType::F32, {1}, p, 0}});
  EXPECT_NE(e.find("empty name"), std::string::npos) << e;
  e = error_of({{"embed.weight", DType::F32, {1}, p, 0}, {"model.embed_tokens.weight", DType::F32, {1}, p, 4}});
  EXPECT_NE(e.find("both map to the native name 'embed.weight'"), std::string::npos) << e;
  e = error_of({{"a.weight", DType::F32, {1}, p, 0}}, nlohmann::json::array());
  EXPECT_NE(e.find("not a JSON object"), std::string::npos) << e;
  e = error_of({{"a.weight", DType::F32, {int64_t(1) << 62, 8}, p, 0}});
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
}
