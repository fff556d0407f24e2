// The CPU sampler: Philox known answers, greedy / top-k / top-p / min-p rules, penalties and bias
// against hand-derived values, logprobs against an independent double log-softmax, sampling
// frequencies (chi-square), and batch-independent determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "util/philox.h"
#include "ops/sample_math.h"
#include "engine/sampler.h"
#include "ops/cpu/cpu_backend.h"
#include "engine/stop_matcher.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(vocab);
  for (float& x : v) x = d(rng);
  return v;
}

SamplingParams sampled(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

// ---------------------------------------------------------------- Philox

TEST(Philox, PublishedKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 from the Random123 distribution (counter, key -> output).
  struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(philox4x32_10(k.ctr, k.key), k.out);
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u, "usable at compile time (GPU constants)");
}

TEST(Philox, UniformIsStrictlyInsideUnitInterval) {
  EXPECT_GT(philox_uniform(0), 0.0f);
  EXPECT_LT(philox_uniform(0xffffffffu), 1.0f);
  EXPECT_FLOAT_EQ(philox_uniform(0x80000000u), 0.5f + 0.5f / 8388608.0f);
}

TEST(Philox, ChoiceKeysAndTokenWords) {
  EXPECT_EQ(choice_key(1234, 0), 1234u);
  std::set<uint64_t> keys;
  for (uint32_t i = 0; i < 16; ++i) keys.insert(choice_key(1234, i));
  EXPECT_EQ(keys.size(), 16u);
  // The word for token t is word t & 3 of the block t >> 2, with position split over words 0 and 3.
  const uint64_t key = 0x0123456789abcdefULL, pos = (7ULL << 32) | 99;
  const PhiloxCounter w = philox4x32_10({99, 0, 10, 7}, philox_key(key));
  for (uint32_t t = 40; t < 44; ++t) EXPECT_EQ(philox_token_word(key, pos, RngStream::kSample, t), w[t & 3]);
  EXPECT_NE(philox_token_word(key, pos, RngStream::kSample, 40), philox_token_word(key, pos, RngStream::kDraft, 40));
}

// ---------------------------------------------------------------- greedy / top-k

TEST(Sampler, GreedyPicksArgmaxWithTiesToLowerId) {
  for (uint32_t s = 0; s < 20; ++s) {
    auto logits = random_logits(3000, s);
    const int32_t expect = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SequenceSamplingState st({}, s, 0);
    EXPECT_EQ(sample_one(logits.data(), 3000, sampled(0.0f), st, s).token, expect);
  }
  std::vector<float> tied = {0.0f, 1.0f, 3.0f, -1.0f, 3.0f, 3.0f};
  SequenceSamplingState st({}, 1, 0);
  EXPECT_EQ(sample_one(tied.data(), 6, sampled(0.0f), st, 0).token, 2);
  // top-k = 1 with ties: the lower id is the single candidate as well.
  SamplingParams k1 = sampled(1.0f);
  k1.top_k = 1;
  for (uint64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_one(tied.data(), 6, k1, st, pos).token, 2);
}

TEST(Sampler, TopK1EqualsGreedy) {
  for (uint32_t s = 0; s < 40; ++s) {
    auto logits = random_logits(5000, 100 + s, 1.0f);
    SamplingParams p = sampled(1.5f);
    p.top_k = 1;
    SequenceSamplingState st(std::vector<int32_t>{1, 2, 3}, s, 0);
    const int32_t greedy = sample_one(logits.data(), 5000, sampled(0.0f), st, s).token;
    EXPECT_EQ(sample_one(logits.data(), 5000, p, st, s).token, greedy);
  }
}

// ---------------------------------------------------------------- candidate filters

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> v;
  for (double p : probs) v.push_back((float)std::log(p));
  return v;
}

