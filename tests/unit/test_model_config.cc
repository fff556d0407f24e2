// config.json parsing: both spellings, YaRN tables (spec §3.4 check values), clear errors.
#include <gtest/gtest.h>

#include "model/config.h"
#include "util/error.h"

using namespace deepinfer;
using nlohmann::json;

namespace {
json legacy_flash_like() {
  return json::parse(R"({
    "model_type": "deepseek_v4", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 5,
    "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
    "o_groups": 2, "o_lora_rank": 16, "compress_ratios": [0, 4, 128, 4, 0, 0],
    "num_hash_layers": 2, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 8, "index_head_dim": 32, "index_topk": 4, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
}
}  // namespace

TEST(V4Config, LegacyFields) {
  V4Config c = parse_v4_config(legacy_flash_like());
  ASSERT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.layer_types, (std::vector<AttnType>{AttnType::Sliding, AttnType::CSA, AttnType::HCA, AttnType::CSA,
                                                  AttnType::Sliding}));
  EXPECT_EQ(c.hash_layers, (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(c.compress_rate(2), 128);
}

TEST(V4Config, TransformersSpellingEqualsLegacy) {
  json j = legacy_flash_like();
  for (const char* k : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling"}) j.erase(k);
  j["layer_types"] = {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                      "compressed_sparse_attention", "sliding_attention"};
  j["mlp_layer_types"] = {"hash_moe", "hash_moe", "moe", "moe", "moe"};
  j["partial_rotary_factor"] = 0.25;
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  j["rope_parameters"] = json::parse(R"({"main": {"rope_type": "default", "rope_theta": 10000.0},
     "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16, "attention_factor": 1.0,
                  "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}})");
  V4Config a = parse_v4_config(legacy_flash_like()), b = parse_v4_config(j);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.hash_layers, b.hash_layers);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(rope_inv_freq(a.rope_compress, 64), rope_inv_freq(b.rope_compress, 64));
}

TEST(V4Config, YarnTableMatchesSpecCheckValues) {
  RopeConfig r;
  r.theta = 160000;
  r.yarn = true;
  r.factor = 16;
  r.original_max_position = 65536;
  auto f = rope_inv_freq(r, 64);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_NEAR(f[0], 1.0f, 1e-7);
  EXPECT_NEAR(f[1], 0.687656f, 1e-6);
  EXPECT_NEAR(f[2], 0.472871f, 1e-6);
  EXPECT_NEAR(f[3], 0.325172f, 1e-6);
  EXPECT_NEAR(f[16], 2.265625e-3f, 1e-9);
  EXPECT_NEAR(f[24], 1.953125e-5f, 1e-11);
  EXPECT_NEAR(f[31], 5.680529e-7f, 1e-12);
  RopeConfig m;  // main: theta 1e4, no YaRN
  auto g = rope_inv_freq(m, 64);
  EXPECT_NEAR(g[1], 0.7498942f, 1e-7);
  EXPECT_NEAR(g[31], 1.3335215e-4f, 1e-10);
}

TEST(V4Config, ClearErrors) {
  auto expect_error = [](json j, const std::string& needle) {
    try {
      parse_v4_config(j);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  json j = legacy_flash_like();
  j.erase("compress_ratios");
  expect_error(j, "layer_types");
  j = legacy_flash_like();
  j["compress_ratios"] = {0, 4, 7, 4, 0};
  expect_error(j, "compress_ratios");
  j = legacy_flash_like();
  j["compress_ratios"] = {0, 4};
  expect_error(j, "layer_types");
  j = legacy_flash_like();
  j["hidden_size"] = "big";
  expect_error(j, "hidden_size");
  j = legacy_flash_like();
  j["num_attention_heads"] = 3;
  expect_error(j, "o_groups");
  j = legacy_flash_like();
  j["scoring_func"] = "relu";
  expect_error(j, "scoring_func");
  j = legacy_flash_like();
  j["rope_scaling"]["type"] = "longrope";
  expect_error(j, "rope");
  expect_error(json::array(), "object");
}
