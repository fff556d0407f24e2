// float32 kernels for any shape: the GEMM, attention and indexer of the CUDA backend's model path and
// the row-movement ops the forward pass needs to keep its state on the device. Simple and exact
// rather than fast: each output is one fixed-order fma chain, so a row never depends on the batch.
#include <cooperative_groups.h>

#include <climits>

#include "ops/cuda/async_bits.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"

namespace deepinfer::cuda {
namespace {
using detail::cdiv;
namespace cg = cooperative_groups;

// ---- GEMM: 64×64 output tile, 16-deep k slices through shared memory, 4×4 outputs a thread ----
constexpr int GT = 64, GK = 16;

__global__ void __launch_bounds__(256) gemm_f32_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                                       const float* __restrict__ w, int64_t N, float* __restrict__ y,
                                                       int64_t ldy) {
  DI_PDL_WAIT();
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
  DI_PDL_WAIT();
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

// ---- sink attention v2 (flash-decoding): a cluster of SA_CS blocks per (query, group of SA_G heads) ----
// The query's n keys are cut into tiles of CK keys; cluster rank r takes the contiguous tile range
// [r·T/CS, (r+1)·T/CS) (T = ⌈n/CK⌉), so the cut depends on n alone (batch invariant). A block stages Q
// of its SA_G heads once and each key tile once in shared memory (cp.async, double buffered) and uses
// it for all its heads: S[G, CK] = Q·Kᵀ (8 warps = 8 fixed d slices, summed in slice order), an online
// softmax per head over its tiles in key order, O[G, d] += P·K. The ranks' (max, sum, O) meet through
// distributed shared memory and are merged in rank order 0..CS-1 with the sink; no global scratch.
// Every (query, head) result is one fixed sequence of f32 operations that depends only on that
// query's keys, d and the constants below (not on M, H, the head's group or the other queries).
constexpr int SA_NT = 256, SA_NW = SA_NT / 32, SA_CS = 8, SA_G = 16, SA_DMAX = 1024;
static_assert(SA_G == 2 * SA_NW && SA_G == 2 * SA_CS && SA_NT == 2 * 128, "v2 thread mappings");

using detail::cp_async16, detail::cp_async4, detail::cp_async_commit, detail::cp_async_wait;

// Shared memory of the v2 kernel (floats), dp = d rounded up to 32, DQ = dp + 4 (row stride ≡ 4 mod 32
// banks: the 4 head rows / 8 key rows one score instruction reads fall in distinct banks).
__host__ __device__ constexpr int64_t sa2_smem_floats(int d, int CK) {
  const int64_t dq = ((d + 31) / 32) * 32 + 4;
  return SA_G * dq + 2 * CK * dq + (int64_t)SA_NW * SA_G * CK + CK * SA_G + SA_G;
}

// CK keys a tile; NJ column blocks of 512 per thread in P·V (d ≤ 512·NJ).
template <int CK, int NJ>
__global__ void __launch_bounds__(SA_NT, 1) sink_attn_f32_v2_kernel(
    const float* __restrict__ q, int64_t ldq, int H, int d, const float* __restrict__ win,
    const int32_t* __restrict__ win_lo, const int32_t* __restrict__ win_hi, const float* __restrict__ ent,
    const int32_t* __restrict__ ent_idx, const int64_t* __restrict__ ent_off, const float* __restrict__ sinks,
    float scale, float* __restrict__ out, int64_t ldo, int HG, bool vec) {
  DI_PDL_WAIT();
  constexpr int KJ = CK / 8;  // keys a thread in the score phase
  static_assert(CK % 8 == 0 && CK <= 32, "tile");
  extern __shared__ float4 sa_smem4[];
  float* sm = reinterpret_cast<float*>(sa_smem4);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int64_t item = (int64_t)blockIdx.x / SA_CS;  // (query, head group)
  const int64_t m = item / HG;
  const int h0 = (int)(item % HG) * SA_G;
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const int dp = (d + 31) & ~31, DQ = dp + 4;
  float* qs = sm;                      // [G][DQ] Q of the group (zero beyond d and H)
  float* ks = qs + SA_G * DQ;          // [2][CK][DQ] key tiles (columns ≥ d stay zero)
  float* sp = ks + 2 * CK * DQ;        // [NW][G][CK] partial scores; slice 0 then holds the scores
  float* ps = sp + SA_NW * SA_G * CK;  // [CK][G] probabilities of the tile
  float* cr = ps + CK * SA_G;          // [G] rescale factor of the running output

  for (int h = wp; h < SA_G; h += SA_NW) {
    const bool hv = h0 + h < H;
    const float* qr = q + m * ldq + (int64_t)(h0 + h) * d;
    for (int c = lane; c < DQ; c += 32) qs[h * DQ + c] = (hv && c < d) ? qr[c] : 0.0f;
  }
  for (int r = wp; r < 2 * CK; r += SA_NW)
    for (int c = d + lane; c < DQ; c += 32) ks[r * DQ + c] = 0.0f;

  const int lo = win_lo[m];
  const int64_t nw = (int64_t)win_hi[m] - lo;
  const int64_t e0 = ent_off ? ent_off[m] : 0, ne = ent_off ? ent_off[m + 1] - e0 : 0;
  const int64_t n = nw + ne, T = (n + CK - 1) / CK;
  const int64_t t0 = rank * T / SA_CS, t1 = (rank + 1) * T / SA_CS;

  auto load_tile = [&](int64_t t, int b) {
    float* kb = ks + b * CK * DQ;
    for (int r = wp; r < CK; r += SA_NW) {
      const int64_t i = t * CK + r;
      float* dst = kb + r * DQ;
      if (i >= n) {  // past the last key: zeros (p = 0 there, and 0·0 stays 0)
        for (int c = lane; c < d; c += 32) dst[c] = 0.0f;
        continue;
      }
      const float* src = i < nw ? win + (lo + i) * d : ent + (int64_t)ent_idx[e0 + i - nw] * d;
      if (vec) {
        for (int c = lane * 4; c < d; c += 128) cp_async16(dst + c, src + c);
      } else {
        for (int c = lane; c < d; c += 32) cp_async4(dst + c, src + c);
      }
    }
    cp_async_commit();
  };

  // score phase: warp wp = d slice [f0, f1) in float4 units; lane = (head tile ht, key tile kt);
  // thread heads ht + 4i (i < 4), keys kt + 8j (j < KJ)
  const int ht = lane >> 3, kt = lane & 7;
  const int F = dp / 4, f0 = wp * F / SA_NW, f1 = (wp + 1) * F / SA_NW;
  // P·V phase: thread heads hh·8 + i (i < 8), columns 4·cl + 512·jj (jj < NJ)
  const int hh = tid >> 7, cl = tid & 127;
  bool colok[NJ];
#pragma unroll
  for (int jj = 0; jj < NJ; ++jj) colok[jj] = 4 * cl + 512 * jj < dp;
  float o[8][NJ][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][jj][e] = 0.0f;
  // running max / sum of heads 2·wp + u (warp uniform)
  float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};

  if (t0 < t1) load_tile(t0, 0);
  __syncthreads();
  for (int64_t t = t0; t < t1; ++t) {
    const int b = (int)((t - t0) & 1);
    if (t + 1 < t1) {
      load_tile(t + 1, b ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* kb = ks + b * CK * DQ;
    const int nv = (int)(n - t * CK < CK ? n - t * CK : CK);

    float acc[4][KJ];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < KJ; ++j) acc[i][j] = 0.0f;
    for (int f = f0; f < f1; ++f) {
      float4 qv[4], kv[KJ];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(qs + (ht + 4 * i) * DQ + 4 * f);
#pragma unroll
      for (int j = 0; j < KJ; ++j) kv[j] = *reinterpret_cast<const float4*>(kb + (kt + 8 * j) * DQ + 4 * f);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < KJ; ++j) {
          float a = acc[i][j];
          a = fmaf(qv[i].x, kv[j].x, a);
          a = fmaf(qv[i].y, kv[j].y, a);
          a = fmaf(qv[i].z, kv[j].z, a);
          a = fmaf(qv[i].w, kv[j].w, a);
          acc[i][j] = a;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < KJ; ++j) sp[(wp * SA_G + ht + 4 * i) * CK + kt + 8 * j] = acc[i][j];
    __syncthreads();
    for (int idx = tid; idx < SA_G * CK; idx += SA_NT) {  // slices summed in order 0..7
      float s = sp[idx];
#pragma unroll
      for (int w = 1; w < SA_NW; ++w) s = __fadd_rn(s, sp[w * SA_G * CK + idx]);
      sp[idx] = (idx % CK) < nv ? __fmul_rn(scale, s) : -INFINITY;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // online softmax of head 2·wp + u; lane = key
      const int h = 2 * wp + u;
      const float s = lane < CK ? sp[h * CK + lane] : -INFINITY;
      const float mn = fmaxf(mrun[u], detail::warp_max(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - mn);
      const float c = expf(mrun[u] - mn);  // 0 on the first tile
      lrun[u] = fmaf(lrun[u], c, detail::warp_sum(p));
      mrun[u] = mn;
      if (lane < CK) ps[lane * SA_G + h] = p;
      if (lane == 0) cr[h] = c;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float c = cr[hh * 8 + i];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][jj][e] = __fmul_rn(o[i][jj][e], c);
    }
#pragma unroll 2
    for (int k = 0; k < nv; ++k) {
      const float4 pa = *reinterpret_cast<const float4*>(ps + k * SA_G + hh * 8);
      const float4 pb = *reinterpret_cast<const float4*>(ps + k * SA_G + hh * 8 + 4);
      const float pv[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        if (!colok[jj]) continue;
        const float4 kv = *reinterpret_cast<const float4*>(kb + k * DQ + 4 * cl + 512 * jj);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          o[i][jj][0] = fmaf(pv[i], kv.x, o[i][jj][0]);
          o[i][jj][1] = fmaf(pv[i], kv.y, o[i][jj][1]);
          o[i][jj][2] = fmaf(pv[i], kv.z, o[i][jj][2]);
          o[i][jj][3] = fmaf(pv[i], kv.w, o[i][jj][3]);
        }
      }
    }
    __syncthreads();  // the next iteration's load reuses this buffer
  }

  // this rank's partial state into shared memory (over the key tiles, which are free now)
  float* op = ks;  // [G][dp]
  float* ml = sp;  // [G][2] (max, sum)
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj)
      if (colok[jj])
        *reinterpret_cast<float4*>(op + (hh * 8 + i) * dp + 4 * cl + 512 * jj) =
            make_float4(o[i][jj][0], o[i][jj][1], o[i][jj][2], o[i][jj][3]);
  if (lane == 0)
#pragma unroll
    for (int u = 0; u < 2; ++u) ml[(2 * wp + u) * 2] = mrun[u], ml[(2 * wp + u) * 2 + 1] = lrun[u];
  cluster.sync();
  {  // rank r finalizes heads 2r, 2r+1 of the group, 128 threads a head; ranks merged in order
    const int h = 2 * rank + (tid >> 7), gh = h0 + h;
    if (gh < H) {
      const float sink = sinks[gh];
      float mx = sink, wr[SA_CS];
      const float* opr[SA_CS];
#pragma unroll
      for (int r = 0; r < SA_CS; ++r) {
        wr[r] = cluster.map_shared_rank(ml, r)[2 * h];
        opr[r] = cluster.map_shared_rank(op, r) + (int64_t)h * dp;
        mx = fmaxf(mx, wr[r]);
      }
      float L = expf(sink - mx);
#pragma unroll
      for (int r = 0; r < SA_CS; ++r) {
        wr[r] = wr[r] == -INFINITY ? 0.0f : expf(wr[r] - mx);
        L = fmaf(cluster.map_shared_rank(ml, r)[2 * h + 1], wr[r], L);
      }
      const float inv = 1.0f / L;
      float* orow = out + m * ldo + (int64_t)gh * d;
      for (int c = tid & 127; c < d; c += 128) {
        float a = 0.0f;
#pragma unroll
        for (int r = 0; r < SA_CS; ++r) a = fmaf(opr[r][c], wr[r], a);
        orow[c] = __fmul_rn(a, inv);
      }
    }
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

template <int CK, int NJ>
cudaError_t sa2_launch(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win, const int32_t* win_lo,
                       const int32_t* win_hi, const float* ent, const int32_t* ent_idx, const int64_t* ent_off,
                       const float* sinks, float scale, float* out, int64_t ldo, cudaStream_t s) {
  // (max dynamic shared memory 4 · sa2_smem_floats(512 · NJ, CK): sa2_attrs, once)
  const int HG = (H + SA_G - 1) / SA_G;
  const int64_t blocks = M * HG * SA_CS;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const bool vec = d % 4 == 0 && ((uintptr_t)win % 16) == 0 && ((uintptr_t)ent % 16) == 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks, 1, 1);
  cfg.blockDim = dim3(SA_NT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)(4 * sa2_smem_floats(d, CK));
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = SA_CS;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, sink_attn_f32_v2_kernel<CK, NJ>, q, ldq, H, d, win, win_lo, win_hi, ent, ent_idx,
                            ent_off, sinks, scale, out, ldo, HG, vec);
}

