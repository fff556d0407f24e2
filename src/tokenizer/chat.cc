#include "tokenizer/chat.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "util/error.h"
#include "util/json.h"

namespace deepinfer::tokenizer::chat {

namespace {

// Control-token strings (U+FF5C "｜" and U+2581 "▁").
const std::string kUser = "<｜User｜>";
const std::string kAssistant = "<｜Assistant｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kThinkStart = "<think>";
const std::string kThinkEnd = "</think>";
const std::string kDsml = "｜DSML｜";
const std::string kLatestReminder = "<｜latest_reminder｜>";

struct Builder {
  Rendered r;
  void t(const std::string& s) { add(s, true); }   // template text
  void u(const std::string& s) { add(s, false); }  // message text
  void add(const std::string& s, bool trusted) {
    if (s.empty()) return;
    if (!r.pieces.empty() && r.pieces.back().trusted == trusted)
      r.pieces.back().text += s;
    else
      r.pieces.push_back({s, trusted});
  }
  void append(const Rendered& o) {
    for (const auto& p : o.pieces) add(p.text, p.trusted);
  }
};

// Python-like helpers over JSON dicts.
const Json* get(const Json& m, const char* k) {
  if (!m.is_object()) return nullptr;
  auto it = m.find(k);
  if (it == m.end() || it->is_null()) return nullptr;
  return &*it;
}
bool truthy(const Json* v) {
  if (!v || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_array() || v->is_object()) return !v->empty();
  if (v->is_number()) return v->get<double>() != 0;
  return true;
}
// str(value) for values used as text: strings as they are, other JSON as Python would show it
// would differ; the formats only use strings there.
std::string text_of(const Json* v) {
  if (!v || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>();
  throw Error("chat: expected a string, got " + v->dump());
}
std::string role_of(const Json& m) {
  const Json* r = get(m, "role");
  return r && r->is_string() ? r->get<std::string>() : "";
}


void dump(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_python_json_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out += '}';
      break;
    }
    case Json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        dump(v[i], out);
      }
      out += ']';
      break;
    }
    case Json::value_t::string:
      append_python_json_string(v.get_ref<const std::string&>(), out);
      break;
    case Json::value_t::number_float: {
      double d = v.get<double>();
      if (d != d) {
        out += "NaN";
      } else if (d == 1.0 / 0.0) {
        out += "Infinity";
      } else if (d == -1.0 / 0.0) {
        out += "-Infinity";
      } else {
        out += v.dump();  // shortest round-trip digits, as Python's float repr
      }
      break;
    }
    default:
      out += v.dump();
  }
}

}  // namespace

std::string python_json_dumps(const Json& v) {
  std::string out;
  dump(v, out);
  return out;
}

std::string Rendered::text() const {
  std::string s;
  for (const auto& p : pieces) s += p.text;
  return s;
}

std::vector<int32_t> Rendered::encode(const Tokenizer& tok) const {
  std::vector<Tokenizer::TextPiece> v;
  v.reserve(pieces.size());
  for (const auto& p : pieces) v.push_back({p.text, p.trusted});
  return tok.encode_pieces(v);
}

