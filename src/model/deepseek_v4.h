#pragma once
// DeepSeek-V4 (V4-Flash, V4-Pro and their Base variants): weights, per-sequence decode state and the
// forward pass, written once against the Backend op table. Spec: shared/docs/deepseek-v4.md.
//
// Numerics: float32 activations and weights (every stored dtype is dequantized at load, then handed
// to the backend in its own layout), float32
// softmax/Sinkhorn, no QAT simulations — the transformers (HF) numerics, which our references use.
//
// Memory: weights, activations and the cache live in the backend's memory (Buffer<T>, V4Cache with
// the backend's allocator); the host keeps only what the host decides with: token ids, positions,
// page tables, the MoE routing (router logits come back, [T, E]) and the indexer's top-k (scores
// come back, [T, keys]). Per step the host uploads small index arrays and downloads the logits.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/v4_cache.h"
#include "ops/backend.h"

namespace deepinfer {

class Checkpoint;
using LoadProgress = std::function<void(int done, int total)>;  // layers loaded so far

// ---- weights (float32, row-major [out, in]) ----
struct V4Compressor {  // main (d) or indexer (dI) compressor of a CSA/HCA layer
  int rate = 0;        // m
  int width = 0;       // d or dI
  bool overlap = false;  // CSA: c = 2 (A|B halves), HCA: c = 1
  // (its wkv, wgate [c·width, D] live in the layer's stacked wcomp)
  Buffer<float> ape;              // [m, c·width]
  Buffer<float> norm;             // [width]
};

struct V4Layer {
  AttnType type = AttnType::Sliding;
  bool hash = false;
  Buffer<float> attn_norm, ffn_norm;                      // [D]
  Buffer<float> hc_attn_fn, hc_ffn_fn;                    // [(2+hc)·hc, hc·D]
  Buffer<float> hc_attn_base, hc_ffn_base;                // [(2+hc)·hc]
  Buffer<float> hc_attn_scale, hc_ffn_scale;              // [3]
  Buffer<float> sinks;                                    // [H]
  // The projections of the attention input h stacked into one GEMM each (one launch instead of up to six
  // at decode): wq_a over wkv; the compressor's wkv, wgate, then the indexer compressor's wkv, wgate.
  WeightPtr wqkv_a;                                       // [q_lora + d, D]
  WeightPtr wcomp;                                        // [2·c·d (+ 2·2·dI for CSA), D] (CSA / HCA)
  Buffer<float> q_norm;                                   // [q_lora]
  WeightPtr wq_b;                                         // [H·d, q_lora]
  Buffer<float> kv_norm;                                  // [d]
  WeightGroupsPtr wo_a;                                   // g × [o_lora, H·d/g]
  WeightPtr wo_b;                                         // [D, g·o_lora]
  V4Compressor comp;                                      // CSA / HCA
  V4Compressor idx_comp;                                  // CSA only
  WeightPtr idx_wq_b;                                     // [hI·dI, q_lora]
  WeightPtr idx_weights_proj;                             // [hI, D]
  WeightPtr gate;                                         // [E, D]
  Buffer<float> gate_bias;                                // [E] (score-routed layers)
  Buffer<int32_t> tid2eid;                                // [V, k] (hash layers)
  ExpertsPtr experts;                                     // E × ([2I, D] w1 rows over w3 rows, [D, I] w2)
  WeightPtr shared_w13;                                   // [2I, D] (null: no shared expert)
  WeightPtr shared_w2;                                    // [D, I]
};

// The multi-token-prediction layer (kept for speculative decoding; spec §3.9).
struct V4Mtp {
  V4Layer block;                          // sliding-only, score-routed
  WeightPtr e_proj, h_proj;               // [D, D]
  Buffer<float> enorm, hnorm, norm;       // [D]
  Buffer<float> hc_head_fn;               // [hc, hc·D]
  Buffer<float> hc_head_base;             // [hc]
  Buffer<float> hc_head_scale;            // [1]
};

// One sequence's share of a forward step: `tokens` go in at positions state->pos, state->pos+1, ...
// The state's slot and pages live in the V4Cache passed to forward(); its pages must already cover
// state->pos + tokens.size() positions (V4Cache::reserve).
struct V4SeqChunk {
  V4SeqState* state;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every token of the chunk, else only for the last
  // How the backend samples the chunk's last row when device sampling is on (set_device_argmax): its
  // token is what argmax() returns. Other rows of an all_logits chunk are greedy picks.
  SampleSpec sample{};
  // That row's logit processors (bias, penalties, a min_tokens mask), applied on the backend before its pick:
  // `edited` when its request may have any (a step with such a row records the edits), then its penalties
  // (edit_row; first / count are the model's, pend a flag the model turns into its token's place) and edits. A prepared step takes them at launch instead
  // (StepEdits): they depend on the tokens up to the one launched.
  bool edited = false;
  RowEdits edit_row{};
  std::span<const LogitEdit> edits{};
  // A structured-output row's grammar mask (Backend::mask_rows, before the edits), when the backend has masks on
  // (masks_on_backend): `masked` when the row takes one (a step with such a row records the masks op), then its
  // allowed-token words (mask_words(V); a prepared step takes them at launch: StepEdits::masks).
  bool masked = false;
  std::span<const uint32_t> mask{};
};

// A prepared decode step's logit edits, given at launch: rows[i] for sequence i (first / count into list). A
// fed row's pend = 1 (logit_edits' pending: its token is the previous step's pick, and the two list places after
// its edits are kept for it); the model turns it into 1 + that token's place in the step's ids.
struct StepEdits {
  std::vector<RowEdits> rows;
  std::vector<LogitEdit> list;
  std::vector<uint32_t> masks;  // the rows' grammar masks, mask_words(V) words each (RowEdits::mask: which)
};

class DeepseekV4Model {
 public:
  // Loads weights from an opened checkpoint (taking every tensor it uses; the caller reports
  // ckpt.unused()). Throws Error naming the tensor on a missing tensor or a wrong shape.
  DeepseekV4Model(const V4Config& cfg, Checkpoint& ckpt, Backend& backend, const LoadProgress& progress = {});

