// A serial model of the CUDA sampler's selection (src/ops/cuda/sampler.cu, sample_rows_kernel) against the
// definition it must equal bit for bit (ops/sampling.h sample_row). The kernel cannot run in CI (no GPU); this
// model follows its steps one for one — sweep A, the 1/16-nat bins of d = m − s, the top-k cut's bin, the top-p
// cut's bin, a bin sorted when it holds at most `cap` tokens and else cut by radix refinement (radix_cut), the
// Gumbel draw over kept tokens within the reach — with the sort capacity shrunk so that every path runs on
// small rows. A change to the kernel's algorithm belongs here too; test_cuda_ops checks the kernel itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/sample_math.h"
#include "ops/sampling.h"

namespace deepinfer {
namespace {

namespace sm = deepinfer::sampling;
using ull = unsigned long long;
constexpr int NBQ = 384, NB = NBQ + 1;  // bins with mass (d < 24), and all bins
constexpr int BPL = (NB + 31) / 32;     // bins a lane in the kernel's warp scans

ull comp_key(float s, int64_t i) { return ((ull)sm::order_key(s) << 32) | (ull)(0xFFFFFFFFu - (uint32_t)i); }
int bin_of(float s, float m) {
  const float d = sm::f_sub(m, s);
  return d < sm::kReach ? (int)sm::f_mul(d, 16.0f) : NBQ;
}
float key_value(ull k) {
  const uint32_t o = (uint32_t)(k >> 32);
  return sm::float_of((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

struct Bins {
  std::vector<int> cnt = std::vector<int>(NB);
  std::vector<ull> mass = std::vector<ull>(NB);
};
// bin_sweep: counts (and masses) of the finite tokens with key ≥ kmin.
Bins bin_sweep(const std::vector<float>& s, float m, ull kmin, bool mass) {
  Bins b;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!(s[i] > -INFINITY) || comp_key(s[i], (int64_t)i) < kmin) continue;
    const int k = bin_of(s[i], m);
    ++b.cnt[k];
    if (mass && k < NBQ) b.mass[k] += sm::mass_of(sm::rel_of(s[i], m));
  }
  return b;
}
// The sub-bin of a token below the reach (1/4096 nat; sub_of in the kernel).
int sub_of(float s, float m) {
  const float d = sm::f_sub(m, s);
  return (int)sm::f_mul(d, 4096.0f) - 256 * (int)sm::f_mul(d, 16.0f);
}
// gather_bin: the bin's keys (≥ kmin; sub ≥ 0: of that sub-bin only), sorted best first.
std::vector<ull> gather_bin(const std::vector<float>& s, float m, ull kmin, int bin, int sub = -1) {
  std::vector<ull> c;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] > -INFINITY && bin_of(s[i], m) == bin && (sub < 0 || sub_of(s[i], m) == sub) &&
        comp_key(s[i], (int64_t)i) >= kmin)
      c.push_back(comp_key(s[i], (int64_t)i));
  std::sort(c.begin(), c.end(), std::greater<ull>());
  return c;
}
// radix_cut, digit by digit as the kernel walks them.
ull radix_cut(const std::vector<float>& s, float m, ull kmin, int bin, bool topp, int64_t place, ull E0,
              int64_t limit) {
  ull prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const ull hi = shift == 56 ? 0ull : ~0ull << (shift + 8);
    std::vector<int> cnt(256);
    std::vector<ull> mass(256);
    for (size_t i = 0; i < s.size(); ++i) {
      if (!(s[i] > -INFINITY) || bin_of(s[i], m) != bin) continue;
      const ull k = comp_key(s[i], (int64_t)i);
      if (k < kmin || (k & hi) != prefix) continue;
      const int d = (int)((k >> shift) & 255);
      ++cnt[d];
      if (topp) mass[d] += sm::mass_of(sm::rel_of(s[i], m));
    }
    int chosen = -1;
    if (!topp) {
      for (int d = 255; d >= 0; --d) {
        if (place < cnt[d]) {
          chosen = d;
          break;
        }
        place -= cnt[d];
      }
    } else {
      ull E = E0, Ech = E0;
      for (int d = 255; d >= 0; --d) {
        if (cnt[d] == 0) continue;
        if ((int64_t)E > limit) break;
        chosen = d, Ech = E;
        E += mass[d];
      }
      E0 = Ech;
    }
    prefix |= (ull)(chosen < 0 ? 0 : chosen) << shift;
  }
  return prefix;
}

