#pragma once
// Scalar conversions for the storage formats found in checkpoints, and overflow-checked size
// arithmetic. All conversions reinterpret bits; none goes through a hardware float8 cast.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace deepinfer {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);  // subnormal (or zero): man * 2^-24
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

// float8 E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN, max finite +-448.
inline float e4m3fn_to_f32(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);  // man/8 * 2^-6
  else v = std::ldexp(static_cast<float>(8 + man), exp - 10);  // (1+man/8) * 2^(exp-7)
  return neg ? -v : v;
}

// float8 E5M2 (IEEE-like): bias 15, exp 31 = inf / NaN.
inline float e5m2_to_f32(uint8_t b) { return f16_to_f32(static_cast<uint16_t>(b) << 8); }

// E8M0 scale byte (float8_e8m0fnu): 2^(b-127), b = 255 is NaN; no sign, no zero.
inline float e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is a float subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}

// FP4 E2M1 nibble (bit 3 = sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kLut[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                     -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kLut[nibble & 0xf];
}

// Overflow-checked arithmetic for sizes read from untrusted files. Returns false on overflow.
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

}  // namespace deepinfer
