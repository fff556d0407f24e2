#include "ops/cpu/cpu_backend.h"

#include "ops/cpu/gemm.h"
#include "ops/expert_loop.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <limits>
#include <numeric>
#include <vector>

namespace deepinfer {
namespace {

// Fixed-order dot product (sequential over 8 lanes, then lanes summed in a fixed order): the same
// result for a row whatever else is in the batch.
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Inverse RMS of n values, accumulated in double (cheap, and closer to the float64 references).
inline float inv_rms(const float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  return (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
}

}  // namespace

namespace {
struct CpuWeight final : Weight {
  PackedMatrix packed;     // CpuGemm::Deterministic
  std::vector<float> raw;  // CpuGemm::OpenBLAS: [N, K] as given
};
}  // namespace

CpuBackend::CpuBackend(int threads, CpuGemm gemm) : pool_(threads), gemm_(gemm) {
  // OpenBLAS keeps its own threads; match our count so the two pools do not oversubscribe.
  openblas_set_num_threads(pool_.size());
}

void* CpuBackend::alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = std::aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  return p;
}
void CpuBackend::release(void* p) { std::free(p); }
void CpuBackend::upload(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, (size_t)bytes);
}
void CpuBackend::download(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, (size_t)bytes);
}
void CpuBackend::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memmove(dst, src, (size_t)bytes);
}
void CpuBackend::fill(float* x, int64_t n, float v) { std::fill(x, x + n, v); }
void CpuBackend::scale(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}
void CpuBackend::copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                           const int32_t* dst_rows, int64_t n, int64_t width) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src_rows ? src_rows[i] : i, d = dst_rows ? dst_rows[i] : i;
    if (d < 0) continue;
    std::memcpy(dst + d * ldd, src + s * lds, sizeof(float) * width);
  }
}
void CpuBackend::ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                            int64_t R) {
  for (int64_t i = std::max<int64_t>(0, n - R); i < n; ++i)
    std::memcpy(ring + ((p0 + i) % R) * width, src + i * lds, sizeof(float) * width);
}
void CpuBackend::ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width, ring + ((t0 + i) % R) * width, sizeof(float) * width);
}
void CpuBackend::add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                          float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    float* o = dst + (dst_rows ? (int64_t)dst_rows[i] : i) * width;
    const float* s = src + i * width;
    if (w)
      for (int64_t c = 0; c < width; ++c) o[c] += s[c] * w[i];
    else
      for (int64_t c = 0; c < width; ++c) o[c] += s[c];
  }
}
void CpuBackend::compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                  int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                  const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg) {
  const int64_t cw = (overlap ? 2 : 1) * (int64_t)width, R = overlap ? 2 * m : m;
  const int S = overlap ? 2 * m : m;
  const float ninf = -std::numeric_limits<float>::infinity();
  // Row of position p (in the step's projections when p ≥ p0, else in the ring), from column col.
  int64_t r0 = 0;  // the current window's ring row offset
  auto src = [&](const float* step, const float* ring, int64_t p, int64_t col) {
    return p >= p0 ? step + (p - p0) * ld + col : ring + (r0 + p % R) * cw + col;
  };
  for (int64_t i = 0; i < nw; ++i) {
    const int64_t win = win_ids[i];
    r0 = ring_rows ? ring_rows[i] : 0;
    float* wk = skv + i * S * width;
    float* wg = sg + i * S * width;
    for (int j = 0; j < m; ++j) {
      const float* a = ape ? ape + (int64_t)j * cw : nullptr;
      if (!overlap) {  // HCA: the window's m tokens
        const int64_t p = win * m + j;
        const float *k = src(kv, ring_kv, p, 0), *g = src(gate, ring_gate, p, 0);
        for (int c = 0; c < width; ++c) {
          wk[j * width + c] = k[c];
          wg[j * width + c] = a ? g[c] + a[c] : g[c];
        }
        continue;
      }
      // CSA: slots 0..m-1 = A halves of the previous window (absent for window 0), m..2m-1 = B halves
      // of this one.
      if (win > 0) {
        const int64_t p = (win - 1) * m + j;
        const float *k = src(kv, ring_kv, p, 0), *g = src(gate, ring_gate, p, 0);
        for (int c = 0; c < width; ++c) {
          wk[j * width + c] = k[c];
          wg[j * width + c] = a ? g[c] + a[c] : g[c];
        }
      } else {
        std::fill(wk + j * width, wk + (j + 1) * width, 0.0f);
        std::fill(wg + j * width, wg + (j + 1) * width, ninf);
      }
      const int64_t p = win * m + j;
      const float *k = src(kv, ring_kv, p, width), *g = src(gate, ring_gate, p, width);
      for (int c = 0; c < width; ++c) {
        wk[(m + j) * width + c] = k[c];
        wg[(m + j) * width + c] = a ? g[c] + a[width + c] : g[c];
      }
    }
  }
}

