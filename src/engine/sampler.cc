#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "engine/philox.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The one definition of the noise, shared by gumbel_noise and the blocked loop in sample_one so
// both give bit-identical values.
inline float gumbel_from_word(uint32_t word) { return -std::log(-std::log(philox_uniform(word))); }

// Strict order of the candidate lists: value desc, then id asc. Values are never NaN here.
struct ByValueThenId {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

}  // namespace

SequenceSamplingState::SequenceSamplingState(std::span<const int32_t> prompt, uint64_t request_seed,
                                             uint32_t choice_index, std::vector<int32_t> min_tokens_masked)
    : prompt_ids_(prompt.begin(), prompt.end()),
      min_tokens_masked_(std::move(min_tokens_masked)),
      prompt_len_((int64_t)prompt.size()),
      seed_(request_seed),
      key_(choice_key(request_seed, choice_index)),
      choice_index_(choice_index) {
  std::sort(prompt_ids_.begin(), prompt_ids_.end());
  prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
}

void SequenceSamplingState::on_token(int32_t id) {
  int32_t& c = output_counts_[id];
  if (c == 0) output_ids_.push_back(id);
  ++c;
  ++num_output_;
}

bool SequenceSamplingState::in_prompt(int32_t id) const {
  return std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id);
}

int32_t SequenceSamplingState::output_count(int32_t id) const {
  auto it = output_counts_.find(id);
  return it == output_counts_.end() ? 0 : it->second;
}

void apply_logit_processors(float* logits, int vocab, const SamplingParams& params,
                            const SequenceSamplingState& state) {
  auto in_range = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  for (const auto& [id, bias] : params.logit_bias)
    if (in_range(id)) logits[id] += bias;

  const float r = params.repetition_penalty;
  if (r != 1.0f) {
    // Divide positive logits, multiply the others: both make a seen token less likely.
    auto penalize = [&](int32_t id) {
      float& x = logits[id];
      x = x > 0.0f ? x / r : x * r;
    };
    for (int32_t id : state.prompt_ids())
      if (in_range(id)) penalize(id);
    for (int32_t id : state.output_ids())
      if (in_range(id) && !state.in_prompt(id)) penalize(id);  // once per token, prompt or output
  }

  const float f = params.frequency_penalty, p = params.presence_penalty;
  if (f != 0.0f || p != 0.0f) {
    for (int32_t id : state.output_ids()) {
      if (!in_range(id)) continue;
      logits[id] -= f * (float)state.output_count(id);
      logits[id] -= p;  // every listed id occurred at least once
    }
  }

  if (state.num_output() < params.min_tokens)
    for (int32_t id : state.min_tokens_masked())
      if (in_range(id)) logits[id] = kNegInf;
}

std::vector<int32_t> filter_candidates(const float* scaled, int vocab, const SamplingParams& params) {
  std::vector<int32_t> ids;  // ascending id order until the final sort
  for (int32_t i = 0; i < vocab; ++i)
    if (scaled[i] > kNegInf) ids.push_back(i);
  if (ids.empty()) return ids;
  const ByValueThenId better{scaled};

  if (params.top_k > 0 && (size_t)params.top_k < ids.size()) {
    std::nth_element(ids.begin(), ids.begin() + params.top_k, ids.end(), better);
    ids.resize(params.top_k);
    std::sort(ids.begin(), ids.end());  // back to id order: the sums below run in id order
  }
  const bool use_top_p = params.top_p < 1.0f && ids.size() > 1;
  if (!use_top_p && !(params.min_p > 0.0f)) {
    std::sort(ids.begin(), ids.end(), better);
    return ids;
  }
  double m = -std::numeric_limits<double>::infinity();
  for (int32_t id : ids) m = std::max(m, (double)scaled[id]);
  std::vector<double> rel_of(vocab, 0.0);  // [vocab] p_i / p_max = exp(s_i - s_max), once per id
  for (int32_t id : ids) rel_of[id] = std::exp((double)scaled[id] - m);
  auto rel = [&](int32_t id) { return rel_of[id]; };

  // Mass of the top-k set (renormalised distribution), before min-p removes anything.
  double limit = 0.0;
  if (use_top_p) {
    double z = 0.0;
    for (int32_t id : ids) z += rel(id);
    limit = (double)params.top_p * z;
  }
  // min-p keeps p_i >= min_p * p_max: a value threshold, so it needs no sort. It keeps a prefix of
  // the (value desc, id asc) order, as top-p does, so applying it first gives the same set as
  // applying it after top-p.
  if (params.min_p > 0.0f)
    std::erase_if(ids, [&](int32_t id) { return !(rel(id) >= (double)params.min_p); });

  if (!use_top_p) {
    std::sort(ids.begin(), ids.end(), better);
    return ids;
  }
  // top-p keeps a token while the mass ranked strictly before it is < limit. Only the head of the
  // order matters, so sort the tokens within `delta` of the max, widening delta until their mass
  // reaches the limit. The walk sees the same tokens in the same order as a full sort would, so the
  // result does not depend on where the ladder stopped.
  for (double delta = 1.0;; delta *= 2.0) {
    const bool all = delta > 128.0;
    std::vector<int32_t> head;
    double mass = 0.0;
    for (int32_t id : ids)
      if (all || (double)scaled[id] >= m - delta) head.push_back(id), mass += rel(id);
    if (!all && head.size() < ids.size() && mass < limit) continue;
    std::sort(head.begin(), head.end(), better);
    double before = 0.0;
    size_t keep = 0;
    while (keep < head.size() && before < limit) before += rel(head[keep++]);
    // Exhausting a partial head (its sorted sum can round below the id-order sum) means the prefix
    // may continue past it: widen.
    if (keep == head.size() && before < limit && head.size() < ids.size()) continue;
    head.resize(std::max<size_t>(keep, 1));
    return head;
  }
}

