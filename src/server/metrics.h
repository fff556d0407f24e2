#pragma once
// Prometheus text-format metrics of the HTTP server (counters, latency histograms) plus the
// engine's gauges (running / waiting requests, cache usage) at scrape time.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Thread-safe: HTTP worker threads record, /metrics renders.
class Metrics {
 public:
  Metrics();
  void on_http_response(int status);
  void on_request_finished(const std::string& finish_reason, int64_t prompt_tokens, int64_t generation_tokens);
  void on_rejected();  // admission refused (queue full / draining)
  // Per request: time to first token, mean time per output token after the first, end to end.
  void observe_latency(double ttft_s, double tpot_s, bool has_tpot, double e2e_s);
  std::string render(const EngineStats& s, int64_t sequences_in_server, bool draining) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> http_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, rejected_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace deepinfer::server
