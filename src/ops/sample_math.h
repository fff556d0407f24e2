#pragma once
// The sampler's arithmetic, shared bit for bit by the host sampler (src/ops/cpu/sampling.cc, which the
// engine's sample_one uses) and the CUDA sampler (src/ops/cuda/sampler.cu): the same token from the same
// logits on either side. Only IEEE-exact single operations appear here (+, −, ×, ÷ in float, each rounded
// once: __fadd_rn and friends on the device, which are never fused into an fma; the host build compiles with
// -ffp-contract=off), and no library exp / log (glibc's and CUDA's differ in the last bit).
//
// What they define (docs/sampling.md):
//   noise    g = −log(−log u), u = philox_uniform(word), with det_log;
//   masses   rel_i = exp(s_i − s_max) (det_exp) and q_i = ⌊rel_i · 2^32⌋, integers, so every sum of them is
//            exact in any order (the GPU's parallel sums equal the host's loops);
//   top-p    with Z = Σ q over the top-k set, token j is kept when q_j > 0 and the mass of the tokens ranked
//            before it, E_j, satisfies E_j < top_p · Z (in double: E_j ≤ ⌈top_p · Z⌉ − 1); the best token is
//            always kept.
// Accuracy: det_log and det_exp are within a few float ulp, as library float log / exp are.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "util/philox.h"

#if defined(__CUDACC__)
#define DI_SAMPLE_FN __host__ __device__ __forceinline__
#else
#define DI_SAMPLE_FN inline
#endif

namespace deepinfer::sampling {

// A token whose scaled logit s has f_sub(max, s) ≥ this has q = 0 (e^−24 · 2^32 < 0.2) and takes no part in
// the Gumbel draw. In exact arithmetic it could not win anyway (noise lies in [−2.82, 16.64]), but where the
// float spacing of s is ≥ 16 (|s| ≥ 2^27) a rounded s + g can tie the best score: so the reach is part of the
// definition, and both samplers skip such tokens.
constexpr float kReach = 24.0f;

// One rounding each, never fused.
DI_SAMPLE_FN float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DI_SAMPLE_FN float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DI_SAMPLE_FN float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DI_SAMPLE_FN float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DI_SAMPLE_FN uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}
DI_SAMPLE_FN float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}

// Natural log of a positive normal float (the sampler's arguments lie in [2^−25, 17]). x = m·2^e with m in
// [√½, √2): log m = 2·atanh(s), s = (m − 1) / (m + 1), |s| < 0.172, series to s^13 (the rest < 1e-10).
DI_SAMPLE_FN float det_log(float x) {
  const uint32_t b = bits_of(x);
  int e = (int)(b >> 23) - 127;
  uint32_t mb = (b & 0x007FFFFFu) | 0x3F800000u;
  if (mb > 0x3FB504F3u) mb -= 0x00800000u, ++e;  // m > √2: halve it
  const float f = f_sub(float_of(mb), 1.0f);     // exact
  const float s = f_div(f, f_add(2.0f, f));
  const float z = f_mul(s, s);
  float p = 1.0f / 13.0f;
  p = f_add(f_mul(p, z), 1.0f / 11.0f);
  p = f_add(f_mul(p, z), 1.0f / 9.0f);
  p = f_add(f_mul(p, z), 1.0f / 7.0f);
  p = f_add(f_mul(p, z), 1.0f / 5.0f);
  p = f_add(f_mul(p, z), 1.0f / 3.0f);
  p = f_add(f_mul(p, z), 1.0f);
  constexpr float kLn2 = 0.693147180559945309f;
  return f_add(f_mul((float)e, kLn2), f_mul(f_add(s, s), p));
}

