// Structured outputs through the engine on the embedded nano model (byte-level BPE, 8192 tokens):
// every finished output is accepted by the grammar (checked by re-running a fresh matcher over its
// bytes; tests/python/test_structured_outputs.py validates with Python jsonschema / re as well),
// n > 1, seeded determinism alone and in a batch, preemption by recompute, abort, per-request errors.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"
#include "engine/structured_output.h"
#include "util/error.h"

using namespace deepinfer;

namespace {

EngineConfig nano(int max_num_seqs = 16) {
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.max_num_seqs = max_num_seqs;
  return cfg;
}

Request req(const std::string& prompt, StructuredKind kind, std::string text, uint64_t seed, int n = 1,
            int max_tokens = 160) {
  Request r;
  r.prompt = prompt;
  r.add_special_tokens = true;
  r.params.n = n;
  r.params.seed = seed;
  r.params.temperature = 1.0f;
  r.params.max_tokens = max_tokens;
  r.params.structured = {kind, std::move(text)};
  return r;
}

const char* kPerson = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":150},"tribe":{"enum":["Judah","Levi","Dan"]}},
  "required":["name","age","tribe"],"additionalProperties":false})";
const char* kVerses = R"({"type":"array","items":{"type":"object","properties":{
  "book":{"type":"string","pattern":"^[A-Z][a-z]{1,8}$"},"chapter":{"type":"integer","minimum":1}},
  "required":["book","chapter"],"additionalProperties":false},"minItems":1,"maxItems":3})";

// The output is in the grammar's language: a fresh matcher accepts its bytes and can end there.
bool grammar_accepts(Engine& e, const StructuredOutput& s, const std::string& text) {
  StructuredCompiler c(&e.tokenizer(), e.vocab_size(), {e.tokenizer().eos_id()});
  grammar::Matcher m(c.compile(s));
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace

TEST(Structured, OutputsMatchTheirGrammarWithSeveralChoices) {
  Engine e(nano());
  std::vector<Request> reqs = {
      req("In the beginning", StructuredKind::kJsonSchema, kPerson, 1, 3),
      req("And God said", StructuredKind::kJsonSchema, kVerses, 2, 2),
      req("The LORD is", StructuredKind::kJsonObject, "", 3, 2),
      req("Blessed are", StructuredKind::kRegex, "(Amen|Selah)\\. [0-9]{1,3} [a-z ]{0,20}!", 4, 2),
      req("Let there be", StructuredKind::kGrammar,
          "root ::= \"light\" (\" and \" word)* \".\"\nword ::= [a-z]+\n", 5, 2, 80),
  };
  auto res = e.generate(reqs);
  int stopped = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    for (const Completion& c : res[i].outputs) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(c.index) + ": " + c.text);
      ASSERT_NE(c.finish, Finish::kError) << c.error;
      if (c.finish != Finish::kStop) continue;  // ran out of max_tokens mid-way: a prefix only
      ++stopped;
      EXPECT_TRUE(grammar_accepts(e, reqs[i].params.structured, c.text));
      const StructuredKind k = reqs[i].params.structured.kind;
      if (k == StructuredKind::kJsonSchema || k == StructuredKind::kJsonObject) {
        EXPECT_TRUE(nlohmann::json::accept(c.text));
      }
    }
  // The grammar ends generation: most outputs finish with "stop" rather than run to max_tokens.
  EXPECT_GE(stopped, 8);
}

TEST(Structured, SeededOutputIsTheSameAloneAndInABatch) {
  Engine e(nano());
  Request target = req("The words of", StructuredKind::kJsonSchema, kPerson, 77);
  auto alone = e.generate({target});
  std::vector<Request> batch = {req("Honour thy", StructuredKind::kRegex, "[A-Z][a-z]+( [a-z]+){2,5}\\.", 8),
                                target, req("Thou shalt", StructuredKind::kJsonObject, "", 9, 2)};
  Request plain;  // an unconstrained request in the same batch
  plain.prompt = "And it came to pass";
  plain.params.seed = 10;
  plain.params.max_tokens = 30;
  batch.push_back(plain);
  auto res = e.generate(batch);
  EXPECT_EQ(alone[0].outputs[0].token_ids, res[1].outputs[0].token_ids);
  EXPECT_EQ(alone[0].outputs[0].text, res[1].outputs[0].text);
  // The unconstrained request samples exactly as it does on its own.
  auto plain_alone = e.generate({plain});
  EXPECT_EQ(plain_alone[0].outputs[0].token_ids, res[3].outputs[0].token_ids);
}

