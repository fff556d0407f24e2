// deepinfer bench: decode and prefill throughput of DeepSeek-V4 on a model slice with random weights
// in the published storage formats (docs/bench.md), with each result's share of the HBM roofline and
// of the fp8 tensor-core peak.
//
//   deepinfer bench [--backend cuda|cpu] [--config flash|tiny|DIR] [--layers N] [--batch 1,8,32,128,256]
//                   [--context 4096] [--prefill 4096,16384] [--steps N] [--seed S] [--json FILE]
//                   [--hf-json FILE] ...
//
// The weights never touch a disk: make_synthetic_v4_checkpoint builds an in-memory Checkpoint and
// the model loads it through the same loader as a real directory. Decode cases fast-forward the
// cache (V4Cache::fast_forward_for_bench) instead of prefilling B·C tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "deepinfer/engine.h"
#include "io/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/v4_inventory.h"
#include "ops/select/backend_select.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The ceilings every percentage is taken against (issue #6; measured on the H200 in
// docs/cuda-notes.md: 4268 GB/s copy, 1462 TFLOP/s fp8 cuBLASLt).
constexpr double kHbmBytesPerS = 4.27e12;
constexpr double kFp8FlopsPerS = 1474e12;

const char* kUsage =
    "usage: deepinfer bench [options]\n"
    "  --backend cuda|cpu         (default: cuda when a GPU is present)\n"
    "  --config flash|tiny|DIR    model shapes: V4-Flash (default), a tiny test config, or DIR/config.json\n"
    "  --layers N                 layers of the slice (default: cuda: as many as fit, cpu: tiny all, else 1)\n"
    "  --batch LIST               decode batch sizes (default 1,8,32,128,256)\n"
    "  --context N                decode context per sequence (default 4096)\n"
    "  --prefill LIST             prefill prompt lengths (default 4096,16384; 0 or '' = none)\n"
    "  --steps N                  timed decode steps per batch size (default 16)\n"
    "  --warmup N                 untimed decode steps first (default 2)\n"
    "  --chunk N                  prefill tokens per step (default: the engine's max_batched_tokens)\n"
    "  --case-seconds S           time cap of one case's timed part (default 60)\n"
    "  --gpu-memory-fraction F    share of free device memory for weights + cache (default 0.9)\n"
    "  --dtype auto|float32       cuda: weights as stored (fp8/fp4/bf16, default) or dequantized to float32\n"
    "  --seed S  --threads N  --device-name NAME\n"
    "  --profile N                after each decode case, N more steps with device time per op (prefill: the\n"
    "                             prompt again); busy/gap/idle per step and the top ops go to the JSON and stdout\n"
    "  --overlap 0|1              decode: plan and record step N+1 while step N runs (default 1; needs graphs)\n"
    "  --logits 0|1               decode: read every step's logits (1) or only its picks (default 0)\n"
    "  --feed 0|1                 decode with --overlap 1 --logits 0: launch step N+1 with its tokens taken from N's\n"
    "                             picks on the device, then read N (the engine's way with device sampling; default 1)\n"
    "  --temperature T  --top-p P decode picks sampled on the backend (Backend::sample_rows; default 0: greedy)\n"
    "  --kernel-trace N           after each decode case, N more steps with every kernel's device start and end\n"
    "                             recorded (CUPTI, loaded at run time: DEEPINFER_CUPTI=path; graph replays and their\n"
    "                             early launches untouched) and summed by kernel into each one's share of the step\n"
    "                             (its marginal time: how far its end moves the latest end). Starts CUPTI before the\n"
    "                             model is built: the other numbers of that run may move; compare its ms/step\n"
    "  --cost-only                print bytes/FLOPs/floors of every case for the slice (--layers, default all), run nothing\n"
    "  --json FILE                write the results as JSON\n"
    "  --hf-json FILE             transformers' results (bench/hf_slice_bench.py) to print side by side\n";

struct Options {
  std::string backend, config = "flash", json_out, hf_json, device_name, dtype = "auto";
  int layers = 0;  // 0: default
  bool cost_only = false;  // --cost-only: print the cost model of every case, run nothing
  int64_t profile_steps = 0;  // --profile N: after a case's timed steps, N more steps with device-time profiling
  int64_t trace_steps = 0;    // --kernel-trace N: then N more decode steps with a kernel timeline
  bool overlap = true;        // --overlap: decode step N+1 prepared while step N runs
  bool read_logits = false;   // --logits: decode steps read every logit (else the picks only)
  bool feed = true;           // --feed: step N+1 launched before N is read, its tokens N's picks
  float temperature = 0.0f, top_p = 1.0f;  // --temperature / --top-p: how the picks are sampled
  std::vector<int64_t> batches{1, 8, 32, 128, 256}, prefills{4096, 16384};
  int64_t context = 4096, steps = 16, warmup = 2, chunk = 0, seed = 1, threads = 0;
  double case_seconds = 60, gpu_fraction = 0.9;
};

std::vector<int64_t> int_list(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t x = flag_int(flag, item);
    if (x < 0) throw Error(flag + ": values must be >= 0, got " + item);
    if (x > 0) out.push_back(x);
  }
  return out;
}

double flag_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used != v.size()) throw 0;
    return x;
  } catch (...) {
    throw Error(flag + ": expected a number, got '" + v + "'");
  }
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string device_description(const std::string& backend, int threads) {
  if (backend == "cuda") {  // the driver's description, no CUDA call needed
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
      std::ifstream f(e.path() / "information");
      std::string line;
      while (std::getline(f, line))
        if (line.rfind("Model:", 0) == 0) {
          auto p = line.find_first_not_of(" \t", 6);
          return p == std::string::npos ? "cuda device" : line.substr(p);
        }
    }
    return "cuda device";
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "cpu";
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) model = line.substr(line.find_first_not_of(" \t", p + 1));
      break;
    }
  return model + " (" + std::to_string(threads) + " threads)";
}