// e^x for x ≤ 0 (any larger x is not a sampler argument); 0 below e^−87 (and for −inf, NaN). x = k·ln2 + r,
// |r| ≤ ln2 / 2 (+ rounding), e^r by its Taylor series to r^7 (the rest < 1e-8 relative), times 2^k.
DI_SAMPLE_FN float det_exp(float x) {
  if (!(x > -87.0f)) return 0.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 significant bits: k · kLn2Hi is exact for |k| < 2^8
  constexpr float kLn2Lo = 1.42860682030941723e-06f;
  const float y = f_add(f_mul(x, kLog2e), 0.5f);
#if defined(__CUDA_ARCH__)
  const float k = floorf(y);  // in [−126, 0]
#else
  const int ki = (int)y;  // floor(y) exactly (|y| < 127), without a libm call where SSE4.1 is not assumed
  const float k = (float)(ki - ((float)ki > y ? 1 : 0));
#endif
  float r = f_sub(x, f_mul(k, kLn2Hi));
  r = f_sub(r, f_mul(k, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = f_add(f_mul(p, r), 1.0f / 720.0f);
  p = f_add(f_mul(p, r), 1.0f / 120.0f);
  p = f_add(f_mul(p, r), 1.0f / 24.0f);
  p = f_add(f_mul(p, r), 1.0f / 6.0f);
  p = f_add(f_mul(p, r), 0.5f);
  p = f_add(f_mul(p, r), 1.0f);
  p = f_add(f_mul(p, r), 1.0f);
  return f_mul(p, float_of((uint32_t)((int)k + 127) << 23));  // a normal power of two
}

// A logit processor's edit of one logit (ops/sampling.h LogitEdit), as the engine's apply_logit_processors
// applies it to that id, in this order, each operation rounded once: + bias; the repetition penalty (÷ rep
// when positive, × rep otherwise); − freq · count, then − presence (an id of the output); −inf (masked).
constexpr uint32_t kEditBias = 1, kEditRepeat = 2, kEditMask = 4;
DI_SAMPLE_FN float edit_logit(float x, uint32_t flags, float bias, int32_t count, float rep, float freq,
                              float presence) {
  if (flags & kEditBias) x = f_add(x, bias);
  if ((flags & kEditRepeat) && rep != 1.0f) x = x > 0.0f ? f_div(x, rep) : f_mul(x, rep);
  if (count > 0 && (freq != 0.0f || presence != 0.0f)) {
    x = f_sub(x, f_mul(freq, (float)count));
    x = f_sub(x, presence);
  }
  if (flags & kEditMask) x = -INFINITY;
  return x;
}

// The place of `id` among edits[first, first + count) (ascending ids, one edit an id), −1 when it has none.
template <class Edit>
DI_SAMPLE_FN int32_t find_id(const Edit* edits, int32_t first, int32_t count, int32_t id) {
  int32_t lo = 0, hi = count;  // the first place with an id ≥ id
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (edits[first + mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < count && edits[first + lo].id == id ? lo : -1;
}

// A pending output token's edit (RowEdits::pend): one more occurrence of it — the repetition flag when the
// penalty is on, and count + 1 when the frequency or presence penalty is (logit_edits' rules for output ids).
DI_SAMPLE_FN void pending_edit(uint32_t& flags, int32_t& count, float rep, float freq, float presence) {
  if (rep != 1.0f) flags |= kEditRepeat;
  if (freq != 0.0f || presence != 0.0f) count += 1;
}

// Gumbel(0, 1) noise of one Philox word: increasing in the word, within [−2.82, 16.64].
DI_SAMPLE_FN float gumbel_from_word(uint32_t word) { return -det_log(-det_log(philox_uniform(word))); }

// Temperature-scaled logit: x / t (t > 0), an overflow clamped to FLT_MAX and NaN (an unvalidated T)
// made −inf, so that every later step sees ordered, finite-or-(−inf) values.
DI_SAMPLE_FN float scale_logit(float x, float t) {
  const float s = f_div(x, t);
  if (s != s) return -INFINITY;
  return s == INFINITY ? FLT_MAX : s;
}

// A token's relative probability exp(s − m) and its quantized mass.
DI_SAMPLE_FN float rel_of(float s, float m) { return det_exp(f_sub(s, m)); }
DI_SAMPLE_FN uint64_t mass_of(float rel) { return (uint64_t)(rel * 4294967296.0f); }  // exact scale, ≤ 2^32

// Largest prefix mass E that keeps a token under top-p: E < top_p · Z ⟺ E ≤ ⌈top_p · Z⌉ − 1 (Z < 2^53, so
// the sums are exact doubles; the one rounding is the product's).
// At least 0 (top_p ≤ 0 keeps the best token only, as top_p tiny does).
DI_SAMPLE_FN int64_t top_p_limit(float top_p, uint64_t Z) {
  const int64_t l = (int64_t)ceil((double)top_p * (double)Z) - 1;
  return l < 0 ? 0 : l;
}

// ---- Logprobs (ops/sampling.h row_logprobs; docs/sampling.md "Logprobs"): the raw log-softmax of a row, the
// same bits wherever it is computed. lp_i = (float)(((double)x_i − m) − log Z), m the row's largest value,
// Z = Σ_i q_i · 2^−S with integer masses q_i = ⌊exp(x_i − m) · 2^S⌋ (so the sum is exact in any order), exp and
// log in double from single IEEE operations (det_exp_d, det_log_d: within a few double ulp), so the float result
// is within one float ulp of the exact log-softmax but for the masses' truncation (≤ N · 2^−S relative in Z).
// S = 44 for rows of fewer than 2^19 tokens (Z < 2^63), one less for each doubling beyond (lp_shift).

DI_SAMPLE_FN double d_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DI_SAMPLE_FN double d_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
DI_SAMPLE_FN double d_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
DI_SAMPLE_FN double d_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
DI_SAMPLE_FN uint64_t dbits_of(double x) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)__double_as_longlong(x);
#else
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
#endif
}
DI_SAMPLE_FN double double_of(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)b);
#else
  double x;
  std::memcpy(&x, &b, 8);
  return x;
#endif
}
// 2^k, −1022 ≤ k ≤ 1023.
DI_SAMPLE_FN double pow2_d(int k) { return double_of((uint64_t)(k + 1023) << 52); }

