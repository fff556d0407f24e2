// CPU benchmark of the DeepSeek-V4 forward pass on a small random-weight config (not a test).
// Reports prefill and decode tokens/s, the GEMM work rate they reach, and next to it this machine's
// measured GEMM rate (OpenBLAS sgemm and our batch-invariant kernel on a 512×2048×2048 problem).
//
//   build/bench/bench_model [--model DIR] [--threads N] [--prefill T] [--decode-steps S] [--json FILE]
// Without --model it writes a small random-weight V4 checkpoint to a temp dir and uses that.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>

#include "model/model.h"
#include "model/v4_inventory.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/gemm.h"

using namespace deepinfer;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

json small_config() {
  return json{{"model_type", "deepseek_v4"}, {"vocab_size", 8192}, {"hidden_size", 1024},
              {"num_hidden_layers", 4}, {"num_attention_heads", 8}, {"head_dim", 128},
              {"qk_rope_head_dim", 32}, {"q_lora_rank", 256}, {"o_groups", 2}, {"o_lora_rank", 256},
              {"compress_ratios", {0, 4, 128, 4, 0}}, {"num_hash_layers", 1}, {"index_n_heads", 8},
              {"index_head_dim", 64}, {"index_topk", 64}, {"hc_mult", 4}, {"n_routed_experts", 8},
              {"num_experts_per_tok", 2}, {"moe_intermediate_size", 1024}, {"sliding_window", 128},
              {"num_nextn_predict_layers", 0}};
}

// Multiply-adds ×2 per token in the linear layers that one token runs through.
double gemm_flops_per_token(const V4Config& c) {
  const double D = c.hidden_size, H = c.num_heads, d = c.head_dim, ql = c.q_lora_rank, I = c.moe_intermediate_size;
  double f = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    f += ql * D + H * d * ql + d * D + c.o_groups * (double)c.o_lora_rank * (H * d / c.o_groups) +
         D * c.o_groups * (double)c.o_lora_rank;
    if (c.layer_types[l] != AttnType::Sliding) f += 2 * ((c.layer_types[l] == AttnType::CSA ? 2 : 1) * d) * D;
    if (c.layer_types[l] == AttnType::CSA)
      f += 2 * (2.0 * c.index_head_dim) * D + c.index_n_heads * (double)c.index_head_dim * ql + c.index_n_heads * D;
    f += c.n_routed_experts * D + (c.num_experts_per_tok + c.n_shared_experts) * 3 * I * D;
  }
  f += (double)c.vocab_size * D / 1.0;  // head (only for rows that need logits; counted per token for prefill)
  return 2 * f;
}