TEST(Sampler, TopPBoundaries) {
  const auto s = log_of({0.5, 0.3, 0.15, 0.05});
  auto kept = [&](float top_p, int top_k = 0) {
    SamplingParams p;
    p.top_p = top_p;
    p.top_k = top_k;
    return filter_candidates(s.data(), 4, p);
  };
  // A token is kept while the mass ranked before it is below top_p.
  EXPECT_EQ(kept(0.01f), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(0.49f), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(0.51f), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept(0.79f), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept(0.81f), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept(0.94f), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept(0.96f), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(kept(1.0f), (std::vector<int32_t>{0, 1, 2, 3}));
  // top-p acts on the top-k renormalised distribution: [0.5, 0.3, 0.15] / 0.95 puts 0.842 before
  // token 2, against 0.8 without top-k.
  EXPECT_EQ(kept(0.83f, 3), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept(0.83f, 0), (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampler, MinPBoundariesAndOrder) {
  const auto s = log_of({0.4, 0.2, 0.1, 0.3});  // ratios to the max: 1, 0.5, 0.25, 0.75
  auto kept = [&](float min_p) {
    SamplingParams p;
    p.min_p = min_p;
    return filter_candidates(s.data(), 4, p);
  };
  EXPECT_EQ(kept(0.0f), (std::vector<int32_t>{0, 3, 1, 2}));  // off: all, value desc
  EXPECT_EQ(kept(0.24f), (std::vector<int32_t>{0, 3, 1, 2}));
  EXPECT_EQ(kept(0.26f), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(kept(0.49f), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(kept(0.51f), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(kept(0.76f), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(1.0f), (std::vector<int32_t>{0}));
  // min_p = 1 keeps every token tied with the max; ties ordered by id.
  const std::vector<float> tied = {1.0f, 0.0f, 1.0f, kNegInf};
  SamplingParams p;
  p.min_p = 1.0f;
  EXPECT_EQ(filter_candidates(tied.data(), 4, p), (std::vector<int32_t>{0, 2}));
  // -inf is never a candidate; top-k larger than the finite set keeps the finite set.
  SamplingParams k;
  k.top_k = 10;
  EXPECT_EQ(filter_candidates(tied.data(), 4, k), (std::vector<int32_t>{0, 2, 1}));
  // And through the sampler: with min_p = 0.51 only tokens 0 and 3 ever come out.
  SamplingParams mp = sampled(1.0f);
  mp.min_p = 0.51f;
  SequenceSamplingState st({}, 77, 0);
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 400; ++pos) seen.insert(sample_one(s.data(), 4, mp, st, pos).token);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 3}));
}

// ---------------------------------------------------------------- penalties and bias

TEST(Sampler, PenaltiesAndBiasFollowTheFormulas) {
  // logits:          0     1     2    3    4     5     6    7
  std::vector<float> x = {2.0f, -1.5f, 3.0f, 0.0f, 1.0f, -2.0f, 4.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.logit_bias = {{0, 2.0f}, {4, 1.5f}, {5, -0.5f}};
  SequenceSamplingState st(std::vector<int32_t>{0, 1, 1}, 5, 0);  // prompt {0, 1}
  for (int32_t t : {2, 2, 3, 1}) st.on_token(t);                  // output counts: 2:2, 3:1, 1:1
  apply_logit_processors(x.data(), 8, p, st);
  // 0: bias first, then repetition: (2 + 2) / 2 (bias after repetition would give 3)
  // 1: prompt and output, penalised once: -1.5 * 2 = -3; then -0.5 * 1 - 0.25
  // 2: 3 / 2 = 1.5; then -0.5 * 2 - 0.25
  // 3: 0 is not positive: 0 * 2 = 0; then -0.5 - 0.25
  // 4, 5: bias only; 6, 7 unchanged
  const std::vector<float> expect = {2.0f, -3.75f, 0.25f, -0.75f, 2.5f, -2.5f, 4.0f, 0.5f};
  EXPECT_EQ(x, expect);

  // Repetition penalty below 1 favours seen tokens, with the same sign rule.
  std::vector<float> y = {2.0f, -2.0f, 1.0f};
  SamplingParams q;
  q.repetition_penalty = 0.5f;
  SequenceSamplingState st2(std::vector<int32_t>{0, 1}, 5, 0);
  apply_logit_processors(y.data(), 3, q, st2);
  EXPECT_EQ(y, (std::vector<float>{4.0f, -1.0f, 1.0f}));

  // Presence / frequency penalties ignore prompt tokens (OpenAI: output only).
  std::vector<float> z = {1.0f, 1.0f};
  SamplingParams r;
  r.presence_penalty = 1.0f;
  r.frequency_penalty = 1.0f;
  SequenceSamplingState st3(std::vector<int32_t>{0}, 5, 0);
  apply_logit_processors(z.data(), 2, r, st3);
  EXPECT_EQ(z, (std::vector<float>{1.0f, 1.0f}));
}

TEST(Sampler, PenaltiesAndBiasChangeTheChoice) {
  std::vector<float> x = {5.0f, 4.9f, 0.0f};
  SamplingParams p = sampled(0.0f);
  SequenceSamplingState st({}, 1, 0);
  EXPECT_EQ(sample_one(x.data(), 3, p, st, 0).token, 0);
  st.on_token(0);
  p.frequency_penalty = 0.2f;  // 5 - 0.2 = 4.8 < 4.9
  EXPECT_EQ(sample_one(x.data(), 3, p, st, 1).token, 1);
  SamplingParams b = sampled(0.0f);
  b.logit_bias = {{2, 100.0f}};
  EXPECT_EQ(sample_one(x.data(), 3, b, st, 1).token, 2);
  b.logit_bias = {{0, -100.0f}};
  EXPECT_EQ(sample_one(x.data(), 3, b, st, 1).token, 1);
  // Sampled too: a -100 bias takes a token out for any realistic noise.
  auto logits = random_logits(2000, 9, 1.0f);
  SamplingParams s = sampled(1.0f);
  s.logit_bias = {{1234, 100.0f}};
  for (uint64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_one(logits.data(), 2000, s, st, pos).token, 1234);
}

TEST(Sampler, MinTokensMasksEosAndStopTokens) {
  const int32_t eos = 9;
  std::vector<float> x(10, 0.0f);
  x[eos] = 50.0f;
  x[4] = 40.0f;  // a stop token
  x[7] = 30.0f;
  SamplingParams p = sampled(0.0f);
  p.min_tokens = 3;
  p.stop_token_ids = {4};
  const int32_t eos_ids[] = {eos};
  SequenceSamplingState st({}, 1, 0, min_tokens_masked_ids(p, eos_ids));
  EXPECT_EQ(st.min_tokens_masked(), (std::vector<int32_t>{4, eos}));
  for (int i = 0; i < 3; ++i) {
    const int32_t t = sample_one(x.data(), 10, p, st, i).token;
    EXPECT_EQ(t, 7) << "step " << i;
    st.on_token(t);
  }
  EXPECT_EQ(sample_one(x.data(), 10, p, st, 3).token, eos);  // min_tokens reached
  // ignore_eos: EOS is neither a stop nor masked; stop tokens still are.
  p.ignore_eos = true;
  SequenceSamplingState st2({}, 1, 0, min_tokens_masked_ids(p, eos_ids));
  EXPECT_EQ(sample_one(x.data(), 10, p, st2, 0).token, eos);
  EXPECT_EQ(min_tokens_masked_ids(p, eos_ids), (std::vector<int32_t>{4}));
  p.min_tokens = 0;
  EXPECT_TRUE(min_tokens_masked_ids(p, eos_ids).empty());
}

// ---------------------------------------------------------------- logprobs

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  const int vocab = 5000;
  auto logits = random_logits(vocab, 31, 4.0f);
  logits[17] = logits[18] = 20.0f;  // a tie at the top: ids ascending
  logits[100] = kNegInf;
  // Independent reference: long double log-sum-exp.
  long double m = -INFINITY, z = 0;
  for (float v : logits) m = std::max<long double>(m, v);
  for (float v : logits) z += std::exp((long double)v - m);
  const long double lse = m + std::log(z);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

  SamplingParams p = sampled(0.6f);
  p.logprobs = 7;
  p.repetition_penalty = 1.7f;  // processing must not leak into the returned logprobs
  p.top_k = 40;
  SequenceSamplingState st(std::vector<int32_t>{17, 5}, 3, 0);
  for (uint64_t pos = 0; pos < 10; ++pos) {
    SampleResult r = sample_one(logits.data(), vocab, p, st, pos);
    // Float output: allow one float ulp of the reference's magnitude.
    const double ref = (double)((long double)logits[r.token] - lse);
    EXPECT_NEAR(r.logprob, ref, 1.2e-7 * std::max(1.0, std::fabs(ref)));
    ASSERT_EQ(r.top_logprobs.size(), 7u);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token, order[i]);
      const double ref_i = (double)((long double)logits[order[i]] - lse);
      EXPECT_NEAR(r.top_logprobs[i].logprob, ref_i, 1.2e-7 * std::max(1.0, std::fabs(ref_i)));
    }
  }
  EXPECT_EQ(sample_one(logits.data(), vocab, p, st, 0).top_logprobs[0].token, 17);
  // logprobs = 0: only the chosen token's; no logprobs: NaN.
  p.logprobs = 0;
  EXPECT_TRUE(sample_one(logits.data(), vocab, p, st, 0).top_logprobs.empty());
  EXPECT_FALSE(std::isnan(sample_one(logits.data(), vocab, p, st, 0).logprob));
  p.logprobs.reset();
  EXPECT_TRUE(std::isnan(sample_one(logits.data(), vocab, p, st, 0).logprob));
  EXPECT_EQ(raw_logprobs(logits.data(), vocab, 100, 0).token_logprob, kNegInf);
}

// ---------------------------------------------------------------- distribution

// Pearson chi-square of `draws` tokens against probabilities `expect`.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expect, int draws) {
  double c2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expect[i] * draws;
    c2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return c2;
}

