// float32 kernels for any shape: the GEMM, attention and indexer of the CUDA backend's model path and
// the row-movement ops the forward pass needs to keep its state on the device. Simple and exact
// rather than fast: each output is one fixed-order fma chain, so a row never depends on the batch.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;

// ---- GEMM: 64×64 output tile, 16-deep k slices through shared memory, 4×4 outputs a thread ----
constexpr int GT = 64, GK = 16;

__global__ void __launch_bounds__(256) gemm_f32_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                                       const float* __restrict__ w, int64_t N, float* __restrict__ y,
                                                       int64_t ldy) {
  __shared__ float xs[GK][GT + 1], ws[GK][GT + 1];  // [k][row]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = (int64_t)blockIdx.y * GT, n0 = (int64_t)blockIdx.x * GT;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += GK) {
    for (int i = threadIdx.x; i < GT * GK; i += 256) {  // coalesced along k
      const int r = i / GK, k = i % GK;
      const int64_t gk = k0 + k;
      xs[k][r] = (m0 + r < M && gk < K) ? x[(m0 + r) * ldx + gk] : 0.0f;
      ws[k][r] = (n0 + r < N && gk < K) ? w[(n0 + r) * K + gk] : 0.0f;
    }
    __syncthreads();
    const int kn = (K - k0) < GK ? (int)(K - k0) : GK;
    for (int k = 0; k < kn; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[k][ty + 16 * i], b[i] = ws[k][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) y[m * ldy + n] = acc[i][j];
    }
}

// ---- sink attention: block (query m, head h), 4 warps; warp w takes keys w, w+4, ... with an
// online softmax, lanes own channels c = lane + 32·j; the 4 partial states merge in warp order ----
constexpr int AW = 4, ADMAX = 1024, AJ = ADMAX / 32;

__global__ void __launch_bounds__(AW * 32) sink_attn_f32_kernel(
    const float* __restrict__ q, int64_t ldq, int H, int d, const float* __restrict__ win,
    const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi, const float* __restrict__ ent,
    const int32_t* __restrict__ ent_idx, const int64_t* __restrict__ ent_off, const float* __restrict__ sinks,
    float scale, float* __restrict__ out, int64_t ldo) {
  extern __shared__ float sm[];  // q[d], then per warp: acc[d], m, l
  const int64_t m = blockIdx.x;
  const int h = blockIdx.y, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  float* qs = sm;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[m * ldq + (int64_t)h * d + c];
  __syncthreads();
  const int lo = win_lo[m], nw = win_hi[m] - lo;
  const int64_t e0 = ent_off ? ent_off[m] : 0, ne = ent_off ? ent_off[m + 1] - e0 : 0;
  const int64_t n = nw + ne;
  const int nj = (d + 31) / 32;
  float acc[AJ];
#pragma unroll
  for (int j = 0; j < AJ; ++j) acc[j] = 0.0f;
  float mx = -INFINITY, l = 0.0f;
  for (int64_t i = wp; i < n; i += AW) {
    const float* k = i < nw ? win + (int64_t)(lo + i) * d : ent + (int64_t)ent_idx[e0 + i - nw] * d;
    float kv[AJ];
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < AJ; ++j) {
      const int c = lane + 32 * j;
      kv[j] = (j < nj && c < d) ? k[c] : 0.0f;
      if (j < nj && c < d) part = fmaf(qs[c], kv[j], part);
    }
    const float s = scale * detail::warp_sum(part);
    const float mn = fmaxf(mx, s);
    const float corr = expf(mx - mn), p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < AJ; ++j) acc[j] = fmaf(p, kv[j], acc[j] * corr);
    mx = mn;
  }
  float* wacc = sm + d + (int64_t)wp * (d + 2);
