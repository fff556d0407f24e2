#include "server/openai.h"

#include <cmath>
#include <limits>
#include <string_view>

#include "tokenizer/chat.h"
#include "util/error.h"

namespace deepinfer::server {

ApiError::ApiError(int s, std::string message, std::string p, std::string c)
    : std::runtime_error(std::move(message)), status(s), type(error_type_for(s)), param(std::move(p)), code(std::move(c)) {}

const char* error_type_for(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 431: return "invalid_request_error";
    case 503: return "service_unavailable_error";
    default: return status < 500 ? "invalid_request_error" : "server_error";
  }
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  Json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  else err["code"] = e.status;
  return dump(Json{{"error", err}});
}

namespace {

[[noreturn]] void bad(const std::string& msg, const std::string& param = {}, const std::string& code = {}) {
  throw ApiError(400, msg, param, code);
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::binary: return "binary";
    case Json::value_t::discarded: return "invalid";
    default: return "a number";
  }
}

// The field's value, or nullptr when it is absent or null (OpenAI treats both as "not given").
const Json* field(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(std::string("'") + key + "' must be a boolean, got " + type_name(*v), key);
  return v->get<bool>();
}

std::optional<double> get_number(const Json& o, const char* key, double lo, double hi) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(std::string("'") + key + "' must be a number, got " + type_name(*v), key);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad(std::string("'") + key + "' must be in [" + Json(lo).dump() + ", " + Json(hi).dump() + "], got " + v->dump(),
        key);
  }
  return x;
}

// Integers may arrive as 3 or 3.0 (Python clients); anything fractional or out of range is an error.
int64_t to_int(const Json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number()) bad("'" + name + "' must be an integer, got " + type_name(v), name);
  std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > (uint64_t)hi) bad("'" + name + "' must be in " + range + ", got " + v.dump(), name);
    return (int64_t)u;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) bad("'" + name + "' must be in " + range + ", got " + v.dump(), name);
    return i;
  }
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d)) bad("'" + name + "' must be an integer, got " + v.dump(), name);
  if (d < (double)lo || d > (double)hi) bad("'" + name + "' must be in " + range + ", got " + v.dump(), name);
  return (int64_t)d;
}

std::optional<int64_t> get_int(const Json& o, const char* key, int64_t lo, int64_t hi) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  return to_int(*v, key, lo, hi);
}

std::optional<std::string> get_string(const Json& o, const char* key) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(std::string("'") + key + "' must be a string, got " + type_name(*v), key);
  return v->get<std::string>();
}

std::string resolve_model(const Json& body, const ModelInfo& m) {
  auto name = get_string(body, "model");
  if (!name) return m.names.at(0);
  for (const auto& n : m.names)
    if (*name == n) return m.names.at(0);
  bad("The model '" + *name + "' does not exist; this server serves '" + m.names.at(0) + "'", "model",
      "model_not_found");
}

int32_t token_id(const Json& v, const std::string& name, const ModelInfo& m) {
  return (int32_t)to_int(v, name, 0, m.vocab_size - 1);
}

void set_structured(SamplingParams& p, StructuredKind kind, std::string text, const char* param) {
  if (p.structured.active())
    bad("give only one structured-output constraint (response_format, guided_*, structured_outputs)", param);
  p.structured.kind = kind;
  p.structured.text = std::move(text);
}

// A schema given as an object or as JSON text.
std::string schema_text(const Json& v, const char* param) {
  if (v.is_object() || v.is_boolean()) return dump(v);
  if (v.is_string()) return v.get<std::string>();
  bad(std::string("'") + param + "' must be a JSON Schema object", param);
}

// One of the strings exactly: an alternation of escaped literals (as the Python package does).
std::string choice_regex(const Json& v, const char* param) {
  if (!v.is_array() || v.empty()) bad(std::string("'") + param + "' must be a non-empty array of strings", param);
  std::string re = "(";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) bad(std::string("'") + param + "' must be a non-empty array of strings", param);
    if (i) re += "|";
    for (char c : v[i].get<std::string>()) {
      if (std::string_view("\\.^$*+?{}[]|()").find(c) != std::string_view::npos) re += '\\';
      re += c;
    }
  }
  return re + ")";
}

