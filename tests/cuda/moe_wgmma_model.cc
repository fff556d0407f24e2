// Host model of moe_expert_gemm_wg_kernel (src/ops/cuda/moe_grouped.cu), no GPU needed: mirrors one work
// item (256 weight rows × a tile of ≤ 128 token rows) — the cp.async weight / e8m0 copies, the x copies of
// wg-order x into the no-swizzle K-major core-matrix layout (their commit groups, wait counts and buffer
// reuse against the wgmmas still running), the wgmma operand reads as the PTX ISA
// defines them (B through the descriptor: start + (n / 8)·SBO + (k / 8)·LBO + (n % 8)·16 + (k % 8)·2; A
// from registers in the m64nNk16 fragment layout; D in its accumulator layout), the dequantization's
// register roles and the epilogue addresses (plain f32 and fused SwiGLU, modelled as 1000·gate + up, pair
// order or not). Checks, on integer data: (1) every wgmma step pairs each A element with the x element of
// the same logical k; (2) step i of each 64-k chunk reads exactly the stored x positions (and in the same
// A/B slots) that mma.sync number i of moe_expert_gemm_kernel reads — the condition for equal bits;
// (3) every output equals x·dequant(W)ᵀ exactly and is written once; columns ≥ nrows are never written.
// Build and run: ctest -R CudaMoeWgmmaModel (or g++ -O2 -std=c++17 tests/cuda/moe_wgmma_model.cc && ./a.out).
// Keep it in step with the kernel when either changes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "host_check.h"

namespace {
constexpr int NT = 256, BN = 256, MR = 128, KC = 128, NST = 4;
constexpr int WB = KC / 2, WROW = WB + 16, SROW = KC / 32, XSTEP = MR * 32, XB = (KC / 16) * XSTEP;
constexpr int WOFF = XB, SOFF = WOFF + BN * WROW, STAGE = SOFF + BN * SROW;
constexpr uint32_t LBO = 128, SBO = 256;

int pair_pos(int k8) { return k8 < 4 ? 2 * k8 : 2 * (k8 - 4) + 1; }
int pair_inv(int p8) { return (p8 & 1) ? 4 + p8 / 2 : p8 / 2; }  // stored position in an 8-group → k

using host_check::fails;

// x element tag in shared memory: (token row n of the tile, stored position p in the row); -1 = unwritten
struct Tag {
  int n = -1;
  int64_t p = -1;
};

// x arrives in wg order (pair-order position p = 16t + 4i + 2h + l of a 64-k chunk stored at 16i + 8h + 2t + l),
// so 16-byte piece pc of a stage's row belongs at step 4·(pc / 8) + i, core h, with i = (pc / 2) % 4, h = pc % 2.
int wg_pos(int p64) { return ((p64 >> 2) & 3) * 16 + ((p64 >> 1) & 1) * 8 + (p64 >> 4) * 2 + (p64 & 1); }
int wg_inv(int q64) {  // wg position → pair-order position
  const int i = q64 >> 4, h = (q64 >> 3) & 1, t = (q64 >> 1) & 3, l = q64 & 1;
  return 16 * t + 4 * i + 2 * h + l;
}

void run(int64_t K, int nrows, bool sw, bool act_pair, bool gather, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t Nw = 2 * BN;  // weight rows of the expert (w13: I = BN, N = 2I; w2: N = 2·BN, two column blocks)
  const int64_t I = Nw / 2;
  const int nb = 1;           // the second column block (grow offsets matter)
  const int r0 = 5;           // first grouped row of the tile
  const int ncols = (nrows + 15) & ~15;
  // weights: e2m1 nibbles (code 0..15), e8m0 bytes; x: small integers in pair order
  std::vector<uint8_t> wq(Nw * K / 2), ws(Nw * K / 32);
  for (auto& b : wq) b = (uint8_t)rng();
  for (auto& b : ws) b = (uint8_t)(120 + rng() % 16);
  auto e2m1 = [](int code) {
    static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8 ? -1 : 1) * v[code & 7];
  };
  auto wval = [&](int64_t n, int64_t k) {
    const uint8_t b = wq[n * (K / 2) + k / 2];
    return e2m1(k & 1 ? b >> 4 : b & 15) * std::ldexp(1.0, (int)ws[n * (K / 32) + k / 32] - 127);
  };
  const int64_t ldx = K + 8, nx = 300;
  std::vector<double> xl(nx * K);  // logical x
  for (auto& v : xl) v = (double)((int)(rng() % 15) - 7);
  std::vector<int> gat(r0 + MR);
  for (auto& v : gat) v = (int)(rng() % nx);
  auto xrow_of = [&](int n) { return gather ? gat[r0 + n] : (r0 + n) % (int)nx; };
  auto grow = [&](int r) -> int64_t {
    return sw ? (r < BN / 2 ? (int64_t)nb * (BN / 2) + r : I + (int64_t)nb * (BN / 2) + (r - BN / 2)) : (int64_t)nb * BN + r;
  };
  (void)ldx;

