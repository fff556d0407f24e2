#include "ops/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
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

// Which tokens can still win the Gumbel draw, without their noise. The noise is increasing in the Philox word
// and never exceeds 16.64, so a token with fl(s + 17) < best (the best score so far) cannot win or tie (float
// rounding is monotone). Likewise, a word below min_word_[k] gives noise < k (its uniform is 16 steps below
// the uniform of noise k: a margin far above det_log's error), so a token with fl(s + k) < best and such a
// word cannot reach best either. Both tests only skip tokens that lose, so the token drawn is the one every
// noise computed would give; most tokens skip the two logs.
class NoiseBound {
 public:
  NoiseBound() {
    for (int k = 0; k <= 16; ++k) {
      const double u = std::exp(-std::exp(-(double)k));           // the uniform of noise k
      const double w = std::floor(u * 8388608.0 - 0.5) - 16.0;    // philox_uniform: u = ((w >> 9) + 0.5) / 2^23
      min_word_[k] = w <= 0 ? 0u : (uint32_t)w << 9;
    }
  }
  // Can a token with value s beat or tie `best` (none yet: have_best false)?
  bool may_win_value(float s, float best, bool have_best) const { return !have_best || !(s + 17.0f < best); }
  // The same, given its Philox word.
  bool may_win(float s, float best, bool have_best, uint32_t word) const {
    if (!have_best) return true;
    if (s + 17.0f < best) return false;
    const float need = best - s;
    int k = need >= 16.0f ? 16 : need >= 0.0f ? (int)need : -1;
    while (k >= 0 && !(s + (float)k < best)) --k;  // the largest k with fl(s + k) < best
    return k < 0 || word >= min_word_[k];
  }

 private:
  std::array<uint32_t, 17> min_word_{};
};

const NoiseBound& noise_bound() {
  static const NoiseBound nb;  // a table of constants, computed once
  return nb;
}

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
  if (use_top_p) {
    // The top-k set's mass (integers: the order of the sum does not matter), and its tokens with mass.
    std::vector<std::pair<int32_t, uint64_t>> massive;  // (id, q), q > 0
    massive.reserve(ids.size());
    uint64_t Z = 0;
    for (int32_t id : ids)
      if (const uint64_t q = sampling::mass_of(sampling::rel_of(scaled[id], m)); q > 0) massive.push_back({id, q}), Z += q;
    const int64_t limit = sampling::top_p_limit(top_p, Z);
    // Keep a token with mass while the mass ranked before it is ≤ the limit (a prefix of the order: that mass
    // only grows; tokens without mass add nothing to it and are never kept; the best token, q = 2^32, stays).
    // Only the head of the order up to the cut matters. Bins of d = m − s, 1/16 wide (the CUDA sampler's: d is
    // monotone in s, so a run of bins is a prefix of the order): the cut lies in the last bin whose mass before
    // it is ≤ the limit, so the head is that bin and the bins before it, and only the head is sorted.
    constexpr int kBins = 384;  // d < 24 (a token with mass has d < 22.2)
    std::array<uint64_t, kBins> bin_mass{};
    std::vector<uint16_t> bin_of(massive.size());
    for (size_t j = 0; j < massive.size(); ++j) {
      const float d = sampling::f_sub(m, scaled[massive[j].first]);
      bin_of[j] = (uint16_t)std::min(kBins - 1, (int)(d * 16.0f));
      bin_mass[bin_of[j]] += massive[j].second;
    }
    int cut = 0;  // the last bin with mass whose mass before it is ≤ the limit
    uint64_t E = 0;
    for (int b = 0; b < kBins; ++b) {
      if (bin_mass[b] == 0) continue;
      if ((int64_t)E > limit) break;
      cut = b;
      E += bin_mass[b];
    }
    std::vector<std::pair<int32_t, uint64_t>> head;
    for (size_t j = 0; j < massive.size(); ++j)
      if (bin_of[j] <= cut) head.push_back(massive[j]);
    std::sort(head.begin(), head.end(), [&](const auto& a, const auto& b) { return better(a.first, b.first); });
    uint64_t before = 0;
    size_t keep = 0;
    while (keep < head.size() && (int64_t)before <= limit) before += head[keep++].second;
    ids.clear();
    for (size_t i = 0; i < std::max<size_t>(keep, 1); ++i) ids.push_back(head[i].first);
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  // min-p, per token (rel ≥ min_p), after top-p (so the mass before a token counts every token ranked before
  // it, as the CUDA sampler counts it): the best token (rel = 1) stays.
  if (min_p > 0.0f) std::erase_if(ids, [&](int32_t id) { return !(sampling::rel_of(scaled[id], m) >= min_p); });
  return ids;
}

