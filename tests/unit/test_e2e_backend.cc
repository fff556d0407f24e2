// Choosing the backend at run time and keeping the model's state in a backend's memory, on any
// machine (CI has no GPU): `--backend` / EngineConfig::backend resolution and its errors, a V4Cache
// allocated through a backend gives bitwise the logits of a host cache, and forward() refuses a cache
// that lives in another backend's memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "deepinfer/engine.h"
#include "model/model.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/select/backend_select.h"
#include "util/error.h"

using namespace deepinfer;

namespace {

std::string fixture_model() {
  const char* env = std::getenv("DEEPINFER_V4_FIXTURES");
  std::string root = env ? env : std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/v4";
  return root + "/tiny_f32/model";
}

std::vector<float> run(DeepseekV4Model& m, V4Cache& cache, const std::vector<int32_t>& ids) {
  V4SeqState st;
  EXPECT_TRUE(cache.open(&st) && cache.reserve(&st, (int64_t)ids.size()));
  std::vector<float> out;
  for (size_t done = 0; done < ids.size();) {  // a prefill chunk, then single tokens
    size_t n = done == 0 ? 9 : 1;
    V4SeqChunk c{&st, std::span<const int32_t>(ids.data() + done, n), true};
    auto l = m.forward(std::span<const V4SeqChunk>(&c, 1), cache);
    out.insert(out.end(), l.begin(), l.end());
    done += n;
  }
  cache.close(&st);
  return out;
}

}  // namespace

TEST(Backend, ResolvesNamesAndSaysWhyCudaIsUnavailable) {
  EXPECT_EQ(resolve_backend("cpu"), "cpu");
  EXPECT_EQ(resolve_backend(""), cuda_available() ? "cuda" : "cpu");
  EXPECT_EQ(resolve_backend("auto"), resolve_backend(""));
  EXPECT_THROW(resolve_backend("tpu"), Error);
  if (cuda_available()) {
    EXPECT_EQ(resolve_backend("cuda"), "cuda");
  } else {
    try {
      resolve_backend("cuda");
      ADD_FAILURE() << "cuda resolved without a device";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    }
  }
  auto be = make_backend("cpu", 1);
  EXPECT_STREQ(be->name(), "cpu");
}

TEST(Backend, EngineRejectsUnavailableBackend) {
  EngineConfig cfg;
  cfg.model_dir = fixture_model();
  cfg.threads = 1;
  cfg.backend = "tpu";
  EXPECT_THROW(Engine e(cfg), Error);
  if (!cuda_available()) {
    cfg.backend = "cuda";
    EXPECT_THROW(Engine e(cfg), Error);
  }
  cfg.backend = "cpu";
  Engine e(cfg);
  Request r;
  r.prompt_ids = {1, 2, 3};
  r.params.max_tokens = 4;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  auto out = e.generate({r});
  EXPECT_EQ(out[0].outputs[0].token_ids.size(), 4u);
}

TEST(Backend, CacheInBackendMemoryGivesTheSameLogits) {
  CpuBackend be(2);
  LoadedModel m = load_model(fixture_model(), be);
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 5) % (int)m.v4->config().vocab_size);
  const int32_t pages = (int32_t)V4CacheLayout::make(m.v4->config()).pages_for((int64_t)ids.size());
  V4Cache host(m.v4->config(), 1, pages);
  V4Cache owned(m.v4->config(), 1, pages, &be);
  EXPECT_EQ(owned.backend(), &be);
  EXPECT_EQ(owned.capacity_bytes(), host.capacity_bytes());
  auto a = run(*m.v4, host, ids);
  auto b = run(*m.v4, owned, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));

  // A cache allocated by another backend is not this model's memory.
  CpuBackend other(1);
  V4Cache foreign(m.v4->config(), 1, pages, &other);
  V4SeqState st;
  ASSERT_TRUE(foreign.open(&st) && foreign.reserve(&st, 4));
  std::vector<int32_t> few{1, 2, 3, 4};
  V4SeqChunk c{&st, few, true};
  EXPECT_THROW(m.v4->forward(std::span<const V4SeqChunk>(&c, 1), foreign), Error);
  EXPECT_EQ(st.pos, 0);
}

TEST(Backend, CacheFromBudgetInBackendMemory) {
  CpuBackend be(1);
  LoadedModel m = load_model(fixture_model(), be);
  const V4CacheLayout L = V4CacheLayout::make(m.v4->config());
  V4Cache c = V4Cache::from_budget(m.v4->config(), 3 * L.slot_bytes() + 10 * L.page_bytes(), 3, &be);
  EXPECT_EQ(c.slot_manager().total(), 3);
  EXPECT_EQ(c.page_manager().total(), 10);
  EXPECT_EQ(c.backend(), &be);
}
