#include "model/v4_inventory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/numeric.h"

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

// ---- published storage, configs, synthetic checkpoints ----

int64_t V4StoredTensor::nbytes() const {
  int64_t n = (int64_t)dtype_size(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string scale_name(const std::string& weight) {
  return weight.size() > 7 && weight.compare(weight.size() - 7, 7, ".weight") == 0
             ? weight.substr(0, weight.size() - 7) + ".scale"
             : weight + ".scale";
}

}  // namespace

std::vector<V4StoredTensor> v4_stored_tensors(const V4Config& c, const V4TensorSpec& t) {
  switch (t.storage) {
    case V4Storage::BF16: return {{t.name, DType::BF16, t.shape}};
    case V4Storage::F32: return {{t.name, DType::F32, t.shape}};
    case V4Storage::I64: return {{t.name, DType::I64, t.shape}};
    case V4Storage::FP8: {
      const int64_t N = t.shape.at(0), K = t.shape.at(1);
      return {{t.name, DType::F8_E4M3, {N, K}},
              {scale_name(t.name), DType::F8_E8M0, {ceil_div(N, c.fp8_block_rows), ceil_div(K, c.fp8_block_cols)}}};
    }
    case V4Storage::FP4: {
      const int64_t N = t.shape.at(0), K = t.shape.at(1);
      if (K % 2) throw Error("tensor '" + t.name + "': FP4 needs an even input width, got " + std::to_string(K));
      return {{t.name, DType::I8, {N, K / 2}}, {scale_name(t.name), DType::F8_E8M0, {N, ceil_div(K, 32)}}};
    }
  }
  return {};
}

int64_t v4_stored_bytes(const V4Config& c, const V4TensorSpec& t) {
  int64_t n = 0;
  for (const auto& s : v4_stored_tensors(c, t)) n += s.nbytes();
  return n;
}

nlohmann::json v4_flash_config_json() {
  nlohmann::json ratios = nlohmann::json::array({0, 0});
  for (int i = 0; i < 20; ++i) {
    ratios.push_back(4);
    ratios.push_back(128);
  }
  ratios.push_back(4);
  ratios.push_back(0);  // the MTP layer's entry
  return nlohmann::json{
      {"model_type", "deepseek_v4"}, {"architectures", {"DeepseekV4ForCausalLM"}},
      {"vocab_size", 129280}, {"hidden_size", 4096}, {"num_hidden_layers", 43},
      {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512},
      {"qk_rope_head_dim", 64}, {"q_lora_rank", 1024}, {"o_groups", 8}, {"o_lora_rank", 1024},
      {"sliding_window", 128}, {"compress_ratios", ratios}, {"compress_rope_theta", 160000.0},
      {"rope_theta", 10000.0},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 16.0}, {"original_max_position_embeddings", 65536},
                        {"beta_fast", 32}, {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576}, {"index_n_heads", 64}, {"index_head_dim", 128},
      {"index_topk", 512}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-6}, {"n_routed_experts", 256}, {"n_shared_experts", 1},
      {"num_experts_per_tok", 6}, {"moe_intermediate_size", 2048}, {"num_hash_layers", 3},
      {"scoring_func", "sqrtsoftplus"}, {"routed_scaling_factor", 1.5}, {"norm_topk_prob", true},
      {"topk_method", "noaux_tc"}, {"swiglu_limit", 10.0}, {"num_nextn_predict_layers", 0},
      {"expert_dtype", "fp4"}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
      {"bos_token_id", 0}, {"eos_token_id", 1}, {"torch_dtype", "bfloat16"},
      {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                               {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}}}};
}

nlohmann::json v4_tiny_config_json() {
  nlohmann::json c = v4_flash_config_json();
  c["vocab_size"] = 512;
  c["hidden_size"] = 64;
  c["num_hidden_layers"] = 4;
  c["num_attention_heads"] = 4;
  c["head_dim"] = 32;
  c["qk_rope_head_dim"] = 8;
  c["q_lora_rank"] = 32;
  c["o_groups"] = 2;
  c["o_lora_rank"] = 16;
  c["sliding_window"] = 8;
  c["compress_ratios"] = {0, 4, 16, 4, 0};
  c["compress_rate_csa"] = 4;
  c["compress_rate_hca"] = 16;
  c["rope_scaling"]["original_max_position_embeddings"] = 256;  // max_position / factor
  c["max_position_embeddings"] = 4096;
  c["index_n_heads"] = 4;
  c["index_head_dim"] = 16;
  c["index_topk"] = 4;
  c["hc_mult"] = 2;
  c["hc_sinkhorn_iters"] = 3;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 32;
  c["num_hash_layers"] = 1;
  c["quantization_config"]["weight_block_size"] = {32, 32};
  return c;
}