// ---- indexer: a warp per (query, key) ----
__global__ void indexer_f32_kernel(const float* __restrict__ qI, const float* __restrict__ gamma, int64_t M, int hI,
                                   int dI, const float* __restrict__ K, const int32_t* __restrict__ key_rows,
                                   int64_t key_ld, int64_t n_keys, const int32_t* __restrict__ n_vis, float qk_scale,
                                   float* __restrict__ score) {
  DI_PDL_WAIT();
  const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= M * n_keys) return;
  const int64_t m = gw / n_keys, w = gw % n_keys;
  if (w >= n_vis[m]) {
    if (lane == 0) score[m * n_keys + w] = -INFINITY;
    return;
  }
  const float* k = K + (int64_t)(key_rows ? key_rows[m * key_ld + w] : w) * dI;
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
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * width) return;
  const int64_t i = t / width, c = t % width;
  int64_t sr = src_rows ? (int64_t)src_rows[i] : s0 + i;
  int64_t dr = dst_rows ? (int64_t)dst_rows[i] : d0 + i;
  if (dr < 0) return;  // a skipped row (Backend::copy_rows)
  if (sR) sr %= sR;
  if (dR) dr %= dR;
  dst[dr * ldd + c] = src[sr * lds + c];
}

// copy_rows_multi: flat index t of set k (t − begin[k] = i·width_k + c), found by a scan of ≤ 4 set starts.
struct RowCopyMulti {
  RowCopySet set[4];
  int64_t begin[5];  // first flat index of each set; begin[nsets] = the total
  int nsets;
};
__global__ void copy_rows_multi_kernel(const float* __restrict__ src, int64_t lds, const int32_t* __restrict__ src_rows,
                                       const RowCopyMulti p) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.begin[p.nsets]) return;
  int k = 0;
