#!/usr/bin/env python3
"""Index model of gemv_q_v6 (src/ops/cuda/gemv_q_v6.cu): mirrors its schedule, per-lane weight loads
(byte offsets), x staging (unit layout, row stride, f16 pre-scale per 128-k block and its factor table),
the m16n8k16 fragment registers (emulated MMA from lane registers), the step chain with the scale FMA,
the slice / rank reduction and the output decode, in float64. Compared with the direct product of
bf16(x) and the dequantized weight: a wrong index gives O(1) errors, a right one ~1e-16.
Needs numpy: /work/venv-ref/bin/python3 tests/cuda/gemv_q_v6_model.py
"""
import numpy as np

NT, WARPS, NB, ITEMS, MAXS, KR, FS = 256, 8, 4, 2048, 64, 4096, 40


def cdiv(a, b):
    return -(-a // b)


def schedule(fmt, N, K, groups=1):
    kstep = 64 if fmt == "bf16" else 128
    tiles, nst = groups * cdiv(N, 16), K // kstep
    s = 1
    while s < MAXS and tiles * s < ITEMS and nst >= 2 * s:
        s *= 2
    cs = 1
    while cs < 8 and cdiv(K, cs) > KR:
        cs *= 2
    cs = max(cs, min(s, 4))
    cs = max(cs, s // WARPS)
    s = max(s, cs)
    sw, sps = s // cs, cdiv(nst, s)
    return cs, sw, sps, sw * sps * kstep


def e4m3_table():
    t = np.zeros(256)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if e == 15 and m == 7:
            v = np.nan
        t[b] = -v if s else v
    return t


E4M3 = e4m3_table()


def bf16r(v):
    u = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def mma(C, A, B):
    """C[16, 8] += A[16, 16] · B[16, 8] where A, B are given as lane registers (pairs of values)."""
    Am, Bm = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a0, a1, a2, a3 = A[lane]
        b0, b1 = B[lane]
        Am[g, 2 * t:2 * t + 2], Am[g + 8, 2 * t:2 * t + 2] = a0, a1
        Am[g, 2 * t + 8:2 * t + 10], Am[g + 8, 2 * t + 8:2 * t + 10] = a2, a3
        Bm[2 * t:2 * t + 2, g], Bm[2 * t + 8:2 * t + 10, g] = b0, b1
    C += Am @ Bm


def run(fmt, M, N, K, ldws_pad=0, seed=0, groups=1):
    """One group's product under the schedule of `groups` groups (gemv_q_v6_groups: the other groups only
    offset the pointers)."""
    rng = np.random.default_rng(seed)
    cs, sw, sps, kr = schedule(fmt, N, K, groups)
    kstep = 64 if fmt == "bf16" else 128
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(-30, 30, (M, K // 128)).repeat(128, 1))
    if fmt == "fp8":
        wb = rng.integers(0, 0x7F, (N, K)).astype(np.uint8) | (rng.integers(0, 2, (N, K)).astype(np.uint8) << 7)
        ldws = K // 128 + ldws_pad
        sc = np.exp2(rng.integers(-10, 10, (cdiv(N, 128), ldws))).astype(np.float64)
        wv = E4M3[wb] * np.repeat(np.repeat(sc[:, :K // 128], 128, 0)[:N], 128, 1)
        rowbytes = wb  # [N, K] bytes
    else:
        wvals = bf16r(rng.standard_normal((N, K)))
        wv = wvals
        rowbytes = None
    ref = bf16r(x) @ wv.T  # [M, N]

    # weight "bytes" as per-element values: a 16-byte load of a row gives 16 (fp8) / 8 (bf16) values
    def load(n, byte_off):
        if n >= N:
            return np.zeros(16 if fmt == "fp8" else 8)
        if fmt == "fp8":
            return E4M3[rowbytes[n, byte_off:byte_off + 16]]
        return wv[n, byte_off // 2:byte_off // 2 + 8]

    tpb = WARPS // sw
    rounds = cdiv(cdiv(N, 16), tpb)
    y = np.full((M, N), np.nan)
    for rnd in range(rounds):
        parts = []
        for rank in range(cs):
            kb0 = rank * kr
            klen = max(0, min(kr, K - kb0))
            xs_u4 = kr // 8 + (4 if fmt == "bf16" else 1)
            xs = np.zeros((M, xs_u4, 8))
            fs = np.zeros(FS * 8)
            units = klen // 8
            for m in range(M):
                for u in range(units):
                    v = bf16r(x[m, kb0 + 8 * u:kb0 + 8 * u + 8])
                    if fmt == "fp8":
                        blk = bf16r(x[m, kb0 + 128 * (u // 16):kb0 + 128 * (u // 16) + 128])
                        mx = np.abs(blk).max()
                        E = max(int(np.floor(np.log2(mx))) if mx > 0 else -127, -110)
                        h = (v * 2.0 ** (14 - E)).astype(np.float16).astype(np.float64)
                        assert np.all(h == v * 2.0 ** (14 - E)) or np.abs(v).min() < mx * 2.0 ** -31
                        xs[m, u] = h
                        fs[(u // 16) * 8 + m] = 2.0 ** (E - 14)
                    else:
                        xs[m, u] = v
            red = np.zeros((WARPS, 16, 8))
            for warp in range(WARPS):
                tl, sl = warp // sw, warp % sw
                n0 = (rnd * tpb + tl) * 16
                gst0 = rank * (kr // kstep)
                lst0 = sl * sps
                lst1 = min(lst0 + sps, klen // kstep) if n0 < N else lst0
                acc = np.zeros((16, 8))
                for ls in range(lst0, lst1):
                    st = gst0 + ls
                    # per lane: wv[2h] row g, wv[2h+1] row g+8 at bytes 128 st + 64 h + 16 t
                    L = {}
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        L[lane] = [load(n0 + g + 8 * (q & 1), st * 128 + 64 * (q >> 1) + 16 * t) for q in range(4)]
                    if fmt == "bf16":
                        for h in range(2):
                            for i in range(2):
                                A, B = {}, {}
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    w0, w1 = L[lane][2 * h], L[lane][2 * h + 1]
                                    X = xs[g, ls * 8 + 4 * h + t] if g < M else np.zeros(8)
                                    A[lane] = (w0[4 * i:4 * i + 2], w1[4 * i:4 * i + 2], w0[4 * i + 2:4 * i + 4],
                                               w1[4 * i + 2:4 * i + 4])
                                    B[lane] = (X[4 * i:4 * i + 2], X[4 * i + 2:4 * i + 4])
                                mma(acc, A, B)
                    else:
                        blk = np.zeros((16, 8))
                        for h in range(2):
                            for i in range(4):
                                A, B = {}, {}
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    w0, w1 = L[lane][2 * h], L[lane][2 * h + 1]
                                    if g < M:
                                        X = [xs[g, ls * 16 + 8 * h + 2 * t], xs[g, ls * 16 + 8 * h + 2 * t + 1]]
                                    else:
                                        X = [np.zeros(8), np.zeros(8)]
                                    xw = X[i // 2]
                                    j = 2 * (i % 2)  # x words j, j+1 = values 2j..2j+3
                                    A[lane] = (w0[4 * i:4 * i + 2], w1[4 * i:4 * i + 2], w0[4 * i + 2:4 * i + 4],
                                               w1[4 * i + 2:4 * i + 4])
                                    B[lane] = (xw[2 * j:2 * j + 2], xw[2 * j + 2:2 * j + 4])
                                mma(blk, A, B)
                        s = sc[n0 // 128, st]
                        # lane (g, t): acc columns 2t, 2t+1 scaled by fs[ls*8 + 2t], fs[ls*8 + 2t + 1]
                        f = np.array([fs[ls * 8 + c] for c in range(8)])
                        acc += s * f[None, :] * blk
                red[warp] = acc
            part = np.zeros((tpb, 16, 8))
            for q in range(tpb):
                for s_ in range(sw):
                    part[q] += red[q * sw + s_]
            parts.append(part)
        fin = sum(parts)
        for q in range(tpb):
            for row in range(16):
                for m in range(8):
                    n = (rnd * tpb + q) * 16 + row
                    if m < M and n < N:
                        y[m, n] = fin[q, row, m]
    assert not np.isnan(y).any(), "unwritten outputs"
    err = np.abs(y - ref).max() / np.abs(ref).max()
    return (cs, sw, sps, kr), err


if __name__ == "__main__":
    cases = [("fp8", 3, 40, 1152), ("fp8", 8, 20, 4096), ("fp8", 2, 33, 256), ("fp8", 1, 17, 16384),
             ("bf16", 5, 40, 1152), ("bf16", 2, 24, 4096), ("bf16", 8, 17, 512), ("fp8", 4, 300, 1024),
             ("fp8", 3, 136, 512, 8), ("fp8", 2, 1001, 1152, 3)]
    ok = True
    for fmt, M, N, K, *grp in cases:
        sched, err = run(fmt, M, N, K, ldws_pad=3, groups=grp[0] if grp else 1)
        good = err < 1e-12
        ok &= good
        print(f"{fmt} M={M} N={N} K={K} groups={grp[0] if grp else 1} schedule(cs, sw, sps, kr)={sched} max rel err {err:.2e} {'ok' if good else 'FAIL'}")
    # the schedules of the V4-Flash shapes (printed for the notes)
    for fmt, N, K, what in [("fp8", 512, 4096, "wkv"), ("fp8", 1024, 4096, "wq_a"), ("fp8", 32768, 1024, "wq_b"),
                            ("fp8", 4096, 8192, "wo_b"), ("fp8", 4096, 4096, "w13"), ("fp8", 4096, 2048, "w2"),
                            ("bf16", 256, 4096, "router"), ("bf16", 1024, 4096, "compressor"),
                            ("bf16", 129280, 4096, "head"), ("fp8", 1024, 4096, "wo_a x8")]:
        G = 8 if "x8" in what else 1
        cs, sw, sps, kr = schedule(fmt, N, K, G)
        rounds = cdiv(cdiv(N, 16), WARPS // sw)
        print(f"{what:10s} {fmt} N={N} K={K}: cs={cs} sw={sw} steps/slice={sps} k/rank={kr} tile groups={rounds} "
              f"blocks={G * (rounds * cs if cs > 1 else min(rounds, 264 // G))}")
    raise SystemExit(0 if ok else 1)
