#include "model/deepseek_v41.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>

#include "io/checkpoint.h"
#include "io/dequant.h"
#include "model/v41_debug.h"
#include "model/weight_reader.h"
#include "ops/expert_loop.h"
#include "util/error.h"
#include "util/numeric.h"

namespace deepinfer {

V41QatHook g_v41_qat_hook = nullptr;

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw Error("config.json (DeepSeek-V4.1): field '" + field + "': " + why);
}

// First present spelling of a field (transformers name first, then the reference code's).
const json* field(const json& j, std::initializer_list<const char*> names, std::string* which = nullptr) {
  for (const char* n : names) {
    auto it = j.find(n);
    if (it != j.end() && !it->is_null()) {
      if (which) *which = n;
      return &*it;
    }
  }
  return nullptr;
}

template <class T>
T get_or(const json& j, std::initializer_list<const char*> names, T def) {
  std::string n;
  const json* v = field(j, names, &n);
  if (!v) return def;
  try {
    return v->get<T>();
  } catch (const std::exception&) {
    bad(n, std::string("wrong type (") + v->type_name() + ")");
  }
}

int get_int(const json& j, std::initializer_list<const char*> names, int def, int min_value = 1) {
  std::string n;
  const json* v = field(j, names, &n);
  if (!v) return def;
  if (!v->is_number_integer()) bad(n, "must be an integer");
  int64_t x = v->get<int64_t>();
  if (x < min_value || x > INT32_MAX) bad(n, "must be in [" + std::to_string(min_value) + ", 2^31), got " + std::to_string(x));
  return (int)x;
}