  const V4Config& config() const { return cfg_; }
  Backend& backend() const { return be_; }
  bool has_mtp() const { return !mtp_.empty(); }

  // Runs one step over several sequences (each chunk of any length ≥ 1). Returns logits
  // [rows, vocab] in chunk order: all tokens of chunks with all_logits, else the last token.
  // Validates everything before touching any state: on Error nothing has changed. The cache must
  // live in this model's backend memory (V4Cache built with the same backend, or host memory for a
  // host-memory backend).
  std::vector<float> forward(std::span<const V4SeqChunk> batch, V4Cache& cache);
  // The same, the logits [R, V] left in host memory the backend owns (Backend::download_view), valid
  // until the next forward: no fresh vector to zero and fault in, and on CUDA a page-locked copy (a
  // batch of 256 returns 132 MB a step).
  std::span<const float> forward_view(std::span<const V4SeqChunk> batch, V4Cache& cache);
  // Pipelined decode (the host work of step N+1 overlapping step N on the device): prepare() takes a
  // decode step (one token a sequence; the tokens' values are ignored: they are not known yet) and, when
  // the backend runs it from a graph, plans and records it without launching anything (positions
  // advance as in forward). launch(ids) gives its token ids (one a sequence, in batch order) and launches
  // it; logits() waits for the last launched step and returns its logits as forward_view does. Without a
  // graph (CPU, graphs off, the step after a prefill) prepare only keeps the step and launch runs it whole
  // (the same results, no overlap); `prepared_ahead()` tells which. Until launch, no other step may be
  // prepared or run. A malformed step throws here (nothing changed) or, kept for launch, there.
  void prepare(std::span<const V4SeqChunk> batch, V4Cache& cache);
  // forward_view without reading the result: logits() / argmax() read it (any step, chunks of any length).
  void forward_launch(std::span<const V4SeqChunk> batch, V4Cache& cache) { enqueue(batch, cache, false, {}); }
  // feed (empty, or one entry a sequence): feed[i] ≥ 0 takes sequence i's token from the backend's pick for row
  // feed[i] of the step launched before this one (its argmax(), read on the backend: the step can be launched
  // before the host has read that one, with no round trip between them); ids[i] is then ignored. A pick that
  // is no token (−1 / −2) feeds token 0: that row's request fails, its result is to be dropped. Needs
  // can_feed() when any entry is ≥ 0.
  void launch(std::span<const int32_t> ids, std::span<const int32_t> feed = {}, const StepEdits* edits = nullptr);
  // The most logit edits a step holds (more: the caller samples those rows on the host).
  static constexpr int64_t kEditCap = 1 << 18;
  // Whether the last launched step's picks can feed the next launch: a decode step with picks
  // (set_device_argmax) of at most kPickRows rows. They stay readable as argmax(1) after that launch.
  bool can_feed() const { return out_pick_slot_; }
  // Whether the prepared step can take a feed (its picks too go outside the arena).
  bool prepared_takes_feed() const { return ready_ && ready_pick_slot_; }
  static constexpr int64_t kPickRows = 4096;
  std::span<const float> logits();
  // Row r of those logits into dst[V] (one copy of V floats): for a step whose few rows are sampled on the host. (A
  // row masked on the backend, a grammar's, comes back masked: restore_row.)
  void logits_row(int64_t r, float* dst);
  bool prepared() const { return ready_; }
  // Picks on the backend (Backend::sample_rows, each chunk's `sample`: greedy by default) with every step's
  // logits, so that a batch without logit processors reads R ids instead of R·V logits: argmax() returns
  // those of the last launched step (−1 / −2 as sample_rows says), empty when not computed; argmax(1) those of
  // the step launched before it, when that one could feed (can_feed(): they are kept apart from the arena).
  void set_device_argmax(bool on) { argmax_ = on; }
  std::span<const int32_t> argmax(int back = 0);
  // The raw logprobs of the rows whose `sample` asked for them (SampleSpec::logprobs ≥ 0; Backend::logprob_rows,
  // when the backend has them on: logprobs_on_backend), one a logits row as argmax(back) (other rows' entries are
  // unset); empty when the step computed none.
  std::span<const RowLogprobs> logprobs(int back = 0);
  bool logprobs_on_backend() const { return be_.logprobs_on_backend(); }
  bool masks_on_backend() const { return be_.masks_on_backend(); }
  // The most grammar masks a step holds (more: the caller samples those rows on the host).
  static constexpr int64_t kMaskRows = 256;
  bool prepared_ahead() const { return ready_ && !deferred_cache_; }
  // Decode steps padded to a bucket of batch sizes (stand-in rows, results unchanged): −1 = when the
  // backend asks for it (Backend::decode_rows: CUDA graphs), 0 = never, 1 = always (tests).
  void set_decode_padding(int mode) { pad_decode_ = mode; }

