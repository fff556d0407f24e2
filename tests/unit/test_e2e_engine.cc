// The engine end to end on a tiny reference checkpoint (ids in, ids out) with a deliberately small
// cache: seeded determinism whatever else is in the batch, preemption that does not change outputs,
// abort that frees everything, and the cache accounting after every step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "deepinfer/engine.h"
#include "util/error.h"

using namespace deepinfer;

namespace {

std::string fixture_model() {
  const char* env = std::getenv("DEEPINFER_V4_FIXTURES");
  std::string root = env ? env : std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/v4";
  return root + "/tiny_f32/model";
}

Request make_req(std::mt19937& g, int64_t vocab, int len, int max_tokens, std::optional<uint64_t> seed,
                 float temperature = 1.0f) {
  Request r;
  for (int i = 0; i < len; ++i) r.prompt_ids.push_back((int32_t)(g() % vocab));
  r.params.max_tokens = max_tokens;
  r.params.temperature = temperature;
  r.params.seed = seed;
  r.params.logprobs = 3;
  r.params.ignore_eos = true;
  return r;
}

// Runs requests to completion with step(), checking invariants after every step.
std::vector<GenerateResult> run_checked(Engine& e, const std::vector<Request>& reqs) {
  std::vector<GenerateResult> out(reqs.size());
  std::map<uint64_t, size_t> where;
  for (size_t i = 0; i < reqs.size(); ++i) {
    out[i].outputs.resize(reqs[i].params.n);
    uint64_t id = e.add_request(reqs[i], [&out, &where](const RequestOutput& o) {
      auto& c = out[where.at(o.request_id)].outputs[o.index];
      c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
      c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finished) c.finish = o.finish;
    });
    where[id] = i;
  }
  int steps = 0;
  while (e.has_work()) {
    e.step();
    EXPECT_EQ(e.check_invariants(), "") << "after step " << steps;
    if (++steps > 100000) break;
  }
  return out;
}

void expect_same(const Completion& a, const Completion& b) {
  ASSERT_EQ(a.token_ids, b.token_ids);
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(a.logprobs[i].logprob, b.logprobs[i].logprob);
    EXPECT_EQ(a.logprobs[i].top, b.logprobs[i].top);
  }
}

}  // namespace

TEST(Engine, SeededRequestIsIdenticalAloneAndInsideAnyBatch) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 2;
  cfg.max_num_seqs = 40;
  cfg.max_batched_tokens = 96;
  Engine e(cfg);
  std::mt19937 g(5);
  Request target = make_req(g, e.vocab_size(), 37, 24, 1234, 0.9f);
  target.params.top_p = 0.95f;
  auto alone = run_checked(e, {target});
  ASSERT_EQ(alone[0].outputs[0].token_ids.size(), 24u);
  for (int others : {1, 3, 8, 17, 32}) {
    std::vector<Request> batch;
    for (int i = 0; i < others; ++i) {
      std::optional<uint64_t> seed;
      if (i % 2) seed = g();
      batch.push_back(make_req(g, e.vocab_size(), 1 + g() % 60, 1 + g() % 30, seed, (i % 3) * 0.5f));
    }
    batch.insert(batch.begin() + others / 2, target);
    auto res = run_checked(e, batch);
    SCOPED_TRACE("batch of " + std::to_string(others + 1));
    expect_same(alone[0].outputs[0], res[others / 2].outputs[0]);
  }
  EngineStats s = e.stats();
  EXPECT_EQ(s.cache_pages_used, 0);
  EXPECT_EQ(s.cache_slots_used, 0);
}

TEST(Engine, PreemptionUnderASmallCacheDoesNotChangeOutputs) {
  std::mt19937 g(9);
  std::vector<Request> reqs;
  EngineConfig big;
  big.model_dir = fixture_model();
  big.threads = 2;
  Engine ref_engine(big);
  for (int i = 0; i < 12; ++i) reqs.push_back(make_req(g, ref_engine.vocab_size(), 150 + g() % 300, 40, 100 + i));
  reqs[3].params.n = 2;
  auto ref = run_checked(ref_engine, reqs);
  EXPECT_EQ(ref_engine.stats().preemptions, 0);

  EngineConfig small = big;
  small.max_num_seqs = 6;
  small.max_batched_tokens = 64;
  // Room for the 6 slots and 8 pages: sequences must be preempted and recomputed.
  EngineStats st = ref_engine.stats();
  small.cache_bytes = 6 * st.cache_slot_bytes + 8 * st.cache_page_bytes;
  Engine e(small);
  auto out = run_checked(e, reqs);
  EXPECT_GT(e.stats().preemptions, 0) << "the cache was meant to be too small";
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t k = 0; k < ref[i].outputs.size(); ++k) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k));
      expect_same(ref[i].outputs[k], out[i].outputs[k]);
    }
}

