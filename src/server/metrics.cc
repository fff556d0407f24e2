#include "server/metrics.h"

#include <cstdio>

namespace deepinfer::server {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  header(out, name, "gauge", help);
  out += name + " " + num(v) + "\n";
}

void counter(std::string& out, const std::string& name, const std::string& help, double v) {
  header(out, name, "counter", help);
  out += name + " " + num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

// Buckets as vLLM's (seconds).
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0}) {}

void Metrics::on_http_response(int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++http_[status];
}

void Metrics::on_request_finished(const std::string& reason, int64_t prompt_tokens, int64_t generation_tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finished_[reason];
  prompt_tokens_ += (uint64_t)prompt_tokens;
  generation_tokens_ += (uint64_t)generation_tokens;
}

void Metrics::on_rejected() {
  std::lock_guard<std::mutex> lk(mu_);
  ++rejected_;
}

void Metrics::observe_latency(double ttft_s, double tpot_s, bool has_tpot, double e2e_s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (has_tpot) tpot_.observe(tpot_s);
  e2e_.observe(e2e_s);
}

std::string Metrics::render(const EngineStats& s, int64_t in_server, bool draining) const {
  std::string out;
  out.reserve(8192);
  gauge(out, "deepinfer_num_requests_running", "Sequences in the engine's running batch.", (double)s.running);
  gauge(out, "deepinfer_num_requests_waiting", "Sequences queued in the engine (queue length).", (double)s.waiting);
  gauge(out, "deepinfer_server_sequences", "Sequences admitted by the HTTP server and not finished yet.",
        (double)in_server);
  gauge(out, "deepinfer_cache_pages_used", "Paged-cache pages in use.", (double)s.cache_pages_used);
  gauge(out, "deepinfer_cache_pages_total", "Paged-cache pages in the pool.", (double)s.cache_pages_total);
  gauge(out, "deepinfer_cache_slots_used", "Per-sequence cache state slots in use.", (double)s.cache_slots_used);
  gauge(out, "deepinfer_cache_slots_total", "Per-sequence cache state slots in the pool.", (double)s.cache_slots_total);
  gauge(out, "deepinfer_cache_usage_perc", "Fraction of cache pages in use (0..1).",
        s.cache_pages_total ? (double)s.cache_pages_used / (double)s.cache_pages_total : 0.0);
  gauge(out, "deepinfer_draining", "1 while the server drains for shutdown.", draining ? 1.0 : 0.0);
  counter(out, "deepinfer_engine_steps_total", "Engine steps run.", (double)s.steps);
  counter(out, "deepinfer_num_preemptions_total", "Sequences preempted (recomputed later).", (double)s.preemptions);
  counter(out, "deepinfer_device_sampled_tokens_total", "Generated tokens picked on the backend (only ids crossed).",
          (double)s.device_sampled_tokens);
  counter(out, "deepinfer_fed_steps_total",
          "Decode steps launched before the previous one was read (tokens taken from its picks on the device).",
          (double)s.fed_steps);
  std::lock_guard<std::mutex> lk(mu_);
  counter(out, "deepinfer_prompt_tokens_total", "Prompt tokens of finished requests.", (double)prompt_tokens_);
  counter(out, "deepinfer_generation_tokens_total", "Generated tokens of finished requests.",
          (double)generation_tokens_);
  counter(out, "deepinfer_admission_rejections_total", "Requests refused because the queue was full or draining.",
          (double)rejected_);
  header(out, "deepinfer_request_success_total", "counter", "Finished generation sequences by finish reason.");
  for (const char* r : {"stop", "length", "abort", "error"}) {
    auto it = finished_.find(r);
    out += std::string("deepinfer_request_success_total{finished_reason=\"") + r + "\"} " +
           std::to_string(it == finished_.end() ? 0 : it->second) + "\n";
  }
  header(out, "deepinfer_http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http_)
    out += "deepinfer_http_requests_total{status=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
  ttft_.render(out, "deepinfer_time_to_first_token_seconds", "Time from arrival to the first generated token.");
  tpot_.render(out, "deepinfer_time_per_output_token_seconds",
               "Per request: (last token time - first token time) / (output tokens - 1).");
  e2e_.render(out, "deepinfer_e2e_request_latency_seconds", "Time from arrival to the last token.");
  return out;
}

}  // namespace deepinfer::server