float gumbel_noise(uint64_t key, uint64_t position, int32_t token) {
  return gumbel_from_word(philox_token_word(key, position, RngStream::kSample, (uint32_t)token));
}

int32_t argmax_lowest_id(const float* values, int vocab) {
  int32_t best = -1;
  float bv = kNegInf;
  for (int32_t i = 0; i < vocab; ++i)
    if (values[i] > bv) bv = values[i], best = i;  // strict: equal values keep the lower id
  return best;
}

RawLogprobs raw_logprobs(const float* logits, int vocab, int32_t token, int top_n) {
  auto val = [logits](int32_t i) { return std::isnan(logits[i]) ? kNegInf : logits[i]; };
  double m = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < vocab; ++i) m = std::max(m, (double)val(i));
  // lse = m + log(sum exp(x - m)); logprob = (x - m) - log(sum), which keeps the small terms exact.
  double log_z = 0.0;
  if (std::isfinite(m)) {
    double z = 0.0;
    for (int32_t i = 0; i < vocab; ++i) z += std::exp((double)val(i) - m);
    log_z = std::log(z);
  }
  auto lp = [&](int32_t i) -> float {
    if (!std::isfinite(m) || val(i) == kNegInf) return kNegInf;
    return (float)(((double)val(i) - m) - log_z);
  };

  RawLogprobs out;
  out.token_logprob = (token >= 0 && token < vocab) ? lp(token) : kNegInf;
  // Running top-n by (value desc, id asc); ids arrive ascending, so a later id only displaces an
  // entry with a strictly smaller value.
  std::vector<int32_t> best;
  const size_t n = (size_t)std::max(0, std::min(top_n, vocab));
  if (n > 0) {
    best.reserve(n + 1);
    for (int32_t i = 0; i < vocab; ++i) {
      const float x = val(i);
      if (best.size() == n && !(x > val(best.back()))) continue;
      auto pos = std::find_if(best.begin(), best.end(), [&](int32_t e) { return x > val(e); });
      best.insert(pos, i);
      if (best.size() > n) best.pop_back();
    }
  }
  out.top.reserve(best.size());
  for (int32_t id : best) out.top.push_back({id, lp(id)});
  return out;
}

