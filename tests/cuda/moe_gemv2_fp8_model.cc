// Host model of moe_gemv2_fp8 (moe_gemv2.cu, moe_gemv2_kernel<F8 = 2, 4>), no GPU needed: mirrors the kernel's
// index math and bit tricks and checks them against what they must compute. Keep it in step with the kernel.
// (1) e2m1x8_e4m3: every byte in every position of a word decodes to e4m3 codes whose value is e2m1 · 2^-6
//     exactly (lo = the low nibbles, hi = the high ones, in byte order), signed zeros included;
// (2) act_scale_exp: 2^e is DeepSeek's scale 2^ceil(log2(max(amax, 1e-4) / 448)) (frexp form, as the op test's
//     host quantizer), on powers of two, their neighbours and random values;
// (3) mv_stage_x8's B layout read as wgmma reads 8-bit K-major B without swizzle (start + (n / 8)·SBO + (k / 16)·LBO
//     + (n % 8)·16 + k % 16, start = (4cp + j)·256·NT): every byte is written once; in every step (cp, j), column
//     n = 4NT·h + 4u + q holds token u's x of chunk 2cp + h exactly in the k-slots that lane t = q's A registers
//     take (lo word j of group q: k 32q + 8j + 2i at slot 4q + i; hi: + 1 at slot 16 + 4q + i), zeros elsewhere
//     and in absent tokens' columns — so Σ_k A·B per column is the dot product of one 32-k group of one token;
// (4) the C fragment: lane (g, t), block b of its chunk half, register r → column 2t + r % 2 of n8 block
//     NB·h + b = token 2b + t / 2, group 2(t % 2) + r % 2: what the kernel's ssel / xel / reduction assume;
// (5) the promotion factor's bits (b + 6 + e) << 23 built by one IMAD equal 2^(b − 121 + e) (e8m0 b, x scale 2^e);
// (6) the partial-sum image [k split][pair][tile][token][row] is written once per entry and the reducers read
//     each (pair, tile, token, row) from all 8 k splits.
// Build and run: ctest -R CudaMoeGemv2Fp8Model (or g++ -O2 -std=c++17 tests/cuda/moe_gemv2_fp8_model.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "host_check.h"