 private:
  struct Step;  // activations of one forward step
  void attention(int layer, Step& st);
  // Writes an entry into the sequence's pages (at page_off) for every compressor window that closes
  // among n tokens (projections kv/gate [n, c·width], row stride ld, positions p0..), reading earlier
  // positions from the slot's window ring (ring_kv/ring_gate [R, c·width], R = 2m for CSA, m for HCA).
  // The caller pushes the n tokens into the ring afterwards (one batched copy for the whole step).
  void compressor_update(const V4Compressor& w, float* ring_kv, float* ring_gate, V4Cache& cache,
                         const V4SeqState& s, int64_t page_off, const float* kv, const float* gate, int64_t ld,
                         int64_t p0, int64_t n);
  // Entries of nw compressor windows (ids wins, first positions wpos): pooled from the rings (window i's
  // ring ring_rows[i] rows into ring_kv / ring_gate, or 0 when ring_rows is null) and from this step's
  // projections (positions ≥ p0), normed, roped at their first position and scattered to page_rows[i]
  // (rows of width floats from page_base: the layer's region in page 0; −1: not kept). Arrays in backend memory.
  void emit_entries(const V4Compressor& w, const float* ring_kv, const float* ring_gate, const float* kv,
                    const float* gate, int64_t ld, int64_t p0, const int32_t* wins, const int32_t* ring_rows,
                    const int32_t* wpos, const int32_t* page_rows, int64_t nw, float* page_base);
  void moe(const V4Layer& L, const float* h, const int32_t* tokens, int64_t T, float* out);
  // Validates and plans a step, then runs it (ready_only: records it for launch(); false when it cannot).
  // feed: launch()'s, for a step that runs whole (ready_only false); empty = none.
  bool enqueue(std::span<const V4SeqChunk> batch, V4Cache& cache, bool ready_only, std::span<const int32_t> feed);
  // A launched step's outputs become the last launched step's (the one before moves to prev_).
  // lps: its rows' logprobs (after its picks: ids + kPickRows in picks_, else ids + R), or null.
  void set_out(const float* logits, const int32_t* ids, int64_t n, bool pick_slot, uint64_t par, const RowLogprobs* lps,
               std::vector<RowEdits> erows = {}, std::vector<LogitEdit> elist = {});
  // Puts back the raw logits of row r's edits into dst[V] (a row of the last launched step, read by the host). A
  // row masked on the backend (a grammar) stays masked: its disallowed tokens read −inf (the host masks it again).
  void restore_row(int64_t r, float* dst);
  // Bytes of a launched step's small outputs (picks, logprobs) into dst: from its staged copy at staged_at when it
  // has one (back = 1 always does), else downloaded from src.
  void read_out(int back, int64_t staged_at, const void* src, void* dst, int64_t bytes);
  int64_t decode_rows_of(int64_t B) const;  // a decode step's rows with stand-ins (set_decode_padding)