// e^x for −40 ≤ x ≤ 0 (the logprob masses' range). x = k·ln2 + r, |r| ≤ ln2 / 2 (+ rounding), k·ln2 split in two
// (fdlibm's ln2_hi has 32 significant bits: k·ln2_hi is exact), e^r by its Taylor series to r^13 (the rest
// < 1e-17 relative), times 2^k.
DI_SAMPLE_FN double det_exp_d(double x) {
  constexpr double kLog2e = 1.44269504088896338700e+00;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double y = d_add(d_mul(x, kLog2e), 0.5);
#if defined(__CUDA_ARCH__)
  const double k = floor(y);  // in [−58, 0]
#else
  const int ki = (int)y;  // floor(y) exactly (|y| < 60)
  const double k = (double)(ki - ((double)ki > y ? 1 : 0));
#endif
  const double r = d_sub(d_sub(x, d_mul(k, kLn2Hi)), d_mul(k, kLn2Lo));
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = d_add(d_mul(p, r), 1.0 / 479001600.0);
  p = d_add(d_mul(p, r), 1.0 / 39916800.0);
  p = d_add(d_mul(p, r), 1.0 / 3628800.0);
  p = d_add(d_mul(p, r), 1.0 / 362880.0);
  p = d_add(d_mul(p, r), 1.0 / 40320.0);
  p = d_add(d_mul(p, r), 1.0 / 5040.0);
  p = d_add(d_mul(p, r), 1.0 / 720.0);
  p = d_add(d_mul(p, r), 1.0 / 120.0);
  p = d_add(d_mul(p, r), 1.0 / 24.0);
  p = d_add(d_mul(p, r), 1.0 / 6.0);
  p = d_add(d_mul(p, r), 0.5);
  p = d_add(d_mul(p, r), 1.0);
  p = d_add(d_mul(p, r), 1.0);
  return d_mul(p, pow2_d((int)k));
}

// Natural log of a double x ≥ 1 (a mass sum). x = m·2^e, m in [√½, √2): log m = 2·atanh(s), s = (m − 1) / (m + 1),
// |s| < 0.172, series to s^23 (the rest < 1e-18); e·ln2 split as in det_exp_d.
DI_SAMPLE_FN double det_log_d(double x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const uint64_t b = dbits_of(x);
  int e = (int)(b >> 52) - 1023;
  uint64_t mb = (b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  if (mb > 0x3FF6A09E667F3BCDull) mb -= 0x0010000000000000ull, ++e;  // m > √2: halve it
  const double f = d_sub(double_of(mb), 1.0);                          // exact
  const double s = d_div(f, d_add(2.0, f));
  const double z = d_mul(s, s);
  double p = 1.0 / 23.0;
  p = d_add(d_mul(p, z), 1.0 / 21.0);
  p = d_add(d_mul(p, z), 1.0 / 19.0);
  p = d_add(d_mul(p, z), 1.0 / 17.0);
  p = d_add(d_mul(p, z), 1.0 / 15.0);
  p = d_add(d_mul(p, z), 1.0 / 13.0);
  p = d_add(d_mul(p, z), 1.0 / 11.0);
  p = d_add(d_mul(p, z), 1.0 / 9.0);
  p = d_add(d_mul(p, z), 1.0 / 7.0);
  p = d_add(d_mul(p, z), 1.0 / 5.0);
  p = d_add(d_mul(p, z), 1.0 / 3.0);
  p = d_add(d_mul(p, z), 1.0);
  const double ed = (double)e;
  return d_add(d_mul(ed, kLn2Hi), d_add(d_mul(ed, kLn2Lo), d_mul(d_add(s, s), p)));
}

// The masses' scale S for a row of N tokens: Z ≤ N · 2^S < 2^63.
DI_SAMPLE_FN int lp_shift(int64_t N) {
  int s = 44;
  for (int64_t n = N; n >= (int64_t)1 << 19; n >>= 1) --s;
  return s;
}
// A token's mass ⌊exp(x − m) · 2^S⌋ (x ≤ m, m finite; 0 for −inf and farther than 40 below m).
DI_SAMPLE_FN uint64_t lp_mass(float x, float m, int shift) {
  const double d = d_sub((double)x, (double)m);
  if (!(d >= -40.0)) return 0;
  return (uint64_t)d_mul(det_exp_d(d), pow2_d(shift));  // ≤ 2^S; the conversion truncates
}
// log Z from the masses' sum (≥ 2^S: the largest token's mass is exactly 2^S).
DI_SAMPLE_FN double lp_log_z(uint64_t Z, int shift) {
  return det_log_d(d_mul((double)(int64_t)Z, pow2_d(-shift)));  // int → double rounds to nearest on both sides
}
// A token's logprob (−inf for −inf).
DI_SAMPLE_FN float logprob_of(float x, float m, double log_z) {
  if (!(x > -INFINITY)) return -INFINITY;
  return (float)d_sub(d_sub((double)x, (double)m), log_z);
}

// Order key of a float: larger value ⟺ larger key (−0 as +0), for radix selection.
DI_SAMPLE_FN uint32_t order_key(float f) {
  uint32_t u = bits_of(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace deepinfer::sampling