WeightPtr CpuBackend::make_weight(const float* w, int64_t N, int64_t K) {
  auto cw = std::make_unique<CpuWeight>();
  cw->N = N;
  cw->K = K;
  if (gemm_ == CpuGemm::Deterministic) cw->packed = pack_matrix(w, N, K);
  else cw->raw.assign(w, w + N * K);
  return cw;
}

void CpuBackend::linear(const float* x, int64_t M, int64_t ldx, const Weight& wt, float* y, int64_t ldy) {
  const auto& w = static_cast<const CpuWeight&>(wt);
  const int64_t N = w.N, K = w.K;
  if (M <= 0 || N <= 0) return;
  if (gemm_ == CpuGemm::Deterministic) {
    gemm_packed(x, M, ldx, w.packed, y, ldy, &pool_);
    return;
  }
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) std::memset(y + m * ldy, 0, sizeof(float) * N);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x, (int)ldx, w.raw.data(),
              (int)K, 0.0f, y, (int)ldy);
}

void CpuBackend::rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y) {
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * ld;
      float* yr = y + m * ld;
      float r = inv_rms(xr, D, eps);
      if (w)
        for (int64_t i = 0; i < D; ++i) yr[i] = w[i] * (xr[i] * r);
      else
        for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * r;
    }
  }, 16);
}

void CpuBackend::rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
                      const float* inv_freq, bool inverse) {
  const int half = rope_dim / 2;
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    std::vector<float> c(half), s(half);
    for (int64_t m = b; m < e; ++m) {
      for (int i = 0; i < half; ++i) {
        float ang = (float)pos[m] * inv_freq[i];  // float32, as transformers computes the table
        c[i] = std::cos(ang);
        s[i] = inverse ? -std::sin(ang) : std::sin(ang);
      }
      for (int h = 0; h < heads; ++h) {
        float* v = x + m * ld + (int64_t)h * head_dim + (head_dim - rope_dim);
        for (int i = 0; i < half; ++i) {
          float a = v[2 * i], bb = v[2 * i + 1];
          v[2 * i] = a * c[i] - bb * s[i];
          v[2 * i + 1] = bb * c[i] + a * s[i];
        }
      }
    }
  }, 8);
}