  V4Config cfg_;
  Backend& be_;
  Buffer<float> embed_;         // [V, D]
  WeightPtr head_;              // [V, D]
  Buffer<float> norm_;          // [D]
  Buffer<float> hc_head_fn_, hc_head_base_, hc_head_scale_;
  std::vector<V4Layer> layers_;
  std::vector<V4Mtp> mtp_;
  Buffer<float> inv_freq_main_, inv_freq_compress_;  // [r/2]
  uint64_t graph_owner_ = 0;  // keys this model's step graphs (Backend::graph_begin)
  int pad_decode_ = -1;       // set_decode_padding
  uint64_t parity_ = 0;       // the last launched step's; alternates per decode step: consecutive steps use
                              // different graphs (and halves of picks_)
  const float* out_logits_ = nullptr;  // the last enqueued step's logits [out_n_] (backend memory)
  Buffer<float> out_buf_;              // holds them when the step did not run from a graph
  const int32_t* out_ids_ = nullptr;   // its argmax_rows picks [out_n_ / V], when argmax_
  Buffer<int32_t> out_ids_buf_;        // (and its logprobs after them, when it had some)
  const RowLogprobs* out_lps_ = nullptr;  // its logprobs [out_n_ / V], when a row asked for them
  // Decode steps' picks outside the arena, by parity [2, kPickSlot]: step N+1 reads N's (launch's feed) while the
  // host reads them after N+1's launch; N+2 writes them again only after that (the engine reads N first). A half
  // is kPickRows picks, then kPickRows RowLogprobs (staged with the picks when the step has logprobs).
  static constexpr int64_t kPickSlot = kPickRows + kPickRows * (int64_t)(sizeof(RowLogprobs) / 4);
  Buffer<int32_t> picks_;
  int32_t* pick_half(uint64_t par) { return picks_.data() + (int64_t)par * kPickSlot; }
  bool out_pick_slot_ = false;          // the last launched step's picks are in picks_ (and staged: Backend::stage)
  int out_slot_ = 0;                    // its parity: picks_ half and stage slot
  int prev_slot_ = -1;                  // the step launched before it: its stage slot, when it had one
  int64_t prev_rows_ = 0;
  bool prev_lps_ = false;               // its staged copy holds logprobs
  std::vector<RowLogprobs> lps_host_;
  bool ready_pick_slot_ = false;        // the prepared step's picks go to picks_ (it can take a feed)
  bool ready_edited_ = false;           // it applies logit edits (its rows' RowEdits follow the feed map)
  bool ready_masked_ = false;           // and grammar masks
  std::vector<char> deferred_edited_;   // a deferred step's chunks' `edited`
  std::vector<char> deferred_masked_;   // and `masked`
  // The steps' logit edits outside the arena, by parity [2, kEditCap] (their number is not part of a graph's key).
  Buffer<LogitEdit> edits_;
  Buffer<float> edits_raw_;            // [2, kEditCap]: the logits the edits replaced (Backend::sample_rows)
  Buffer<uint32_t> masks_;             // [2, kMaskRows, mask_words(V)]: the steps' grammar masks, by parity
  uint32_t* mask_half(uint64_t par) { return masks_.data() + (int64_t)par * kMaskRows * mask_words(cfg_.vocab_size); }
  // The last launched step's edited rows (host copies of its RowEdits by logits row, and of its edits), so that a
  // row the host samples after all (logits_row / logits) gets its raw logits back.
  std::vector<RowEdits> out_erows_;
  std::vector<LogitEdit> out_elist_;
  std::vector<float> restored_;        // logits() of a step with edited rows
  uint64_t ready_par_ = 0;              // its parity
  std::vector<int32_t> ids_host_;
  bool argmax_ = false;
  const int32_t* ready_ids_ = nullptr;
  const RowLogprobs* ready_lps_ = nullptr;
  int64_t out_n_ = 0;
  bool ready_ = false;                 // a prepared step waits for launch()
  int64_t ready_rows_ = 0, ready_padded_ = 0;  // its sequences, and its rows with stand-ins
  const float* ready_logits_ = nullptr;        // its logits [ready_n_], once launched
  V4Cache* deferred_cache_ = nullptr;          // a prepared step without a graph: runs whole at launch
  std::vector<V4SeqState> deferred_states_;    // its sequences' states at prepare
  std::vector<SampleSpec> deferred_specs_;     // and their sampling
  int64_t ready_n_ = 0;
};

}  // namespace deepinfer