std::vector<int64_t> get_int_list(const json& j, std::initializer_list<const char*> names, bool required) {
  std::string n;
  const json* v = field(j, names, &n);
  if (!v) {
    if (required) bad(*names.begin(), "missing");
    return {};
  }
  if (!v->is_array()) bad(n, "must be a list of integers");
  std::vector<int64_t> out;
  for (const auto& e : *v) {
    if (!e.is_number_integer()) bad(n, "must be a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

void parse_rope(const json& p, RopeConfig& r, const std::string& name) {
  if (!p.is_object()) bad(name, "must be an object");
  std::string type = get_or<std::string>(p, {"rope_type", "type"}, "default");
  if (p.contains("rope_theta")) r.theta = get_or<double>(p, {"rope_theta"}, r.theta);
  if (type == "default") {
    r.yarn = false;
    return;
  }
  if (type != "yarn") bad(name, "unsupported rope type '" + type + "'");
  r.yarn = true;
  r.factor = get_or<double>(p, {"factor"}, 1.0);
  r.original_max_position = get_or<double>(p, {"original_max_position_embeddings"}, 0.0);
  r.beta_fast = get_or<double>(p, {"beta_fast"}, 32.0);
  r.beta_slow = get_or<double>(p, {"beta_slow"}, 1.0);
  r.truncate = get_or<bool>(p, {"truncate"}, true);
  if (r.original_max_position <= 0) bad(name, "yarn needs original_max_position_embeddings > 0");
  if (!(r.factor > 0)) bad(name, "yarn factor must be > 0");
  if (get_or<double>(p, {"attention_factor"}, 1.0) != 1.0) bad(name, "attention_factor != 1 is not used by DeepSeek-V4.1");
}

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// numpy's SeedSequence (pool of 4 words) + PCG64 (XSL-RR 128/64) + Generator.integers' 64-bit
// Lemire bounded draw: exactly what `numpy.random.default_rng(seed).integers(0, high, size=n)`
// returns, so the Engram multipliers follow from the config alone.
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed) {
    std::vector<uint32_t> ent;
    for (uint64_t s = seed; s; s >>= 32) ent.push_back((uint32_t)s);
    if (ent.empty()) ent.push_back(0);
    uint32_t hc = 0x43b0d7e5u;
    auto hashmix = [&](uint32_t v) {
      v ^= hc;
      hc *= 0x931e8875u;
      v *= hc;
      v ^= v >> 16;
      return v;
    };
    auto mix = [](uint32_t x, uint32_t y) {
      uint32_t r = 0xca01f9ddu * x - 0x4973f715u * y;
      return r ^ (r >> 16);
    };
    uint32_t pool[4];
    for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < ent.size() ? ent[i] : 0u);
    for (int s = 0; s < 4; ++s)
      for (int d = 0; d < 4; ++d)
        if (s != d) pool[d] = mix(pool[d], hashmix(pool[s]));
    for (size_t s = 4; s < ent.size(); ++s)
      for (int d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(ent[s]));
    uint32_t w[8];
    uint32_t hb = 0x8b51f9ddu;
    for (int i = 0; i < 8; ++i) {
      uint32_t v = pool[i % 4];
      v ^= hb;
      hb *= 0x58f38dedu;
      v *= hb;
      w[i] = v ^ (v >> 16);
    }
    uint64_t v64[4];
    for (int i = 0; i < 4; ++i) v64[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    const unsigned __int128 initstate = ((unsigned __int128)v64[0] << 64) | v64[1];
    const unsigned __int128 initseq = ((unsigned __int128)v64[2] << 64) | v64[3];
    state_ = 0;
    inc_ = (initseq << 1) | 1;
    step();
    state_ += initstate;
    step();
  }
  uint64_t next64() {
    step();
    uint64_t x = (uint64_t)(state_ >> 64) ^ (uint64_t)state_;
    unsigned rot = (unsigned)(state_ >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
  }
  // Uniform in [0, rng] (rng > 2^32 − 1: the path numpy takes for these bounds).
  uint64_t bounded(uint64_t rng) {
    const uint64_t excl = rng + 1;
    unsigned __int128 m = (unsigned __int128)next64() * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
      const uint64_t threshold = (UINT64_MAX - rng) % excl;
      while (left < threshold) {
        m = (unsigned __int128)next64() * excl;
        left = (uint64_t)m;
      }
    }
    return (uint64_t)(m >> 64);
  }

 private:
  void step() {
    const unsigned __int128 mult = ((unsigned __int128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
    state_ = state_ * mult + inc_;
  }
  unsigned __int128 state_, inc_;
};

inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config parsing
// ---------------------------------------------------------------------------------------------

bool V41Config::is_kv_source(int l) const {
  return std::find(kv_source_layers.begin(), kv_source_layers.end(), l) != kv_source_layers.end();
}
bool V41Config::is_index_source(int l) const {
  return std::find(index_source_layers.begin(), index_source_layers.end(), l) != index_source_layers.end();
}

bool is_v41_config(const json& j) {
  if (!j.is_object()) return false;
  auto str = [&](const json& o, const char* k) {
    return o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  std::string t = str(j, "model_type");
  if (t == "deepseek_v41" || t == "deepseek_v41_text") return true;
  if (j.contains("text_config") && j["text_config"].is_object() && str(j["text_config"], "model_type") == "deepseek_v41_text")
    return true;
  // The reference code's flat inference/config.json names no model type; the shared-compression
  // schedule is V4.1's alone.
  if (j.contains("kv_source_layers") || j.contains("kv_source_layer_ids")) return true;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string() && a.get<std::string>().rfind("DeepseekV41", 0) == 0) return true;
  return false;
}

V41Config parse_v41_config(const json& top) {
  if (!top.is_object()) throw Error("config.json: top level must be an object");
  // Composite config: the text model's fields live in text_config; quantization_config and the
  // token ids may sit at the top level.
  const json* tp = &top;
  if (top.contains("text_config")) {
    if (!top["text_config"].is_object()) bad("text_config", "must be an object");
    tp = &top["text_config"];
  }
  const json& j = *tp;
  V41Config c;
  c.vocab_size = get_int(j, {"vocab_size"}, c.vocab_size);
  c.hidden_size = get_int(j, {"hidden_size", "dim"}, c.hidden_size);
  c.num_layers = get_int(j, {"num_hidden_layers", "n_layers"}, c.num_layers);
  c.num_heads = get_int(j, {"num_attention_heads", "n_heads"}, c.num_heads);
  if (get_int(j, {"num_key_value_heads"}, 1) != 1) bad("num_key_value_heads", "DeepSeek-V4.1 has one K=V head");
  c.head_dim = get_int(j, {"head_dim"}, c.head_dim);
  c.rope_dim = get_int(j, {"qk_rope_head_dim", "rope_head_dim"}, c.rope_dim);
  c.q_lora_rank = get_int(j, {"q_lora_rank"}, c.q_lora_rank);
  c.o_groups = get_int(j, {"o_groups"}, c.o_groups);
  c.o_lora_rank = get_int(j, {"o_lora_rank"}, c.o_lora_rank);
  c.sliding_window = get_int(j, {"sliding_window", "window_size"}, c.sliding_window);
  c.index_n_heads = get_int(j, {"index_n_heads"}, c.index_n_heads);
  c.index_head_dim = get_int(j, {"index_head_dim"}, c.index_head_dim);
  c.index_topk = get_int(j, {"index_topk"}, c.index_topk);
  c.candidate_topk_blocks = get_int(j, {"candidate_topk_blocks"}, c.candidate_topk_blocks);
  c.candidate_block_size = get_int(j, {"candidate_block_size"}, c.candidate_block_size);
  c.candidate_source_layer = get_int(j, {"candidate_source_layer_id", "candidate_source_layer"}, -1, INT32_MIN + 1);
  c.hc_mult = get_int(j, {"hc_mult"}, c.hc_mult);
  c.hc_sinkhorn_iters = get_int(j, {"hc_sinkhorn_iters"}, c.hc_sinkhorn_iters);
  c.hc_eps = get_or<double>(j, {"hc_eps"}, c.hc_eps);
  c.rms_norm_eps = get_or<double>(j, {"rms_norm_eps", "norm_eps"}, c.rms_norm_eps);
  if (!(c.rms_norm_eps >= 0) || !(c.hc_eps >= 0)) bad("rms_norm_eps", "epsilons must be >= 0");
  c.n_routed_experts = get_int(j, {"n_routed_experts"}, c.n_routed_experts);
  c.n_shared_experts = get_int(j, {"n_shared_experts"}, c.n_shared_experts, 0);
  if (c.n_shared_experts > 1) bad("n_shared_experts", "DeepSeek-V4.1 has at most one shared expert");
  c.num_experts_per_tok = get_int(j, {"num_experts_per_tok", "n_activated_experts"}, c.num_experts_per_tok);
  if (c.num_experts_per_tok > c.n_routed_experts) bad("num_experts_per_tok", "larger than n_routed_experts");
  c.moe_intermediate_size = get_int(j, {"moe_intermediate_size", "moe_inter_dim"}, c.moe_intermediate_size);
  c.norm_topk_prob = get_or<bool>(j, {"norm_topk_prob"}, true);
  c.routed_scaling_factor = get_or<double>(j, {"routed_scaling_factor", "route_scale"}, c.routed_scaling_factor);
  c.gate_temp = get_or<double>(j, {"gate_temp"}, 1.0);
  if (!(c.gate_temp > 0)) bad("gate_temp", "must be > 0");
  c.swiglu_limit = get_or<double>(j, {"swiglu_limit"}, c.swiglu_limit);
  c.num_mtp_layers = get_int(j, {"num_nextn_predict_layers", "n_mtp_layers"}, 0, 0);
  c.max_position_embeddings = get_int(j, {"max_position_embeddings"}, c.max_position_embeddings);
  if (get_or<bool>(j, {"tie_word_embeddings"}, get_or<bool>(top, {"tie_word_embeddings"}, false)))
    bad("tie_word_embeddings", "DeepSeek-V4.1 has an untied head");
  if (get_or<std::string>(j, {"hidden_act"}, "silu") != "silu") bad("hidden_act", "only silu is used by DeepSeek-V4.1");
  std::string sf = get_or<std::string>(j, {"scoring_func", "score_func"}, "sqrtsoftplus");
  if (sf != "sqrtsoftplus") bad("scoring_func", "DeepSeek-V4.1 routes with sqrtsoftplus, got '" + sf + "'");
  if (get_int(j, {"num_hash_layers", "n_hash_layers"}, 0, 0) != 0) bad("num_hash_layers", "DeepSeek-V4.1 has no hash-routed layers");
  auto read_ids = [&](const json& o) {  // the text config's ids win over the top level's
    c.bos_token_id = get_int(o, {"bos_token_id"}, c.bos_token_id, 0);
    if (o.contains("eos_token_id") && o["eos_token_id"].is_array()) {
      c.eos_token_ids.clear();
      for (int64_t v : get_int_list(o, {"eos_token_id"}, true)) c.eos_token_ids.push_back((int)v);
    } else if (o.contains("eos_token_id") && !o["eos_token_id"].is_null()) {
      c.eos_token_ids = {get_int(o, {"eos_token_id"}, 1, 0)};
    }
  };
  read_ids(top);
  if (&j != &top) read_ids(j);
  c.image_token_id = get_int(top, {"image_token_id"}, get_int(j, {"image_token_id"}, -1, -1), -1);

  // Layer schedule.
  auto ratios = get_int_list(j, {"compress_ratios"}, true);
  if ((int)ratios.size() < c.num_layers)
    bad("compress_ratios", "has " + std::to_string(ratios.size()) + " entries for " + std::to_string(c.num_layers) + " layers");
  for (int l = 0; l < c.num_layers; ++l) {
    if (ratios[l] < 0 || ratios[l] > 2) bad("compress_ratios", "layer " + std::to_string(l) + ": ratio " + std::to_string(ratios[l]) + " (DeepSeek-V4.1 uses 0, 1 or 2)");
    c.compress_ratios.push_back((int)ratios[l]);
  }
  auto to_layers = [&](const std::vector<int64_t>& v, const char* name) {
    std::vector<int> out;
    for (int64_t x : v) {
      if (x < 0 || x >= c.num_layers) bad(name, "layer " + std::to_string(x) + " outside [0, " + std::to_string(c.num_layers) + ")");
      if (c.compress_ratios[x] == 0) bad(name, "layer " + std::to_string(x) + " has compress ratio 0");
      if (!out.empty() && x <= out.back()) bad(name, "must be strictly increasing");
      out.push_back((int)x);
    }
    return out;
  };
  c.kv_source_layers = to_layers(get_int_list(j, {"kv_source_layer_ids", "kv_source_layers"}, true), "kv_source_layer_ids");
  c.index_source_layers = to_layers(get_int_list(j, {"index_source_layer_ids", "index_source_layers"}, true), "index_source_layer_ids");
  for (int s : c.kv_source_layers)
    if (!c.is_index_source(s)) bad("index_source_layer_ids", "must contain every KV source layer (missing " + std::to_string(s) + ")");
  c.kv_source_of.assign(c.num_layers, -1);
  c.index_source_of.assign(c.num_layers, -1);
  int kv = -1, idx = -1;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.is_kv_source(l)) kv = l;
    if (c.is_index_source(l)) idx = l;
    if (c.compress_ratios[l] == 0) continue;
    const std::string L = "layer " + std::to_string(l);
    if (kv < 0) bad("kv_source_layer_ids", L + " is compressed but no KV source precedes it");
    if (c.compress_ratios[kv] != c.compress_ratios[l])
      bad("compress_ratios", L + " has ratio " + std::to_string(c.compress_ratios[l]) + " but its KV source " +
                                 std::to_string(kv) + " has " + std::to_string(c.compress_ratios[kv]));
    if (idx < kv) bad("index_source_layer_ids", L + " has no index source in its KV group");
    c.kv_source_of[l] = kv;
    c.index_source_of[l] = idx;
  }
  if (c.candidate_source_layer >= 0) {
    if (c.candidate_source_layer >= c.num_layers || !c.is_index_source(c.candidate_source_layer))
      bad("candidate_source_layer_id", "must be an index source layer, got " + std::to_string(c.candidate_source_layer));
  } else {
    c.candidate_source_layer = -1;
  }

  // RoPE: ratio-0 layers rope_theta without scaling; compressed layers compress_rope_theta + YaRN.
  c.rope_main.theta = get_or<double>(j, {"rope_theta"}, 10000.0);
  c.rope_compress.theta = get_or<double>(j, {"compress_rope_theta"}, 160000.0);
  const json* rp = field(j, {"rope_parameters"});
  if (rp && rp->is_object() && rp->contains("main") && rp->contains("compress")) {
    parse_rope((*rp)["main"], c.rope_main, "rope_parameters.main");
    parse_rope((*rp)["compress"], c.rope_compress, "rope_parameters.compress");
  } else if (const json* flat = field(j, {"rope_scaling"}) ? field(j, {"rope_scaling"}) : rp) {
    json p = *flat;
    if (!p.is_object()) bad("rope_scaling", "must be an object");
    p.erase("rope_theta");  // the compress base stays compress_rope_theta
    parse_rope(p, c.rope_compress, "rope_scaling");
  } else if (j.contains("rope_factor")) {  // reference-code flat names
    c.rope_compress.yarn = true;
    c.rope_compress.factor = get_or<double>(j, {"rope_factor"}, 1.0);
    c.rope_compress.original_max_position = get_or<double>(j, {"original_seq_len"}, 0.0);
    c.rope_compress.beta_fast = get_or<double>(j, {"beta_fast"}, 32.0);
    c.rope_compress.beta_slow = get_or<double>(j, {"beta_slow"}, 1.0);
    if (c.rope_compress.original_max_position <= 0) bad("original_seq_len", "must be > 0");
  }

  // Engram.
  auto el = get_int_list(j, {"engram_layer_ids"}, false);
  for (int64_t x : el) {
    if (x < 0 || x >= c.num_layers) bad("engram_layer_ids", "layer " + std::to_string(x) + " out of range");
    if (!c.engram_layers.empty() && x <= c.engram_layers.back()) bad("engram_layer_ids", "must be strictly increasing");
    c.engram_layers.push_back((int)x);
  }
  if (!c.engram_layers.empty()) {
    c.engram_num_embeddings = get_int_list(j, {"engram_num_embeddings"}, true);
    if (c.engram_num_embeddings.size() != c.engram_layers.size())
      bad("engram_num_embeddings", "needs one entry per Engram layer");
    c.engram_max_ngram = get_int(j, {"engram_max_ngram_size"}, c.engram_max_ngram, 2);
    c.engram_n_heads = get_int(j, {"engram_n_heads"}, c.engram_n_heads);
    c.engram_head_dim = get_int(j, {"engram_head_dim"}, c.engram_head_dim);
    {
      const json* v = field(j, {"engram_vocab_size"});
      if (v) {
        if (!v->is_number_integer() || v->get<int64_t>() < 2) bad("engram_vocab_size", "must be an integer >= 2");
        c.engram_vocab_size = v->get<int64_t>();
      }
    }
    c.engram_pad_id = get_int(j, {"engram_pad_token_id", "engram_pad_id"}, c.engram_pad_id, 0);
    c.engram_compressed_vocab = get_int(j, {"engram_compressed_vocab_size"}, c.engram_compressed_vocab);
    if (c.engram_pad_id >= c.vocab_size) bad("engram_pad_token_id", "outside the vocabulary");
    if (c.engram_max_ngram > 8) bad("engram_max_ngram_size", "must be <= 8");
  }

  // Quantization block (top level in the composite config, sometimes inside text_config).
  for (const json* o : {&j, &top}) {
    const json* q = field(*o, {"quantization_config"});
    if (!q || !q->is_object() || !q->contains("weight_block_size")) continue;
    const json& b = (*q)["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int>() <= 0 || b[1].get<int>() <= 0)
      bad("quantization_config.weight_block_size", "must be two positive integers");
    c.fp8_block_rows = b[0].get<int>();
    c.fp8_block_cols = b[1].get<int>();
    break;
  }

  // Shape rules the QAT block sizes and the grouped output rely on.
  if (c.num_heads % c.o_groups) bad("o_groups", "must divide num_attention_heads");
  if (c.head_dim % 32) bad("head_dim", "must be a multiple of 32 (FP8 KV blocks)");
  if (c.index_head_dim % 32) bad("index_head_dim", "must be a multiple of 32 (FP4 index blocks)");
  if (c.rope_dim % 2 || c.rope_dim > c.head_dim || c.rope_dim > c.index_head_dim)
    bad("qk_rope_head_dim", "must be even and at most head_dim and index_head_dim");
  if (c.hc_mult < 1 || c.hc_mult > 16) bad("hc_mult", "must be in [1, 16]");
  return c;
}

std::vector<int64_t> engram_multipliers(int layer, int compressed_vocab, int max_ngram) {
  const uint64_t high = (uint64_t)INT64_MAX / (uint64_t)compressed_vocab / 2;  // integers(0, high)
  if (high - 1 <= 0xFFFFFFFFull) throw Error("engram_compressed_vocab_size too large for the Engram hash");
  NumpyPcg64 g(10007ull * (uint64_t)layer);
  std::vector<int64_t> out;
  for (int k = 0; k < max_ngram; ++k) out.push_back((int64_t)(2 * g.bounded(high - 1) + 1));
  return out;
}

std::vector<std::vector<int64_t>> engram_primes(const V41Config& c) {
  std::vector<std::vector<int64_t>> out;
  int64_t next = c.engram_vocab_size;
  const int cols = (c.engram_max_ngram - 1) * c.engram_n_heads;
  for (size_t e = 0; e < c.engram_layers.size(); ++e) {
    out.emplace_back();
    for (int col = 0; col < cols; ++col) {
      while (!is_prime(next)) ++next;
      out.back().push_back(next++);
    }
  }
  return out;
}

int64_t V41SeqState::bytes() const {
  int64_t b = 0;
  for (const auto* v : {&ring, &open_kv, &open_gate})
    for (const auto& x : *v) b += x.size() * 4;
  for (const auto* v : {&entries, &keys})
    for (const auto& x : *v) b += x.buf.size() * 4;
  return b + (int64_t)engram_hist.capacity() * 4;
}

float* V41Rows::reserve(Backend& be, int64_t add) {
  const int64_t cap = width ? buf.size() / width : 0;
  if (n + add > cap) {
    Buffer<float> grown(be, std::max<int64_t>({n + add, 2 * cap, 16}) * width);
    if (n) be.copy(grown.data(), buf.data(), sizeof(float) * n * width);
    buf = std::move(grown);
  }
  return buf.data() + n * width;
}

std::vector<int32_t> read_engram_token_map(const std::string& dir, const V41Config& cfg) {
  if (cfg.engram_layers.empty()) return {};
  const std::string path = dir + "/engram_token_map.safetensors";
  if (!std::filesystem::exists(path))
    throw Error(dir + ": the config has Engram layers but engram_token_map.safetensors is missing (make it from "
                      "tokenizer.json with scripts/make_engram_token_map.py)");
  auto f = SafetensorsFile::open(path);
  const TensorView* t = f->find("token_map");
  if (!t) throw Error(path + ": no tensor 'token_map'");
  if (t->shape != std::vector<int64_t>{cfg.vocab_size})
    throw Error(path + ": 'token_map' has shape " + shape_str(t->shape) + ", expected [" + std::to_string(cfg.vocab_size) + "]");
  std::vector<int32_t> out(cfg.vocab_size);
  std::vector<char> seen(cfg.engram_compressed_vocab, 0);
  int64_t distinct = 0;
  for (int64_t i = 0; i < cfg.vocab_size; ++i) {
    int64_t v;
    if (t->dtype == DType::I64) std::memcpy(&v, t->data + 8 * i, 8);
    else if (t->dtype == DType::I32) { int32_t x; std::memcpy(&x, t->data + 4 * i, 4); v = x; }
    else throw Error(path + ": 'token_map' must be I32 or I64");
    if (v < 0 || v >= cfg.engram_compressed_vocab)
      throw Error(path + ": 'token_map' holds " + std::to_string(v) + ", outside [0, engram_compressed_vocab_size = " +
                  std::to_string(cfg.engram_compressed_vocab) + ")");
    distinct += !seen[v];
    seen[v] = 1;
    out[i] = (int32_t)v;
  }
  // Every hash multiplier depends on the compressed vocabulary size: a map of another size
  // would silently rehash the tables (spec §3.1).
  if (distinct != cfg.engram_compressed_vocab)
    throw Error(path + ": 'token_map' has " + std::to_string(distinct) + " distinct values, the config says " +
                std::to_string(cfg.engram_compressed_vocab));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

DeepseekV41Model::DeepseekV41Model(const V41Config& cfg, Checkpoint& ckpt, Backend& backend,
                                   std::vector<int32_t> token_map, const LoadProgress& progress)
    : cfg_(cfg), be_(backend), token_map_(std::move(token_map)) {
  const V41Config& c = cfg_;
  const int64_t V = c.vocab_size, D = c.hidden_size, H = c.num_heads, d = c.head_dim, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc, I = c.moe_intermediate_size, E = c.n_routed_experts;
  const int64_t dI = c.index_head_dim, hI = c.index_n_heads;
  if (!c.engram_layers.empty() && (int64_t)token_map_.size() != V)
    throw Error(ckpt.dir() + ": the Engram token map must have vocab_size entries");
  WeightReader r(ckpt, cfg_.fp8_block_rows, cfg_.fp8_block_cols, backend);
  embed_ = r.vec("embed.weight", {V, D});
  head_ = r.mat("head.weight", V, D);
  norm_ = r.vec("norm.weight", {D});

  // Engram modules.
  auto primes = engram_primes(c);
  const int cols = (c.engram_max_ngram - 1) * c.engram_n_heads;
  const int64_t hd = c.engram_head_dim;
  for (size_t e = 0; e < c.engram_layers.size(); ++e) {
    const int l = c.engram_layers[e];
    const std::string p = "layers." + std::to_string(l) + ".engram.";
    V41Engram g;
    g.prime = primes[e];
    int64_t off = 0;
    for (int64_t pr : g.prime) {
      g.off.push_back(off);
      off += pr;
    }
    if (off != c.engram_num_embeddings[e])
      throw Error("config.json (DeepSeek-V4.1): engram_num_embeddings[" + std::to_string(e) + "] = " +
                  std::to_string(c.engram_num_embeddings[e]) + ", but the hash primes of layer " + std::to_string(l) +
                  " sum to " + std::to_string(off));
    g.mult = engram_multipliers(l, c.engram_compressed_vocab, c.engram_max_ngram);
    g.table = ckpt.take(p + "embed.weight");
    if (g.table.shape != std::vector<int64_t>{off, hd})
      throw Error(ckpt.dir() + ": tensor '" + p + "embed.weight' has shape " + shape_str(g.table.shape) + ", expected " +
                  shape_str({off, hd}));
    if (ckpt.has(p + "embed.scale")) {
      g.table_scale = ckpt.take(p + "embed.scale");
      g.has_scale = true;
      if (g.table.dtype != DType::F8_E4M3 || g.table_scale.shape != std::vector<int64_t>{off, (hd + 31) / 32} ||
          (g.table_scale.dtype != DType::F8_E8M0 && g.table_scale.dtype != DType::F32))
        throw Error(ckpt.dir() + ": Engram table '" + p + "embed.weight' must be F8_E4M3 with an F8_E8M0/F32 scale [" +
                    std::to_string(off) + ", " + std::to_string((hd + 31) / 32) + "]");
    } else if (g.table.dtype != DType::F32 && g.table.dtype != DType::BF16 && g.table.dtype != DType::F16) {
      throw Error(ckpt.dir() + ": Engram table '" + p + "embed.weight' has dtype " + std::string(dtype_name(g.table.dtype)) +
                  " and no scale");
    }
    g.wkv = r.mat(p + "wkv.weight", (hc + 1) * D, cols * hd);
    auto qw = r.f32(p + "q_weight", {hc, D});
    auto kw = r.f32(p + "k_weight", {hc, D});
    std::vector<float> w(hc * D);
    for (int64_t i = 0; i < hc * D; ++i) w[i] = qw[i] * kw[i];  // only ever used as a product
    g.w = Buffer<float>(backend, w);
    engrams_.push_back(std::move(g));
  }

  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    V41Layer& L = layers_[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.ratio = c.compress_ratios[l];
    L.kv_source = c.is_kv_source(l);
    L.index_source = c.is_index_source(l);
    L.candidate_source = l == c.candidate_source_layer;
    L.kv_src = c.kv_source_of[l];
    L.restricted = L.index_source && !L.kv_source && c.candidate_source_layer >= 0 && l > c.candidate_source_layer &&
                   L.kv_src == c.kv_source_of[c.candidate_source_layer];
    for (size_t e = 0; e < c.engram_layers.size(); ++e)
      if (c.engram_layers[e] == l) L.engram = (int)e;
    L.attn_norm = r.vec(p + "attn_norm.weight", {D});
    L.ffn_norm = r.vec(p + "ffn_norm.weight", {D});
    L.hc_attn_fn = r.vec(p + "hc_attn_fn", {mix, hc * D});
    L.hc_attn_base = r.vec(p + "hc_attn_base", {mix});
    L.hc_attn_scale = r.vec(p + "hc_attn_scale", {3});
    L.hc_ffn_fn = r.vec(p + "hc_ffn_fn", {mix, hc * D});
    L.hc_ffn_base = r.vec(p + "hc_ffn_base", {mix});
    L.hc_ffn_scale = r.vec(p + "hc_ffn_scale", {3});
    L.sinks = r.vec(p + "attn.attn_sink", {H});
    L.wq_a = r.mat(p + "attn.wq_a.weight", c.q_lora_rank, D);
    L.q_norm = r.vec(p + "attn.q_norm.weight", {c.q_lora_rank});
    L.wq_b = r.mat(p + "attn.wq_b.weight", H * d, c.q_lora_rank);
    L.wkv = r.mat(p + "attn.wkv.weight", d, D);
    L.kv_norm = r.vec(p + "attn.kv_norm.weight", {d});
    {  // block-diagonal: one [o_lora, H·d/g] matrix per head group
      const int64_t G = c.o_groups, ol = c.o_lora_rank, gin = H * d / G;
      auto wo_a = r.f32(p + "attn.wo_a.weight", {G * ol, gin});
      for (int64_t g = 0; g < G; ++g) L.wo_a.push_back(backend.make_weight(wo_a.data() + g * ol * gin, ol, gin));
    }
    L.wo_b = r.mat(p + "attn.wo_b.weight", D, (int64_t)c.o_groups * c.o_lora_rank);
    if (L.kv_source) {
      L.comp_wkv = r.mat(p + "attn.compressor.wkv.weight", d, D);
      if (L.ratio == 2) L.comp_wgate = r.mat(p + "attn.compressor.wgate.weight", d, D);
      L.comp_norm = r.vec(p + "attn.compressor.norm.weight", {d});
      L.idx_wk = r.mat(p + "attn.indexer.wk.weight", dI, d);
      L.idx_k_norm = r.vec(p + "attn.indexer.k_norm.weight", {dI});
    }
    if (L.index_source) {
      L.idx_wq_b = r.mat(p + "attn.indexer.wq_b.weight", hI * dI, c.q_lora_rank);
      L.idx_weights_proj = r.mat(p + "attn.indexer.weights_proj.weight", hI, D);
    }
    L.gate = r.mat(p + "ffn.gate.weight", E, D);
    L.gate_bias = r.f32(p + "ffn.gate.bias", {E});
    // bias_vl routes image-span tokens; image inputs are refused, so it is checked and dropped.
    if (ckpt.has(p + "ffn.gate.bias_vl")) r.f32(p + "ffn.gate.bias_vl", {E});
    L.expert_w13.resize(E);
    L.expert_w2.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      L.expert_w13[e] = r.mat2(ep + "w1.weight", ep + "w3.weight", I, D);
      L.expert_w2[e] = r.mat(ep + "w2.weight", D, I);
    }
    if (c.n_shared_experts == 1) {
      L.shared_w13 = r.mat2(p + "ffn.shared_experts.w1.weight", p + "ffn.shared_experts.w3.weight", I, D);
      L.shared_w2 = r.mat(p + "ffn.shared_experts.w2.weight", D, I);
    }
    if (progress) progress(l + 1, c.num_layers);
  }
  inv_freq_main_ = Buffer<float>(backend, rope_inv_freq(c.rope_main, c.rope_dim));
  inv_freq_compress_ = Buffer<float>(backend, rope_inv_freq(c.rope_compress, c.rope_dim));
}

V41SeqState DeepseekV41Model::new_state() const {
  const V41Config& c = cfg_;
  const int64_t W = c.sliding_window, d = c.head_dim;
  V41SeqState s;
  s.ring.resize(c.num_layers);
  s.entries.resize(c.num_layers);
  s.keys.resize(c.num_layers);
  s.open_kv.resize(c.num_layers);
  s.open_gate.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    s.ring[l] = Buffer<float>(be_, W * d);
    be_.fill(s.ring[l].data(), W * d, 0.0f);
    if (!layers_[l].kv_source) continue;
    s.entries[l].width = d;
    s.keys[l].width = c.index_head_dim;
    if (layers_[l].ratio == 2)
      for (auto* o : {&s.open_kv[l], &s.open_gate[l]}) {
        *o = Buffer<float>(be_, 2 * d);
        be_.fill(o->data(), 2 * d, 0.0f);
      }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

struct DeepseekV41Model::Step {
  std::span<const V41SeqChunk> batch;
  int64_t T = 0;                          // tokens in the step
  std::vector<int64_t> seq_begin;         // [B + 1] first row of each chunk
  std::vector<int32_t> tokens, pos;       // [T] (host)
  Buffer<int32_t> pos_d;                  // [T] positions in backend memory
  std::vector<std::vector<int64_t>> engram_rows;  // host, per Engram module: [T, cols] table rows
  Buffer<float> h, y;                     // [T, D] normed sub-block input / sub-block output
  // Host, transient across layers of one step (spec §5.1): the latest published top-k list and
  // the candidate mask, per row.
  std::vector<std::vector<int32_t>> list;  // [T] entry indices, ascending
  std::vector<std::vector<char>> cand;     // [T] over the row's visible entries of the candidate group
};

void DeepseekV41Model::engram(const V41Engram& g, Step& st, float* X) {
  const int64_t T = st.T, D = cfg_.hidden_size, hc = cfg_.hc_mult, hd = cfg_.engram_head_dim;
  const int64_t cols = (int64_t)g.prime.size();
  const int e = (int)(&g - engrams_.data());
  const auto& rows = st.engram_rows[e];
  // The table is memory-mapped on the host: this step's rows are gathered and dequantized there,
  // Em[T, cols·hd] (column order (n−2)·heads + j), and go to the backend in one upload.
  std::vector<float> Em(T * cols * hd);
  const size_t esz = dtype_size(g.table.dtype);
  for (int64_t i = 0; i < T * cols; ++i) {
    const int64_t row = rows[i];
    float* dst = Em.data() + i * hd;
    const uint8_t* src = g.table.data + (size_t)row * hd * esz;
    for (int64_t c = 0; c < hd; ++c) {
      switch (g.table.dtype) {
        case DType::F32: std::memcpy(&dst[c], src + 4 * c, 4); break;
        case DType::BF16: { uint16_t v; std::memcpy(&v, src + 2 * c, 2); dst[c] = bf16_to_f32(v); break; }
        case DType::F16: { uint16_t v; std::memcpy(&v, src + 2 * c, 2); dst[c] = f16_to_f32(v); break; }
        default: dst[c] = e4m3fn_to_f32(src[c]);
      }
    }
    if (g.has_scale) {
      const int64_t ns = (hd + 31) / 32;
      for (int64_t b = 0; b < ns; ++b) {
        float s;
        if (g.table_scale.dtype == DType::F32) std::memcpy(&s, g.table_scale.data + 4 * (row * ns + b), 4);
        else s = e8m0_to_f32(g.table_scale.data[row * ns + b]);
        for (int64_t c = b * 32; c < std::min(hd, (b + 1) * 32); ++c) dst[c] *= s;
      }
    }
  }
  Buffer<float> Em_d(be_, Em);                  // [T, cols·hd]
  Buffer<float> kv(be_, T * (hc + 1) * D);     // [T, hc+1, D]: hc keys, then the value
  be_.linear(Em_d.data(), T, cols * hd, *g.wkv, kv.data(), (hc + 1) * D);
  be_.engram_gate(X, T, (int)hc, D, kv.data(), g.w.data(), cfg_.rms_norm_eps);
}

// KV source `l`, sequence `b` of the step: closes the compression groups that complete in its chunk
// and appends their entries and index keys to the state. ca, cz: the chunk's compressor projections
// [n, d] (cz: ratio 2 only).
void DeepseekV41Model::publish(int l, Step& st, size_t b, const float* ca, const float* cz) {
  const V41Layer& L = layers_[l];
  V41SeqState& S = *st.batch[b].state;
  const int64_t d = cfg_.head_dim, dI = cfg_.index_head_dim, r = cfg_.rope_dim;
  const int64_t p0 = S.pos, n = st.seq_begin[b + 1] - st.seq_begin[b];
  const float eps = (float)cfg_.rms_norm_eps;
  const int m = L.ratio;
  std::vector<int32_t> idx;  // [2, nw]: ids of the closing groups, then their first positions
  for (int64_t i = 0; i < n; ++i)
    if ((p0 + i + 1) % m == 0) idx.push_back((int32_t)((p0 + i) / m));
  const int64_t nw = (int64_t)idx.size();
  for (int64_t i = 0; i < nw; ++i) idx.push_back(idx[i] * m);
  Buffer<int32_t> idx_d(be_, idx);
  float* lat = nw ? S.entries[l].reserve(be_, nw) : nullptr;  // [nw, d] latents L_w, in place in the state
  float* key = nw ? S.keys[l].reserve(be_, nw) : nullptr;     // [nw, dI]
  if (m == 1) {  // every token is its own group
    be_.copy(lat, ca, sizeof(float) * nw * d);
  } else if (nw > 0) {
    // A group = an even and the following odd token, softmax-pooled over the pair with gates z; an
    // even token of an earlier step is in the open-group ring (row = position mod 2).
    Buffer<float> skv(be_, nw * 2 * d), sg(be_, nw * 2 * d);  // [nw, 2, d]
    be_.compress_windows(S.open_kv[l].data(), S.open_gate[l].data(), ca, cz, d, p0, nullptr, 2, (int)d, false,
                         idx_d.data(), nullptr, nw, skv.data(), sg.data());
    be_.compress_pool(skv.data(), sg.data(), nw, 2, (int)d, lat);
  }
  if (m == 2) {
    be_.ring_write(ca, d, n, d, p0, S.open_kv[l].data(), 2);
    be_.ring_write(cz, d, n, d, p0, S.open_gate[l].data(), 2);
  }
  if (nw == 0) return;
  const int32_t* wpos = idx_d.data() + nw;
  be_.rms_norm(lat, nw, d, d, L.comp_norm.data(), eps, lat);
  // Index keys from the pre-RoPE latent, then the main entries.
  be_.linear(lat, nw, d, *L.idx_wk, key, dI);
  be_.rms_norm(key, nw, dI, dI, L.idx_k_norm.data(), eps, key);
  be_.rope(key, nw, dI, 1, (int)dI, (int)r, wpos, inv_freq_compress_.data(), false);
  if (g_v41_qat_hook) g_v41_qat_hook(l, "index keys", key, nw, dI);  // test-only (v41_debug.h)
  be_.kv_qdq(key, nw * dI, KvQdq::Fp4Pow2x32);
  be_.rope(lat, nw, d, 1, (int)d, (int)r, wpos, inv_freq_compress_.data(), false);
  if (g_v41_qat_hook) g_v41_qat_hook(l, "compressed kv", lat, nw, d);
  be_.kv_qdq(lat, nw * d, KvQdq::Fp4E4m3x16);
  S.entries[l].n += nw;
  S.keys[l].n += nw;
}

void DeepseekV41Model::attention(int l, Step& st) {
  const V41Layer& L = layers_[l];
  const int64_t T = st.T, D = cfg_.hidden_size, H = cfg_.num_heads, d = cfg_.head_dim, r = cfg_.rope_dim;
  const int64_t ql = cfg_.q_lora_rank, W = cfg_.sliding_window, hI = cfg_.index_n_heads, dI = cfg_.index_head_dim;
  const float eps = (float)cfg_.rms_norm_eps;
  const float* inv_freq = L.ratio ? inv_freq_compress_.data() : inv_freq_main_.data();
  const float* h = st.h.data();
  const int32_t* pos = st.pos_d.data();

  Buffer<float> qr(be_, T * ql), q(be_, T * H * d), kv(be_, T * d);  // [T, q_lora], [T, H, d], [T, d]
  be_.linear(h, T, D, *L.wq_a, qr.data(), ql);
  be_.rms_norm(qr.data(), T, ql, ql, L.q_norm.data(), eps, qr.data());
  be_.linear(qr.data(), T, ql, *L.wq_b, q.data(), H * d);  // no per-head q norm in V4.1
  be_.rope(q.data(), T, H * d, (int)H, (int)d, (int)r, pos, inv_freq, false);
  be_.linear(h, T, D, *L.wkv, kv.data(), d);
  be_.rms_norm(kv.data(), T, d, d, L.kv_norm.data(), eps, kv.data());
  be_.rope(kv.data(), T, d, 1, (int)d, (int)r, pos, inv_freq, false);
  if (g_v41_qat_hook) g_v41_qat_hook(l, "sliding kv", kv.data(), T, d);  // test-only (v41_debug.h)
  be_.kv_qdq(kv.data(), T * d, KvQdq::Fp8Pow2x32);  // all d channels, RoPE tail included

  Buffer<float> ca, cz;  // compressor projections [T, d] (cz: ratio 2)
  if (L.kv_source) {
    ca = Buffer<float>(be_, T * d);
    be_.linear(h, T, D, *L.comp_wkv, ca.data(), d);
    if (L.ratio == 2) {
      cz = Buffer<float>(be_, T * d);
      be_.linear(h, T, D, *L.comp_wgate, cz.data(), d);
    }
  }
  Buffer<float> iq, gamma;  // [T, hI, dI], [T, hI]
  if (L.index_source) {
    iq = Buffer<float>(be_, T * hI * dI);
    gamma = Buffer<float>(be_, T * hI);
    be_.linear(qr.data(), T, ql, *L.idx_wq_b, iq.data(), hI * dI);
    be_.rope(iq.data(), T, hI * dI, (int)hI, (int)dI, (int)r, pos, inv_freq_compress_.data(), false);
    if (g_v41_qat_hook) g_v41_qat_hook(l, "index q", iq.data(), T, hI * dI);  // test-only
    be_.kv_qdq(iq.data(), T * hI * dI, KvQdq::Fp4Pow2x32);
    be_.linear(h, T, D, *L.idx_weights_proj, gamma.data(), hI);
    be_.scale(gamma.data(), T * hI, 1.0f / std::sqrt((float)hI));
  }

  // Per sequence: the sliding keys (the ring's earlier positions still inside the window, then the
  // chunk) go into one buffer for the step, the ring keeps the last W positions, and a KV source
  // publishes the groups its chunk closes.
  const size_t B = st.batch.size();
  int64_t win_rows = 0;
  for (size_t b = 0; b < B; ++b)
    win_rows += std::min<int64_t>(W - 1, st.batch[b].state->pos) + (st.seq_begin[b + 1] - st.seq_begin[b]);
  Buffer<float> win(be_, win_rows * d);  // [win_rows, d]
  std::vector<int32_t> win_lo(T), win_hi(T);
  int64_t base = 0;  // first row of this sequence's keys in win
  for (size_t b = 0; b < B; ++b) {
    V41SeqState& S = *st.batch[b].state;
    const int64_t p0 = S.pos, r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
    const int64_t np = std::min<int64_t>(W - 1, p0);
    float* ring = S.ring[l].data();  // [W, d], row = position mod W
    be_.ring_read(ring, W, d, p0 - np, np, win.data() + base * d);
    be_.copy(win.data() + (base + np) * d, kv.data() + r0 * d, sizeof(float) * n * d);
    be_.ring_write(kv.data() + r0 * d, d, n, d, p0, ring, W);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t hi = base + np + i + 1;
      win_hi[r0 + i] = (int32_t)hi;
      win_lo[r0 + i] = (int32_t)std::max<int64_t>(base, hi - W);
    }
    base += np + n;
    if (L.kv_source) publish(l, st, b, ca.data() + r0 * d, L.ratio == 2 ? cz.data() + r0 * d : nullptr);
  }

  // Compressed part: each row's entries of its KV source, chosen by the latest index list.
  std::vector<int32_t> ent_idx;
  std::vector<int64_t> ent_off(T + 1, 0);
  if (L.ratio && L.index_source) {
    const int m = L.ratio;
    // Index keys are the KV source's own running key cache, for every step (transformers'
    // behaviour, spec §5.3). The reference code instead scores ratio-2 layers on decode steps
    // that close no group against the slot left by the previous publisher (layer 20's keys);
    // that quirk is deliberately not reproduced.
    // Every sequence's scores go into one buffer (sequence b's [n, nk] at score_at[b]) and come
    // back to the host in one download for the top-k choice.
    std::vector<int64_t> score_at(B + 1, 0);
    std::vector<int32_t> nvis(T);
    for (size_t b = 0; b < B; ++b) {
      const int64_t p0 = st.batch[b].state->pos, r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      score_at[b + 1] = score_at[b] + n * st.batch[b].state->keys[L.kv_src].n;
      for (int64_t i = 0; i < n; ++i) nvis[r0 + i] = (int32_t)((p0 + i + 1) / m);
    }
    Buffer<float> score_d(be_, score_at[B]);
    Buffer<int32_t> nvis_d(be_, nvis);
    for (size_t b = 0; b < B; ++b) {
      const V41Rows& K = st.batch[b].state->keys[L.kv_src];
      const int64_t r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      if (K.n > 0)
        be_.indexer_scores(iq.data() + r0 * hI * dI, gamma.data() + r0 * hI, n, (int)hI, (int)dI, K.data(), nullptr, 0,
                           K.n, nvis_d.data() + r0, 1.0f / std::sqrt((float)dI), score_d.data() + score_at[b]);
    }
    const std::vector<float> scores = score_d.to_host();
    std::vector<int32_t> order;
    for (size_t b = 0; b < B; ++b) {
      const int64_t r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      const int64_t nk = st.batch[b].state->keys[L.kv_src].n;
      for (int64_t i = 0; i < n; ++i) {
        const float* sc = scores.data() + score_at[b] + i * nk;
        const int64_t nv = nvis[r0 + i];
        // Ties (e.g. exact-zero ReLU sums) go to the lower index, so the choice is deterministic.
        auto higher = [&](const float* s) {
          return [s](int32_t a, int32_t c) { return s[a] > s[c] || (s[a] == s[c] && a < c); };
        };
        if (L.candidate_source) {  // two-level top-k: keep the best blocks (spec §3.8 step 4)
          const int64_t bs = cfg_.candidate_block_size, nb = (nv + bs - 1) / bs;
          std::vector<float> bsc(nb, -std::numeric_limits<float>::infinity());
          for (int64_t w = 0; w < nv; ++w) bsc[w / bs] = std::max(bsc[w / bs], sc[w]);
          if (nb > 0) bsc[nb - 1] = std::numeric_limits<float>::infinity();  // the newest entry's block
          order.resize(nb);
          std::iota(order.begin(), order.end(), 0);
          const int64_t kb = std::min<int64_t>(cfg_.candidate_topk_blocks, nb);
          std::partial_sort(order.begin(), order.begin() + kb, order.end(), higher(bsc.data()));
          auto& mask = st.cand[r0 + i];
          mask.assign(nv, 0);
          for (int64_t j = 0; j < kb; ++j)
            for (int64_t w = order[j] * bs; w < std::min(nv, (order[j] + 1) * bs); ++w) mask[w] = 1;
        }
        order.clear();
        for (int32_t w = 0; w < nv; ++w)
          if (!L.restricted || st.cand[r0 + i][w]) order.push_back(w);
        const int64_t k = std::min<int64_t>(cfg_.index_topk, (int64_t)order.size());
        std::partial_sort(order.begin(), order.begin() + k, order.end(), higher(sc));
        std::sort(order.begin(), order.begin() + k);
        st.list[r0 + i].assign(order.begin(), order.begin() + k);
      }
    }
  }
  if (L.ratio)
    for (int64_t t = 0; t < T; ++t) {
      ent_idx.insert(ent_idx.end(), st.list[t].begin(), st.list[t].end());
      ent_off[t + 1] = (int64_t)ent_idx.size();
    }

  Buffer<int32_t> win_lo_d(be_, win_lo), win_hi_d(be_, win_hi), ent_idx_d(be_, ent_idx);
  Buffer<int64_t> ent_off_d;
  if (L.ratio) ent_off_d = Buffer<int64_t>(be_, ent_off);
  Buffer<float> o(be_, T * H * d);  // [T, H, d]
  const float scale = 1.0f / std::sqrt((float)d);
  if (!L.ratio) {  // sliding only: one call for the step
    be_.sink_attention(q.data(), T, H * d, (int)H, (int)d, win.data(), win_lo_d.data(), win_hi_d.data(), nullptr,
                       nullptr, nullptr, L.sinks.data(), scale, o.data(), H * d);
  } else {  // one call per sequence: each reads its own compressed entries
    for (size_t b = 0; b < B; ++b) {
      const int64_t r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      be_.sink_attention(q.data() + r0 * H * d, n, H * d, (int)H, (int)d, win.data(), win_lo_d.data() + r0,
                         win_hi_d.data() + r0, st.batch[b].state->entries[L.kv_src].data(), ent_idx_d.data(),
                         ent_off_d.data() + r0, L.sinks.data(), scale, o.data() + r0 * H * d, H * d);
    }
  }
  be_.rope(o.data(), T, H * d, (int)H, (int)d, (int)r, pos, inv_freq, true);

  // Grouped output projection: group g's heads through wo_a[g], then wo_b.
  const int64_t G = cfg_.o_groups, ol = cfg_.o_lora_rank, gin = H * d / G;
  Buffer<float> z(be_, T * G * ol);  // [T, g·o_lora]
  for (int64_t g = 0; g < G; ++g)
    be_.linear(o.data() + g * gin, T, H * d, *L.wo_a[g], z.data() + g * ol, G * ol);
  be_.linear(z.data(), T, G * ol, *L.wo_b, st.y.data(), D);
}

void DeepseekV41Model::moe(const V41Layer& L, const float* h, int64_t T, float* out) {
  const int64_t D = cfg_.hidden_size, E = cfg_.n_routed_experts, K = cfg_.num_experts_per_tok;
  const int64_t I = cfg_.moe_intermediate_size;
  std::vector<float> logits;  // [T, E]: routing is decided on the host
  {
    Buffer<float> logits_d(be_, T * E);
    be_.linear(h, T, D, *L.gate, logits_d.data(), E);
    logits = logits_d.to_host();
  }
  std::vector<int32_t> sel(T * K);
  std::vector<float> wsel(T * K), sc(E), biased(E);
  std::vector<int32_t> order(E);
  const float inv_temp = (float)(1.0 / cfg_.gate_temp);
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) sc[e] = std::sqrt(softplus(lg[e] * inv_temp));
    for (int64_t e = 0; e < E; ++e) biased[e] = sc[e] + L.gate_bias[e];  // bias only picks, never weighs
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
    });
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += (wsel[t * K + k] = sc[sel[t * K + k] = order[k]]);
    const float f = (float)cfg_.routed_scaling_factor / (cfg_.norm_topk_prob ? sum + 1e-20f : 1.0f);
    for (int64_t k = 0; k < K; ++k) wsel[t * K + k] *= f;
  }
  moe_ffn_loop(be_, h, T, D, I, L.expert_w13, L.expert_w2, sel.data(), wsel.data(), (int)K,
               (float)cfg_.swiglu_limit, out);
  if (L.shared_w13) {
    Buffer<float> gu(be_, T * 2 * I), act(be_, T * I), ye(be_, T * D);
    be_.linear(h, T, D, *L.shared_w13, gu.data(), 2 * I);
    be_.swiglu_clamp(gu.data(), T, I, (float)cfg_.swiglu_limit, nullptr, act.data());
    be_.linear(act.data(), T, I, *L.shared_w2, ye.data(), D);
    be_.add_rows(ye.data(), T, D, nullptr, nullptr, out);
  }
}

