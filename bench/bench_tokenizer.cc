// Tokenizer encode throughput, single thread and batch (all cores), optionally side by side with
// Hugging Face `tokenizers` on the same corpus (scripts/tokenizer/bench_hf.py).
//   bench_tokenizer [--tokenizer DIR] [--corpus FILE.jsonl.gz] [--repeats N] [--hf PYTHON]
// Defaults: tests/data/tokenizer/deepseek-v3 and its corpus. Not a test: prints numbers only.
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/json.h"

using deepinfer::tokenizer::Tokenizer;


static std::string source_dir() {
  std::string f = __FILE__;
  size_t p = f.rfind("/bench/");
  return p == std::string::npos ? "." : f.substr(0, p);
}

int main(int argc, char** argv) {
  std::string root = source_dir();
  std::string tok_dir = root + "/tests/data/tokenizer/deepseek-v3";
  std::string corpus = root + "/tests/data/tokenizer/corpus.jsonl.gz";
  std::string python;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokenizer") tok_dir = argv[i + 1];
    else if (a == "--corpus") corpus = argv[i + 1];
    else if (a == "--repeats") reps = std::atoi(argv[i + 1]);
    else if (a == "--hf") python = argv[i + 1];
  }
  Tokenizer tok = Tokenizer::from_file(tok_dir);
  std::vector<std::string> texts;
  {
    gzFile f = gzopen(corpus.c_str(), "rb");
    if (!f) {
      std::fprintf(stderr, "cannot open %s\n", corpus.c_str());
      return 1;
    }
    std::string all;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, size_t(n));
    gzclose(f);
    size_t pos = 0;
    while (pos < all.size()) {
      size_t e = all.find('\n', pos);
      if (e == std::string::npos) e = all.size();
      if (e > pos) texts.push_back(nlohmann::json::parse(all.substr(pos, e - pos)).get<std::string>());
      pos = e + 1;
    }
  }
  size_t bytes = 0, ntok = 0;
  for (auto& t : texts) bytes += t.size();
  using clk = std::chrono::steady_clock;
  double best = 0, bbest = 0;
  for (size_t i = 0; i < std::min<size_t>(2000, texts.size()); ++i) ntok += tok.encode(texts[i]).size();
  for (int r = 0; r < reps; ++r) {
    auto t0 = clk::now();
    ntok = 0;
    for (auto& t : texts) ntok += tok.encode(t).size();
    double s = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::max(best, bytes / s / 1e6);
  }
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (int r = 0; r < reps; ++r) {
    auto t0 = clk::now();
    auto out = tok.encode_batch(texts, false, deepinfer::tokenizer::ParseSpecial::kAll, threads);
    double s = std::chrono::duration<double>(clk::now() - t0).count();
    bbest = std::max(bbest, bytes / s / 1e6);
  }
  std::printf("corpus: %zu strings, %.2f MB, %zu tokens\n", texts.size(), bytes / 1e6, ntok);
  std::printf("deepinfer: single-thread %.2f MB/s, batch (%u threads) %.2f MB/s\n", best, threads, bbest);
  if (!python.empty()) {
    std::string tj = tok_dir + "/tokenizer.json";
    if (FILE* f = std::fopen(tj.c_str(), "rb")) std::fclose(f); else tj += ".gz";
    auto run = [&](const std::string& env, double& single, double& batch) {
      std::string cmd = env + python + " " + root + "/scripts/tokenizer/bench_hf.py " + tj + " " +
                        corpus + " " + std::to_string(reps);
      FILE* p = popen(cmd.c_str(), "r");
      char line[512] = {0};
      if (p && std::fgets(line, sizeof line, p))
        std::sscanf(line, "hf_single_mb_s=%lf hf_batch_mb_s=%lf", &single, &batch);
      if (p) pclose(p);
      return single > 0;
    };
    double hs = 0, hb = 0, h1s = 0, h1 = 0;
    if (run("", hs, hb) && run("RAYON_NUM_THREADS=1 ", h1s, h1)) {
      std::printf("hf tokenizers: encode() per string %.2f MB/s, encode_batch 1 thread %.2f MB/s, "
                  "encode_batch all threads %.2f MB/s\n", hs, h1, hb);
      std::printf("speed-up single thread: %.2fx vs HF encode_batch(1 thread), %.2fx vs HF encode(); "
                  "batch: %.2fx\n", best / h1, best / hs, bbest / hb);
    } else {
      std::printf("hf tokenizers: could not run %s (pip install tokenizers)\n", python.c_str());
    }
  }
  return 0;
}