TEST(Engine, AbortFreesTheCacheWithinOneStep) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 2;
  Engine e(cfg);
  std::mt19937 g(3);
  Finish fin = Finish::kNone;
  int events = 0;
  Request r = make_req(g, e.vocab_size(), 50, 1000, 7);
  uint64_t id = e.add_request(r, [&](const RequestOutput& o) {
    ++events;
    if (o.finished) fin = o.finish;
  });
  Request other = make_req(g, e.vocab_size(), 10, 30, 8);
  Finish other_fin = Finish::kNone;
  e.add_request(other, [&](const RequestOutput& o) {
    if (o.finished) other_fin = o.finish;
  });
  for (int i = 0; i < 5; ++i) e.step();
  EXPECT_GT(e.stats().cache_pages_used, 0);
  e.abort(id);
  e.step();
  EXPECT_EQ(fin, Finish::kAbort);
  while (e.has_work()) e.step();
  EXPECT_EQ(other_fin, Finish::kLength) << "an aborted request must not harm the others";
  EXPECT_EQ(e.stats().cache_pages_used, 0);
  EXPECT_EQ(e.stats().cache_slots_used, 0);
  EXPECT_EQ(e.check_invariants(), "");
}

// Asynchronous scheduling (step N+1 planned and prepared before step N's tokens are read; on the CPU the
// prepared step runs at launch) against the plain loop: the same tokens, logprobs and finish reasons for
// a mix of greedy rows (read as device picks), seeded sampling, n > 1, EOS not ignored, stop tokens, and
// requests that end while the next step already holds them (their extra row is dropped); the cache is
// fully free at the end and the accounting holds after every step.
TEST(Engine, AsyncSchedulingGivesTheSameOutputsAsTheSequentialLoop) {
  std::mt19937 g(21);
  std::vector<Request> reqs;
  for (int i = 0; i < 14; ++i) {
    Request r = make_req(g, 512, 1 + (int)(g() % 40), 1 + (int)(g() % 25), g(), i % 2 ? 0.0f : 0.8f);
    if (i % 2) r.params.logprobs.reset();  // plain greedy: the engine reads the device's picks only
    if (i % 4 == 1) r.params.ignore_eos = false;
    if (i % 5 == 2) r.params.stop_token_ids = {(int32_t)(g() % 512), (int32_t)(g() % 512)};
    if (i % 6 == 3) r.params.n = 3, r.params.seed = 99, r.params.temperature = 0.7f;
    reqs.push_back(r);
  }
  std::vector<std::vector<GenerateResult>> out;
  for (bool async : {false, true}) {
    EngineConfig cfg;
    cfg.model_dir = fixture_model();
    cfg.threads = 2;
    cfg.max_num_seqs = 6;  // sequences come and go while others run
    cfg.max_batched_tokens = 48;
    cfg.async_scheduling = async;
    Engine e(cfg);
    out.push_back(run_checked(e, reqs));
    EXPECT_EQ(e.stats().cache_pages_used, 0);
    EXPECT_EQ(e.stats().cache_slots_used, 0);
  }
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t k = 0; k < out[0][i].outputs.size(); ++k) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k));
      expect_same(out[0][i].outputs[k], out[1][i].outputs[k]);
      EXPECT_EQ(out[0][i].outputs[k].finish, out[1][i].outputs[k].finish);
      EXPECT_FALSE(out[1][i].outputs[k].token_ids.empty());
    }
}