  // shared memory: bytes for weights / scales, tags for x (per 2-byte element)
  std::vector<uint8_t> sm(NST * STAGE, 0);
  std::vector<Tag> sx(NST * STAGE / 2);
  const int nst = (int)(K / KC);
  auto issue_w = [&](int st, int buf) {
    for (int tid = 0; tid < NT; ++tid) {
      const int wpiece = tid & 3;
      for (int i = 0; i < 4; ++i) {
        const int row = (tid >> 2) + 64 * i;
        for (int b = 0; b < 16; ++b)
          sm[buf * STAGE + WOFF + row * WROW + wpiece * 16 + b] = wq[grow(row) * (K / 2) + st * WB + wpiece * 16 + b];
      }
      for (int b = 0; b < 4; ++b) sm[buf * STAGE + SOFF + tid * SROW + b] = ws[grow(tid) * (K / 32) + st * SROW + b];
    }
  };
  // x copies (both kernels take x in wg order: pair-order position p = 16t + 4i + 2h + l of a 64-k chunk
  // stored at 16i + 8h + 2t + l). Source element el of 16-byte piece pc of a stage's row: wg position
  // st·KC + 8·pc + el → pair-order position st·KC + 64·(pc / 8) + wg_inv((8·pc + el) % 64).
  auto copy_piece = [&](int st, int buf, int row, int pc, int dst) {
    for (int el = 0; el < 8; ++el) {
      const int q64 = (8 * pc + el) & 63;
      CHECK(wg_pos(wg_inv(q64)) == q64, "wg_pos / wg_inv\n");
      CHECK(dst >= buf * STAGE && dst + 16 <= buf * STAGE + XB && dst % 16 == 0, "x copy address\n");
      sx[(dst + 2 * el) / 2] = Tag{row, (int64_t)st * KC + (pc >> 3) * 64 + wg_inv(q64)};
    }
  };
  auto load_store_x = [&](int st, int buf) {
    // moe_expert_gemm_wg_kernel's issue_x: warp w, lane: rows 16w + 8u + lane % 8, pieces 4·pq + lane / 8;
    // destination xdst[u] + 2·pq·XSTEP as the kernel computes it
    for (int warp = 0; warp < 8; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int xq = lane >> 3;
        for (int u = 0; u < 2; ++u) {
          const int row = 16 * warp + 8 * u + (lane & 7);
          if (row >= nrows) continue;
          const int xdst = (row >> 3) * 256 + (xq & 1) * 128 + (row & 7) * 16 + (xq >> 1) * XSTEP;
          for (int pq = 0; pq < 4; ++pq) copy_piece(st, buf, row, 4 * pq + xq, buf * STAGE + xdst + 2 * pq * XSTEP);
        }
      }
  };

