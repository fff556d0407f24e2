#!/usr/bin/env python3
"""Host model of gemv_q_v5's index math (src/ops/cuda/gemv_q_v5.cu), no GPU: numpy on integer data.

Mirrors the launcher's schedule (slices S, chunks a slice, rounds, grid, rows a launch), a warp's item,
the 16-byte loads of lane (g, t) with their zero-fill (rows ≥ N, bytes ≥ K, chunks ≥ c1), the x staging
(bf16 units of 8 k, padded row stride), the per-lane fragment registers fed to an emulated
mma.sync.m16n8k16 (A rows g / g + 8, k pairs 2t / 2t + 8; B column g; C rows g / g + 8, columns 2t, +1),
the fp8 scale index (chunk pair → 128-k block) and the slice reduction / output decode. Integer values
make every sum exact, so each output must equal x·Wᵀ exactly. Run: python3 tests/cuda/gemv_q_v5_model.py
"""
import numpy as np

WARPS, B, ITEMS, MAXS = 16, 8, 2048, 16
SMEM_MAX = 227 * 1024


def cdiv(a, b):
    return -(-a // b)


def schedule(fp8, N, nch, items=ITEMS):
    tiles, s = cdiv(N, 16), 1
    while s < MAXS and tiles * s < items and cdiv(nch, 2 * s) >= 2:
        s *= 2
    cps = cdiv(nch, s)
    if fp8:
        cps += cps % 2
    return s, cps


def xs_u4(fp8, nch):
    return nch * 8 + 1 if fp8 else cdiv(nch * 64, 128) * 8 + 4


def mma(acc, a, b):
    """acc[32][4] += A·B from per-lane fragments a[32][4][2], b[32][2][2] (m16n8k16 layout)."""
    A = np.zeros((16, 16), dtype=np.int64)
    Bm = np.zeros((16, 8), dtype=np.int64)
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        for h in range(2):
            A[g, 2 * t + h] = a[ln][0][h]
            A[g + 8, 2 * t + h] = a[ln][1][h]
            A[g, 2 * t + 8 + h] = a[ln][2][h]
            A[g + 8, 2 * t + 8 + h] = a[ln][3][h]
            Bm[2 * t + h, g] = b[ln][0][h]
            Bm[2 * t + 8 + h, g] = b[ln][1][h]
    C = A @ Bm
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        acc[ln][0] += C[g, 2 * t]
        acc[ln][1] += C[g, 2 * t + 1]
        acc[ln][2] += C[g + 8, 2 * t]
        acc[ln][3] += C[g + 8, 2 * t + 1]


def run(fp8, M, N, K, rng, sms=132, items=ITEMS):
    """items: the split target (the kernel's 2048; smaller here to reach S = 1, 2 on small N)."""
    vb = 1 if fp8 else 2  # bytes a value
    W = rng.integers(-3, 4, size=(N, K))
    X = rng.integers(-3, 4, size=(M, K))
    # fp8: integer "scales" per 128×128 block (stand-in for the powers of two), applied per chunk
    nsr, nsc = cdiv(N, 128), cdiv(K, 128)
    Sg = rng.integers(1, 4, size=(nsr, nsc))
    Weff = W * (np.repeat(np.repeat(Sg, 128, 0), 128, 1)[:N, :K] if fp8 else 1)
    want = X @ Weff.T

    kb = K * vb
    nch = cdiv(kb, 64)
    xu = xs_u4(fp8, nch)
    rows = 8
    while rows > 1 and rows * xu * 16 + WARPS * 128 * 4 > SMEM_MAX:
        rows //= 2
    assert rows * xu * 16 + WARPS * 128 * 4 <= SMEM_MAX
    S, cps = schedule(fp8, N, nch, items)
    rounds = cdiv(cdiv(N, 16), WARPS // S)
    grid = min(rounds, sms)
    Y = np.full((M, N), 10**9, dtype=np.int64)
    vpl = 16 // vb  # values a 16-byte lane load
    for m0 in range(0, M, rows):
        Mb = min(rows, M - m0)
        # staging: unit u of row m = values k [8u, 8u + 8), zero past K; row stride xu units
        xs = np.zeros(Mb * xu * 8, dtype=np.int64)
        units = nch * (8 if fp8 else 4)
        assert units <= xu
        for i in range(Mb * units):
            m, u = divmod(i, units)
            for e in range(8):
                k = 8 * u + e
                xs[m * xu * 8 + 8 * u + e] = X[m0 + m, k] if k < K else 0
        for blk in range(grid):
            for rnd in range(blk, rounds, grid):
                tpr = WARPS // S
                red = np.zeros((WARPS, 128), dtype=np.int64)
                for warp in range(WARPS):
                    tile, s = rnd * tpr + warp // S, warp % S
                    n0 = tile * 16
                    c0, c1 = min(nch, s * cps), min(nch, (s + 1) * cps)
                    if n0 >= N:
                        c1 = c0
                    acc = [[0] * 4 for _ in range(32)]
                    for cb in range(c0, c1, B):
                        assert not fp8 or cb % 2 == 0
                        for j in range(B):
                            c = cb + j
                            if c >= c1:
                                break
                            # per lane: two 16-byte loads (rows g, g + 8) as value lists, zero-filled
                            lw, lx = [], []
                            for ln in range(32):
                                g, t = ln >> 2, ln & 3
                                off = c * 64 + t * 16
                                rw = []
                                for h in range(2):
                                    n = n0 + g + 8 * h
                                    if off < kb and n < N:
                                        k0 = off // vb
                                        rw.append([W[n, k0 + e] for e in range(vpl)])
                                    else:
                                        rw.append([0] * vpl)
                                lw.append(rw)
                                # x: fp8 units 8c + 2t, +1; bf16 unit 4c + t (row g, null → zero if g ≥ M)
                                us = [8 * c + 2 * t, 8 * c + 2 * t + 1] if fp8 else [4 * c + t]
                                xv = []
                                for u in us:
                                    xv += [xs[g * xu * 8 + 8 * u + e] if g < Mb else 0 for e in range(8)]
                                lx.append(xv)
                            sc = Sg[n0 // 128, c // 2] if fp8 else 1  # cb even: scale of the chunk pair
                            nmma = 4 if fp8 else 2
                            for i in range(nmma):
                                a, b = [], []
                                for ln in range(32):
                                    w0, w1 = lw[ln]
                                    if fp8:  # word i = values 4i..4i+3 → lo (4i, 4i+1), hi (4i+2, 4i+3)
                                        lo0, hi0 = w0[4 * i:4 * i + 2], w0[4 * i + 2:4 * i + 4]
                                        lo1, hi1 = w1[4 * i:4 * i + 2], w1[4 * i + 2:4 * i + 4]
                                        a.append([[v * sc for v in lo0], [v * sc for v in lo1], [v * sc for v in hi0],
                                                  [v * sc for v in hi1]])
                                        b.append([lx[ln][4 * i:4 * i + 2], lx[ln][4 * i + 2:4 * i + 4]])
                                    else:  # words 2i, 2i + 1 = values (4i, 4i+1), (4i+2, 4i+3)
                                        a.append([w0[4 * i:4 * i + 2], w1[4 * i:4 * i + 2], w0[4 * i + 2:4 * i + 4],
                                                  w1[4 * i + 2:4 * i + 4]])
                                        b.append([lx[ln][4 * i:4 * i + 2], lx[ln][4 * i + 2:4 * i + 4]])
                                mma(acc, a, b)
                    for ln in range(32):
                        g, t = ln >> 2, ln & 3
                        for r in range(4):
                            if S == 1:
                                n, m = n0 + g + 8 * (r >> 1), 2 * t + (r & 1)
                                if m < Mb and n < N:
                                    Y[m0 + m, n] = acc[ln][r]
                            red[warp, r * 32 + ln] = acc[ln][r]
                if S > 1:
                    for e in range(tpr * 128):
                        q, r, ln = e // 128, (e // 32) % 4, e % 32
                        v = sum(red[q * S + s, e % 128] for s in range(S))
                        n = (rnd * tpr + q) * 16 + (ln >> 2) + 8 * (r >> 1)
                        m = 2 * (ln & 3) + (r & 1)
                        if m < Mb and n < N:
                            Y[m0 + m, n] = v
    bad = int((Y != want).sum())
    print(f"{'fp8 ' if fp8 else 'bf16'} M={M:2d} N={N:5d} K={K:5d}: S={S:2d} cps={cps:3d} rounds={rounds:4d} "
          f"grid={grid:3d} rows/launch={rows}  {'OK' if bad == 0 else f'{bad} WRONG'}")
    return bad == 0


def main():
    rng = np.random.default_rng(5)
    cases = [(True, 3, 97, 1104), (True, 8, 37, 1040), (True, 1, 16, 128), (True, 5, 44, 128),
             (True, 2, 300, 640), (True, 9, 40, 256), (False, 3, 41, 1032), (False, 8, 33, 264),
             (False, 1, 20, 72), (True, 3, 24, 16384), (False, 2, 17, 8192)]
    ok = all(run(*c, rng) for c in cases)
    # a shape with several rounds a block (small fake SM count) and S = 1 vs S > 1
    ok &= run(True, 2, 300, 256, rng, sms=3, items=19)    # S = 1, rounds of 16 tiles
    ok &= run(True, 3, 300, 1024, rng, sms=2, items=38)   # S = 2, 8 tiles a round
    ok &= run(False, 4, 70, 128, rng, sms=2, items=10)    # S = 2 (bf16)
    ok &= run(False, 6, 70, 1000, rng, sms=1, items=1)    # S = 1, bf16, K % 32 != 0
    print("ALL OK" if ok else "FAILURES")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