#pragma unroll
  for (int j = 0; j < AJ; ++j) {
    const int c = lane + 32 * j;
    if (j < nj && c < d) wacc[c] = acc[j];
  }
  if (lane == 0) wacc[d] = mx, wacc[d + 1] = l;
  __syncthreads();
  float M = sinks[h];
  for (int w = 0; w < AW; ++w) M = fmaxf(M, sm[d + (int64_t)w * (d + 2) + d]);
  float L = expf(sinks[h] - M);
  float f[AW];
  for (int w = 0; w < AW; ++w) {
    const float* st = sm + d + (int64_t)w * (d + 2);
    f[w] = st[d] == -INFINITY ? 0.0f : expf(st[d] - M);
    L += st[d + 1] * f[w];
  }
  const float inv = 1.0f / L;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < AW; ++w) o += sm[d + (int64_t)w * (d + 2) + c] * f[w];
    out[m * ldo + (int64_t)h * d + c] = o * inv;
  }
}

// ---- indexer: a warp per (query, key) ----
__global__ void indexer_f32_kernel(const float* __restrict__ qI, const float* __restrict__ gamma, int64_t M, int hI,
                                   int dI, const float* __restrict__ K, const int32_t* __restrict__ key_rows,
                                   int64_t n_keys, const int32_t* __restrict__ n_vis, float qk_scale,
                                   float* __restrict__ score) {
  const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= M * n_keys) return;
  const int64_t m = gw / n_keys, w = gw % n_keys;
  if (w >= n_vis[m]) {
    if (lane == 0) score[m * n_keys + w] = -INFINITY;
    return;
  }
  const float* k = K + (int64_t)(key_rows ? key_rows[w] : w) * dI;
  float acc = 0.0f;
  for (int h = 0; h < hI; ++h) {
    const float* qv = qI + (m * hI + h) * (int64_t)dI;
    float part = 0.0f;
    for (int c = lane; c < dI; c += 32) part = fmaf(qv[c], k[c], part);
    const float v = detail::warp_sum(part);
    acc += gamma[m * hI + h] * (fmaxf(v, 0.0f) * qk_scale);
  }
  if (lane == 0) score[m * n_keys + w] = acc;
}

// ---- row movement ----
__global__ void copy_rows_kernel(const float* __restrict__ src, int64_t lds, const int32_t* __restrict__ src_rows,
                                 int64_t s0, int64_t sR, float* __restrict__ dst, int64_t ldd,
                                 const int32_t* __restrict__ dst_rows, int64_t d0, int64_t dR, int64_t n,
                                 int64_t width) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * width) return;
  const int64_t i = t / width, c = t % width;
  int64_t sr = src_rows ? (int64_t)src_rows[i] : s0 + i;
  int64_t dr = dst_rows ? (int64_t)dst_rows[i] : d0 + i;
  if (sR) sr %= sR;
  if (dR) dr %= dR;
  dst[dr * ldd + c] = src[sr * lds + c];
}

__global__ void add_rows_kernel(const float* __restrict__ src, int64_t n, int64_t width, const float* __restrict__ w,
                                const int32_t* __restrict__ dst_rows, float* __restrict__ dst) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * width) return;
  const int64_t i = t / width, c = t % width;
  const int64_t r = dst_rows ? (int64_t)dst_rows[i] : i;
  const float v = src[t];
  dst[r * width + c] += w ? v * w[i] : v;
}

__global__ void fill_kernel(float* x, int64_t n, float v) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) x[t] = v;
}
__global__ void scale_kernel(float* x, int64_t n, float a) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) x[t] *= a;
}