// ---------------------------------------------------------------------------------------------------
// Cost model: bytes that must be read and FLOPs that must be done per forward step (docs/bench.md).
//
// Bytes, per step:
//   weights   = Σ_layers [dense + shared expert + E_hit(T)·routed expert] + head + final norm/mHC head
//               + T·(embedding row), in the published storage (fp8 + e8m0 block scales, fp4 + e8m0
//               1×32 scales, bf16, f32), T = tokens in the step;
//   E_hit(T)  = E·(1 − (1 − k/E)^T): expected number of distinct routed experts that T tokens touch
//               when each picks k of E uniformly (random weights route near-uniformly);
//   cache     = per sequence and layer, each row of the union of its queries' key sets once:
//               sliding rows min(W−1, p0) + n, compressed entries (HCA: ⌊(p0+n)/m⌋; CSA:
//               min(⌊(p0+n)/m⌋, n·top-k)) at kv_row bytes, plus CSA indexer keys ⌊(p0+n)/m⌋ at
//               idx_row bytes, for a chunk of n tokens at positions p0..p0+n−1 (decode: n = 1);
//               kv_row = (d−r) fp8 + r bf16 + ⌈(d−r)/64⌉ e8m0 scales + 1 pad (584 B for V4-Flash),
//               idx_row = dI fp8 + 4 B scale (132 B): the compact production layout of spec §4.1.
//   Not counted: writes (new cache rows, activations), tid2eid rows, the compressor's open-window
//   state, activations re-read between kernels.
// FLOPs, per step: 2 × multiply-adds of
//   every GEMM a token runs through (attention projections, compressor and indexer projections, the
//   mHC mixes, the router, k routed + the shared expert), per token;
//   attention: 2·H·d per key of the token's key set (q·k and p·v), keys(t) = min(W, t+1) + compressed
//   (HCA: ⌊(t+1)/m⌋, CSA: min(top-k, ⌊(t+1)/m⌋)); indexer: hI·dI per visible CSA key ⌊(t+1)/m⌋;
//   the head (V·D) and the mHC head for every row that returns logits.
// HBM roofline time = bytes / 4.27e12 B/s; % of roofline = that / measured time. Compute floor =
// FLOPs / 1474e12 (fp8 dense peak); % of fp8 peak = that / measured time.
struct CostModel {
  const V4Config& c;
  std::vector<double> dense, shared, expert;  // per layer: bytes (expert = one routed expert)
  std::vector<double> macs_token;             // per layer: GEMM MACs per token (k routed + shared)
  double head = 0, top = 0, embed_row = 0;    // head; final norm + mHC head; one embedding row
  double kv_row = 0, idx_row = 0;

  explicit CostModel(const V4Config& cfg) : c(cfg) {
    const int L = c.num_layers;
    dense.assign(L, 0);
    shared.assign(L, 0);
    expert.assign(L, 0);
    macs_token.assign(L, 0);
    std::vector<double> expert_macs(L, 0);
    for (const auto& t : v4_tensor_inventory(c, false)) {
      const double bytes = (double)v4_stored_bytes(c, t);
      const bool matrix = t.shape.size() == 2;
      const double macs = matrix ? (double)t.shape[0] * (double)t.shape[1] : 0;
      if (t.name == "embed.weight") {
        embed_row = bytes / (double)c.vocab_size;
        continue;
      }
      if (t.name == "head.weight") {
        head = bytes;
        continue;
      }
      if (t.name.rfind("layers.", 0) != 0) {
        top += bytes;
        continue;
      }
      const int l = std::stoi(t.name.substr(7));
      if (t.name.find(".ffn.gate.tid2eid") != std::string::npos) continue;  // host table, T·k rows
      if (t.name.find(".ffn.experts.") != std::string::npos) {
        expert[l] += bytes / c.n_routed_experts;
        expert_macs[l] += macs / c.n_routed_experts;
        continue;
      }
      (t.name.find(".ffn.shared_experts.") != std::string::npos ? shared[l] : dense[l]) += bytes;
      if (matrix && t.name.find(".ape") == std::string::npos) macs_token[l] += macs;
    }
    for (int l = 0; l < L; ++l) macs_token[l] += c.num_experts_per_tok * expert_macs[l];
    const double d = c.head_dim, r = c.rope_dim;
    kv_row = (d - r) + 2 * r + std::ceil((d - r) / 64) + 1;
    idx_row = c.index_head_dim + 4.0;
  }

  double weight_bytes() const {
    double s = head + top + embed_row * c.vocab_size;
    for (int l = 0; l < c.num_layers; ++l) s += dense[l] + shared[l] + expert[l] * c.n_routed_experts;
    return s;
  }
  double experts_hit(double T) const {
    const double E = c.n_routed_experts, k = c.num_experts_per_tok;
    return E * (1.0 - std::pow(1.0 - k / E, T));
  }

  struct Chunk {
    int64_t p0, n;  // positions p0 .. p0+n−1 of one sequence
  };
  struct Cost {
    double bytes_weights = 0, bytes_experts = 0, bytes_cache = 0, flops = 0;
    double bytes() const { return bytes_weights + bytes_experts + bytes_cache; }
  };
  // One forward step over `chunks` (one per sequence); `logit_rows` rows return logits.
  Cost step(const std::vector<Chunk>& chunks, int64_t logit_rows) const {
    Cost out;
    int64_t T = 0;
    for (const auto& ch : chunks) T += ch.n;
    const double W = c.sliding_window, topk = c.index_topk, D = c.hidden_size;
    double macs = 0;
    out.bytes_weights = head + top + embed_row * (double)T;
    for (int l = 0; l < c.num_layers; ++l) {
      out.bytes_weights += dense[l] + shared[l];
      out.bytes_experts += experts_hit((double)T) * expert[l];
      macs += macs_token[l] * (double)T;
      const AttnType type = c.layer_types[l];
      const double m = type == AttnType::Sliding ? 0 : c.compress_rate(l);
      for (const auto& ch : chunks) {
        const double end = (double)(ch.p0 + ch.n);
        double rows = std::min<double>(W - 1, (double)ch.p0) + (double)ch.n, keys = 0;
        if (type == AttnType::HCA) rows += std::floor(end / m);
        if (type == AttnType::CSA) {
          keys = std::floor(end / m);
          rows += std::min(keys, (double)ch.n * topk);
        }
        out.bytes_cache += rows * kv_row + keys * idx_row;
        for (int64_t t = ch.p0; t < ch.p0 + ch.n; ++t) {  // per token: its own key set
          const double vis = m > 0 ? std::floor((double)(t + 1) / m) : 0;
          double k = std::min<double>(W, (double)(t + 1));
          if (type == AttnType::HCA) k += vis;
          if (type == AttnType::CSA) {
            k += std::min(topk, vis);
            macs += (double)c.index_n_heads * c.index_head_dim * vis;
          }
          macs += 2.0 * c.num_heads * c.head_dim * k;
        }
      }
    }
    macs += (double)logit_rows * ((double)c.vocab_size * D + (double)c.hc_mult * c.hc_mult * D);
    out.flops = 2 * macs;
    return out;
  }
};

