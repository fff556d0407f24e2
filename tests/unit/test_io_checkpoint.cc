// Checkpoint directories on valid inputs: single file, index + shards, bare shards, take/unused,
// and dequantizing through take_f32.
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/dequant.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {
using testing::TempDir;
using testing::write_text;

const float kTwo[2] = {1, 2};

void write_f32(const std::string& path, const std::vector<std::string>& names) {
  std::vector<TensorToWrite> ts;
  for (const auto& n : names) ts.push_back({n, DType::F32, {2}, kTwo, sizeof kTwo});
  write_safetensors(path, ts);
}

TEST(Checkpoint, SingleFile) {
  TempDir d;
  write_text(d / "config.json", R"({"hidden_size": 64, "num_hidden_layers": 1})");
  write_f32(d / "model.safetensors", {"embed.weight", "head.weight", "layers.0.attn_norm.weight"});
  auto ck = Checkpoint::open(d.str());
  EXPECT_EQ(ck->dir(), d.str());
  EXPECT_EQ(ck->config().at("hidden_size"), 64);
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"embed.weight", "head.weight", "layers.0.attn_norm.weight"}));
  EXPECT_TRUE(ck->has("head.weight"));
  EXPECT_FALSE(ck->has("model.embed_tokens.weight"));  // lookups take native names only
  EXPECT_EQ(ck->unused().size(), 3u);
  const TensorView& e = ck->take("embed.weight");
  EXPECT_EQ(e.name, "embed.weight");
  EXPECT_EQ(*e.file, d / "model.safetensors");
  EXPECT_EQ(ck->unused(), (std::vector<std::string>{"head.weight", "layers.0.attn_norm.weight"}));
  ck->take("embed.weight");  // taking twice is fine
  ck->take("head.weight");
  ck->take("layers.0.attn_norm.weight");
  EXPECT_TRUE(ck->unused().empty());
}

TEST(Checkpoint, IndexAndShards) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_f32(d / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight", "model.norm.weight"});
  write_f32(d / "model-00002-of-00002.safetensors", {"head.weight", "model.layers.0.attn.norm.weight"});
  write_text(d / "model.safetensors.index.json", R"({"metadata": {"total_size": 32}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors",
      "head.weight": "model-00002-of-00002.safetensors",
      "model.layers.0.attn.norm.weight": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(d.str());
  EXPECT_EQ(ck->names(),
            (std::vector<std::string>{"embed.weight", "head.weight", "layers.0.attn.kv_norm.weight", "norm.weight"}));
  EXPECT_EQ(*ck->find("head.weight")->file, d / "model-00002-of-00002.safetensors");
  EXPECT_EQ(ck->file_tensor_name("embed.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(ck->file_tensor_name("nope"), "");
  // A stray file the index does not mention is not opened.
  write_f32(d / "stray.safetensors", {"extra"});
  EXPECT_FALSE(Checkpoint::open(d.str())->has("extra"));
}

TEST(Checkpoint, BareShardsWithoutIndex) {
  TempDir d;
  write_text(d / "config.json", "{}");
  write_f32(d / "a.safetensors", {"embed.weight"});
  write_f32(d / "b.safetensors", {"head.weight"});
  write_text(d / "notes.txt", "not a shard");
  auto ck = Checkpoint::open(d.str());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"embed.weight", "head.weight"}));
}

TEST(Checkpoint, SingleFileWinsOverIndex) {
  // Like transformers: model.safetensors is used when present, the index then ignored.
  TempDir d;
  write_text(d / "config.json", "{}");
  write_f32(d / "model.safetensors", {"embed.weight"});
  write_text(d / "model.safetensors.index.json", R"({"weight_map": {"x": "missing.safetensors"}})");
  EXPECT_EQ(Checkpoint::open(d.str())->names(), (std::vector<std::string>{"embed.weight"}));
}

TEST(Checkpoint, TakeF32DequantizesWithSiblingScale) {
  TempDir d;
  write_text(d / "config.json", "{}");
  const uint8_t w[6] = {0x38, 0x40, 0xb8, 0x38, 0x38, 0x38};  // [2, 3]: 1 2 -1 / 1 1 1
  const uint8_t s[1] = {128};                                 // [1, 1] E8M0: 2
  const uint8_t p[1] = {0x21};                                // FP4 [1, 1]: 0.5 1
  const uint8_t ps[1] = {126};                                // 0.5
  const uint16_t b[2] = {0x3f80, 0x4000};
  write_safetensors(d / "model.safetensors",
                    {{"layers.0.attn.wq_a.weight", DType::F8_E4M3, {2, 3}, w, 6},
                     {"layers.0.attn.wq_a.weight_scale_inv", DType::F8_E8M0, {1, 1}, s, 1},
                     {"layers.0.ffn.experts.0.w1.weight", DType::I8, {1, 1}, p, 1},
                     {"layers.0.ffn.experts.0.w1.scale", DType::F8_E8M0, {1, 1}, ps, 1},
                     {"norm.weight", DType::BF16, {2}, b, 4}});
  auto ck = Checkpoint::open(d.str());
  std::vector<int64_t> shape;
  EXPECT_EQ(take_f32(*ck, "layers.0.attn.wq_a.weight", &shape), (std::vector<float>{2, 4, -2, 2, 2, 2}));
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(take_f32(*ck, "layers.0.ffn.experts.0.w1.weight", &shape), (std::vector<float>{0.25f, 0.5f}));
  EXPECT_EQ(shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(take_f32(*ck, "norm.weight"), (std::vector<float>{1, 2}));
  EXPECT_TRUE(ck->unused().empty());  // the scales were taken too
}

}  // namespace
}  // namespace deepinfer