std::vector<double> normalise(std::vector<double> w) {
  const double s = std::accumulate(w.begin(), w.end(), 0.0);
  for (double& x : w) x /= s;
  return w;
}

TEST(Sampler, FrequenciesMatchTheDistribution) {
  const std::vector<double> probs = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
  const auto logits = log_of(probs);
  const int k = (int)probs.size(), draws = 20000;
  struct Case {
    const char* name;
    SamplingParams params;
    std::vector<double> expect;
  };
  std::vector<Case> cases;
  cases.push_back({"T=1", sampled(1.0f), probs});
  std::vector<double> sharp, flat;
  for (double p : probs) sharp.push_back(std::pow(p, 1 / 0.5)), flat.push_back(std::pow(p, 1 / 2.0));
  cases.push_back({"T=0.5", sampled(0.5f), normalise(sharp)});
  cases.push_back({"T=2", sampled(2.0f), normalise(flat)});
  SamplingParams tk = sampled(1.0f);
  tk.top_k = 3;
  cases.push_back({"top_k=3", tk, normalise({0.4, 0.25, 0.15, 0, 0, 0})});
  SamplingParams tp = sampled(1.0f);
  tp.top_p = 0.7f;  // 0.4 + 0.25 < 0.7: keeps three
  cases.push_back({"top_p=0.7", tp, normalise({0.4, 0.25, 0.15, 0, 0, 0})});
  SamplingParams mp = sampled(1.0f);
  mp.min_p = 0.2f;  // keeps p >= 0.08
  cases.push_back({"min_p=0.2", mp, normalise({0.4, 0.25, 0.15, 0.1, 0, 0})});

  for (const Case& c : cases) {
    for (uint64_t seed : {1ull, 2ull, 0xdeadbeefull}) {
      std::vector<int> counts(k, 0);
      SequenceSamplingState st({}, seed, 0);
      for (int i = 0; i < draws; ++i) ++counts[sample_one(logits.data(), k, c.params, st, i).token];
      std::vector<int> kept_counts;
      std::vector<double> kept_expect;
      for (int t = 0; t < k; ++t) {
        if (c.expect[t] == 0) {
          EXPECT_EQ(counts[t], 0) << c.name << " token " << t << " is filtered out";
        } else {
          kept_counts.push_back(counts[t]);
          kept_expect.push_back(c.expect[t]);
        }
      }
      // dof <= 5: P(chi2 > 40) < 1e-6, so a correct sampler essentially never fails this, while a
      // wrong noise transform or temperature is off by thousands.
      EXPECT_LT(chi_square(kept_counts, kept_expect, draws), 40.0) << c.name << " seed " << seed;
    }
  }
}

TEST(Sampler, FrequenciesAcrossSeedsAtOnePosition) {
  // The same position under many seeds is also a fair sample (what n > 1 choices rely on).
  const std::vector<double> probs = {0.5, 0.3, 0.2};
  const auto logits = log_of(probs);
  std::vector<int> counts(3, 0);
  const int draws = 20000;
  for (int s = 0; s < draws; ++s) {
    SequenceSamplingState st({}, 7, (uint32_t)s);  // choice s of one request
    ++counts[sample_one(logits.data(), 3, sampled(1.0f), st, 12).token];
  }
  EXPECT_LT(chi_square(counts, probs, draws), 40.0);
}

// ---------------------------------------------------------------- determinism

TEST(Sampler, SameSeedSameTokensDifferentSeedsDiffer) {
  const int vocab = 1000;
  std::vector<float> flat(vocab, 0.0f);
  auto run = [&](uint64_t seed, uint32_t choice) {
    std::vector<int32_t> out;
    SequenceSamplingState st({}, seed, choice);
    for (uint64_t pos = 0; pos < 64; ++pos) out.push_back(sample_one(flat.data(), vocab, sampled(1.0f), st, pos).token);
    return out;
  };
  auto same = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] == b[i];
    return n;
  };
  EXPECT_EQ(run(11, 0), run(11, 0));
  EXPECT_LT(same(run(11, 0), run(12, 0)), 5);  // uniform over 1000: ~0.06 coincidences expected
  EXPECT_LT(same(run(11, 0), run(11, 1)), 5);
  EXPECT_LT(same(run(11, 1), run(11, 2)), 5);
  // Positions differ too (no sequence of identical draws).
  std::set<int32_t> distinct;
  for (int32_t t : run(11, 0)) distinct.insert(t);
  EXPECT_GT(distinct.size(), 50u);
}

TEST(Sampler, FilteredAndFullVocabularyPathsShareTheNoise) {
  // top_k = vocab - 1 removes exactly the -inf token, so both paths see the same candidate set and
  // must pick the same token at every position: the blocked Philox loop equals gumbel_noise().
  const int vocab = 777;
  auto logits = random_logits(vocab, 5, 0.5f);
  logits[300] = kNegInf;
  SamplingParams full = sampled(1.3f), filtered = sampled(1.3f);
  filtered.top_k = vocab - 1;
  SequenceSamplingState st({}, 99, 2);
  for (uint64_t pos = 0; pos < 200; ++pos)
    EXPECT_EQ(sample_one(logits.data(), vocab, full, st, pos).token,
              sample_one(logits.data(), vocab, filtered, st, pos).token)
        << pos;
}

TEST(Sampler, GumbelArgmaxMatchesAnIndependentRecomputation) {
  // The sampled token is argmax(logit / T + noise) over the candidates, recomputed here from the
  // Philox word for every candidate (the sampler skips tokens that cannot win: wide logits make it
  // skip most of them, so this also checks that the skipping is exact).
  const int vocab = 3000;
  for (float scale : {2.0f, 15.0f}) {
    for (int top_k : {0, 50}) {
      auto logits = random_logits(vocab, 8 + (int)scale, scale);
      SamplingParams p = sampled(0.8f);
      p.top_k = top_k;
      std::vector<int32_t> cand(vocab);
      std::iota(cand.begin(), cand.end(), 0);
      if (top_k) {
        std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        cand.resize(top_k);
      }
      SequenceSamplingState st({}, 4242, 0);
      for (uint64_t pos = 0; pos < 100; ++pos) {
        int32_t best = -1;
        double bv = -INFINITY;
        for (int32_t i : cand) {
          const uint32_t w = philox_token_word(st.rng_key(), pos, RngStream::kSample, (uint32_t)i);
          const double u = ((w >> 9) + 0.5) / 8388608.0;
          const double v = logits[i] / 0.8 - std::log(-std::log(u));
          if (v > bv) bv = v, best = i;
        }
        EXPECT_EQ(sample_one(logits.data(), vocab, p, st, pos).token, best) << scale << " " << top_k << " " << pos;
      }
    }
  }
}