// cut_key: the cut's key in bin `bin` (nb of its tokens with key ≥ kmin). A bin of more than `whole` tokens is
// split into 256 sub-bins (sub_sweep + pick_sub, lanes of 8 after a scan), only the cut's sub-bin sorted; a
// sub-bin of more than `cap` tokens takes radix_cut over the whole bin (whole ≤ cap, as in the kernel).
ull cut_key(const std::vector<float>& s, float m, ull kmin, int nb, int bin, bool topp, int64_t place, ull E0,
            int64_t limit, int cap, int whole) {
  int sub = -1;
  int64_t pl = place;
  ull E = E0;
  if (nb > whole) {
    std::vector<int> cnt(256);
    std::vector<ull> mass(256);
    for (size_t i = 0; i < s.size(); ++i) {
      if (!(s[i] > -INFINITY) || bin_of(s[i], m) != bin || comp_key(s[i], (int64_t)i) < kmin) continue;
      const int d = sub_of(s[i], m);
      ++cnt[d];
      if (topp) mass[d] += sm::mass_of(sm::rel_of(s[i], m));
    }
    if (!topp) {
      int64_t before = 0;
      for (int d = 0; d < 256; ++d) {
        if (place < before + cnt[d]) {
          sub = d, pl = place - before;
          break;
        }
        before += cnt[d];
      }
      if (sub < 0) sub = 0;
    } else {
      ull Es = E0;
      for (int d = 0; d < 256; ++d) {
        if (cnt[d] > 0 && (int64_t)Es <= limit) sub = d, E = Es;
        Es += mass[d];
      }
      if (sub < 0) sub = 0, E = E0;
    }
    if (cnt[sub] > cap) return radix_cut(s, m, kmin, bin, topp, place, E0, limit);
  }
  const std::vector<ull> c = gather_bin(s, m, kmin, bin, sub);
  if (!topp) return c[(size_t)pl];
  size_t last = 0;
  for (size_t p = 0; p < c.size(); ++p) {
    if ((int64_t)E > limit) break;
    last = p;
    E += sm::mass_of(sm::rel_of(key_value(c[p]), m));
  }
  return c.empty() ? 0 : c[last];
}

// The kernel's noise bounds: g_hi[t] ≥ the noise of every word with top byte t.
std::vector<float> noise_bounds() {
  std::vector<float> g(256);
  for (uint32_t t = 0; t < 256; ++t) g[t] = sm::f_add(sm::gumbel_from_word((t << 24) | 0x00FFFFFFu), 1e-3f);
  return g;
}

// Warp 0's choice of the top-k cut's bin (topk_bin): lanes of BPL consecutive bins, a scan of their counts,
// the first lane whose bins reach k.
void topk_bin(const Bins& b, int k, int& bk, int& place) {
  int before_lane = 0;
  bk = NBQ, place = 0;
  for (int lane = 0; lane < 32; ++lane) {
    int before = before_lane, found = NB, pl = 0;
    for (int j = 0; j < BPL && found == NB; ++j) {
      const int q = lane * BPL + j;
      if (q >= NB) break;
      if (before + b.cnt[q] >= k) found = q, pl = k - before - 1;
      else before += b.cnt[q];
    }
    if (found < NB) {
      bk = found, place = pl;
      return;
    }
    for (int j = 0; j < BPL; ++j) before_lane += lane * BPL + j < NB ? b.cnt[lane * BPL + j] : 0;
  }
}
// Warp 0's choice of the top-p cut's bin (topp_bin): the last non-empty bin whose mass before it is within
// the limit, each lane over its BPL bins after a scan of the lanes' masses.
void topp_bin(const Bins& b, float top_p, int& bp, ull& Ebp, int64_t& limit) {
  ull Z = 0;
  for (int q = 0; q < NBQ; ++q) Z += b.mass[q];
  limit = sm::top_p_limit(top_p, Z);
  int best = -1;
  ull Ebest = 0, E = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < BPL; ++j) {
      const int q = lane * BPL + j;
      if (q >= NBQ) break;
      if (b.cnt[q] > 0 && (int64_t)E <= limit) best = q, Ebest = E;
      E += b.mass[q];
    }
  bp = best < 0 ? 0 : best;
  Ebp = best < 0 ? 0 : Ebest;
}

