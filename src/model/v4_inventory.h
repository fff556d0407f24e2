#pragma once
// The tensor inventory of a DeepSeek-V4 checkpoint in the published (native) naming, derived from
// the config (spec §2.2), and a writer of random-weight checkpoints in that layout. Used by the
// benchmark (real layer shapes, random weights) and by tests that check loader and inventory agree.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "util/json.h"

namespace deepinfer {

// Storage of a tensor in the published V4-Flash checkpoint. FP8 and FP4 tensors come with a
// sibling `<base>.scale` (F8_E8M0) tensor, counted separately by inventory_tensor_count.
enum class V4Storage { BF16, F32, FP8, FP4, I64 };

struct V4TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // logical shape ([out, in] for matrices)
  V4Storage storage;
};

std::vector<V4TensorSpec> v4_tensor_inventory(const V4Config& cfg, bool include_mtp);
int64_t inventory_tensor_count(const std::vector<V4TensorSpec>& inv);  // incl. scale tensors

// Writes config.json (the given JSON) and model.safetensors with random weights (normal, scaled by
// 1/sqrt(fan_in) for matrices) for every tensor of the inventory, all stored as F32 (tid2eid as
// I64). Deterministic in `seed`.
void write_random_v4_checkpoint(const std::string& dir, const nlohmann::json& config, uint64_t seed);

}  // namespace deepinfer