namespace {
// mHC coefficients of one row xr[hc·D]: pre[hc], post[hc], comb C[hc, hc] (Sinkhorn-projected).
// mu: scratch of (2+hc)·hc floats. Shared by hc_pre and hc_mix so both give the same bits.
void hc_coeffs(const float* xr, int hc, int64_t D, const float* fn, const float* base, const float* scale,
               int iters, float hc_eps, float norm_eps, float* mu, float* pre, float* post, float* C) {
  const int mix = (2 + hc) * hc;
  const int64_t W = (int64_t)hc * D;
  float r = inv_rms(xr, W, norm_eps);
  for (int k = 0; k < mix; ++k) mu[k] = dot(fn + (int64_t)k * W, xr, (int)W) * r;
  for (int j = 0; j < hc; ++j) {
    pre[j] = sigmoidf(mu[j] * scale[0] + base[j]) + hc_eps;
    post[j] = 2.0f * sigmoidf(mu[hc + j] * scale[1] + base[hc + j]);
  }
  // comb logits, row j = input stream, column k = output stream; softmax over k, then Sinkhorn
  // (column normalisation last).
  for (int j = 0; j < hc; ++j) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int k = 0; k < hc; ++k) {
      float v = mu[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
      C[j * hc + k] = v;
      mx = std::max(mx, v);
    }
    float s = 0;
    for (int k = 0; k < hc; ++k) s += (C[j * hc + k] = std::exp(C[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / s + hc_eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      float s = 0;
      for (int j = 0; j < hc; ++j) s += C[j * hc + k];
      for (int j = 0; j < hc; ++j) C[j * hc + k] /= (s + hc_eps);
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      float s = 0;
      for (int k = 0; k < hc; ++k) s += C[j * hc + k];
      for (int k = 0; k < hc; ++k) C[j * hc + k] /= (s + hc_eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
}

void hc_collapse(const float* xr, int hc, int64_t D, const float* w, float* ur) {
  for (int64_t i = 0; i < D; ++i) {
    float s = 0;
    for (int j = 0; j < hc; ++j) s += w[j] * xr[(int64_t)j * D + i];
    ur[i] = s;
  }
}
}  // namespace

void CpuBackend::hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                        const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                        float* comb) {
  const int64_t W = (int64_t)hc * D;
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    std::vector<float> mu((2 + hc) * hc), pre(hc);
    for (int64_t m = b; m < e; ++m) {
      const float* xr = X + m * W;
      hc_coeffs(xr, hc, D, fn, base, scale, iters, hc_eps, norm_eps, mu.data(), pre.data(), post + m * hc,
                comb + m * hc * hc);
      hc_collapse(xr, hc, D, pre.data(), u + m * D);
    }
  }, 4);
}

void CpuBackend::hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn,
                        const float* base, const float* scale, int iters, float hc_eps, float norm_eps, float* u,
                        float* pre, float* post, float* comb) {
  const int64_t W = (int64_t)hc * D;
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    std::vector<float> mu((2 + hc) * hc);
    for (int64_t m = b; m < e; ++m) {
      const float* xr = X + m * W;
      if (fn)
        hc_coeffs(xr, hc, D, fn, base, scale, iters, hc_eps, norm_eps, mu.data(), pre + m * hc, post + m * hc,
                  comb + m * hc * hc);
      hc_collapse(xr, hc, D, w + m * hc, u + m * D);
    }
  }, 4);
}

void CpuBackend::hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                         int64_t D, float* out) {
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = X + m * hc * D;
      const float* C = comb + m * hc * hc;
      for (int k = 0; k < hc; ++k) {
        float* o = out + (m * hc + k) * D;
        const float pk = post[m * hc + k];
        for (int64_t i = 0; i < D; ++i) {
          float s = pk * y[m * D + i];
          for (int j = 0; j < hc; ++j) s += C[j * hc + k] * xr[(int64_t)j * D + i];
          o[i] = s;
        }
      }
    }
  }, 4);
}

void CpuBackend::hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                         const float* scale, float hc_eps, float norm_eps, float* u) {
  const int64_t W = (int64_t)hc * D;
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    std::vector<float> pre(hc);
    for (int64_t m = b; m < e; ++m) {
      const float* xr = X + m * W;
      float r = inv_rms(xr, W, norm_eps);
      for (int j = 0; j < hc; ++j) pre[j] = sigmoidf(dot(fn + (int64_t)j * W, xr, (int)W) * r * scale[0] + base[j]) + hc_eps;
      for (int64_t i = 0; i < D; ++i) {
        float s = 0;
        for (int j = 0; j < hc; ++j) s += pre[j] * xr[(int64_t)j * D + i];
        u[m * D + i] = s;
      }
    }
  }, 4);
}

void CpuBackend::sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                float* out, int64_t ldo) {
  pool_.parallel_for(M * H, [&](int64_t b, int64_t e) {
    std::vector<float> s;
    for (int64_t mh = b; mh < e; ++mh) {
      const int64_t m = mh / H;
      const int h = (int)(mh % H);
      const float* qv = q + m * ldq + (int64_t)h * d;
      const int nw = win_hi[m] - win_lo[m];
      const int64_t e0 = ent_off ? ent_off[m] : 0, ne = ent_off ? ent_off[m + 1] - e0 : 0;
      s.resize(nw + ne);
      float mx = sinks[h];
      for (int i = 0; i < nw; ++i) mx = std::max(mx, s[i] = scale * dot(qv, win + (int64_t)(win_lo[m] + i) * d, d));
      for (int64_t i = 0; i < ne; ++i)
        mx = std::max(mx, s[nw + i] = scale * dot(qv, ent + (int64_t)ent_idx[e0 + i] * d, d));
      float denom = std::exp(sinks[h] - mx);
      for (auto& v : s) denom += (v = std::exp(v - mx));
      const float inv = 1.0f / denom;
      float* o = out + m * ldo + (int64_t)h * d;
      std::fill(o, o + d, 0.0f);
      for (int i = 0; i < nw; ++i) {
        const float p = s[i] * inv;
        const float* k = win + (int64_t)(win_lo[m] + i) * d;
        for (int c = 0; c < d; ++c) o[c] += p * k[c];
      }
      for (int64_t i = 0; i < ne; ++i) {
        const float p = s[nw + i] * inv;
        const float* k = ent + (int64_t)ent_idx[e0 + i] * d;
        for (int c = 0; c < d; ++c) o[c] += p * k[c];
      }
    }
  }, 4);
}

