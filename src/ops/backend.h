#pragma once
// The op set the DeepSeek-V4 forward pass is written in. Every op takes plain parameters (raw
// pointers, sizes, strides) so that a CUDA backend implements the same table with device pointers;
// the CPU backend (ops/cpu) is the correctness oracle for it. All tensors are float32, row-major;
// shapes are given next to each parameter.
//
// Batch invariance: every op computes a row from that row's inputs with a reduction order that does
// not depend on how many other rows are in the call, so a sequence gives bitwise the same result
// alone or inside any batch.
#include <cstdint>
#include <memory>

namespace deepinfer {

// A weight matrix W[N, K] (row-major [out, in]) in the backend's own layout: repacked for the CPU
// kernel, resident in device memory (and possibly bf16/fp8) for CUDA.
class Weight {
 public:
  virtual ~Weight() = default;
  int64_t N = 0, K = 0;
};
using WeightPtr = std::unique_ptr<Weight>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Takes a float32 W[N, K] into the backend's layout (the caller may free w afterwards).
  virtual WeightPtr make_weight(const float* w, int64_t N, int64_t K) = 0;
  // y[M, N] (row stride ldy) = x[M, K] (row stride ldx) · Wᵀ. y may not alias x.
  virtual void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy) = 0;

  // y[M, D] = x / sqrt(mean(x²) + eps) (* w[D] if w). In place allowed (y == x).
  virtual void rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps,
                        float* y) = 0;

  // Interleaved (GPT-J) RoPE on the trailing `rope_dim` channels of each of `heads` vectors of width
  // `head_dim` per row: x[M, heads, head_dim] with row stride ld. pos[M] absolute positions,
  // inv_freq[rope_dim / 2]. inverse = rotate by −angle (used on the attention output).
  virtual void rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim,
                    const int32_t* pos, const float* inv_freq, bool inverse) = 0;

  // Manifold-constrained hyper-connection, pre side. X[M, hc, D]; fn[(2+hc)·hc, hc·D]; base[(2+hc)·hc];
  // scale[3]. Outputs u[M, D] = Σ_j pre_j X_j, post[M, hc], comb[M, hc, hc] (Sinkhorn-projected).
  virtual void hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                      const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u,
                      float* post, float* comb) = 0;
  // Single-pass mHC (DeepSeek-V4.1): one read of X[M, hc, D] both collapses it with weights that
  // are already known, u[M, D] = Σ_j w[m, j]·X_j (w[M, hc]: the previous site's pre), and computes
  // this site's coefficients pre[M, hc], post[M, hc], comb[M, hc, hc] exactly as hc_pre does.
  // fn == nullptr: collapse only (pre/post/comb untouched). u may not alias X.
  virtual void hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn,
                      const float* base, const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps,
                      float* u, float* pre, float* post, float* comb) = 0;
  // X'[m, k] = post[m, k]·y[m] + Σ_j comb[m, j, k]·X[m, j]. out may not alias X.
  virtual void hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M,
                       int hc, int64_t D, float* out) = 0;
  // Final head reduction: u[M, D] = Σ_j (sigmoid(scale·μ_j + base_j) + eps)·X_j, μ = rms·(fn · vec X).
  virtual void hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, float hc_eps, float norm_eps, float* u) = 0;

  // Attention with a per-head sink logit over a per-query key set drawn from two pools of
  // d-wide rows (K = V): a contiguous range [win_lo[m], win_hi[m]) of `win` and the rows
  // `ent_idx[ent_off[m] .. ent_off[m+1])` of `ent`. q[M, H, d] (row stride ldq); out[M, H, d].
  // p = exp(s) / (Σ exp(s) + exp(sink_h)), s = scale · q·k.
  virtual void sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                              const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                              const int32_t* ent_idx, const int64_t* ent_off, const float* sinks,
                              float scale, float* out, int64_t ldo) = 0;

  // Lightning-indexer scores: score[m, w] = Σ_h γ[m, h] · ReLU(qI[m, h]·K[key_rows[w]]) · qk_scale
  // for w < n_vis[m] (others −inf). qI[M, hI, dI]; K: rows of dI floats; key_rows[n_keys];
  // γ[M, hI]; score[M, n_keys].
  virtual void indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI,
                              const float* K, const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis,
                              float qk_scale, float* score) = 0;

  // Softmax-gated pooling of compressor slots: out[W, d] with
  // out[w, c] = Σ_s softmax_s(gate[w, s, c]) · kv[w, s, c]; kv/gate [W, S, d]; gate −inf = absent slot.
  virtual void compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) = 0;

  // Clamped SwiGLU: gu[M, 2I] = [gate | up] → act[M, I] = silu(min(gate, lim)) · clamp(up, −lim, lim)
  // (* row_scale[m] if row_scale).
  virtual void swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                            float* act) = 0;
};

}  // namespace deepinfer
