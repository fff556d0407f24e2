// DeepSeek-V4.1 chat format (see chat.h). Rendering rules, in the reference's order:
//   1. message normalisation: "reasoning" is also read as "reasoning_content"; content part lists
//      become one string joined by "\n\n"; image parts are refused (no vision tower yet);
//   2. tool messages merge into user turns as <tool_result> blocks, sorted by the calling order;
//   3. in thinking mode (unless a message carries tools) reasoning before the last user turn is
//      dropped, and earlier developer messages with it;
//   4. every message renders with the V4.1 prefixes: <｜System｜> (conversation start, and every
//      mid-conversation system message), numeric reasoning effort, spaced DSML tool calls, and the
//      assistant header after user / developer / mid-conversation system turns.
#include <algorithm>
#include <map>

#include "tokenizer/chat.h"
#include "util/error.h"

namespace deepinfer::tokenizer::chat {
namespace {

// Control-token strings (U+FF5C "｜" and U+2581 "▁").
const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kSystem = "<｜System｜>";
const std::string kUser = "<｜User｜>";
const std::string kAssistant = "<｜Assistant｜>";
const std::string kLatestReminder = "<｜latest_reminder｜>";
const std::string kThinkStart = "<think>";
const std::string kThinkEnd = "</think>";
const std::string kDsml = "｜DSML｜";
const std::string kImage = "<｜deepseek_image｜>";
// V4.1's tag names carry a leading space (V4: "tool_calls", "invoke", "parameter").
const std::string kCalls = " calls", kInvoke = " invoke", kParam = " parameter";

struct Builder {
  Rendered r;
  void t(const std::string& s) { add(s, true); }   // template text
  void u(const std::string& s) { add(s, false); }  // message text
  void add(const std::string& s, bool trusted) {
    if (s.empty()) return;
    if (!r.pieces.empty() && r.pieces.back().trusted == trusted) r.pieces.back().text += s;
    else r.pieces.push_back({s, trusted});
  }
};

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
std::string text_of(const Json* v) {
  if (!v || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>();
  throw Error("chat: expected a string, got " + v->dump());
}
std::string role_of(const Json& m) { return text_of(get(m, "role")); }

void reject_image_text(const Json* v) {
  if (v && v->is_string() && v->get_ref<const std::string&>().find(kImage) != std::string::npos)
    throw Error("chat: message text contains the image placeholder " + kImage + "; image inputs are not supported");
}

// Step 1.
Json normalize(const Json& messages) {
  if (!messages.is_array()) throw Error("chat: messages must be an array");
  Json out = Json::array();
  for (const Json& m0 : messages) {
    if (!m0.is_object()) throw Error("chat: every message must be an object");
    Json m = m0;
    const std::string role = role_of(m);
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool" &&
        role != "latest_reminder")
      throw Error("chat: invalid role '" + role + "'");
    if (m.contains("reasoning")) m["reasoning_content"] = m["reasoning"];
    reject_image_text(get(m, "reasoning_content"));
    const Json* c = get(m, "content");
    if (c && c->is_string()) {
      reject_image_text(c);
    } else if (c && c->is_array()) {
      std::string joined;
      bool first = true;
      for (const Json& part : *c) {
        const std::string type = part.is_object() ? text_of(get(part, "type")) : "";
        std::string text;
        if (type == "text" || type == "input_text" || type == "output_text") {
          reject_image_text(get(part, "text"));
          text = text_of(get(part, "text"));
        } else if (type == "image_url" || type == "input_image" || type == "image_pil" || type == "image_embeds") {
          throw Error("chat: image inputs are not supported (DeepSeek-V4.1's vision tower is not implemented)");
        } else if (type == "tool_reference") {
          text = text_of(get(part, "name"));
        } else {
          throw Error("chat: DeepSeek-V4.1 supports text content only; got part type '" + type + "'");
        }
        if (!first) joined += "\n\n";
        first = false;
        joined += text;
      }
      m["content"] = joined;
    }
    out.push_back(std::move(m));
  }
  return out;
}

// Step 2: tool results become blocks of a user turn.
Json merge_tool_messages(const Json& messages) {
  Json merged = Json::array();
  auto last_user_blocks = [&] {
    return !merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks");
  };
  for (const Json& m : messages) {
    const std::string role = role_of(m);
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", m.contains("tool_call_id") ? m["tool_call_id"] : Json("")},
                    {"content", m.contains("content") ? m["content"] : Json("")}};
      if (last_user_blocks()) merged.back()["content_blocks"].push_back(block);
      else merged.push_back({{"role", "user"}, {"content_blocks", Json::array({block})}});
    } else if (role == "user") {
      Json blocks = get(m, "content_blocks") ? m["content_blocks"]
                                             : Json::array({{{"type", "text"},
                                                             {"text", m.contains("content") ? m["content"] : Json("")}}});
      if (last_user_blocks() && !get(merged.back(), "task")) {
        for (const Json& b : blocks) merged.back()["content_blocks"].push_back(b);
      } else {
        Json n = m;
        n["content_blocks"] = blocks;
        merged.push_back(std::move(n));
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

// Tool results of one user turn in the order of the preceding assistant's calls (stable).
void sort_tool_results(Json& messages) {
  std::map<std::string, int> order;
  for (Json& m : messages) {
    const std::string role = role_of(m);
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
      for (const Json& b : blocks)
        if (b.is_object() && text_of(get(b, "type")) == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const Json& b) {
          const Json* id = get(b, "tool_use_id");
          auto it = order.find(id && id->is_string() ? id->get<std::string>() : "");
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const Json& a, const Json& c) { return key(a) < key(c); });
        size_t k = 0;
        for (Json& b : blocks)
          if (b.is_object() && text_of(get(b, "type")) == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

// The last turn a user started: user / developer / mid-conversation system messages, except user
// messages that only carry tool results.
int last_user_index(const Json& messages) {
  for (int i = int(messages.size()) - 1; i >= 0; --i) {
    const Json& m = messages[size_t(i)];
    const std::string r = role_of(m);
    if (r == "user" || r == "developer" || (r == "system" && i > 0)) {
      const Json* blocks = get(m, "content_blocks");
      if (truthy(blocks)) {
        bool has_text = false;
        for (const Json& b : *blocks) {
          const std::string t = b.is_object() ? text_of(get(b, "type")) : "";
          has_text |= t == "text" || t == "image" || t == "image_url";
        }
        if (!has_text) continue;
      }
      return i;
    }
  }
  return -1;
}

// Step 3.
Json drop_thinking_messages(const Json& messages) {
  const int last = last_user_index(messages);
  Json out = Json::array();
  for (int i = 0; i < int(messages.size()); ++i) {
    const Json& m = messages[size_t(i)];
    const std::string r = role_of(m);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" ||
        i >= last) {
      out.push_back(m);
    } else if (r == "assistant") {
      Json c = m;
      c.erase("reasoning_content");
      out.push_back(std::move(c));
    }
  }
  return out;
}

void tools_block(Builder& b, const Json& tools) {
  const std::string D = kDsml;
  b.t("## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
      "writing a \"<" + D + kCalls + ">\" block like the following:\n\n<" + D + kCalls + ">\n<" + D + kInvoke +
      " name=\"$TOOL_NAME\">\n<" + D + kParam + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" +
      D + kParam + ">\n...\n</" + D + kInvoke + ">\n<" + D + kInvoke + " name=\"$TOOL_NAME2\">\n...\n</" + D +
      kInvoke + ">\n</" + D + kCalls + ">\n\nString parameters should be specified as is and set `string=\"true\"`. "
      "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by " + kThinkStart + "), you MUST output your "
      "complete reasoning inside " + kThinkStart + "..." + kThinkEnd + " BEFORE any tool calls or final "
      "response.\n\nOtherwise, output directly after " + kThinkEnd + " with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n");
  if (!tools.is_array()) throw Error("chat: tools must be a list");
  bool first = true;
  for (const Json& t : tools) {
    const Json* fn = get(t, "function");
    if (!fn) throw Error("chat: tool without \"function\"");
    if (!first) b.t("\n");
    first = false;
    b.u(python_json_dumps(*fn));
  }
  b.t("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n");
}

void response_format_block(Builder& b, const Json& rf) {
  b.t("\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
  b.u(python_json_dumps(rf));
}

// Tool-call arguments as DSML parameters. Arguments that are not an object are tolerated like the
// reference does: a JSON string (even double-encoded) is decoded, anything else becomes one
// parameter named "arguments".
void dsml_arguments(Builder& b, const Json& original) {
  Json args = original;
  for (int i = 0; i < 2 && !args.is_object() && args.is_string(); ++i) {
    try {
      args = Json::parse(args.get<std::string>());
    } catch (const Json::exception&) {
      break;
    }
  }
  if (!args.is_object()) args = Json{{"arguments", original}};
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) b.t("\n");
    first = false;
    const bool is_str = it.value().is_string();
    b.t("<" + kDsml + kParam + " name=\"");
    b.u(it.key());
    b.t(std::string("\" string=\"") + (is_str ? "true" : "false") + "\">");
    b.u(is_str ? it.value().get<std::string>() : python_json_dumps(it.value()));
    b.t("</" + kDsml + kParam + ">");
  }
}

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return m;
}

// The effort number (the reference validates it on every message, thinking or not).
int effort_value(const std::string& e) {
  if (e.empty() || e == "high" || e == "xhigh") return 75;
  if (e == "low") return 50;
  if (e == "max") return 100;
  if (!e.empty() && e.size() <= 3 && std::all_of(e.begin(), e.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int v = std::stoi(e);
    if (v >= 1 && v <= 100 && std::to_string(v) == e) return v;
  }
  throw Error("chat: invalid reasoning effort '" + e + "' (low, high, xhigh, max or an integer 1..100)");
}

struct Ctx {
  const V41Options& o;
  bool drop;
  int last_user;
};

void render_message(Builder& b, size_t index, const Json& msgs, const Ctx& cx) {
  const V41Options& o = cx.o;
  const Json& msg = msgs[index];
  const std::string role = role_of(msg);
  const Json* content = get(msg, "content");
  const Json* tools = get(msg, "tools");
  const Json* rf = get(msg, "response_format");
  const Json* calls = get(msg, "tool_calls");
  const bool is_last = index + 1 == msgs.size();
  const bool wo_eos = truthy(get(msg, "wo_eos")) || (is_last && o.continue_final_message);

  const int effort = effort_value(o.reasoning_effort);
  const bool effort_prompt = index == 0 && o.thinking;
  if (index == 0 && (effort_prompt || role == "system")) b.t(kSystem);
  if (effort_prompt)
    b.t("Reasoning Effort: " + std::to_string(effort) +
        " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");

  if (role == "system") {
    if (index > 0) b.t(kSystem);  // mid-conversation system message
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
        const std::string type = text_of(get(bl, "type"));
        if (type == "text") {
          b.u(text_of(get(bl, "text")));
        } else if (type == "tool_result") {
          const Json* tc = get(bl, "content");
          b.t("<tool_result>");
          if (tc && tc->is_array()) {
            bool f2 = true;
            for (const Json& part : *tc) {
              if (!f2) b.u("\n\n");
              f2 = false;
              const std::string pt = text_of(get(part, "type"));
              b.u(pt == "text" ? text_of(get(part, "text")) : "[Unsupported " + pt + "]");
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
  } else if (role == "assistant") {
    const bool prev_task = index > 0 && get(msgs[index - 1], "task");
    const std::string rc = text_of(get(msg, "reasoning_content"));
    const std::string summary = text_of(content);
    if (o.thinking && !prev_task && (!cx.drop || int(index) > cx.last_user)) {
      // A continued final message that is still reasoning stays inside the thinking block.
      const bool open = is_last && o.continue_final_message && !rc.empty() && summary.empty() && !truthy(calls);
      b.u(rc);
      if (!open) b.t(kThinkEnd);
    }
    b.u(summary);
    if (truthy(calls)) {
      b.t("\n\n<" + kDsml + kCalls + ">\n");
      bool first = true;
      for (const Json& tc : *calls) {
        const Json* fn = get(tc, "function");
        if (!fn || !fn->contains("name") || !fn->contains("arguments"))
          throw Error("chat: tool call needs function.name and function.arguments");
        if (!first) b.t("\n");
        first = false;
        b.t("<" + kDsml + kInvoke + " name=\"");
        b.u(text_of(get(*fn, "name")));
        b.t("\">\n");
        dsml_arguments(b, (*fn)["arguments"]);
        b.t("\n</" + kDsml + kInvoke + ">");
      }
      b.t("\n</" + kDsml + kCalls + ">");
    }
    if (!wo_eos) b.t(kEos);
  } else {
    throw Error("chat: unknown role '" + role + "'");
  }

  if (is_last && !o.add_generation_prompt) return;
  if (!is_last) {
    const std::string next = role_of(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return;
  }
  const Json* task = get(msg, "task");
  if (task) {
    const std::string t = task->is_string() ? task->get<std::string>() : "";
    auto it = task_tokens().find(t);
    if (it == task_tokens().end()) throw Error("chat: invalid task '" + t + "'");
    if (t != "action") b.t(it->second);
    else b.t(kAssistant + (o.thinking ? kThinkStart : kThinkEnd) + it->second);
  } else if (role == "user" || role == "developer" || (role == "system" && index > 0) ||
             (is_last && role == "assistant" && !wo_eos)) {
    b.t(kAssistant);
    b.t(o.thinking && (!cx.drop || int(index) >= cx.last_user) ? kThinkStart : kThinkEnd);
  }
}

}  // namespace

Rendered render_v41(const Json& messages, const V41Options& o0) {
  V41Options o = o0;
  Json msgs = normalize(messages);
  if (o.continue_final_message) {
    if (msgs.empty() || role_of(msgs.back()) != "assistant")
      throw Error("chat: continue_final_message requires a final assistant message");
    o.add_generation_prompt = false;
  }
  effort_value(o.reasoning_effort);  // invalid efforts fail even for an empty conversation
  msgs = merge_tool_messages(msgs);
  sort_tool_results(msgs);
  Builder b;
  if (o.add_bos) b.t(kBos);
  bool drop = o.drop_thinking;
  for (const Json& m : msgs)
    if (truthy(get(m, "tools"))) drop = false;  // with tools, nothing is dropped
  if (o.thinking && drop) msgs = drop_thinking_messages(msgs);
  const Ctx cx{o, drop, last_user_index(msgs)};
  for (size_t i = 0; i < msgs.size(); ++i) render_message(b, i, msgs, cx);
  return b.r;
}

ParsedMessage parse_v41(const std::string& text, bool thinking) {
  // Map every accepted spelling of the DSML tags onto V4's and reuse its strict parser.
  static const std::vector<std::pair<std::string, std::string>> kSpellings = {
      {"<" + kDsml + " calls>", "<" + kDsml + "tool_calls>"},
      {"</" + kDsml + " calls>", "</" + kDsml + "tool_calls>"},
      {"<" + kDsml + " tool_calls>", "<" + kDsml + "tool_calls>"},
      {"</" + kDsml + " tool_calls>", "</" + kDsml + "tool_calls>"},
      {"<" + kDsml + "calls>", "<" + kDsml + "tool_calls>"},
      {"</" + kDsml + "calls>", "</" + kDsml + "tool_calls>"},
      {"<" + kDsml + " invoke", "<" + kDsml + "invoke"},
      {"</" + kDsml + " invoke>", "</" + kDsml + "invoke>"},
      {"<" + kDsml + " parameter", "<" + kDsml + "parameter"},
      {"</" + kDsml + " parameter>", "</" + kDsml + "parameter>"},
  };
  std::string t;
  t.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    bool hit = false;
    if (text.compare(i, 1, "<") == 0) {
      for (const auto& [from, to] : kSpellings) {
        if (text.compare(i, from.size(), from) == 0) {
          t += to;
          i += from.size();
          hit = true;
          break;
        }
      }
    }
    if (!hit) t += text[i++];
  }
  return parse_v4(t, thinking);
}

}  // namespace deepinfer::tokenizer::chat
