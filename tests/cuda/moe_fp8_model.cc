// Host model of moe_expert_fp8_kernel and moe_quant_fp8 (src/ops/cuda/moe_fp8.cu), no GPU needed: mirrors one
// block's stage — the quantizer's byte placement, the cp.async x / weight / scale copies into shared memory, the
// wgmma B reads as the PTX ISA defines them for 8-bit K-major operands without swizzle (start + (n / 8)·SBO +
// (k / 16)·LBO + (n % 8)·16 + k % 16), the A registers the kernel builds (m64nNk32 e4m3 fragment: a0 = row g,
// bytes 4t..4t+3; a1 = row g + 8; a2 / a3 the same rows at bytes 16 + 4t..), the byte-permute decode with its
// code tables, the x-scale layout of the promotion, and the w13 row interleave with its epilogue. Checks:
// (1) every copy lands once and the B reads see exactly the copied bytes; (2) in every wgmma step each A
// element and the B element it meets carry the same k of the 128-k stage; (3) the decode gives, for every
// 16-bit nibble group and every d, e4m3 codes whose value is e2m1 · 2^(d − 6) exactly for d ≥ −2 (and the
// e4m3 rounding of it below), and the sign bits; (4) the x-scale reads are the right columns, conflict-free;
// (5) the w13 rows map onto gate / up rows once each, and each thread's gate and up accumulators belong to the
// act column it writes. Build and run: ctest -R CudaMoeFp8Model (or g++ -O2 -std=c++17 tests/cuda/moe_fp8_model.cc).
// Keep it in step with the kernel when either changes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "host_check.h"

namespace {
constexpr int NT = 256, BN = 256, MR = 128, KC = 128;
constexpr int XSTEP = MR * 32, WOFF = 4 * XSTEP, SOFF = WOFF + BN * 64, XSOFF = SOFF + BN * 4, STAGE = XSOFF + 640;
constexpr uint32_t LBO = 128, SBO = 256;

using host_check::fails;

// moe_grouped.h's moe_fp8_pos: k = 32t + 8j + 4h + i → 32j + 16h + 4t + i
int fp8_pos(int k) { return 32 * ((k >> 3) & 3) + 16 * ((k >> 2) & 1) + 4 * (k >> 5) + (k & 3); }
int xs_pos(int c) { return ((c >> 1) & 3) * 36 + (c >> 3) * 2 + (c & 1); }

// PTX prmt.b32 (default mode): byte n of the result = byte (s & 7) of {b, a} (a the low word), or, when s & 8,
// that byte's sign replicated
uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t pool = (uint64_t)a | ((uint64_t)b << 32);
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const int s = (sel >> (4 * n)) & 15;
    uint32_t byte = (uint32_t)(pool >> (8 * (s & 7))) & 0xff;
    if (s & 8) byte = (byte & 0x80) ? 0xff : 0x00;
    r |= byte << (8 * n);
  }
  return r;
}
uint32_t dec4(uint32_t v, uint32_t lx, uint32_t ly) {  // the kernel's mf_dec4
  const uint32_t mag = prmt(lx, ly, v & 0x7777u);
  const uint32_t sgn = prmt(0x80808080u, 0x80808080u, v);
  return mag | ((sgn << 7) & 0x80808080u);
}
double e4m3_value(uint8_t c) {
  const int E = (c >> 3) & 15, m = c & 7;
  const double a = E == 0 ? std::ldexp((double)m, -9) : std::ldexp(1.0 + m / 8.0, E - 7);
  return (c & 0x80) ? -a : a;
}
uint8_t e4m3_rne(double v) {  // round to nearest even, saturating (the device's cvt.rn.satfinite)
  const uint8_t s = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (a >= 448.0) return s | 0x7E;
  if (a < std::ldexp(1.0, -6)) return s | (uint8_t)std::nearbyint(a * 512.0);
  int e;
  const double f = std::frexp(a, &e);
  double m = std::nearbyint((2 * f - 1) * 8);
  int E = e - 1;
  if (m == 8) m = 0, E += 1;
  return s | (uint8_t)(((E + 7) << 3) | (int)m);
}
const double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

