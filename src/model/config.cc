#include "model/config.h"

#include <cmath>

#include "util/error.h"

namespace deepinfer {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw Error("config.json: field '" + field + "': " + why);
}

template <class T>
T get_or(const json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  try {
    return it->get<T>();
  } catch (const std::exception& e) {
    bad(key, std::string("wrong type (") + it->type_name() + ")");
  }
}

int get_pos_int(const json& j, const char* key, int def, int min_value = 1) {
  int v = get_or<int>(j, key, def);
  if (v < min_value) bad(key, "must be >= " + std::to_string(min_value) + ", got " + std::to_string(v));
  return v;
}

AttnType attn_type_from_name(const std::string& s, const std::string& field) {
  if (s == "sliding_attention") return AttnType::Sliding;
  if (s == "compressed_sparse_attention") return AttnType::CSA;
  if (s == "heavily_compressed_attention") return AttnType::HCA;
  bad(field, "unknown layer type '" + s + "'");
}

void parse_rope_params(const json& p, RopeConfig& r, const std::string& field) {
  if (!p.is_object()) bad(field, "must be an object");
  std::string type = get_or<std::string>(p, "rope_type", get_or<std::string>(p, "type", "default"));
  if (p.contains("rope_theta")) r.theta = get_or<double>(p, "rope_theta", r.theta);
  if (type == "default") {
    r.yarn = false;
  } else if (type == "yarn") {
    r.yarn = true;
    r.factor = get_or<double>(p, "factor", 1.0);
    r.original_max_position = get_or<double>(p, "original_max_position_embeddings", 0.0);
    r.beta_fast = get_or<double>(p, "beta_fast", 32.0);
    r.beta_slow = get_or<double>(p, "beta_slow", 1.0);
    r.truncate = get_or<bool>(p, "truncate", true);
    if (r.original_max_position <= 0) bad(field, "yarn needs original_max_position_embeddings > 0");
    if (!(r.factor > 0)) bad(field, "yarn factor must be > 0");
    // The V4 reference never multiplies cos/sin by YaRN's mscale; a config asking for it
    // would change the math, so refuse it rather than silently ignore it.
    double af = get_or<double>(p, "attention_factor", 1.0);
    if (af != 1.0) bad(field, "attention_factor != 1 is not used by DeepSeek-V4");
  } else {
    bad(field, "unsupported rope type '" + type + "'");
  }
}

}  // namespace

int V4Config::compress_rate(int layer) const {
  switch (layer_types[layer]) {
    case AttnType::Sliding: return 0;
    case AttnType::CSA: return compress_rate_csa;
    case AttnType::HCA: return compress_rate_hca;
  }
  return 0;
}

