#pragma once
// DeepSeek-V4.1 (V4.1-Flash): configuration, weights, per-sequence decode state and the text forward
// pass, written against the Backend op table like deepseek_v4.*. Spec: shared/docs/deepseek-v4.1.md.
//
// What differs from V4 (spec §8): compression shared across layers (a few KV-source layers own a
// compressor and publish compressed KV + index keys; Full / Reindex / Reuse roles), ratios 1 and 2,
// a candidate pool that restricts later indexers, Engram n-gram hash memory, single-pass mHC without
// hc_head, no per-head q norm, 32×32 FP8 weight blocks, no hash-routed layers.
//
// Memory (as deepseek_v4.*): weights, activations and the decode state live in the backend's memory
// and every tensor of the forward pass is computed by Backend ops, so the same code runs on the cpu
// and cuda backends. The host keeps the index arrays (uploaded), routing and the top-k / candidate
// choices (router logits and index scores are downloaded once per layer), and the Engram tables:
// memory-mapped, far larger than a GPU (2 × 98 GB FP8 for V4.1-Flash); the rows a step needs depend
// on its token ids alone, so they are gathered and dequantized on the host and uploaded once per
// Engram layer and step.
//
// Numerics follow the spec's [HF] column (§6): float32 activations and weights (every stored dtype
// is dequantized at load; Engram rows are dequantized when gathered), no activation quantisation
// for the linears, but the KV QAT simulations that are part of the model's semantics: sliding KV
// FP8 (1×32, E8M0-style power-of-two scales), compressed KV FP4 (1×16, E4M3 scales), index keys and
// queries FP4 (1×32, power-of-two scales); index scores in float32. Index keys are always the
// owner's running key cache (spec §5.3: transformers' behaviour, not the reference code's stale
// slot on incomplete-group decode steps).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/deepseek_v4.h"  // LoadProgress
#include "ops/backend.h"
#include "util/json.h"

namespace deepinfer {

class Checkpoint;

struct V41Config {
  int vocab_size = 129280;
  int hidden_size = 5120;         // D, per HC stream
  int num_layers = 40;
  int num_heads = 64;             // H
  int head_dim = 512;             // d (q heads and the single K=V head)
  int rope_dim = 64;              // r, trailing RoPE'd channels
  int q_lora_rank = 1280;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int sliding_window = 128;       // W, includes the current token
  std::vector<int> compress_ratios;   // [num_layers], each 0, 1 or 2
  std::vector<int> kv_source_layers;  // own a compressor (Full)
  std::vector<int> index_source_layers;  // run an indexer (Full + Reindex)
  int candidate_source_layer = -1;    // < 0: no candidate pool
  int candidate_topk_blocks = 2048;
  int candidate_block_size = 8;
  int index_n_heads = 32;
  int index_head_dim = 128;
  int index_topk = 512;
  RopeConfig rope_main;               // ratio-0 layers
  RopeConfig rope_compress;           // ratio > 0 layers (q, sliding kv, latents, index q/k)
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-20;
  int n_routed_experts = 384;
  int n_shared_experts = 1;
  int num_experts_per_tok = 6;
  int moe_intermediate_size = 2304;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double gate_temp = 1.0;
  double swiglu_limit = 10.0;
  // Engram (spec §3.1, §3.4)
  std::vector<int> engram_layers;
  std::vector<int64_t> engram_num_embeddings;  // table rows per Engram layer
  int engram_max_ngram = 4;                    // n-gram orders 2..N
  int engram_n_heads = 8;
  int engram_head_dim = 256;
  int64_t engram_vocab_size = 16000000;        // start of the prime search
  int engram_pad_id = 2;
  int engram_compressed_vocab = 99092;
  int num_mtp_layers = 0;                      // DSpark stages (not run here)
  int fp8_block_rows = 32, fp8_block_cols = 32;
  int bos_token_id = 0;
  std::vector<int> eos_token_ids{1};
  int image_token_id = -1;                     // inputs holding it are refused (no vision tower yet)
  int max_position_embeddings = 1048576;