__global__ void compress_windows_kernel(const float* __restrict__ ring_kv, const float* __restrict__ ring_gate,
                                        const float* __restrict__ kv, const float* __restrict__ gate, int64_t ld,
                                        int64_t p0, const float* __restrict__ ape, int m, int width, bool overlap,
                                        const int32_t* __restrict__ win_ids, int64_t nw, float* __restrict__ skv,
                                        float* __restrict__ sg) {
  const int S = overlap ? 2 * m : m;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nw * S * width) return;
  const int c = (int)(t % width);
  const int s = (int)((t / width) % S);
  const int64_t win = win_ids[t / ((int64_t)S * width)];
  const int64_t cw = (overlap ? 2 : 1) * (int64_t)width, R = overlap ? 2 * m : m;
  int64_t p;  // source position
  int col;    // column inside cw
  int j;
  if (!overlap) {
    j = s, p = win * m + j, col = c;
  } else if (s < m) {
    j = s, p = (win - 1) * m + j, col = c;
    if (win == 0) {
      skv[t] = 0.0f;
      sg[t] = -INFINITY;
      return;
    }
  } else {
    j = s - m, p = win * m + j, col = width + c;
  }
  float k, g;
  if (p >= p0) {
    k = kv[(p - p0) * ld + col];
    g = gate[(p - p0) * ld + col];
  } else {
    k = ring_kv[(p % R) * cw + col];
    g = ring_gate[(p % R) * cw + col];
  }
  skv[t] = k;
  sg[t] = ape ? g + ape[(int64_t)j * cw + col] : g;
}

}  // namespace

cudaError_t gemm_f32(const float* x, int64_t M, int64_t K, int64_t ldx, const float* w, int64_t N, float* y,
                     int64_t ldy, cudaStream_t s) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  dim3 grid((unsigned)cdiv(N, GT), (unsigned)cdiv(M, GT));
  gemm_f32_kernel<<<grid, 256, 0, s>>>(x, M, K, ldx, w, N, y, ldy);
  return cudaGetLastError();
}

cudaError_t sink_attention_f32(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s) {
  if (d > ADMAX) return cudaErrorNotSupported;
  if (M <= 0 || H <= 0) return cudaSuccess;
  const size_t smem = sizeof(float) * ((size_t)d + AW * ((size_t)d + 2));
  sink_attn_f32_kernel<<<dim3((unsigned)M, (unsigned)H), AW * 32, smem, s>>>(q, ldq, H, d, win, win_lo, win_hi, ent,
                                                                          ent_idx, ent_off, sinks, scale, out, ldo);
  return cudaGetLastError();
}

cudaError_t indexer_scores_f32(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                               const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                               float* score, cudaStream_t s) {
  if (M <= 0 || n_keys <= 0) return cudaSuccess;
  indexer_f32_kernel<<<(unsigned)cdiv(M * n_keys * 32, 256), 256, 0, s>>>(qI, gamma, M, hI, dI, K, key_rows, n_keys,
                                                                        n_vis, qk_scale, score);
  return cudaGetLastError();
}

cudaError_t copy_rows(const float* src, int64_t lds, const int32_t* src_rows, int64_t s0, int64_t sR, float* dst,
                      int64_t ldd, const int32_t* dst_rows, int64_t d0, int64_t dR, int64_t n, int64_t width,
                      cudaStream_t s) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  copy_rows_kernel<<<(unsigned)cdiv(n * width, 256), 256, 0, s>>>(src, lds, src_rows, s0, sR, dst, ldd, dst_rows, d0,
                                                                   dR, n, width);
  return cudaGetLastError();
}

cudaError_t add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows, float* dst,
                     cudaStream_t s) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  add_rows_kernel<<<(unsigned)cdiv(n * width, 256), 256, 0, s>>>(src, n, width, w, dst_rows, dst);
  return cudaGetLastError();
}

cudaError_t fill_f32(float* x, int64_t n, float v, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  fill_kernel<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(x, n, v);
  return cudaGetLastError();
}

cudaError_t scale_f32(float* x, int64_t n, float a, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(x, n, a);
  return cudaGetLastError();
}

cudaError_t compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                             int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                             const int32_t* win_ids, int64_t nw, float* skv, float* sg, cudaStream_t s) {
  const int64_t n = nw * (overlap ? 2 * m : m) * width;
  if (n <= 0) return cudaSuccess;
  compress_windows_kernel<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width,
                                                                  overlap, win_ids, nw, skv, sg);
  return cudaGetLastError();
}

}  // namespace deepinfer::cuda