nlohmann::json v4_slice_config(nlohmann::json c, int layers) {
  if (layers < 1) throw Error("a model slice needs at least one layer, got " + std::to_string(layers));
  const int have = c.value("num_hidden_layers", 0);
  if (layers > have)
    throw Error("the config has " + std::to_string(have) + " layers, cannot cut " + std::to_string(layers));
  c["num_hidden_layers"] = layers;
  for (const char* key : {"layer_types", "mlp_layer_types"})
    if (c.contains(key) && c[key].is_array() && (int)c[key].size() > layers)
      c[key] = nlohmann::json(std::vector<nlohmann::json>(c[key].begin(), c[key].begin() + layers));
  if (c.contains("compress_ratios") && c["compress_ratios"].is_array() && (int)c["compress_ratios"].size() > layers)
    c["compress_ratios"] =
        nlohmann::json(std::vector<nlohmann::json>(c["compress_ratios"].begin(), c["compress_ratios"].begin() + layers));
  c["num_nextn_predict_layers"] = 0;
  return c;
}

namespace {

// splitmix64: fast, good enough for benchmark weights.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

// The E4M3 byte nearest to v (|v| <= 448; never a NaN byte).
uint8_t f32_to_e4m3(float v, const std::vector<std::pair<float, uint8_t>>& pos_table) {
  const float a = std::fabs(v);
  auto it = std::lower_bound(pos_table.begin(), pos_table.end(), std::make_pair(a, (uint8_t)0));
  uint8_t b;
  if (it == pos_table.end()) b = pos_table.back().second;
  else if (it == pos_table.begin()) b = it->second;
  else b = (a - (it - 1)->first <= it->first - a) ? (it - 1)->second : it->second;
  return v < 0 ? (uint8_t)(b | 0x80) : b;
}

// A pool of `bytes` bytes of elements of `elt` bytes: `gen` makes one element; the first (at most)
// 2^20 elements are generated, the rest are copies of them starting at random elements, so that a
// 1 GB pool takes a fraction of a second.
template <class Gen>
std::shared_ptr<std::vector<uint8_t>> make_pool(int64_t bytes, size_t elt, Rng& rng, Gen gen) {
  auto pool = std::make_shared<std::vector<uint8_t>>((size_t)bytes);
  const size_t n = (size_t)bytes / elt, base = std::min<size_t>(n, size_t(1) << 20);
  uint8_t* p = pool->data();
  for (size_t i = 0; i < base; ++i) gen(p + i * elt);
  for (size_t done = base; done < n;) {
    const size_t start = base > 1 ? (size_t)(rng.next() % base) : 0, len = std::min(base - start, n - done);
    std::memcpy(p + done * elt, p + start * elt, len * elt);
    done += len;
  }
  return pool;
}

}  // namespace