// The kernel's row, serially; `cap` = its sort capacity (SCAP = 8192 on the device), C blocks of nt threads,
// bins of more than `whole` tokens (kSortWhole = 512) split into sub-bins before the sort.
int32_t kernel_model(const float* x, int64_t N, const SampleSpec& sp, int cap, int C = 1, int nt = 512,
                     int whole = 512) {
  float bv = -INFINITY;
  int bi = -1, bad = 0, nfin = 0;
  for (int64_t i = 0; i < N; ++i) {
    bad |= std::isnan(x[i]) || x[i] == INFINITY;
    nfin += x[i] > -INFINITY;
    if (x[i] > bv) bv = x[i], bi = (int)i;
  }
  const float T = sp.temperature;
  if (bad || bi < 0 || !(T > 0.0f)) return bad ? -2 : bi;
  const float m = sm::scale_logit(bv, T);
  std::vector<float> s((size_t)N);
  for (int64_t i = 0; i < N; ++i) s[(size_t)i] = sm::scale_logit(x[i], T);
  const bool filtered = (sp.top_k > 0 && (int64_t)sp.top_k < N) || sp.top_p < 1.0f || sp.min_p > 0.0f;
  ull kset = 0, kcut = 0;
  bool use_top_p = false;
  if (filtered) {
    const bool topk = sp.top_k > 0 && sp.top_k < nfin;
    const int64_t set_size = topk ? sp.top_k : nfin;
    use_top_p = sp.top_p < 1.0f && set_size > 1;
    Bins b = bin_sweep(s, m, 0, !topk);
    if (topk) {
      int bk = NBQ, place = 0;
      topk_bin(b, sp.top_k, bk, place);
      if (bk != NBQ) kset = cut_key(s, m, 0, b.cnt[bk], bk, false, place, 0, 0, cap, whole);
      if (use_top_p) b = bin_sweep(s, m, kset, true);
    }
    if (use_top_p) {
      int bp = 0;
      ull Ebp = 0;
      int64_t limit = 0;
      topp_bin(b, sp.top_p, bp, Ebp, limit);
      kcut = cut_key(s, m, kset, b.cnt[bp], bp, true, 0, Ebp, limit, cap, whole);
    }
  }
  const bool minp = filtered && sp.min_p > 0.0f;
  // D as the kernel prunes it: C blocks of nt threads, thread (rank, t) taking the groups g with g mod nt = t
  // and (g / nt) mod C = rank in ascending order, each with its own best score so far.
  const std::vector<float> g_hi = noise_bounds();
  std::vector<float> tv((size_t)(C * nt), -INFINITY);
  std::vector<int> ti((size_t)(C * nt), -1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t g = i / 4;
    const size_t th = (size_t)(((g / nt) % C) * nt + g % nt);
    float& tb = tv[th];  // this thread's best so far
    int& tbi = ti[th];
    const float v = s[(size_t)i];
    bool keep = v > -INFINITY && bin_of(v, m) != NBQ && !(sm::f_add(v, g_hi[255]) < tb);
    if (keep && filtered) {
      const ull k = comp_key(v, i);
      keep = k >= kset && k >= kcut;
      if (keep && (use_top_p || minp)) {
        const float rel = sm::rel_of(v, m);
        keep = !(use_top_p && sm::mass_of(rel) == 0) && !(minp && !(rel >= sp.min_p));
      }
    }
    if (!keep) continue;
    const uint32_t w = philox_token_word(sp.key, sp.position, RngStream::kSample, (uint32_t)i);
    if (sm::f_add(v, g_hi[w >> 24]) < tb) continue;
    const float score = sm::f_add(v, sm::gumbel_from_word(w));
    if (tbi < 0 || score > tb || (score == tb && i < tbi)) tb = score, tbi = (int)i;
  }
  bv = -INFINITY, bi = -1;
  for (size_t t = 0; t < tv.size(); ++t)
    if (ti[t] >= 0 && (bi < 0 || tv[t] > bv || (tv[t] == bv && ti[t] < bi))) bv = tv[t], bi = ti[t];
  return bi;
}

