#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/sample_math.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Strict order of the candidate lists: value desc, then id asc. Values are never NaN here.
struct ByValueThenId {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

}  // namespace

std::vector<int32_t> filter_candidates(const float* scaled, int vocab, int top_k, float top_p, float min_p) {
  std::vector<int32_t> ids;  // id order until the final sort
  for (int32_t i = 0; i < vocab; ++i)
    if (scaled[i] > kNegInf) ids.push_back(i);
  if (ids.empty()) return ids;
  const ByValueThenId better{scaled};
  if (top_k > 0 && (size_t)top_k < ids.size()) {
    std::nth_element(ids.begin(), ids.begin() + top_k, ids.end(), better);
    ids.resize(top_k);
  }
  const bool use_top_p = top_p < 1.0f && ids.size() > 1;
  if (!use_top_p && !(min_p > 0.0f)) {
    std::sort(ids.begin(), ids.end(), better);
    return ids;
  }
  float m = kNegInf;
  for (int32_t id : ids) m = std::max(m, scaled[id]);
  auto q = [&](int32_t id) { return sampling::mass_of(sampling::rel_of(scaled[id], m)); };
  if (use_top_p) {
    // The top-k set's mass (integers: the order of the sum does not matter), then the walk over the tokens
    // with mass in order: keep a token while the mass ranked before it is ≤ the limit (a prefix: that mass
    // only grows; tokens without mass add nothing to it and are never kept). The best token (q = 2^32) stays.
    uint64_t Z = 0;
    for (int32_t id : ids) Z += q(id);
    std::erase_if(ids, [&](int32_t id) { return q(id) == 0; });
    std::sort(ids.begin(), ids.end(), better);
    const int64_t limit = sampling::top_p_limit(top_p, Z);
    uint64_t before = 0;
    size_t keep = 0;
    while (keep < ids.size() && (int64_t)before <= limit) before += q(ids[keep++]);
    ids.resize(std::max<size_t>(keep, 1));
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  // min-p, per token (rel ≥ min_p), after top-p (so the mass before a token counts every token ranked before
  // it, as the CUDA sampler counts it): the best token (rel = 1) stays.
  if (min_p > 0.0f)
    std::erase_if(ids, [&](int32_t id) { return !(sampling::rel_of(scaled[id], m) >= (double)min_p); });
  return ids;
}

float gumbel_noise(uint64_t key, uint64_t position, int32_t token) {
  return sampling::gumbel_from_word(philox_token_word(key, position, RngStream::kSample, (uint32_t)token));
}

int32_t sample_scaled(const float* scaled, int vocab, int top_k, float top_p, float min_p, uint64_t key,
                      uint64_t position) {
  int32_t token = -1;
  float best = kNegInf;
  auto consider = [&](int32_t id, float score) {
    if (token < 0 || score > best || (score == best && id < token)) best = score, token = id;
  };
  // The noise never exceeds 16.64, and float rounding is monotone, so a token whose value + 17 is below
  // the best score so far can neither win nor tie: its noise is not drawn. Exact, not an approximation;
  // seeding with the top value makes it bite early.
  constexpr float kNoiseBound = 17.0f;
  const bool filtered = (top_k > 0 && top_k < vocab) || top_p < 1.0f || min_p > 0.0f;
  if (filtered) {
    for (int32_t id : filter_candidates(scaled, vocab, top_k, top_p, min_p)) {
      if (token >= 0 && scaled[id] + kNoiseBound < best) break;  // value-descending: the rest are lower
      consider(id, scaled[id] + gumbel_noise(key, position, id));
    }
    return token;
  }
  int32_t top = -1;
  for (int32_t i = 0; i < vocab; ++i)
    if (scaled[i] > kNegInf && (top < 0 || scaled[i] > scaled[top])) top = i;
  if (top >= 0) consider(top, scaled[top] + gumbel_noise(key, position, top));
  // Whole vocabulary: one Philox call per block of 4 ids.
  PhiloxCounter w{};
  uint32_t block = UINT32_MAX;
  for (int32_t i = 0; i < vocab; ++i) {
    if (!(scaled[i] > kNegInf) || scaled[i] + kNoiseBound < best) continue;
    const uint32_t b = (uint32_t)i >> 2;
    if (b != block) {
      w = philox4x32_10({(uint32_t)position, (uint32_t)RngStream::kSample, b, (uint32_t)(position >> 32)},
                        philox_key(key));
      block = b;
    }
    consider(i, scaled[i] + sampling::gumbel_from_word(w[i & 3]));
  }
  return token;
}

int32_t sample_row(const float* x, int64_t N, const SampleSpec& spec) {
  constexpr float kPosInf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < N; ++i)
    if (std::isnan(x[i]) || x[i] == kPosInf) return -2;
  if (!(spec.temperature > 0.0f)) {
    int32_t best = -1;
    float bv = kNegInf;
    for (int64_t i = 0; i < N; ++i)
      if (x[i] > bv) bv = x[i], best = (int32_t)i;  // strict: equal values keep the lower id
    return best;
  }
  std::vector<float> s((size_t)N);  // [N] scaled logits
  for (int64_t i = 0; i < N; ++i) s[i] = sampling::scale_logit(x[i], spec.temperature);
  return sample_scaled(s.data(), (int)N, spec.top_k, spec.top_p, spec.min_p, spec.key, spec.position);
}

}  // namespace deepinfer
