#pragma once
// DeepSeek-V4.1 fixtures: QAT rounding flips (tests/fixtures/v41/README.md, "Tolerances, and
// the fragility"). A fixture's report.json lists every QAT rounding whose float64 input lies within
// 1e-5 (relative) of its rounding midpoint ("fragile") and what flipping it alone does to the
// reference's logits. A float32 engine that sums in another order (the GPU) can round such a value
// the other way; one flipped code then moves the logits by up to ~0.5 relative from that position
// on, far outside the parity bounds. These helpers reproduce a listed flip on the CPU (test-only
// hook, model/v41_debug.h) and explain a difference between another backend's logits and the
// CPU's as a set of listed flips, so that the parity check can compare against the CPU with the
// same flips (and still fails on anything else). Shared by test_model_v41_reference (CPU) and
// test_model_cuda.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/v41_debug.h"
#include "util/json.h"

namespace deepinfer::testref {

struct V41Nudge {
  int layer = -1;
  std::string site;      // "sliding kv", "index q", "index keys", "compressed kv"
  int64_t row = 0, col = 0;
  double factor = 1;     // the QAT input is multiplied by this
};

inline std::vector<V41Nudge>& v41_active_nudges() {
  static std::vector<V41Nudge> n;
  return n;
}

inline void v41_nudge_hook(int layer, const char* site, float* x, int64_t rows, int64_t cols) {
  for (const auto& n : v41_active_nudges())
    if (n.layer == layer && n.site == site && n.row < rows && n.col < cols)
      x[n.row * cols + n.col] = (float)((double)x[n.row * cols + n.col] * n.factor);  // host memory: CPU
}

// Full-forward logits of ids on a CPU-backend model with the nudges applied (none: plain).
inline std::vector<float> v41_logits_nudged(LoadedModel& m, const std::vector<int32_t>& ids,
                                            const std::vector<V41Nudge>& nudges) {
  const int64_t T = (int64_t)ids.size();
  v41_active_nudges() = nudges;
  g_v41_qat_hook = nudges.empty() ? nullptr : v41_nudge_hook;
  std::vector<float> out;
  try {
    out = sequence_logits(m, ids, T, T);
  } catch (...) {
    g_v41_qat_hook = nullptr;
    v41_active_nudges().clear();
    throw;
  }
  g_v41_qat_hook = nullptr;
  v41_active_nudges().clear();
  return out;
}

// Per-position relative L2 of out against ref ([T, V]); the measure of compare().
inline std::vector<double> v41_rel_per_position(const std::vector<float>& out, const std::vector<float>& ref,
                                                int64_t V) {
  const int64_t T = (int64_t)ref.size() / V;
  std::vector<double> rel(T);
  for (int64_t t = 0; t < T; ++t) {
    double num = 0, den = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = (double)out[t * V + v] - ref[t * V + v];
      num += d * d;
      den += (double)ref[t * V + v] * ref[t * V + v];
    }
    rel[t] = std::sqrt(num / std::max(den, 1e-30));
  }
  return rel;
}

inline int64_t v41_first_above(const std::vector<double>& rel, double thr) {
  for (size_t t = 0; t < rel.size(); ++t)
    if (rel[t] > thr) return (int64_t)t;
  return -1;
}