#pragma unroll
  for (int q = 1; q < 4; ++q) k += (q < p.nsets && t >= p.begin[q]) ? 1 : 0;
  const RowCopySet& c = p.set[k];
  const int64_t u = t - p.begin[k], i = u / c.width, col = u % c.width;
  const int64_t dr = c.dst_rows ? (int64_t)c.dst_rows[i] : i;
  if (dr < 0) return;  // a skipped row (Backend::copy_rows)
  const int64_t sr = src_rows ? (int64_t)src_rows[i] : i;
  c.dst[dr * c.ldd + col] = src[sr * lds + c.col + col];
}

__global__ void add_rows_kernel(const float* __restrict__ src, int64_t n, int64_t width, const float* __restrict__ w,
                                const int32_t* __restrict__ dst_rows, float* __restrict__ dst) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * width) return;
  const int64_t i = t / width, c = t % width;
  const int64_t r = dst_rows ? (int64_t)dst_rows[i] : i;
  const float v = src[t];
  dst[r * width + c] += w ? v * w[i] : v;
}

__global__ void fill_kernel(float* x, int64_t n, float v) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) x[t] = v;
}
__global__ void scale_kernel(float* x, int64_t n, float a) {
  DI_PDL_WAIT();
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) x[t] *= a;
}

__global__ void compress_windows_kernel(const float* __restrict__ ring_kv, const float* __restrict__ ring_gate,
                                        const float* __restrict__ kv, const float* __restrict__ gate, int64_t ld,
                                        int64_t p0, const float* __restrict__ ape, int m, int width, bool overlap,
                                        const int32_t* __restrict__ win_ids, const int32_t* __restrict__ ring_rows,
                                        int64_t nw, float* __restrict__ skv, float* __restrict__ sg) {
  DI_PDL_WAIT();
  const int S = overlap ? 2 * m : m;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nw * S * width) return;
  const int c = (int)(t % width);
  const int s = (int)((t / width) % S);
  const int64_t wi = t / ((int64_t)S * width);
  const int64_t win = win_ids[wi], r0 = ring_rows ? ring_rows[wi] : 0;
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
    k = ring_kv[(r0 + p % R) * cw + col];
    g = ring_gate[(r0 + p % R) * cw + col];
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
  if (d <= 0 || d > SA_DMAX) return cudaErrorNotSupported;
  if (M <= 0 || H <= 0) return cudaSuccess;
  if (d <= 512)
    return sa2_launch<32, 1>(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s);
  return sa2_launch<16, 2>(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, s);
}