// =============================================================================================
// DeepSeek-V3 (tokenizer_config.json chat_template), state machine mirroring the template.
Rendered render_v3(const Json& messages, bool add_generation_prompt, const std::string& bos) {
  if (!messages.is_array()) throw Error("chat: messages must be an array");
  Builder b;
  // System prompts are concatenated (joined by "\n\n") and placed after BOS.
  Rendered sys;
  Builder sb;
  bool first_sp = true;
  for (const Json& m : messages) {
    if (role_of(m) != "system") continue;
    if (!first_sp) sb.t("\n\n");
    sb.u(text_of(get(m, "content")));
    first_sp = false;
  }
  b.t(bos);
  b.append(sb.r);
  bool is_first = false, is_tool = false, is_output_first = true;
  for (const Json& m : messages) {
    std::string role = role_of(m);
    const Json* content = get(m, "content");
    if (role == "user") {
      is_tool = false;
      b.t(kUser);
      b.u(text_of(content));
    }
    if (role == "assistant" && !content) {
      is_tool = false;
      const Json* calls = get(m, "tool_calls");
      if (calls && calls->is_array()) {
        for (const Json& tc : *calls) {
          const Json* fn = get(tc, "function");
          std::string type = text_of(get(tc, "type"));
          std::string name = fn ? text_of(get(*fn, "name")) : "";
          const Json* args = fn ? get(*fn, "arguments") : nullptr;
          std::string a = args && !args->is_string() ? python_json_dumps(*args) : text_of(args);
          if (!is_first) {
            b.t(kAssistant + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>");
          } else {
            b.t("\n<｜tool▁call▁begin｜>");
          }
          b.u(type);
          b.t("<｜tool▁sep｜>");
          b.u(name);
          b.t("\n```json\n");
          b.u(a);
          b.t("\n```<｜tool▁call▁end｜>");
          if (is_first) b.t("<｜tool▁calls▁end｜>" + kEos);
          is_first = true;
        }
      }
    }
    if (role == "assistant" && content) {
      if (is_tool) {
        b.t("<｜tool▁outputs▁end｜>");
        b.u(text_of(content));
        b.t(kEos);
        is_tool = false;
      } else {
        b.t(kAssistant);
        b.u(text_of(content));
        b.t(kEos);
      }
    }
    if (role == "tool") {
      is_tool = true;
      if (is_output_first) {
        b.t("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>");
        is_output_first = false;
      } else {
        b.t("\n<｜tool▁output▁begin｜>");
      }
      b.u(text_of(content));
      b.t("<｜tool▁output▁end｜>");
    }
  }
  if (is_tool) b.t("<｜tool▁outputs▁end｜>");
  if (add_generation_prompt && !is_tool) b.t(kAssistant);
  return b.r;
}

// =============================================================================================
// DeepSeek-V4 encoding.
namespace {

// Prompt texts of the V4 format (model protocol data, byte-for-byte as the model was trained).
// Reasoning-effort preambles (thinking mode, start of the prompt): "low" (default) adds none.
const std::string kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n";
const std::string kEffortMax =
    "Reasoning Effort: Beyond maximum \xE2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";
const std::string kImage = "<｜deepseek_image｜>";

// OpenAI content parts -> text (images become the image placeholder token).
Json flatten_content(const Json* c) {
  if (!c || !c->is_array()) return c ? *c : Json();
  std::string out;
  bool first = true;
  for (const Json& b : *c) {
    if (!first) out += "\n\n";
    first = false;
    if (!b.is_object()) {
      out += b.is_string() ? b.get<std::string>() : b.dump();
      continue;
    }
    std::string type = b.value("type", "");
    if (type == "image" || type == "image_url")
      out += kImage;
    else if (type == "text")
      out += b.contains("text") && b["text"].is_string() ? b["text"].get<std::string>() : "";
    else
      throw Error("chat: unsupported content block type '" + type + "'");
  }
  return Json(out);
}

void tools_block(Builder& b, const Json& tools) {
  const std::string D = kDsml;
  b.t("## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
      "invoke tools by writing a \"<" + D + "tool_calls>\" block like the following:\n\n<" + D +
      "tool_calls>\n<" + D + "invoke name=\"$TOOL_NAME\">\n<" + D +
      "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + D +
      "parameter>\n...\n</" + D + "invoke>\n<" + D + "invoke name=\"$TOOL_NAME2\">\n...\n</" + D +
      "invoke>\n</" + D + "tool_calls>\n\nString parameters should be specified as is and set "
      "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value "
      "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by " +
      kThinkStart + "), you MUST output your complete reasoning inside " + kThinkStart + "..." +
      kThinkEnd + " BEFORE any tool calls or final response.\n\nOtherwise, output directly after " +
      kThinkEnd + " with tool calls or final response.\n\n### Available Tool Schemas\n\n");
  bool first = true;
  for (const Json& t : tools) {
    if (!first) b.t("\n");
    first = false;
    const Json* fn = get(t, "function");
    if (!fn) throw Error("chat: tool without \"function\"");
    b.u(python_json_dumps(*fn));
  }
  b.t("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
      "tool calls.\n");
}

void response_format_block(Builder& b, const Json& rf) {
  b.t("\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
  b.u(python_json_dumps(rf));
}

Json merge_tool_messages(const Json& messages) {
  Json merged = Json::array();
  for (const Json& m0 : messages) {
    Json m = m0;
    std::string role = role_of(m);
    auto last_is_user_blocks = [&]() {
      return !merged.empty() && role_of(merged.back()) == "user" &&
             merged.back().contains("content_blocks");
    };
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", m.contains("tool_call_id") ? m["tool_call_id"] : Json("")},
                    {"content", m.contains("content") ? m["content"] : Json("")}};
      if (last_is_user_blocks()) {
        merged.back()["content_blocks"].push_back(block);
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", Json::array({block})}});
      }
    } else if (role == "user") {
      Json content = m.contains("content") ? flatten_content(&m["content"]) : Json("");
      Json block = {{"type", "text"}, {"text", content}};
      if (last_is_user_blocks() && !get(merged.back(), "task")) {
        merged.back()["content_blocks"].push_back(block);
      } else {
        Json n = {{"role", "user"}, {"content", content}, {"content_blocks", Json::array({block})}};
        for (const char* k : {"task", "wo_eos", "mask"})
          if (m.contains(k)) n[k] = m[k];
        merged.push_back(n);
      }
    } else {
      merged.push_back(m);
    }
  }
  return merged;
}

std::string call_id(const Json& tc) {
  const Json* id = get(tc, "id");
  if (truthy(id) && id->is_string()) return id->get<std::string>();
  const Json* fn = get(tc, "function");
  const Json* fid = fn ? get(*fn, "id") : nullptr;
  return fid && fid->is_string() ? fid->get<std::string>() : "";
}

void sort_tool_results(Json& messages) {
  std::map<std::string, int> order;
  for (Json& m : messages) {
    std::string role = role_of(m);
    const Json* calls = get(m, "tool_calls");
    if (role == "assistant" && truthy(calls)) {
      order.clear();
      int idx = 0;
      for (const Json& tc : *calls) {
        std::string id = call_id(tc);
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(get(m, "content_blocks"))) {
      Json& blocks = m["content_blocks"];
      std::vector<Json> tool_blocks;
      for (const Json& bl : blocks)
        if (bl.value("type", "") == "tool_result") tool_blocks.push_back(bl);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const Json& bl) {
          const Json* id = get(bl, "tool_use_id");
          std::string s = id && id->is_string() ? id->get<std::string>() : "";
          auto it = order.find(s);
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const Json& a, const Json& c) { return key(a) < key(c); });
        size_t k = 0;
        for (Json& bl : blocks)
          if (bl.value("type", "") == "tool_result") bl = tool_blocks[k++];
      }
    }
  }
}