namespace {
using host_check::fails;
const double kE2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

// bf16_bits.cuh's e2m1x8_e4m3
void e2m1x8_e4m3(uint32_t v, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = (v << 2) & 0x3C3C3C3Cu, b = (v >> 2) & 0x3C3C3C3Cu;
  lo = a + 3u * (a & 0x20202020u);
  hi = b + 3u * (b & 0x20202020u);
}
// common.cuh's act_scale_exp (on the bits of the f32 quotient)
int act_scale_exp(float amax) {
  const float r = std::fmax(amax, 1e-4f) / 448.0f;
  uint32_t bits;
  std::memcpy(&bits, &r, 4);
  return (int)((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) ? 1 : 0);
}
// the op test's host_quant_block scale exponent
int ref_scale_exp(float amax) {
  const float r = std::max(amax, 1e-4f) / 448.0f;
  int e;
  const float mant = std::frexp(r, &e);
  return mant == 0.5f ? e - 1 : e;
}

void check_decode() {
  for (int pos = 0; pos < 4; ++pos)
    for (int byte = 0; byte < 256; ++byte) {
      const uint32_t v = (uint32_t)byte << (8 * pos);
      uint32_t lo, hi;
      e2m1x8_e4m3(v, lo, hi);
      for (int i = 0; i < 4; ++i) {
        const int nl = i == pos ? byte & 15 : 0, nh = i == pos ? byte >> 4 : 0;
        const uint8_t cl = (uint8_t)(lo >> (8 * i)), ch = (uint8_t)(hi >> (8 * i));
        CHECK(e4m3_value(cl) == std::ldexp(kE2m1[nl], -6) && std::signbit(e4m3_value(cl)) == std::signbit(kE2m1[nl]),
              "decode: byte %02x at %d, lo %d: code %02x\n", byte, pos, i, cl);
        CHECK(e4m3_value(ch) == std::ldexp(kE2m1[nh], -6) && std::signbit(e4m3_value(ch)) == std::signbit(kE2m1[nh]),
              "decode: byte %02x at %d, hi %d: code %02x\n", byte, pos, i, ch);
      }
    }
  std::mt19937 rng(7);
  for (int it = 0; it < 200000; ++it) {  // whole words: no carry between bytes
    const uint32_t v = rng();
    uint32_t lo, hi;
    e2m1x8_e4m3(v, lo, hi);
    for (int i = 0; i < 4; ++i) {
      CHECK(e4m3_value((uint8_t)(lo >> (8 * i))) == std::ldexp(kE2m1[(v >> (8 * i)) & 15], -6), "decode word %08x\n", v);
      CHECK(e4m3_value((uint8_t)(hi >> (8 * i))) == std::ldexp(kE2m1[(v >> (8 * i + 4)) & 15], -6), "decode word %08x\n", v);
    }
  }
}

void check_scale() {
  std::vector<float> a = {0.0f, 1e-30f, 1e-4f, 0.0448f, 0.0448001f, 448.0f, 3.0e38f};
  for (int e = -40; e <= 120; ++e) {
    const float p = std::ldexp(448.0f, e);
    a.push_back(p), a.push_back(std::nextafter(p, 0.0f)), a.push_back(std::nextafter(p, 1e38f));
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  for (int i = 0; i < 100000; ++i) a.push_back(std::exp2(u(rng)));
  for (float x : a)
    if (std::isfinite(x)) CHECK(act_scale_exp(x) == ref_scale_exp(x), "scale exponent of %g: %d, wants %d\n", x, act_scale_exp(x), ref_scale_exp(x));
}

// moe_gemv2.cu's mv_stage_x8<NT>: the byte offset of (column 4NT·(c % 2) + 4u + q, k half 0) in step (c / 2, j)
template <int NT>
int row_at(int c, int j, int u, int q) {
  const int n = 4 * NT * (c & 1) + 4 * u + q;
  return ((c >> 1) * 4 + j) * (256 * NT) + (n >> 3) * 256 + (n & 7) * 16;
}

template <int NT>
void check_b_layout(int K, int rows) {
  const int nb = K / 128;
  // x[u][k] = a distinct tag (token u, k) for present tokens; the staging's writes, lane by lane
  std::vector<int> mem(4 * NT * K, -1), count(4 * NT * K, 0);
  auto tag = [&](int u, int k) { return 1 + u * K + k; };
  for (int u = 0; u < rows; ++u)
    for (int c = 0; c < nb; ++c)
      for (int lane = 0; lane < 32; lane += 2) {  // even lanes write lane and lane + 1's bytes
        const int q = lane >> 3, j = (lane >> 1) & 3;
        int lo[4], hi[4];  // lane l: k 4l..4l+3 of the block; even k → lo, odd → hi; lane + 1's in bytes 2, 3
        for (int h = 0; h < 2; ++h) {
          const int kb = c * 128 + 4 * (lane + h);
          lo[2 * h] = tag(u, kb), lo[2 * h + 1] = tag(u, kb + 2), hi[2 * h] = tag(u, kb + 1), hi[2 * h + 1] = tag(u, kb + 3);
        }
        const int r = row_at<NT>(c, j, u, q);
        for (int w = 0; w < 4; ++w)  // uint4 rows: word q = the values, the others zero
          for (int b = 0; b < 4; ++b) {
            const int o = r + 4 * w + b;
            mem.at(o) = w == q ? lo[b] : 0, ++count.at(o);
            mem.at(o + 128) = w == q ? hi[b] : 0, ++count.at(o + 128);
          }
        if (u == 0)
          for (int ua = rows; ua < NT; ++ua) {
            const int z = row_at<NT>(c, j, ua, q);
            for (int b = 0; b < 16; ++b)
              mem.at(z + b) = 0, ++count.at(z + b), mem.at(z + 128 + b) = 0, ++count.at(z + 128 + b);
          }
      }
  for (size_t i = 0; i < mem.size(); ++i) CHECK(count[i] == 1, "B byte %zu written %d times (NT %d rows %d)\n", i, count[i], NT, rows);
  // wgmma's reads against what the A side meets
  constexpr int LBO = 128, SBO = 256, N = 8 * NT;
  for (int cp = 0; cp < nb / 2; ++cp)
    for (int j = 0; j < 4; ++j)
      for (int n = 0; n < N; ++n)
        for (int s = 0; s < 32; ++s) {
          const int start = (4 * cp + j) * 256 * NT;
          const int got = mem[start + (n / 8) * SBO + (s / 16) * LBO + (n % 8) * 16 + s % 16];
          const int h = n / (4 * NT), u = (n / 4) % NT, q = n % 4;
          const int owner = (s % 16) / 4, i = s % 4;  // the lane t whose A registers fill k-slot s
          const int k = 128 * (2 * cp + h) + 32 * owner + 8 * j + 2 * i + (s >= 16 ? 1 : 0);
          const int want = owner == q && u < rows ? tag(u, k) : 0;
          CHECK(got == want, "B (NT %d rows %d) cp %d j %d n %d slot %d: %d, wants %d\n", NT, rows, cp, j, n, s, got, want);
        }
}

template <int NT>
void check_fragment_and_reduction() {
  constexpr int NB = NT / 2;
  // (4) C registers: lane (g, t) holds z[4·blk + r] = (row g + 8·(r / 2), column 8·blk + 2t + r % 2)
  for (int hh = 0; hh < 2; ++hh)
    for (int t = 0; t < 4; ++t)
      for (int b = 0; b < NB; ++b)
        for (int r = 0; r < 4; ++r) {
          const int blk = NB * hh + b, n = 8 * blk + 2 * t + (r & 1);
          const int h = n / (4 * NT), u = (n / 4) % NT, q = n % 4;
          CHECK(h == hh && u == 2 * b + (t >> 1) && q == 2 * (t & 1) + (r & 1),
                "fragment NT %d: hh %d t %d b %d r %d → (h %d u %d q %d)\n", NT, hh, t, b, r, h, u, q);
        }
  // (6) rd[ks·wred + pr·NT·32 + rt·16·NT + u·16 + h·8 + g], wred = pairs·NT·32, written by the even lanes
  for (int pairs = 1; pairs <= 2; ++pairs) {
    const int wred = pairs * NT * 32;
    std::vector<int> wr(8 * wred, 0);
    for (int warp = 0; warp < 16; ++warp) {
      const int wg = warp >> 2, rt = warp & 1, hh = (warp >> 1) & 1, ks = 2 * wg + hh;
      for (int pr = 0; pr < pairs; ++pr)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          if (t & 1) continue;
          for (int b = 0; b < NB; ++b)
            for (int h = 0; h < 2; ++h) ++wr[ks * wred + pr * NT * 32 + rt * 16 * NT + (2 * b + (t >> 1)) * 16 + h * 8 + g];
        }
    }
    for (int i = 0; i < 8 * wred; ++i) CHECK(wr[i] == 1, "rd entry %d written %d times (NT %d pairs %d)\n", i, wr[i], NT, pairs);
    // unfused reducers: tid < pairs·32·NT → (pair, tile, token, row); the row of the output
    std::vector<int> seen(pairs * 2 * NT * 16, 0);
    for (int tid = 0; tid < pairs * 32 * NT; ++tid) {
      const int pr = tid / (32 * NT), i = tid - pr * (32 * NT), rt = i / (16 * NT), col = (i >> 4) % NT, row = i & 15;
      CHECK(pr * NT * 32 + i == pr * NT * 32 + rt * 16 * NT + col * 16 + row, "reducer %d reads another entry\n", tid);
      ++seen[((pr * 2 + rt) * NT + col) * 16 + row];
    }
    for (size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == 1, "output %zu reduced %d times\n", i, seen[i]);
  }
  // fused: tid < 16·NT → gate entry tid (tile 0), up entry 16·NT + tid (tile 1) of the same (token, row)
  for (int tid = 0; tid < 16 * NT; ++tid) {
    const int col = tid >> 4, row = tid & 15;
    CHECK(tid == 0 * 16 * NT + col * 16 + row && 16 * NT + tid == 1 * 16 * NT + col * 16 + row, "fused reducer %d\n", tid);
  }
}

void check_factor() {
  for (int b = 0; b < 255; ++b)
    for (int e = -22; e <= 40; ++e) {
      const int f = b + 6 + e;
      if (f < 1 || f > 254) continue;  // (the documented range)
      const uint32_t bits = (uint32_t)b * (1u << 23) + ((uint32_t)(6 + e) << 23);
      float v;
      std::memcpy(&v, &bits, 4);
      CHECK((double)v == std::ldexp(1.0, b - 121 + e), "factor b %d e %d: %g\n", b, e, v);
    }
}
}  // namespace

int main() {
  check_decode();
  check_scale();
  for (int rows = 1; rows <= 2; ++rows) check_b_layout<2>(2048, rows), check_b_layout<2>(4096, rows);
  for (int rows = 1; rows <= 4; ++rows) check_b_layout<4>(2048, rows);
  check_fragment_and_reduction<2>();
  check_fragment_and_reduction<4>();
  check_factor();
  if (fails) {
    std::printf("moe_gemv2_fp8 model: %d failures\n", fails);
    return 1;
  }
  std::printf("moe_gemv2_fp8 model: decode, scale exponent, B layout, fragment, reduction and factor checks pass\n");
  return 0;
}
