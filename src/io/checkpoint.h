#pragma once
// A Hugging Face model directory: config.json plus one safetensors file or shards listed in
// model.safetensors.index.json. Tensor names are normalised to the native naming of the published
// DeepSeek checkpoints (spec §2.1: `layers.N.attn.wq_a.weight`, `embed.weight`, `head.weight`,
// `mtp.0.*` ...), whichever of the two namings (published native, or the mixed naming that
// transformers' save_pretrained writes) the files use.
//
// The model asks for tensors with take(); after loading it calls unused() so that every tensor the
// model did not consume is reported by name, never silently dropped.
//
// A Checkpoint can also be built in memory (in_memory(): tensors whose bytes the Checkpoint owns, no
// files), so that synthetic weights (the benchmark's V4-Flash slice) go through exactly the same
// loader as a real directory.
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "util/json.h"

namespace deepinfer {

class Checkpoint {
 public:
  // Opens `dir`: parses config.json (kept as JSON; the model parses its own fields), opens and
  // validates all shard files. Throws Error on any problem (missing dir / config / shard, bad JSON,
  // index pointing at a tensor that the shard lacks, the same tensor in two shards, ...).
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  // A tensor of an in-memory checkpoint: `shape` of `dtype` whose bytes are
  // storage[offset, offset + numel·dtype_size). Many tensors may view one storage (overlapping is
  // allowed: they are read-only). Names as in a file (native or transformers naming).
  struct MemoryTensor {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::shared_ptr<const std::vector<uint8_t>> storage;
    size_t offset = 0;
  };
  // A checkpoint of `tensors` (kept alive by the Checkpoint) with `config` as its config.json.
  // `label` stands for the directory in messages (dir()). Validated like a file: throws Error naming
  // the label and the tensor for an empty name, a negative dimension, a missing storage, bytes
  // outside the storage, two tensors with one (native) name, or a config that is not an object.
  static std::unique_ptr<Checkpoint> in_memory(const std::string& label, nlohmann::json config,
                                               std::vector<MemoryTensor> tensors);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }

  // Lookup by native name. find() returns nullptr if absent; take() throws Error("missing tensor
  // <name> in <dir>") if absent and marks the tensor as used. Both accept only native names.
  const TensorView* find(const std::string& native_name) const;
  const TensorView& take(const std::string& native_name);
  bool has(const std::string& native_name) const { return find(native_name) != nullptr; }

  std::vector<std::string> names() const;   // all native names, sorted
  std::vector<std::string> unused() const;  // names never take()n, sorted

  // Maps a name as written in a file to the native name (identity for native names). Stacked
  // expert tensors (`...ffn.experts.gate_up_proj` [E, 2I, D], `...ffn.experts.down_proj` [E, D, I],
  // and their `_scale_inv`) keep their stacked name here; open() splits them into per-expert
  // native views `...ffn.experts.E.w1.weight` [I, D], `w3` [I, D], `w2` [D, I].
  static std::string to_native_name(const std::string& file_name);

  // The name the tensor has inside its file (differs from the native name for transformers-saved
  // checkpoints; for per-expert slices it is the stacked tensor's name). Empty if absent.
  std::string file_tensor_name(const std::string& native_name) const;

 private:
  void add_native(TensorView v, const std::string& file_name);
  void split_stacked_experts();

  std::string dir_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> storages_;  // in_memory(): the bytes
  // Views under native names (same bytes as the files' views; per-expert slices of stacked
  // expert tensors). A deque so that pointers in by_native_ stay valid while it grows.
  std::deque<TensorView> views_;
  std::map<std::string, std::string> file_name_of_;  // native name -> name as written in the file
  std::map<std::string, const TensorView*, std::less<>> by_native_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace deepinfer
