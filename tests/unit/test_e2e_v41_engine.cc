// The engine drives DeepSeek-V4.1 (the tiny_hf reference fixture, ids in / ids out): greedy output
// equals a greedy loop over full forwards, seeded requests give the same tokens alone and inside a
// batch with chunked prefill and preemption, and an image placeholder fails its request cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>

#include "deepinfer/engine.h"
#include "model/model.h"
#include "ops/cpu/cpu_backend.h"
#include "util/error.h"

using namespace deepinfer;

namespace {

std::string fixture_model() {
  const char* env = std::getenv("DEEPINFER_V41_FIXTURES");
  std::string root = env ? env : std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/v41";
  return root + "/tiny_hf/model";
}

std::vector<GenerateResult> run(Engine& e, const std::vector<Request>& reqs) {
  std::vector<GenerateResult> out(reqs.size());
  std::map<uint64_t, size_t> where;
  for (size_t i = 0; i < reqs.size(); ++i) {
    out[i].outputs.resize(reqs[i].params.n);
    uint64_t id = e.add_request(reqs[i], [&out, &where](const RequestOutput& o) {
      auto& c = out[where.at(o.request_id)].outputs[o.index];
      c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
      if (o.finished) {
        c.finish = o.finish;
        c.error = o.error;
      }
    });
    where[id] = i;
  }
  int steps = 0;
  while (e.has_work() && ++steps < 100000) {
    e.step();
    EXPECT_EQ(e.check_invariants(), "");
  }
  return out;
}

Request req(std::mt19937& g, int len, int max_tokens, std::optional<uint64_t> seed, float temperature) {
  Request r;
  r.prompt_ids.push_back(0);
  for (int i = 1; i < len; ++i) r.prompt_ids.push_back(3 + (int32_t)(g() % 380));
  r.params.max_tokens = max_tokens;
  r.params.temperature = temperature;
  r.params.seed = seed;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace

TEST(EngineV41, GreedyEqualsGreedyLoopOverFullForwards) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 2;
  Engine e(cfg);
  std::mt19937 g(3);
  Request r = req(g, 21, 12, std::nullopt, 0.0f);
  auto out = run(e, {r});
  ASSERT_EQ(out[0].outputs[0].token_ids.size(), 12u);

  CpuBackend be(2);
  LoadedModel m = load_model(cfg.model_dir, be);
  std::vector<int32_t> ids = r.prompt_ids, gen;
  const int64_t V = m.vocab_size();
  for (int k = 0; k < 12; ++k) {
    auto l = sequence_logits(m, ids, (int64_t)ids.size(), (int64_t)ids.size());
    const float* last = l.data() + (ids.size() - 1) * V;
    int32_t t = (int32_t)(std::max_element(last, last + V) - last);
    gen.push_back(t);
    ids.push_back(t);
  }
  EXPECT_EQ(out[0].outputs[0].token_ids, gen);
}

TEST(EngineV41, SeededRequestsSameAloneAndBatchedWithPreemption) {
  std::mt19937 g(7);
  std::vector<Request> reqs;
  for (int len : {250, 251, 40, 252, 253}) reqs.push_back(req(g, len, 10, 100 + len, 0.8f));
  std::vector<std::vector<int32_t>> alone;
  {
    EngineConfig cfg;
    cfg.model_dir = fixture_model();
    cfg.threads = 2;
    Engine e(cfg);
    for (auto& r : reqs) alone.push_back(run(e, {r})[0].outputs[0].token_ids);
  }
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 2;
  cfg.max_batched_tokens = 16;  // chunked prefill mixed with decodes
  cfg.max_num_seqs = 3;
  // Room for 3 sequence states and 3 pages of 256 tokens (V4.1 accounting: rings + open groups per
  // sequence, (d + dI)·4/m bytes per token per KV source): the long prompts preempt each other.
  cfg.cache_bytes = 3 * (10LL * 8 * 64 * 4 + 2 * 2 * 64 * 4) + 3 * 256 * ((64 + 32) * 4 / 2 * 2 + (64 + 32) * 4);
  Engine e(cfg);
  auto batched = run(e, reqs);
  EXPECT_GT(e.stats().preemptions, 0) << "the budget was meant to force preemption";
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batched[i].outputs[0].finish, Finish::kLength) << batched[i].outputs[0].error;
    EXPECT_EQ(batched[i].outputs[0].token_ids, alone[i]) << "request " << i;
  }
}

TEST(EngineV41, ImagePlaceholderIsRefusedWithAClearError) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 1;
  Engine e(cfg);
  std::mt19937 g(1);
  Request bad = req(g, 6, 3, std::nullopt, 0.0f);
  bad.prompt_ids[3] = 383;  // image_token_id of the fixture
  try {
    e.add_request(bad, [](const RequestOutput&) {});
    ADD_FAILURE() << "image placeholder accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("image inputs are not supported"), std::string::npos) << err.what();
  }
  auto ok = run(e, {req(g, 6, 3, std::nullopt, 0.0f)});
  EXPECT_EQ(ok[0].outputs[0].token_ids.size(), 3u);
}
