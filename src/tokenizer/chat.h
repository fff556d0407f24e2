#pragma once
// Chat formats of DeepSeek models, rendered by dedicated code (no Jinja engine):
//   * DeepSeek-V3: the chat_template of its tokenizer_config.json, byte-identical to
//     transformers' apply_chat_template on the conversations in tests/data/tokenizer/chat_v3*.
//   * DeepSeek-V4: the Python encoding of the model (encoding_dsv4.py; reference used: vLLM
//     0.34.0's vllm/tokenizers/deepseek_v4_encoding.py), byte-identical on
//     tests/data/tokenizer/chat_cases.jsonl.gz.
// Messages use the OpenAI chat format as JSON (role, content, tool_calls, tool_call_id, ...).
// A rendering is a list of pieces: template text (trusted, may hold control tokens) and message
// text (untrusted: encoded so that it can never become a control token).
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/json.h"

namespace deepinfer::tokenizer::chat {

using Json = nlohmann::ordered_json;  // key order matters for JSON that the model sees

struct Rendered {
  struct Piece {
    std::string text;
    bool trusted;
  };
  std::vector<Piece> pieces;
  std::string text() const;  // the prompt string
  // Token ids: the concatenated text encoded once, markers only from trusted pieces.
  std::vector<int32_t> encode(const Tokenizer& tok) const;
};

// DeepSeek-V3 chat template. bos is the BOS token string.
Rendered render_v3(const Json& messages, bool add_generation_prompt,
                   const std::string& bos = "<｜begin▁of▁sentence｜>");

struct V4Options {
  bool thinking = false;      // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;  // drop reasoning of turns before the last user message
  bool add_bos = true;
  std::string reasoning_effort;  // "low" (= ""), "high" or "max"; thinking mode only
};
// DeepSeek-V4 encoding (system / user / developer / assistant / tool / latest_reminder roles,
// tools on system or developer messages, response_format, tasks, thinking on and off).
// Throws deepinfer::Error on conversations the reference rejects.
Rendered render_v4(const Json& messages, const V4Options& opt = {});

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text
};
struct ParsedMessage {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;
};
// Parses one V4 assistant completion (text after the prompt, including the EOS token) into
// reasoning, content and tool calls, with the reference's strictness (deepinfer::Error on
// malformed output).
ParsedMessage parse_v4(const std::string& text, bool thinking);
// Parses one V3 assistant completion: content, optional <think>...</think> reasoning (R1-style
// checkpoints), and tool calls in V3's ```json fenced format. Missing EOS is accepted.
ParsedMessage parse_v3(const std::string& text);

// DeepSeek-V4.1 encoding (chat_v41.cc): `<｜System｜>`, numeric reasoning effort, spaced DSML tool
// tags (` calls`, ` invoke`, ` parameter`), mid-conversation system messages, tool results merged
// into user turns. Reference: vLLM 0.34.0's vllm/tokenizers/deepseek_v41_encoding.py
// encode_messages() after the message normalisation of vllm/tokenizers/deepseek_v41.py,
// byte-identical on tests/data/tokenizer/chat_v41_cases.jsonl.gz.
struct V41Options {
  bool thinking = false;        // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;    // drop reasoning of turns before the last user turn
  bool add_bos = true;
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // leave the final assistant message open (no EOS)
  // "" (= "high"), "low" (50), "high" (75), "xhigh" (75), "max" (100) or an integer 1..100 as text;
  // rendered in thinking mode only.
  std::string reasoning_effort;
};
Rendered render_v41(const Json& messages, const V41Options& opt = {});
// Parses one V4.1 assistant completion (spaced DSML; also accepts `<｜DSML｜calls>`,
// `<｜DSML｜ tool_calls>` and V4's unspaced tags, which the checkpoint occasionally emits).
ParsedMessage parse_v41(const std::string& text, bool thinking);

// json.dumps(value, ensure_ascii=False) as Python writes it (", " and ": " separators).
std::string python_json_dumps(const Json& v);

}  // namespace deepinfer::tokenizer::chat