// ---------------------------------------------------------------------------------------------------

struct CaseResult {
  std::string kind;  // "decode" | "prefill"
  int64_t batch = 1, context = 0, prompt = 0;
  int64_t steps = 0;  // timed forward steps (prefill: chunks)
  double seconds = 0;
  bool partial = false;  // stopped by --case-seconds
  bool logits_finite = true;  // of the last timed step
  CostModel::Cost cost;  // summed over the timed steps
  std::string error;
  Backend::Profile profile;  // --profile: device time per op over profile_steps extra steps
  int64_t profile_steps = 0;
  std::vector<KernelRecord> trace;  // --kernel-trace: the kernels of trace_steps extra decode steps
  int64_t trace_steps = 0;

  json to_json() const {
    json j{{"kind", kind}, {"batch", batch}};
    j["context"] = kind == "decode" ? json(context) : json(nullptr);
    j["prompt"] = kind == "prefill" ? json(prompt) : json(nullptr);
    if (!error.empty() || steps == 0 || seconds <= 0) {
      j["error"] = error.empty() ? "no step completed" : error;
      return j;
    }
    const double tokens = kind == "decode" ? (double)batch * steps : (double)prompt_done();
    const double S = (double)steps;
    j["steps"] = steps;
    j["seconds"] = seconds;
    j["tokens_per_s"] = tokens / seconds;
    j["per_user_tokens_per_s"] = kind == "decode" ? S / seconds : tokens / seconds;
    j["ms_per_step"] = 1e3 * seconds / S;
    j["bytes"] = cost.bytes() / S;  // per step
    j["bytes_weights"] = cost.bytes_weights / S;
    j["bytes_experts"] = cost.bytes_experts / S;
    j["bytes_cache"] = cost.bytes_cache / S;
    j["flops"] = cost.flops / S;
    j["hbm_floor_ms"] = 1e3 * cost.bytes() / S / kHbmBytesPerS;
    j["fp8_floor_ms"] = 1e3 * cost.flops / S / kFp8FlopsPerS;
    j["pct_hbm"] = 100.0 * (cost.bytes() / kHbmBytesPerS) / seconds;
    j["pct_fp8"] = 100.0 * (cost.flops / kFp8FlopsPerS) / seconds;
    j["partial"] = partial;
    j["logits_finite"] = logits_finite;
    j["error"] = nullptr;
    if (profile_steps > 0 && profile.calls > 0) {  // backends with a device only
      // Per step: device busy time (Σ op time), device gaps between ops (idle: launch and host cost),
      // and the ops by time. Measured on extra steps (events add host time), so busy is compared with
      // the unprofiled ms_per_step: idle_est = ms_per_step − busy.
      const double P = (double)profile_steps;
      json ops = json::array();
      for (const auto& op : profile.ops)
        ops.push_back({{"op", op.op}, {"calls_per_step", op.calls / P}, {"us_per_step", 1e3 * op.ms / P},
                       {"gap_before_us_per_step", 1e3 * op.gap_ms / P}});
      j["profile"] = {{"steps", profile_steps},
                      {"busy_ms_per_step", profile.busy_ms / P},
                      {"gap_ms_per_step", profile.gap_ms / P},
                      {"calls_per_step", profile.calls / P},
                      {"graph_steps", profile.graph_steps},
                      {"idle_between_graphs_us",
                       profile.graph_gaps > 0 ? 1e3 * profile.graph_gap_ms / (double)profile.graph_gaps : 0.0},
                      {"idle_est_ms_per_step", 1e3 * seconds / S - profile.busy_ms / P},
                      {"ops", ops}};
    }
    if (trace_steps > 0 && !trace.empty()) {
      // The kernel timeline, summed by kernel (util/kernel_timeline.h): per step, each kernel's marginal time (its
      // share of the step's span: Σ marginal + Σ idle = span), its own duration, the idle time before it and how
      // long it overlapped what ran before (early start).
      const KernelTimeline t = summarize_kernels(trace);
      const double P = (double)trace_steps;
      json ks = json::array();
      for (const KernelSummaryRow& r : t.rows)
        ks.push_back({{"kernel", r.name}, {"calls_per_step", r.calls / P}, {"marginal_us_per_step", r.marginal_us / P},
                      {"us_per_step", r.dur_us / P}, {"idle_before_us_per_step", r.idle_us / P},
                      {"early_us_per_step", r.early_us / P}});
      json raw = json::array();
      for (const KernelRecord& k : trace)
        raw.push_back({k.name, k.start_ns - trace.front().start_ns, k.end_ns - k.start_ns, k.graph_node, k.blocks,
                       k.threads, k.stream});
      j["kernel_trace"] = {{"steps", trace_steps}, {"span_ms_per_step", 1e-3 * t.span_us / P},
                           {"idle_ms_per_step", 1e-3 * t.idle_us / P}, {"kernels_per_step", t.kernels / P},
                           {"kernels", ks},
                           {"records_fields",
                            {"name", "start_ns", "duration_ns", "graph_node", "blocks", "threads", "stream"}},
                           {"records", raw}};
    }
    return j;
  }
  int64_t prompt_done_ = 0;
  int64_t prompt_done() const { return prompt_done_; }
};

std::vector<int32_t> random_tokens(std::mt19937_64& g, int64_t n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(g);
  return t;
}