// The full-sort definition of the filters, written out plainly (docs/sampling.md): masses are the integers
// q = ⌊exp(s − max) · 2^32⌋ (sample_math.h's det_exp, checked against std::exp below); top-p keeps a token
// with q > 0 while the mass ranked before it is < top_p · Z, Z the top-k set's mass; min-p keeps rel ≥ min_p.
std::vector<int32_t> filters_by_full_sort(const std::vector<float>& s, const SamplingParams& p) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < (int32_t)s.size(); ++i)
    if (s[i] > kNegInf) ids.push_back(i);
  auto better = [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  std::sort(ids.begin(), ids.end(), better);
  if (p.top_k > 0 && (size_t)p.top_k < ids.size()) ids.resize(p.top_k);
  const float m = s[ids[0]];
  auto q = [&](int32_t id) { return sampling::mass_of(sampling::rel_of(s[id], m)); };
  if (p.top_p < 1.0f && ids.size() > 1) {
    uint64_t z = 0;
    for (int32_t id : ids) z += q(id);
    const long double limit = (long double)p.top_p * (long double)z;
    std::vector<int32_t> kept;
    uint64_t before = 0;
    for (int32_t id : ids) {
      if ((long double)before >= limit) break;
      if (q(id) > 0 || kept.empty()) kept.push_back(id);
      before += q(id);
    }
    ids = kept;
  }
  if (p.min_p > 0.0f)
    std::erase_if(ids, [&](int32_t id) { return !(sampling::rel_of(s[id], m) >= (double)p.min_p); });
  return ids;
}

TEST(Sampler, FiltersEqualTheFullSortDefinition) {
  int checked = 0;
  for (uint32_t seed = 0; seed < 60; ++seed) {
    const float scale = 0.05f + 0.5f * (seed % 12);  // from nearly flat to very peaked
    auto s = random_logits(20000, 300 + seed, scale);
    if (seed % 5 == 0) s[seed] = kNegInf;
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.99f, 0.999999f, 1.0f})
      for (int top_k : {0, 7, 5000})
        for (float min_p : {0.0f, 0.01f, 0.3f}) {
          SamplingParams p;
          p.top_p = top_p, p.top_k = top_k, p.min_p = min_p;
          ASSERT_EQ(filter_candidates(s.data(), (int)s.size(), p), filters_by_full_sort(s, p))
              << seed << " " << top_p << " " << top_k << " " << min_p;
          ++checked;
        }
  }
  EXPECT_EQ(checked, 60 * 6 * 3 * 3);
}

TEST(Sampler, BatchResultsIndependentOfOrderSizeAndThreads) {
  const int vocab = 4096;
  const int rows = 32;
  std::vector<std::vector<float>> logits;
  std::vector<SamplingParams> params(rows);
  std::vector<SequenceSamplingState> states;
  std::vector<uint64_t> positions;
  std::mt19937 rng(2024);
  for (int r = 0; r < rows; ++r) {
    logits.push_back(random_logits(vocab, 1000 + r, 2.0f));
    SamplingParams& p = params[r];
    p.temperature = (r % 5 == 0) ? 0.0f : 0.3f + 0.1f * (r % 7);
    if (r % 3 == 1) p.top_k = 20 + r;
    if (r % 4 == 2) p.top_p = 0.9f;
    if (r % 6 == 3) p.min_p = 0.05f;
    if (r % 2) p.logprobs = r % 6;
    if (r % 7 == 4) p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.1f;
    std::vector<int32_t> prompt = {r, r + 1, 2 * r};
    states.emplace_back(prompt, 500 + r, (uint32_t)(r % 3));
    for (int i = 0; i < r % 5; ++i) states.back().on_token((int32_t)(rng() % vocab));
    positions.push_back(states.back().next_position() + r);
  }
  std::vector<SampleResult> ref;
  for (int r = 0; r < rows; ++r) ref.push_back(sample_one(logits[r].data(), vocab, params[r], states[r], positions[r]));
  auto same = [](const SampleResult& a, const SampleResult& b) {
    const bool lp = (std::isnan(a.logprob) && std::isnan(b.logprob)) || a.logprob == b.logprob;
    return a.token == b.token && lp && a.top_logprobs == b.top_logprobs && a.error == b.error;
  };

  ThreadPool pool(4);
  std::set<int32_t> tokens;
  for (int n = 1; n <= rows; ++n) {
    std::vector<int> pick(rows);
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    pick.resize(n);
    std::vector<SampleRow> batch;
    for (int r : pick) batch.push_back({logits[r].data(), &params[r], &states[r], positions[r]});
    for (ThreadPool* tp : {(ThreadPool*)nullptr, &pool}) {
      auto out = sample_batch(batch, vocab, tp);
      ASSERT_EQ(out.size(), (size_t)n);
      for (int i = 0; i < n; ++i) {
        EXPECT_TRUE(same(out[i], ref[pick[i]])) << "batch " << n << " row " << pick[i];
        tokens.insert(out[i].token);
      }
    }
  }
  EXPECT_GT(tokens.size(), 10u);  // the rows really differ
}

// ---------------------------------------------------------------- bad input

TEST(Sampler, BadLogitsAreErrorsNotCrashes) {
  std::vector<float> x = {0.0f, 1.0f, 2.0f};
  SequenceSamplingState st({}, 1, 0);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(sample_one(x.data(), 3, sampled(1.0f), st, 0), Error);
  x[1] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(sample_one(x.data(), 3, sampled(0.0f), st, 0), Error);
  std::vector<float> masked(3, kNegInf);
  EXPECT_THROW(sample_one(masked.data(), 3, sampled(1.0f), st, 0), Error);
  EXPECT_THROW(sample_one(masked.data(), 3, sampled(0.0f), st, 0), Error);
  EXPECT_THROW(sample_one(masked.data(), 0, sampled(0.0f), st, 0), Error);
  // Bias can mask the only finite token: still an error, not UB.
  std::vector<float> one = {kNegInf, 3.0f};
  SamplingParams b = sampled(1.0f);
  b.logit_bias = {{1, kNegInf}};  // not a valid request; the sampler must still cope
  EXPECT_THROW(sample_one(one.data(), 2, b, st, 0), Error);

  // In a batch, the failing row reports and the others are sampled.
  std::vector<float> good = {0.0f, 5.0f, 1.0f};
  SamplingParams g = sampled(0.0f);
  std::vector<SampleRow> rows = {{good.data(), &g, &st, 0}, {masked.data(), &g, &st, 0}, {good.data(), &g, &st, 0}};
  ThreadPool pool(3);
  auto out = sample_batch(rows, 3, &pool);
  EXPECT_EQ(out[0].token, 1);
  EXPECT_EQ(out[1].token, -1);
  EXPECT_NE(out[1].error.find("masked"), std::string::npos);
  EXPECT_EQ(out[2].token, 1);
  EXPECT_TRUE(out[2].error.empty());
}