V4Config parse_v4_config(const json& j) {
  if (!j.is_object()) throw Error("config.json: top level must be an object");
  V4Config c;
  c.vocab_size = get_pos_int(j, "vocab_size", c.vocab_size);
  c.hidden_size = get_pos_int(j, "hidden_size", c.hidden_size);
  c.num_layers = get_pos_int(j, "num_hidden_layers", c.num_layers);
  c.num_heads = get_pos_int(j, "num_attention_heads", c.num_heads);
  if (get_or<int>(j, "num_key_value_heads", 1) != 1) bad("num_key_value_heads", "DeepSeek-V4 has one K=V head");
  c.head_dim = get_pos_int(j, "head_dim", c.head_dim);
  c.q_lora_rank = get_pos_int(j, "q_lora_rank", c.q_lora_rank);
  c.o_groups = get_pos_int(j, "o_groups", c.o_groups);
  c.o_lora_rank = get_pos_int(j, "o_lora_rank", c.o_lora_rank);
  c.sliding_window = get_pos_int(j, "sliding_window", c.sliding_window);
  c.index_n_heads = get_pos_int(j, "index_n_heads", c.index_n_heads);
  c.index_head_dim = get_pos_int(j, "index_head_dim", c.index_head_dim);
  c.index_topk = get_pos_int(j, "index_topk", c.index_topk);
  c.hc_mult = get_pos_int(j, "hc_mult", c.hc_mult);
  c.hc_sinkhorn_iters = get_pos_int(j, "hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  c.hc_eps = get_or<double>(j, "hc_eps", c.hc_eps);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", c.rms_norm_eps);
  c.n_routed_experts = get_pos_int(j, "n_routed_experts", c.n_routed_experts);
  c.n_shared_experts = get_pos_int(j, "n_shared_experts", c.n_shared_experts, 0);
  if (c.n_shared_experts > 1) bad("n_shared_experts", "DeepSeek-V4 has at most one shared expert");
  c.num_experts_per_tok = get_pos_int(j, "num_experts_per_tok", c.num_experts_per_tok);
  if (c.num_experts_per_tok > c.n_routed_experts) bad("num_experts_per_tok", "larger than n_routed_experts");
  c.moe_intermediate_size = get_pos_int(j, "moe_intermediate_size", c.moe_intermediate_size);
  c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", true);
  c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", c.routed_scaling_factor);
  c.swiglu_limit = get_or<double>(j, "swiglu_limit", c.swiglu_limit);
  c.num_mtp_layers = get_pos_int(j, "num_nextn_predict_layers", 0, 0);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  c.max_position_embeddings = get_pos_int(j, "max_position_embeddings", c.max_position_embeddings);
  c.bos_token_id = get_or<int>(j, "bos_token_id", 0);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    c.eos_token_ids = j["eos_token_id"].get<std::vector<int>>();
  } else {
    c.eos_token_ids = {get_or<int>(j, "eos_token_id", 1)};
  }
  if (get_or<std::string>(j, "hidden_act", "silu") != "silu") bad("hidden_act", "only silu is used by DeepSeek-V4");

  std::string sf = get_or<std::string>(j, "scoring_func", "sqrtsoftplus");
  if (sf == "sqrtsoftplus") c.scoring = ScoringFunc::SqrtSoftplus;
  else if (sf == "sigmoid") c.scoring = ScoringFunc::Sigmoid;
  else if (sf == "softmax") c.scoring = ScoringFunc::Softmax;
  else bad("scoring_func", "unknown '" + sf + "'");

  // Compression rates: transformers' dict, then the legacy scalars override (as transformers does).
  if (j.contains("compress_rates") && !j["compress_rates"].is_null()) {
    const json& cr = j["compress_rates"];
    if (!cr.is_object()) bad("compress_rates", "must be an object");
    c.compress_rate_csa = get_pos_int(cr, "compressed_sparse_attention", c.compress_rate_csa);
    c.compress_rate_hca = get_pos_int(cr, "heavily_compressed_attention", c.compress_rate_hca);
  }
  c.compress_rate_csa = get_pos_int(j, "compress_rate_csa", c.compress_rate_csa);
  c.compress_rate_hca = get_pos_int(j, "compress_rate_hca", c.compress_rate_hca);

  // Layer schedule: explicit layer_types > legacy compress_ratios (longer than num_layers: the tail
  // belongs to MTP layers). transformers' no-schedule default is a Pro-like guess; we refuse it.
  c.layer_types.clear();
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    if (!lt.is_array()) bad("layer_types", "must be an array");
    for (const auto& e : lt) {
      if (!e.is_string()) bad("layer_types", "entries must be strings");
      c.layer_types.push_back(attn_type_from_name(e.get<std::string>(), "layer_types"));
    }
  } else if (j.contains("compress_ratios") && !j["compress_ratios"].is_null()) {
    const json& cr = j["compress_ratios"];
    if (!cr.is_array()) bad("compress_ratios", "must be an array");
    for (const auto& e : cr) {
      if (!e.is_number_integer()) bad("compress_ratios", "entries must be integers");
      int r = e.get<int>();
      if (r == 0) c.layer_types.push_back(AttnType::Sliding);
      else if (r == c.compress_rate_csa) c.layer_types.push_back(AttnType::CSA);
      else if (r == c.compress_rate_hca) c.layer_types.push_back(AttnType::HCA);
      else bad("compress_ratios", "ratio " + std::to_string(r) + " is neither 0, the CSA nor the HCA rate");
    }
  } else {
    bad("layer_types", "config has neither layer_types nor compress_ratios");
  }
  if ((int)c.layer_types.size() < c.num_layers)
    bad("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries for " +
                           std::to_string(c.num_layers) + " layers");
  c.layer_types.resize(c.num_layers);

  c.hash_layers.assign(c.num_layers, false);
  if (j.contains("mlp_layer_types") && !j["mlp_layer_types"].is_null()) {
    const json& ml = j["mlp_layer_types"];
    if (!ml.is_array() || (int)ml.size() < c.num_layers) bad("mlp_layer_types", "must list every layer");
    for (int i = 0; i < c.num_layers; ++i) {
      if (!ml[i].is_string()) bad("mlp_layer_types", "entries must be strings");
      std::string s = ml[i].get<std::string>();
      if (s == "hash_moe") c.hash_layers[i] = true;
      else if (s != "moe") bad("mlp_layer_types", "unknown entry '" + s + "'");
    }
  } else {
    int n_hash = get_pos_int(j, "num_hash_layers", 3, 0);
    for (int i = 0; i < c.num_layers && i < n_hash; ++i) c.hash_layers[i] = true;
  }

  // Partial rotary: transformers' partial_rotary_factor, else legacy qk_rope_head_dim, else 64/512.
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    double f = get_or<double>(j, "partial_rotary_factor", 0.125);
    c.rope_dim = (int)(c.head_dim * f);
  } else if (j.contains("qk_rope_head_dim")) {
    c.rope_dim = get_pos_int(j, "qk_rope_head_dim", 64);
  } else {
    c.rope_dim = c.head_dim / 8;
  }
  if (c.rope_dim <= 0 || c.rope_dim % 2 || c.rope_dim > c.head_dim) bad("qk_rope_head_dim", "must be even, in (0, head_dim]");
  if (c.rope_dim > c.index_head_dim) bad("index_head_dim", "smaller than the rope dim");

  // RoPE: sliding layers use rope_theta without scaling; compressed layers compress_rope_theta with
  // the (flat) rope_scaling / nested rope_parameters.compress.
  c.rope_main.theta = get_or<double>(j, "rope_theta", 10000.0);
  c.rope_compress.theta = get_or<double>(j, "compress_rope_theta", 160000.0);
  const json* rp = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rp = &j["rope_parameters"];
  if (rp && rp->contains("main") && rp->contains("compress")) {
    parse_rope_params((*rp)["main"], c.rope_main, "rope_parameters.main");
    parse_rope_params((*rp)["compress"], c.rope_compress, "rope_parameters.compress");
  } else {
    const json* flat = rp;
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) flat = &j["rope_scaling"];
    if (flat) {
      json p = *flat;
      p.erase("rope_theta");  // the compress base stays compress_rope_theta
      parse_rope_params(p, c.rope_compress, "rope_scaling");
    }
  }
  c.rope_main.yarn = c.rope_main.yarn;  // kept as parsed; V4 checkpoints never set it

  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const json& q = j["quantization_config"];
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
          b[0].get<int>() <= 0 || b[1].get<int>() <= 0)
        bad("quantization_config.weight_block_size", "must be two positive integers");
      c.fp8_block_rows = b[0].get<int>();
      c.fp8_block_cols = b[1].get<int>();
    }
  }

  // Shape sanity that the model relies on.
  if (c.num_heads % c.o_groups) bad("o_groups", "must divide num_attention_heads");
  if (c.hc_mult < 1) bad("hc_mult", "must be >= 1");
  return c;
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int dim) {
  // transformers computes these in float32: base ** (arange(0, dim, 2) / dim), then 1 / that.
  int half = dim / 2;
  std::vector<float> f(half);
  float base = (float)rope.theta;
  for (int i = 0; i < half; ++i) f[i] = 1.0f / std::pow(base, (float)(2 * i) / (float)dim);
  if (!rope.yarn) return f;
  auto corr = [&](double n_rot) {
    return dim * std::log(rope.original_max_position / (n_rot * 2 * M_PI)) / (2 * std::log(rope.theta));
  };
  double lo = corr(rope.beta_fast), hi = corr(rope.beta_slow);
  if (rope.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, (double)(dim - 1));
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < half; ++i) {
    float ramp = std::clamp((float)((i - lo) / (hi - lo)), 0.0f, 1.0f);  // 1 = interpolate (divide by factor)
    float extrap = 1.0f - ramp;
    float interp = 1.0f / ((float)rope.factor * std::pow(base, (float)(2 * i) / (float)dim));
    f[i] = interp * (1.0f - extrap) + f[i] * extrap;
  }
  return f;
}

}  // namespace deepinfer