int last_user_index(const Json& messages) {
  for (int i = int(messages.size()) - 1; i >= 0; --i) {
    std::string r = role_of(messages[size_t(i)]);
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

Json drop_thinking_messages(const Json& messages) {
  int last = last_user_index(messages);
  Json out = Json::array();
  for (int i = 0; i < int(messages.size()); ++i) {
    const Json& m = messages[size_t(i)];
    std::string r = role_of(m);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" ||
        r == "direct_search_results" || i >= last) {
      out.push_back(m);
    } else if (r == "assistant") {
      Json c = m;
      c.erase("reasoning");
      out.push_back(c);
    }  // other roles before the last user message are dropped
  }
  return out;
}

// Tool-call arguments as DSML parameters.
void dsml_arguments(Builder& b, const Json& tc) {
  const Json* fn = get(tc, "function");
  const Json* args = fn ? get(*fn, "arguments") : nullptr;
  Json parsed;
  if (args && args->is_string()) {
    try {
      parsed = Json::parse(args->get<std::string>());
    } catch (const Json::exception& e) {
      throw Error(std::string("chat: tool call arguments are not JSON: ") + e.what());
    }
  } else if (args) {
    parsed = *args;
  }
  if (!parsed.is_object()) throw Error("chat: tool call arguments must be a JSON object");
  bool first = true;
  for (auto it = parsed.begin(); it != parsed.end(); ++it) {
    if (!first) b.t("\n");
    first = false;
    bool is_str = it.value().is_string();
    b.t("<" + kDsml + "parameter name=\"");
    b.u(it.key());
    b.t(std::string("\" string=\"") + (is_str ? "true" : "false") + "\">");
    b.u(is_str ? it.value().get<std::string>() : python_json_dumps(it.value()));
    b.t("</" + kDsml + "parameter>");
  }
}

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"},   {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},   {"read_url", "<｜read_url｜>"}};
  return m;
}

