#pragma once
// DeepInfer's engine: the one object every front-end (CLI, Python, HTTP server) drives.
//
//   deepinfer::Engine engine({.model_dir = "path/to/model"});
//   auto id = engine.add_request({.prompt = "Hello", .params = p}, [](const RequestOutput& o) {...});
//   while (engine.has_work()) engine.step();          // or engine.start() for a background loop
//
// Threading: add_request() and abort() may be called from any thread at any time; everything else
// (the model, the cache, the scheduler) is owned by the one thread that runs step() — the caller's,
// or the background loop's after start(). Output callbacks run on that thread. No global state:
// two engines in one process are independent.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct EngineConfig {
  std::string model_dir;             // "" = the embedded default model (models/nano-v4)
  std::string tokenizer;             // "" = the model directory (requests then need ids if it has none)
  int threads = 0;                   // CPU threads (0 = all cores)
  int64_t cache_bytes = 256ll << 20; // budget for the paged cache (state slots + pages)
  int max_num_seqs = 16;             // sequences running at once
  int64_t max_batched_tokens = 512;  // tokens per step (chunked prefill)
  int64_t max_model_len = 0;         // 0 = the model's max_position_embeddings
  bool progress = false;             // print weight-loading progress on stderr
  std::string backend;               // "cuda", "cpu" or "" (auto: cuda when built with it and a GPU is present)
  double gpu_memory_fraction = 0.9;  // cuda: share of the device memory free after weights and activations
                                     // that the paged cache takes (cache_bytes is the cpu budget)
  bool async_scheduling = true;      // plan and record decode step N+1 while step N runs (where the backend
                                     // runs decode steps from graphs: cuda); results are the same either way
  bool device_sampling = true;       // sample on the backend (Backend::sample_rows) every row without grammar
                                     // or logprobs, its logit processors applied there as edits, so only ids
                                     // cross to the host; the tokens are the same either way
  std::string dtype = "auto";        // cuda: "auto" keeps bf16 / fp8 / fp4 weights as stored (fast path);
                                     // "float32" dequantizes them (the cpu backend's numerics). cpu: float32.
};

enum class Finish { kNone, kStop, kLength, kAbort, kError };
const char* finish_name(Finish f);  // "stop", "length", "abort", "error" ("" for kNone)

struct Request {
  std::string prompt;                // used when prompt_ids is empty (encoded without BOS unless add_bos)
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = false;   // BOS per tokenizer config when encoding `prompt`
  SamplingParams params;
};

struct TokenLogprobs {
  int32_t token;
  float logprob;
  std::vector<TokenLogprob> top;
};

// One event of one output sequence (choice `index` of request `request_id`).
struct RequestOutput {
  uint64_t request_id = 0;
  int index = 0;
  std::vector<int32_t> token_ids;       // generated this step
  std::string text;                     // text that became final this step
  std::vector<TokenLogprobs> logprobs;  // one per token_ids entry, when requested
  bool finished = false;
  Finish finish = Finish::kNone;
  std::string stop_reason;              // matched stop string, or the stop token id
  std::string error;                    // finish == kError
  int64_t num_prompt_tokens = 0;
  int64_t num_output_tokens = 0;        // so far, this choice
};

using OutputSink = std::function<void(const RequestOutput&)>;

// What generate() returns per choice.
struct Completion {
  int index = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  Finish finish = Finish::kNone;
  std::string stop_reason, error;
};
struct GenerateResult {
  uint64_t request_id = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<Completion> outputs;  // n choices
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t cache_pages_used = 0, cache_pages_total = 0, cache_slots_used = 0, cache_slots_total = 0;
  int64_t cache_page_bytes = 0, cache_slot_bytes = 0, cache_tokens_per_page = 0;
  int64_t steps = 0, prompt_tokens = 0, generated_tokens = 0, preemptions = 0;
  int64_t device_sampled_tokens = 0;  // generated tokens picked on the backend (only their ids crossed)
  int64_t fed_steps = 0;  // decode steps launched before the host read the previous one: their tokens were its
                          // picks, taken on the device (async scheduling with device sampling)
};

class Engine {
 public:
  explicit Engine(const EngineConfig& cfg);  // loads model and tokenizer; throws Error
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request; throws Error (with the field name) for an invalid one, and
  // then nothing is queued. Thread-safe.
  uint64_t add_request(Request req, OutputSink sink);
  // Stops a request; its choices finish with Finish::kAbort within one step and every cache
  // block it held is free after that step. Unknown ids are ignored. Thread-safe.
  void abort(uint64_t request_id);

  // One engine step (admits queued requests, runs the model once, samples, emits outputs).
  // Returns false when there was nothing to do.
  bool step();
  bool has_work() const;
  // Background loop owning the engine until stop(); stop() drains nothing (see drain()).
  void start();
  void stop();
  // Stops admitting new requests; returns when every running request has finished or
  // `timeout_ms` passed (then the rest are aborted). Needs the background loop.
  void drain(int64_t timeout_ms);

  // Offline batch: runs to completion on the calling thread (the loop must not be started).
  std::vector<GenerateResult> generate(const std::vector<Request>& reqs);

  bool has_tokenizer() const;
  const tokenizer::Tokenizer& tokenizer() const;  // throws Error if none
  int64_t vocab_size() const;
  // "deepseek_v4" or "deepseek_v41" (picks the chat format, among others).
  const char* architecture() const;
  int64_t max_model_len() const;
  const std::string& model_dir() const;
  EngineStats stats() const;  // thread-safe snapshot
  // Internal consistency of the cache accounting (tests call it after every step): "" when ok.
  std::string check_invariants() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The directory of the embedded default model.
std::string default_model_dir();

}  // namespace deepinfer