// Sampling on the backend (EngineConfig::device_sampling: only the picks, and the logprobs asked for, cross when
// no row has a grammar) against the host sampler on the logits: the same tokens for seeded temperature / top-k /
// top-p / min-p requests and n > 1, sequential and asynchronous, with logit processors (fed steps included) and
// with logprobs requests, with and without processors (Backend::logprob_rows puts the edited logits back first):
// the same logprobs, bit for bit. The counters show which path each token took and that steps were fed.
TEST(Engine, DeviceSamplingGivesTheHostSamplersTokens) {
  std::mt19937 g(33);
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r = make_req(g, 512, 1 + (int)(g() % 30), 2 + (int)(g() % 20), g(), 0.4f + 0.2f * (float)(i % 5));
    r.params.logprobs.reset();
    if (i % 4 == 1) r.params.top_k = 5 + i;
    if (i % 3 == 2) r.params.top_p = 0.6f + 0.05f * (float)i;
    if (i % 5 == 3) r.params.min_p = 0.05f;
    if (i == 6) r.params.n = 3;
    if (i == 9) r.params.temperature = 0.0f;
    reqs.push_back(r);
  }
  // Logit processors (bias, penalties, a min_tokens mask) are applied on the backend as edits: those rows are
  // picked there too, and so are the rows of requests with logprobs.
  std::vector<Request> mixed = reqs;
  mixed[4].params.presence_penalty = 0.5f;
  mixed[1].params.repetition_penalty = 1.3f;
  mixed[2].params.logit_bias = {{5, 3.0f}, {7, -100.0f}, {11, 0.0f}};
  mixed[3].params.frequency_penalty = 0.7f, mixed[3].params.presence_penalty = -0.2f;
  mixed[5].params.min_tokens = 6, mixed[5].params.stop_token_ids = {(int32_t)(g() % 512), (int32_t)(g() % 512)};
  // Every row is picked on the device, so decode steps are fed even for the rows with processors: their edits
  // take the previous step's pick as a pending token (RowEdits::pend).
  // Strong penalties (favouring repeats, or against them), at a low temperature and for longer outputs, make
  // the pending token's own edit decide the next token often (checked to fail when that edit misses its
  // count; every part of it is checked in Sampler.PendingTokenEditsEqualTheLogitProcessors).
  std::vector<Request> penalized = mixed;
  penalized[1].params.repetition_penalty = 4.0f;
  penalized[3].params.presence_penalty = -2.0f;
  penalized[4].params.frequency_penalty = -2.0f;
  for (int i : {1, 3, 4}) penalized[i].params.max_tokens = 40, penalized[i].params.temperature = 0.5f;
  // Logprobs: a plain request, one with a bias, and a penalized one (its raw logits, from under edits that
  // include the pending token's); all twenty, and none but the pick's.
  mixed[7].params.logprobs = 2;
  mixed[2].params.logprobs = 20;
  penalized[1].params.logprobs = 5;
  penalized[4].params.logprobs = 0;
  for (const auto* set : {&reqs, &mixed, &penalized}) {
    std::vector<std::vector<GenerateResult>> out;
    std::vector<int64_t> device_tokens, fed;
    for (int mode = 0; mode < 3; ++mode) {  // host sampler; device, sequential; device, async
      EngineConfig cfg;
      cfg.model_dir = fixture_model();
      cfg.threads = 2;
      cfg.max_num_seqs = 5;
      cfg.max_batched_tokens = 40;
      cfg.device_sampling = mode > 0;
      cfg.async_scheduling = mode == 2;
      Engine e(cfg);
      out.push_back(run_checked(e, *set));
      device_tokens.push_back(e.stats().device_sampled_tokens);
      fed.push_back(e.stats().fed_steps);
    }
    // Async with every row picked on the device: decode steps take their tokens from the previous step's
    // picks (DeepseekV4Model::launch's feed), never before the host has its tokens otherwise.
    EXPECT_EQ(fed[0], 0);
    EXPECT_EQ(fed[1], 0);
    EXPECT_GT(fed[2], 0);
    // Every token is picked on the device.
    int64_t total = 0;
    for (size_t i = 0; i < set->size(); ++i)
      for (const auto& c : out[0][i].outputs) total += (int64_t)c.token_ids.size();
    EXPECT_EQ(device_tokens[0], 0);
    EXPECT_EQ(device_tokens[1], total);
    EXPECT_EQ(device_tokens[2], total);
    for (size_t i = 0; i < set->size(); ++i)
      for (size_t k = 0; k < out[0][i].outputs.size(); ++k) {
        SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(k));
        for (int mode = 1; mode < 3; ++mode) {
          EXPECT_EQ(out[0][i].outputs[k].token_ids, out[mode][i].outputs[k].token_ids) << "mode " << mode;
          EXPECT_EQ(out[0][i].outputs[k].finish, out[mode][i].outputs[k].finish);
          expect_same(out[0][i].outputs[k], out[mode][i].outputs[k]);
          if ((*set)[i].params.logprobs)
            EXPECT_EQ(out[mode][i].outputs[k].logprobs.size(), out[mode][i].outputs[k].token_ids.size());
        }
      }
  }
}

TEST(Engine, InvalidRequestsAreClearErrors) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 1;
  Engine e(cfg);
  auto expect_error = [&](Request r, const std::string& needle) {
    try {
      e.add_request(r, {});
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
  };
  Request ok;
  ok.prompt_ids = {1, 2, 3};
  Request r = ok;
  r.params.temperature = -1;
  expect_error(r, "temperature");
  r = ok;
  r.params.top_p = 1.5f;
  expect_error(r, "top_p");
  r = ok;
  r.prompt_ids = {1, (int32_t)e.vocab_size()};
  expect_error(r, "vocabulary");
  r = ok;
  r.prompt_ids.clear();
  r.prompt = "text";
  expect_error(r, "tokenizer");
  r = ok;
  r.prompt_ids.assign(e.max_model_len(), 1);
  expect_error(r, "context");
  EXPECT_FALSE(e.has_work());
}

TEST(Engine, MissingModelIsAClearError) {
  EngineConfig cfg;
  cfg.model_dir = "/nonexistent/model";
  EXPECT_THROW(Engine e(cfg), Error);
}