cudaError_t sink_attention_f32_v1(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
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
                               const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis,
                               float qk_scale, float* score, cudaStream_t s) {
  if (M <= 0 || n_keys <= 0) return cudaSuccess;
  indexer_f32_kernel<<<(unsigned)cdiv(M * n_keys * 32, 256), 256, 0, s>>>(qI, gamma, M, hI, dI, K, key_rows, key_ld,
                                                                        n_keys, n_vis, qk_scale, score);
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

cudaError_t copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopySet* sets, int nsets,
                            int64_t n, cudaStream_t s) {
  if (nsets < 1 || nsets > 4) return cudaErrorInvalidValue;
  RowCopyMulti p = {};
  p.nsets = nsets;
  for (int k = 0; k < nsets; ++k) {
    if (sets[k].width < 0) return cudaErrorInvalidValue;
    p.set[k] = sets[k];
    p.begin[k + 1] = p.begin[k] + (n > 0 ? n * sets[k].width : 0);
  }
  const int64_t total = p.begin[nsets];
  if (total <= 0) return cudaSuccess;
  copy_rows_multi_kernel<<<(unsigned)cdiv(total, 256), 256, 0, s>>>(src, lds, src_rows, p);
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
                             const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg, cudaStream_t s) {
  const int64_t n = nw * (overlap ? 2 * m : m) * width;
  if (n <= 0) return cudaSuccess;
  compress_windows_kernel<<<(unsigned)cdiv(n, 256), 256, 0, s>>>(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width,
                                                                  overlap, win_ids, ring_rows, nw, skv, sg);
  return cudaGetLastError();
}

namespace detail {
cudaError_t init_attributes_f32_ops() {
  return first_error({set_max_dynamic_smem(sink_attn_f32_v2_kernel<32, 1>, (size_t)(4 * sa2_smem_floats(512, 32))),
                      set_max_dynamic_smem(sink_attn_f32_v2_kernel<16, 2>, (size_t)(4 * sa2_smem_floats(1024, 16)))});
}
}  // namespace detail

}  // namespace deepinfer::cuda