void CpuBackend::indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                                const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis,
                                float qk_scale, float* score) {
  pool_.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      float* sr = score + m * n_keys;
      const int32_t* kr = key_rows ? key_rows + m * key_ld : nullptr;
      for (int64_t w = 0; w < n_keys; ++w) {
        if (w >= n_vis[m]) {
          sr[w] = -std::numeric_limits<float>::infinity();
          continue;
        }
        float acc = 0;
        for (int h = 0; h < hI; ++h) {
          float v = dot(qI + (m * hI + h) * (int64_t)dI, K + (int64_t)(kr ? kr[w] : w) * dI, dI);
          acc += gamma[m * hI + h] * (std::max(v, 0.0f) * qk_scale);
        }
        sr[w] = acc;
      }
    }
  }, 1);
}

void CpuBackend::compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) {
  for (int64_t w = 0; w < W; ++w) {
    for (int c = 0; c < d; ++c) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int s = 0; s < S; ++s) mx = std::max(mx, gate[(w * S + s) * d + c]);
      float den = 0, num = 0;
      for (int s = 0; s < S; ++s) {
        float g = gate[(w * S + s) * d + c];
        if (g == -std::numeric_limits<float>::infinity()) continue;  // absent slot: weight 0
        float p = std::exp(g - mx);
        den += p;
        num += p * kv[(w * S + s) * d + c];
      }
      out[w * d + c] = num / den;
    }
  }
}

void CpuBackend::swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                              float* act) {
  for (int64_t m = 0; m < M; ++m) {
    const float* g = gu + m * 2 * I;
    const float* up = g + I;
    const float rs = row_scale ? row_scale[m] : 1.0f;
    for (int64_t i = 0; i < I; ++i) {
      float a = std::min(g[i], limit);
      float v = std::clamp(up[i], -limit, limit);
      act[m * I + i] = (a / (1.0f + std::exp(-a))) * v * rs;
    }
  }
}


namespace {
struct CpuExperts final : Experts {
  std::vector<WeightPtr> w13, w2;  // E × [2I, D], E × [D, I]
};
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

namespace {
struct CpuGroups final : WeightGroups {
  std::vector<WeightPtr> w;
};
}  // namespace

WeightGroupsPtr CpuBackend::make_groups(std::vector<WeightPtr> ws) {
  auto g = std::make_unique<CpuGroups>();
  g->G = (int64_t)ws.size();
  g->N = ws.empty() ? 0 : ws[0]->N;
  g->K = ws.empty() ? 0 : ws[0]->K;
  g->w = std::move(ws);
  return g;
}

void CpuBackend::linear_groups(const float* x, int64_t M, int64_t ldx, const WeightGroups& wg, float* y,
                               int64_t ldy) {
  const auto& g = static_cast<const CpuGroups&>(wg);
  for (int64_t i = 0; i < g.G; ++i) linear(x + i * g.K, M, ldx, *g.w[i], y + i * g.N, ldy);
}

ExpertsPtr CpuBackend::make_experts(std::vector<WeightPtr> w13, std::vector<WeightPtr> w2) {
  auto ex = std::make_unique<CpuExperts>();
  ex->E = (int64_t)w13.size();
  ex->I = w13.empty() ? 0 : w13[0]->N / 2;
  ex->D = w13.empty() ? 0 : w13[0]->K;
  ex->w13 = std::move(w13);
  ex->w2 = std::move(w2);
  return ex;
}

void CpuBackend::moe_route(const float* logits, int64_t T, int E, int K, RouteScoring scoring, const float* bias,
                           const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                           int32_t* sel, float* wsel) {
  std::vector<float> sc(E), biased(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = logits + t * E;
    switch (scoring) {
      case RouteScoring::SqrtSoftplus:
        for (int e = 0; e < E; ++e) sc[e] = std::sqrt(softplus(lg[e]));
        break;
      case RouteScoring::Sigmoid:
        for (int e = 0; e < E; ++e) sc[e] = 1.0f / (1.0f + std::exp(-lg[e]));
        break;
      case RouteScoring::Softmax: {
        float mx = *std::max_element(lg, lg + E), s = 0;
        for (int e = 0; e < E; ++e) s += (sc[e] = std::exp(lg[e] - mx));
        for (int e = 0; e < E; ++e) sc[e] /= s;
        break;
      }
    }
    if (tid2eid) {
      for (int k = 0; k < K; ++k) sel[t * K + k] = tid2eid[(int64_t)tokens[t] * K + k];
    } else {
      for (int e = 0; e < E; ++e) biased[e] = sc[e] + bias[e];  // bias only picks, never weighs
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
        return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
      });
      for (int k = 0; k < K; ++k) sel[t * K + k] = order[k];
    }
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += (wsel[t * K + k] = sc[sel[t * K + k]]);
    const float f = route_scale / (normalize ? sum + 1e-20f : 1.0f);
    for (int k = 0; k < K; ++k) wsel[t * K + k] *= f;
  }
}