  // The kernel's commit groups and buffer reuse: cp.async.wait_group 3 at the top of stage s must cover the
  // weights and x of s; a copy into a buffer must not overwrite what a wgmma may still read (the last step of
  // stage s − 1 can run past the barrier of stage s: x of s − 1 stays live, x of s − 2 and all weights read
  // by LDS before the barrier are free; the kernel keeps two steps in flight, so at stage s's barrier stage
  // s − 2 has retired: each warpgroup ran stage s − 1's second step and its wait_group 2).
  std::vector<std::vector<int>> groups(1);  // items: 2·stage (weights) or 2·stage + 1 (x)
  std::vector<int> x_read(NST, -100), w_read(NST, -100);
  int cur = -1;                             // the stage whose loop body runs (-1: prologue)
  auto commit = [&] { groups.emplace_back(); };
  auto issue_w_at = [&](int st) {
    const int b = st % NST;
    CHECK(w_read[b] <= cur - 1, "weights of stage %d overwrite a buffer read in stage %d (now %d)\n", st, w_read[b], cur);
    issue_w(st, b);
    groups.back().push_back(2 * st);
  };
  auto issue_x_at = [&](int st) {
    const int b = st % NST;
    CHECK(x_read[b] <= cur - 2, "x of stage %d overwrites a buffer a wgmma of stage %d may read (now %d)\n", st, x_read[b], cur);
    load_store_x(st, b);
    groups.back().push_back(2 * st + 1);
  };
  auto wait_covers = [&](int s) {  // wait_group 3: all but the 3 newest committed groups are complete
    const int done = (int)groups.size() - 1 - 3;
    bool w = false, x = false;
    for (int gi = 0; gi < done; ++gi)
      for (int it : groups[gi]) w |= it == 2 * s, x |= it == 2 * s + 1;
    CHECK(w && x, "stage %d: wait_group 3 does not cover its %s\n", s, w ? "x" : "weights");
  };

  // accumulators: [warp][mt][64] per lane → keep D per (warpgroup, mt, m64 row, col) in double
  std::vector<double> D(2 * 2 * 64 * MR, 0.0);
  auto Dat = [&](int wg, int mt, int m, int n) -> double& { return D[((wg * 2 + mt) * 64 + m) * MR + n]; };
  // the stored x positions each (chunk, mma i, lane t, A reg r, half) reads in moe_expert_gemm_kernel:
  // b0 (A regs 0, 1: k 2t + half) = 16t + 4i + half, b1 (A regs 2, 3: k 8 + 2t + half) = 16t + 4i + 2 + half
  auto old_pos = [](int c, int i, int t, int r, int half) -> int64_t {
    return (int64_t)c * 64 + 16 * t + 4 * i + 2 * (r >> 1) + half;
  };

