#pragma once
// DeepSeek-V4 configuration: every config.json field that changes the math.
//
// Accepts both spellings seen in the wild: transformers' (layer_types, mlp_layer_types,
// compress_rates, partial_rotary_factor, nested rope_parameters {main, compress}) and the legacy /
// published one (compress_ratios, num_hash_layers, qk_rope_head_dim, compress_rate_csa/hca,
// flat rope_scaling). Spec: shared/docs/deepseek-v4.md §1.
#include <string>
#include <vector>

#include "util/json.h"

namespace deepinfer {

enum class AttnType { Sliding, CSA, HCA };  // compress ratio 0 / compress_rate_csa / compress_rate_hca
enum class ScoringFunc { SqrtSoftplus, Sigmoid, Softmax };

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
};

struct V4Config {
  int vocab_size = 129280;
  int hidden_size = 4096;        // D, per HC stream
  int num_layers = 43;
  int num_heads = 64;            // H
  int head_dim = 512;            // d (q heads and the single K=V head)
  int rope_dim = 64;             // r, trailing RoPE'd channels of a head
  int q_lora_rank = 1024;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int sliding_window = 128;      // W, includes the current token
  int compress_rate_csa = 4;
  int compress_rate_hca = 128;
  std::vector<AttnType> layer_types;   // [num_layers]
  std::vector<bool> hash_layers;       // [num_layers]: routed by tid2eid
  RopeConfig rope_main;                // Sliding layers
  RopeConfig rope_compress;            // CSA/HCA layers (main q/kv, compressed entries, indexer)
  int index_n_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int n_routed_experts = 256;
  int n_shared_experts = 1;
  int num_experts_per_tok = 6;
  int moe_intermediate_size = 2048;
  ScoringFunc scoring = ScoringFunc::SqrtSoftplus;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;
  int num_mtp_layers = 0;
  int fp8_block_rows = 128, fp8_block_cols = 128;  // quantization_config.weight_block_size
  bool tie_word_embeddings = false;
  int bos_token_id = 0;
  std::vector<int> eos_token_ids{1};
  int max_position_embeddings = 1048576;

  int compress_rate(int layer) const;  // 0 for sliding layers
  const RopeConfig& rope_for(int layer) const {
    return layer_types[layer] == AttnType::Sliding ? rope_main : rope_compress;
  }
};

// Parses config.json contents; throws Error with the field name on a missing or invalid field.
V4Config parse_v4_config(const nlohmann::json& j);

// inv_freq[i], i < r/2, for one RoPE kind, computed the way transformers does (float32 pow).
std::vector<float> rope_inv_freq(const RopeConfig& rope, int rope_dim);

}  // namespace deepinfer
