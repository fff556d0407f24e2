// Checkpoint directories: config.json + safetensors shard(s), names normalised to native naming.
#include "io/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace deepinfer {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

std::string join_dots(const std::vector<std::string>& parts, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < parts.size(); ++i) s += (i > from ? "." : "") + parts[i];
  return s;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void rename_seg(std::string& seg, std::initializer_list<std::pair<const char*, const char*>> table) {
  for (const auto& [from, to] : table)
    if (seg == from) {
      seg = to;
      return;
    }
}

// Rewrites the part of a layer name after `layers.N.` / `mtp.N.` from transformers' module naming
// (or the mixed naming save_pretrained writes) to native naming. Native input passes unchanged.
void layer_to_native(std::vector<std::string>& r) {
  if (r.empty()) return;
  // attn_hc.{fn,base,scale} -> hc_attn_{fn,base,scale}; same for ffn_hc.
  if (r.size() == 2 && (r[0] == "attn_hc" || r[0] == "ffn_hc") &&
      (r[1] == "fn" || r[1] == "base" || r[1] == "scale")) {
    r = {std::string(r[0] == "attn_hc" ? "hc_attn_" : "hc_ffn_") + r[1]};
    return;
  }
  rename_seg(r[0], {{"input_layernorm", "attn_norm"},
                    {"post_attention_layernorm", "ffn_norm"},
                    {"self_attn", "attn"},
                    {"mlp", "ffn"}});
  if (r[0] == "attn" && r.size() >= 2) {
    if (r.size() == 2 && r[1] == "sinks") r[1] = "attn_sink";
    // save_pretrained writes the attention's kv_norm as `attn.norm` (its reverse of the load-time
    // rename compressor.norm -> compressor.kv_norm also hits this one).
    if (r[1] == "norm") r[1] = "kv_norm";
    rename_seg(r[1], {{"q_a_proj", "wq_a"}, {"q_b_proj", "wq_b"}, {"kv_proj", "wkv"},
                      {"o_a_proj", "wo_a"}, {"o_b_proj", "wo_b"}, {"q_a_norm", "q_norm"}});
    // HF nests the indexer inside the compressor: compressor.indexer.{q_b_proj, scorer.weights_proj, *}.
    if (r[1] == "compressor" && r.size() >= 4 && r[2] == "indexer") {
      if (r[3] == "q_b_proj") {
        r.erase(r.begin() + 1);  // attn.indexer.q_b_proj...
        r[2] = "wq_b";
      } else if (r[3] == "scorer" && r.size() >= 5 && r[4] == "weights_proj") {
        r.erase(r.begin() + 1, r.begin() + 2);  // attn.indexer.scorer.weights_proj...
        r.erase(r.begin() + 2);                 // attn.indexer.weights_proj...
      } else {
        std::swap(r[1], r[2]);  // attn.indexer.compressor.*
      }
    }
    // Inside a compressor (attn.compressor.X or attn.indexer.compressor.X).
    size_t c = r[1] == "compressor" ? 2 : (r[1] == "indexer" && r.size() >= 3 && r[2] == "compressor") ? 3 : 0;
    if (c && c < r.size())
      rename_seg(r[c], {{"kv_proj", "wkv"}, {"gate_proj", "wgate"}, {"kv_norm", "norm"}, {"position_bias", "ape"}});
  } else if (r[0] == "ffn" && r.size() >= 3) {
    if (r[1] == "gate" && r[2] == "e_score_correction_bias") r[2] = "bias";
    if (r[1] == "shared_experts") rename_seg(r[2], {{"gate_proj", "w1"}, {"down_proj", "w2"}, {"up_proj", "w3"}});
  }
}

[[noreturn]] void fail(const std::string& where, const std::string& msg) { throw Error(where + ": " + msg); }

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(p.string(), std::string("not valid JSON: ") + e.what());
  }
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string Checkpoint::to_native_name(const std::string& file_name) {
  std::vector<std::string> s = split_dots(file_name);
  if (s.size() > 1 && s[0] == "model") s.erase(s.begin());  // transformers' base-model prefix
  // FP8 block scales: transformers' quantizer calls `X.scale` `X.weight_scale_inv`.
  if (s.size() > 1 && s.back() == "weight_scale_inv") s.back() = "scale";

  if (s.size() == 2 && s[0] == "embed_tokens" && s[1] == "weight") return "embed.weight";
  if (s.size() == 2 && s[0] == "lm_head" && s[1] == "weight") return "head.weight";
  if (s.size() == 2 && s[0] == "hc_head" && (s[1] == "hc_fn" || s[1] == "hc_base" || s[1] == "hc_scale"))
    return "hc_head_" + s[1].substr(3);
  if (s.size() >= 3 && (s[0] == "layers" || s[0] == "mtp") && all_digits(s[1])) {
    std::vector<std::string> rest(s.begin() + 2, s.end());
    layer_to_native(rest);
    return s[0] + "." + s[1] + "." + join_dots(rest);
  }
  return join_dots(s);
}