TEST(Structured, PreemptionByRecomputeKeepsTheMatcherState) {
  Engine big(nano());
  // 240-token prompts: a page holds 256 tokens, so every sequence needs a second page while it
  // generates, and a 5-page cache for 4 running sequences must preempt some of them.
  const std::vector<int32_t> verse = big.tokenizer().encode(
      "And the earth was without form, and void; and darkness was upon the face of the deep. ");
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r = req("", i % 2 ? StructuredKind::kJsonSchema : StructuredKind::kJsonObject, i % 2 ? kVerses : "",
                    200 + i, i == 3 ? 2 : 1, 120);
    for (int k = 0; (int)r.prompt_ids.size() < 240; ++k) r.prompt_ids.push_back(verse[(k + i) % verse.size()]);
    reqs.push_back(r);
  }
  auto ref = big.generate(reqs);
  EXPECT_EQ(big.stats().preemptions, 0);
  EngineStats st = big.stats();
  EngineConfig small = nano(4);
  small.max_batched_tokens = 48;
  small.cache_bytes = 4 * st.cache_slot_bytes + 5 * st.cache_page_bytes;
  Engine e(small);
  auto out = e.generate(reqs);
  EXPECT_GT(e.stats().preemptions, 0) << "the cache was meant to be too small";
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t k = 0; k < ref[i].outputs.size(); ++k) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k));
      EXPECT_EQ(ref[i].outputs[k].token_ids, out[i].outputs[k].token_ids);
      EXPECT_EQ(ref[i].outputs[k].finish, out[i].outputs[k].finish);
      EXPECT_NE(out[i].outputs[k].finish, Finish::kError) << out[i].outputs[k].error;
    }
}

TEST(Structured, BadSpecsFailTheirRequestOnly) {
  Engine e(nano());
  const std::vector<std::pair<StructuredKind, std::string>> bad = {
      {StructuredKind::kJsonSchema, "{not json"},
      {StructuredKind::kJsonSchema, R"({"type":"object","unevaluatedProperties":{"type":"string"}})"},  // unsupported
      {StructuredKind::kJsonSchema, R"({"type":"string","format":"no-such-format"})"},
      {StructuredKind::kRegex, "(unclosed"},
      {StructuredKind::kRegex, "[]"},  // matches nothing
      {StructuredKind::kGrammar, "root ::= missing\n"},
      {StructuredKind::kRegex, ""},
  };
  for (const auto& [kind, text] : bad) {
    SCOPED_TRACE(text);
    Request r = req("In", kind, text, 1);
    try {
      e.add_request(r, nullptr);
      ADD_FAILURE() << "accepted";
    } catch (const Error& ex) {
      EXPECT_NE(std::string(ex.what()).find("structured"), std::string::npos) << ex.what();
    }
  }
  EXPECT_FALSE(e.has_work());
  // A good request in the same engine still runs.
  auto res = e.generate({req("In", StructuredKind::kRegex, "(yea|nay)", 3)});
  EXPECT_EQ(res[0].outputs[0].finish, Finish::kStop);
  EXPECT_TRUE(res[0].outputs[0].text == "yea" || res[0].outputs[0].text == "nay") << res[0].outputs[0].text;
}

TEST(Structured, GrammarEndsGenerationEvenWithIgnoreEosAndMinTokens) {
  Engine e(nano());
  Request r = req("Amen", StructuredKind::kRegex, "[0-9]{3}", 5);
  r.params.ignore_eos = true;
  r.params.min_tokens = 50;
  r.params.logprobs = 2;
  auto res = e.generate({r});
  const Completion& c = res[0].outputs[0];
  EXPECT_EQ(c.finish, Finish::kStop);
  ASSERT_EQ(c.text.size(), 3u) << c.text;
  for (char ch : c.text) EXPECT_TRUE(ch >= '0' && ch <= '9') << c.text;
  // Logprobs are of the masked distribution: the last token (EOS, the only one allowed once three
  // digits are out) has probability 1; disallowed alternatives show -inf.
  ASSERT_EQ(c.logprobs.size(), c.token_ids.size());
  EXPECT_EQ(c.logprobs.back().logprob, 0.0f);
  for (const TokenLogprobs& t : c.logprobs) EXPECT_GT(t.logprob, -1e30f);
}