void check_quant_and_copies() {
  // (1a) the quantizer: lane l's four bytes (k 4l..4l+3) land at 32j + 16h + 4t = moe_fp8_pos(k)
  std::set<int> seen;
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int t = l >> 3, j = (l >> 1) & 3, h = l & 1, dst = 32 * j + 16 * h + 4 * t + i;
      CHECK(dst == fp8_pos(4 * l + i), "quant lane %d byte %d at %d, moe_fp8_pos %d\n", l, i, dst, fp8_pos(4 * l + i));
      seen.insert(dst);
    }
  CHECK(seen.size() == 128, "quant positions not a permutation\n");

  // (1b) x copies of one stage: smem byte → (token row, stored position in the row's 128-byte stage chunk)
  std::vector<int> xrow(4 * XSTEP, -1), xpos(4 * XSTEP, -1);
  for (int tid = 0; tid < NT; ++tid) {
    const int warp = tid >> 5, lane = tid & 31;
    for (int u = 0; u < 2; ++u)
      for (int v = 0; v < 2; ++v) {
        const int row = 16 * warp + 8 * u + (lane & 7), pc = (lane >> 3) + 4 * v;
        const int dst = (pc >> 1) * XSTEP + (row >> 3) * 256 + (pc & 1) * 128 + (row & 7) * 16;
        const int src = (lane >> 3) * 16 + 64 * v;  // the kernel's xsrc offset + 64·v
        CHECK(src == 16 * pc, "x piece %d from byte %d\n", pc, src);
        for (int b = 0; b < 16; ++b) {
          CHECK(xrow[dst + b] < 0, "x smem byte %d written twice\n", dst + b);
          xrow[dst + b] = row, xpos[dst + b] = src + b;
        }
      }
  }
  for (int i = 0; i < 4 * XSTEP; ++i) CHECK(xrow[i] >= 0, "x smem byte %d not written\n", i);

  // (1c) weights: block row tid / 4 + 64i, 16-byte piece tid % 4, each smem byte once
  std::vector<int> wrow(BN * 64, -1), wbyte(BN * 64, -1);
  for (int tid = 0; tid < NT; ++tid)
    for (int i = 0; i < 4; ++i) {
      const int r = (tid >> 2) + 64 * i, dst = (tid >> 2) * 64 + (tid & 3) * 16 + i * (64 * 64);
      for (int b = 0; b < 16; ++b) {
        CHECK(wrow[dst + b] < 0, "weight smem byte %d written twice\n", dst + b);
        wrow[dst + b] = r, wbyte[dst + b] = (tid & 3) * 16 + b;
      }
    }
  for (int i = 0; i < BN * 64; ++i) CHECK(wrow[i] == i / 64 && wbyte[i] == i % 64, "weight smem byte %d\n", i);

  // (2) each wgmma step: A (row, logical k) against B (token n, logical k) — the same k of the stage
  for (int j = 0; j < 4; ++j)
    for (int warp = 0; warp < 8; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int t = lane & 3;  // (the row g = lane / 4 does not change k)
        for (int r = 0; r < 4; ++r)
          for (int i = 0; i < 4; ++i) {
            const int L = 4 * t + 16 * (r >> 1) + i;  // logical k of fragment register r, byte i
            // the kernel: A[j][0/1] = dec(word j of rows g / g + 8, nibbles 0..3), A[j][2/3] = nibbles 4..7;
            // word j of thread t holds k 32t + 8j .. 32t + 8j + 7 (bytes 16t + 4j.. of the row's stage)
            const int ka = 32 * t + 8 * j + 4 * (r >> 1) + i;
            for (int n = 0; n < MR; n += 7) {
              const int a = j * XSTEP + (n / 8) * SBO + (L / 16) * LBO + (n % 8) * 16 + L % 16;
              CHECK(xrow[a] == n, "B read of token %d got row %d\n", n, xrow[a]);
              CHECK(fp8_pos(ka) == xpos[a], "step %d lane %d reg %d byte %d: A k %d, B stored %d (wants %d)\n", j, lane,
                    r, i, ka, xpos[a], fp8_pos(ka));
            }
          }
      }
}