std::string Checkpoint::file_tensor_name(const std::string& native_name) const {
  auto it = file_name_of_.find(native_name);
  return it == file_name_of_.end() ? std::string() : it->second;
}

void Checkpoint::add_native(TensorView v, const std::string& file_name) {
  auto it = by_native_.find(v.name);
  if (it != by_native_.end())
    throw Error(*v.file + ": tensor '" + file_name + "' and tensor '" + file_tensor_name(v.name) + "' in " +
                *it->second->file + " both map to the native name '" + v.name + "'");
  views_.push_back(std::move(v));
  file_name_of_[views_.back().name] = file_name;
  by_native_.emplace(views_.back().name, &views_.back());
}

// transformers keeps routed experts stacked: gate_up_proj [E, 2I, D] (w1 rows, then w3 rows),
// down_proj [E, D, I]; FP8 scales likewise stacked as *_scale_inv [E, rows/br, cols/bc]. Row-major,
// so every per-expert w1/w3/w2 (and scale) is a contiguous byte range: expose each as a view.
void Checkpoint::split_stacked_experts() {
  struct Stacked {
    std::string native;
    const TensorView* v;
  };
  std::vector<Stacked> todo;
  for (const auto& [name, v] : by_native_) {
    const std::string tail = name.substr(name.rfind('.') + 1);
    if (name.find(".ffn.experts.") != std::string::npos &&
        (tail == "gate_up_proj" || tail == "down_proj" || tail == "gate_up_proj_scale_inv" ||
         tail == "down_proj_scale_inv"))
      todo.push_back({name, v});
  }
  for (const auto& item : todo) {
    const std::string& name = item.native;
    const TensorView* v = item.v;  // (not a structured binding: lambdas below capture it)
    const std::string prefix = name.substr(0, name.rfind('.') + 1);  // layers.N.ffn.experts.
    const std::string tail = name.substr(prefix.size());
    const std::string file_name = file_tensor_name(name);
    auto bad = [&](const std::string& why) {
      throw Error(*v->file + ": tensor '" + file_name + "': stacked experts " + shape_str(v->shape) + ": " + why);
    };
    if (v->shape.size() != 3 || v->shape[0] <= 0) bad("expected 3 dims [experts, rows, cols]");
    const int64_t E = v->shape[0], rows = v->shape[1], cols = v->shape[2];
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(v->dtype);
    const bool gate_up = tail.rfind("gate_up_proj", 0) == 0;
    const bool is_scale = tail.size() > 10 && tail.substr(tail.size() - 10) == "_scale_inv";
    if (gate_up && rows % 2) bad("odd number of rows, cannot split into w1 and w3");
    if (gate_up && is_scale) {
      // The w1/w3 boundary (row I of the weight) must fall on a scale block boundary.
      const TensorView* w = by_native_.count(prefix + "gate_up_proj") ? by_native_.at(prefix + "gate_up_proj") : nullptr;
      if (w && w->shape.size() == 3 && (w->shape[1] % rows != 0 || (w->shape[1] / 2) % (w->shape[1] / rows) != 0))
        bad("the w1/w3 split of the weight does not fall on a scale block boundary");
    }
    const std::string leaf = is_scale ? ".scale" : ".weight";
    by_native_.erase(name);
    for (int64_t e = 0; e < E; ++e) {
      const uint8_t* base = v->data + static_cast<size_t>(e) * static_cast<size_t>(rows) * row_bytes;
      auto make = [&](const std::string& w, int64_t r0, int64_t nr) {
        TensorView s;
        s.name = prefix + std::to_string(e) + "." + w + leaf;
        s.dtype = v->dtype;
        s.shape = {nr, cols};
        s.data = base + static_cast<size_t>(r0) * row_bytes;
        s.nbytes = static_cast<size_t>(nr) * row_bytes;
        s.file = v->file;
        add_native(std::move(s), file_name);
      };
      if (gate_up) {
        make("w1", 0, rows / 2);
        make("w3", rows / 2, rows / 2);
      } else {
        make("w2", 0, rows);
      }
    }
  }
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail(dir, "model directory does not exist");
  if (!fs::is_directory(dir, ec)) fail(dir, "not a directory");
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  const fs::path root(dir);

  const fs::path config = root / "config.json";
  if (!fs::exists(config, ec)) fail(config.string(), "missing (every model directory needs a config.json)");
  ck->config_ = read_json_file(config);
  if (!ck->config_.is_object()) fail(config.string(), "not a JSON object");

  // Which files hold the weights. Like transformers, a single model.safetensors wins over an index.
  const fs::path single = root / "model.safetensors";
  const fs::path index = root / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor name (as in the files) -> shard
  std::vector<std::string> shards;
  bool from_index = false;
  if (fs::exists(single, ec)) {
    shards.push_back("model.safetensors");
  } else if (fs::exists(index, ec)) {
    from_index = true;
    nlohmann::json j = read_json_file(index);
    const std::string where = index.string();
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(where, "no \"weight_map\" object");
    std::set<std::string> seen;
    for (const auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) fail(where, "tensor '" + name + "': shard is not a string");
      const std::string s = shard.get<std::string>();
      // Shards live in the model directory: never follow a path out of it.
      if (s.empty() || s.find('/') != std::string::npos || s.find('\\') != std::string::npos ||
          s.find("..") != std::string::npos || s.find('\0') != std::string::npos)
        fail(where, "tensor '" + name + "': shard file name '" + s + "' is not a plain file name");
      weight_map[name] = s;
      if (seen.insert(s).second) shards.push_back(s);
    }
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) fail(where, "\"weight_map\" is empty");
  } else {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") shards.push_back(n);
    }
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) fail(dir, "no model.safetensors, model.safetensors.index.json or *.safetensors files");
  }

  std::map<std::string, const TensorView*> by_file_name;
  for (const auto& s : shards) {
    const fs::path p = root / s;
    if (from_index && !fs::exists(p, ec))
      fail(index.string(), "names shard '" + s + "' but " + p.string() + " does not exist");
    ck->files_.push_back(SafetensorsFile::open(p.string()));
    for (const auto& t : ck->files_.back()->tensors()) {
      auto [it, inserted] = by_file_name.emplace(t.name, &t);
      if (!inserted)
        fail(p.string(), "tensor '" + t.name + "' is also in " + *it->second->file + " (a tensor in two shards)");
    }
  }
  for (const auto& [name, shard] : weight_map) {
    const fs::path p = root / shard;
    auto it = by_file_name.find(name);
    if (it == by_file_name.end() || *it->second->file != p.string())
      fail(index.string(), "maps tensor '" + name + "' to " + shard + ", but " + p.string() +
                               " does not contain it" + (it == by_file_name.end() ? "" : " (it is in " + *it->second->file + ")"));
  }

  for (const auto& [name, t] : by_file_name) {
    TensorView v = *t;
    v.name = to_native_name(name);
    ck->add_native(std::move(v), name);
  }
  ck->split_stacked_experts();
  return ck;
}

