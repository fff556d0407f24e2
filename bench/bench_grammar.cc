// Structured-output benchmark (not a test): one thread, DeepSeek vocabulary (129,280 logits).
// For every schema: compile time (cold), then the time of every fill_mask along
//  (a) each valid JSON-Schema-Test-Suite instance, tokenized greedily (MaskBench-style), and
//  (b) a seeded random walk over allowed tokens (up to 200 tokens).
// Schemas: the test-suite cases, tests/data/grammar/sample_schemas.json, and every top-level
// schema and definition of the *.json files in extra directories (scripts/grammar/fetch_bench_schemas.sh).
//
// usage: bench_grammar [--tokenizer PATH] [--walk-tokens N] [--compile-runs N] [--min] [--per-schema] [--only NAME] [DIR...]
//   --compile-runs N (default 3): compiles per schema; the median counts, or the minimum with --min
//   (the uncontended cost on a shared, noisy machine: other load only ever adds time).
//   --per-schema: one line per compiled schema (compile us, DFA states); --only: schemas whose name
//   is NAME (profiling one case under callgrind).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/testing.h"
#include "util/error.h"

using namespace deepinfer::grammar;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

struct Item {
  std::string name, schema;
  std::vector<std::string> instances;  // valid instances to replay
};

double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()));
  return v[i];
}

void summary(const char* what, const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  std::printf("%-28s n=%-8zu avg=%9.1f p50=%9.1f p90=%9.1f p99=%9.1f p99.9=%9.1f max=%10.1f  (us)\n", what, v.size(),
              v.empty() ? 0 : sum / v.size(), pct(v, 50), pct(v, 90), pct(v, 99), pct(v, 99.9),
              v.empty() ? 0 : *std::max_element(v.begin(), v.end()));
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok = DEEPINFER_SOURCE_DIR "/tests/data/grammar/deepseek-v3/tokenizer.json";
  std::string src = DEEPINFER_SOURCE_DIR;
  size_t walk_tokens = 200;
  std::vector<std::string> dirs;
  bool per_schema = false, use_min = false;
  int compile_runs = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) tok = argv[++i];
    else if (a == "--walk-tokens" && i + 1 < argc) walk_tokens = std::stoul(argv[++i]);
    else if (a == "--per-schema") per_schema = true;
    else if (a == "--min") use_min = true;
    else if (a == "--compile-runs" && i + 1 < argc) compile_runs = std::max(1, std::stoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else dirs.push_back(a);
  }
  auto vocab = load_vocab_from_tokenizer_json(tok, 129280);
  std::vector<Item> items;
  for (auto& e : std::filesystem::directory_iterator(src + "/tests/data/grammar/json-schema-test-suite")) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    for (auto& tc : ojson::parse(f)) {
      Item it{e.path().stem().string(), tc["schema"].dump(), {}};
      for (auto& t : tc["tests"])
        if (t["valid"].get<bool>()) it.instances.push_back(testkit::dump_python(t["data"], true));
      items.push_back(std::move(it));
    }
  }
  {
    std::ifstream f(src + "/tests/data/grammar/sample_schemas.json");
    int k = 0;
    for (auto& s : ojson::parse(f)) items.push_back({"sample" + std::to_string(k++), s.dump(), {}});
  }
  for (auto& d : dirs)
    for (auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() != ".json") continue;
      std::ifstream f(e.path());
      ojson doc;
      try { doc = ojson::parse(f); } catch (...) { continue; }
      if (!doc.is_object()) continue;
      items.push_back({e.path().stem().string(), doc.dump(), {}});
      // Each definition is a real-world schema of its own (references still resolve in doc).
      for (const char* key : {"definitions", "$defs"}) {
        if (!doc.contains(key) || !doc[key].is_object()) continue;
        for (auto& [name, _] : doc[key].items()) {
          ojson sub = doc;
          for (const char* drop : {"properties", "type", "required", "additionalProperties", "oneOf", "anyOf", "allOf",
                                   "items", "$ref", "patternProperties", "if", "then", "else", "not", "enum", "const"})
            sub.erase(drop);
          std::string esc;
          for (char c : name) esc += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
          sub["$ref"] = std::string("#/") + key + "/" + esc;
          items.push_back({e.path().stem().string() + "#" + name, sub.dump(), {}});
        }
      }
    }
  std::vector<double> compile_us, first_mask_us, ttfm_us, mask_replay, mask_walk;
  size_t ok = 0, errors = 0;
  std::vector<uint32_t> mask(vocab->mask_words());
  for (auto& it : items) {
    if (!only.empty() && it.name != only) continue;
    std::shared_ptr<const Grammar> g;
    try {
      std::vector<double> runs;
      for (int r = 0; r < compile_runs; ++r) {
        auto t0 = Clock::now();
        g = compile({SpecKind::JsonSchema, it.schema}, vocab);
        runs.push_back(us(t0, Clock::now()));
      }
      std::sort(runs.begin(), runs.end());
      compile_us.push_back(use_min ? runs[0] : runs[runs.size() / 2]);
    } catch (const deepinfer::Error&) {
      ++errors;
      continue;
    }
    ++ok;
    if (per_schema) std::printf("schema %-60s compile %10.1f us  %6zu states\n", it.name.c_str(), compile_us.back(), g->num_states());
    {
      Matcher m(g);
      auto t0 = Clock::now();
      m.fill_mask(mask.data());
      double fm = us(t0, Clock::now());
      first_mask_us.push_back(fm);
      ttfm_us.push_back(compile_us.back() + fm);
    }
    for (auto& inst : it.instances) {
      Matcher m(g);
      for (int32_t id : testkit::greedy_tokenize(*vocab, inst)) {
        auto t0 = Clock::now();
        m.fill_mask(mask.data());
        mask_replay.push_back(us(t0, Clock::now()));
        if (!(mask[id >> 5] >> (id & 31) & 1) || !m.accept_token(id)) break;
      }
    }
    {
      // Random walk; timing fill_mask only (sampling itself is not the engine's cost).
      Matcher m(g);
      std::mt19937_64 rng(12345);
      std::vector<int32_t> allowed;
      for (size_t step = 0; step < walk_tokens; ++step) {
        auto t0 = Clock::now();
        m.fill_mask(mask.data());
        mask_walk.push_back(us(t0, Clock::now()));
        allowed.clear();
        for (size_t w = 0; w < mask.size(); ++w)
          for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed.push_back(w * 32 + __builtin_ctz(bits));
        if (allowed.empty()) break;
        int32_t pick = allowed[rng() % allowed.size()];
        if (pick == vocab->eos_id()) break;
        if (!m.accept_token(pick)) { std::printf("MASK ERROR in %s\n", it.name.c_str()); return 1; }
      }
    }
  }
  std::printf("schemas: %zu compiled, %zu compile errors (unsupported keywords / limits)\n", ok, errors);
  summary("compile", compile_us);
  summary("first mask", first_mask_us);
  summary("time to first mask", ttfm_us);
  summary("mask, suite instances", mask_replay);
  summary("mask, random walk", mask_walk);
  std::vector<double> all = mask_replay;
  all.insert(all.end(), mask_walk.begin(), mask_walk.end());
  summary("mask, all", all);
  return 0;
}