double measure_gemm_rate(bool openblas, int threads) {
  const int M = 512, N = 2048, K = 2048;
  std::vector<float> x((size_t)M * K), w((size_t)N * K), y((size_t)M * N);
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(g);
  for (auto& v : w) v = nd(g);
  ThreadPool pool(threads);
  PackedMatrix p = pack_matrix(w.data(), N, K);
  auto once = [&] {
    if (openblas)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, y.data(), N);
    else
      gemm_packed(x.data(), M, K, p, y.data(), N, &pool);
  };
  once();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    once();
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, prefill = 512, decode_steps = 32;
  std::string json_out, model_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--prefill") prefill = std::atoi(argv[i + 1]);
    else if (a == "--decode-steps") decode_steps = std::atoi(argv[i + 1]);
    else if (a == "--json") json_out = argv[i + 1];
    else if (a == "--model") model_dir = argv[i + 1];
  }
  CpuBackend be(threads);
  openblas_set_num_threads(be.pool().size());
  const double blas_rate = measure_gemm_rate(true, be.pool().size());
  const double own_rate = measure_gemm_rate(false, be.pool().size());

  std::string dir = std::filesystem::temp_directory_path() / "deepinfer_bench_model";
  if (model_dir.empty()) {
    std::filesystem::remove_all(dir);
    write_random_v4_checkpoint(dir, small_config(), 1);
  }
  LoadedModel m = load_model(model_dir.empty() ? dir : model_dir, be);
  const V4Config& c = m.v4->config();
  const double fpt = gemm_flops_per_token(c);
  std::mt19937 g(2);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);

  // Prefill: one sequence, one step.
  std::vector<int32_t> ids(prefill);
  for (auto& t : ids) t = tok(g);
  V4Cache cache(c, 18, 64);
  V4SeqState st;
  cache.open(&st);
  cache.reserve(&st, prefill);
  {  // warm-up on a throwaway state
    V4SeqState w;
    cache.open(&w);
    cache.reserve(&w, 64);
    V4SeqChunk c0{&w, std::span<const int32_t>(ids.data(), 64), false};
    m.v4->forward(std::span<const V4SeqChunk>(&c0, 1), cache);
    cache.close(&w);
  }
  auto t0 = Clock::now();
  V4SeqChunk pc{&st, ids, false};
  m.v4->forward(std::span<const V4SeqChunk>(&pc, 1), cache);
  cache.close(&st);
  const double prefill_s = seconds_since(t0);
  const double prefill_tps = prefill / prefill_s;
  const double prefill_gflops = prefill_tps * (fpt - 2.0 * c.vocab_size * c.hidden_size) / 1e9;

  json result = {{"model", model_dir.empty() ? std::string("random small config") : model_dir}, {"threads", be.pool().size()},
                 {"gemm_gflops_openblas", blas_rate}, {"gemm_gflops_deepinfer", own_rate},
                 {"prefill_tokens", prefill}, {"prefill_tok_s", prefill_tps}, {"prefill_gemm_gflops", prefill_gflops},
                 {"prefill_vs_openblas", prefill_gflops / blas_rate}};
  std::printf("machine GEMM rate: OpenBLAS %.1f GFLOP/s, DeepInfer kernel %.1f GFLOP/s (%d threads)\n", blas_rate,
              own_rate, be.pool().size());
  std::printf("prefill %d tokens: %.0f tok/s, %.1f GFLOP/s in GEMMs = %.0f%% of OpenBLAS\n", prefill, prefill_tps,
              prefill_gflops, 100 * prefill_gflops / blas_rate);

  for (int batch : {1, 16}) {
    std::vector<V4SeqState> states(batch);
    std::vector<std::vector<int32_t>> last(batch, std::vector<int32_t>(1));
    for (int b = 0; b < batch; ++b) {
      cache.open(&states[b]);
      cache.reserve(&states[b], 128 + decode_steps);
      std::vector<int32_t> p(128);
      for (auto& t : p) t = tok(g);
      V4SeqChunk cc{&states[b], p, false};
      m.v4->forward(std::span<const V4SeqChunk>(&cc, 1), cache);
      last[b][0] = tok(g);
    }
    auto t1 = Clock::now();
    for (int s = 0; s < decode_steps; ++s) {
      std::vector<V4SeqChunk> step;
      for (int b = 0; b < batch; ++b) step.push_back({&states[b], last[b], false});
      auto logits = m.v4->forward(step, cache);
      for (int b = 0; b < batch; ++b) {  // greedy, so the run is a real decode loop
        const float* row = logits.data() + (size_t)b * c.vocab_size;
        last[b][0] = (int32_t)(std::max_element(row, row + c.vocab_size) - row);
      }
    }
    const double s = seconds_since(t1);
    const double tps = batch * decode_steps / s;
    std::printf("decode batch %2d (context 128): %.1f tok/s, %.2f ms/step\n", batch, tps, 1e3 * s / decode_steps);
    result["decode_b" + std::to_string(batch) + "_tok_s"] = tps;
    for (auto& s2 : states) cache.close(&s2);
  }
  if (!json_out.empty()) std::ofstream(json_out) << result.dump(2) << "\n";
  if (model_dir.empty()) std::filesystem::remove_all(dir);
  return 0;
}
