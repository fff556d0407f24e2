// Memory is predictable: filling the cache to the last page keeps the process's peak resident
// memory within weights + cache budget + a fixed overhead (kFixedOverhead, documented in
// docs/engine.md). Own executable, so the peak is this test's alone.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "deepinfer/engine.h"
#include "model/v4_cache.h"

using namespace deepinfer;

namespace {
int64_t status_kib(const char* key) {  // VmHWM / VmRSS from /proc/self/status
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key) + 1);
  return -1;
}
constexpr int64_t kFixedOverhead = 64ll << 20;  // activations, sampler, threads, allocator slack
}  // namespace

TEST(EngineMemory, PeakStaysWithinWeightsPlusBudgetPlusFixedOverhead) {
  const char* env = std::getenv("DEEPINFER_V4_FIXTURES");
  std::string dir = std::string(env ? env : DEEPINFER_SOURCE_DIR "/tests/fixtures/v4") + "/tiny_f32/model";
  int64_t file_bytes = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") file_bytes += (int64_t)e.file_size();
  const int64_t base = status_kib("VmRSS:") * 1024;
  EngineConfig cfg;
  cfg.model_dir = dir;
  cfg.threads = 2;
  cfg.max_num_seqs = 4;
  {  // size the budget from the layout: 4 slots and 12 pages, so filling it stays cheap
    std::ifstream f(dir + "/config.json");
    V4CacheLayout L = V4CacheLayout::make(parse_v4_config(nlohmann::json::parse(f)));
    cfg.cache_bytes = 4 * L.slot_bytes() + 12 * L.page_bytes();
  }
  Engine e(cfg);
  EngineStats st = e.stats();
  ASSERT_EQ(st.cache_pages_total, 12);
  // Four requests that together need more pages than exist (the scheduler preempts to fit).
  std::mt19937 g(1);
  int64_t peak_pages = 0;
  for (int i = 0; i < 4; ++i) {
    Request r;
    for (int64_t k = 0; k < 3 * st.cache_tokens_per_page - 20; ++k) r.prompt_ids.push_back((int32_t)(g() % e.vocab_size()));
    r.params.max_tokens = 8;
    r.params.ignore_eos = true;
    e.add_request(r, {});
  }
  while (e.has_work()) {
    e.step();
    peak_pages = std::max(peak_pages, e.stats().cache_pages_used);
  }
  EXPECT_GE(peak_pages, st.cache_pages_total * 9 / 10) << "the cache was not filled";
  // Weights: the mapped files plus their float32 copies in the backend's layout (f32 checkpoint:
  // same size), so at most twice the files.
  const int64_t weights = 2 * file_bytes;
  const int64_t peak = status_kib("VmHWM:") * 1024;
  EXPECT_LE(peak - base, weights + cfg.cache_bytes + kFixedOverhead)
      << "peak " << (peak >> 20) << " MiB, base " << (base >> 20) << " MiB";
}
