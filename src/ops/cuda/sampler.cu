// GPU sampler (Backend::sample_rows): the host sampler's token (ops/sampling.h), bit for bit — the
// arithmetic is sample_math.h's, and every sum is of integers, so the parallel order cannot change a result.
// A row is swept by a cluster of C blocks of 512 threads (C = 1 … 16 by M, so that small batches use many
// SMs: one block sweeping a 129k row was ~120 µs for temperature alone, 455 µs with top-p on a flat row);
// each block takes every C-th run of 512 four-id groups, and after each sweep the blocks' partial results
// (best, counts, integer masses, a bin's keys) are summed through distributed shared memory, every block
// summing all ranks for itself, so that every block holds the same values and takes the same decisions:
//   A  NaN / +inf check, the argmax of x (greedy rows stop here), the finite count; m = scale(max x);
//   B  (filtered rows) bins of d = m − s, 1/16 wide below 24 (bin 384: 24 or farther): the tokens' count and
//      their quantized mass q (0 from 24 on, sample_math.h);
//   top-k: the bin of the k-th best token, its tokens sorted → the k-th (value, id) key, then B again over
//      the top-k set; top-p: the last bin whose best token is kept, sorted and scanned → the worst kept key;
//   D  Gumbel-max over the kept tokens less than 24 below m (no farther token can win or has mass).
// A cut that falls in a bin of more than SCAP tokens (a nearly flat row) is found by radix refinement instead
// of a sort: its 64-bit key 8 bits at a time, one sweep a digit (radix_cut). Every row is decided here.
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_attrs.h"
#include "ops/sample_math.h"

namespace deepinfer::cuda {
namespace {

namespace sm = deepinfer::sampling;
namespace cg = cooperative_groups;
constexpr int SRT = 512, SW = SRT / 32;
constexpr int NBQ = 384, NB = NBQ + 1;  // bins with mass (d < 24), and all bins (the last: d ≥ 24)
constexpr int BPL = (NB + 31) / 32;     // bins a lane in the warp scans over the bins
constexpr int SCAP = 8192;              // tokens of one bin the block can sort
constexpr int SIPT = SCAP / SRT;        // their places a thread in the top-p scan
constexpr int kMaxCluster = 16;         // blocks a row at most (16: the non-portable cluster size)
using ull = unsigned long long;
using SampleScan = cub::BlockScan<ull, SRT>;

struct SampleShared {
  union {
    struct {
      ull mass[SW][NBQ];  // per warp: Σ q of its tokens in each bin
      int cnt[SW][NB];    // per warp: its tokens in each bin
    } h;
    struct {
      ull cand[SCAP];  // one bin's (value, id) keys, sorted best first
      ull q[SCAP];     // this block's keys of the bin while they are gathered; then their masses (top-p)
    } c;
    struct {
      ull mass[SW][256];  // per warp: Σ q of the tokens with each value of the key's next digit
      int cnt[SW][256];   // per warp: their count
    } r;
  } u;
  ull dig_mass[256], dig_mass_loc[256];  // radix_cut: the row's sums of u.r, and this block's (read by the cluster)
  int dig_cnt[256], dig_cnt_loc[256];
  ull bin_mass[NB], bin_mass_loc[NB];  // the row's bins, and this block's
  int bin_cnt[NB], bin_cnt_loc[NB];
  float g_hi[256];  // a bound on the Gumbel noise of the words with each top byte (the draw's pruning)
  typename SampleScan::TempStorage scan;
  float wv[SW];
  int wi[SW], wb[SW], wf[SW];
  float pv;  // this block's part of a cluster reduction: best value, its id, NaN / +inf seen, finite count
  int pi, pbad, pfin;
  float rv;  // the row's (after the reduction)
  int ri, rbad, rfin;
  int nloc;  // gather_bin: this block's keys in u.c.q
  int ncand, last, flag;
  ull key;
  long long limit;  // the top-p limit
};
static_assert(SRT >= 256, "radix_cut sums its 256 digits a thread each");

// The row's blocks: C of them, this one `rank`.
struct Part {
  int C, rank;
};
// Every thread of every block of the cluster arrives (C = 1: the block's barrier).
__device__ __forceinline__ void part_sync(const Part& P) {
  if (P.C > 1) cg::this_cluster().sync();
  else __syncthreads();
}
// Block r's copy of a shared variable of this block.
template <class T>
__device__ __forceinline__ T* at_rank(T* p, const Part& P, int r) {
  return P.C > 1 ? cg::this_cluster().map_shared_rank(p, (unsigned)r) : p;
}
// out[i] = Σ over the row's blocks of loc[i], i < n, in every block. Between two barriers: every block's loc is
// complete before the first, and read by all before the second (it may be rewritten, the block may exit).
// Two arrays of n (counts ca, masses qa) at once.
__device__ __forceinline__ void part_sum(int* ca, int* cout, ull* qa, ull* qout, int n, const Part& P) {
  part_sync(P);
  for (int i = threadIdx.x; i < n; i += SRT) {
    int c = 0;
    ull q = 0;
    for (int r = 0; r < P.C; ++r) c += at_rank(ca, P, r)[i], q += at_rank(qa, P, r)[i];
    cout[i] = c, qout[i] = q;
  }
  part_sync(P);
}

// (value, id) key of a token: larger = better (value desc, then id asc).
__device__ __forceinline__ ull comp_key(float s, int64_t i) {
  return ((ull)sm::order_key(s) << 32) | (ull)(0xFFFFFFFFu - (uint32_t)i);
}
__device__ __forceinline__ int bin_of(float s, float m) {
  const float d = __fsub_rn(m, s);
  return d < sm::kReach ? (int)__fmul_rn(d, 16.0f) : NBQ;
}
// The sub-bin of a token of a bin below the reach: 1/4096 nat wide, floor(4096 d) − 256·bin in [0, 256) (the
// products by powers of two are exact), so better tokens are in the same or a lower sub-bin.
__device__ __forceinline__ int sub_of(float s, float m) {
  const float d = __fsub_rn(m, s);
  return (int)__fmul_rn(d, 4096.0f) - 256 * (int)__fmul_rn(d, 16.0f);
}
// This block's part of the row in groups of four consecutive ids: f(g, v) with v[r] = row[4g + r] (−inf past
// N, which every sweep skips); the row's groups in runs of SRT, run j to block j mod C; thread t takes group t
// of its block's runs, four runs' loads in flight, float4 loads when the row is 16-byte aligned.
template <class F>
__device__ __forceinline__ void row_groups(const float* __restrict__ row, int64_t N, const Part& P, F&& f) {
  const bool vec = ((uintptr_t)row & 15) == 0;
  const int64_t G = (N + 3) / 4, step = (int64_t)P.C * SRT;
  for (int64_t g0 = (int64_t)P.rank * SRT + threadIdx.x; g0 < G; g0 += 4 * step) {
    float v[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t g = g0 + u * step;
      if (vec && 4 * g + 3 < N) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(row) + g);
        v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) v[u][r] = g < G && 4 * g + r < N ? row[4 * g + r] : -INFINITY;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (g0 + u * step < G) f(g0 + u * step, v[u]);
  }
}

// Better of two (value, id) candidates: the larger value, then the lower id; id −1 = none yet.
__device__ __forceinline__ void better_of(float& bv, int& bi, float ov, int oi) {
  if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
}
// The row's best (value, id), NaN / +inf flag and finite count from every thread's; every thread gets them.
__device__ __forceinline__ void row_best(float& bv, int& bi, int& bad, int& fin, SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x, lane = tid & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    better_of(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    fin += __shfl_xor_sync(0xffffffffu, fin, o);
  }
  __syncthreads();  // every thread has read the last reduction's wv / wi
  if (lane == 0) sh.wv[tid >> 5] = bv, sh.wi[tid >> 5] = bi, sh.wb[tid >> 5] = bad, sh.wf[tid >> 5] = fin;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < SW; ++w) better_of(bv, bi, sh.wv[w], sh.wi[w]), bad |= sh.wb[w], fin += sh.wf[w];
    sh.pv = bv, sh.pi = bi, sh.pbad = bad, sh.pfin = fin;
  }
  part_sync(P);  // every block's part is published
  if (tid < 32) {
    float v = -INFINITY;
    int i = -1, b = 0, f = 0;
    if (lane < P.C) {
      v = *at_rank(&sh.pv, P, lane), i = *at_rank(&sh.pi, P, lane);
      b = *at_rank(&sh.pbad, P, lane), f = *at_rank(&sh.pfin, P, lane);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      better_of(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
      b |= __shfl_xor_sync(0xffffffffu, b, o);
      f += __shfl_xor_sync(0xffffffffu, f, o);
    }
    if (lane == 0) sh.rv = v, sh.ri = i, sh.rbad = b, sh.rfin = f;
  }
  part_sync(P);  // every block has read every part (and rv … is visible to the block)
  bv = sh.rv, bi = sh.ri, bad = sh.rbad, fin = sh.rfin;
}

