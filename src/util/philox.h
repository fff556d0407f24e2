#pragma once
// Philox4x32-10 counter-based RNG (Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as
// 1, 2, 3", SC'11): a keyed bijection from a 128-bit counter to 128 random bits. Any counter can be
// evaluated directly, so a random number is addressed by (key, counter) alone: no stream state, no
// dependence on how many numbers other requests drew, on batch order or on the thread. Integer-only,
// so a GPU kernel produces the same words from the same (key, counter).
//
// Addressing used by the sampler (shared/docs/parallelism-and-determinism.md §7.2):
//   key     = per-choice key: the request seed for choice 0, derived from (seed, choice) otherwise;
//   counter = (position low 32, stream tag, token_id >> 2, position high 32), output word token_id & 3.
#include <array>
#include <cstdint>

namespace deepinfer {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox round: two 32x32->64 multiplies; the high halves are mixed with the other two words
// and the key, the low halves pass through.
constexpr PhiloxCounter philox4x32_round(const PhiloxCounter& c, const PhiloxKey& k) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  const uint64_t p0 = kM0 * c[0];
  const uint64_t p1 = kM1 * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
}

// Ten rounds; the key is bumped by the Weyl constants (golden ratio, sqrt(3)-1) between rounds.
constexpr PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    c = philox4x32_round(c, k);
  }
  return c;
}

constexpr PhiloxKey philox_key(uint64_t key) {
  return {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
}

// Stream tags (counter word 1) keep draws for different purposes disjoint under one key.
// Values are part of the reproducibility contract: never renumber.
enum class RngStream : uint32_t {
  kSample = 0,      // Gumbel noise of the target's sample (and of coupled drafts)
  kDraft = 1,       // independent draft noise (rejection-mode speculative decoding)
  kAccept = 2,      // uniform of a speculative accept test
  kResidual = 3,    // Gumbel noise for residual / bonus draws
  kChoiceKey = 0xFFFFFFFFu,  // derives the key of choice i > 0 from the request seed
};

// Uniform in (0, 1) from one 32-bit word: 23 random bits, centred, so the value is exact in FP32
// and never 0 or 1 (the naive x * 2^-32 rounds to 1.0f for the largest words).
constexpr float philox_uniform(uint32_t x) {
  return (static_cast<float>(x >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Key for choice `index` (0 <= index < n) of a request with seed `seed`. Choice 0 uses the seed
// itself, so an n = 1 request reproduces choice 0 of the same request with n > 1.
constexpr uint64_t choice_key(uint64_t seed, uint32_t index) {
  if (index == 0) return seed;
  const PhiloxCounter w =
      philox4x32_10({index, static_cast<uint32_t>(RngStream::kChoiceKey), 0, 0}, philox_key(seed));
  return (static_cast<uint64_t>(w[1]) << 32) | w[0];
}

// The 32-bit word addressed by (key, position, stream, token id).
constexpr uint32_t philox_token_word(uint64_t key, uint64_t position, RngStream stream, uint32_t token) {
  const PhiloxCounter w = philox4x32_10({static_cast<uint32_t>(position), static_cast<uint32_t>(stream),
                                         token >> 2, static_cast<uint32_t>(position >> 32)},
                                        philox_key(key));
  return w[token & 3];
}

}  // namespace deepinfer
