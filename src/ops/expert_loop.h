#pragma once
// The routed-expert FFN as a loop of backend ops: the reference order that CpuBackend::moe_ffn, the CUDA
// backend's float32 path and DeepSeek-V4.1's host-routed MoE share. Tokens are grouped by expert (tokens
// ascending within an expert), one GEMM pair runs per expert over its tokens, and a token adds its experts
// in ascending expert id, whatever the batch.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/backend.h"

namespace deepinfer {

// out[T, D] = Σ_k wsel[t, k] · W2_e · swiglu_clamp(W13_e · h[t], limit), e = sel[t, k] (out overwritten).
// sel / wsel [T, K] in host memory; h [T, D] and out in the backend's memory; w13[e] [2I, D], w2[e] [D, I].
inline void moe_ffn_loop(Backend& be, const float* h, int64_t T, int64_t D, int64_t I,
                         const std::vector<WeightPtr>& w13, const std::vector<WeightPtr>& w2, const int32_t* sel,
                         const float* wsel, int K, float limit, float* out) {
  const int64_t E = (int64_t)w13.size();
  std::vector<int64_t> off(E + 1, 0);  // expert e's grouped rows: [off[e], off[e+1])
  for (int64_t i = 0; i < T * K; ++i) ++off[sel[i] + 1];
  for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
  std::vector<int32_t> rows(T * K);
  std::vector<float> wrows(T * K);
  {
    std::vector<int64_t> fill(off.begin(), off.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t j = fill[sel[t * K + k]]++;
        rows[j] = (int32_t)t;
        wrows[j] = wsel[t * K + k];
      }
  }
  int64_t nmax = 0;
  for (int64_t e = 0; e < E; ++e) nmax = std::max(nmax, off[e + 1] - off[e]);
  // The routed token ids and weights of all experts go to the backend in one upload.
  Buffer<int32_t> rows_d(be, rows);
  Buffer<float> wrows_d(be, wrows);
  Buffer<float> xe(be, nmax * D), gu(be, nmax * 2 * I), act(be, nmax * I), ye(be, nmax * D);
  be.fill(out, T * D, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    be.copy_rows(h, D, rows_d.data() + off[e], xe.data(), D, nullptr, n, D);
    be.linear(xe.data(), n, D, *w13[e], gu.data(), 2 * I);
    be.swiglu_clamp(gu.data(), n, I, limit, nullptr, act.data());
    be.linear(act.data(), n, I, *w2[e], ye.data(), D);
    be.add_rows(ye.data(), n, D, wrows_d.data() + off[e], rows_d.data() + off[e], out);
  }
}

}  // namespace deepinfer