// Grammar masks on the backend (Backend::mask_rows before the pick, EngineConfig::device_sampling): the same
// tokens, texts and logprobs (of the masked rows, bit for bit) as the host sampler on downloaded rows, sequential
// and asynchronous, with logit processors and n > 1 beside plain requests; every structured token picked on the
// backend (but the min_tokens row's, which the host keeps), and no step fed after a structured row.
TEST(Structured, MasksOnTheBackendGiveTheHostSamplersOutputs) {
  std::vector<Request> reqs = {
      req("In the beginning", StructuredKind::kJsonSchema, kPerson, 11, 2),
      req("And God said", StructuredKind::kJsonSchema, kVerses, 12),
      req("Blessed are", StructuredKind::kRegex, "(Amen|Selah)\\. [0-9]{1,3} [a-z ]{0,20}!", 13),
      req("Let there be", StructuredKind::kGrammar, "root ::= \"light\" (\" and \" word)* \".\"\nword ::= [a-z]+\n", 14, 1, 60),
  };
  reqs[0].params.logprobs = 3;
  reqs[1].params.repetition_penalty = 1.3f, reqs[1].params.logprobs = 0;
  reqs[2].params.logit_bias = {{65, 2.0f}, {66, -3.0f}};
  reqs[3].params.min_tokens = 4, reqs[3].params.logprobs = 1;  // the min_tokens mask: that row on the host
  Request plain;
  plain.prompt = "The LORD is";
  plain.add_special_tokens = true;
  plain.params.seed = 15, plain.params.max_tokens = 30, plain.params.temperature = 0.8f, plain.params.logprobs = 2;
  reqs.push_back(plain);
  std::vector<std::vector<GenerateResult>> out;
  std::vector<int64_t> dev;
  for (int mode = 0; mode < 3; ++mode) {  // host sampler; backend, sequential; backend, async
    EngineConfig cfg = nano();
    cfg.device_sampling = mode > 0;
    cfg.async_scheduling = mode == 2;
    Engine e(cfg);
    out.push_back(e.generate(reqs));
    dev.push_back(e.stats().device_sampled_tokens);
  }
  int64_t total = 0, host_rows = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    for (const Completion& c : out[0][i].outputs) {
      total += (int64_t)c.token_ids.size();
      if (i == 3) host_rows += std::min<int64_t>(4, (int64_t)c.token_ids.size());
    }
  EXPECT_EQ(dev[0], 0);
  EXPECT_EQ(dev[1], total - host_rows);
  EXPECT_EQ(dev[2], total - host_rows);
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t k = 0; k < out[0][i].outputs.size(); ++k)
      for (int mode = 1; mode < 3; ++mode) {
        SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k) + " mode " + std::to_string(mode));
        const Completion &a = out[0][i].outputs[k], &b = out[mode][i].outputs[k];
        ASSERT_NE(a.finish, Finish::kError) << a.error;
        EXPECT_EQ(a.token_ids, b.token_ids);
        EXPECT_EQ(a.text, b.text);
        EXPECT_EQ(a.finish, b.finish);
        ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
        for (size_t t = 0; t < a.logprobs.size(); ++t) {
          EXPECT_EQ(0, std::memcmp(&a.logprobs[t].logprob, &b.logprobs[t].logprob, 4)) << t;
          EXPECT_EQ(a.logprobs[t].top, b.logprobs[t].top) << t;
        }
      }
}

// More grammar rows in a step than a step holds masks for (DeepseekV4Model::kMaskRows): the first 256 take their
// masks on the backend, the rest are sampled on the host; every output is the host sampler's.
TEST(Structured, MoreGrammarRowsThanAStepHoldsMasks) {
  std::vector<Request> reqs;
  for (int i = 0; i < 300; ++i) reqs.push_back(req("Amen", StructuredKind::kRegex, "(yea|nay|selah)[0-9]", 100 + i, 1, 8));
  std::vector<std::vector<GenerateResult>> out;
  std::vector<int64_t> dev;
  for (int mode = 0; mode < 2; ++mode) {
    EngineConfig cfg = nano(320);
    cfg.max_batched_tokens = 4096;
    cfg.device_sampling = mode == 1;
    Engine e(cfg);
    out.push_back(e.generate(reqs));
    dev.push_back(e.stats().device_sampled_tokens);
  }
  int64_t total = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Completion &a = out[0][i].outputs[0], &b = out[1][i].outputs[0];
    ASSERT_EQ(a.finish, Finish::kStop) << a.error;
    EXPECT_EQ(a.token_ids, b.token_ids) << i;
    total += (int64_t)a.token_ids.size();
  }
  EXPECT_EQ(dev[0], 0);
  EXPECT_GT(dev[1], 0);
  EXPECT_LT(dev[1], total);  // the rows past 256 a step went to the host
}

TEST(Structured, AbortFinishesAConstrainedRequest) {
  Engine e(nano());
  std::map<int, Finish> fin;
  uint64_t id = e.add_request(req("In", StructuredKind::kJsonObject, "", 1, 2, 400),
                              [&](const RequestOutput& o) { if (o.finished) fin[o.index] = o.finish; });
  for (int i = 0; i < 3; ++i) e.step();
  e.abort(id);
  while (e.has_work()) e.step();
  ASSERT_EQ(fin.size(), 2u);
  for (auto& [k, f] : fin)
    if (f != Finish::kStop) {
      EXPECT_EQ(f, Finish::kAbort);
    }
  EXPECT_EQ(e.stats().cache_pages_used, 0);
}