bool all_finite(std::span<const float> v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

CaseResult run_decode(DeepseekV4Model& model, Backend& be, const CostModel& cm, const Options& o, int64_t B,
                      std::mt19937_64& g) {
  CaseResult r;
  r.kind = "decode";
  r.batch = B;
  r.context = o.context;
  const V4Config& c = model.config();
  const int64_t extra = o.warmup + o.steps + o.profile_steps + o.trace_steps;
  const V4CacheLayout lay = V4CacheLayout::make(c);
  Backend* cache_be = be.free_memory() >= 0 ? &be : nullptr;
  V4Cache cache(c, (int32_t)B, (int32_t)(B * lay.pages_for(o.context + extra)), cache_be);
  cache.fill_random_for_bench((uint64_t)o.seed + (uint64_t)B);
  std::vector<V4SeqState> st(B);
  for (auto& s : st)
    if (!cache.open(&s) || !cache.fast_forward_for_bench(&s, o.context, extra))
      throw Error("cache: cannot hold " + std::to_string(B) + " sequences");
  std::vector<int32_t> toks(B), feed_rows(B);
  for (int64_t b = 0; b < B; ++b) feed_rows[b] = (int32_t)b;
  std::vector<V4SeqChunk> step(B);
  std::span<const float> logits;
  // --overlap 1 (the engine's way): step N+1 is planned and recorded while step N runs, then N's logits
  // are read and N+1 is launched with its token ids (random here: sampling is not part of the measurement).
  // --logits 0 (a greedy engine's way): only the step's greedy picks (argmax_rows) cross to the host;
  // the logits are read once at the end of a case (finiteness check). --feed 1 (with both): N+1 is launched
  // with N's picks as its tokens (taken on the device) before N's picks are read, so the device never waits
  // for the host between steps.
  model.set_device_argmax(!o.read_logits);
  bool in_flight = false;  // a launched step whose results are not read yet
  auto read = [&] {
    if (o.read_logits) logits = model.logits();
    else model.argmax();
  };
  auto one_step = [&] {
    toks = random_tokens(g, B, c.vocab_size);
    for (int64_t b = 0; b < B; ++b)
      step[b] = {&st[b], std::span<const int32_t>(&toks[b], 1), false,
                 SampleSpec{o.temperature, o.top_p, 0.0f, 0, (uint64_t)(o.seed + b), (uint64_t)st[b].pos + 1}};
    if (o.overlap) model.prepare(step, cache);
    if (o.overlap && o.feed && !o.read_logits && in_flight && model.can_feed()) {
      model.launch(toks, feed_rows);  // every row's token: its pick of the step in flight
      model.argmax(1);                // that step's picks, read while this one runs
      return;
    }
    if (in_flight) read();
    in_flight = true;
    if (o.overlap) model.launch(toks);
    else model.forward_launch(step, cache);
  };
  auto drain = [&] {
    if (in_flight) read();
    in_flight = false;
  };
  for (int64_t i = 0; i < o.warmup; ++i) one_step();
  drain();
  be.synchronize();
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < o.steps; ++s) {
    std::vector<CostModel::Chunk> ch(B, CostModel::Chunk{st[0].pos, 1});
    for (int64_t b = 0; b < B; ++b) ch[b].p0 = st[b].pos;
    auto cost = cm.step(ch, B);
    one_step();
    r.cost.bytes_weights += cost.bytes_weights;
    r.cost.bytes_experts += cost.bytes_experts;
    r.cost.bytes_cache += cost.bytes_cache;
    r.cost.flops += cost.flops;
    ++r.steps;
    if (seconds_since(t0) > o.case_seconds && s + 1 < o.steps) {
      r.partial = true;
      break;
    }
  }
  drain();
  be.synchronize();
  r.seconds = seconds_since(t0);
  r.logits_finite = all_finite(model.logits());  // the last step's
  if (o.profile_steps > 0) {
    be.set_profiling(true);
    for (int64_t i = 0; i < o.profile_steps; ++i) one_step();
    drain();
    be.set_profiling(false);
    r.profile = be.take_profile();
    r.profile_steps = o.profile_steps;
  }
  if (o.trace_steps > 0) {  // the tracer records from the start; only these steps' kernels are kept
    drain();
    be.synchronize();
    be.kernel_trace_window(true);
    for (int64_t i = 0; i < o.trace_steps; ++i) one_step();
    drain();
    be.synchronize();
    be.kernel_trace_window(false);
    r.trace = be.take_kernel_trace();
    r.trace_steps = o.trace_steps;
  }
  return r;
}

CaseResult run_prefill(DeepseekV4Model& model, Backend& be, const CostModel& cm, const Options& o, int64_t P,
                       int64_t chunk, std::mt19937_64& g) {
  CaseResult r;
  r.kind = "prefill";
  r.prompt = P;
  const V4Config& c = model.config();
  const V4CacheLayout lay = V4CacheLayout::make(c);
  Backend* cache_be = be.free_memory() >= 0 ? &be : nullptr;
  V4Cache cache(c, 2, (int32_t)(lay.pages_for(P) + lay.pages_for(chunk)), cache_be);
  const std::vector<int32_t> ids = random_tokens(g, P, c.vocab_size);
  {  // warm-up: one chunk on a throwaway sequence
    V4SeqState w;
    const int64_t n = std::min(chunk, P);
    if (!cache.open(&w) || !cache.reserve(&w, n)) throw Error("cache: cannot hold the warm-up chunk");
    V4SeqChunk wc{&w, std::span<const int32_t>(ids.data(), n), false};
    model.forward(std::span<const V4SeqChunk>(&wc, 1), cache);
    cache.close(&w);
  }
  V4SeqState s;
  if (!cache.open(&s) || !cache.reserve(&s, P)) throw Error("cache: cannot hold the prompt");
  be.synchronize();
  const auto t0 = Clock::now();
  for (int64_t done = 0; done < P;) {
    const int64_t n = std::min(chunk, P - done);
    auto cost = cm.step({CostModel::Chunk{done, n}}, 1);
    V4SeqChunk pc{&s, std::span<const int32_t>(ids.data() + done, n), false};
    r.logits_finite = all_finite(model.forward_view(std::span<const V4SeqChunk>(&pc, 1), cache));
    r.cost.bytes_weights += cost.bytes_weights;
    r.cost.bytes_experts += cost.bytes_experts;
    r.cost.bytes_cache += cost.bytes_cache;
    r.cost.flops += cost.flops;
    ++r.steps;
    done += n;
    r.prompt_done_ = done;
    if (done < P && seconds_since(t0) > o.case_seconds) {
      r.partial = true;
      break;
    }
  }
  be.synchronize();
  r.seconds = seconds_since(t0);
  if (o.profile_steps > 0 && !r.partial) {  // the same chunks again on a fresh sequence, profiled
    cache.close(&s);
    V4SeqState p;
    if (!cache.open(&p) || !cache.reserve(&p, P)) throw Error("cache: cannot hold the profiled prompt");
    be.set_profiling(true);
    for (int64_t done = 0; done < P;) {
      const int64_t n = std::min(chunk, P - done);
      V4SeqChunk pc{&p, std::span<const int32_t>(ids.data() + done, n), false};
      model.forward(std::span<const V4SeqChunk>(&pc, 1), cache);
      done += n;
    }
    be.set_profiling(false);
    r.profile = be.take_profile();
    r.profile_steps = r.steps;
  }
  return r;
}

