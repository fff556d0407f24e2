# Index model of gemv4_kernel (src/ops/cuda/gemv_q.cu), no GPU needed: mirrors the x staging, the per-thread
# ring (jobs, stages, fp4 scale words), the B-fragment x reads, the fixed-order reduction and the output
# decode (plain and fused SwiGLU, whose act is modelled as 1000·gate + up), on integer data, and checks
# every output exactly against x·Wᵀ and written once. The MMA is modelled by its PTX fragment roles.
# Run: python3 tests/cuda/gemv_q_v4_model.py (numpy). Keep it in step with the kernel when either changes.
import numpy as np, itertools, sys
WARPS, NT, RT, KSL, MAXM = 8, 256, 2, 2048, 32
def cdiv(a, b): return (a + b - 1) // b
def pow2ceil(m):
    r = 1
    while r < m: r *= 2
    return r
def plan(rg, K, CK, sms=132):
    cs = 1
    while cs * KSL < K: cs *= 2
    while cs < 8 and rg * cs < 2 * sms and cdiv(cdiv(K, 2 * cs), CK) >= WARPS: cs *= 2
    return cs, cdiv(cdiv(K, cs), CK) * CK
def run(fmt, M, N, K, gx_override=None, S=3, fuse=False, seed=0):
    VPT = {'bf16': 8, 'fp8': 16, 'fp4': 32}[fmt]; NQ = VPT // 8; CK = 4 * VPT
    rng = np.random.default_rng(seed)
    W = rng.integers(-3, 4, size=(N, K)).astype(np.float64)
    X = rng.integers(-3, 4, size=(M, K)).astype(np.float64)
    I = N // 2
    row_groups = cdiv(N, 32)
    cs, kslice = plan(row_groups, K, CK)
    mmr = pow2ceil(M)
    gx = min(row_groups, gx_override or 264 // cs)
    Y = np.full((M, N if not fuse else I), np.nan)
    def tile_row(rg, rt): return rt * I + rg * 16 if fuse else rg * 32 + rt * 16
    parts = {}
    for bx in range(gx):
        ranks = []
        for rank in range(cs):
            kbase = rank * kslice
            klen = max(0, min(kslice, K - kbase)); nch = cdiv(klen, CK); nbat = max(1, cdiv(nch, WARPS))
            nrg = (row_groups - bx + gx - 1) // gx if bx < row_groups else 0
            njobs = nrg * nbat
            # fill_x4: xs[unit] = (m, kstart)  (unit holds x[m, kstart .. kstart+8) in the format's order)
            xs = {}
            units = nch * CK // 8; total = M * units
            for idx in range(total):
                m = idx // units; u = idx - m * units; k = kbase + u * 8
                c = u // (4 * NQ); rem = u % (4 * NQ); t = rem // NQ; q = rem % NQ
                key = ((c * NQ + q) * mmr + m) * 4 + t
                assert key < (kslice // 8) * mmr and key not in xs
                xs[key] = (m, k if k < K else None)
            ring = {}
            def issue(q):
                if q >= njobs: return
                rg = bx + (q // nbat) * gx; b = q % nbat; st = q % S
                for warp in range(WARPS):
                    c = warp + WARPS * b; cok = c < nch; kc = kbase + c * CK
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3; kk = kc + t * VPT
                        for rt in range(RT):
                            for h in range(2):
                                n = tile_row(rg, rt) + g + 8 * h
                                ok = cok and kk < K and n < N
                                ring[(st, warp, rt * 2 + h, lane)] = (q, (n, kk) if ok else None)
                        if fmt == 'fp4':  # lane L: word of row L%16 of tile L/16: scale bytes kc/32 .. +3
                            n = tile_row(rg, lane >> 4) + (lane & 15)
                            ring[('s', st, warp, lane)] = (q, (n, kc // 32) if (cok and n < N) else None)
            for q in range(S - 1): issue(q)
            acc = {}
            out = {}
            for q in range(njobs):
                issue(q + S - 1)
                b = q % nbat; st = q % S
                for warp in range(WARPS):
                    c = warp + WARPS * b
                    if c >= nch: continue
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        for rt in range(RT):
                            for h in range(2):
                                qq_, ent = ring[(st, warp, rt * 2 + h, lane)]
                                assert qq_ == q
                                if fmt == 'fp4':
                                    qs, sent = ring[('s', st, warp, rt * 16 + g + 8 * h)]
                                    assert qs == q
                                    if ent is not None:
                                        n, kk = ent
                                        assert sent is not None and sent[0] == n and sent[1] + t == kk // 32
                                if ent is None: continue
                                n, kk = ent
                                # A row (g + 8h) of tile rt; B columns 8j + g' from lanes (g', t)
                                for j in range(4):
                                    if 8 * j >= M: break  # j < ncg
                                    for gp in range(8):
                                        col = 8 * j + gp
                                        if col >= M: continue
                                        for qq in range(NQ):
                                            key = ((c * NQ + qq) * mmr + col) * 4 + t
                                            m, ks = xs[key]
                                            assert m == col and ks == kk + 8 * qq, (m, col, ks, kk, qq)
                                            v = W[n, ks:ks + 8] @ X[m, ks:ks + 8]
                                            # C fragment owner: lane (g, gp//2 ...) register r: row g+8h, col 2tt+r%2
                                            tt, r = gp // 2, 2 * h + gp % 2
                                            acc[(warp, rt, j, r, g * 4 + tt)] = acc.get((warp, rt, j, r, g * 4 + tt), 0.0) + v
                if b == nbat - 1:
                    i_rg = q // nbat; rg = bx + i_rg * gx
                    ncg = (M + 7) // 8; REDN = RT * ncg * 128
                    halves = 2 if ncg > 2 else 1; cgh = 2 if ncg > 2 else ncg; REDH = RT * cgh * 128
                    pp = np.full(REDN, np.nan)
                    red = np.full(WARPS * REDH, np.nan)  # stale between halves, as in shared memory
                    for hf in range(halves):
                        for warp in range(WARPS):
                            for rt in range(RT):
                                for j in range(4):
                                    if j >= ncg: break
                                    jl = j - hf * cgh
                                    if jl < 0 or jl >= cgh: continue
                                    for r in range(4):
                                        for ln in range(32):
                                            red[warp * REDH + ((rt * cgh + jl) * 4 + r) * 32 + ln] = acc.get((warp, rt, j, r, ln), 0.0)
                        for el in range(REDH):
                            rt = el // (cgh * 128); j = (el >> 7) % cgh + hf * cgh
                            if j >= ncg: continue
                            v = sum(red[w * REDH + el] for w in range(WARPS))
                            e = ((rt * ncg + j) << 7) + (el & 127)
                            assert np.isnan(pp[e]); pp[e] = v
                    assert not np.isnan(pp).any()
                    acc = {}
                    ranks.append(None)
                    parts.setdefault((bx, rg), []).append(pp)
        # rank 0 output
        for (bx_, rg), pl in parts.items():
            if bx_ != bx: continue
            assert len(pl) == cs
            pp = sum(pl)
            ncg = (M + 7) // 8; REDN = RT * ncg * 128; hsz = ncg * 128
            if not fuse:
                for e in range(REDN):
                    rt = e // hsz; j = (e >> 7) % ncg; r = (e >> 5) & 3; ln = e & 31
                    row = (ln >> 2) + 8 * (r >> 1); col = 8 * j + 2 * (ln & 3) + (r & 1)
                    n = tile_row(rg, rt) + row
                    if col < M and n < N:
                        assert np.isnan(Y[col, n]); Y[col, n] = pp[e]
            else:
                for e in range(hsz):
                    j = e >> 7; r = (e >> 5) & 3; ln = e & 31
                    row = (ln >> 2) + 8 * (r >> 1); col = 8 * j + 2 * (ln & 3) + (r & 1)
                    i = rg * 16 + row
                    if col < M and i < I:
                        assert np.isnan(Y[col, i]); Y[col, i] = pp[e] * 1000 + pp[hsz + e]
    ref = X @ W.T
    if fuse: ref = ref[:, :I] * 1000 + ref[:, I:]
    assert not np.isnan(Y).any(), "unwritten outputs"
    assert np.array_equal(Y, ref), np.abs(Y - ref).max()
    print("ok", fmt, M, N, K, "cs", cs, "kslice", kslice, "gx", gx, "fuse", fuse)
for args in [('bf16', 1, 40, 256, 3), ('bf16', 9, 97, 520, 2), ('bf16', 32, 70, 1032, 3), ('bf16', 3, 33, 4096, 5),
             ('fp4', 5, 40, 512, 2), ('fp4', 17, 64, 4096, 3), ('fp8', 31, 50, 1152, 4)]:
    fmt, M, N, K, gxo = args
    run(fmt, M, N, K, gx_override=gxo)
run('bf16', 17, 40, 256, gx_override=1)
run('fp4', 2, 64, 512, gx_override=1, fuse=True)
run('fp4', 25, 64, 512, gx_override=2, fuse=True)
run('bf16', 12, 96, 264, gx_override=2, fuse=True, S=2)