std::unique_ptr<Checkpoint> make_synthetic_v4_checkpoint(const nlohmann::json& config, uint64_t seed, bool include_mtp) {
  const V4Config c = parse_v4_config(config);
  const auto inv = v4_tensor_inventory(c, include_mtp);
  // Every stored tensor gets a pool key: tensors with one key share one pool (and its value law).
  struct Item {
    V4StoredTensor t;
    std::string key;
    bool whole = false;  // must start at offset 0 (tid2eid: rows of distinct ids)
  };
  std::vector<Item> items;
  std::map<std::string, int64_t> pool_bytes;  // key -> largest tensor
  auto fmt = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", x);
    return std::string(b);
  };
  for (const auto& spec : inv) {
    auto stored = v4_stored_tensors(c, spec);
    const bool matrix = spec.shape.size() == 2;
    const int64_t K = matrix ? spec.shape[1] : 1;
    const bool is_norm = spec.name.find("norm.weight") != std::string::npos;
    for (size_t i = 0; i < stored.size(); ++i) {
      Item it{stored[i], "", false};
      const bool is_scale = i == 1;
      switch (spec.storage) {
        case V4Storage::BF16:
        case V4Storage::F32: {
          const std::string ty = spec.storage == V4Storage::BF16 ? "bf16:" : "f32:";
          it.key = is_norm ? ty + "norm" : matrix ? ty + fmt(1.0 / std::sqrt((double)K)) : ty + "0.5";
          break;
        }
        case V4Storage::I64:
          it.key = "tid2eid:" + std::to_string(spec.shape[1]);
          it.whole = true;
          break;
        case V4Storage::FP8:
          it.key = is_scale ? "e8m0:" + std::to_string(127 - (int)std::lround(std::log2(16.0 * std::sqrt((double)K))))
                            : std::string("e4m3");
          break;
        case V4Storage::FP4:
          it.key = is_scale ? "e8m0:" + std::to_string(127 - (int)std::lround(std::log2(2.93 * std::sqrt((double)K))))
                            : std::string("fp4");
          break;
      }
      int64_t& pb = pool_bytes[it.key];
      pb = std::max(pb, it.t.nbytes());
      items.push_back(std::move(it));
    }
  }
  // Positive E4M3 values (bytes 0x00..0x7E) sorted, for rounding.
  std::vector<std::pair<float, uint8_t>> e4m3_pos;
  for (int b = 0; b < 0x7f; ++b) e4m3_pos.push_back({e4m3fn_to_f32((uint8_t)b), (uint8_t)b});
  std::sort(e4m3_pos.begin(), e4m3_pos.end());

  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  std::map<std::string, std::shared_ptr<std::vector<uint8_t>>> pools;
  for (const auto& [key, largest] : pool_bytes) {
    const std::string ty = key.substr(0, key.find(':'));
    const std::string arg = key.find(':') == std::string::npos ? "" : key.substr(key.find(':') + 1);
    // Slack beyond the largest tensor, so that tensors sharing the pool start at different offsets.
    const int64_t bytes = ty == "tid2eid" ? largest : largest + std::min<int64_t>(largest / 4 + 64, 64ll << 20);
    Rng r{rng.next()};
    std::shared_ptr<std::vector<uint8_t>> pool;
    if (ty == "bf16" || ty == "f32") {
      const bool norm = arg == "norm";
      const float sd = norm ? 0.1f : std::stof(arg);
      const bool bf = ty == "bf16";
      pool = make_pool(bytes, bf ? 2 : 4, r, [&](uint8_t* p) {
        const float v = (norm ? 1.0f : 0.0f) + sd * r.normal();
        if (bf) {
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(p, &h, 2);
        } else {
          std::memcpy(p, &v, 4);
        }
      });
    } else if (ty == "e4m3") {
      pool = make_pool(bytes, 1, r, [&](uint8_t* p) { *p = f32_to_e4m3(std::clamp(16.0f * r.normal(), -448.f, 448.f), e4m3_pos); });
    } else if (ty == "fp4") {
      pool = make_pool(bytes, 1, r, [&](uint8_t* p) { *p = (uint8_t)r.next(); });
    } else if (ty == "e8m0") {
      const int b = std::clamp(std::stoi(arg), 1, 254);
      pool = std::make_shared<std::vector<uint8_t>>((size_t)bytes, (uint8_t)b);
    } else {  // tid2eid: k distinct experts per row
      const int64_t k = std::stoll(arg), E = c.n_routed_experts;
      if (k > E) throw Error("synthetic checkpoint: num_experts_per_tok > n_routed_experts");
      pool = std::make_shared<std::vector<uint8_t>>((size_t)bytes);
      const int64_t rows = bytes / (8 * k);
      std::vector<int64_t> row(k);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          bool dup;
          do {
            row[j] = (int64_t)(r.next() % (uint64_t)E);
            dup = std::find(row.begin(), row.begin() + j, row[j]) != row.begin() + j;
          } while (dup);
        }
        std::memcpy(pool->data() + i * k * 8, row.data(), (size_t)k * 8);
      }
    }
    pools[key] = std::move(pool);
  }
  std::vector<Checkpoint::MemoryTensor> tensors;
  tensors.reserve(items.size());
  for (auto& it : items) {
    const auto& pool = pools.at(it.key);
    const int64_t n = it.t.nbytes(), room = (int64_t)pool->size() - n;
    int64_t off = 0;
    if (!it.whole && room > 0) {
      const int64_t align = (int64_t)dtype_size(it.t.dtype) * 32;
      off = (int64_t)(rng.next() % (uint64_t)(room + 1)) / align * align;
    }
    tensors.push_back({it.t.name, it.t.dtype, it.t.shape, pool, (size_t)off});
  }
  return Checkpoint::in_memory("synthetic:" + std::to_string(c.num_layers) + "-layer V4 (seed " +
                                   std::to_string(seed) + ")",
                               config, std::move(tensors));
}

}  // namespace deepinfer