// Device bytes of the cache and the step activations of the largest case of a slice (what must stay
// free besides the weights). Activations: the engine's estimate (float32, engine.cc) for the step's
// tokens, plus 256 MiB.
int64_t runtime_reserve(const V4Config& c, const Options& o, int64_t chunk) {
  const V4CacheLayout lay = V4CacheLayout::make(c);
  auto activations = [&](int64_t T) {
    const int64_t D = c.hidden_size, hc = c.hc_mult, I = c.moe_intermediate_size;
    const int64_t per_token = 3 * hc * D + 4 * D + 3 * (int64_t)c.num_heads * c.head_dim + c.q_lora_rank +
                              6 * c.head_dim + 5 * c.index_head_dim + (int64_t)c.index_n_heads * c.index_head_dim +
                              (c.num_experts_per_tok + 1) * (2 * D + 3 * I) + c.vocab_size;
    return (int64_t)(2 * 4 * T * per_token + (int64_t(256) << 20));
  };
  int64_t need = 0;
  for (int64_t B : o.batches) {
    const int64_t pages = B * lay.pages_for(o.context + o.warmup + o.steps);
    need = std::max(need, B * lay.slot_bytes() + pages * lay.page_bytes() + activations(B));
  }
  for (int64_t P : o.prefills) {
    const int64_t pages = lay.pages_for(P) + lay.pages_for(chunk);
    // + the indexer scores of a chunk against every key (float32), downloaded for the top-k
    const int64_t scores = 4 * chunk * (P / std::max(1, c.compress_rate_csa));
    need = std::max(need, 2 * lay.slot_bytes() + pages * lay.page_bytes() + activations(chunk) + scores);
  }
  return need;
}

struct MemoryPlan {
  json info = json::object();
  int layers = 0;
  std::unique_ptr<DeepseekV4Model> model;  // the probe model, when it is already the slice to run
  std::unique_ptr<Checkpoint> ckpt;
};

// How many layers fit on a device backend: loads a probe slice of up to 4 layers, measuring the free
// device memory after the embedding/head and every layer, turns that into device bytes per stored
// byte (ρ, from layers 1..; layer 0 also carries the embedding and head), and picks the largest L
// with  fixed + ρ·Σ_{l<L} stored(l) + reserve(L) ≤ fraction · free.
MemoryPlan plan_layers(const json& full_cfg, Backend& be, const Options& o, int64_t chunk) {
  MemoryPlan plan;
  const int max_layers = full_cfg.value("num_hidden_layers", 1);
  const int64_t free0 = be.free_memory();
  const int probe_layers = std::min(4, max_layers);
  json pcfg = v4_slice_config(full_cfg, probe_layers);
  const V4Config pc = parse_v4_config(pcfg);
  std::vector<int64_t> free_after;  // after layer l
  auto ckpt = make_synthetic_v4_checkpoint(pcfg, (uint64_t)o.seed);
  std::unique_ptr<DeepseekV4Model> model;
  std::string probe_error;
  try {
    model = std::make_unique<DeepseekV4Model>(pc, *ckpt, be, [&](int done, int) {
      free_after.push_back(be.free_memory());
      std::fprintf(stderr, "bench: probe layer %d loaded, %.1f GiB free\n", done, free_after.back() / 1073741824.0);
    });
  } catch (const std::exception& e) {  // out of memory inside the probe: use what was measured
    probe_error = e.what();
  }
  const V4Config full = parse_v4_config(full_cfg);
  const CostModel cm(full);
  auto stored = [&](int l) { return cm.dense[l] + cm.shared[l] + cm.expert[l] * full.n_routed_experts; };
  double rho = 0;
  {
    double dev = 0, st = 0;
    for (size_t l = 1; l < free_after.size(); ++l) {
      dev += (double)(free_after[l - 1] - free_after[l]);
      st += stored((int)l);
    }
    if (st > 0) rho = dev / st;
  }
  if (free_after.empty()) throw Error("the first layer of the slice does not fit in device memory: " + probe_error);
  if (rho <= 0) rho = (double)(free0 - free_after[0]) / (stored(0) + cm.head + cm.embed_row * full.vocab_size);
  const double fixed = (double)(free0 - free_after[0]) - rho * stored(0);
  const double budget = o.gpu_fraction * (double)free0;
  int L = 0;
  double weights = fixed;
  for (int l = 0; l < max_layers; ++l) {
    const double w = weights + rho * stored(l);
    const V4Config cl = parse_v4_config(v4_slice_config(full_cfg, l + 1));
    if (w + (double)runtime_reserve(cl, o, chunk) > budget) break;
    weights = w;
    L = l + 1;
  }
  plan.info = {{"free_bytes_before_load", free0},
               {"probe_layers", probe_layers},
               {"probe_free_bytes_after_layer", free_after},
               {"device_bytes_per_stored_byte", rho},
               {"fixed_device_bytes", fixed},
               {"predicted_weight_device_bytes", weights},
               {"budget_bytes", budget}};
  if (!probe_error.empty()) plan.info["probe_error"] = probe_error;
  plan.layers = std::max(L, 1);
  if (L == 0) plan.info["warning"] = "not even one layer fits next to the largest case's cache; running 1";
  if (model && plan.layers == probe_layers) {
    plan.model = std::move(model);
    plan.ckpt = std::move(ckpt);
  }
  return plan;
}