std::unique_ptr<Checkpoint> Checkpoint::in_memory(const std::string& label, nlohmann::json config,
                                                  std::vector<MemoryTensor> tensors) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = label;
  if (!config.is_object()) fail(label, "config is not a JSON object");
  ck->config_ = std::move(config);
  std::set<const std::vector<uint8_t>*> seen;
  for (auto& t : tensors) {
    auto bad = [&](const std::string& why) { fail(label, "tensor '" + t.name + "': " + why); };
    if (t.name.empty()) fail(label, "a tensor has an empty name");
    if (!t.storage) bad("has no storage");
    size_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) bad("negative dimension in shape " + shape_str(t.shape));
      if (d > 0 && n > SIZE_MAX / static_cast<size_t>(d)) bad("shape " + shape_str(t.shape) + " is too large");
      n *= static_cast<size_t>(d);
    }
    if (t.offset > t.storage->size() || n > t.storage->size() - t.offset)
      bad(std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) + " needs bytes [" + std::to_string(t.offset) +
          ", " + std::to_string(t.offset + n) + ") of a storage of " + std::to_string(t.storage->size()) + " bytes");
    if (seen.insert(t.storage.get()).second) ck->storages_.push_back(t.storage);
    TensorView v;
    v.name = to_native_name(t.name);
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = t.storage->data() + t.offset;
    v.nbytes = n;
    v.file = &ck->dir_;
    ck->add_native(std::move(v), t.name);
  }
  ck->split_stacked_experts();
  return ck;
}

const TensorView* Checkpoint::find(const std::string& native_name) const {
  auto it = by_native_.find(native_name);
  return it == by_native_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::take(const std::string& native_name) {
  const TensorView* v = find(native_name);
  if (!v) throw Error("missing tensor " + native_name + " in " + dir_);
  used_.insert(native_name);
  return *v;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_native_.size());
  for (const auto& [name, _] : by_native_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : by_native_)
    if (!used_.count(name)) out.push_back(name);
  return out;
}

}  // namespace deepinfer
