// `deepinfer bench` on the CPU with the tiny config: exits 0 and writes a JSON result with every
// case, positive numbers and a consistent cost model (no timing assertions).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/json.h"

namespace {
const std::string kExe = std::string(DEEPINFER_BINARY_DIR) + "/deepinfer";
}

TEST(CliBench, TinyOnCpuWritesAConsistentJson) {
  const std::string dir = (std::filesystem::temp_directory_path() / "deepinfer_cli_bench").string();
  std::filesystem::create_directories(dir);
  const std::string json_file = dir + "/bench.json", log = dir + "/log.txt";
  const std::string cmd = kExe + " bench --backend cpu --config tiny --batch 1,2 --context 64 --prefill 32 --steps 2 "
                                 "--profile 1 --threads 1 --json " + json_file + " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << std::ifstream(log).rdbuf();
  std::ifstream f(json_file);
  ASSERT_TRUE(f.good());
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["layers"], 4);
  EXPECT_EQ(j["config"]["num_hidden_layers"], 4);
  ASSERT_EQ(j["cases"].size(), 3u);
  const auto& d1 = j["cases"][0];
  const auto& d2 = j["cases"][1];
  const auto& p = j["cases"][2];
  EXPECT_EQ(d1["kind"], "decode");
  EXPECT_EQ(d1["batch"], 1);
  EXPECT_EQ(d2["batch"], 2);
  EXPECT_EQ(d1["context"], 64);
  EXPECT_EQ(p["kind"], "prefill");
  EXPECT_EQ(p["prompt"], 32);
  for (const auto& c : j["cases"]) {
    ASSERT_TRUE(c["error"].is_null()) << c.dump();
    for (const char* k : {"tokens_per_s", "per_user_tokens_per_s", "ms_per_step", "bytes", "flops", "pct_hbm", "pct_fp8",
                          "hbm_floor_ms", "fp8_floor_ms"})
      EXPECT_GT(c[k].get<double>(), 0) << k << " in " << c.dump();
    EXPECT_TRUE(c["logits_finite"].get<bool>()) << c.dump();
    // --profile's extra steps ran (the cache had room for them); the CPU has no device profile.
    EXPECT_FALSE(c.contains("profile")) << c.dump();
    EXPECT_NEAR(c["bytes"].get<double>(),
                c["bytes_weights"].get<double>() + c["bytes_experts"].get<double>() + c["bytes_cache"].get<double>(),
                1e-6 * c["bytes"].get<double>());
  }
  // Decode: per-user speed = throughput / batch; two sequences read more (experts, cache) and
  // compute twice the work of one.
  EXPECT_NEAR(d2["per_user_tokens_per_s"].get<double>() * 2, d2["tokens_per_s"].get<double>(),
              1e-9 * d2["tokens_per_s"].get<double>());
  EXPECT_GT(d2["bytes"].get<double>(), d1["bytes"].get<double>());
  EXPECT_GT(d2["bytes_experts"].get<double>(), d1["bytes_experts"].get<double>());
  EXPECT_NEAR(d2["bytes_cache"].get<double>(), 2 * d1["bytes_cache"].get<double>(), 1e-9 * d2["bytes_cache"].get<double>());
  EXPECT_NEAR(d2["flops"].get<double>(), 2 * d1["flops"].get<double>(), 1e-9 * d2["flops"].get<double>());
  EXPECT_LT(d2["bytes_experts"].get<double>(), 2 * d1["bytes_experts"].get<double>());  // shared experts
  // Dense weights are read once a step whatever the batch: only one more embedding row.
  EXPECT_GT(d2["bytes_weights"].get<double>(), d1["bytes_weights"].get<double>());
  EXPECT_LT(d2["bytes_weights"].get<double>() - d1["bytes_weights"].get<double>(), 0.01 * d1["bytes_weights"].get<double>());
  // The whole prompt in one chunk (32 < 512): one step.
  EXPECT_EQ(p["steps"], 1);
  EXPECT_GT(p["flops"].get<double>(), d1["flops"].get<double>());
  std::filesystem::remove_all(dir);
}

TEST(CliBench, BadFlagsAreErrors) {
  const std::string log = (std::filesystem::temp_directory_path() / "deepinfer_cli_bench_err.txt").string();
  EXPECT_NE(std::system((kExe + " bench --backend cpu --config tiny --layers 9 > " + log + " 2>&1").c_str()), 0);
  std::stringstream ss;
  ss << std::ifstream(log).rdbuf();
  EXPECT_NE(ss.str().find("the config has 4"), std::string::npos) << ss.str();
  EXPECT_NE(std::system((kExe + " bench --config nowhere > " + log + " 2>&1").c_str()), 0);
  EXPECT_NE(std::system((kExe + " bench --batch x > " + log + " 2>&1").c_str()), 0);
}
