#pragma once
// Sampling of temperature-scaled logits, the part of the sampler that both backends run: the host
// functions here (src/ops/cpu/sampling.cc) are what the engine's sample_one calls after its logit
// processors, what the CPU backend's sample_rows runs, and the oracle of the CUDA sampler, which gives the
// same token bit for bit (the arithmetic is src/ops/sample_math.h).
#include <cmath>
#include <cstdint>
#include <vector>

namespace deepinfer {

// One row's sampling, as a backend takes it (plain data, 32 bytes, copied to backend memory).
struct SampleSpec {
  float temperature = 0.0f;  // the effective temperature (effective_temperature); ≤ 0 or NaN: greedy
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off
  int32_t top_k = 0;         // ≤ 0 = off
  uint64_t key = 0;          // the sequence's RNG key (SequenceSamplingState::rng_key)
  uint64_t position = 0;     // the RNG counter: absolute position of the token being decided
  int32_t logprobs = -1;     // the row's raw logprobs with this many top entries (≤ kMaxLogprobs): Backend::logprob_rows; −1 none
  int32_t pad_ = 0;
};
static_assert(sizeof(SampleSpec) == 40);

// Raw logprobs of a sampled row, as a backend returns them (Backend::logprob_rows; plain data, 168 bytes): the
// picked token's and the top n (value desc, then id asc), row_logprobs' values.
constexpr int kMaxLogprobs = 20;  // vLLM's default --max-logprobs; rows asking more are sampled on the host
struct RowLogprobs {
  float token = 0.0f;  // the pick's logprob (−inf when the pick is no token)
  int32_t n = 0;       // entries of ids / lps
  int32_t ids[kMaxLogprobs] = {};
  float lps[kMaxLogprobs] = {};
};
static_assert(sizeof(RowLogprobs) == 168);

// A row's logit processors (bias, repetition / frequency / presence penalties, the min_tokens mask) as
// edits of the ids they touch: sample_math.h edit_logit, in place, before sampling. Plain data.
struct LogitEdit {
  int32_t id = 0;
  float bias = 0.0f;   // added when flags has kEditBias
  int32_t count = 0;   // the id's occurrences in the output (frequency / presence penalties)
  uint32_t flags = 0;  // kEditBias | kEditRepeat (in the prompt or the output) | kEditMask
};
static_assert(sizeof(LogitEdit) == 16);
struct RowEdits {
  float rep = 1.0f, freq = 0.0f, presence = 0.0f;  // the request's penalties
  int32_t first = 0, count = 0;                    // its edits: [first, first + count) of the step's list
  // A pending token (a fed decode row: its input token is the previous step's pick, an output token the list
  // does not count yet): 1 + its place in the step's token ids (0: none). Its edit is the list's entry for it,
  // or an empty one, with one more occurrence (sample_math.h pending_edit). The list keeps the two places after
  // the row's edits free: raw[first + count] gets its value before when the list has no entry for it, and
  // raw[first + count + 1] the float whose bits are its id then (−1 otherwise), so that the raw row can be
  // restored without knowing the token on the host.
  int32_t pend = 0;
  // A structured-output row's grammar mask: its place among the step's masks (Backend::mask_rows), −1 none.
  int32_t mask = -1;
};
static_assert(sizeof(RowEdits) == 28);
// Words of a row's allowed-token bitmask (bit i of word i / 32: token i allowed).
inline int64_t mask_words(int64_t N) { return (N + 31) / 32; }
// x[i] = −inf for every token i the mask does not allow (a NaN or +inf stays: the row still answers −2), as the
// host sampler masks a structured-output row before its logit processors.
void apply_mask(float* x, int64_t N, const uint32_t* allowed);
// The places a row takes in the step's list (and its raw values): its edits, and two for a pending token. A row
// with none has nothing to apply.
inline int32_t edit_places(const RowEdits& r) { return r.count + (r.pend > 0 ? 2 : 0); }
// x[id] = edit_logit(x[id], ...) for the row's edits (ids outside [0, N) are skipped), the values before into
// raw[first + j] when raw is given (so that a row the host must sample after all gets its raw logits back). A
// NaN or +inf is left as it is: the host sampler rejects a row holding one before its processors run, and so
// the row still answers −2. tokens: the step's token ids (for row.pend; may be null when no row has one).
void apply_edits(float* x, int64_t N, const RowEdits& row, const LogitEdit* edits, float* raw = nullptr,
                 const int32_t* tokens = nullptr);

// The edits' raw values back into row x[N] (what apply_edits saved into raw): the row's logits as the model gave
// them. The host does the same with a downloaded row (DeepseekV4Model::restore_row).
void restore_edits(float* x, int64_t N, const RowEdits& row, const LogitEdit* edits, const float* raw);

// The raw log-softmax of a row x[N] (sample_math.h "Logprobs": the same bits on every backend; NaN counts as
// −inf): m its largest value (−inf: every logprob is −inf) and log Z, so that lp(x_i) = logprob_of(x_i, m, log_z).
struct LogprobBase {
  float m = -INFINITY;
  double log_z = 0.0;
};
LogprobBase logprob_base(const float* x, int64_t N);
// The ids of the n largest values of x[N], best first (value desc, then id asc; NaN as −inf).
std::vector<int32_t> top_ids(const float* x, int64_t N, int n);
// A backend row's logprobs (Backend::logprob_rows): out.token = lp(x[token]) (−inf when token is outside
// [0, N)), out.ids / lps the top min(top_n, N, kMaxLogprobs).
void row_logprobs(const float* x, int64_t N, int32_t token, int top_n, RowLogprobs& out);

// Candidate set of temperature-scaled logits [vocab] (−inf = excluded; no NaN), in order (value desc,
// id asc): top-k, then top-p on the top-k set, then min-p (rel ≥ min_p). Masses as sample_math.h defines
// them: rel = exp(s − s_max), q = ⌊rel · 2^32⌋; top-p keeps a token when q > 0 and the mass ranked before
// it is < top_p · (the top-k set's mass); the best token is always kept.
std::vector<int32_t> filter_candidates(const float* scaled, int vocab, int top_k, float top_p, float min_p);

// Gumbel(0, 1) noise for `token` at `position` of the sequence with RNG key `key`.
float gumbel_noise(uint64_t key, uint64_t position, int32_t token);

// The token of scaled logits [vocab]: argmax of s_i + gumbel_noise(key, position, i) over the candidates
// (all finite tokens when no filter is on), ties to the lower id; −1 when every value is −inf.
int32_t sample_scaled(const float* scaled, int vocab, int top_k, float top_p, float min_p, uint64_t key,
                      uint64_t position);

// A backend's row: −2 when x holds a NaN or +inf; greedy (argmax, ties to the lower id) when the temperature
// is not > 0; else sample_scaled of x / T (sample_math::scale_logit). −1 when every value is −inf.
int32_t sample_row(const float* x, int64_t N, const SampleSpec& spec);

}  // namespace deepinfer