// Sweep B: per-bin counts (and masses when `mass`) of the row's finite tokens with key ≥ kmin, into bin_cnt /
// bin_mass.
__device__ __forceinline__ void bin_sweep(const float* __restrict__ row, int64_t N, float T, float m, ull kmin, bool mass,
                                          SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x, w = tid >> 5;
  __syncthreads();  // (the union's last use is over)
  for (int j = tid; j < SW * NB; j += SRT) (&sh.u.h.cnt[0][0])[j] = 0;
  for (int j = tid; j < SW * NBQ; j += SRT) (&sh.u.h.mass[0][0])[j] = 0;
  __syncthreads();
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float s = sm::scale_logit(v[r], T);
      if (!(s > -INFINITY) || comp_key(s, 4 * g + r) < kmin) continue;
      const int b = bin_of(s, m);
      atomicAdd(&sh.u.h.cnt[w][b], 1);
      if (mass && b < NBQ) atomicAdd(&sh.u.h.mass[w][b], (ull)sm::mass_of(sm::rel_of(s, m)));
    }
  });
  __syncthreads();
  for (int b = tid; b < NB; b += SRT) {
    int c = 0;
    ull q = 0;
    for (int v = 0; v < SW; ++v) c += sh.u.h.cnt[v][b], q += b < NBQ ? sh.u.h.mass[v][b] : 0ull;
    sh.bin_cnt_loc[b] = c, sh.bin_mass_loc[b] = q;
  }
  part_sum(sh.bin_cnt_loc, sh.bin_cnt, sh.bin_mass_loc, sh.bin_mass, NB, P);
}

// The keys (≥ kmin) of bin `bin`'s finite tokens of the row (bin < 0: of every bin; sub ≥ 0: of its sub-bin `sub`
// only) into cand,
// sorted best first; their count (≤ SCAP: the caller checked the count). Slots past it hold 0, below every
// token's key.
__device__ __forceinline__ int gather_bin(const float* __restrict__ row, int64_t N, float T, float m, ull kmin, int bin,
                                          int sub, SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x;
  __syncthreads();  // every thread has read what the caller passed through shared memory
  if (tid == 0) sh.nloc = 0;
  __syncthreads();
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float s = sm::scale_logit(v[r], T);
      if (!(s > -INFINITY) || (bin >= 0 && bin_of(s, m) != bin) || (sub >= 0 && sub_of(s, m) != sub)) continue;
      const ull k = comp_key(s, 4 * g + r);
      if (k >= kmin) sh.u.c.q[atomicAdd(&sh.nloc, 1)] = k;
    }
  });
  part_sync(P);  // every block's keys are in its q
  int n = 0;
  for (int r = 0; r < P.C; ++r) {  // rank r's keys to cand[n, n + its count)
    const int nr = *at_rank(&sh.nloc, P, r);
    const ull* qr = at_rank(sh.u.c.q, P, r);
    for (int j = tid; j < nr; j += SRT) sh.u.c.cand[n + j] = qr[j];
    n += nr;
  }
  int Pw = 1;
  while (Pw < n) Pw <<= 1;
  for (int j = n + tid; j < Pw; j += SRT) sh.u.c.cand[j] = 0;
  part_sync(P);  // every block has its copy (q may be rewritten)
  for (int size = 2; size <= Pw; size <<= 1)  // bitonic, descending
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < Pw; i += SRT) {
        const int p = i ^ stride;
        if (p > i) {
          const ull a = sh.u.c.cand[i], c = sh.u.c.cand[p];
          if (((i & size) == 0) == (a < c)) sh.u.c.cand[i] = c, sh.u.c.cand[p] = a;
        }
      }
      __syncthreads();
    }
  return n;
}