void render_message(Builder& b, size_t index, const Json& msgs, const V4Options& o,
                    bool drop_thinking) {
  const Json& msg = msgs[index];
  int last_user = last_user_index(msgs);
  std::string role = role_of(msg);
  Json flat = flatten_content(get(msg, "content"));
  const Json* content = flat.is_null() ? nullptr : &flat;
  const Json* tools = get(msg, "tools");
  const Json* rf = get(msg, "response_format");
  const Json* calls = get(msg, "tool_calls");
  const Json* reasoning = get(msg, "reasoning");
  bool wo_eos = truthy(get(msg, "wo_eos"));
  const std::string& eff = o.reasoning_effort.empty() ? std::string("low") : o.reasoning_effort;
  if (eff != "low" && eff != "high" && eff != "max")
    throw Error("chat: invalid reasoning effort '" + eff + "' (low, high or max)");
  if (index == 0 && o.thinking) b.t(eff == "max" ? kEffortMax : eff == "high" ? kEffortHigh : "");

  if (role == "system") {
    b.u(text_of(content));
    if (truthy(tools)) {
      b.t("\n\n");
      tools_block(b, *tools);
    }
    if (truthy(rf)) response_format_block(b, *rf);
  } else if (role == "developer") {
    if (!truthy(content)) throw Error("chat: developer message without content");
    b.t(kUser);
    b.u(text_of(content));
    if (truthy(tools)) {
      b.t("\n\n");
      tools_block(b, *tools);
    }
    if (truthy(rf)) response_format_block(b, *rf);
  } else if (role == "user") {
    b.t(kUser);
    const Json* blocks = get(msg, "content_blocks");
    if (truthy(blocks)) {
      bool first = true;
      for (const Json& bl : *blocks) {
        if (!first) b.t("\n\n");
        first = false;
        std::string type = text_of(get(bl, "type"));
        if (type == "text") {
          b.u(text_of(get(bl, "text")));
        } else if (type == "image" || type == "image_url") {
          b.t(kImage);
        } else if (type == "tool_result") {
          const Json* tc = get(bl, "content");
          b.t("<tool_result>");
          if (tc && tc->is_array()) {
            bool f2 = true;
            for (const Json& part : *tc) {
              if (!f2) b.u("\n\n");
              f2 = false;
              std::string pt = text_of(get(part, "type"));
              if (pt == "text")
                b.u(text_of(get(part, "text")));
              else
                b.u("[Unsupported " + pt + "]");
            }
          } else {
            b.u(text_of(tc));
          }
          b.t("</tool_result>");
        } else {
          b.u("[Unsupported " + type + "]");
        }
      }
    } else {
      b.u(text_of(content));
    }
  } else if (role == "latest_reminder") {
    b.t(kLatestReminder);
    b.u(text_of(content));
  } else if (role == "tool") {
    throw Error("chat: tool messages must follow an assistant tool call");
  } else if (role == "assistant") {
    bool prev_task = index > 0 && get(msgs[index - 1], "task");
    if (o.thinking && !prev_task && (!drop_thinking || int(index) > last_user)) {
      b.u(text_of(reasoning));
      b.t(kThinkEnd);
    }
    b.u(text_of(content));
    if (truthy(calls)) {
      b.t("\n\n<" + kDsml + "tool_calls>\n");
      bool first = true;
      for (const Json& tc : *calls) {
        if (!first) b.t("\n");
        first = false;
        const Json* fn = get(tc, "function");
        b.t("<" + kDsml + "invoke name=\"");
        b.u(fn ? text_of(get(*fn, "name")) : "");
        b.t("\">\n");
        dsml_arguments(b, tc);
        b.t("\n</" + kDsml + "invoke>");
      }
      b.t("\n</" + kDsml + "tool_calls>");
    }
    if (!wo_eos) b.t(kEos);
  } else {
    throw Error("chat: unknown role '" + role + "'");
  }

  if (index + 1 < msgs.size()) {
    std::string next = role_of(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return;
  }
  const Json* task = get(msg, "task");
  if (task) {
    std::string t = task->is_string() ? task->get<std::string>() : "";
    auto it = task_tokens().find(t);
    if (it == task_tokens().end()) throw Error("chat: invalid task '" + t + "'");
    if (t != "action") {
      b.t(it->second);
    } else {
      b.t(kAssistant + (o.thinking ? kThinkStart : kThinkEnd) + it->second);
    }
  } else if (role == "user" || role == "developer" ||
             (role == "system" &&
              (index + 1 == msgs.size() || role_of(msgs[index + 1]) == "assistant"))) {
    b.t(kAssistant);
    if (o.thinking && (!drop_thinking || int(index) >= last_user))
      b.t(kThinkStart);
    else
      b.t(kThinkEnd);
  }
}

}  // namespace