TEST(Sampler, OverflowingPenaltyStaysOrdered) {
  // A tiny repetition penalty divides a large logit past FLT_MAX; the sampler must still pick it.
  std::vector<float> x = {3e38f, 1.0f, 0.0f, -1.0f};
  SamplingParams p = sampled(0.5f);
  p.repetition_penalty = 1e-3f;
  p.top_p = 0.9f;
  SequenceSamplingState st(std::vector<int32_t>{0}, 1, 0);
  for (uint64_t pos = 0; pos < 20; ++pos) EXPECT_EQ(sample_one(x.data(), 4, p, st, pos).token, 0);
}

}  // namespace
// det_exp_d / det_log_d (the logprobs' exp and log, in double from single IEEE operations, shared with the CUDA
// logprob kernel) against long double over the ranges they take: within a few double ulp, far below a float ulp.
TEST(Sampler, DeterministicDoubleLogAndExpAreAccurate) {
  std::mt19937_64 g(13);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  long double worst_exp = 0, worst_log = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i < 1000 ? -1e-3 * u01(g) : -40.0 * u01(g);
    const long double we = std::exp((long double)x);
    worst_exp = std::max(worst_exp, std::fabs(((long double)deepinfer::sampling::det_exp_d(x) - we) / we));
    const double z = i < 1000 ? 1.0 + 1e-6 * u01(g) : std::ldexp(1.0 + u01(g), (int)(g() % 40));  // [1, 2^40)
    const long double wl = std::log((long double)z);
    worst_log = std::max(worst_log, std::fabs((long double)deepinfer::sampling::det_log_d(z) - wl) / std::max(1.0L, wl));
  }
  EXPECT_EQ(deepinfer::sampling::det_exp_d(0.0), 1.0);  // the best token's mass is exactly 2^S
  EXPECT_EQ(deepinfer::sampling::det_log_d(1.0), 0.0);
  EXPECT_LT(worst_exp, 2e-15L) << (double)worst_exp;
  EXPECT_LT(worst_log, 2e-15L) << (double)worst_log;
  EXPECT_EQ(deepinfer::sampling::lp_shift(129280), 44);
  EXPECT_EQ(deepinfer::sampling::lp_shift((1 << 19) - 1), 44);
  EXPECT_EQ(deepinfer::sampling::lp_shift(1 << 19), 43);
  EXPECT_EQ(deepinfer::sampling::lp_shift(3 << 20), 41);
}

// logprob_rows (the logprobs a backend returns beside its picks) are raw_logprobs of the rows as the model gave
// them, bit for bit: the rows' logit edits (a pending token's too) are put back first, and the top lists of 0 …
// 20 entries follow (value desc, id asc) through ties, rows with fewer finite tokens than asked, an all −inf row
// and a flat one. A NaN row has no logprobs (its pick is −2); rows that asked none are left edited and their
// entries untouched.
TEST(Sampler, BackendLogprobRowsAreTheHostsLogprobs) {
  deepinfer::CpuBackend be(2);
  std::mt19937 g(21);
  const int64_t M = 40, N = 2003;
  std::vector<float> x(M * N);
  std::vector<deepinfer::SampleSpec> spec(M);
  std::vector<deepinfer::RowEdits> rows(M);
  std::vector<deepinfer::LogitEdit> edits(5);  // rows' edits need not start at 0
  std::vector<int32_t> tokens(M, 0);
  for (int64_t m = 0; m < M; ++m) {
    std::normal_distribution<float> n(0.0f, 0.5f + 0.5f * (float)(m % 7));
    for (int64_t i = 0; i < N; ++i) x[m * N + i] = n(g);
    spec[m] = {m % 5 == 0 ? 0.0f : 0.8f, m % 4 == 1 ? 0.9f : 1.0f, 0.0f, m % 6 == 2 ? 30 : 0, 77 + (uint64_t)m, 500,
               m % 7 == 3 ? -1 : (int32_t)(m % 22)};  // 21: more than a backend gives (20)
    if (m % 3 != 0) continue;
    deepinfer::RowEdits& r = rows[m];
    r.rep = 1.4f, r.freq = 0.3f, r.presence = 0.2f;
    r.first = (int32_t)edits.size();
    std::set<int32_t> ids;
    while (ids.size() < 6) ids.insert((int32_t)(g() % N));
    for (int32_t id : ids)
      edits.push_back({id, (float)((int)(g() % 9) - 4) * 1.5f, (int32_t)(g() % 3),
                       deepinfer::sampling::kEditBias | deepinfer::sampling::kEditRepeat});
    r.count = (int32_t)ids.size();
    if (m % 2 == 0) {  // a pending token, in the list or not
      r.pend = (int32_t)m + 1;
      tokens[m] = m % 4 == 0 ? *ids.begin() : (int32_t)(g() % N);
      edits.resize(edits.size() + 2, deepinfer::LogitEdit{-1, 0.0f, 0, 0u});
    }
  }
  x[5 * N + 10] = x[5 * N + 1900] = 25.0f;                     // a tie at the top
  for (int64_t i = 0; i < N; ++i) x[11 * N + i] = -INFINITY;   // three finite tokens, 11 asked
  x[11 * N + 1500] = 2.0f, x[11 * N + 40] = 2.0f, x[11 * N + 900] = -3.0f;
  for (int64_t i = 0; i < N; ++i) x[13 * N + i] = -INFINITY;   // all −inf
  x[16 * N + 100] = std::numeric_limits<float>::quiet_NaN();   // no logprobs
  for (int64_t i = 0; i < N; ++i) x[19 * N + i] = 1.5f;        // flat
  const std::vector<float> orig = x;
  std::vector<float> raw(edits.size(), 0.0f);
  std::vector<int32_t> picks(M);
  be.sample_rows(x.data(), M, N, N, spec.data(), rows.data(), edits.data(), raw.data(), tokens.data(), picks.data());
  const std::vector<float> edited = x;
  std::vector<deepinfer::RowLogprobs> out(M);
  for (auto& o : out) o.n = -7;
  be.logprob_rows(x.data(), M, N, N, spec.data(), rows.data(), edits.data(), raw.data(), picks.data(), out.data());
  int checked = 0, restored = 0;
  for (int64_t m = 0; m < M; ++m) {
    SCOPED_TRACE("row " + std::to_string(m));
    const float* row = x.data() + m * N;
    if (spec[m].logprobs < 0) {
      EXPECT_EQ(out[m].n, -7);
      EXPECT_EQ(0, std::memcmp(row, edited.data() + m * N, N * sizeof(float)));
      continue;
    }
    EXPECT_EQ(0, std::memcmp(row, orig.data() + m * N, N * sizeof(float)));  // the raw row back
    if (m == 16) {
      EXPECT_EQ(picks[m], -2);
      EXPECT_TRUE(std::isnan(out[m].token));
      EXPECT_EQ(out[m].n, 0);
      continue;
    }
    const int n = std::min(spec[m].logprobs, deepinfer::kMaxLogprobs);
    const deepinfer::RawLogprobs want = deepinfer::raw_logprobs(orig.data() + m * N, (int)N, picks[m], n);
    EXPECT_EQ(deepinfer::sampling::bits_of(out[m].token), deepinfer::sampling::bits_of(want.token_logprob));
    ASSERT_EQ(out[m].n, (int32_t)want.top.size());
    for (int j = 0; j < out[m].n; ++j) {
      EXPECT_EQ(out[m].ids[j], want.top[(size_t)j].token) << j;
      EXPECT_EQ(deepinfer::sampling::bits_of(out[m].lps[j]), deepinfer::sampling::bits_of(want.top[(size_t)j].logprob));
    }
    ++checked;
    restored += rows[m].count > 0;
  }
  EXPECT_GT(checked, 25);
  EXPECT_GT(restored, 5);
  // The special rows' lists, by hand.
  ASSERT_EQ(out[5].n, 5);
  EXPECT_EQ(out[5].ids[0], 10);
  EXPECT_EQ(out[5].ids[1], 1900);
  ASSERT_EQ(out[11].n, 11);
  EXPECT_EQ(out[11].ids[0], 40);
  EXPECT_EQ(out[11].ids[1], 1500);
  EXPECT_EQ(out[11].ids[2], 900);
  EXPECT_EQ(out[11].ids[3], 0);
  EXPECT_EQ(out[11].lps[3], -INFINITY);
  EXPECT_EQ(out[11].ids[10], 7);
  EXPECT_NEAR(out[11].lps[0], -std::log(2.0 + std::exp(-5.0)), 2e-7);
  ASSERT_EQ(out[13].n, 13);
  EXPECT_EQ(out[13].token, -INFINITY);
  EXPECT_EQ(out[13].ids[12], 12);
  ASSERT_EQ(out[19].n, 19);
  EXPECT_EQ(out[19].ids[18], 18);
  EXPECT_EQ(out[19].token, (float)-std::log((double)N));
  ASSERT_EQ(out[21].n, 20);  // 21 asked
}