// One sweep over the row's tokens of bin `bin` with key ≥ kmin: per-digit counts (and masses when `mass`) into
// dig_cnt / dig_mass, the digit of a token being digit_of(s, key) in [0, 256), or −1 to leave it out (radix_cut's
// key digits, sub_sweep's sub-bins).
template <class DigitOf>
__device__ __forceinline__ void digit_sweep(const float* __restrict__ row, int64_t N, float T, float m, ull kmin,
                                            int bin, bool mass, SampleShared& sh, const Part& P, DigitOf digit_of) {
  const int tid = threadIdx.x, w = tid >> 5;
  __syncthreads();  // every thread has read the last results (and the caller's shared values); the union is free
  for (int j = tid; j < SW * 256; j += SRT) (&sh.u.r.cnt[0][0])[j] = 0, (&sh.u.r.mass[0][0])[j] = 0;
  __syncthreads();
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float s = sm::scale_logit(v[r], T);
      if (!(s > -INFINITY) || bin_of(s, m) != bin) continue;
      const ull k = comp_key(s, 4 * g + r);
      if (k < kmin) continue;
      const int d = digit_of(s, k);
      if (d < 0) continue;
      atomicAdd(&sh.u.r.cnt[w][d], 1);
      if (mass) atomicAdd(&sh.u.r.mass[w][d], (ull)sm::mass_of(sm::rel_of(s, m)));
    }
  });
  __syncthreads();
  if (tid < 256) {
    int c = 0;
    ull q = 0;
    for (int v = 0; v < SW; ++v) c += sh.u.r.cnt[v][tid], q += sh.u.r.mass[v][tid];
    sh.dig_cnt_loc[tid] = c, sh.dig_mass_loc[tid] = q;
  }
  part_sum(sh.dig_cnt_loc, sh.dig_cnt, sh.dig_mass_loc, sh.dig_mass, 256, P);
}

// The cut among the row's tokens of bin `bin` with key ≥ kmin when there are too many to sort: their keys are
// unique (the id is in them), so the cut's key is found one 8-bit digit at a time from the top, each digit by
// a sweep that counts (and, for top-p, weighs) the tokens whose key agrees with the digits found so far.
// top-k (topp false): the key at place `place` (0 = best). top-p: the worst key whose mass before it (E0, the
// mass of the better bins, plus that of the better tokens of the bin) is ≤ limit — the sort-and-scan rule of
// the top-p cut, which holds for a digit's first token exactly when it holds for the digit. At least one
// token qualifies (the caller chose the bin so). Eight sweeps: only for nearly flat rows.
__device__ ull radix_cut(const float* __restrict__ row, int64_t N, float T, float m, ull kmin, int bin, bool topp,
                         int64_t place, ull E0, int64_t limit, SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x;
  ull prefix = 0;  // the key's digits above `shift`
  for (int shift = 56; shift >= 0; shift -= 8) {
    const ull hi = shift == 56 ? 0ull : ~0ull << (shift + 8);
    digit_sweep(row, N, T, m, kmin, bin, topp, sh, P,
                [&](float, ull k) { return (k & hi) != prefix ? -1 : (int)((k >> shift) & 255); });
    if (tid == 0) {  // the digits best first: the larger digit is the better key
      int chosen = -1;
      if (!topp) {
        for (int d = 255; d >= 0; --d) {
          if (place < sh.dig_cnt[d]) {
            chosen = d;
            break;
          }
          place -= sh.dig_cnt[d];
        }
      } else {
        ull E = E0, Ech = E0;
        for (int d = 255; d >= 0; --d) {
          if (sh.dig_cnt[d] == 0) continue;
          if ((int64_t)E > limit) break;
          chosen = d, Ech = E;
          E += sh.dig_mass[d];
        }
        E0 = Ech;
      }
      sh.key = prefix | ((ull)(chosen < 0 ? 0 : chosen) << shift);
    }
    __syncthreads();
    prefix = sh.key;
  }
  return prefix;
}

