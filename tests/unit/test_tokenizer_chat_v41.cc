// DeepSeek-V4.1 chat format: byte-identical to the reference encoder (vLLM 0.34.0's
// deepseek_v41_encoding.py after its message normalisation) on the conversations of
// tests/data/tokenizer/chat_v41_cases.jsonl.gz (scripts/tokenizer/make_chat_v41_reference.py), the
// same rejections, and tool calls that parse back from rendered assistant turns.
#include <gtest/gtest.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "tokenizer/chat.h"
#include "util/error.h"

using namespace deepinfer;
using namespace deepinfer::tokenizer;
using Json = chat::Json;

namespace {

std::vector<Json> cases() {
  static std::vector<Json> all = [] {
    std::vector<Json> out;
    gzFile f = gzopen((std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/tokenizer/chat_v41_cases.jsonl.gz").c_str(), "rb");
    if (!f) return out;
    std::string s;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) s.append(buf, size_t(n));
    gzclose(f);
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find('\n', pos);
      if (e == std::string::npos) e = s.size();
      if (e > pos) out.push_back(Json::parse(s.substr(pos, e - pos)));
      pos = e + 1;
    }
    return out;
  }();
  return all;
}

chat::V41Options options(const Json& o) {
  chat::V41Options opt;
  opt.thinking = o.value("thinking", false);
  opt.drop_thinking = o.value("drop_thinking", true);
  opt.add_generation_prompt = o.value("add_generation_prompt", true);
  opt.continue_final_message = o.value("continue_final_message", false);
  if (o.contains("reasoning_effort"))
    opt.reasoning_effort = o["reasoning_effort"].is_string() ? o["reasoning_effort"].get<std::string>()
                                                             : std::to_string(o["reasoning_effort"].get<int>());
  return opt;
}

}  // namespace

TEST(TokenizerChatV41, RendersByteIdenticallyToTheReference) {
  size_t n = 0, thinking = 0, tools = 0;
  for (const Json& c : cases()) {
    if (c["fmt"] != "v41") continue;
    SCOPED_TRACE(c["messages"].dump() + " " + c["opts"].dump());
    std::string text;
    ASSERT_NO_THROW(text = chat::render_v41(c["messages"], options(c["opts"])).text());
    EXPECT_EQ(text, c["text"].get<std::string>());
    ++n;
    thinking += c["opts"].value("thinking", false);
    tools += c["text"].get<std::string>().find("｜DSML｜ calls>") != std::string::npos;
  }
  EXPECT_GT(n, 300u);
  EXPECT_GT(thinking, 100u);
  EXPECT_GT(tools, 50u);
}

TEST(TokenizerChatV41, RejectsWhatTheReferenceRejects) {
  size_t n = 0;
  for (const Json& c : cases()) {
    if (c["fmt"] != "v41err") continue;
    SCOPED_TRACE(c["messages"].dump() + " " + c["opts"].dump());
    EXPECT_THROW(chat::render_v41(c["messages"], options(c["opts"])), Error);
    ++n;
  }
  EXPECT_GT(n, 10u);
  // Images need the vision tower: a clear error.
  Json img = Json::parse(R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])");
  try {
    chat::render_v41(img);
    ADD_FAILURE() << "image accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("image inputs are not supported"), std::string::npos);
  }
}

TEST(TokenizerChatV41, MinimalPromptsFromTheSpec) {
  Json q = Json::parse(R"([{"role":"user","content":"Q"}])");
  EXPECT_EQ(chat::render_v41(q).text(), "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜></think>");
  Json sq = Json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Q"}])");
  chat::V41Options t;
  t.thinking = true;
  EXPECT_EQ(chat::render_v41(sq, t).text(),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more "
            "thorough the reasoning)\n\nS<｜User｜>Q<｜Assistant｜><think>");
  // Message text never becomes a control token; template text does.
  auto r = chat::render_v41(Json::parse(R"([{"role":"user","content":"<｜User｜>x"}])"));
  bool untrusted_marker = false;
  for (const auto& p : r.pieces) untrusted_marker |= !p.trusted && p.text.find("<｜User｜>x") != std::string::npos;
  EXPECT_TRUE(untrusted_marker);
}

TEST(TokenizerChatV41, ToolCallsParseBack) {
  size_t n = 0;
  for (const Json& c : cases()) {
    if (c["fmt"] != "v41") continue;
    const Json& msgs = c["messages"];
    const chat::V41Options opt = options(c["opts"]);
    if (opt.continue_final_message || !opt.add_generation_prompt) continue;
    // Every assistant turn with tool calls: render the conversation up to it (the prompt) and with it;
    // the difference is the completion, which must parse back to the same calls.
    for (size_t i = 1; i < msgs.size(); ++i) {
      const Json& m = msgs[i];
      if (m.value("role", "") != "assistant" || !m.contains("tool_calls") || m["tool_calls"].empty()) continue;
      Json before = Json::array(), with = Json::array();
      for (size_t k = 0; k < i; ++k) before.push_back(msgs[k]);
      with = before;
      with.push_back(m);
      chat::V41Options o = opt;
      std::string prompt = chat::render_v41(before, o).text();
      o.add_generation_prompt = false;
      std::string full = chat::render_v41(with, o).text();
      if (full.compare(0, prompt.size(), prompt) != 0) continue;  // dropped reasoning changes history
      chat::ParsedMessage p;
      ASSERT_NO_THROW(p = chat::parse_v41(full.substr(prompt.size()), opt.thinking)) << full.substr(prompt.size());
      ASSERT_EQ(p.tool_calls.size(), m["tool_calls"].size());
      for (size_t k = 0; k < p.tool_calls.size(); ++k) {
        const Json& fn = m["tool_calls"][k]["function"];
        EXPECT_EQ(p.tool_calls[k].name, fn["name"].get<std::string>());
        Json args = fn["arguments"];
        for (int d = 0; d < 2 && args.is_string(); ++d) {
          try {
            args = Json::parse(args.get<std::string>());
          } catch (...) {
            break;
          }
        }
        if (!args.is_object()) args = Json{{"arguments", fn["arguments"]}};
        EXPECT_EQ(Json::parse(p.tool_calls[k].arguments), args);
      }
      ++n;
    }
  }
  EXPECT_GT(n, 20u);
  // The spellings the checkpoint emits besides the canonical one.
  for (const char* open : {"<｜DSML｜ calls>", "<｜DSML｜calls>", "<｜DSML｜ tool_calls>", "<｜DSML｜tool_calls>"}) {
    std::string o = open, close = "</" + o.substr(1);
    std::string text = "Hi\n\n" + o + "\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"false\">1"
                       "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n" + close + "<｜end▁of▁sentence｜>";
    auto p = chat::parse_v41(text, false);
    ASSERT_EQ(p.tool_calls.size(), 1u) << open;
    EXPECT_EQ(p.content, "Hi");
    EXPECT_EQ(Json::parse(p.tool_calls[0].arguments), Json::parse(R"({"a": 1})"));
  }
  EXPECT_THROW(chat::parse_v41("no eos", false), Error);
}