std::vector<float> DeepseekV41Model::forward(std::span<const V41SeqChunk> batch) {
  const V41Config& c = cfg_;
  const int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const float eps = (float)c.rms_norm_eps, hc_eps = (float)c.hc_eps;
  Step st;
  st.batch = batch;
  st.seq_begin.push_back(0);
  for (size_t b = 0; b < batch.size(); ++b) {
    const V41SeqChunk& ch = batch[b];
    if (!ch.state || ch.tokens.empty()) throw Error("forward: every sequence needs a state and at least one token");
    if ((int)ch.state->ring.size() != c.num_layers) throw Error("forward: sequence state was not made by new_state()");
    if (ch.state->pos + (int64_t)ch.tokens.size() > INT32_MAX) throw Error("forward: position overflow");
    for (size_t a = 0; a < b; ++a)
      if (batch[a].state == ch.state) throw Error("forward: the same sequence appears twice in one step");
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const int32_t t = ch.tokens[i];
      if (t < 0 || t >= V)
        throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) + ")");
      if (t == c.image_token_id)
        throw Error("forward: image inputs are not supported (token " + std::to_string(t) + " at position " +
                    std::to_string(ch.state->pos + (int64_t)i) +
                    " is the image placeholder; DeepSeek-V4.1's vision tower is not implemented)");
      st.tokens.push_back(t);
      st.pos.push_back((int32_t)(ch.state->pos + (int64_t)i));
    }
    st.seq_begin.push_back((int64_t)st.tokens.size());
  }
  const int64_t T = st.T = (int64_t)st.tokens.size();
  st.pos_d = Buffer<int32_t>(be_, st.pos);
  st.list.resize(T);
  st.cand.resize(T);

  // Engram table rows (spec §3.1): look-back compressed ids from the chunk and the state's history.
  const int N = c.engram_max_ngram;
  if (!engrams_.empty()) {
    const int64_t heads = c.engram_n_heads, cols = (N - 1) * heads;
    const int64_t pad = token_map_[c.engram_pad_id];
    st.engram_rows.assign(engrams_.size(), std::vector<int64_t>(T * cols));
    for (size_t b = 0; b < batch.size(); ++b) {
      const V41SeqState& S = *batch[b].state;
      const int64_t r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      const int64_t nh = (int64_t)S.engram_hist.size();
      for (int64_t i = 0; i < n; ++i) {
        int64_t g[8];
        for (int k = 0; k < N; ++k) {
          const int64_t j = i - k;  // chunk index of the look-back token
          if (j >= 0) g[k] = token_map_[st.tokens[r0 + j]];
          else if (nh + j >= 0) g[k] = S.engram_hist[nh + j];
          else g[k] = pad;  // before position 0 (no image spans, so never DEAD)
        }
        for (size_t e = 0; e < engrams_.size(); ++e) {
          const V41Engram& E = engrams_[e];
          int64_t hsh = g[0] * E.mult[0];
          for (int nn = 2; nn <= N; ++nn) {
            hsh ^= g[nn - 1] * E.mult[nn - 1];
            for (int64_t hh = 0; hh < heads; ++hh) {
              const int64_t col = (nn - 2) * heads + hh;
              st.engram_rows[e][(r0 + i) * cols + col] = hsh % E.prime[col] + E.off[col];
            }
          }
        }
      }
    }
  }

  Buffer<float> X(be_, T * hc * D), X2(be_, T * hc * D);  // [T, hc, D] residual streams
  {  // every stream starts as the token's embedding
    std::vector<int32_t> src(T * hc);
    for (int64_t i = 0; i < T * hc; ++i) src[i] = st.tokens[i / hc];
    Buffer<int32_t> src_d(be_, src);
    be_.copy_rows(embed_.data(), D, src_d.data(), X.data(), D, nullptr, T * hc, D);
  }
  // Carried pre-mix (one-hot at layer 0), this site's coefficients: [T, hc], comb [T, hc, hc].
  Buffer<float> carry, apre(be_, T * hc), fpre(be_, T * hc), post(be_, T * hc), comb(be_, T * hc * hc), u(be_, T * D);
  {
    std::vector<float> one_hot(T * hc, 0.0f);
    for (int64_t t = 0; t < T; ++t) one_hot[t * hc] = 1.0f;
    carry = Buffer<float>(be_, one_hot);
  }
  st.h = Buffer<float>(be_, T * D);
  st.y = Buffer<float>(be_, T * D);
  for (int l = 0; l < c.num_layers; ++l) {
    const V41Layer& L = layers_[l];
    if (L.engram >= 0) engram(engrams_[L.engram], st, X.data());
    // Attention site: collapse with the previous FFN site's pre; this site's pre goes to the FFN site.
    be_.hc_mix(X.data(), T, (int)hc, D, carry.data(), L.hc_attn_fn.data(), L.hc_attn_base.data(),
               L.hc_attn_scale.data(), c.hc_sinkhorn_iters, hc_eps, eps, u.data(), apre.data(), post.data(),
               comb.data());
    be_.rms_norm(u.data(), T, D, D, L.attn_norm.data(), eps, st.h.data());
    attention(l, st);
    be_.hc_post(X.data(), st.y.data(), post.data(), comb.data(), T, (int)hc, D, X2.data());
    std::swap(X, X2);
    be_.hc_mix(X.data(), T, (int)hc, D, apre.data(), L.hc_ffn_fn.data(), L.hc_ffn_base.data(),
               L.hc_ffn_scale.data(), c.hc_sinkhorn_iters, hc_eps, eps, u.data(), fpre.data(), post.data(),
               comb.data());
    be_.rms_norm(u.data(), T, D, D, L.ffn_norm.data(), eps, st.h.data());
    moe(L, st.h.data(), T, st.y.data());
    be_.hc_post(X.data(), st.y.data(), post.data(), comb.data(), T, (int)hc, D, X2.data());
    std::swap(X, X2);
    std::swap(carry, fpre);
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    V41SeqState& S = *batch[b].state;
    S.pos += (int64_t)batch[b].tokens.size();
    if (!engrams_.empty()) {
      for (int32_t t : batch[b].tokens) S.engram_hist.push_back(token_map_[t]);
      if ((int)S.engram_hist.size() > N - 1) S.engram_hist.erase(S.engram_hist.begin(), S.engram_hist.end() - (N - 1));
    }
  }

  // Rows that need logits: final collapse with the last FFN site's pre (no hc_head), norm, head.
  std::vector<int32_t> rows;
  for (size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].all_logits)
      for (int64_t t = st.seq_begin[b]; t < st.seq_begin[b + 1]; ++t) rows.push_back((int32_t)t);
    else
      rows.push_back((int32_t)(st.seq_begin[b + 1] - 1));
  }
  const int64_t R = (int64_t)rows.size();
  Buffer<int32_t> rows_d(be_, rows);
  Buffer<float> Xr(be_, R * hc * D), wr(be_, R * hc), ur(be_, R * D), logits(be_, R * V);
  be_.copy_rows(X.data(), hc * D, rows_d.data(), Xr.data(), hc * D, nullptr, R, hc * D);
  be_.copy_rows(carry.data(), hc, rows_d.data(), wr.data(), hc, nullptr, R, hc);
  be_.hc_mix(Xr.data(), R, (int)hc, D, wr.data(), nullptr, nullptr, nullptr, 0, hc_eps, eps, ur.data(), nullptr,
             nullptr, nullptr);
  be_.rms_norm(ur.data(), R, D, D, norm_.data(), eps, ur.data());
  be_.linear(ur.data(), R, D, *head_, logits.data(), V);
  return logits.to_host();
}

}  // namespace deepinfer