// The scaled value of a key's token.
__device__ __forceinline__ float key_value(ull k) {
  const uint32_t o = (uint32_t)(k >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

// Warp 0 (every lane calls): the top-k cut's bin — the first bin where the count of the bins up to it reaches
// k — over lanes of BPL consecutive bins (a scan of their counts); sh.ncand = the bin, sh.last = the k-th
// token's place in it, sh.flag = 0 (no cut: the bin is the one beyond the reach) or 1.
__device__ __forceinline__ void topk_bin(int k, SampleShared& sh) {
  const int lane = threadIdx.x & 31, b0 = lane * BPL;
  int own = 0;
  for (int j = 0; j < BPL; ++j) own += b0 + j < NB ? sh.bin_cnt[b0 + j] : 0;
  int incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  int before = incl - own, found = NB, place = 0;
  for (int j = 0; j < BPL && found == NB; ++j) {
    const int b = b0 + j;
    if (b >= NB) break;
    if (before + sh.bin_cnt[b] >= k) found = b, place = k - before - 1;
    else before += sh.bin_cnt[b];
  }
  const unsigned hit = __ballot_sync(0xffffffffu, found < NB);
  const int src = hit ? __ffs((int)hit) - 1 : 0;
  const int bk = hit ? __shfl_sync(0xffffffffu, found, src) : NBQ;
  const int pl = __shfl_sync(0xffffffffu, place, src);
  if (lane == 0) {
    // A cut 24 or more below m leaves out only tokens without mass that cannot win: no cut needed.
    sh.flag = bk != NBQ;
    sh.last = pl;
    sh.ncand = bk;
  }
}

// Warp 0 (every lane calls): the top-p cut's bin — the last non-empty bin whose mass before it, E, is within
// the limit (E only grows, so these bins are a prefix of the non-empty ones; the first has E = 0) — from a scan
// of the lanes' masses; sh.ncand = the bin, sh.key = its E, sh.limit.
__device__ __forceinline__ void topp_bin(float top_p, SampleShared& sh) {
  const int lane = threadIdx.x & 31, b0 = lane * BPL;
  ull own = 0;
  for (int j = 0; j < BPL; ++j) own += b0 + j < NBQ ? sh.bin_mass[b0 + j] : 0ull;
  ull incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const ull y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const ull Z = __shfl_sync(0xffffffffu, incl, 31);
  const int64_t limit = sm::top_p_limit(top_p, Z);
  ull E = incl - own, Ebp = 0;
  int bp = -1;
  for (int j = 0; j < BPL; ++j) {
    const int b = b0 + j;
    if (b >= NBQ) break;
    if (sh.bin_cnt[b] > 0 && (int64_t)E <= limit) bp = b, Ebp = E;
    E += sh.bin_mass[b];
  }
  const int best = __reduce_max_sync(0xffffffffu, bp);
  const int src = best < 0 ? 0 : best / BPL;
  const ull Eb = __shfl_sync(0xffffffffu, Ebp, src);
  if (lane == 0) {
    const int b = best < 0 ? 0 : best;
    sh.ncand = b;
    sh.key = best < 0 ? 0 : Eb;
    sh.limit = limit;
  }
}

// Per sub-bin counts (and masses when `mass`) of the row's tokens of bin `bin` with key ≥ kmin, into dig_cnt /
// dig_mass (radix_cut's arrays: the two are never used at once).
__device__ void sub_sweep(const float* __restrict__ row, int64_t N, float T, float m, ull kmin, int bin, bool mass,
                          SampleShared& sh, const Part& P) {
  digit_sweep(row, N, T, m, kmin, bin, mass, sh, P, [&](float s, ull) { return sub_of(s, m); });
}

// Warp 0 (every lane calls): the cut's sub-bin from dig_cnt / dig_mass (sub-bin 0 best), lanes of 8 after a scan.
// top-k: the sub-bin holding place `place` of the bin, sh.last = the place within it. top-p: the last non-empty
// sub-bin whose E = E0 + the mass of the better sub-bins is ≤ limit (the first non-empty one qualifies: E0 ≤
// limit), sh.key = its E. sh.ncand = the sub-bin.
__device__ __forceinline__ void pick_sub(bool topp, int place, ull E0, int64_t limit, SampleShared& sh) {
  const int lane = threadIdx.x & 31, i0 = lane * 8;
  int idx = -1;
  if (!topp) {
    int own = 0;
    for (int j = 0; j < 8; ++j) own += sh.dig_cnt[i0 + j];
    int incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    int before = incl - own, pl = 0;
    for (int j = 0; j < 8 && idx < 0; ++j) {
      if (place < before + sh.dig_cnt[i0 + j]) idx = i0 + j, pl = place - before;
      else before += sh.dig_cnt[i0 + j];
    }
    const unsigned hit = __ballot_sync(0xffffffffu, idx >= 0);
    const int src = hit ? __ffs((int)hit) - 1 : 0;
    idx = __shfl_sync(0xffffffffu, idx, src), pl = __shfl_sync(0xffffffffu, pl, src);
    if (lane == 0) sh.ncand = idx < 0 ? 0 : idx, sh.last = pl;
  } else {
    ull own = 0;
    for (int j = 0; j < 8; ++j) own += sh.dig_mass[i0 + j];
    ull incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const ull y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    ull E = E0 + incl - own, Eb = 0;
    for (int j = 0; j < 8; ++j) {
      if (sh.dig_cnt[i0 + j] > 0 && (int64_t)E <= limit) idx = i0 + j, Eb = E;
      E += sh.dig_mass[i0 + j];
    }
    const int best = __reduce_max_sync(0xffffffffu, idx);
    Eb = __shfl_sync(0xffffffffu, Eb, best < 0 ? 0 : best / 8);
    if (lane == 0) sh.ncand = best < 0 ? 0 : best, sh.key = best < 0 ? E0 : Eb;
  }
}

// Bins of up to this many tokens are sorted whole; fuller ones are split into sub-bins first (a bitonic sort of
// 8192 keys by one block is ~90 dependent stages, tens of µs: s18-run2 measured 151 µs for a flat top-p row).
constexpr int kSortWhole = 512;

// The cut's key in bin `bin` (bin_cnt[bin] of its tokens have key ≥ kmin). top-k (topp false): the key at place
// `place` of the bin (0 = best). top-p: the worst key whose mass before it (E0, the better bins' mass, plus the
// bin's better tokens') is ≤ limit. A full bin is split into 256 sub-bins by one more sweep, and only the cut's
// sub-bin is gathered and sorted; a sub-bin of more than SCAP tokens (a row of nearly one value) takes radix_cut
// over the whole bin. The bin past the reach (NBQ, top-k only) is sorted whole, or by radix_cut beyond SCAP.
__device__ ull cut_key(const float* __restrict__ row, int64_t N, float T, float m, ull kmin, int bin, bool topp,
                       int place, ull E0, int64_t limit, SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x;
  int sub = -1, pl = place;
  ull E = E0;
  if (bin == NBQ) {  // the bin past the reach (logprob_rows' top list only) has no sub-bins
    if (sh.bin_cnt[bin] > SCAP) return radix_cut(row, N, T, m, kmin, bin, topp, place, E0, limit, sh, P);
  } else if (sh.bin_cnt[bin] > kSortWhole) {
    sub_sweep(row, N, T, m, kmin, bin, topp, sh, P);
    if (tid < 32) pick_sub(topp, place, E0, limit, sh);
    __syncthreads();
    sub = sh.ncand, pl = sh.last, E = sh.key;
    if (sh.dig_cnt[sub] > SCAP) return radix_cut(row, N, T, m, kmin, bin, topp, place, E0, limit, sh, P);
  }
  const int n = gather_bin(row, N, T, m, kmin, bin, sub, sh, P);
  if (!topp) {
    const ull k = sh.u.c.cand[pl];
    __syncthreads();  // (every thread has read it before the union's next use)
    return k;
  }
  // The masses before each place in sorted order: a thread's SIPT consecutive places after the exclusive sum of
  // the threads before it (integers: the order of the sums is immaterial).
  for (int p = tid; p < n; p += SRT) sh.u.c.q[p] = sm::mass_of(sm::rel_of(key_value(sh.u.c.cand[p]), m));
  if (tid == 0) sh.last = 0;
  __syncthreads();
  ull own = 0;
  for (int j = 0; j < SIPT; ++j) {
    const int p = tid * SIPT + j;
    own += p < n ? sh.u.c.q[p] : 0ull;
  }
  ull Ep;
  SampleScan(sh.scan).ExclusiveSum(own, Ep);
  int last = -1;  // the worst place whose mass before it keeps it (a prefix: that mass only grows)
  for (int j = 0; j < SIPT; ++j) {
    const int p = tid * SIPT + j;
    if (p >= n || (int64_t)(E + Ep) > limit) break;
    last = p;
    Ep += sh.u.c.q[p];
  }
  if (last >= 0) atomicMax(&sh.last, last);
  __syncthreads();
  const ull k = sh.u.c.cand[sh.last];
  __syncthreads();
  return k;
}

__global__ void __launch_bounds__(SRT) sample_rows_kernel(const float* __restrict__ x, int64_t N, int64_t ld,
                                                          const SampleSpec* __restrict__ spec,
                                                          int32_t* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char sample_smem[];
  SampleShared& sh = *reinterpret_cast<SampleShared*>(sample_smem);
  const Part P{(int)cg::this_cluster().num_blocks(), (int)cg::this_cluster().block_rank()};
  const int64_t rowi = blockIdx.x / P.C;
  const int tid = threadIdx.x;
  // The noise bounds (constants: before the wait): g_hi[t] ≥ the noise of every word with top byte t — the
  // noise of the byte's largest word (it grows with the word) plus a margin far above det_log's few-ulp
  // departures from monotonicity.
  if (tid < 256) sh.g_hi[tid] = __fadd_rn(sm::gumbel_from_word(((uint32_t)tid << 24) | 0x00FFFFFFu), 1e-3f);
  DI_PDL_WAIT();
  const float* row = x + rowi * ld;
  const SampleSpec sp = spec[rowi];

  // A: the NaN / +inf check, the greedy pick (the argmax of x, ties to the lower id), the finite count.
  float bv = -INFINITY;
  int bi = -1, bad = 0, nfin = 0;
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {  // ascending ids: strict > keeps the lowest
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      bad |= isnan(v[r]) || v[r] == INFINITY;
      nfin += v[r] > -INFINITY;
      if (v[r] > bv) bv = v[r], bi = (int)(4 * g + r);
    }
  });
  row_best(bv, bi, bad, nfin, sh, P);
  const float T = sp.temperature;
  if (bad || bi < 0 || !(T > 0.0f)) {
    if (tid == 0 && P.rank == 0) out[rowi] = bad ? -2 : bi;
    return;
  }
  const float m = sm::scale_logit(bv, T);  // division and the clamps are monotone: the max of the scaled
  const bool filtered = (sp.top_k > 0 && (int64_t)sp.top_k < N) || sp.top_p < 1.0f || sp.min_p > 0.0f;

  ull kset = 0;                // top-k set: keys ≥ kset
  ull kcut = 0;                // top-p: kept keys ≥ kcut (and q > 0)
  bool use_top_p = false;
  if (filtered) {
    const int total = nfin;
    const bool topk = sp.top_k > 0 && (int64_t)sp.top_k < total;
    const int64_t set_size = topk ? sp.top_k : total;
    use_top_p = sp.top_p < 1.0f && set_size > 1;
    bin_sweep(row, N, T, m, 0, !topk, sh, P);
    if (topk) {
      if (tid < 32) topk_bin(sp.top_k, sh);
      __syncthreads();
      const int flag = sh.flag, place = sh.last, bk = sh.ncand;
      if (flag) kset = cut_key(row, N, T, m, 0, bk, false, place, 0, 0, sh, P);
      if (use_top_p) bin_sweep(row, N, T, m, kset, true, sh, P);
    }
    if (use_top_p) {
      __syncthreads();  // (topk: every thread has read the cut's key and flags)
      if (tid < 32) topp_bin(sp.top_p, sh);
      __syncthreads();
      const int bp = sh.ncand;
      const ull Ebp = sh.key;
      const int64_t limit = sh.limit;
      kcut = cut_key(row, N, T, m, kset, bp, true, 0, Ebp, limit, sh, P);
    }
  }

  // D: Gumbel-max over the kept tokens within reach of m; four consecutive ids a thread share a Philox call.
  // Exact pruning: a token whose value plus its noise bound (g_hi of its word's top byte, or of any word) is
  // below the thread's best score so far cannot win (rounding is monotone), so most tokens skip det_log.
  const PhiloxKey pk = philox_key(sp.key);
  const bool minp = filtered && sp.min_p > 0.0f;
  const float gmax = sh.g_hi[255];
  bv = -INFINITY, bi = -1;
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {
    bool keep[4];
    float sv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = 4 * g + r;
      const float s = sm::scale_logit(v[r], T);
      sv[r] = s;
      keep[r] = s > -INFINITY && bin_of(s, m) != NBQ && !(__fadd_rn(s, gmax) < bv);
      if (keep[r] && filtered) {
        const ull k = comp_key(s, i);
        keep[r] = k >= kset && k >= kcut;
        if (keep[r] && (use_top_p || minp)) {
          const float rel = sm::rel_of(s, m);
          keep[r] = !(use_top_p && sm::mass_of(rel) == 0) && !(minp && !(rel >= sp.min_p));
        }
      }
    }
    if (!(keep[0] || keep[1] || keep[2] || keep[3])) return;
    const PhiloxCounter w = philox4x32_10(
        {(uint32_t)sp.position, (uint32_t)RngStream::kSample, (uint32_t)g, (uint32_t)(sp.position >> 32)}, pk);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (keep[r] && !(__fadd_rn(sv[r], sh.g_hi[w[r] >> 24]) < bv))
        better_of(bv, bi, __fadd_rn(sv[r], sm::gumbel_from_word(w[r])), (int)(4 * g + r));
  });
  int b0 = 0, f0 = 0;
  row_best(bv, bi, b0, f0, sh, P);
  if (tid == 0 && P.rank == 0) out[rowi] = bi;
}

}  // namespace