void CpuBackend::moe_ffn(const float* h, int64_t T, const Experts& exb, const int32_t* sel, const float* wsel, int K,
                         float limit, const float* shared, float* out) {
  const auto& ex = static_cast<const CpuExperts&>(exb);
  moe_ffn_loop(*this, h, T, ex.D, ex.I, ex.w13, ex.w2, sel, wsel, K, limit, out);
  if (shared) add_rows(shared, T, ex.D, nullptr, nullptr, out);
}

void CpuBackend::argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * ld;
    int32_t best = -1;
    float bv = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < N; ++i) {
      if (std::isnan(r[i]) || r[i] == std::numeric_limits<float>::infinity()) {
        best = -2;
        break;
      }
      if (r[i] > bv) bv = r[i], best = (int32_t)i;  // strict: equal values keep the lower id
    }
    out[m] = best;
  }
}

void CpuBackend::sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                             const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out) {
  // Rows in parallel: each is computed by one thread from its own data (no order, no shared state).
  pool().parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (rows && edit_places(rows[m]) > 0) apply_edits(x + m * ld, N, rows[m], edits, edit_raw, tokens);
      out[m] = sample_row(x + m * ld, N, spec[m]);
    }
  }, 1);
}

void CpuBackend::mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks) {
  pool().parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      if (rows[m].mask >= 0) apply_mask(x + m * ld, N, masks + rows[m].mask * mask_words(N));
  }, 1);
}

void CpuBackend::logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                              const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out) {
  pool().parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (spec[m].logprobs < 0) continue;
      float* row = x + m * ld;
      if (rows && edit_places(rows[m]) > 0) restore_edits(row, N, rows[m], edits, edit_raw);
      bool bad = false;
      for (int64_t i = 0; i < N && !bad; ++i) bad = std::isnan(row[i]) || row[i] == std::numeric_limits<float>::infinity();
      if (bad) {
        out[m] = RowLogprobs{};
        out[m].token = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      row_logprobs(row, N, picks[m], spec[m].logprobs, out[m]);
    }
  }, 1);
}

void CpuBackend::feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks, int64_t V) {
  for (int64_t i = 0; i < T; ++i) {
    if (feed[i] < 0) continue;
    const int32_t p = picks[feed[i]], t = p >= 0 && p < V ? p : 0;
    pack[i] = t;
    for (int j = 0; j < hc; ++j) pack[T + i * hc + j] = t;
  }
}