// mask_rows (a structured-output row's grammar mask on the backend, before its edits and pick) then sample_rows
// and logprob_rows give sample_one's token and logprobs with that mask, bit for bit: masks from dense to a single
// token, with logit processors, greedy and filtered rows; a mask allowing nothing leaves no token (−1: the host
// then reports it), and a NaN under the mask still answers −2.
TEST(Sampler, BackendMaskRowsAreTheHostsGrammarMask) {
  CpuBackend be(2);
  std::mt19937 g(31);
  const int64_t M = 24, N = 1000, W = mask_words(N);
  std::vector<float> x(M * N);
  std::vector<uint32_t> masks(M * W);
  std::vector<SampleSpec> spec(M);
  std::vector<RowEdits> rows(M);
  std::vector<LogitEdit> edits;
  std::vector<SamplingParams> params(M);
  std::vector<SequenceSamplingState> states;
  for (int64_t m = 0; m < M; ++m) {
    std::normal_distribution<float> n(0.0f, 1.0f + (float)(m % 4));
    for (int64_t i = 0; i < N; ++i) x[m * N + i] = n(g);
    const int density = (int)(m % 4);  // allowed: ~all, ~half, ~1/16, one token
    for (int64_t i = 0; i < N; ++i) {
      const bool ok = density == 0 ? g() % 50 != 0 : density == 1 ? g() % 2 == 0 : density == 2 ? g() % 16 == 0 : false;
      if (ok) masks[m * W + i / 32] |= 1u << (i % 32);
    }
    if (density == 3) masks[m * W + (m * 37 % N) / 32] |= 1u << ((m * 37 % N) % 32);
    SamplingParams& p = params[m];
    p.temperature = m % 5 == 0 ? 0.0f : 0.7f;
    p.top_k = m % 3 == 1 ? 5 : 0;
    p.top_p = m % 4 == 2 ? 0.8f : 1.0f;
    p.logprobs = (int)(m % 6);
    if (m % 2) p.repetition_penalty = 1.5f, p.logit_bias = {{(int32_t)(m * 11 % N), 4.0f}};
    states.emplace_back(std::vector<int32_t>{3, 5, (int32_t)(m * 13 % N)}, 900 + (uint64_t)m, 0);
    spec[m] = {effective_temperature(p.temperature), p.top_p, p.min_p, p.top_k, states[m].rng_key(), 7, *p.logprobs};
    rows[m] = logit_edits(p, states[m], (int)N, edits);
    rows[m].mask = (int32_t)m;
  }
  std::fill(masks.begin() + 9 * W, masks.begin() + 10 * W, 0u);  // row 9 allows nothing
  x[14 * N + 500] = std::numeric_limits<float>::quiet_NaN();     // row 14: NaN (allowed or not)
  const std::vector<float> orig = x;
  std::vector<float> raw(edits.size());
  std::vector<int32_t> picks(M);
  std::vector<RowLogprobs> lps(M);
  be.mask_rows(x.data(), M, N, N, rows.data(), masks.data());
  be.sample_rows(x.data(), M, N, N, spec.data(), rows.data(), edits.data(), raw.data(), nullptr, picks.data());
  be.logprob_rows(x.data(), M, N, N, spec.data(), rows.data(), edits.data(), raw.data(), picks.data(), lps.data());
  EXPECT_EQ(picks[9], -1);
  EXPECT_EQ(picks[14], -2);
  int checked = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (m == 9 || m == 14) continue;
    SCOPED_TRACE("row " + std::to_string(m));
    const SampleResult want = sample_one(orig.data() + m * N, (int)N, params[m], states[m], 7, masks.data() + m * W);
    ASSERT_EQ(picks[m], want.token);
    EXPECT_EQ(sampling::bits_of(lps[m].token), sampling::bits_of(want.logprob));
    ASSERT_EQ(lps[m].n, (int32_t)want.top_logprobs.size());
    for (int j = 0; j < lps[m].n; ++j) {
      EXPECT_EQ(lps[m].ids[j], want.top_logprobs[(size_t)j].token);
      EXPECT_EQ(sampling::bits_of(lps[m].lps[j]), sampling::bits_of(want.top_logprobs[(size_t)j].logprob));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 22);
}

// A flat row past 2^19 tokens (the masses' scale drops a bit so that Z stays below 2^63) and a peaked one: the
// logprobs of the exact log-softmax within a float ulp.
TEST(Sampler, LogprobsOfLongRowsStayExact) {
  const int64_t N = (1 << 19) + 1001;
  std::vector<float> x((size_t)N, -2.25f);
  deepinfer::RowLogprobs o;
  deepinfer::row_logprobs(x.data(), N, 7, 3, o);
  EXPECT_EQ(o.token, (float)-std::log((long double)N));
  EXPECT_EQ(o.ids[2], 2);
  std::mt19937 g(4);
  std::normal_distribution<float> n(0.0f, 4.0f);
  for (float& v : x) v = n(g);
  long double m = -INFINITY, z = 0;
  for (float v : x) m = std::max<long double>(m, v);
  for (float v : x) z += std::exp((long double)v - m);
  deepinfer::row_logprobs(x.data(), N, 12345, 20, o);
  const double ref = (double)((long double)x[12345] - m - std::log(z));
  EXPECT_NEAR(o.token, ref, 1.2e-7 * std::max(1.0, std::fabs(ref)));
  for (int j = 0; j < 20; ++j) {
    const double r = (double)((long double)x[(size_t)o.ids[j]] - m - std::log(z));
    EXPECT_NEAR(o.lps[j], r, 1.2e-7 * std::max(1.0, std::fabs(r))) << j;
  }
}

}  // namespace deepinfer