namespace {
// The rows' logit processors, in place (apply_edits), before the sampler reads the rows through the read-only
// path (a kernel of its own: a kernel may not write what it reads with ld.global.nc). One block a row.
__global__ void __launch_bounds__(256) apply_edits_kernel(float* __restrict__ x, int64_t N, int64_t ld,
                                                          const RowEdits* __restrict__ rows,
                                                          const LogitEdit* __restrict__ edits,
                                                          float* __restrict__ raw, const int32_t* __restrict__ tokens) {
  DI_PDL_WAIT();
  const RowEdits r = rows[blockIdx.x];
  float* row = x + (int64_t)blockIdx.x * ld;
  __shared__ int jt_s;
  // The pending token (RowEdits::pend) and its entry in the row's list (ascending ids: a binary search), which
  // the loop below leaves to thread 0.
  const int32_t t = r.pend > 0 && tokens ? tokens[r.pend - 1] : -1;
  const bool has_t = t >= 0 && t < N;
  if (threadIdx.x == 0) jt_s = has_t ? sm::find_id(edits, r.first, r.count, t) : -1;
  __syncthreads();
  const int jt = jt_s;
  auto edit_one = [&](int32_t id, uint32_t flags, float bias, int32_t count, int32_t slot) {
    const float v = row[id];
    raw[r.first + slot] = v;
    if (!isnan(v) && v != INFINITY)  // a NaN / +inf stays: the row answers −2, as the host rejects it
      row[id] = sm::edit_logit(v, flags, bias, count, r.rep, r.freq, r.presence);
  };
  for (int j = threadIdx.x; j < r.count; j += blockDim.x) {
    const LogitEdit e = edits[r.first + j];  // one edit an id: no two threads write the same logit
    if (e.id < 0 || e.id >= N || j == jt) continue;
    edit_one(e.id, e.flags, e.bias, e.count, j);
  }
  if (threadIdx.x == 0 && r.pend > 0) raw[r.first + r.count + 1] = __int_as_float(has_t && jt < 0 ? t : -1);
  if (threadIdx.x == 0 && has_t) {
    LogitEdit e = jt >= 0 ? edits[r.first + jt] : LogitEdit{t, 0.0f, 0, 0u};
    sm::pending_edit(e.flags, e.count, r.rep, r.freq, r.presence);
    edit_one(t, e.flags, e.bias, e.count, jt >= 0 ? jt : r.count);
  }
}
}  // namespace

