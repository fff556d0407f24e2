#include "model/v4_inventory.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "util/error.h"

namespace deepinfer {
namespace {

void add_layer(std::vector<V4TensorSpec>& v, const V4Config& c, const std::string& p, AttnType type, bool hash) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  const int64_t I = c.moe_intermediate_size, E = c.n_routed_experts, G = c.o_groups, ol = c.o_lora_rank;
  auto add = [&](const std::string& n, std::vector<int64_t> s, V4Storage st) { v.push_back({p + n, std::move(s), st}); };
  add("attn_norm.weight", {D}, V4Storage::BF16);
  add("ffn_norm.weight", {D}, V4Storage::BF16);
  for (const char* site : {"attn", "ffn"}) {
    add(std::string("hc_") + site + "_fn", {mix, hc * D}, V4Storage::F32);
    add(std::string("hc_") + site + "_base", {mix}, V4Storage::F32);
    add(std::string("hc_") + site + "_scale", {3}, V4Storage::F32);
  }
  add("attn.attn_sink", {H}, V4Storage::F32);
  add("attn.wq_a.weight", {c.q_lora_rank, D}, V4Storage::FP8);
  add("attn.q_norm.weight", {c.q_lora_rank}, V4Storage::BF16);
  add("attn.wq_b.weight", {H * d, c.q_lora_rank}, V4Storage::FP8);
  add("attn.wkv.weight", {d, D}, V4Storage::FP8);
  add("attn.kv_norm.weight", {d}, V4Storage::BF16);
  add("attn.wo_a.weight", {G * ol, H * d / G}, V4Storage::FP8);
  add("attn.wo_b.weight", {D, G * ol}, V4Storage::FP8);
  if (type != AttnType::Sliding) {
    const bool csa = type == AttnType::CSA;
    const int64_t m = csa ? c.compress_rate_csa : c.compress_rate_hca, cw = (csa ? 2 : 1) * d;
    add("attn.compressor.wkv.weight", {cw, D}, V4Storage::BF16);
    add("attn.compressor.wgate.weight", {cw, D}, V4Storage::BF16);
    add("attn.compressor.ape", {m, cw}, V4Storage::F32);
    add("attn.compressor.norm.weight", {d}, V4Storage::BF16);
    if (csa) {
      const int64_t hI = c.index_n_heads, dI = c.index_head_dim;
      add("attn.indexer.wq_b.weight", {hI * dI, c.q_lora_rank}, V4Storage::FP8);
      add("attn.indexer.weights_proj.weight", {hI, D}, V4Storage::BF16);
      add("attn.indexer.compressor.wkv.weight", {2 * dI, D}, V4Storage::BF16);
      add("attn.indexer.compressor.wgate.weight", {2 * dI, D}, V4Storage::BF16);
      add("attn.indexer.compressor.ape", {m, 2 * dI}, V4Storage::F32);
      add("attn.indexer.compressor.norm.weight", {dI}, V4Storage::BF16);
    }
  }
  add("ffn.gate.weight", {E, D}, V4Storage::BF16);
  if (hash) add("ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, V4Storage::I64);
  else add("ffn.gate.bias", {E}, V4Storage::F32);
  if (c.n_shared_experts == 1) {
    add("ffn.shared_experts.w1.weight", {I, D}, V4Storage::FP8);
    add("ffn.shared_experts.w2.weight", {D, I}, V4Storage::FP8);
    add("ffn.shared_experts.w3.weight", {I, D}, V4Storage::FP8);
  }
  for (int64_t e = 0; e < E; ++e) {
    std::string ep = "ffn.experts." + std::to_string(e) + ".";
    add(ep + "w1.weight", {I, D}, V4Storage::FP4);
    add(ep + "w2.weight", {D, I}, V4Storage::FP4);
    add(ep + "w3.weight", {I, D}, V4Storage::FP4);
  }
}

}  // namespace

std::vector<V4TensorSpec> v4_tensor_inventory(const V4Config& c, bool include_mtp) {
  const int64_t V = c.vocab_size, D = c.hidden_size, hc = c.hc_mult;
  std::vector<V4TensorSpec> v;
  v.push_back({"embed.weight", {V, D}, V4Storage::BF16});
  v.push_back({"head.weight", {V, D}, V4Storage::BF16});
  v.push_back({"norm.weight", {D}, V4Storage::BF16});
  v.push_back({"hc_head_fn", {hc, hc * D}, V4Storage::F32});
  v.push_back({"hc_head_base", {hc}, V4Storage::F32});
  v.push_back({"hc_head_scale", {1}, V4Storage::F32});
  for (int l = 0; l < c.num_layers; ++l)
    add_layer(v, c, "layers." + std::to_string(l) + ".", c.layer_types[l], c.hash_layers[l]);
  if (include_mtp)
    for (int k = 0; k < c.num_mtp_layers; ++k) {
      std::string p = "mtp." + std::to_string(k) + ".";
      add_layer(v, c, p, AttnType::Sliding, false);
      v.push_back({p + "e_proj.weight", {D, D}, V4Storage::FP8});
      v.push_back({p + "h_proj.weight", {D, D}, V4Storage::FP8});
      v.push_back({p + "enorm.weight", {D}, V4Storage::BF16});
      v.push_back({p + "hnorm.weight", {D}, V4Storage::BF16});
      v.push_back({p + "norm.weight", {D}, V4Storage::BF16});
      v.push_back({p + "hc_head_fn", {hc, hc * D}, V4Storage::F32});
      v.push_back({p + "hc_head_base", {hc}, V4Storage::F32});
      v.push_back({p + "hc_head_scale", {1}, V4Storage::F32});
    }
  return v;
}

int64_t inventory_tensor_count(const std::vector<V4TensorSpec>& inv) {
  int64_t n = 0;
  for (const auto& t : inv) n += (t.storage == V4Storage::FP8 || t.storage == V4Storage::FP4) ? 2 : 1;
  return n;
}

void write_random_v4_checkpoint(const std::string& dir, const nlohmann::json& config, uint64_t seed) {
  V4Config c = parse_v4_config(config);
  auto inv = v4_tensor_inventory(c, true);
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json");
    f << config.dump(2);
    if (!f) throw Error(dir + ": cannot write config.json");
  }
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<int64_t>> i64;
  std::vector<TensorToWrite> out;
  f32.reserve(inv.size());
  for (const auto& t : inv) {
    int64_t n = 1;
    for (auto s : t.shape) n *= s;
    if (t.storage == V4Storage::I64) {
      std::uniform_int_distribution<int64_t> ud(0, c.n_routed_experts - 1);
      std::vector<int64_t> ids(n);
      for (int64_t r = 0; r < t.shape[0]; ++r) {  // distinct experts per token
        for (int64_t k = 0; k < t.shape[1]; ++k) {
          int64_t e;
          bool dup;
          do {
            e = ud(g);
            dup = false;
            for (int64_t q = 0; q < k; ++q) dup |= ids[r * t.shape[1] + q] == e;
          } while (dup);
          ids[r * t.shape[1] + k] = e;
        }
      }
      i64.push_back(std::move(ids));
      out.push_back({t.name, DType::I64, t.shape, i64.back().data(), (size_t)n * 8});
      continue;
    }
    std::vector<float> w(n);
    const bool is_norm = t.name.find("norm.weight") != std::string::npos;
    const float sd = t.shape.size() == 2 ? 1.0f / std::sqrt((float)t.shape[1]) : 0.5f;
    for (auto& x : w) x = is_norm ? 1.0f + 0.1f * nd(g) : sd * nd(g);
    f32.push_back(std::move(w));
    out.push_back({t.name, DType::F32, t.shape, f32.back().data(), (size_t)n * 4});
  }
  write_safetensors(dir + "/model.safetensors", out);
}

}  // namespace deepinfer