Rendered render_v4(const Json& messages, const V4Options& o) {
  if (!messages.is_array()) throw Error("chat: messages must be an array");
  Json msgs = merge_tool_messages(messages);
  sort_tool_results(msgs);
  Builder b;
  if (o.add_bos) b.t(kBos);
  bool drop = o.drop_thinking;
  for (const Json& m : msgs)
    if (truthy(get(m, "tools"))) drop = false;
  if (o.thinking && drop) msgs = drop_thinking_messages(msgs);
  for (size_t i = 0; i < msgs.size(); ++i) render_message(b, i, msgs, o, drop);
  return b.r;
}

// =============================================================================================
// Parsing model output.
namespace {

// Finds the earliest of `stops` at or after pos; returns {new_pos, text before, matched index}.
struct Stop {
  size_t next;
  std::string before;
  int which;  // -1: none
};
Stop read_until(const std::string& text, size_t pos, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  int which = -1;
  for (size_t k = 0; k < stops.size(); ++k) {
    size_t p = text.find(stops[k], pos);
    if (p != std::string::npos && p < best) {
      best = p;
      which = int(k);
    }
  }
  if (which < 0) return {text.size(), text.substr(std::min(pos, text.size())), -1};
  return {best + stops[size_t(which)].size(), text.substr(pos, best - pos), which};
}

}  // namespace

ParsedMessage parse_v4(const std::string& text, bool thinking) {
  ParsedMessage out;
  const std::string tc_start = "\n\n<" + kDsml + "tool_calls";
  const std::string tc_end = "</" + kDsml + "tool_calls>";
  size_t pos = 0;
  int stop = -1;
  if (thinking) {
    Stop s = read_until(text, pos, {kThinkEnd, tc_start});
    out.reasoning = s.before;
    if (s.which != 0) throw Error("chat: invalid thinking format: missing </think>");
    pos = s.next;
  }
  Stop s = read_until(text, pos, {kEos, tc_start});
  out.content = s.before;
  pos = s.next;
  bool tool_calling = s.which == 1;
  if (!tool_calling && s.which != 0) throw Error("chat: invalid format: missing EOS token");
  stop = tool_calling ? 1 : 0;  // 0 = EOS, 1 = other
  if (tool_calling) {
    const std::string inv = "<" + kDsml + "invoke", inv_end = "</" + kDsml + "invoke";
    const std::string par = "<" + kDsml + "parameter", par_end = "/" + kDsml + "parameter";
    while (pos < text.size()) {
      Stop a = read_until(text, pos, {inv, tc_end});
      if (a.before != ">\n") throw Error("chat: tool call format error: expected '>\\n'");
      pos = a.next;
      if (a.which == 1) break;
      if (a.which < 0) throw Error("chat: missing special token in tool calls");
      Stop nm = read_until(text, pos, {par, inv_end});
      pos = nm.next;
      // ^\s*name="(.*?)">\n$
      const std::string& c = nm.before;
      size_t i = 0;
      while (i < c.size() && (c[i] == ' ' || c[i] == '\t' || c[i] == '\n' || c[i] == '\r' ||
                              c[i] == '\f' || c[i] == '\v'))
        ++i;
      const std::string tail = "\">\n";
      if (c.compare(i, 6, "name=\"") != 0 || c.size() < i + 6 + tail.size() ||
          c.compare(c.size() - tail.size(), tail.size(), tail) != 0)
        throw Error("chat: tool name format error");
      std::string name = c.substr(i + 6, c.size() - tail.size() - i - 6);
      std::vector<std::pair<std::string, std::pair<std::string, bool>>> args;
      int st = nm.which;
      while (st == 0) {
        Stop p = read_until(text, pos, {par_end});
        pos = p.next;
        // ^ name="(.*?)" string="(true|false)">(.*?)<$   (lazy: first '" string="')
        const std::string& pc = p.before;
        const std::string pre = " name=\"";
        if (pc.compare(0, pre.size(), pre) != 0 || pc.empty() || pc.back() != '<')
          throw Error("chat: parameter format error");
        bool found = false;
        for (size_t q = pre.size(); q < pc.size(); ++q) {
          for (const char* flag : {"true", "false"}) {
            std::string mid = std::string("\" string=\"") + flag + "\">";
            if (pc.compare(q, mid.size(), mid) == 0 && q + mid.size() <= pc.size() - 1) {
              std::string pname = pc.substr(pre.size(), q - pre.size());
              std::string val = pc.substr(q + mid.size(), pc.size() - 1 - q - mid.size());
              for (auto& kv : args)
                if (kv.first == pname) throw Error("chat: duplicate parameter '" + pname + "'");
              args.push_back({pname, {val, std::string(flag) == "true"}});
              found = true;
              break;
            }
          }
          if (found) break;
        }
        if (!found) throw Error("chat: parameter format error");
        Stop n2 = read_until(text, pos, {par, inv_end});
        pos = n2.next;
        if (n2.before != ">\n") throw Error("chat: parameter format error: expected '>\\n'");
        st = n2.which;
      }
      std::string json = "{";
      for (size_t k = 0; k < args.size(); ++k) {
        if (k) json += ", ";
        json += python_json_dumps(Json(args[k].first)) + ": ";
        json += args[k].second.second ? python_json_dumps(Json(args[k].second.first))
                                      : args[k].second.first;
      }
      json += "}";
      out.tool_calls.push_back({name, json});
    }
    Stop e = read_until(text, pos, {kEos});
    if (!e.before.empty()) throw Error("chat: unexpected content after tool calls");
    pos = e.next;
    stop = e.which == 0 ? 0 : (e.which < 0 ? -1 : 1);
  }
  if (pos != text.size() || (stop != 0 && stop != -1)) throw Error("chat: unexpected content at end");
  for (const std::string& sp : {kBos, kEos, kThinkStart, kThinkEnd, kDsml})
    if (out.content.find(sp) != std::string::npos || out.reasoning.find(sp) != std::string::npos)
      throw Error("chat: unexpected special token '" + sp + "' in content");
  return out;
}