void check_decode() {
  // (3) code tables as the kernel builds them (d = idx − 16), then every 16-bit nibble group
  for (int d = -16; d <= 12; ++d) {
    uint8_t lut[8];
    for (int m = 0; m < 8; ++m) lut[m] = e4m3_rne(std::ldexp(kE2m1[m], d - 6));
    uint32_t lx = 0, ly = 0;
    for (int m = 0; m < 4; ++m) lx |= (uint32_t)lut[m] << (8 * m), ly |= (uint32_t)lut[m + 4] << (8 * m);
    for (uint32_t v = 0; v < 65536; ++v) {
      const uint32_t r = dec4(v, lx, ly);
      for (int n = 0; n < 4; ++n) {
        const int nib = (v >> (4 * n)) & 15;
        const uint8_t c = (uint8_t)(r >> (8 * n));
        const double want = (nib & 8 ? -1 : 1) * std::ldexp(kE2m1[nib & 7], d - 6);
        CHECK(c == ((nib & 8 ? 0x80 : 0) | lut[nib & 7]), "d %d nibble %x: code %02x\n", d, nib, c);
        if (d >= -2) CHECK(e4m3_value(c) == want, "d %d nibble %x: %g, wants %g (not exact)\n", d, nib, e4m3_value(c), want);
      }
    }
  }
  // the row factor: code · 2^(e_max − 133) = e2m1 · 2^(e − 127) for d = e − e_max + 12
  for (int emax = 0; emax < 255; emax += 17)
    for (int e = std::max(0, emax - 14); e <= emax; ++e) {
      const int d = e - emax + 12;
      for (int m = 1; m < 8; ++m)
        CHECK(e4m3_value(e4m3_rne(std::ldexp(kE2m1[m], d - 6))) * std::ldexp(1.0, emax - 133) ==
                  std::ldexp(kE2m1[m], e - 127),
              "emax %d e %d m %d\n", emax, e, m);
    }
}

void check_scales_and_rows() {
  // (4) x scales: token column c at xs_pos(c), inside the 640-byte area, once; the promotion's float4 i of thread
  // t covers columns 16i + 2t + {0, 1} and 16i + 8 + 2t + {0, 1}; one warp's four addresses start in distinct banks
  std::set<int> pos;
  for (int c = 0; c < MR; ++c) {
    CHECK(xs_pos(c) * 4 + 4 <= 640, "x scale of column %d outside\n", c);
    pos.insert(xs_pos(c));
  }
  CHECK(pos.size() == MR, "x scale positions collide\n");
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 8; ++i) {
      const int p = 36 * t + 4 * i;
      CHECK(xs_pos(16 * i + 2 * t) == p && xs_pos(16 * i + 2 * t + 1) == p + 1 && xs_pos(16 * i + 8 + 2 * t) == p + 2 &&
                xs_pos(16 * i + 8 + 2 * t + 1) == p + 3,
            "promotion float4 %d of thread %d\n", i, t);
      CHECK((p * 4) % 16 == 0, "float4 %d of thread %d misaligned\n", i, t);
      std::set<int> banks;
      for (int tt = 0; tt < 4; ++tt)
        for (int q = 0; q < 4; ++q) banks.insert((36 * tt + 4 * i + q) % 32);
      CHECK(banks.size() == 16, "promotion load %d: bank conflict\n", i);
    }
  // (5) w13: block row b = 128mt + 16w + r → gate row 128nb + 64mt + 8w + r (r < 8) or its up row (I + …)
  const int I = 1024;
  for (int nb = 0; nb < 3; ++nb) {
    std::set<int> rows;
    for (int b = 0; b < BN; ++b) {
      const int bb = b & 127, i = nb * (BN / 2) + 64 * (b >> 7) + 8 * (bb >> 4) + (bb & 7);
      rows.insert((bb & 8) ? I + i : i);
    }
    CHECK(rows.size() == BN && *rows.begin() == nb * 128 && *rows.rbegin() == I + nb * 128 + 127, "w13 rows of block %d\n", nb);
    for (int mt = 0; mt < 2; ++mt)
      for (int w = 0; w < 8; ++w)
        for (int g = 0; g < 8; ++g) {
          const int rA = 128 * mt + 16 * w + g, rB = rA + 8;  // accumulator rows of r < 2 and r ≥ 2
          const int gate = nb * 128 + 64 * mt + 8 * w + g;
          const int ia = nb * (BN / 2) + 64 * (rA >> 7) + 8 * ((rA & 127) >> 4) + (rA & 7);
          const int ib = nb * (BN / 2) + 64 * (rB >> 7) + 8 * ((rB & 127) >> 4) + (rB & 7);
          CHECK(!(rA & 8) && (rB & 8) && ia == gate && ib == gate, "w13 epilogue mt %d warp %d g %d\n", mt, w, g);
        }
  }
  CHECK(STAGE % 128 == 0 && 6 * STAGE <= 227 * 1024, "stage size %d\n", STAGE);
}
}  // namespace

int main() {
  check_quant_and_copies();
  check_decode();
  check_scales_and_rows();
  if (fails) {
    fprintf(stderr, "%d failures\n", fails);
    return 1;
  }
  printf("moe_fp8 host model: quantizer, copies, wgmma operands, decode (29 tables x 65536 groups), scales, w13 rows: ok\n");
  return 0;
}
