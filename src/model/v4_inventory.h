#pragma once
// The tensor inventory of a DeepSeek-V4 checkpoint in the published (native) naming, derived from
// the config (spec §2.2), and a writer of random-weight checkpoints in that layout. Used by the
// benchmark (real layer shapes, random weights) and by tests that check loader and inventory agree.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "util/json.h"

namespace deepinfer {

class Checkpoint;

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

// A tensor as stored in the published checkpoint: FP8 -> F8_E4M3 [N, K] + `<base>.scale` F8_E8M0
// [ceil(N/br), ceil(K/bc)] (br × bc = the config's fp8 block); FP4 -> I8 [N, K/2] (two E2M1 a byte)
// + `<base>.scale` F8_E8M0 [N, ceil(K/32)]; BF16 / F32 / I64 as they are.
struct V4StoredTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t nbytes() const;
};
std::vector<V4StoredTensor> v4_stored_tensors(const V4Config& c, const V4TensorSpec& t);  // weight [, scale]
int64_t v4_stored_bytes(const V4Config& c, const V4TensorSpec& t);                      // sum of the above

// config.json of the published V4-Flash (spec §1: every field that changes the math; no MTP layer
// in the benchmark slice: num_nextn_predict_layers = 0), and a tiny config with the same structure
// (sliding, CSA and HCA layers, hash and score routing, fp8 blocks that divide its shapes) for tests.
nlohmann::json v4_flash_config_json();
nlohmann::json v4_tiny_config_json();
// `config` cut to its first `layers` layers (num_hidden_layers; the schedule lists keep their first
// entries) and without MTP layers.
nlohmann::json v4_slice_config(nlohmann::json config, int layers);

// An in-memory checkpoint (Checkpoint::in_memory) holding every tensor of the config's inventory in
// the published storage formats above, with random values, built in seconds even for V4-Flash:
// values come from per-format pools, and many tensors view one pool at different offsets.
//  * BF16 / F32 matrices: N(0, 1/K) (K = the input width); norm weights 1 + 0.1·N(0, 1); other
//    vectors (sinks, mHC base and scale, router bias) 0.5·N(0, 1).
//  * FP8: E4M3 bytes of 16·N(0, 1) (never the NaN bytes 0x7F / 0xFF), E8M0 block scales
//    2^-round(log2(16·sqrt(K))), so the weight is ~N(0, 1/K).
//  * FP4: any byte (two E2M1 values, std ≈ 2.93), E8M0 scales 2^-round(log2(2.93·sqrt(K))).
//  * tid2eid: k distinct experts per row.
// Deterministic in `seed`. Throws Error for an invalid config.
std::unique_ptr<Checkpoint> make_synthetic_v4_checkpoint(const nlohmann::json& config, uint64_t seed,
                                                         bool include_mtp = false);

}  // namespace deepinfer