ParsedMessage parse_v3(const std::string& text0) {
  ParsedMessage out;
  std::string text = text0;
  size_t eos = text.find(kEos);
  if (eos != std::string::npos) {
    if (eos + kEos.size() != text.size()) throw Error("chat: unexpected content after EOS");
    text.resize(eos);
  }
  size_t te = text.find(kThinkEnd);
  if (te != std::string::npos) {
    size_t ts = text.rfind(kThinkStart, te);
    size_t from = ts == std::string::npos ? 0 : ts + kThinkStart.size();
    out.reasoning = text.substr(from, te - from);
    text = text.substr(te + kThinkEnd.size());
  }
  const std::string begin = "<｜tool▁calls▁begin｜>", end = "<｜tool▁calls▁end｜>";
  const std::string cb = "<｜tool▁call▁begin｜>", ce = "<｜tool▁call▁end｜>", sep = "<｜tool▁sep｜>";
  size_t tb = text.find(begin);
  if (tb == std::string::npos) {
    out.content = text;
    return out;
  }
  out.content = text.substr(0, tb);
  size_t pos = tb + begin.size();
  size_t stop = text.find(end, pos);
  if (stop == std::string::npos) throw Error("chat: tool calls without <｜tool▁calls▁end｜>");
  while (true) {
    size_t b = text.find(cb, pos);
    if (b == std::string::npos || b >= stop) break;
    size_t e = text.find(ce, b);
    if (e == std::string::npos || e > stop) throw Error("chat: unterminated tool call");
    std::string call = text.substr(b + cb.size(), e - b - cb.size());
    size_t s = call.find(sep);
    if (s == std::string::npos) throw Error("chat: tool call without <｜tool▁sep｜>");
    std::string rest = call.substr(s + sep.size());
    size_t nl = rest.find("\n```json\n");
    if (nl == std::string::npos || rest.size() < nl + 9 + 4 || rest.compare(rest.size() - 4, 4, "\n```") != 0)
      throw Error("chat: tool call arguments are not a ```json block");
    out.tool_calls.push_back({rest.substr(0, nl), rest.substr(nl + 9, rest.size() - 4 - nl - 9)});
    pos = e + ce.size();
  }
  if (stop + end.size() != text.size()) throw Error("chat: unexpected content after tool calls");
  return out;
}

}  // namespace deepinfer::tokenizer::chat
