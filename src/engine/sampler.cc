#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>

#include "ops/sampling.h"
#include "ops/sample_math.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

bool has_logit_processors(const SamplingParams& p, const SequenceSamplingState& state, int64_t pending) {
  return !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
         p.presence_penalty != 0.0f ||
         (state.num_output() + pending < p.min_tokens && !state.min_tokens_masked().empty());
}

RowEdits logit_edits(const SamplingParams& params, const SequenceSamplingState& state, int vocab,
                     std::vector<LogitEdit>& out, bool pending) {
  RowEdits row;
  row.rep = params.repetition_penalty;
  row.freq = params.frequency_penalty;
  row.presence = params.presence_penalty;
  row.first = (int32_t)out.size();
  // Every (id, part) appended, then sorted by id and merged into one edit an id (the prompt's ids, often the
  // most, come sorted and distinct already).
  auto in_range = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  const bool rep = row.rep != 1.0f, counts = row.freq != 0.0f || row.presence != 0.0f;
  for (const auto& [id, bias] : params.logit_bias)
    if (in_range(id)) out.push_back({id, bias, 0, sampling::kEditBias});
  if (rep)
    for (int32_t id : state.prompt_ids())
      if (in_range(id)) out.push_back({id, 0.0f, 0, sampling::kEditRepeat});
  if (rep || counts)
    for (int32_t id : state.output_ids())
      if (in_range(id)) out.push_back({id, 0.0f, counts ? state.output_count(id) : 0, rep ? sampling::kEditRepeat : 0u});
  if (state.num_output() + (pending ? 1 : 0) < params.min_tokens)
    for (int32_t id : state.min_tokens_masked())
      if (in_range(id)) out.push_back({id, 0.0f, 0, sampling::kEditMask});
  const auto first = out.begin() + row.first;
  std::stable_sort(first, out.end(), [](const LogitEdit& a, const LogitEdit& b) { return a.id < b.id; });
  auto w = first;  // merge runs of one id
  for (auto it = first; it != out.end();) {
    LogitEdit e = *it;
    for (++it; it != out.end() && it->id == e.id; ++it) {
      if (it->flags & sampling::kEditBias) e.bias = it->bias;
      e.flags |= it->flags;
      e.count = std::max(e.count, it->count);
    }
    *w++ = e;
  }
  out.erase(w, out.end());
  row.count = (int32_t)(out.size() - (size_t)row.first);
  if (pending) {
    row.pend = 1;  // (the backend's token index is the model's to set)
    out.resize(out.size() + 2, LogitEdit{-1, 0.0f, 0, 0u});
  }
  return row;
}

std::vector<int32_t> filter_candidates(const float* scaled, int vocab, const SamplingParams& params) {
  return filter_candidates(scaled, vocab, params.top_k, params.top_p, params.min_p);
}

int32_t argmax_lowest_id(const float* values, int vocab) {
  int32_t best = -1;
  float bv = kNegInf;
  for (int32_t i = 0; i < vocab; ++i)
    if (values[i] > bv) bv = values[i], best = i;  // strict: equal values keep the lower id
  return best;
}

RawLogprobs raw_logprobs(const float* logits, int vocab, int32_t token, int top_n) {
  // The backends' definition (ops/sampling.h logprob_base: integer masses, exp and log in double), so that a row's
  // logprobs are the same bits whether the host or a backend computed them.
  const LogprobBase b = logprob_base(logits, vocab);
  auto lp = [&](int32_t i) { return b.m > kNegInf ? sampling::logprob_of(logits[i], b.m, b.log_z) : kNegInf; };
  RawLogprobs out;
  out.token_logprob = (token >= 0 && token < vocab) ? lp(token) : kNegInf;
  const std::vector<int32_t> best = top_ids(logits, vocab, top_n);
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
    bool any = false;
    for (int32_t i = 0; i < vocab && !any; ++i) any = (allowed[i >> 5] >> (i & 31)) & 1u;
    if (!any) throw Error("sampler: the structured-output grammar allows no token");
    masked.assign(logits, logits + vocab);
    apply_mask(masked.data(), vocab, allowed);  // the backends' mask (Backend::mask_rows)
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
    // Scale (sample_math.h: an overflow becomes FLT_MAX, an unvalidated NaN −inf), then draw: the CPU
    // backend's and the CUDA sampler's sample_rows run the same two steps.
    for (float& x : work) x = sampling::scale_logit(x, t);
    r.token = sample_scaled(work.data(), vocab, params.top_k, params.top_p, params.min_p, state.rng_key(), position);
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