void CpuBackend::select_topk(const float* score, int64_t M, int64_t n, const int32_t* n_vis, int topk,
                             const int32_t* rowmap, int64_t rowmap_ld, const int64_t* out_off, int32_t* out) {
  std::vector<int32_t> cand;
  for (int64_t i = 0; i < M; ++i) {
    const int64_t nv = n_vis[i], k = std::min<int64_t>(topk, nv);
    cand.resize(nv);
    std::iota(cand.begin(), cand.end(), 0);
    const float* sc = score + i * n;
    // Highest scores first; equal scores by lower index, so the choice is deterministic.
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                      [&](int32_t a, int32_t c) { return sc[a] > sc[c] || (sc[a] == sc[c] && a < c); });
    std::sort(cand.begin(), cand.begin() + k);
    const int32_t* map = rowmap + i * rowmap_ld;
    for (int64_t j = 0; j < k; ++j) out[out_off[i] + j] = map[cand[j]];
  }
}

// ---- DeepSeek-V4.1: KV QAT simulations (spec §3.5, §3.7, §3.8) and the Engram gate (§3.4) ----
namespace {

// Round-to-nearest-even onto a float grid with `mbits` mantissa bits and minimum normal exponent
// `emin`; the input is already clamped to the grid's range.
template <class F>
inline F round_grid(F v, int mbits, int emin) {
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);  // |v| = f·2^e, f in [0.5, 1)  =>  floor(log2|v|) = e − 1
  const int q = std::max(e - 1, emin) - mbits;
  return std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);  // default rounding mode: ties to even
}

// 2^ceil(log2(x)) for x > 0.
inline float pow2_ceil(double x) {
  int e;
  double f = std::frexp(x, &e);
  return (float)std::ldexp(1.0, f == 0.5 ? e - 1 : e);
}

// E4M3 cast (round to nearest even, saturating at 448) straight from double: no double rounding.
inline float e4m3_rne(double x) { return (float)round_grid(std::min(x, 448.0), 3, -6); }

void qdq_block(float* x, KvQdq f) {
  const int bs = kv_qdq_block(f);
  float amax = 0;
  for (int i = 0; i < bs; ++i) amax = std::max(amax, std::fabs(x[i]));
  switch (f) {
    case KvQdq::Fp8Pow2x32: {
      const float s = pow2_ceil(std::max((double)amax, 1e-4) / 448.0);
      for (int i = 0; i < bs; ++i) x[i] = round_grid(std::clamp(x[i] / s, -448.0f, 448.0f), 3, -6) * s;
      break;
    }
    case KvQdq::Fp4Pow2x32: {
      const float s = pow2_ceil(std::max((double)amax, 6.0 * std::ldexp(1.0, -126)) / 6.0);
      for (int i = 0; i < bs; ++i) x[i] = round_grid(std::clamp(x[i] / s, -6.0f, 6.0f), 1, 0) * s;
      break;
    }
    case KvQdq::Fp4E4m3x16: {
      const float s = e4m3_rne(std::max((double)amax, 6.0 * std::ldexp(1.0, -9)) / 6.0);
      for (int i = 0; i < bs; ++i) x[i] = round_grid(std::clamp(x[i] / s, -6.0f, 6.0f), 1, 0) * s;
      break;
    }
  }
}

}  // namespace

void CpuBackend::kv_qdq(float* x, int64_t n, KvQdq format) {
  const int bs = kv_qdq_block(format);
  for (int64_t b = 0; b + bs <= n; b += bs) qdq_block(x + b, format);
}

void CpuBackend::engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps) {
  for (int64_t t = 0; t < M; ++t) {
    const float* value = kv + (t * (hc + 1) + hc) * D;
    for (int64_t j = 0; j < hc; ++j) {
      float* x = X + (t * hc + j) * D;
      const float* key = kv + (t * (hc + 1) + j) * D;
      const float* wj = w + j * D;
      double dotv = 0, xx = 0, kk = 0;
      for (int64_t c = 0; c < D; ++c) {
        dotv += (double)x[c] * wj[c] * key[c];
        xx += (double)x[c] * x[c];
        kk += (double)key[c] * key[c];
      }
      // Per-stream normalisation: rsqrt(mean x²)·rsqrt(mean key²)/sqrt(D), then a signed square root.
      const double s = dotv / std::sqrt(xx / D + eps) / std::sqrt(kk / D + eps) / std::sqrt((double)D);
      const double gate = 1.0 / (1.0 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(s), 1e-6)), s)));
      for (int64_t c = 0; c < D; ++c) x[c] = (float)(x[c] + gate * value[c]);
    }
  }
}

}  // namespace deepinfer
