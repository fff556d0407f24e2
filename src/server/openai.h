#pragma once
// The OpenAI-compatible request/response layer: JSON bodies -> engine requests, engine outputs ->
// OpenAI JSON (whole responses and SSE chunks). No HTTP here (server.cc owns the sockets), so
// everything in this file is a pure function of its inputs.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "util/json.h"

namespace deepinfer::server {

using Json = nlohmann::json;

// An error the client gets, in OpenAI's envelope:
//   {"error": {"message", "type", "param", "code"}}
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
};
std::string error_body(const ApiError& e);
// The error type OpenAI uses for an HTTP status ("invalid_request_error", ...).
const char* error_type_for(int status);

// Server-wide request limits (flags of `deepinfer serve`).
struct RequestLimits {
  int max_n = 16;                 // choices per prompt
  int max_prompts = 16;           // prompts per /v1/completions request
  int max_logit_bias = 1024;      // entries
  int max_stop = 16;              // stop strings
  int max_stop_bytes = 256;       // per stop string
  int max_top_logprobs = 20;
  int max_json_depth = 64;
  int max_messages = 4096;
  int64_t max_tokens = 0;         // 0: up to the context length
};

// What the parsing needs to know about the serving engine.
struct ModelInfo {
  const tokenizer::Tokenizer* tok = nullptr;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  std::vector<std::string> names;  // accepted "model" values; names[0] is the one reported
  int32_t think_end_id = -1;       // "</think>" token, -1 if the vocabulary has none
  bool v41 = false;                // DeepSeek-V4.1 chat encoding (else V4)
};

enum class Kind { kChat, kCompletion };

// One parsed generation request: one or more prompts (completions accept a batch), each run as
// one engine request with params.n choices. Choice index = prompt index * n + choice.
struct GenRequest {
  Kind kind = Kind::kChat;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo (completions only)
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool thinking = false;       // chat: DeepSeek thinking mode (reasoning -> reasoning_content)
  bool echo = false;           // completions: prepend the prompt text
  bool want_logprobs = false;  // chat: logprobs=true; completions: logprobs is an integer
  int top_logprobs = 0;
  std::string model;           // the name reported back
  int total_sequences() const { return (int)prompts.size() * params.n; }
};

// Body text -> JSON object, with a nesting-depth cap; ApiError 400 for anything else.
Json parse_body(const std::string& body, int max_depth);

GenRequest parse_chat(const Json& body, const ModelInfo& m, const RequestLimits& lim);
GenRequest parse_completion(const Json& body, const ModelInfo& m, const RequestLimits& lim);

// /tokenize and /detokenize bodies -> response bodies.
Json handle_tokenize(const Json& body, const ModelInfo& m, const RequestLimits& lim);
Json handle_detokenize(const Json& body, const ModelInfo& m);

// The chat prompt of a list of OpenAI messages in the model's format (also used by /tokenize).
std::vector<int32_t> render_chat(const Json& messages, bool thinking, const std::string& reasoning_effort,
                                 const ModelInfo& m, const RequestLimits& lim);

// ---- output side ----

// The accumulated output of one choice.
struct ChoiceState {
  std::string content, reasoning;
  bool in_reasoning = false;  // chat + thinking: text goes to reasoning until "</think>"
  std::vector<TokenLogprobs> logprobs;
  int64_t num_tokens = 0;
  bool finished = false;
  Finish finish = Finish::kNone;
  std::string error;
};

// The text of one output event, split into its reasoning and content parts (chat + thinking) and
// appended to the choice.
struct Delta {
  std::string content, reasoning;
};
Delta apply_output(ChoiceState& c, const RequestOutput& o, const ModelInfo& m);

// OpenAI finish_reason for an engine finish ("stop", "length", "abort", "error").
const char* finish_reason(Finish f);

// Logprobs objects: chat ({"content": [...]}) and completions ({"tokens", "token_logprobs", ...}).
Json chat_logprobs(const std::vector<TokenLogprobs>& lps, const ModelInfo& m);
Json completion_logprobs(const std::vector<TokenLogprobs>& lps, const ModelInfo& m, size_t text_offset);

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// JSON text that never throws on odd strings (invalid UTF-8 is replaced).
std::string dump(const Json& j);

}  // namespace deepinfer::server
