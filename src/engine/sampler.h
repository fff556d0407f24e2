#pragma once
// The CPU sampler: one row of FP32 logits [vocab] + the request's SamplingParams + the sequence's
// penalty/RNG state -> the next token. Plain data in, plain data out, so the engine's batch loop and
// a future GPU sampler share the contract (and this file is the GPU sampler's test oracle).
//
// Pipeline (docs/sampling.md):
//   structured-output mask (disallowed tokens -> -inf, before anything else: vLLM applies the
//   grammar bitmask to the logits before its sampler) -> logit_bias -> repetition penalty -> frequency/presence penalties -> min_tokens mask
//   -> temperature (0: greedy argmax, ties to the lower id)
//   -> top-k -> top-p -> min-p (candidate set, order: value desc, id asc)
//   -> Gumbel-max over the candidates with Philox noise keyed by (key, position, token id).
// The token therefore depends only on (logits, params, state, position): never on the batch, the
// row order, the thread count, or on how many random numbers anybody else drew.
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sampling_params.h"
#include "ops/sampling.h"

namespace deepinfer {

class ThreadPool;

struct TokenLogprob {
  int32_t token;
  float logprob;
  bool operator==(const TokenLogprob&) const = default;
};

struct SampleResult {
  int32_t token = -1;
  // Raw model log-softmax of `token` (before bias, penalties, temperature and filtering: vLLM's
  // default). With a structured-output mask it is the log-softmax of the masked logits (allowed
  // tokens renormalised, the rest -inf), as in vLLM, where the grammar bitmask is applied to the
  // logits before the sampler computes raw logprobs. NaN unless params.logprobs is set.
  float logprob = std::numeric_limits<float>::quiet_NaN();
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, logprob desc then id asc
  std::string error;                       // sample_batch only: why this row failed (token -1)
};

// What penalties and the RNG need to know about one output sequence (one choice of a request).
// Sparse (prompt and output ids only), so it costs O(distinct tokens), not O(vocab).
class SequenceSamplingState {
 public:
  // request_seed: resolve_seed(params), drawn once per request; choice_index: 0..n-1.
  // min_tokens_masked: min_tokens_masked_ids(params, eos ids) (stop_matcher.h).
  SequenceSamplingState(std::span<const int32_t> prompt, uint64_t request_seed, uint32_t choice_index,
                        std::vector<int32_t> min_tokens_masked = {});

  void on_token(int32_t id);  // call once per generated token, in order

  int64_t prompt_len() const { return prompt_len_; }
  int64_t num_output() const { return num_output_; }
  // Absolute position of the next token to decide: the RNG counter the engine passes by default.
  uint64_t next_position() const { return (uint64_t)(prompt_len_ + num_output_); }
  uint64_t seed() const { return seed_; }
  uint32_t choice_index() const { return choice_index_; }
  uint64_t rng_key() const { return key_; }

  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }  // distinct, ascending
  const std::vector<int32_t>& output_ids() const { return output_ids_; }  // distinct, first-seen order
  bool in_prompt(int32_t id) const;
  int32_t output_count(int32_t id) const;
  const std::vector<int32_t>& min_tokens_masked() const { return min_tokens_masked_; }

 private:
  std::vector<int32_t> prompt_ids_;
  std::vector<int32_t> output_ids_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> min_tokens_masked_;
  int64_t prompt_len_ = 0, num_output_ = 0;
  uint64_t seed_ = 0, key_ = 0;
  uint32_t choice_index_ = 0;
};

// ---- building blocks (public for tests and for checking a GPU sampler stage by stage) ----

// In place on logits [vocab], in this order (float arithmetic, as written):
//   x += logit_bias[id];
//   x = x > 0 ? x / repetition_penalty : x * repetition_penalty   (ids in prompt or output, once);
//   x -= frequency_penalty * count; x -= presence_penalty          (ids in the output, count >= 1);
//   x = -inf for state.min_tokens_masked() while state.num_output() < params.min_tokens.
// Ids outside [0, vocab) are ignored.
void apply_logit_processors(float* logits, int vocab, const SamplingParams& params,
                            const SequenceSamplingState& state);
// The same as edits (ops/sampling.h), one an id in ascending id order, appended to `out`: apply_edits with the
// returned row (first = out's size before the call) gives apply_logit_processors's logits bit for bit. Empty
// (count 0, no-op penalties) for a request without processors.
// pending: the state lacks the last output token (a fed decode row: the backend knows it, RowEdits::pend), so
// the edits are those of the state with it appended once the backend adds that token's (sample_math.h
// pending_edit): the min_tokens mask counts it, the row's pend is set and two places after its edits are kept
// free for it (placeholders with id −1).
RowEdits logit_edits(const SamplingParams& params, const SequenceSamplingState& state, int vocab,
                     std::vector<LogitEdit>& out, bool pending = false);
// Whether the request has any logit processor for its next token (bias, penalties, an active min_tokens mask),
// or for the token `pending` places after it (tokens before it not known yet: the mask may be off by then).
bool has_logit_processors(const SamplingParams& params, const SequenceSamplingState& state, int64_t pending = 0);

// filter_candidates (ops/sampling.h) with the request's top_k, top_p and min_p.
std::vector<int32_t> filter_candidates(const float* scaled, int vocab, const SamplingParams& params);

// gumbel_noise(key, position, token): ops/sampling.h.

// argmax with ties to the lower id; -1 when every value is -inf.
int32_t argmax_lowest_id(const float* values, int vocab);

// Raw log-softmax of logits [vocab] (double accumulation): the logprob of `token` and the top_n
// (id, logprob) sorted by logprob desc then id asc. Also what the engine uses for prompt_logprobs.
struct RawLogprobs {
  float token_logprob;
  std::vector<TokenLogprob> top;
};
RawLogprobs raw_logprobs(const float* logits, int vocab, int32_t token, int top_n);

// ---- the sampler ----

// One row. position: the RNG counter, normally state.next_position() (absolute index of the token
// being decided, so preemption/recompute and speculative verification address the same noise).
// allowed: structured-output bitmask, ceil(vocab / 32) words, bit i of word i / 32 set = token i
// allowed; nullptr = no mask. When min_tokens would mask every token the grammar allows (the
// grammar can only end), the grammar wins and min_tokens is ignored for that step.
// Throws deepinfer::Error for NaN / +inf logits or when every token is masked.
SampleResult sample_one(const float* logits, int vocab, const SamplingParams& params,
                        const SequenceSamplingState& state, uint64_t position,
                        const uint32_t* allowed = nullptr);

struct SampleRow {
  const float* logits;  // [vocab]
  const SamplingParams* params;
  const SequenceSamplingState* state;
  uint64_t position;
  const uint32_t* allowed = nullptr;  // structured-output bitmask [ceil(vocab / 32)] or nullptr
};

// Rows in parallel on `pool` (nullptr: on the calling thread). results[i] == sample_one(rows[i])
// exactly; a failing row gets token -1 and `error` set, the other rows are unaffected.
std::vector<SampleResult> sample_batch(std::span<const SampleRow> rows, int vocab, ThreadPool* pool);

}  // namespace deepinfer