void apply_edits(float* x, int64_t N, const RowEdits& row, const LogitEdit* edits, float* raw, const int32_t* tokens) {
  const int32_t t = row.pend > 0 && tokens ? tokens[row.pend - 1] : -1;
  const int32_t jt = t >= 0 && t < N ? sampling::find_id(edits, row.first, row.count, t) : -1;  // the pending token's entry
  auto edit_one = [&](int32_t id, LogitEdit e, int32_t slot) {
    const float v = x[id];
    if (raw) raw[row.first + slot] = v;
    if (!(v != v) && v != std::numeric_limits<float>::infinity())
      x[id] = sampling::edit_logit(v, e.flags, e.bias, e.count, row.rep, row.freq, row.presence);
  };
  for (int32_t j = 0; j < row.count; ++j) {
    const LogitEdit& e = edits[row.first + j];
    if (e.id < 0 || e.id >= N || j == jt) continue;
    edit_one(e.id, e, j);
  }
  if (row.pend > 0 && raw) {  // the id of a pending token without an entry, for restoring the raw row
    const int32_t id = t >= 0 && t < N && jt < 0 ? t : -1;
    std::memcpy(&raw[row.first + row.count + 1], &id, 4);
  }
  if (t >= 0 && t < N) {
    LogitEdit e = jt >= 0 ? edits[row.first + jt] : LogitEdit{t, 0.0f, 0, 0u};
    sampling::pending_edit(e.flags, e.count, row.rep, row.freq, row.presence);
    edit_one(t, e, jt >= 0 ? jt : row.count);
  }
}

void apply_mask(float* x, int64_t N, const uint32_t* allowed) {
  for (int64_t i = 0; i < N; ++i)
    if (!((allowed[i >> 5] >> (i & 31)) & 1u) && !std::isnan(x[i]) && x[i] != std::numeric_limits<float>::infinity())
      x[i] = kNegInf;
}

void restore_edits(float* x, int64_t N, const RowEdits& row, const LogitEdit* edits, const float* raw) {
  for (int32_t j = 0; j < row.count; ++j) {
    const int32_t id = edits[row.first + j].id;
    if (id >= 0 && id < N) x[id] = raw[row.first + j];
  }
  if (row.pend > 0) {  // a pending token without an entry: its id's bits after its value
    int32_t id;
    std::memcpy(&id, &raw[row.first + row.count + 1], 4);
    if (id >= 0 && id < N) x[id] = raw[row.first + row.count];
  }
}

LogprobBase logprob_base(const float* x, int64_t N) {
  LogprobBase b;
  for (int64_t i = 0; i < N; ++i)
    if (x[i] > b.m) b.m = x[i];  // (NaN never compares greater)
  if (!(b.m > kNegInf)) return b;
  const int shift = sampling::lp_shift(N);
  uint64_t Z = 0;
  for (int64_t i = 0; i < N; ++i)
    if (x[i] > kNegInf) Z += sampling::lp_mass(x[i], b.m, shift);
  b.log_z = sampling::lp_log_z(Z, shift);
  return b;
}

