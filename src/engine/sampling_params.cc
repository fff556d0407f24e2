#include "engine/sampling_params.h"

#include <cmath>
#include <random>
#include <sstream>

#include "util/error.h"

namespace deepinfer {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void bad(const std::string& msg) { throw Error("invalid sampling parameters: " + msg); }

void check_finite(const char* field, float v) {
  if (!std::isfinite(v)) bad(std::string(field) + " must be a finite number, got " + num(v));
}

// Stop strings are matched byte-wise; valid UTF-8 guarantees a match starts and ends on character
// boundaries of the (valid UTF-8) output text.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int j = 1; j < len; ++j) {
      const unsigned char d = static_cast<unsigned char>(s[i + j]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size, const SamplingLimits& limits) const {
  if (vocab_size < 1) bad("vocabulary size must be positive, got " + std::to_string(vocab_size));
  if (n < 1 || n > limits.max_n)
    bad("n must be in [1, " + std::to_string(limits.max_n) + "], got " + std::to_string(n));
  if (max_tokens && *max_tokens < 1) bad("max_tokens must be at least 1, got " + std::to_string(*max_tokens));
  if (min_tokens < 0) bad("min_tokens must be non-negative, got " + std::to_string(min_tokens));
  if (max_tokens && min_tokens > *max_tokens)
    bad("min_tokens must be at most max_tokens (" + std::to_string(*max_tokens) + "), got " +
        std::to_string(min_tokens));

  check_finite("temperature", temperature);
  if (temperature < 0.0f) bad("temperature must be non-negative, got " + num(temperature));
  if (n > 1 && temperature == 0.0f)
    bad("n must be 1 when temperature is 0 (greedy sampling), got " + std::to_string(n));
  if (top_k < -1) bad("top_k must be -1 or 0 (off) or a positive integer, got " + std::to_string(top_k));
  check_finite("top_p", top_p);
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p must be in (0, 1], got " + num(top_p));
  check_finite("min_p", min_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p must be in [0, 1], got " + num(min_p));
  check_finite("repetition_penalty", repetition_penalty);
  if (!(repetition_penalty > 0.0f))
    bad("repetition_penalty must be greater than 0, got " + num(repetition_penalty));
  check_finite("presence_penalty", presence_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    bad("presence_penalty must be in [-2, 2], got " + num(presence_penalty));
  check_finite("frequency_penalty", frequency_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    bad("frequency_penalty must be in [-2, 2], got " + num(frequency_penalty));

  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size)
      bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
          std::to_string(vocab_size) + ")");
    if (!std::isfinite(bias) || std::fabs(bias) > limits.max_abs_logit_bias)
      bad("logit_bias for token " + std::to_string(id) + " must be in [-" + num(limits.max_abs_logit_bias) +
          ", " + num(limits.max_abs_logit_bias) + "], got " + num(bias));
  }

  if ((int64_t)stop.size() > limits.max_stop_strings)
    bad("stop may hold at most " + std::to_string(limits.max_stop_strings) + " strings, got " +
        std::to_string(stop.size()));
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) bad("stop[" + std::to_string(i) + "] must not be empty");
    if ((int64_t)stop[i].size() > limits.max_stop_string_bytes)
      bad("stop[" + std::to_string(i) + "] is longer than " + std::to_string(limits.max_stop_string_bytes) +
          " bytes");
    if (!valid_utf8(stop[i])) bad("stop[" + std::to_string(i) + "] is not valid UTF-8");
  }
  if ((int64_t)stop_token_ids.size() > limits.max_stop_token_ids)
    bad("stop_token_ids may hold at most " + std::to_string(limits.max_stop_token_ids) + " ids, got " +
        std::to_string(stop_token_ids.size()));
  for (int32_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      bad("stop_token_ids entry " + std::to_string(id) + " is outside the vocabulary [0, " +
          std::to_string(vocab_size) + ")");

  if (structured.kind == StructuredKind::kNone && !structured.text.empty())
    bad("structured.text is set but structured.kind is none");
  if ((structured.kind == StructuredKind::kRegex || structured.kind == StructuredKind::kJsonSchema ||
       structured.kind == StructuredKind::kGrammar) && structured.text.empty())
    bad(std::string("structured ") + structured_kind_name(structured.kind) + " must not be empty");

  if (logprobs && (*logprobs < 0 || *logprobs > limits.max_logprobs))
    bad("logprobs must be in [0, " + std::to_string(limits.max_logprobs) + "], got " + std::to_string(*logprobs));
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > limits.max_logprobs))
    bad("prompt_logprobs must be in [0, " + std::to_string(limits.max_logprobs) + "], got " +
        std::to_string(*prompt_logprobs));
}

const char* structured_kind_name(StructuredKind k) {
  switch (k) {
    case StructuredKind::kNone: return "none";
    case StructuredKind::kRegex: return "regex";
    case StructuredKind::kJsonSchema: return "json_schema";
    case StructuredKind::kGrammar: return "grammar";
    case StructuredKind::kJsonObject: return "json_object";
  }
  return "none";
}

float effective_temperature(float temperature) {
  if (temperature == 0.0f) return 0.0f;
  return temperature < 0.01f ? 0.01f : temperature;
}

uint64_t resolve_seed(const SamplingParams& params) {
  if (params.seed) return *params.seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace deepinfer
