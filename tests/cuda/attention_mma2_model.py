# Index model of sink_attn_mma2_kernel (src/ops/cuda/attention_mma.cu, v2), no GPU needed: for every d it
# takes, checks that the thread → element maps cover each element exactly once (key-tile copies and their
# conversion, the q load, S warps, softmax heads, P·V tiles, the merge), that the shared-memory layout is
# 16-byte aligned, fits 227 KB and leaves room for the merge's O below S, that ldmatrix row addresses of
# Qs/Ks fall in 8 distinct 16-byte bank groups, that the split ranges cover every key tile once, and
# (pipeline) that no shared buffer is written in a phase where another warp may still read it.
# The MMA fragment layouts and the arithmetic are v1's (the device test checks v2 == v1 bitwise).
# Run: python3 tests/cuda/attention_mma2_model.py. Keep it in step with the kernel when either changes.
from collections import Counter

NT, KT, HB, KS, SPS, PPS = 512, 32, 64, 4, 36, 40


def layout(D):
    q = 0
    k = q + HB * (D + 8) * 2
    stg = k + 2 * KT * (D + 8) * 2  # two key buffers (tile t in buffer t & 1)
    s = stg + KT * D * 4
    p = s + 2 * HB * SPS * 4
    cr = p + HB * PPS * 2
    ml = cr + HB * 4
    wt = ml + HB * 2 * 4
    total = wt + (HB // KS) * (KS + 1) * 4
    return dict(q=q, k=k, stg=stg, s=s, p=p, cr=cr, ml=ml, wt=wt, total=total)


def check(D):
    DH, CPR = D // 2, D // 4
    RPP = NT // CPR
    PASSES = KT // RPP
    assert PASSES * RPP == KT
    # key tile: copy and conversion chunks (row, 16-byte chunk), once each, a thread its own chunks
    c = Counter()
    for tid in range(NT):
        ch, r0 = tid % CPR, tid // CPR
        for k in range(PASSES):
            c[(r0 + k * RPP, ch)] += 1
    assert set(c) == {(r, x) for r in range(KT) for x in range(CPR)} and set(c.values()) == {1}
    # q load: (head, column pair) once each
    QP = D // 2
    HPP = NT // QP
    QPASS = HB // HPP
    U = min(QPASS, 16)
    assert QPASS % U == 0
    c = Counter()
    for tid in range(NT):
        cc, hr = 2 * (tid % QP), tid // QP
        for j in range(QPASS):
            c[(hr + j * HPP, cc)] += 1
    assert set(c) == {(h, x) for h in range(HB) for x in range(0, D, 2)} and set(c.values()) == {1}
    # S: (half, 16-head tile, 16-key half) once each; softmax heads once each
    s = Counter((wp >> 3, (wp & 7) & 3, (wp & 7) >> 2) for wp in range(16))
    assert len(s) == 16 and set(s.values()) == {1}
    sm = Counter(4 * wp + u for wp in range(16) for u in range(4))
    assert set(sm) == set(range(HB)) and set(sm.values()) == {1}
    # P·V: (head row tile, n8 column tile) of the full width once each
    NTILES = DH // 8
    WC = 8 if NTILES >= 8 else NTILES
    WH = 8 // WC
    MT, NTT = 4 // WH, NTILES // WC
    pv = Counter()
    for wp in range(16):
        hf, wl = wp >> 3, wp & 7
        ph, pc = wl // WC, wl % WC
        for i in range(MT):
            for j in range(NTT):
                pv[(ph * MT + i, hf * DH // 8 + pc * NTT + j)] += 1
    assert set(pv) == {(a, b) for a in range(4) for b in range(D // 8)} and set(pv.values()) == {1}
    # merge: (head, 4-column group) once each over the 4 split CTAs
    mg = Counter()
    for split in range(KS):
        for tid in range(NT):
            for idx in range(tid, (HB // KS) * (D // 4), NT):
                mg[(HB // KS * split + idx // (D // 4), 4 * (idx % (D // 4)))] += 1
    assert set(mg) == {(h, x) for h in range(HB) for x in range(0, D, 4)} and set(mg.values()) == {1}
    # layout
    L = layout(D)
    assert all(v % 16 == 0 for v in L.values()), L
    assert L['total'] <= 227 * 1024 and HB * D * 4 <= L['s'], L
    row = (D + 8) * 2  # Qs / Ks row bytes: 8 consecutive rows in distinct 16-byte groups of 128 B
    assert len({(r * row) % 128 // 16 for r in range(8)}) == 8
    return L['total'], PASSES, U


def pipeline(T):
    # Phases of one CTA's loop as v2 runs them, barriers (B) between; writes and reads a phase may do
    # concurrently across warps (a warp runs ahead only up to the next barrier). Stg is left out: a thread
    # copies into and converts only its own chunks (covered above).
    ph = [[('w', 'K0'), ('r', 'Q')]]  # prologue: convert tile 0 into buffer 0, q written
    for t in range(T):
        b, nb = f'K{t & 1}', f'K{(t + 1) & 1}'
        ph.append([('r', b), ('r', 'Q'), ('w', 'S')])           # S(t)
        ph.append([('r', 'S'), ('w', 'P')])                     # softmax(t): P and the correction
        tail = [('r', 'P'), ('r', b)]                           # P·V(t)
        if t + 1 < T:
            tail.append(('w', nb))                              # convert(t + 1), overlapping P·V(t)
        ph.append(tail)
    for seg in ph:  # within a segment between barriers: no buffer both written and read (or written twice)
        wr = [x for a, x in seg if a == 'w']
        rd = [x for a, x in seg if a == 'r']
        assert not (set(wr) & set(rd)) and len(wr) == len(set(wr)), seg
    return len(ph)


def splits(n):
    T = (n + KT - 1) // KT
    ns = max(1, min(KS, T))
    cover = Counter()
    for split in range(KS):
        t0 = split * T // ns if split < ns else T
        t1 = (split + 1) * T // ns if split < ns else T
        for t in range(t0, t1):
            cover[t] += 1
    assert set(cover) == set(range(T)) and set(cover.values()) <= {1}
    return T


for D in (64, 128, 256, 512):
    total, passes, u = check(D)
    print(f"d={D}: shared {total} B ({total / 1024:.1f} KB), {passes} copy passes a tile, q loads {u} pairs in flight")
for n in list(range(0, 300)) + [640, 2000, 4096, 16384]:
    T = splits(n)
    pipeline((T + KS - 1) // KS)
print("all index maps cover each element once")