// Small rows of every shape (ties, nearly flat, −inf, huge magnitudes, a token beyond the reach) and every
// filter, with the sort capacity 1..12 so that the sort, the radix refinement and their mix all run.
TEST(SamplerKernelModel, EqualsTheHostSamplerOnSmallRows) {
  std::mt19937_64 R(12345);
  auto uni = [&] { return std::uniform_real_distribution<double>(0, 1)(R); };
  int64_t radix_rows = 0, bad = 0;
  for (int it = 0; it < 60000; ++it) {
    const int cap = 1 + (int)(R() % 12);
    const int N = 1 + (int)(R() % 60);
    std::vector<float> x((size_t)N);
    const int kind = (int)(R() % 8);
    const float base = kind == 6 ? 268435456.0f : (float)(uni() * 10 - 5);
    for (auto& v : x) {
      switch (kind) {
        case 0: v = (float)(uni() * 4); break;
        case 1: v = (float)(R() % 4) * 0.5f; break;                 // ties
        case 2: v = (float)(R() % 3) * 0.03125f; break;             // nearly flat: one bin
        case 3: v = (R() % 5 == 0) ? -INFINITY : (float)(uni() * 30); break;
        case 4: v = (float)(uni() * 60) - 30; break;                // wider than the reach
        case 5: v = base + (float)(R() % 3) * 1e-6f; break;
        case 6: v = base + 32.0f * (float)(R() % 3); break;         // |s| ≥ 2^27: float sums tie
        default: v = (float)std::ldexp(uni(), (int)(R() % 40)) * ((R() & 1) ? 1 : -1); break;
      }
    }
    SampleSpec sp;
    sp.temperature = (R() % 10 == 0) ? 0.0f : (float)(0.01 + uni() * 2);
    const int f = (int)(R() % 4);
    sp.top_k = (f & 1) ? (int)(R() % (N + 2)) : 0;
    sp.top_p = (f & 2) ? (R() % 8 == 0 ? 0.99999994f : R() % 8 == 1 ? (float)(R() % 2) * -0.5f : (float)uni()) : 1.0f;
    sp.min_p = (R() % 3 == 0) ? (float)(uni() * uni()) : (R() % 20 == 0 ? 1.0f + (float)uni() : 0.0f);
    sp.key = R();
    sp.position = R() % 100000;
    radix_rows += N > cap && (kind == 1 || kind == 2 || kind == 5);
    const int C = 1 + (int)(R() % 3), nt = 1 + (int)(R() % 3);  // threads with several groups: the pruning runs
    const int whole = (int)(R() % (cap + 1));                     // sub-bins, sorts and radix cuts all run
    const int32_t want = sample_row(x.data(), N, sp), got = kernel_model(x.data(), N, sp, cap, C, nt, whole);
    if (want != got && ++bad <= 5)
      ADD_FAILURE() << "kind " << kind << " N " << N << " cap " << cap << " T " << sp.temperature << " top_k "
                    << sp.top_k << " top_p " << sp.top_p << " min_p " << sp.min_p << ": host " << want << ", kernel "
                    << got;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(radix_rows, 1000);
}

// Rows of the real vocabulary at the real capacity: flat rows whose cuts fall in bins of more than 8192 tokens
// (radix), rows of one value (cuts among ties, in id order) and ordinary rows (the sort).
TEST(SamplerKernelModel, EqualsTheHostSamplerOnVocabularyRows) {
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t N = 129280;
  std::vector<float> x((size_t)N);
  for (int r = 0; r < 12; ++r) {
    const int kind = r % 3;
    for (auto& v : x) v = kind == 0 ? 0.02f * n(g) : kind == 1 ? 1.5f : 2.0f * n(g);
    if (kind == 1)
      for (int j = 0; j < 6; ++j) x[(size_t)(g() % N)] = j < 3 ? 2.0f : -INFINITY;
    SampleSpec sp{0.5f + 0.1f * (float)r, r % 2 ? 0.9f : 0.4f, 0.0f, r % 4 < 2 ? (int)(N / 3) + r : 0, 1000u + r,
                  (uint64_t)r};
    const int32_t want = sample_row(x.data(), N, sp);
    EXPECT_EQ(kernel_model(x.data(), N, sp, 8192, 16, 512), want) << "row " << r << ", 16 blocks";
    EXPECT_EQ(kernel_model(x.data(), N, sp, 8192, 1, 512), want) << "row " << r << ", one block";
    EXPECT_EQ(kernel_model(x.data(), N, sp, 8192, 3, 7), want) << "row " << r << ", 3 blocks of 7 threads";
    EXPECT_EQ(kernel_model(x.data(), N, sp, 8192, 16, 512, 8192), want) << "row " << r << ", whole bins sorted";
  }
}

// The draw's pruning rests on g_hi[t] bounding the noise of every word with top byte t (the noise grows with
// the word up to det_log's few-ulp departures, which the margin covers): every byte's first and last words and
// a million random ones.
TEST(SamplerKernelModel, NoiseBoundsHoldForEveryTopByte) {
  const std::vector<float> g_hi = noise_bounds();
  std::mt19937 R(99);
  int64_t bad = 0;
  auto check = [&](uint32_t w) { bad += !(sm::gumbel_from_word(w) <= g_hi[w >> 24]); };
  for (uint32_t t = 0; t < 256; ++t) check(t << 24), check((t << 24) | 0x00FFFFFFu);
  for (int i = 0; i < 1000000; ++i) check((uint32_t)R());
  EXPECT_EQ(bad, 0);
  for (int t = 1; t < 256; ++t) EXPECT_LE(g_hi[t - 1], g_hi[t]) << t;
}

}  // namespace
}  // namespace deepinfer