namespace {
// The edits' raw values back into the rows that want logprobs (restore_edits), after the pick: one block a row. The
// entries' ids are distinct, and a pending token without an entry has none of theirs.
__global__ void __launch_bounds__(256) restore_edits_kernel(float* __restrict__ x, int64_t N, int64_t ld,
                                                            const SampleSpec* __restrict__ spec,
                                                            const RowEdits* __restrict__ rows,
                                                            const LogitEdit* __restrict__ edits,
                                                            const float* __restrict__ raw) {
  DI_PDL_WAIT();
  if (spec[blockIdx.x].logprobs < 0) return;
  const RowEdits r = rows[blockIdx.x];
  float* row = x + (int64_t)blockIdx.x * ld;
  for (int j = threadIdx.x; j < r.count; j += blockDim.x) {
    const int32_t id = edits[r.first + j].id;
    if (id >= 0 && id < N) row[id] = raw[r.first + j];
  }
  if (threadIdx.x == 0 && r.pend > 0) {
    const int32_t id = __float_as_int(raw[r.first + r.count + 1]);
    if (id >= 0 && id < N) row[id] = raw[r.first + r.count];
  }
}

// Σ over the row's blocks of every thread's v (integers: the order is immaterial); every thread gets it.
__device__ __forceinline__ ull row_total(ull v, SampleShared& sh, const Part& P) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // (the last readers of dig_*_loc are done)
  if ((tid & 31) == 0) sh.dig_mass_loc[tid >> 5] = v;
  __syncthreads();
  if (tid == 0) {
    ull t = 0;
    for (int w = 0; w < SW; ++w) t += sh.dig_mass_loc[w];
    sh.dig_mass_loc[0] = t, sh.dig_cnt_loc[0] = 0;
  }
  part_sum(sh.dig_cnt_loc, sh.dig_cnt, sh.dig_mass_loc, sh.dig_mass, 1, P);
  return sh.dig_mass[0];
}