// transformers' results (bench/hf_slice_bench.py), keyed like ours.
std::map<std::string, json> read_hf(const std::string& path) {
  std::map<std::string, json> out;
  if (path.empty()) return out;
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "bench: --hf-json %s: cannot open (no side-by-side columns)\n", path.c_str());
    return out;
  }
  try {
    json j = json::parse(f);
    for (const auto& c : j.at("cases")) {
      const std::string k = c.value("kind", "") + ":" + std::to_string(c.value("batch", 1)) + ":" +
                            std::to_string(c.value("kind", "") == "decode" ? c.value("context", 0) : c.value("prompt", 0));
      out[k] = c;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: --hf-json %s: %s\n", path.c_str(), e.what());
  }
  return out;
}

void print_table(const std::vector<json>& cases, const std::map<std::string, json>& hf) {
  std::printf("\n| case | batch | ctx/prompt | steps | ms/step | tok/s | tok/s/user | GB/step | HBM floor ms | %% HBM "
              "| GFLOP/step | %% fp8 |%s\n",
              hf.empty() ? "" : " HF tok/s | speedup |");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", hf.empty() ? "" : "---|---|");
  for (const auto& c : cases) {
    const std::string kind = c["kind"];
    const int64_t len = kind == "decode" ? c["context"].get<int64_t>() : c["prompt"].get<int64_t>();
    std::printf("| %s | %lld | %lld |", kind.c_str(), (long long)c["batch"].get<int64_t>(), (long long)len);
    if (!c["error"].is_null()) {
      std::printf(" error: %s |\n", c["error"].get<std::string>().c_str());
      continue;
    }
    std::printf(" %lld%s | %.2f | %.1f | %.2f | %.4g | %.4g | %.2f | %.4g | %.3f |", (long long)c["steps"].get<int64_t>(),
                c["partial"].get<bool>() ? " (capped)" : "", c["ms_per_step"].get<double>(),
                c["tokens_per_s"].get<double>(), c["per_user_tokens_per_s"].get<double>(),
                c["bytes"].get<double>() / 1e9, c["hbm_floor_ms"].get<double>(), c["pct_hbm"].get<double>(),
                c["flops"].get<double>() / 1e9, c["pct_fp8"].get<double>());
    if (!hf.empty()) {
      auto it = hf.find(kind + ":" + std::to_string(c["batch"].get<int64_t>()) + ":" + std::to_string(len));
      if (it == hf.end()) std::printf(" – | – |");
      else if (!it->second.contains("tokens_per_s") || it->second["tokens_per_s"].is_null())
        std::printf(" %s | – |", it->second.value("error", std::string("no result")).substr(0, 40).c_str());
      else
        std::printf(" %.1f | %.2fx |", it->second["tokens_per_s"].get<double>(),
                    c["tokens_per_s"].get<double>() / it->second["tokens_per_s"].get<double>());
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Where a decode step's time goes, kernel by kernel (--kernel-trace).
void print_kernel_traces(const std::vector<json>& cases) {
  for (const auto& c : cases) {
    if (!c.contains("kernel_trace")) continue;
    const json& t = c["kernel_trace"];
    const double span = t["span_ms_per_step"].get<double>();
    std::printf("\nkernel trace decode batch %lld: %.3f ms/step timed (untraced steps), traced span %.3f ms/step, idle "
                "%.3f ms, %.0f kernels/step\n",
                (long long)c["batch"].get<int64_t>(), c["ms_per_step"].get<double>(), span,
                t["idle_ms_per_step"].get<double>(), t["kernels_per_step"].get<double>());
    std::printf("  %-44s %6s %10s %6s %10s %10s %10s\n", "kernel (by its share of the step)", "calls", "marginal",
                "%", "duration", "idle bef.", "early");
    int shown = 0;
    for (const auto& k : t["kernels"]) {
      if (shown++ == 30) break;
      const double m = k["marginal_us_per_step"].get<double>();
      std::printf("  %-44.44s %6.1f %8.1f us %5.1f%% %8.1f us %8.1f us %8.1f us\n", k["kernel"].get<std::string>().c_str(),
                  k["calls_per_step"].get<double>(), m, 100.0 * m / 1e3 / std::max(1e-9, span),
                  k["us_per_step"].get<double>(), k["idle_before_us_per_step"].get<double>(),
                  k["early_us_per_step"].get<double>());
    }
  }
  std::fflush(stdout);
}

// Where the device time of each case goes (--profile).
void print_profiles(const std::vector<json>& cases) {
  for (const auto& c : cases) {
    if (!c.contains("profile")) continue;
    const json& p = c["profile"];
    const std::string kind = c["kind"];
    std::printf("\nprofile %s batch %lld: %.3f ms/step timed, device busy %.3f ms, gaps %.3f ms (profiled), "
                "idle est. %.3f ms, %.0f calls/step%s\n",
                kind.c_str(), (long long)c["batch"].get<int64_t>(), c["ms_per_step"].get<double>(),
                p["busy_ms_per_step"].get<double>(), p["gap_ms_per_step"].get<double>(),
                p["idle_est_ms_per_step"].get<double>(), p["calls_per_step"].get<double>(),
                p.value("graph_steps", 0) > 0 ? " (from CUDA graphs, timed inside)" : "");
    if (p.value("graph_steps", 0) > 1)
      std::printf("  GPU idle between steps (end of one step's graph to the start of the next): %.1f us\n",
                  p.value("idle_between_graphs_us", 0.0));
    int shown = 0;
    for (const auto& op : p["ops"]) {
      if (shown++ == 16) break;
      std::printf("  %-18s %8.1f us/step %6.1f calls/step %8.1f us idle before %5.1f %%\n",
                  op["op"].get<std::string>().c_str(), op["us_per_step"].get<double>(), op["calls_per_step"].get<double>(),
                  op.value("gap_before_us_per_step", 0.0),
                  100.0 * op["us_per_step"].get<double>() / 1e3 / std::max(1e-9, p["busy_ms_per_step"].get<double>()));
    }
  }
  std::fflush(stdout);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return false;
    if (a == "--cost-only") {
      o.cost_only = true;
      continue;
    }
    if (i + 1 >= argc) throw Error(a + ": missing value");
    std::string v = argv[++i];
    if (a == "--backend") o.backend = v;
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--config") o.config = v;
    else if (a == "--layers") o.layers = (int)flag_int(a, v);
    else if (a == "--batch") o.batches = int_list(a, v);
    else if (a == "--context") o.context = flag_int(a, v);
    else if (a == "--prefill") o.prefills = int_list(a, v);
    else if (a == "--steps") o.steps = flag_int(a, v);
    else if (a == "--warmup") o.warmup = flag_int(a, v);
    else if (a == "--chunk") o.chunk = flag_int(a, v);
    else if (a == "--case-seconds") o.case_seconds = flag_double(a, v);
    else if (a == "--gpu-memory-fraction") o.gpu_fraction = flag_double(a, v);
    else if (a == "--seed") o.seed = flag_int(a, v);
    else if (a == "--profile") o.profile_steps = std::max<int64_t>(0, flag_int(a, v));
    else if (a == "--kernel-trace") o.trace_steps = std::max<int64_t>(0, flag_int(a, v));
    else if (a == "--overlap") o.overlap = flag_int(a, v) != 0;
    else if (a == "--logits") o.read_logits = flag_int(a, v) != 0;
    else if (a == "--feed") o.feed = flag_int(a, v) != 0;
    else if (a == "--temperature") o.temperature = (float)flag_double(a, v);
    else if (a == "--top-p") o.top_p = (float)flag_double(a, v);
    else if (a == "--threads") o.threads = flag_int(a, v);
    else if (a == "--device-name") o.device_name = v;
    else if (a == "--json") o.json_out = v;
    else if (a == "--hf-json") o.hf_json = v;
    else throw Error("unknown option '" + a + "'");
  }
  if (o.layers < 0) throw Error("--layers must be >= 1");
  if (o.context < 0 || o.steps < 1 || o.warmup < 0) throw Error("--context must be >= 0, --steps >= 1, --warmup >= 0");
  if (o.chunk < 0) throw Error("--chunk must be >= 1");
  if (!(o.gpu_fraction > 0 && o.gpu_fraction <= 1)) throw Error("--gpu-memory-fraction must be in (0, 1]");
  if (!(o.temperature >= 0 && o.temperature <= 100) || !(o.top_p > 0 && o.top_p <= 1))
    throw Error("--temperature must be in [0, 100], --top-p in (0, 1]");
  return true;
}

json load_config(const std::string& which) {
  if (which == "flash") return v4_flash_config_json();
  if (which == "tiny") return v4_tiny_config_json();
  const std::string path = (std::filesystem::path(which) / "config.json").string();
  std::ifstream f(path);
  if (!f) throw Error("--config: '" + which + "' is neither flash, tiny nor a directory with a config.json");
  try {
    return json::parse(f);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Options o;
  try {
    if (!parse(argc, argv, o)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const std::string backend_name = resolve_backend(o.backend);
    std::unique_ptr<Backend> be = make_backend(backend_name, (int)o.threads, o.dtype);
    const bool device = be->free_memory() >= 0;
    if (o.trace_steps > 0) {  // before any graph is recorded
      std::string why;
      if (!be->kernel_trace_start(&why)) {
        std::fprintf(stderr, "bench: --kernel-trace: %s (no kernel timeline)\n", why.c_str());
        o.trace_steps = 0;
      }
    }
    const int threads = o.threads > 0 ? (int)o.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    const json full_cfg = load_config(o.config);
    parse_v4_config(full_cfg);  // a clear error for a bad config before anything is built
    const int max_layers = full_cfg.value("num_hidden_layers", 1);
    const int64_t chunk = o.chunk > 0 ? o.chunk : EngineConfig{}.max_batched_tokens;
    if (o.layers > max_layers)
      throw Error("--layers " + std::to_string(o.layers) + ": the config has " + std::to_string(max_layers));

    if (o.cost_only) {  // the cost model alone: first timed step of each decode case, whole prompts
      const int L = o.layers > 0 ? o.layers : max_layers;
      const V4Config c = parse_v4_config(v4_slice_config(full_cfg, L));
      const CostModel cm(c);
      std::printf("cost model: %s, %d layers, stored weights %.3f GB\n", o.config.c_str(), L, cm.weight_bytes() / 1e9);
      std::printf("| case | batch | ctx/prompt | GB/step (weights + experts + cache) | E_hit | HBM floor ms | GFLOP/step | fp8 floor ms |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      for (int64_t B : o.batches) {
        auto k = cm.step(std::vector<CostModel::Chunk>(B, CostModel::Chunk{o.context + o.warmup, 1}), B);
        std::printf("| decode | %lld | %lld | %.3f (%.3f + %.3f + %.3f) | %.1f | %.3f | %.1f | %.4f |\n", (long long)B,
                    (long long)o.context, k.bytes() / 1e9, k.bytes_weights / 1e9, k.bytes_experts / 1e9,
                    k.bytes_cache / 1e9, cm.experts_hit((double)B), 1e3 * k.bytes() / kHbmBytesPerS, k.flops / 1e9,
                    1e3 * k.flops / kFp8FlopsPerS);
      }
      for (int64_t P : o.prefills) {
        CostModel::Cost t;
        int64_t steps = 0;
        for (int64_t done = 0; done < P; done += chunk, ++steps) {
          auto k = cm.step({CostModel::Chunk{done, std::min(chunk, P - done)}}, 1);
          t.bytes_weights += k.bytes_weights;
          t.bytes_experts += k.bytes_experts;
          t.bytes_cache += k.bytes_cache;
          t.flops += k.flops;
        }
        std::printf("| prefill (%lld chunks of %lld) | 1 | %lld | %.3f (%.3f + %.3f + %.3f) | %.1f | %.3f | %.1f | %.4f |\n",
                    (long long)steps, (long long)chunk, (long long)P, t.bytes() / 1e9 / steps,
                    t.bytes_weights / 1e9 / steps, t.bytes_experts / 1e9 / steps, t.bytes_cache / 1e9 / steps,
                    cm.experts_hit((double)std::min(chunk, P)), 1e3 * t.bytes() / steps / kHbmBytesPerS,
                    t.flops / 1e9 / steps, 1e3 * t.flops / steps / kFp8FlopsPerS);
      }
      return 0;
    }
    json out{{"tool", "deepinfer bench"},
             {"config_name", o.config},
             {"backend", backend_name},
             {"dtype", o.dtype},
             {"device", o.device_name.empty() ? device_description(backend_name, threads) : o.device_name},
             {"ceilings", {{"hbm_bytes_per_s", kHbmBytesPerS}, {"fp8_flops_per_s", kFp8FlopsPerS}}},
             {"context", o.context},
             {"steps", o.steps},
             {"warmup", o.warmup},
             {"overlap", o.overlap},
             {"read_logits", o.read_logits},
             {"feed", o.feed && o.overlap && !o.read_logits},
             {"temperature", o.temperature},
             {"top_p", o.top_p},
             {"prefill_chunk", chunk},
             {"seed", o.seed}};
    // How many layers.
    MemoryPlan plan;
    std::string layers_source;
    if (o.layers > 0) {
      plan.layers = o.layers;
      layers_source = "--layers";
    } else if (device) {
      plan = plan_layers(full_cfg, *be, o, chunk);
      layers_source = "fits in device memory";
      out["memory_plan"] = plan.info;
    } else {
      plan.layers = o.config == "flash" ? 1 : max_layers;
      layers_source = "cpu default";
    }
    const json cfg = v4_slice_config(full_cfg, plan.layers);
    const V4Config c = parse_v4_config(cfg);
    out["config"] = cfg;
    out["layers"] = plan.layers;
    out["layers_source"] = layers_source;
    std::fprintf(stderr, "bench: %s, %d of %d layers (%s), backend %s, device %s\n", o.config.c_str(), plan.layers,
                 max_layers, layers_source.c_str(), backend_name.c_str(), out["device"].get<std::string>().c_str());

    // Load (or keep the probe when it is the slice).
    std::unique_ptr<Checkpoint> ckpt = std::move(plan.ckpt);
    std::unique_ptr<DeepseekV4Model> model = std::move(plan.model);
    double gen_s = 0, load_s = 0;
    if (!model) {
      auto t0 = Clock::now();
      ckpt = make_synthetic_v4_checkpoint(cfg, (uint64_t)o.seed);
      gen_s = seconds_since(t0);
      t0 = Clock::now();
      model = std::make_unique<DeepseekV4Model>(c, *ckpt, *be, [&](int done, int total) {
        if (device) std::fprintf(stderr, "\rbench: loading layer %d/%d", done, total);
        if (device && done == total) std::fprintf(stderr, "\n");
      });
      be->synchronize();
      load_s = seconds_since(t0);
    }
    const auto unused = ckpt->unused();
    if (!unused.empty()) std::fprintf(stderr, "bench: warning: %zu tensors unused, e.g. %s\n", unused.size(), unused[0].c_str());
    const CostModel cm(c);
    out["generate_seconds"] = gen_s;
    out["load_seconds"] = load_s;
    out["stored_weight_bytes"] = cm.weight_bytes();
    if (device) out["free_bytes_after_load"] = be->free_memory();
    std::fprintf(stderr, "bench: weights %.2f GB as published (random), generated in %.1f s, loaded in %.1f s\n",
                 cm.weight_bytes() / 1e9, gen_s, load_s);

    std::mt19937_64 g((uint64_t)o.seed);
    std::vector<json> cases;
    auto save = [&] {  // after every case, so that a run cut short by a timeout keeps what it measured
      if (o.json_out.empty()) return;
      out["cases"] = cases;
      std::ofstream f(o.json_out);
      f << out.dump(2) << "\n";
      if (!f) throw Error(o.json_out + ": cannot write");
    };
    save();
    auto run_case = [&](const char* kind, int64_t batch, int64_t len, auto fn) {
      CaseResult r;
      const auto t0 = Clock::now();
      try {
        r = fn();
      } catch (const std::bad_alloc&) {
        r.error = "out of host memory";
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      if (!r.error.empty()) {
        r.kind = kind;
        r.batch = batch;
        (r.kind == "decode" ? r.context : r.prompt) = len;
        r.steps = 0;
      }
      json j = r.to_json();
      std::fprintf(stderr, "bench: %s batch %lld len %lld: %s (%.1f s)\n", kind, (long long)batch, (long long)len,
                   j["error"].is_null() ? (std::to_string(j["tokens_per_s"].get<double>()) + " tok/s").c_str()
                                        : j["error"].get<std::string>().c_str(),
                   seconds_since(t0));
      cases.push_back(j);
      save();
    };
    for (int64_t B : o.batches)
      run_case("decode", B, o.context, [&] { return run_decode(*model, *be, cm, o, B, g); });
    for (int64_t P : o.prefills)
      run_case("prefill", 1, P, [&] { return run_prefill(*model, *be, cm, o, P, chunk, g); });
    out["cases"] = cases;

    const auto hf = read_hf(o.hf_json);
    if (!hf.empty()) {
      std::ifstream f(o.hf_json);
      try {
        out["transformers"] = json::parse(f);
      } catch (...) {
      }
    }
    std::printf("deepinfer bench: %s slice, %d layers, backend %s on %s\n", o.config.c_str(), plan.layers,
                backend_name.c_str(), out["device"].get<std::string>().c_str());
    std::printf("ceilings: HBM %.2f TB/s, fp8 %.0f TFLOP/s; bytes and FLOPs per step as in docs/bench.md\n",
                kHbmBytesPerS / 1e12, kFp8FlopsPerS / 1e12);
    print_table(cases, hf);
    print_profiles(cases);
    print_kernel_traces(cases);
    save();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer bench: %s\n", e.what());
    return 1;
  }
}

}  // namespace deepinfer::cli
