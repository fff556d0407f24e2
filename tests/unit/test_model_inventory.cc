// The V4 tensor inventory reproduces the published V4-Flash tensor count (spec §2.2), and a random
// checkpoint written from it loads through the real loader with nothing missing and nothing unused.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/model.h"
#include "model/v4_inventory.h"
#include "ops/cpu/cpu_backend.h"

using namespace deepinfer;
using nlohmann::json;

namespace {
json flash_config() {
  json ratios = json::array({0, 0});
  for (int i = 0; i < 20; ++i) {
    ratios.push_back(4);
    ratios.push_back(128);
  }
  ratios.push_back(4);
  ratios.push_back(0);
  return json{{"model_type", "deepseek_v4"}, {"vocab_size", 129280}, {"hidden_size", 4096},
              {"num_hidden_layers", 43}, {"num_attention_heads", 64}, {"head_dim", 512},
              {"qk_rope_head_dim", 64}, {"q_lora_rank", 1024}, {"o_groups", 8}, {"o_lora_rank", 1024},
              {"compress_ratios", ratios}, {"num_hash_layers", 3}, {"index_n_heads", 64},
              {"index_head_dim", 128}, {"index_topk", 512}, {"hc_mult", 4}, {"n_routed_experts", 256},
              {"num_experts_per_tok", 6}, {"moe_intermediate_size", 2048}, {"num_nextn_predict_layers", 1}};
}
}  // namespace

TEST(V4Inventory, FlashTensorCountMatchesPublishedIndex) {
  V4Config c = parse_v4_config(flash_config());
  auto inv = v4_tensor_inventory(c, true);
  EXPECT_EQ(inventory_tensor_count(inv), 69187);
  auto main_only = v4_tensor_inventory(c, false);
  EXPECT_EQ(inventory_tensor_count(main_only), 67612);
  EXPECT_EQ(c.layer_types[42], AttnType::CSA) << "layer 42 of V4-Flash is CSA (spec §1.2)";
}

TEST(V4Inventory, RandomCheckpointLoadsCompletely) {
  json cfg = flash_config();
  cfg["vocab_size"] = 64;
  cfg["hidden_size"] = 32;
  cfg["num_hidden_layers"] = 4;
  cfg["num_attention_heads"] = 2;
  cfg["head_dim"] = 32;
  cfg["qk_rope_head_dim"] = 8;
  cfg["q_lora_rank"] = 16;
  cfg["o_groups"] = 2;
  cfg["o_lora_rank"] = 8;
  cfg["compress_ratios"] = {0, 4, 16, 4, 0};
  cfg["compress_rate_hca"] = 16;
  cfg["num_hash_layers"] = 1;
  cfg["index_n_heads"] = 8;
  cfg["index_head_dim"] = 16;
  cfg["index_topk"] = 2;
  cfg["hc_mult"] = 2;
  cfg["n_routed_experts"] = 4;
  cfg["num_experts_per_tok"] = 2;
  cfg["moe_intermediate_size"] = 8;
  std::string dir = std::filesystem::temp_directory_path() / "deepinfer_inventory_test";
  std::filesystem::remove_all(dir);
  write_random_v4_checkpoint(dir, cfg, 7);
  CpuBackend be(1);
  LoadedModel m = load_model(dir, be);
  EXPECT_TRUE(m.unused.empty()) << m.unused.size() << " unused, e.g. " << (m.unused.empty() ? "" : m.unused[0]);
  EXPECT_TRUE(m.v4->has_mtp());
  V4Cache cache(m.v4->config(), 1, 1);
  V4SeqState st;
  ASSERT_TRUE(cache.open(&st) && cache.reserve(&st, 20));
  std::vector<int32_t> ids{1, 5, 9, 3, 7, 2, 8, 4, 6, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  V4SeqChunk c{&st, ids, true};
  auto logits = m.v4->forward(std::span<const V4SeqChunk>(&c, 1), cache);
  ASSERT_EQ(logits.size(), ids.size() * 64);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  std::filesystem::remove_all(dir);
}