// Raw logprobs of the rows with spec.logprobs ≥ 0 (row_logprobs, bit for bit): a cluster a row as sample_rows.
//   A  NaN / +inf check, the max m, the finite count;
//   B  Z = Σ lp_mass (integers), log Z;
//   C  the top n: the n-th best key by sample_rows' top-k cut (bins of m − x, then its sub-bin or radix_cut), then
//      every key at or above it gathered and sorted (n ≤ 20 tokens); fewer finite tokens than n: all of them, then
//      the lowest ids of the −inf ones.
__global__ void __launch_bounds__(SRT) logprob_rows_kernel(const float* __restrict__ x, int64_t N, int64_t ld,
                                                           const SampleSpec* __restrict__ spec,
                                                           const int32_t* __restrict__ picks,
                                                           RowLogprobs* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char sample_smem[];
  SampleShared& sh = *reinterpret_cast<SampleShared*>(sample_smem);
  const Part P{(int)cg::this_cluster().num_blocks(), (int)cg::this_cluster().block_rank()};
  const int64_t rowi = blockIdx.x / P.C;
  const int tid = threadIdx.x;
  DI_PDL_WAIT();
  const int want = spec[rowi].logprobs;  // the same in every block of the row: they all leave here or none
  if (want < 0) return;
  const float* row = x + rowi * ld;
  RowLogprobs& o = out[rowi];
  const bool writer = tid == 0 && P.rank == 0;

  float bv = -INFINITY;
  int bi = -1, bad = 0, nfin = 0;
  row_groups(row, N, P, [&](int64_t g, const float (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      bad |= isnan(v[r]) || v[r] == INFINITY;
      nfin += v[r] > -INFINITY;
      if (v[r] > bv) bv = v[r], bi = (int)(4 * g + r);
    }
  });
  row_best(bv, bi, bad, nfin, sh, P);
  const int n = (int)(want < kMaxLogprobs ? (want < N ? want : N) : (kMaxLogprobs < N ? kMaxLogprobs : N));
  if (bad) {  // (ids / lps left as they were: readers take n entries)
    if (writer) o.token = __int_as_float(0x7fc00000), o.n = 0;
    return;
  }
  const int32_t pick = picks[rowi];
  if (bi < 0) {  // every value −inf: so is every logprob, and the top ids are the lowest
    if (writer) {
      o.token = -INFINITY, o.n = n;
      for (int j = 0; j < n; ++j) o.ids[j] = j, o.lps[j] = -INFINITY;
    }
    return;
  }
  const float m = bv;
  const int shift = sm::lp_shift(N);
  ull z = 0;
  row_groups(row, N, P, [&](int64_t, const float (&v)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (v[r] > -INFINITY) z += sm::lp_mass(v[r], m, shift);
  });
  const double log_z = sm::lp_log_z(row_total(z, sh, P), shift);

  int ntop = 0;  // the top keys in sh.u.c.cand, best first
  if (n > 0) {
    ull kset = 0;
    if (n < nfin) {
      bin_sweep(row, N, 1.0f, m, 0, false, sh, P);  // (x / 1 is x: the keys are the raw values')
      if (tid < 32) topk_bin(n, sh);
      __syncthreads();
      const int bk = sh.ncand, place = sh.last;
      kset = cut_key(row, N, 1.0f, m, 0, bk, false, place, 0, 0, sh, P);
    }
    ntop = gather_bin(row, N, 1.0f, m, kset, -1, -1, sh, P);  // min(n, nfin) keys
  }
  if (P.rank != 0) return;
  if (ntop > n) ntop = n;  // (never: the keys are unique and kset is the n-th; a guard for the list's bounds)
  if (tid < ntop) {
    const ull k = sh.u.c.cand[tid];
    o.ids[tid] = (int32_t)(0xFFFFFFFFu - (uint32_t)k);
    o.lps[tid] = sm::logprob_of(key_value(k), m, log_z);
  }
  if (tid == 0) {
    o.n = n;
    o.token = pick >= 0 && pick < N ? sm::logprob_of(row[pick], m, log_z) : -INFINITY;
    for (int64_t i = 0, j = ntop; j < n && i < N; ++i)  // fewer finite tokens than n: the lowest −inf ids
      if (!(row[i] > -INFINITY)) o.ids[j] = (int32_t)i, o.lps[j] = -INFINITY, ++j;
  }
}
}  // namespace

// Blocks a row (a cluster) for `kern` with `smem` bytes of dynamic shared memory: the largest power of two ≤ 16
// with M·C ≤ the SMs, 16 only where a cluster of 16 fits the device. The token does not depend on it (integer
// sums, a total order for the best).
// A launch of `blocks` blocks in clusters of C (cfg points into it: keep it in place).
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute at[1];
  ClusterLaunch(int64_t blocks, int C, int threads, size_t smem, cudaStream_t s) {
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)C, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
};
template <class Kern>
int row_cluster(int64_t M, Kern* kern, int threads, size_t smem) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  int C = 1;
  while (C < kMaxCluster && M * C * 2 <= sms) C *= 2;
  if (C == kMaxCluster) {
    const ClusterLaunch L(C, C, threads, smem, nullptr);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kern, &L.cfg) != cudaSuccess || n < 1) {
      (void)cudaGetLastError();  // (a failed query leaves no error behind)
      C /= 2;
    }
  }
  return C;
}
// Launches `kern` on M rows of C blocks (clusters of C) with `threads` threads and `smem` bytes.
template <class Kern, class... Args>
cudaError_t launch_rows(int64_t M, int C, int threads, size_t smem, cudaStream_t s, Kern* kern, Args... args) {
  if (M * C > INT_MAX) return cudaErrorInvalidValue;
  const ClusterLaunch L(M * C, C, threads, smem, s);
  return cudaLaunchKernelEx(&L.cfg, kern, args...);
}