  // Derived, per layer: the most recent KV / index source at or before it (−1 for ratio 0).
  std::vector<int> kv_source_of, index_source_of;
  bool is_kv_source(int l) const;
  bool is_index_source(int l) const;
  const RopeConfig& rope_for(int l) const { return compress_ratios[l] ? rope_compress : rope_main; }
};

// True for a config.json that names the V4.1 architecture (model_type deepseek_v41 /
// deepseek_v41_text, or architectures DeepseekV41ForCausalLM...).
bool is_v41_config(const nlohmann::json& j);
// Parses config.json contents: the composite published / transformers form (text fields under
// `text_config`) or the flat one (inference/config.json names accepted too). Throws Error naming
// the field on a missing, invalid or inconsistent field.
V41Config parse_v41_config(const nlohmann::json& j);

// Engram constants (spec §3.1 step 5), derived from the config exactly as the reference does:
// multipliers μ = 2·R + 1 with R = numpy default_rng(10007·layer).integers(0, (2^63−1) //
// compressed_vocab // 2, size=N) (numpy's PCG64 reimplemented), and the 2·… primes.
std::vector<int64_t> engram_multipliers(int layer, int compressed_vocab, int max_ngram);
// primes[e][(n−2)·heads + j] for Engram layer index e (in config order).
std::vector<std::vector<int64_t>> engram_primes(const V41Config& c);

// ---- weights (float32, row-major [out, in]; in the backend's memory unless marked host) ----
struct V41Engram {
  TensorView table, table_scale;   // host, memory-mapped: [rows, hd] (F8_E4M3 + [rows, hd/32] scale, or a plain float type)
  bool has_scale = false;
  WeightPtr wkv;                   // [(hc+1)·D, cols·hd]
  Buffer<float> w;                 // [hc, D] = q_weight ⊙ k_weight
  std::vector<int64_t> mult;       // [N]
  std::vector<int64_t> prime, off; // [cols]
};

struct V41Layer {
  int ratio = 0;
  bool kv_source = false, index_source = false, candidate_source = false, restricted = false;
  int kv_src = -1;                                        // layer whose compressed cache it reads
  Buffer<float> attn_norm, ffn_norm;                      // [D]
  Buffer<float> hc_attn_fn, hc_ffn_fn;                    // [(2+hc)·hc, hc·D]
  Buffer<float> hc_attn_base, hc_ffn_base;                // [(2+hc)·hc]
  Buffer<float> hc_attn_scale, hc_ffn_scale;              // [3]
  Buffer<float> sinks;                                    // [H]
  WeightPtr wq_a;                                         // [q_lora, D]
  Buffer<float> q_norm;                                   // [q_lora]
  WeightPtr wq_b;                                         // [H·d, q_lora]
  WeightPtr wkv;                                          // [d, D]
  Buffer<float> kv_norm;                                  // [d]
  std::vector<WeightPtr> wo_a;                            // g × [o_lora, H·d/g]
  WeightPtr wo_b;                                         // [D, g·o_lora]
  // KV sources
  WeightPtr comp_wkv, comp_wgate;                         // [d, D] (wgate: ratio 2 only)
  Buffer<float> comp_norm;                                // [d]
  WeightPtr idx_wk;                                       // [dI, d]
  Buffer<float> idx_k_norm;                               // [dI]
  // index sources
  WeightPtr idx_wq_b;                                     // [hI·dI, q_lora]
  WeightPtr idx_weights_proj;                             // [hI, D]
  // MoE
  WeightPtr gate;                                         // [E, D]
  std::vector<float> gate_bias;                           // [E] host (routing; text tokens: bias_vl is for images)
  std::vector<WeightPtr> expert_w13;                      // E × [2I, D]
  std::vector<WeightPtr> expert_w2;                       // E × [D, I]
  WeightPtr shared_w13, shared_w2;                        // [2I, D], [D, I]
  int engram = -1;                                        // index into engrams_, −1: none
};

// Rows of `width` floats in a backend's memory that grow at the end (a KV source's compressed
// entries or index keys); the capacity doubles and the rows move when it does.
struct V41Rows {
  Buffer<float> buf;       // [capacity, width]
  int64_t width = 0;
  int64_t n = 0;           // rows in use
  const float* data() const { return buf.data(); }
  // Room for `add` more rows; returns row n for the caller to write (then n += add).
  float* reserve(Backend& be, int64_t add);
};

// One sequence's decode state (spec §5.1), in the model's backend memory. A pure function of the
// token prefix; owned by the caller (move-only).
struct V41SeqState {
  int64_t pos = 0;                               // tokens processed = next absolute position
  std::vector<Buffer<float>> ring;               // [L] → [W, d], row = position mod W
  std::vector<V41Rows> entries;                  // [L] (KV sources) → [n, d] compressed KV, FP4-QDQ'd
  std::vector<V41Rows> keys;                     // [L] (KV sources) → [n, dI] index keys, FP4-QDQ'd
  // [L] (ratio-2 sources) → [2, d] rings (row = position mod 2) of the compressor's a and z: row 0
  // holds an even token's while its group is open across steps.
  std::vector<Buffer<float>> open_kv, open_gate;
  std::vector<int32_t> engram_hist;              // host: compressed ids of the last N−1 tokens, oldest first
  int64_t bytes() const;                         // backend memory held
};

struct V41SeqChunk {
  V41SeqState* state;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every token of the chunk, else only for the last
};

class DeepseekV41Model {
 public:
  // Loads weights from an opened checkpoint (taking every text-model tensor it uses; vision,
  // aligner and DSpark tensors stay unused). `token_map` is the Engram compressed token map [V]
  // (empty if the config has no Engram layers). Throws Error naming the tensor on a missing
  // tensor or a wrong shape.
  DeepseekV41Model(const V41Config& cfg, Checkpoint& ckpt, Backend& backend, std::vector<int32_t> token_map,
                   const LoadProgress& progress = {});