// OpenAI's response_format and vLLM's guided_* / structured_outputs -> SamplingParams::structured
// (docs/structured-outputs.md). Specs are compiled (and rejected) when the request is added.
void parse_structured(const Json& b, SamplingParams& p) {
  if (const Json* rf = field(b, "response_format")) {
    const char* P = "response_format";
    if (!rf->is_object()) bad("'response_format' must be an object", P);
    auto type = get_string(*rf, "type");
    if (!type) bad("'response_format.type' is required", P);
    if (*type == "json_object") {
      set_structured(p, StructuredKind::kJsonObject, "", P);
    } else if (*type == "json_schema") {
      const Json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) bad("response_format 'json_schema' needs a 'json_schema' object", P);
      const Json* schema = field(*js, "schema");
      if (!schema) bad("response_format 'json_schema' needs 'json_schema.schema'", P);
      set_structured(p, StructuredKind::kJsonSchema, schema_text(*schema, P), P);
    } else if (*type != "text") {
      bad("response_format type must be one of text, json_object, json_schema; got '" + *type + "'", P);
    }
  }
  if (const Json* g = field(b, "guided_json")) set_structured(p, StructuredKind::kJsonSchema, schema_text(*g, "guided_json"), "guided_json");
  if (auto g = get_string(b, "guided_regex")) set_structured(p, StructuredKind::kRegex, *g, "guided_regex");
  if (auto g = get_string(b, "guided_grammar")) set_structured(p, StructuredKind::kGrammar, *g, "guided_grammar");
  if (const Json* g = field(b, "guided_choice")) set_structured(p, StructuredKind::kRegex, choice_regex(*g, "guided_choice"), "guided_choice");
  if (const Json* so = field(b, "structured_outputs")) {
    const char* P = "structured_outputs";
    if (!so->is_object()) bad("'structured_outputs' must be an object", P);
    const bool had = p.structured.active();  // {"disable_any_whitespace"} alone modifies response_format
    if (const Json* j = field(*so, "json")) set_structured(p, StructuredKind::kJsonSchema, schema_text(*j, P), P);
    if (auto r = get_string(*so, "regex")) set_structured(p, StructuredKind::kRegex, *r, P);
    if (auto g = get_string(*so, "grammar")) set_structured(p, StructuredKind::kGrammar, *g, P);
    if (const Json* c = field(*so, "choice")) set_structured(p, StructuredKind::kRegex, choice_regex(*c, P), P);
    if (auto o = get_bool(*so, "json_object"); o && *o) set_structured(p, StructuredKind::kJsonObject, "", P);
    if (auto w = get_bool(*so, "disable_any_whitespace")) p.structured.disable_any_whitespace = *w;
    if (!p.structured.active() && !had)
      bad("'structured_outputs' needs one of json, regex, choice, grammar, json_object", P);
  }
}

