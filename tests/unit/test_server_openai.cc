// The OpenAI request layer without HTTP: body parsing limits, field validation with the field named
// in `param`, prompt forms, and the chat prompt equal to the chat encoder's own rendering.
#include <gtest/gtest.h>

#include "server/openai.h"
#include "tokenizer/chat.h"

namespace deepinfer::server {
namespace {

struct ServerOpenAI : ::testing::Test {
  static const tokenizer::Tokenizer& tok() {
    static const tokenizer::Tokenizer t =
        tokenizer::Tokenizer::from_file(std::string(DEEPINFER_SOURCE_DIR) + "/models/nano-v4");
    return t;
  }
  ModelInfo info() const {
    ModelInfo m;
    m.tok = &tok();
    m.vocab_size = 8192;
    m.max_model_len = 4096;
    m.names = {"nano-v4"};
    return m;
  }
  RequestLimits lim;

  // The 400 a body gets, as (param, code); fails the test when it is accepted.
  std::pair<std::string, std::string> rejected(const char* body, bool chat = false) {
    try {
      Json j = parse_body(body, lim.max_json_depth);
      if (chat) parse_chat(j, info(), lim);
      else parse_completion(j, info(), lim);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_STREQ(e.type.c_str(), "invalid_request_error");
      return {e.param, e.code};
    }
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
};

TEST_F(ServerOpenAI, BodyMustBeAJsonObjectOfBoundedDepth) {
  EXPECT_THROW(parse_body("", 64), ApiError);
  EXPECT_THROW(parse_body("[1]", 64), ApiError);
  EXPECT_THROW(parse_body("{\"a\": \"\xff\"}", 64), ApiError);
  std::string deep(65, '[');
  EXPECT_THROW(parse_body("{\"a\":" + deep + std::string(65, ']') + "}", 64), ApiError);
  EXPECT_NO_THROW(parse_body("{\"a\":" + std::string(60, '[') + std::string(60, ']') + "}", 64));
}

TEST_F(ServerOpenAI, FieldErrorsNameTheField) {
  EXPECT_EQ(rejected(R"({"prompt": "a", "temperature": 2.5})").first, "temperature");
  EXPECT_EQ(rejected(R"({"prompt": "a", "temperature": "hot"})").first, "temperature");
  EXPECT_EQ(rejected(R"({"prompt": "a", "n": 0})").first, "n");
  EXPECT_EQ(rejected(R"({"prompt": "a", "n": 1.5})").first, "n");
  EXPECT_EQ(rejected(R"({"prompt": "a", "max_tokens": 0})").first, "max_tokens");
  EXPECT_EQ(rejected(R"({"prompt": "a", "seed": 18446744073709551616})").first, "seed");
  EXPECT_EQ(rejected(R"({"prompt": "a", "logit_bias": {"-1": 1}})").first, "logit_bias");
  EXPECT_EQ(rejected(R"({"prompt": "a", "logit_bias": {"8192": 1}})").first, "logit_bias");
  EXPECT_EQ(rejected(R"({"prompt": "a", "stop": ["a", 1]})").first, "stop");
  EXPECT_EQ(rejected(R"({"prompt": "a", "model": "other"})"), std::make_pair(std::string("model"), std::string("model_not_found")));
  EXPECT_EQ(rejected(R"({"prompt": [0, 8192]})").first, "prompt");
  EXPECT_EQ(rejected(R"({"prompt": 5})").first, "prompt");
  EXPECT_EQ(rejected(R"({"prompt": "a", "max_tokens": 4096})").second, "context_length_exceeded");
  EXPECT_EQ(rejected(R"({"messages": []})", true).first, "messages");
  EXPECT_EQ(rejected(R"({"messages": [{"role": "user"}]})", true).first, "messages");
  EXPECT_EQ(rejected(R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", true).first,
            "top_logprobs");
  EXPECT_EQ(rejected(R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}})",
                     true).first,
            "response_format");
}

TEST_F(ServerOpenAI, PromptForms) {
  auto g = parse_completion(parse_body(R"({"prompt": ["a b", [5, 6, 7]], "n": 2, "temperature": 1})", 64), info(), lim);
  ASSERT_EQ(g.prompts.size(), 2u);
  EXPECT_EQ(g.prompts[0], tok().encode("a b", true));
  EXPECT_EQ(g.prompts[1], (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(g.total_sequences(), 4);
  EXPECT_EQ(g.params.max_tokens.value_or(-1), 16);  // OpenAI's completions default
}

TEST_F(ServerOpenAI, ChatPromptIsTheEncodersRendering) {
  const char* body = R"({"messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Who "}, {"type": "text", "text": "was Moses?"}]}],
                         "chat_template_kwargs": {"thinking": true}, "max_completion_tokens": 7, "max_tokens": 3})";
  auto g = parse_chat(parse_body(body, 64), info(), lim);
  tokenizer::chat::Json msgs = tokenizer::chat::Json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who was Moses?"}])");
  tokenizer::chat::V4Options opt;
  opt.thinking = true;
  ASSERT_EQ(g.prompts.size(), 1u);
  EXPECT_EQ(g.prompts[0], tokenizer::chat::render_v4(msgs, opt).encode(tok()));
  EXPECT_TRUE(g.thinking);
  EXPECT_EQ(g.params.max_tokens.value_or(-1), 7);  // max_completion_tokens wins
}

TEST_F(ServerOpenAI, ErrorEnvelope) {
  Json e = Json::parse(error_body(ApiError(400, "bad \xff value", "n")));
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], 400);
  EXPECT_TRUE(e["error"]["message"].is_string());  // invalid UTF-8 replaced, never a throw
}

}  // namespace
}  // namespace deepinfer::server