// The nudge of a report.json "fragile" entry that makes the CPU round it the other way: the
// smallest multiple (2.5, 10, 40, 160; below half a quantum) of its relative margin, in the
// direction that changes the logits (the other direction moves away from the midpoint and changes
// nothing). With `extra`
// nudges already applied (base = the logits with those). Empty `out` if no nudge changes anything
// (an index-q / index-key flip that leaves every top-k choice alone). Sites without a hook
// (compressed scales, top-k and block boundaries) return false.
inline bool v41_flip_entry(LoadedModel& m, const std::vector<int32_t>& ids, const nlohmann::json& f,
                           const std::vector<V41Nudge>& extra, const std::vector<float>& base, V41Nudge& nudge,
                           std::vector<float>& out) {
  out.clear();
  if (!f.contains("row") || !f.contains("channel") || f["kind"] == "compressed_scale_e4m3") return false;
  const std::string site = f["site"];
  if (site != "sliding kv" && site != "index q" && site != "index keys" && site != "compressed kv") return false;
  const double margin = f["relative_margin"];
  const double quanta = f.value("margin_quanta", 0.0);  // the margin in quanta of the grid
  for (double mult : {2.5, 10.0, 40.0, 160.0}) {
    if (mult * quanta >= 0.5) break;  // would reach past the next midpoint
    for (double sign : {1.0, -1.0}) {
      nudge = {f["layer"].get<int>(), site, f["row"].get<int64_t>(), f["channel"].get<int64_t>(),
               1 + sign * mult * margin};
      auto all = extra;
      all.push_back(nudge);
      auto o = v41_logits_nudged(m, ids, all);
      if (o.size() == base.size() && std::memcmp(o.data(), base.data(), o.size() * sizeof(float)) != 0) {
        out = std::move(o);
        return true;
      }
    }
  }
  return true;
}

struct V41Explanation {
  std::vector<std::string> flips;  // "sliding kv layer 2 pos 67 ch 10 (margin 3.3e-06)", in order applied
  std::vector<V41Nudge> nudges;
  std::vector<float> cpu;          // the CPU's logits with those flips
  int64_t unexplained_from = -1;   // first position > 1e-4 left (-1: none)
};

// Explains `out` (another backend's full-forward logits of sequence `seq`, [T, V]) against the CPU
// model `m` as listed flips: while some position differs by more than `thr` (relative L2), take
// the first such position p, try every fragile entry of this sequence that the reference records
// as acting from p (or that sits at p), flip it on the CPU, and keep the one that moves the first
// difference furthest (past p; all of them if it disappears). At most max_flips.
inline V41Explanation v41_explain(LoadedModel& m, const nlohmann::json& report, size_t seq,
                                  const std::vector<int32_t>& ids, const std::vector<float>& out,
                                  const std::vector<float>& cpu_plain, int max_flips = 4, double thr = 1e-4) {
  const int64_t V = m.vocab_size();
  V41Explanation ex;
  ex.cpu = cpu_plain;
  if (!report.contains("fragile")) {
    ex.unexplained_from = v41_first_above(v41_rel_per_position(out, ex.cpu, V), thr);
    return ex;
  }
  for (int it = 0;; ++it) {
    const int64_t p = v41_first_above(v41_rel_per_position(out, ex.cpu, V), thr);
    ex.unexplained_from = p;
    if (p < 0 || it >= max_flips) return ex;
    int64_t best_p = p;
    V41Nudge best_n;
    std::vector<float> best_out;
    std::string best_what;
    for (const auto& f : report["fragile"]) {
      if (f["seq"].get<size_t>() != seq) continue;
      const auto& first = f["flip"]["first_pos_above_1e-4"];
      const bool at_p = (!first.is_null() && first.get<int64_t>() == p) || f["pos"].get<int64_t>() == p;
      if (!at_p) continue;
      V41Nudge n;
      std::vector<float> o;
      if (!v41_flip_entry(m, ids, f, ex.nudges, ex.cpu, n, o) || o.empty()) continue;
      int64_t q = v41_first_above(v41_rel_per_position(out, o, V), thr);
      if (q < 0) q = (int64_t)ids.size();
      if (q > best_p) {
        best_p = q;
        best_n = n;
        best_out = std::move(o);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s layer %d pos %lld ch %lld (%s, margin %.3g rel)", n.site.c_str(), n.layer,
                      (long long)f["pos"].get<int64_t>(), (long long)n.col, f["kind"].get<std::string>().c_str(),
                      f["relative_margin"].get<double>());
        best_what = buf;
      }
    }
    if (best_out.empty()) return ex;  // nothing listed explains position p
    ex.nudges.push_back(best_n);
    ex.flips.push_back(best_what);
    ex.cpu = std::move(best_out);
  }
}

}  // namespace deepinfer::testref