SampleResult sample_one(const float* logits, int vocab, const SamplingParams& params,
                        const SequenceSamplingState& state, uint64_t position, const uint32_t* allowed) {
  if (vocab < 1 || logits == nullptr) throw Error("sampler: empty logits row");
  constexpr float kPosInf = std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]) || logits[i] == kPosInf)
      throw Error("sampler: logits contain " + std::string(std::isnan(logits[i]) ? "NaN" : "+inf") +
                  " at token " + std::to_string(i));

  // The structured-output mask comes first: `masked` [vocab] is what the rest of the pipeline and
  // the logprobs see (vLLM masks the logits before its sampler).
  std::vector<float> masked;
  if (allowed) {
    masked.assign(logits, logits + vocab);
    bool any = false;
    for (int32_t i = 0; i < vocab; ++i) {
      if ((allowed[i >> 5] >> (i & 31)) & 1u) any = true;
      else masked[i] = kNegInf;
    }
    if (!any) throw Error("sampler: the structured-output grammar allows no token");
    logits = masked.data();
  }

  std::vector<float> work(logits, logits + vocab);  // [vocab] processed logits
  apply_logit_processors(work.data(), vocab, params, state);
  if (allowed && argmax_lowest_id(work.data(), vocab) < 0) {
    // min_tokens masked every token the grammar allows (it can only end): the grammar wins.
    SamplingParams relaxed = params;
    relaxed.min_tokens = 0;
    work.assign(logits, logits + vocab);
    apply_logit_processors(work.data(), vocab, relaxed, state);
  }

  SampleResult r;
  const float t = effective_temperature(params.temperature);
  if (!(t > 0.0f)) {
    r.token = argmax_lowest_id(work.data(), vocab);  // greedy (also catches an unvalidated NaN T)
  } else {
    // Scale; an overflow (x / r / T beyond FLT_MAX) becomes FLT_MAX and an unvalidated NaN becomes
    // -inf, so the sums and sorts below always see ordered, finite-or-(-inf) values.
    for (float& x : work) {
      x /= t;
      if (std::isnan(x)) x = kNegInf;
      else if (x == kPosInf) x = std::numeric_limits<float>::max();
    }
    const uint64_t key = state.rng_key();
    float best = kNegInf;
    auto consider = [&](int32_t id, float score) {
      if (r.token < 0 || score > best || (score == best && id < r.token)) best = score, r.token = id;
    };
    // The noise never exceeds -log(-log(1 - 2^-24)) = 16.64, and float rounding is monotone, so a
    // token whose value + 17 is below the best score so far can neither win nor tie: its noise is
    // not drawn. Exact, not an approximation; seeding with the top value makes it bite early.
    constexpr float kNoiseBound = 17.0f;
    const bool filtered = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0f || params.min_p > 0.0f;
    if (filtered) {
      for (int32_t id : filter_candidates(work.data(), vocab, params)) {
        if (r.token >= 0 && work[id] + kNoiseBound < best) break;  // value-descending: the rest are lower
        consider(id, work[id] + gumbel_noise(key, position, id));
      }
    } else {
      const int32_t top = argmax_lowest_id(work.data(), vocab);
      if (top >= 0) consider(top, work[top] + gumbel_noise(key, position, top));
      // Whole vocabulary: one Philox call per block of 4 ids.
      PhiloxCounter w{};
      uint32_t block = UINT32_MAX;
      for (int32_t i = 0; i < vocab; ++i) {
        if (!(work[i] > kNegInf) || work[i] + kNoiseBound < best) continue;
        const uint32_t b = (uint32_t)i >> 2;
        if (b != block) {
          w = philox4x32_10({(uint32_t)position, (uint32_t)RngStream::kSample, b, (uint32_t)(position >> 32)},
                            philox_key(key));
          block = b;
        }
        consider(i, work[i] + gumbel_from_word(w[i & 3]));
      }
    }
  }
  if (r.token < 0) throw Error("sampler: every token is masked (all logits are -inf after processing)");

  if (params.logprobs) {
    RawLogprobs lp = raw_logprobs(logits, vocab, r.token, *params.logprobs);
    r.logprob = lp.token_logprob;
    r.top_logprobs = std::move(lp.top);
  }
  return r;
}

std::vector<SampleResult> sample_batch(std::span<const SampleRow> rows, int vocab, ThreadPool* pool) {
  std::vector<SampleResult> out(rows.size());
  // Each row is computed start to finish by one thread with no shared state, so the split of rows
  // over threads cannot change any result. Errors stay in their row (a throw inside a pool worker
  // would terminate the process).
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const SampleRow& row = rows[i];
      try {
        if (!row.logits || !row.params || !row.state) throw Error("sampler: incomplete batch row");
        out[i] = sample_one(row.logits, vocab, *row.params, *row.state, row.position, row.allowed);
      } catch (const std::exception& e) {
        out[i] = SampleResult{};
        out[i].error = e.what();
      }
    }
  };
  if (pool && rows.size() > 1) pool->parallel_for((int64_t)rows.size(), run, 1);
  else run(0, (int64_t)rows.size());
  return out;
}

}  // namespace deepinfer