// argmax_rows is the host sampler's greedy pick (the engine reads it instead of the logits for greedy
// rows): the same id on random rows and on ties, −1 when every value is −inf, −2 for NaN / +inf (rows
// the host sampler rejects).
TEST(Sampler, BackendArgmaxRowsIsTheGreedyPick) {
  deepinfer::CpuBackend be(1);
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  const int64_t M = 9, N = 777;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(M * N);
  for (auto& v : x) v = n(g);
  x[1 * N + 5] = x[1 * N + 600] = 40.0f;                 // a tie: 5 wins
  for (int64_t i = 0; i < N; ++i) x[2 * N + i] = -inf;   // all −inf
  for (int64_t i = 0; i < N; ++i) x[3 * N + i] = -inf;
  x[3 * N + 700] = -1e30f;
  x[4 * N + 9] = std::numeric_limits<float>::quiet_NaN();
  x[5 * N + 3] = inf;
  std::vector<int32_t> out(M);
  be.argmax_rows(x.data(), M, N, N, out.data());
  EXPECT_EQ(out[1], 5);
  EXPECT_EQ(out[2], -1);
  EXPECT_EQ(out[3], 700);
  EXPECT_EQ(out[4], -2);
  EXPECT_EQ(out[5], -2);
  for (int64_t m : {0, 1, 2, 3, 6, 7, 8}) EXPECT_EQ(out[m], deepinfer::argmax_lowest_id(x.data() + m * N, (int)N)) << m;
}

// sample_math.h's log and exp (the noise and the masses, shared with the CUDA sampler) against the
// library's in double, over the ranges the sampler uses: within 4 float ulp (relative 2^-21).
TEST(Sampler, DeterministicLogAndExpAreAccurate) {
  std::mt19937_64 g(11);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  double worst_log = 0.0, worst_exp = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const float x = (float)std::ldexp(u01(g) + 0.5, (int)(g() % 30) - 25);  // [2^-26, 2^5)
    const double want = std::log((double)x);
    if (std::fabs(want) > 1e-3) worst_log = std::max(worst_log, std::fabs((deepinfer::sampling::det_log(x) - want) / want));
    const float y = (float)-std::ldexp(u01(g), (int)(g() % 7));  // (−64, 0]
    const double we = std::exp((double)y);
    worst_exp = std::max(worst_exp, std::fabs((deepinfer::sampling::det_exp(y) - we) / we));
  }
  // Near 1, log's absolute error matters (−log u of a u close to 1 feeds the second log).
  double worst_abs = 0.0;
  for (int k = 1; k < 4096; ++k) {
    const float x = 1.0f - (float)k * 5.9604645e-8f;
    worst_abs = std::max(worst_abs, std::fabs(deepinfer::sampling::det_log(x) - std::log((double)x)) / -std::log((double)x));
  }
  EXPECT_EQ(deepinfer::sampling::det_exp(0.0f), 1.0f);  // the best token's mass is exactly 2^32
  EXPECT_EQ(deepinfer::sampling::det_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(deepinfer::sampling::det_log(1.0f), 0.0f);
  EXPECT_LT(worst_log, 4.8e-7) << worst_log;
  EXPECT_LT(worst_exp, 4.8e-7) << worst_exp;
  EXPECT_LT(worst_abs, 4.8e-7) << worst_abs;
}

// sample_rows (what the engine reads instead of logits when no logit processor is on) is the host
// sampler's token: every filter, greedy rows, ties, and −2 / −1 where sample_one throws.
TEST(Sampler, BackendSampleRowsIsTheHostSampler) {
  deepinfer::CpuBackend be(2);
  std::mt19937 g(5);
  const int64_t M = 48, N = 3001;
  std::vector<float> x(M * N);
  std::vector<deepinfer::SampleSpec> spec(M);
  std::vector<deepinfer::SamplingParams> params(M);
  std::vector<deepinfer::SequenceSamplingState> states;
  for (int64_t m = 0; m < M; ++m) {
    std::normal_distribution<float> n(0.0f, 0.3f + 0.4f * (float)(m % 9));
    for (int64_t i = 0; i < N; ++i) x[m * N + i] = n(g);
    if (m % 6 == 1) x[m * N + 17] = x[m * N + 2900] = 30.0f;  // a tie at the top
    auto& p = params[m];
    p.temperature = m % 8 == 0 ? 0.0f : 0.2f + 0.15f * (float)(m % 11);
    p.top_k = m % 4 == 1 ? 1 + (int)(m % 40) : 0;
    p.top_p = m % 3 == 2 ? 0.3f + 0.1f * (float)(m % 7) : 1.0f;
    p.min_p = m % 5 == 3 ? 0.02f * (float)(m % 4) : 0.0f;
    states.emplace_back(std::vector<int32_t>{}, 1000 + (uint64_t)m, (uint32_t)(m % 3));
    spec[m] = {deepinfer::effective_temperature(p.temperature), p.top_p, p.min_p, p.top_k, states[m].rng_key(),
               (uint64_t)(40 + m * 7)};
  }
  x[7 * N + 4] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < N; ++i) x[9 * N + i] = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> out(M);
  be.sample_rows(x.data(), M, N, N, spec.data(), nullptr, nullptr, nullptr, nullptr, out.data());
  EXPECT_EQ(out[7], -2);
  EXPECT_EQ(out[9], -1);
  for (int64_t m = 0; m < M; ++m) {
    if (m == 7 || m == 9) continue;
    EXPECT_EQ(out[m], deepinfer::sample_one(x.data() + m * N, (int)N, params[m], states[m], 40 + m * 7).token) << m;
  }
}

// The reach (sample_math.h kReach) is part of the definition: at |s| ≥ 2^27 a token 32 below the max can tie
// the best score once the noise is added in float, and without the rule the lower id would win the tie. The
// GPU never considers it (its bins stop at 24), so neither may the host. Also: top_p ≤ 0 keeps the best token.
TEST(Sampler, TokensBeyondTheReachNeverWin) {
  const int64_t N = 129280;
  std::vector<float> x((size_t)N, 268435456.0f);  // 2^28: float spacing 32
  x[N - 1] = 268435488.0f;                         // the max, 32 above every other token
  for (uint64_t key : {145ull, 292ull, 371ull, 7ull, 1000ull}) {
    for (float top_p : {1.0f, 0.5f, 0.0f, -0.5f}) {
      deepinfer::SampleSpec sp{1.0f, top_p, 0.0f, 0, key, 1000};
      EXPECT_EQ(deepinfer::sample_row(x.data(), N, sp), N - 1) << key << " " << top_p;
    }
  }
  // top_p ≤ 0 on an ordinary row: the best token only (what the smallest positive top_p gives).
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> y(5000);
  for (float& v : y) v = n(g);
  const int32_t best = (int32_t)(std::max_element(y.begin(), y.end()) - y.begin());
  for (float top_p : {0.0f, -0.0f, -1.0f, 1e-9f}) {
    deepinfer::SampleSpec sp{1.3f, top_p, 0.0f, 0, 99, 5};
    EXPECT_EQ(deepinfer::sample_row(y.data(), (int64_t)y.size(), sp), best) << top_p;
  }
}

