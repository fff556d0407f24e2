#pragma once
// Shared by the reference-parity tests (V4 and V4.1 on the CPU, V4 on the GPU): reading a fixture's
// ref.safetensors (ids_k I64 [T_k], logits_k F32 [T_k, V], as the fixture scripts write them) and
// comparing logits the way the fixture READMEs state the tolerances.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "util/error.h"

namespace deepinfer::testref {

struct RefSeq {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [T, V]
};

// Fixture directories (each with ref.safetensors and model/) under `root`, sorted; the environment
// variable `env`, when set, points at regenerated fixtures elsewhere.
inline std::vector<std::string> fixture_dirs(const std::filesystem::path& root_default, const char* env) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  const char* e = env ? std::getenv(env) : nullptr;
  fs::path root = e ? fs::path(e) : root_default;
  if (fs::exists(root))
    for (auto& d : fs::directory_iterator(root))
      if (fs::exists(d.path() / "ref.safetensors") && fs::exists(d.path() / "model")) out.push_back(d.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<RefSeq> read_refs(const std::string& dir) {
  auto f = SafetensorsFile::open(dir + "/ref.safetensors");
  std::vector<RefSeq> seqs;
  for (int k = 0;; ++k) {
    const TensorView* ids = f->find("ids_" + std::to_string(k));
    const TensorView* lg = f->find("logits_" + std::to_string(k));
    if (!ids || !lg) break;
    if (ids->dtype != DType::I64 || lg->dtype != DType::F32)
      throw Error(dir + "/ref.safetensors: ids_k must be I64 and logits_k F32");
    RefSeq s;
    for (int64_t i = 0; i < ids->numel(); ++i) {
      int64_t v;
      std::memcpy(&v, ids->data + 8 * i, 8);
      s.ids.push_back((int32_t)v);
    }
    s.logits.resize(lg->numel());
    std::memcpy(s.logits.data(), lg->data, lg->nbytes);
    seqs.push_back(std::move(s));
  }
  return seqs;
}

struct ErrStats {
  double median, max, argmax_agree, max_abs;  // per-position relative L2: median and max
};
// out, ref: [T, V].
inline ErrStats compare(const std::vector<float>& out, const std::vector<float>& ref, int64_t V) {
  const int64_t T = (int64_t)ref.size() / V;
  std::vector<double> rel(T);
  int64_t agree = 0;
  double max_abs = 0;
  for (int64_t t = 0; t < T; ++t) {
    double num = 0, den = 0;
    for (int64_t v = 0; v < V; ++v) {
      double d = (double)out[t * V + v] - ref[t * V + v];
      max_abs = std::max(max_abs, std::fabs(d));
      num += d * d;
      den += (double)ref[t * V + v] * ref[t * V + v];
    }
    rel[t] = std::sqrt(num / std::max(den, 1e-30));
    auto a = std::max_element(out.begin() + t * V, out.begin() + (t + 1) * V) - (out.begin() + t * V);
    auto b = std::max_element(ref.begin() + t * V, ref.begin() + (t + 1) * V) - (ref.begin() + t * V);
    agree += a == b;
  }
  std::vector<double> sorted = rel;
  std::sort(sorted.begin(), sorted.end());
  return {sorted[T / 2], sorted.back(), (double)agree / T, max_abs};
}

}  // namespace deepinfer::testref