  // prologue: groups w0 x0 w1 x1 w2 (empty past the end)
  for (int st = 0; st < NST - 1; ++st) {
    if (st < nst) issue_w_at(st);
    commit();
    if (st < 2) {
      if (st < nst) issue_x_at(st);
      commit();
    }
  }
  const uint32_t smem0 = 0x400;  // any 16-byte aligned base (the descriptor holds address bits 4..17)
  // (the kernel spreads stage s's copies over its wgmma steps; here they come at its top: the same side of
  // the barrier, the same commit order)
  for (int s = 0; s < nst; ++s) {
    cur = s;
    wait_covers(s);
    if (s + 2 < nst) issue_x_at(s + 2);
    commit();
    if (s + NST - 1 < nst) issue_w_at(s + NST - 1);
    commit();
    const int buf = s % NST;
    x_read[buf] = s, w_read[buf] = s;
    for (int c = 0; c < KC / 64; ++c)
      for (int i = 0; i < 4; ++i) {
        const uint32_t saddr = smem0 + buf * STAGE + (c * 4 + i) * XSTEP;
        const uint64_t desc = (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(LBO >> 4) << 16) | ((uint64_t)(SBO >> 4) << 32);
        // decode the descriptor as the hardware does
        const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
                       sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
        auto B = [&](int k, int n) -> Tag {  // B[k][n], K-major, no swizzle
          const uint32_t a = start + (n / 8) * sbo + (k / 8) * lbo + (n % 8) * 16 + (k % 8) * 2 - smem0;
          return sx[a / 2];
        };
        for (int warp = 0; warp < 8; ++warp) {
          const int wg = warp >> 2, wv = warp & 3;
          const int trow0 = sw ? wg * 64 + wv * 16 : wg * 128 + wv * 16;
          const int trow1 = sw ? BN / 2 + wg * 64 + wv * 16 : wg * 128 + 64 + wv * 16;
          for (int mt = 0; mt < 2; ++mt)
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane >> 2, t = lane & 3;
              const int ra = (mt ? trow1 : trow0) + g, rb = ra + 8;
              // the lane's 8 weight bytes of rows ra / rb and their e8m0 bytes (as the kernel reads them)
              const uint8_t* pa = &sm[buf * STAGE + WOFF + ra * WROW + c * 32 + t * 8];
              const uint8_t* pb = &sm[buf * STAGE + WOFF + rb * WROW + c * 32 + t * 8];
              const int ea = sm[buf * STAGE + SOFF + ra * SROW + c * 2 + (t >> 1)] - 1;
              const int eb = sm[buf * STAGE + SOFF + rb * SROW + c * 2 + (t >> 1)] - 1;
              // e2m1x8_raw(word w) → pairs {n_j, n_j+4}; A[0] = ra pair 2(i&1) of word i>>1, A[2] = pair 2(i&1)+1,
              // A[1], A[3] the same of rb; value·2^-126 × 2^(e8m0 − 1) = value × 2^(e8m0 − 127)
              auto nib = [](const uint8_t* p, int w, int j) { const uint8_t b = p[4 * w + j / 2]; return j & 1 ? b >> 4 : b & 15; };
              auto e2 = [](int code) {
                static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
                return (code & 8 ? -1 : 1) * v[code & 7];
              };
              for (int r = 0; r < 4; ++r)
                for (int half = 0; half < 2; ++half) {
                  const uint8_t* pw = (r & 1) ? pb : pa;
                  const int ex = (r & 1) ? eb : ea;
                  const int j = 2 * (i & 1) + (r >> 1) + 4 * half;  // {n_j, n_j+4}: half selects j or j + 4
                  const double aval = e2(nib(pw, i >> 1, j)) * std::ldexp(1.0, ex - 126);
                  // the logical k of this weight: lane's 16 k start at 16t; word i>>1 adds 8; nibble j
                  const int64_t wk = (int64_t)s * KC + c * 64 + 16 * t + 8 * (i >> 1) + j;
                  const int m = 16 * wv + g + 8 * (r & 1);           // A fragment row (PTX m64nNk16 layout)
                  const int kk = 2 * t + half + 8 * (r >> 1);         // A fragment k
                  const int wrow = (mt ? trow1 : trow0) + g + 8 * (r & 1);
                  CHECK(aval == wval(grow(wrow), wk), "dequant value row %d k %lld\n", wrow, (long long)wk);
                  for (int n = 0; n < ncols; ++n) {
                    const Tag b = B(kk, n);
                    if (n >= nrows) continue;  // garbage columns: never stored
                    CHECK(b.n == n, "B column: tag row %d, wanted %d (step %d.%d k %d)\n", b.n, n, c, i, kk);
                    // (2) the same stored position as mma.sync i, same slot
                    CHECK(b.p == (int64_t)s * KC + old_pos(c, i, t, r, half), "B position %lld, mma.sync %lld\n",
                          (long long)b.p, (long long)((int64_t)s * KC + old_pos(c, i, t, r, half)));
                    // (1) x's logical k at that stored position (pair order) = the weight's logical k
                    const int64_t xk = (b.p & ~7LL) + pair_inv((int)(b.p & 7));
                    CHECK(xk == wk, "pairing: x k %lld, w k %lld\n", (long long)xk, (long long)wk);
                    Dat(wg, mt, m, n) += aval * xl[xrow_of(n) * K + xk];
                  }
                }
            }
        }
      }
  }

  // epilogue (kernel's addresses): d[4j + r] of warp wv, lane (g, t) = (row 16wv + g + 8(r / 2), col 8j + 2t + r % 2)
  const int64_t ldy = sw ? I + 3 : Nw + 3;
  std::map<int64_t, double> Y;
  for (int warp = 0; warp < 8; ++warp) {
    const int wg = warp >> 2, wv = warp & 3;
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int j = 0; j < 16; ++j) {
        if (8 * j >= nrows) break;
        for (int r = 0; r < 4; ++r) {
          const int col = j * 8 + 2 * t + (r & 1);
          if (col >= nrows) continue;
          const int64_t yrow = (int64_t)(r0 + col) * ldy;
          const int rr = wv * 16 + g + 8 * (r >> 1);
          const double d0 = Dat(wg, 0, 16 * wv + g + 8 * (r >> 1), col), d1 = Dat(wg, 1, 16 * wv + g + 8 * (r >> 1), col);
          if (sw) {
            int64_t ii = (int64_t)nb * (BN / 2) + wg * 64 + rr;
            if (act_pair) ii = (ii & ~7LL) | pair_pos((int)(ii & 7));
            CHECK(!Y.count(yrow + ii), "act written twice\n");
            Y[yrow + ii] = 1000.0 * d0 + d1;
          } else {
            const int64_t a0 = yrow + (int64_t)nb * BN + wg * 128 + rr, a1 = a0 + 64;
            CHECK(!Y.count(a0) && !Y.count(a1), "y written twice\n");
            Y[a0] = d0, Y[a1] = d1;
          }
        }
      }
    }
  }
  // reference: every (row, output column) of the tile
  int64_t checked = 0;
  for (int n = 0; n < nrows; ++n) {
    const int64_t yrow = (int64_t)(r0 + n) * ldy;
    auto dot = [&](int64_t wr) {
      double a = 0;
      for (int64_t k = 0; k < K; ++k) a += wval(wr, k) * xl[xrow_of(n) * K + k];
      return a;
    };
    if (sw) {
      for (int64_t c = 0; c < BN / 2; ++c) {
        const int64_t ii = nb * (BN / 2) + c;
        const int64_t col = act_pair ? (ii & ~7LL) | pair_pos((int)(ii & 7)) : ii;
        auto it = Y.find(yrow + col);
        CHECK(it != Y.end(), "act (%d, %lld) not written\n", n, (long long)ii);
        if (it != Y.end()) CHECK(it->second == 1000.0 * dot(ii) + dot(I + ii), "act (%d, %lld) wrong\n", n, (long long)ii);
        ++checked;
      }
    } else {
      for (int64_t c = 0; c < BN; ++c) {
        auto it = Y.find(yrow + nb * BN + c);
        CHECK(it != Y.end(), "y (%d, %lld) not written\n", n, (long long)c);
        if (it != Y.end()) CHECK(it->second == dot(nb * BN + c), "y (%d, %lld) wrong\n", n, (long long)c);
        ++checked;
      }
    }
  }
  CHECK((int64_t)Y.size() == checked, "extra outputs written: %zu vs %lld\n", Y.size(), (long long)checked);
  printf("K=%lld rows=%d (wgmma N=%d) %s%s%s: %lld outputs checked, fails so far %d\n", (long long)K, nrows, ncols,
         sw ? "swiglu" : "plain", act_pair ? " pair-order act" : "", gather ? " gathered" : "", (long long)checked, fails);
}
}  // namespace

int main() {
  run(512, 97, false, false, true, 1);
  run(512, 97, true, true, true, 2);
  run(384, 128, true, false, false, 3);
  run(256, 16, false, false, false, 4);
  run(128, 1, true, true, true, 5);
  run(640, 113, false, false, true, 6);
  printf(fails ? "FAILED (%d)\n" : "all checks passed\n", fails);
  return fails ? 1 : 0;
}
