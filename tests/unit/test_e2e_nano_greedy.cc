// The embedded default model: greedy text from DeepInfer equals greedy text from the PyTorch model
// (models/nano-v4/greedy_reference.json, written by scripts/nano/eval.py) token for token.
#include <gtest/gtest.h>

#include <fstream>

#include "deepinfer/engine.h"
#include "util/json.h"

using namespace deepinfer;

TEST(NanoModel, GreedyMatchesPyTorch) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/models/nano-v4";
  std::ifstream f(dir + "/greedy_reference.json");
  ASSERT_TRUE(f) << "missing " << dir << "/greedy_reference.json";
  nlohmann::json ref = nlohmann::json::parse(f);
  ASSERT_GE(ref.size(), 10u);
  EngineConfig cfg;
  cfg.threads = 2;  // model_dir empty: the embedded default
  Engine e(cfg);
  std::vector<Request> reqs;
  for (const auto& r : ref) {
    Request q;
    q.prompt_ids = r["prompt_ids"].get<std::vector<int32_t>>();
    q.params.temperature = 0;
    q.params.max_tokens = 128;  // the reference stops at 128 tokens or at EOS, as we do
    reqs.push_back(q);
  }
  auto out = e.generate(reqs);
  for (size_t i = 0; i < ref.size(); ++i) {
    auto ids = ref[i]["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> want(ids.begin() + reqs[i].prompt_ids.size(), ids.end());
    EXPECT_TRUE(want.size() == 128u || want.back() == 1) << "reference " << i << " is neither 128 tokens nor EOS-ended";
    EXPECT_EQ(out[i].outputs[0].token_ids, want) << "prompt " << i << ": " << ref[i]["prompt"];
  }
}