// Sampling fields shared by both endpoints (OpenAI's plus vLLM's extras).
void parse_sampling(const Json& b, const ModelInfo& m, const RequestLimits& lim, SamplingParams& p) {
  if (auto n = get_int(b, "n", 1, lim.max_n)) p.n = (int)*n;
  if (auto t = get_number(b, "temperature", 0.0, 2.0)) p.temperature = (float)*t;
  if (auto t = get_number(b, "top_p", 0.0, 1.0)) {
    if (*t <= 0.0) bad("'top_p' must be in (0, 1], got " + Json(*t).dump(), "top_p");
    p.top_p = (float)*t;
  }
  if (auto k = get_int(b, "top_k", -1, m.vocab_size)) p.top_k = (int)*k;
  if (auto x = get_number(b, "min_p", 0.0, 1.0)) p.min_p = (float)*x;
  if (auto x = get_number(b, "presence_penalty", -2.0, 2.0)) p.presence_penalty = (float)*x;
  if (auto x = get_number(b, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = (float)*x;
  if (auto x = get_number(b, "repetition_penalty", 1e-6, 100.0)) p.repetition_penalty = (float)*x;
  if (const Json* s = field(b, "seed")) {
    // Any 64-bit integer (negative seeds are reinterpreted, like numpy does).
    p.seed = (uint64_t)to_int(*s, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  }
  if (const Json* s = field(b, "stop")) {
    std::vector<std::string> stops;
    if (s->is_string()) {
      stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if ((int)s->size() > lim.max_stop)
        bad("'stop' may hold at most " + std::to_string(lim.max_stop) + " strings, got " + std::to_string(s->size()),
            "stop");
      for (const auto& e : *s) {
        if (!e.is_string()) bad("'stop' entries must be strings, got " + std::string(type_name(e)), "stop");
        stops.push_back(e.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or an array of strings, got " + std::string(type_name(*s)), "stop");
    }
    for (const auto& st : stops) {
      if (st.empty()) bad("'stop' strings must not be empty", "stop");
      if ((int)st.size() > lim.max_stop_bytes)
        bad("'stop' strings may be at most " + std::to_string(lim.max_stop_bytes) + " bytes", "stop");
    }
    p.stop = std::move(stops);
  }
  if (const Json* s = field(b, "stop_token_ids")) {
    if (!s->is_array()) bad("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    if ((int)s->size() > lim.max_stop * 64) bad("'stop_token_ids' is too long", "stop_token_ids");
    for (const auto& e : *s) p.stop_token_ids.push_back(token_id(e, "stop_token_ids", m));
  }
  if (const Json* lb = field(b, "logit_bias")) {
    if (!lb->is_object()) bad("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    if ((int)lb->size() > lim.max_logit_bias)
      bad("'logit_bias' may hold at most " + std::to_string(lim.max_logit_bias) + " entries, got " +
              std::to_string(lb->size()),
          "logit_bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      bool ok = !key.empty() && key.size() <= 10;
      for (char c : key) ok = ok && c >= '0' && c <= '9';
      if (ok) id = std::stoll(key);
      if (!ok || id >= m.vocab_size)
        bad("'logit_bias' keys must be token ids in [0, " + std::to_string(m.vocab_size) + "), got '" + key + "'",
            "logit_bias");
      if (!it.value().is_number()) bad("'logit_bias' values must be numbers", "logit_bias");
      const double v = it.value().get<double>();
      if (!std::isfinite(v) || v < -100.0 || v > 100.0)
        bad("'logit_bias' values must be in [-100, 100], got " + it.value().dump(), "logit_bias");
      p.logit_bias[(int32_t)id] = (float)v;
    }
  }
  if (auto x = get_bool(b, "ignore_eos")) p.ignore_eos = *x;
  if (auto x = get_bool(b, "include_stop_str_in_output")) p.include_stop_str_in_output = *x;
  if (auto x = get_bool(b, "skip_special_tokens")) p.skip_special_tokens = *x;
  if (auto x = get_int(b, "min_tokens", 0, m.max_model_len)) p.min_tokens = *x;

  parse_structured(b, p);
  if (const Json* t = field(b, "tools")) {
    if (!t->is_array()) bad("'tools' must be an array", "tools");
    if (!t->empty()) bad("tool calling is not supported by this server yet", "tools");
  }
  if (const Json* tc = field(b, "tool_choice")) {
    if (!(tc->is_string() && tc->get<std::string>() == "none") && !(tc->is_string() && tc->get<std::string>() == "auto"))
      bad("'tool_choice' other than \"none\" / \"auto\" needs tools, which this server does not support yet",
          "tool_choice");
  }
  if (const Json* f = field(b, "functions"))
    if (!f->is_array() || !f->empty()) bad("function calling is not supported by this server", "functions");
  if (auto bo = get_int(b, "best_of", 1, lim.max_n))
    if (*bo != p.n) bad("'best_of' is not supported (it must equal n)", "best_of");
}

// max_tokens / max_completion_tokens against the context left after the prompt.
void parse_max_tokens(const Json& b, GenRequest& g, const ModelInfo& m, const RequestLimits& lim,
                      std::optional<int64_t> dflt) {
  const int64_t hi = lim.max_tokens > 0 ? lim.max_tokens : m.max_model_len;
  std::optional<int64_t> mt = get_int(b, "max_tokens", 1, std::numeric_limits<int64_t>::max());
  if (auto mct = get_int(b, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max())) mt = mct;
  const char* which = field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (mt && *mt > hi)
    bad(std::string("'") + which + "' must be at most " + std::to_string(hi) + ", got " + std::to_string(*mt), which);
  size_t longest = 0;
  for (const auto& p : g.prompts) longest = std::max(longest, p.size());
  if ((int64_t)longest >= m.max_model_len)
    bad("This model's maximum context length is " + std::to_string(m.max_model_len) +
            " tokens. However, your prompt has " + std::to_string(longest) + " tokens. Please reduce the length.",
        g.kind == Kind::kChat ? "messages" : "prompt", "context_length_exceeded");
  if (mt && (int64_t)longest + *mt > m.max_model_len)
    bad("This model's maximum context length is " + std::to_string(m.max_model_len) + " tokens. However, you requested " +
            std::to_string(longest + *mt) + " tokens (" + std::to_string(longest) + " in the prompt, " +
            std::to_string(*mt) + " for the completion). Please reduce the length of the prompt or " + which + ".",
        which, "context_length_exceeded");
  if (!mt && dflt) mt = std::min<int64_t>(*dflt, m.max_model_len - (int64_t)longest);
  if (!mt && lim.max_tokens > 0) mt = std::min<int64_t>(lim.max_tokens, m.max_model_len - (int64_t)longest);
  g.params.max_tokens = mt;
}

void parse_stream(const Json& b, GenRequest& g) {
  if (auto s = get_bool(b, "stream")) g.stream = *s;
  if (const Json* so = field(b, "stream_options")) {
    if (!so->is_object()) bad("'stream_options' must be an object", "stream_options");
    if (!g.stream) bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (auto u = get_bool(*so, "include_usage")) g.include_usage = *u;
  }
}

// Engine-side validation (SamplingParams::validate) phrased as a 400 naming the field.
void validate_params(GenRequest& g, const ModelInfo& m, const RequestLimits& lim) {
  SamplingLimits sl;
  sl.max_n = lim.max_n;
  sl.max_logprobs = lim.max_top_logprobs;
  sl.max_stop_strings = lim.max_stop;
  sl.max_stop_string_bytes = lim.max_stop_bytes;
  try {
    g.params.validate(m.vocab_size, sl);
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string prefix = "invalid sampling parameters: ";
    if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
    std::string param = msg.substr(0, msg.find_first_of(" ["));
    if (param == "structured") param = "response_format";
    bad(msg, param);
  }
}

std::string message_text(const Json& content, size_t i) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad("messages[" + std::to_string(i) + "].content must be a string or an array of text parts, got " +
            type_name(content),
        "messages");
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad("messages[" + std::to_string(i) + "].content parts must be objects with a 'type'", "messages");
    if (part["type"].get<std::string>() != "text")
      bad("messages[" + std::to_string(i) + "]: only text content parts are supported, got '" +
              part["type"].get<std::string>() + "'",
          "messages");
    if (!part.contains("text") || !part["text"].is_string())
      bad("messages[" + std::to_string(i) + "]: a text part needs a string 'text'", "messages");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

Json parse_body(const std::string& body, int max_depth) {
  if (body.empty()) bad("the request body is empty; expected a JSON object");
  Json j;
  try {
    // The parser itself is iterative; the cap keeps our own recursive walks (and dumps) shallow.
    j = Json::parse(body, [max_depth](int depth, Json::parse_event_t, Json&) {
      if (depth > max_depth) throw ApiError(400, "JSON nesting is deeper than " + std::to_string(max_depth));
      return true;
    });
  } catch (const ApiError&) {
    throw;
  } catch (const Json::exception& e) {
    bad(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(std::string("the request body must be a JSON object, got ") + type_name(j));
  return j;
}

std::vector<int32_t> render_chat(const Json& messages, bool thinking, const std::string& effort, const ModelInfo& m,
                                 const RequestLimits& lim) {
  if (!messages.is_array()) bad("'messages' must be an array, got " + std::string(type_name(messages)), "messages");
  if (messages.empty()) bad("'messages' must not be empty", "messages");
  if ((int)messages.size() > lim.max_messages)
    bad("'messages' may hold at most " + std::to_string(lim.max_messages) + " messages", "messages");
  tokenizer::chat::Json msgs = tokenizer::chat::Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& in = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!in.is_object()) bad(at + " must be an object, got " + type_name(in), "messages");
    auto role_it = in.find("role");
    if (role_it == in.end() || !role_it->is_string()) bad(at + ".role must be a string", "messages");
    const std::string role = role_it->get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      bad(at + ".role '" + role + "' is not one of system, user, assistant, developer, tool", "messages");
    tokenizer::chat::Json out = {{"role", role}};
    const Json* content = field(in, "content");
    if (content) {
      out["content"] = message_text(*content, i);
    } else if (role != "assistant") {
      bad(at + ".content is required for role '" + role + "'", "messages");
    } else {
      out["content"] = "";
    }
    if (role == "assistant") {
      if (const Json* rc = field(in, "reasoning_content")) {
        if (!rc->is_string()) bad(at + ".reasoning_content must be a string", "messages");
        out["reasoning_content"] = rc->get<std::string>();
      }
      if (const Json* tc = field(in, "tool_calls")) {
        if (!tc->is_array()) bad(at + ".tool_calls must be an array", "messages");
        if (!tc->empty()) bad(at + ": tool calls are not supported by this server yet", "messages");
      }
    }
    if (role == "tool") bad(at + ": tool messages are not supported by this server yet", "messages");
    msgs.push_back(std::move(out));
  }
  try {
    if (m.v41) {
      tokenizer::chat::V41Options opt;
      opt.thinking = thinking;
      // V4.1 spells efforts "low", "high", "xhigh", "max" ("" = its default, high).
      opt.reasoning_effort = effort == "minimal" ? "low" : effort == "medium" ? "" : effort;
      return tokenizer::chat::render_v41(msgs, opt).encode(*m.tok);
    }
    tokenizer::chat::V4Options opt;
    opt.thinking = thinking;
    // V4: "" (low, the default), "high" or "max".
    opt.reasoning_effort = (effort == "high" || effort == "max") ? effort : "";
    return tokenizer::chat::render_v4(msgs, opt).encode(*m.tok);
  } catch (const std::exception& e) {
    // The renderer rejects conversations the model's reference encoder rejects.
    bad(std::string("invalid conversation: ") + e.what(), "messages");
  }
}

namespace {

// Thinking switch: chat_template_kwargs.{thinking,enable_thinking} (vLLM), thinking: bool or
// {"type": "enabled"|"disabled"} (DeepSeek API), reasoning_effort (OpenAI).
void parse_thinking(const Json& b, bool& thinking, std::string& effort) {
  if (const Json* k = field(b, "chat_template_kwargs")) {
    if (!k->is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (auto t = get_bool(*k, "thinking")) thinking = *t;
    if (auto t = get_bool(*k, "enable_thinking")) thinking = *t;
  }
  if (const Json* t = field(b, "thinking")) {
    if (t->is_boolean()) {
      thinking = t->get<bool>();
    } else if (t->is_object()) {
      auto type = get_string(*t, "type");
      if (!type || (*type != "enabled" && *type != "disabled"))
        bad("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking");
      thinking = *type == "enabled";
    } else {
      bad("'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}", "thinking");
    }
  }
  if (auto e = get_string(b, "reasoning_effort")) {
    if (*e == "minimal" || *e == "low" || *e == "medium" || *e == "high" || *e == "xhigh" || *e == "max") effort = *e;
    else bad("'reasoning_effort' must be one of minimal, low, medium, high, xhigh, max", "reasoning_effort");
  }
}

}  // namespace

GenRequest parse_chat(const Json& b, const ModelInfo& m, const RequestLimits& lim) {
  GenRequest g;
  g.kind = Kind::kChat;
  g.model = resolve_model(b, m);
  parse_stream(b, g);
  std::string effort;
  parse_thinking(b, g.thinking, effort);
  parse_sampling(b, m, lim, g.params);
  // Reasoning is routed by the "</think>" token, so special tokens stay out of the text.
  g.params.skip_special_tokens = true;
  if (auto lp = get_bool(b, "logprobs")) g.want_logprobs = *lp;
  if (auto tl = get_int(b, "top_logprobs", 0, lim.max_top_logprobs)) {
    if (!g.want_logprobs) bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    g.top_logprobs = (int)*tl;
  }
  if (g.want_logprobs) g.params.logprobs = g.top_logprobs;
  const Json* msgs = field(b, "messages");
  if (!msgs) bad("'messages' is required", "messages");
  g.prompts.push_back(render_chat(*msgs, g.thinking, effort, m, lim));
  parse_max_tokens(b, g, m, lim, std::nullopt);
  validate_params(g, m, lim);
  return g;
}

GenRequest parse_completion(const Json& b, const ModelInfo& m, const RequestLimits& lim) {
  GenRequest g;
  g.kind = Kind::kCompletion;
  g.model = resolve_model(b, m);
  parse_stream(b, g);
  parse_sampling(b, m, lim, g.params);
  if (const Json* lp = field(b, "logprobs")) {
    if (lp->is_boolean()) bad("'logprobs' must be an integer for /v1/completions", "logprobs");
    g.want_logprobs = true;
    g.top_logprobs = (int)to_int(*lp, "logprobs", 0, lim.max_top_logprobs);
    g.params.logprobs = g.top_logprobs;
  }
  if (auto e = get_bool(b, "echo")) g.echo = *e;
  if (g.echo && g.want_logprobs) bad("'echo' together with 'logprobs' is not supported", "echo");
  if (field(b, "suffix")) bad("'suffix' is not supported", "suffix");
  bool add_special = true;
  if (auto a = get_bool(b, "add_special_tokens")) add_special = *a;
  const Json* p = field(b, "prompt");
  if (!p) bad("'prompt' is required", "prompt");
  auto add_ids = [&](const Json& arr) {
    if (arr.empty()) bad("a token-id prompt must not be empty", "prompt");
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (const auto& e : arr) {
      if (!e.is_number_integer() && !e.is_number_unsigned())
        bad("token-id prompts must hold integers, got " + std::string(type_name(e)), "prompt");
      ids.push_back(token_id(e, "prompt", m));
    }
    if ((int64_t)ids.size() >= m.max_model_len) {
      g.prompts.push_back(std::move(ids));  // reported by the length check below
      g.prompt_texts.emplace_back();
      return;
    }
    g.prompt_texts.push_back(g.echo ? m.tok->decode(ids, false) : std::string());
    g.prompts.push_back(std::move(ids));
  };
  auto add_text = [&](const std::string& s) {
    if (s.empty()) bad("'prompt' must not be empty", "prompt");
    g.prompts.push_back(m.tok->encode(s, add_special));
    g.prompt_texts.push_back(s);
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad("'prompt' must not be empty", "prompt");
    const Json& first = (*p)[0];
    if (first.is_number()) {
      add_ids(*p);
    } else {
      if ((int)p->size() > lim.max_prompts)
        bad("'prompt' may hold at most " + std::to_string(lim.max_prompts) + " prompts", "prompt");
      for (const auto& e : *p) {
        if (e.is_string()) add_text(e.get<std::string>());
        else if (e.is_array()) add_ids(e);
        else bad("'prompt' must be a string, an array of strings, token ids, or arrays of token ids", "prompt");
      }
    }
  } else {
    bad("'prompt' must be a string, an array of strings, token ids, or arrays of token ids; got " +
            std::string(type_name(*p)),
        "prompt");
  }
  if ((int64_t)g.prompts.size() * g.params.n > (int64_t)lim.max_n * lim.max_prompts)
    bad("too many sequences in one request", "n");
  parse_max_tokens(b, g, m, lim, 16);  // OpenAI's legacy default
  validate_params(g, m, lim);
  return g;
}

Json handle_tokenize(const Json& b, const ModelInfo& m, const RequestLimits& lim) {
  resolve_model(b, m);
  std::vector<int32_t> ids;
  if (const Json* msgs = field(b, "messages")) {
    bool thinking = false;
    std::string effort;
    parse_thinking(b, thinking, effort);
    ids = render_chat(*msgs, thinking, effort, m, lim);
  } else {
    auto prompt = get_string(b, "prompt");
    if (!prompt) bad("'prompt' (a string) or 'messages' is required", "prompt");
    bool add_special = true;
    if (auto a = get_bool(b, "add_special_tokens")) add_special = *a;
    ids = m.tok->encode(*prompt, add_special);
  }
  Json out = {{"count", ids.size()}, {"max_model_len", m.max_model_len}, {"tokens", ids}};
  if (auto strs = get_bool(b, "return_token_strs"); strs && *strs) {
    Json s = Json::array();
    for (int32_t id : ids) s.push_back(tokenizer::utf8::to_valid(m.tok->token_bytes(id)));
    out["token_strs"] = s;
  }
  return out;
}

Json handle_detokenize(const Json& b, const ModelInfo& m) {
  resolve_model(b, m);
  const Json* t = field(b, "tokens");
  if (!t || !t->is_array()) bad("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (const auto& e : *t) ids.push_back(token_id(e, "tokens", m));
  return {{"prompt", m.tok->decode(ids, false)}};
}

Delta apply_output(ChoiceState& c, const RequestOutput& o, const ModelInfo& m) {
  Delta d;
  // One event carries one sampled token; its text is reasoning up to and including the event of
  // the "</think>" token (that token's own text is skipped as special).
  if (c.in_reasoning) {
    d.reasoning = o.text;
    for (int32_t t : o.token_ids)
      if (t == m.think_end_id) c.in_reasoning = false;
  } else {
    d.content = o.text;
  }
  c.reasoning += d.reasoning;
  c.content += d.content;
  c.num_tokens = o.num_output_tokens;
  c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
  if (o.finished) {
    c.finished = true;
    c.finish = o.finish;
    c.error = o.error;
  }
  return d;
}

const char* finish_reason(Finish f) {
  const char* n = finish_name(f);
  return *n ? n : nullptr;
}

namespace {

// A logprob JSON can hold (-inf has no JSON spelling; vLLM writes -9999.0 too).
double finite_lp(float lp) { return std::isfinite(lp) ? (double)lp : -9999.0; }

Json token_entry(int32_t id, float lp, const ModelInfo& m) {
  std::string_view raw = m.tok->token_bytes(id);
  Json bytes = Json::array();
  for (unsigned char c : raw) bytes.push_back((int)c);
  return {{"token", tokenizer::utf8::to_valid(raw)}, {"logprob", finite_lp(lp)}, {"bytes", bytes}};
}

}  // namespace

Json chat_logprobs(const std::vector<TokenLogprobs>& lps, const ModelInfo& m) {
  Json content = Json::array();
  for (const auto& t : lps) {
    Json e = token_entry(t.token, t.logprob, m);
    Json top = Json::array();
    for (const auto& x : t.top) top.push_back(token_entry(x.token, x.logprob, m));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}, {"refusal", nullptr}};
}

Json completion_logprobs(const std::vector<TokenLogprobs>& lps, const ModelInfo& m, size_t text_offset) {
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& t : lps) {
    const std::string s = tokenizer::utf8::to_valid(m.tok->token_bytes(t.token));
    tokens.push_back(s);
    token_lps.push_back(finite_lp(t.logprob));
    Json top = Json::object();
    for (const auto& x : t.top) top[tokenizer::utf8::to_valid(m.tok->token_bytes(x.token))] = finite_lp(x.logprob);
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += s.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace deepinfer::server
