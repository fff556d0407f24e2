#pragma once
// The sampler's arithmetic, shared bit for bit by the host sampler (src/ops/cpu/sampling.cc, which the
// engine's sample_one uses) and the CUDA sampler (src/ops/cuda/sampler.cu): the same token from the same
// logits on either side. Only IEEE-exact operations appear here — +, −, ×, ÷, fma and integer work — each
// written once, never left to a compiler to fuse (a product feeding an add is an explicit fma), and no
// library exp / log (glibc's and CUDA's differ in the last bit).
//
// What they define (docs/sampling.md):
//   noise    g = −log(−log(u)), u = philox_uniform(word) — det_log in double, rounded to float once;
//   masses   rel_i = exp(s_i − s_max) (det_exp, double) and q_i = ⌊rel_i · 2^32⌋, integers, so every sum
//            of them is exact in any order (the GPU's parallel sums equal the host's loops);
//   top-p    with Z = Σ q over the top-k set, token j is kept when q_j > 0 and the mass of the tokens
//            ranked before it, E_j, satisfies E_j < top_p · Z (in double: E_j ≤ ⌈top_p · Z⌉ − 1); the
//            best token is always kept.
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

// A token whose scaled logit is more than this below the row's maximum has q = 0 (e^−24 · 2^32 < 0.2)
// and cannot win the Gumbel draw (noise lies in [−2.82, 16.64]: the best token scores ≥ max − 2.82, this
// one < max − 24 + 16.64). Both samplers may therefore skip it.
constexpr float kReach = 24.0f;

DI_SAMPLE_FN double fma_d(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return ::fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DI_SAMPLE_FN uint64_t bits_of(double x) {
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
DI_SAMPLE_FN uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}

// Natural log of a positive normal double (the sampler's arguments lie in [2^−25, 17]); within ~2 ulp.
// m·2^e with m in [√½, √2): log m = 2·atanh(s), s = (m − 1) / (m + 1), |s| < 0.172, series to s^23.
DI_SAMPLE_FN double det_log(double x) {
  uint64_t b = bits_of(x);
  int e = (int)(b >> 52) - 1023;
  uint64_t mb = (b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  if (mb > 0x3FF6A09E667F3BCDull) mb -= 0x0010000000000000ull, ++e;  // m > √2: halve it
  const double f = double_of(mb) - 1.0;                                // exact
  const double s = f / (2.0 + f);
  const double z = s * s;
  double p = 1.0 / 23.0;
  p = fma_d(p, z, 1.0 / 21.0);
  p = fma_d(p, z, 1.0 / 19.0);
  p = fma_d(p, z, 1.0 / 17.0);
  p = fma_d(p, z, 1.0 / 15.0);
  p = fma_d(p, z, 1.0 / 13.0);
  p = fma_d(p, z, 1.0 / 11.0);
  p = fma_d(p, z, 1.0 / 9.0);
  p = fma_d(p, z, 1.0 / 7.0);
  p = fma_d(p, z, 1.0 / 5.0);
  p = fma_d(p, z, 1.0 / 3.0);
  p = fma_d(p, z, 1.0);
  constexpr double kLn2 = 0.69314718055994530942;
  return fma_d(2.0 * s, p, (double)e * kLn2);
}

// e^x for x ≤ 0 (any larger x is not a sampler argument); 0 below 2^−1020 (and for −inf). Within ~2 ulp.
// x = k·ln2 + r, |r| ≤ ln2 / 2, e^r by its Taylor series to r^13, times 2^k.
DI_SAMPLE_FN double det_exp(double x) {
  if (!(x > -707.0)) return 0.0;  // e^−707 < 2^−1020
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 0.693147180369123816490;  // 32 significant bits: k · kLn2Hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double k = floor(fma_d(x, kLog2e, 0.5));
  double r = fma_d(-k, kLn2Hi, x);
  r = fma_d(-k, kLn2Lo, r);
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = fma_d(p, r, 1.0 / 479001600.0);
  p = fma_d(p, r, 1.0 / 39916800.0);
  p = fma_d(p, r, 1.0 / 3628800.0);
  p = fma_d(p, r, 1.0 / 362880.0);
  p = fma_d(p, r, 1.0 / 40320.0);
  p = fma_d(p, r, 1.0 / 5040.0);
  p = fma_d(p, r, 1.0 / 720.0);
  p = fma_d(p, r, 1.0 / 120.0);
  p = fma_d(p, r, 1.0 / 24.0);
  p = fma_d(p, r, 1.0 / 6.0);
  p = fma_d(p, r, 0.5);
  p = fma_d(p, r, 1.0);
  p = fma_d(p, r, 1.0);
  return p * double_of((uint64_t)((int64_t)k + 1023) << 52);  // k in [−1021, 0]: a normal power of two
}

// Gumbel(0, 1) noise of one Philox word.
DI_SAMPLE_FN float gumbel_from_word(uint32_t word) {
  const double u = (double)philox_uniform(word);
  return (float)-det_log(-det_log(u));
}

// Temperature-scaled logit: x / t (t > 0), an overflow clamped to FLT_MAX and NaN (an unvalidated T)
// made −inf, so that every later step sees ordered, finite-or-(−inf) values.
DI_SAMPLE_FN float scale_logit(float x, float t) {
#if defined(__CUDA_ARCH__)
  float s = __fdiv_rn(x, t);
#else
  float s = x / t;
#endif
  if (s != s) return -INFINITY;
  return s == INFINITY ? FLT_MAX : s;
}

// s − m in float (IEEE: the same on both sides), then its relative probability and quantized mass.
DI_SAMPLE_FN float rel_arg(float s, float m) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(s, m);
#else
  return s - m;
#endif
}
DI_SAMPLE_FN double rel_of(float s, float m) { return det_exp((double)rel_arg(s, m)); }
DI_SAMPLE_FN uint64_t mass_of(double rel) { return (uint64_t)(rel * 4294967296.0); }  // exact scale, ≤ 2^32

// Largest prefix mass E that keeps a token under top-p: E < top_p · Z ⟺ E ≤ ⌈top_p · Z⌉ − 1 (Z < 2^53, so
// the sums are exact doubles; the one rounding is the product's). −1 when nothing but the best is kept.
DI_SAMPLE_FN int64_t top_p_limit(float top_p, uint64_t Z) {
  return (int64_t)ceil((double)top_p * (double)Z) - 1;
}

// Order key of a float: larger value ⟺ larger key (−0 as +0), for radix selection.
DI_SAMPLE_FN uint32_t order_key(float f) {
  uint32_t u = bits_of(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace deepinfer::sampling