// The logit processors as sparse edits (what the backends apply before sampling on the device) give
// apply_logit_processors's logits bit for bit: bias (also of zero, and turning signs), repetition penalties
// above and below 1 over prompt and output, frequency / presence counts, the min_tokens mask on and off, ids
// outside the vocabulary, ±0 logits.
TEST(Sampler, LogitEditsEqualTheLogitProcessors) {
  std::mt19937 g(11);
  const int V = 700;
  for (int it = 0; it < 400; ++it) {
    std::vector<int32_t> prompt;
    for (int i = 0, n = (int)(g() % 40); i < n; ++i) prompt.push_back((int32_t)(g() % V));
    std::vector<int32_t> masked{(int32_t)(g() % V), (int32_t)(g() % V), 3, 3};
    deepinfer::SequenceSamplingState st(prompt, 5, 0, masked);
    for (int i = 0, n = (int)(g() % 30); i < n; ++i) st.on_token((int32_t)(g() % (V / 4)));
    deepinfer::SamplingParams p;
    if (g() % 2)
      for (int i = 0; i < 6; ++i) p.logit_bias[(int32_t)(g() % (V + 20)) - 10] = (float)((int)(g() % 9) - 4) * 0.75f;
    const int mode = (int)(g() % 4);
    p.repetition_penalty = mode == 0 ? 1.0f : mode == 1 ? 1.3f : mode == 2 ? 0.7f : 1.05f;
    p.frequency_penalty = g() % 2 ? 0.0f : (float)((int)(g() % 5) - 2) * 0.4f;
    p.presence_penalty = g() % 2 ? 0.0f : (float)((int)(g() % 5) - 2) * 0.3f;
    p.min_tokens = g() % 3 == 0 ? 1000 : 0;
    std::vector<float> x(V);
    std::normal_distribution<float> n(0.0f, 2.0f);
    for (float& v : x) v = g() % 17 == 0 ? (g() % 2 ? 0.0f : -0.0f) : n(g);
    std::vector<float> want = x, got = x;
    deepinfer::apply_logit_processors(want.data(), V, p, st);
    std::vector<deepinfer::LogitEdit> edits(3);  // the row's edits need not start at 0
    const deepinfer::RowEdits row = deepinfer::logit_edits(p, st, V, edits);
    EXPECT_EQ(row.first, 3);
    if (!deepinfer::has_logit_processors(p, st)) EXPECT_EQ(row.count, 0) << it;
    deepinfer::apply_edits(got.data(), V, row, edits.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), V * sizeof(float))) << "case " << it;
  }
}

// A fed row's edits (logit_edits with `pending`, RowEdits::pend): the list built without the last output token,
// plus that token's own edit on the backend (apply_edits with the step's token ids), equal the processors of the
// state with the token appended — whether the token is new, in the prompt or already in the output, with the
// min_tokens mask turning off at it, and with a raw row restorable from the saved values and the id place.
TEST(Sampler, PendingTokenEditsEqualTheLogitProcessors) {
  std::mt19937 g(12);
  const int V = 300;
  int64_t listed = 0, unlisted = 0;
  for (int it = 0; it < 2000; ++it) {
    std::vector<int32_t> prompt;
    for (int i = 0, n = (int)(g() % 40); i < n; ++i) prompt.push_back((int32_t)(g() % V));
    std::vector<int32_t> masked{(int32_t)(g() % V), (int32_t)(g() % V)};
    deepinfer::SequenceSamplingState st(prompt, 5, 0, masked), after(prompt, 5, 0, masked);
    const int n_out = (int)(g() % 12);
    for (int i = 0; i < n_out; ++i) {
      const int32_t t = (int32_t)(g() % (V / 4));
      st.on_token(t), after.on_token(t);
    }
    const int32_t t = (int32_t)(g() % 3 == 0 ? g() % (V / 4) : g() % V);  // often a repeat
    after.on_token(t);
    deepinfer::SamplingParams p;
    if (g() % 2)
      for (int i = 0; i < 6; ++i) p.logit_bias[(int32_t)(g() % V)] = (float)((int)(g() % 9) - 4) * 0.75f;
    const int mode = (int)(g() % 4);
    p.repetition_penalty = mode == 0 ? 1.0f : mode == 1 ? 1.3f : mode == 2 ? 0.7f : 1.05f;
    p.frequency_penalty = g() % 2 ? 0.0f : (float)((int)(g() % 5) - 2) * 0.4f;
    p.presence_penalty = g() % 2 ? 0.0f : (float)((int)(g() % 5) - 2) * 0.3f;
    p.min_tokens = g() % 3 == 0 ? n_out + 1 + (int)(g() % 2) : 0;  // the mask may end with the pending token
    std::vector<float> x(V);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (float& v : x) v = nd(g);
    std::vector<float> want = x, got = x;
    deepinfer::apply_logit_processors(want.data(), V, p, after);
    std::vector<deepinfer::LogitEdit> edits(2);
    deepinfer::RowEdits row = deepinfer::logit_edits(p, st, V, edits, /*pending=*/true);
    ASSERT_EQ(row.pend, 1);
    ASSERT_EQ((int64_t)edits.size(), row.first + row.count + 2);  // the token's two places
    const int32_t tokens[3] = {7, t, 9};
    row.pend = 2;  // the step's token ids: this row's is at place 1
    std::vector<float> raw(edits.size(), -1.0f);
    deepinfer::apply_edits(got.data(), V, row, edits.data(), raw.data(), tokens);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), V * sizeof(float))) << "case " << it;
    // the raw row back from the saved values (as DeepseekV4Model::restore_row does)
    std::vector<float> back = got;
    for (int32_t j = 0; j < row.count; ++j) {
      const int32_t id = edits[(size_t)(row.first + j)].id;
      if (id >= 0 && id < V) back[(size_t)id] = raw[(size_t)(row.first + j)];
    }
    int32_t id = 0;
    std::memcpy(&id, &raw[(size_t)(row.first + row.count + 1)], 4);
    if (id >= 0) back[(size_t)id] = raw[(size_t)(row.first + row.count)];
    (id >= 0 ? unlisted : listed) += 1;
    ASSERT_EQ(0, std::memcmp(back.data(), x.data(), V * sizeof(float))) << "restore, case " << it;
  }
  EXPECT_GT(listed, 100);
  EXPECT_GT(unlisted, 100);
}