std::vector<int32_t> top_ids(const float* x, int64_t N, int n) {
  auto val = [x](int64_t i) { return std::isnan(x[i]) ? kNegInf : x[i]; };
  // A running list by (value desc, id asc); ids arrive ascending, so a later id only displaces an entry with a
  // strictly smaller value.
  std::vector<int32_t> best;
  const size_t k = (size_t)std::max<int64_t>(0, std::min<int64_t>(n, N));
  if (k == 0) return best;
  best.reserve(k + 1);
  for (int64_t i = 0; i < N; ++i) {
    const float v = val(i);
    if (best.size() == k && !(v > val(best.back()))) continue;
    auto pos = std::find_if(best.begin(), best.end(), [&](int32_t e) { return v > val(e); });
    best.insert(pos, (int32_t)i);
    if (best.size() > k) best.pop_back();
  }
  return best;
}

void row_logprobs(const float* x, int64_t N, int32_t token, int top_n, RowLogprobs& out) {
  const LogprobBase b = logprob_base(x, N);
  auto lp = [&](int64_t i) { return b.m > kNegInf ? sampling::logprob_of(x[i], b.m, b.log_z) : kNegInf; };
  out.token = token >= 0 && token < N ? lp(token) : kNegInf;
  const std::vector<int32_t> ids = top_ids(x, N, std::min(top_n, kMaxLogprobs));
  out.n = (int32_t)ids.size();
  for (size_t j = 0; j < ids.size(); ++j) out.ids[j] = ids[j], out.lps[j] = lp(ids[j]);
}

float gumbel_noise(uint64_t key, uint64_t position, int32_t token) {
  return sampling::gumbel_from_word(philox_token_word(key, position, RngStream::kSample, (uint32_t)token));
}

int32_t sample_scaled(const float* scaled, int vocab, int top_k, float top_p, float min_p, uint64_t key,
                      uint64_t position) {
  const NoiseBound& nb = noise_bound();
  int32_t token = -1;
  float best = kNegInf;
  auto consider = [&](int32_t id, uint32_t word) {
    if (!nb.may_win(scaled[id], best, token >= 0, word)) return;
    const float score = scaled[id] + sampling::gumbel_from_word(word);
    if (token < 0 || score > best || (score == best && id < token)) best = score, token = id;
  };
  auto word_of = [&](int32_t id) { return philox_token_word(key, position, RngStream::kSample, (uint32_t)id); };
  const bool filtered = (top_k > 0 && top_k < vocab) || top_p < 1.0f || min_p > 0.0f;
  if (filtered) {
    const std::vector<int32_t> ids = filter_candidates(scaled, vocab, top_k, top_p, min_p);
    const float m = ids.empty() ? kNegInf : scaled[ids[0]];  // the row's max: the best token always stays
    for (int32_t id : ids) {
      // value-descending: the rest are lower (and farther from m: the float difference is monotone)
      if (!nb.may_win_value(scaled[id], best, token >= 0) || !(sampling::f_sub(m, scaled[id]) < sampling::kReach))
        break;
      consider(id, word_of(id));
    }
    return token;
  }
  int32_t top = -1;  // seeding with the top value makes the bounds bite early
  for (int32_t i = 0; i < vocab; ++i)
    if (scaled[i] > kNegInf && (top < 0 || scaled[i] > scaled[top])) top = i;
  if (top < 0) return -1;
  consider(top, word_of(top));
  // Whole vocabulary: one Philox call per block of 4 ids.
  PhiloxCounter w{};
  uint32_t block = UINT32_MAX;
  for (int32_t i = 0; i < vocab; ++i) {
    if (!(scaled[i] > kNegInf) || !nb.may_win_value(scaled[i], best, true) ||
        !(sampling::f_sub(scaled[top], scaled[i]) < sampling::kReach))
      continue;
    const uint32_t b = (uint32_t)i >> 2;
    if (b != block) {
      w = philox4x32_10({(uint32_t)position, (uint32_t)RngStream::kSample, b, (uint32_t)(position >> 32)},
                        philox_key(key));
      block = b;
    }
    consider(i, w[i & 3]);
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