cudaError_t sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                        const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out,
                        cudaStream_t s) {
  if (N <= 0 || N > 0x7fffffff) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  if (rows) {
    if (!edits || !edit_raw) return cudaErrorInvalidValue;
    apply_edits_kernel<<<(unsigned)M, 256, 0, s>>>(x, N, ld, rows, edits, edit_raw, tokens);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int C = row_cluster(M, sample_rows_kernel, SRT, sizeof(SampleShared));
  return launch_rows(M, C, SRT, sizeof(SampleShared), s, sample_rows_kernel, (const float*)x, N, ld, spec, out);
}

namespace {
constexpr int kMaskSpan = 8192;  // tokens a block of mask_rows_kernel covers (256 words, one a thread)
// apply_mask on the rows with a mask: block (span, row) takes 8192 tokens — their 256 words into shared memory, one
// a thread, then token t + 256 j of the span by thread t (consecutive threads, consecutive floats).
__global__ void __launch_bounds__(256) mask_rows_kernel(float* __restrict__ x, int64_t N, int64_t ld,
                                                        const RowEdits* __restrict__ rows,
                                                        const uint32_t* __restrict__ masks) {
  __shared__ uint32_t words[kMaskSpan / 32];
  DI_PDL_WAIT();
  const int k = rows[blockIdx.y].mask;  // (the same for the whole block)
  if (k < 0) return;
  const int64_t W = (N + 31) / 32, w0 = (int64_t)blockIdx.x * (kMaskSpan / 32), i0 = 32 * w0;
  const int64_t w = w0 + threadIdx.x;
  words[threadIdx.x] = w < W ? masks[(int64_t)k * W + w] : 0xFFFFFFFFu;
  __syncthreads();
  float* row = x + (int64_t)blockIdx.y * ld;
  for (int t = threadIdx.x; t < kMaskSpan && i0 + t < N; t += 256) {
    if ((words[t >> 5] >> (t & 31)) & 1u) continue;
    const float v = row[i0 + t];
    if (!isnan(v) && v != INFINITY) row[i0 + t] = -INFINITY;
  }
}
}  // namespace

cudaError_t mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks,
                      cudaStream_t s) {
  if (N <= 0 || N > 0x7fffffff || M > 65535) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  const dim3 grid((unsigned)((N + kMaskSpan - 1) / kMaskSpan), (unsigned)M);
  mask_rows_kernel<<<grid, 256, 0, s>>>(x, N, ld, rows, masks);
  return cudaGetLastError();
}

cudaError_t logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                         const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out,
                         cudaStream_t s) {
  if (N <= 0 || N > 0x7fffffff) return cudaErrorInvalidValue;
  if (M <= 0) return cudaSuccess;
  if (rows) {
    if (!edits || !edit_raw) return cudaErrorInvalidValue;
    restore_edits_kernel<<<(unsigned)M, 256, 0, s>>>(x, N, ld, spec, rows, edits, edit_raw);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int C = row_cluster(M, logprob_rows_kernel, SRT, sizeof(SampleShared));
  return launch_rows(M, C, SRT, sizeof(SampleShared), s, logprob_rows_kernel, (const float*)x, N, ld, spec, picks, out);
}

namespace {
constexpr int ANT = 512;
// A row over a cluster of C blocks (as sample_rows: 17 µs a step at b1 for one block reading a 129k row): block
// `rank` takes the ids rank·ANT + t + j·C·ANT, ascending a thread; the blocks' bests meet in distributed shared
// memory (the best is a total order: the same id whatever C).
__global__ void __launch_bounds__(ANT) argmax_rows_kernel(const float* __restrict__ x, int64_t N, int64_t ld,
                                                          int32_t* __restrict__ out) {
  DI_PDL_WAIT();
  cg::cluster_group cl = cg::this_cluster();
  const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank(), tid = threadIdx.x;
  const int64_t m = blockIdx.x / C;
  const float* row = x + m * ld;
  float bv = -INFINITY;
  int bi = -1;
  int bad = 0;
  for (int64_t i = (int64_t)rank * ANT + tid; i < N; i += (int64_t)C * ANT) {  // ascending ids: strict > keeps the lowest
    const float v = row[i];
    bad |= isnan(v) || v == INFINITY;
    if (v > bv) bv = v, bi = (int)i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) better_of(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
  __shared__ float wv[ANT / 32];
  __shared__ int wi[ANT / 32];
  __shared__ float pv;  // this block's best, NaN / +inf flag (read by the cluster)
  __shared__ int pi, pb;
  if ((tid & 31) == 0) wv[tid >> 5] = bv, wi[tid >> 5] = bi;
  bad = __syncthreads_or(bad);
  if (tid == 0) {
    for (int w = 1; w < ANT / 32; ++w) better_of(bv, bi, wv[w], wi[w]);
    pv = bv, pi = bi, pb = bad;
  }
  if (C == 1) {
    if (tid == 0) out[m] = bad ? -2 : bi;
    return;
  }
  cl.sync();  // every block's best is published
  if (tid < 32) {
    float v = -INFINITY;
    int i = -1, b = 0;
    if (tid < C) v = *cl.map_shared_rank(&pv, tid), i = *cl.map_shared_rank(&pi, tid), b = *cl.map_shared_rank(&pb, tid);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      better_of(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
      b |= __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (tid == 0 && rank == 0) out[m] = b ? -2 : i;
  }
  cl.sync();  // no block leaves while another still reads its shared memory
}
}  // namespace

cudaError_t argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out, cudaStream_t s) {
  if (M <= 0) return cudaSuccess;
  const int C = row_cluster(M, argmax_rows_kernel, ANT, 0);
  return launch_rows(M, C, ANT, 0, s, argmax_rows_kernel, x, N, ld, out);
}

namespace detail {
cudaError_t init_attributes_sampler() {
  if (cudaError_t e = set_max_dynamic_smem(sample_rows_kernel, sizeof(SampleShared)); e != cudaSuccess) return e;
  if (cudaError_t e = cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = set_max_dynamic_smem(logprob_rows_kernel, sizeof(SampleShared)); e != cudaSuccess) return e;
  if (cudaError_t e = cudaFuncSetAttribute(logprob_rows_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      e != cudaSuccess)
    return e;
  return cudaFuncSetAttribute(argmax_rows_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}
}  // namespace detail

}  // namespace deepinfer::cuda
