#pragma once
// Per-request sampling parameters with vLLM / OpenAI meaning, and their validation. The sampler,
// the stop matcher and the API layer all read this one struct; docs/sampling.md is the reference.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace deepinfer {

// Server-wide caps (flags of the serving process, not per request).
struct SamplingLimits {
  int max_n = 128;                 // OpenAI's cap on choices
  int max_logprobs = 20;           // vLLM --max-logprobs default
  int max_stop_strings = 64;
  int max_stop_string_bytes = 1024;
  int max_stop_token_ids = 1024;
  float max_abs_logit_bias = 100.0f;  // OpenAI range [-100, 100]
};

// Structured output: constrain generation to a regex, a JSON Schema, a GBNF grammar or any JSON
// object (docs/structured-outputs.md). Compiled when the request is added (an invalid or
// unsupported spec fails that request only); each generated token is then masked to those the
// grammar allows, and the request finishes with "stop" once the grammar is complete and EOS is
// sampled (EOS is the only allowed token when nothing can follow).
enum class StructuredKind { kNone, kRegex, kJsonSchema, kGrammar, kJsonObject };
const char* structured_kind_name(StructuredKind k);  // "none", "regex", "json_schema", "grammar", "json_object"

struct StructuredOutput {
  StructuredKind kind = StructuredKind::kNone;
  // kRegex: the pattern (full match, Python `re` syntax subset); kJsonSchema: the schema as JSON
  // text; kGrammar: GBNF text (start rule `root`); kJsonObject: ignored (any JSON object).
  std::string text;
  // JSON kinds: no whitespace between JSON tokens (vLLM's disable_any_whitespace). By default up to
  // 20 whitespace bytes are allowed at each place JSON allows whitespace (bounded so that a model
  // cannot loop on newlines forever).
  bool disable_any_whitespace = false;
  bool active() const { return kind != StructuredKind::kNone; }
};

struct SamplingParams {
  int n = 1;                          // parallel samples (choices) of one prompt
  std::optional<int64_t> max_tokens;  // none: until the context limit
  int64_t min_tokens = 0;             // EOS / stop tokens masked until this many are generated
  float temperature = 1.0f;           // 0: greedy; 0 < T < 0.01 runs as 0.01 (vLLM)
  int top_k = 0;                      // -1 or 0: off
  float top_p = 1.0f;                 // (0, 1]; 1: off
  float min_p = 0.0f;                 // [0, 1]; 0: off
  float repetition_penalty = 1.0f;    // > 0; over prompt and output tokens (HF / vLLM)
  float presence_penalty = 0.0f;      // [-2, 2]; over output tokens (OpenAI)
  float frequency_penalty = 0.0f;     // [-2, 2]; over output tokens (OpenAI)
  std::map<int32_t, float> logit_bias;  // token id -> added to the logit, before everything else
  std::vector<std::string> stop;        // stop strings (UTF-8), matched in the detokenized output
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  std::optional<uint64_t> seed;       // none: one drawn from the OS when the request is admitted
  std::optional<int> logprobs;        // number of top logprobs per output token (+ the chosen one)
  std::optional<int> prompt_logprobs;  // same for prompt tokens (validated; computed by the engine)
  bool skip_special_tokens = true;    // detokenizer option, carried with the request
  StructuredOutput structured;        // none by default

  // Throws deepinfer::Error naming the first invalid field, e.g. "top_p must be in (0, 1], got 1.5".
  // vocab_size bounds logit_bias and stop_token_ids.
  void validate(int64_t vocab_size, const SamplingLimits& limits = {}) const;

  bool greedy() const { return temperature == 0.0f; }
};

// The temperature the sampler divides by: vLLM raises 0 < T < 0.01 to 0.01 so that logits / T stays
// finite; 0 (greedy) is returned unchanged.
float effective_temperature(float temperature);

// The request's seed: params.seed, or one value from std::random_device (call once per request and
// keep the result with it, so that preemption and recompute replay the same tokens).
uint64_t resolve_seed(const SamplingParams& params);

}  // namespace deepinfer