  const V41Config& config() const { return cfg_; }

  // A fresh, empty state for one sequence (in the backend's memory).
  V41SeqState new_state() const;
  Backend& backend() const { return be_; }

  // One step over several sequences (chunks of any length ≥ 1). Logits [rows, vocab] in chunk order:
  // every token of chunks with all_logits, else the last. Validates everything first: on Error no
  // state has changed.
  std::vector<float> forward(std::span<const V41SeqChunk> batch);

 private:
  struct Step;
  void engram(const V41Engram& e, Step& st, float* X);
  void publish(int layer, Step& st, size_t b, const float* ca, const float* cz);
  void attention(int layer, Step& st);
  void moe(const V41Layer& L, const float* h, int64_t T, float* out);

  V41Config cfg_;
  Backend& be_;
  Buffer<float> embed_;        // [V, D]
  WeightPtr head_;             // [V, D]
  Buffer<float> norm_;         // [D]
  std::vector<V41Layer> layers_;
  std::vector<V41Engram> engrams_;
  std::vector<int32_t> token_map_;  // host: [V] → [0, compressed_vocab)
  Buffer<float> inv_freq_main_, inv_freq_compress_;  // [r/2]
};

// Reads the Engram compressed token map of a model directory: `engram_token_map.safetensors`,
// tensor `token_map` (I32/I64 [vocab]), values in [0, compressed_vocab) with exactly
// compressed_vocab distinct values. Made by scripts/make_engram_token_map.py from tokenizer.json.
std::vector<int32_t> read_engram_token_map(const std::string& dir, const V41Config& cfg);

}  // namespace deepinfer
