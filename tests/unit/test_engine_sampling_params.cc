// SamplingParams::validate: every bad field is rejected with an error naming it; good values pass.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "engine/sampling_params.h"
#include "util/error.h"

namespace deepinfer {
namespace {

constexpr int64_t kVocab = 1000;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// The error text of validate(), or "" when it passes.
std::string error_of(const std::function<void(SamplingParams&)>& edit, const SamplingLimits& limits = {}) {
  SamplingParams p;
  edit(p);
  try {
    p.validate(kVocab, limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_rejected(const std::function<void(SamplingParams&)>& edit, const std::string& needle) {
  const std::string msg = error_of(edit);
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "' lacks '" << needle << "'";
}

TEST(SamplingParamsValidate, DefaultsAndTypicalRequestsPass) {
  EXPECT_EQ(error_of([](SamplingParams&) {}), "");
  EXPECT_EQ(error_of([](SamplingParams& p) {
              p.n = 4;
              p.max_tokens = 128;
              p.min_tokens = 128;
              p.temperature = 0.7f;
              p.top_k = 50;
              p.top_p = 1.0f;
              p.min_p = 1.0f;
              p.repetition_penalty = 1.3f;
              p.presence_penalty = -2.0f;
              p.frequency_penalty = 2.0f;
              p.logit_bias = {{0, -100.0f}, {999, 100.0f}};
              p.stop = {"\n\nUser", "日本"};
              p.stop_token_ids = {0, 999};
              p.seed = UINT64_MAX;
              p.logprobs = 20;
              p.prompt_logprobs = 0;
            }),
            "");
  EXPECT_EQ(error_of([](SamplingParams& p) { p.temperature = 0.0f; p.top_k = -1; }), "");
}

TEST(SamplingParamsValidate, TopPMessageIsExact) {
  EXPECT_NE(error_of([](SamplingParams& p) { p.top_p = 1.5f; }).find("top_p must be in (0, 1], got 1.5"),
            std::string::npos);
}

TEST(SamplingParamsValidate, EachBadFieldIsNamed) {
  expect_rejected([](SamplingParams& p) { p.n = 0; }, "n must be");
  expect_rejected([](SamplingParams& p) { p.n = 129; }, "n must be");
  expect_rejected([](SamplingParams& p) { p.n = 2, p.temperature = 0.0f; }, "greedy");
  expect_rejected([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_rejected([](SamplingParams& p) { p.max_tokens = -5; }, "max_tokens");
  expect_rejected([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  expect_rejected([](SamplingParams& p) { p.max_tokens = 10, p.min_tokens = 11; }, "min_tokens");
  expect_rejected([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  expect_rejected([](SamplingParams& p) { p.temperature = kNaN; }, "temperature");
  expect_rejected([](SamplingParams& p) { p.temperature = kInf; }, "temperature");
  expect_rejected([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.top_p = -0.5f; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.top_p = kNaN; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.min_p = -0.01f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.min_p = 1.01f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.min_p = kNaN; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = kNaN; }, "repetition_penalty");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = kInf; }, "repetition_penalty");
  expect_rejected([](SamplingParams& p) { p.presence_penalty = 2.01f; }, "presence_penalty");
  expect_rejected([](SamplingParams& p) { p.presence_penalty = -2.01f; }, "presence_penalty");
  expect_rejected([](SamplingParams& p) { p.presence_penalty = kNaN; }, "presence_penalty");
  expect_rejected([](SamplingParams& p) { p.frequency_penalty = 2.5f; }, "frequency_penalty");
  expect_rejected([](SamplingParams& p) { p.frequency_penalty = -kInf; }, "frequency_penalty");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{1000, 1.0f}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{5, 100.5f}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{5, -101.0f}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{5, kNaN}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop[1] must not be empty");
  expect_rejected([](SamplingParams& p) { p.stop.assign(65, "x"); }, "stop may hold at most 64");
  expect_rejected([](SamplingParams& p) { p.stop = {std::string(1025, 'x')}; }, "stop[0]");
  expect_rejected([](SamplingParams& p) { p.stop = {"\xC3"}; }, "UTF-8");          // truncated
  expect_rejected([](SamplingParams& p) { p.stop = {"a\x80"}; }, "UTF-8");         // stray continuation
  expect_rejected([](SamplingParams& p) { p.stop = {"\xC0\xAF"}; }, "UTF-8");      // overlong '/'
  expect_rejected([](SamplingParams& p) { p.stop = {"\xED\xA0\x80"}; }, "UTF-8");  // surrogate
  expect_rejected([](SamplingParams& p) { p.stop_token_ids = {3, 1000}; }, "stop_token_ids");
  expect_rejected([](SamplingParams& p) { p.stop_token_ids = {-7}; }, "stop_token_ids");
  expect_rejected([](SamplingParams& p) { p.stop_token_ids.assign(1025, 1); }, "stop_token_ids");
  expect_rejected([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  expect_rejected([](SamplingParams& p) { p.logprobs = -1; }, "logprobs");
  expect_rejected([](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs");
}

TEST(SamplingParamsValidate, LimitsAreConfigurable) {
  SamplingLimits strict;
  strict.max_logprobs = 5;
  strict.max_stop_strings = 2;
  strict.max_n = 2;
  EXPECT_NE(error_of([](SamplingParams& p) { p.logprobs = 6; }, strict).find("logprobs must be in [0, 5]"),
            std::string::npos);
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logprobs = 5; }, strict), "");
  EXPECT_NE(error_of([](SamplingParams& p) { p.stop = {"a", "b", "c"}; }, strict).find("stop"), std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.n = 3; }, strict).find("n must be"), std::string::npos);
  SamplingLimits loose;
  loose.max_logprobs = 100;
  EXPECT_EQ(error_of([](SamplingParams& p) { p.logprobs = 100; }, loose), "");
}

TEST(SamplingParamsValidate, VocabularyBoundsAreExclusive) {
  SamplingParams p;
  p.logit_bias = {{9, 1.0f}};
  EXPECT_THROW(p.validate(9), Error);
  EXPECT_NO_THROW(p.validate(10));
  EXPECT_THROW(p.validate(0), Error);
}

TEST(SamplingParamsValidate, TemperatureAndSeedHelpers) {
  EXPECT_EQ(effective_temperature(0.0f), 0.0f);
  EXPECT_EQ(effective_temperature(0.001f), 0.01f);  // vLLM's floor keeps logits / T finite
  EXPECT_EQ(effective_temperature(0.7f), 0.7f);
  SamplingParams p;
  p.seed = 42;
  EXPECT_EQ(resolve_seed(p), 42u);
  p.seed.reset();
  // Drawn from the OS: two draws colliding has probability 2^-64.
  EXPECT_NE(resolve_seed(p), resolve_seed(p));
}

}  // namespace
}  // namespace deepinfer
