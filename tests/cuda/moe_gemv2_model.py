#!/usr/bin/env python3
"""Host model of moe_gemv2's index math (src/ops/cuda/moe_gemv2.cu), no GPU, pure Python.

Mirrors, on integer data: run formation from sel (leaders, run cap mmr), the item ranges of the G blocks,
the rows each warp's bulk copies put in a stage (lane 0 of warp w: rows 2w, 2w + 1), the rows and k
each lane reads back (row rt·16 + g (+ 8), bytes c·64 + 16t of a row = k 128c + 32t .. + 32, scale
byte 4c + t), the x staging unit order of mv_stage_x against the unit each lane reads (the pairing of
the 8 k inside a unit with e2m1x8_raw's A pairs is gemv_q's, not modelled again), the fixed-order
reduction decode (tid → tile, row, column) and the output index. Every (slot, n) output
must be written exactly once with the exact dot product of its expert row and its x row.
Session 8: 64-row items (pairs = 2, unfused: one block copy of the item's rows, a tile-pair loop, the
reduction over pairs · 256 partial sums), the item / stage / phase counters against the divisions they
replace, and x restaged only when the run's x rows change (the staged rows must then be the ones needed).
Run: python3 tests/cuda/moe_gemv2_model.py   (a few seconds)
"""
import random

WARPS, ROWS = 16, 32


def runs_of(sel, mmr):
    slots = len(sel)
    lead = []
    for s in range(slots):
        before = sum(1 for j in range(s) if sel[j] == sel[s])
        lead.append(before % mmr == 0)
    runs = [None] * sum(lead)
    for s in range(slots):
        if not lead[s]:
            continue
        r = sum(lead[:s])
        members = []
        for j in range(s, slots):
            if len(members) == mmr:
                break
            if sel[j] == sel[s]:
                members.append(j)
        runs[r] = (sel[s], members)
    return runs


def model(T, topk, E, N, K, per_slot, fuse, G, rng, pairs=1, S_ring=3):
    S = T * topk
    mmr = 1 if T <= 1 else 2 if T <= 2 else 4 if T <= 4 else 8
    sel = [rng.randrange(E) for _ in range(S)]
    W = [[[rng.randrange(-3, 4) for _ in range(K)] for _ in range(N)] for _ in range(E)]
    nx = S if per_slot else T
    X = [[rng.randrange(-5, 6) for _ in range(K)] for _ in range(nx)]
    I = N // 2
    assert pairs == 1 or (not fuse and N % (2 * ROWS) == 0)
    IR = ROWS * pairs
    RG = I // 16 if fuse else N // IR
    runs = runs_of(sel, mmr)
    nitems = len(runs) * RG
    y = {}
    for b in range(G):
        i0, i1 = nitems * b // G, nitems * (b + 1) // G
        # the kernel's counters: (run, rg) from i0 once, then +1 an item; stage and phase parity likewise
        c_run, c_rg, c_st, c_ph = i0 // RG, i0 % RG, 0, 0
        staged = None  # x offsets staged (restaged only when they change)
        for q, it in enumerate(range(i0, i1)):
            run, rg = divmod(it, RG)
            assert (c_run, c_rg) == (run, rg) and c_st == q % S_ring and c_ph == (q // S_ring) & 1
            e, members = runs[run]
            rows = len(members)
            assert 1 <= rows <= mmr
            need = [members[m] if per_slot else members[m] // topk for m in range(rows)]
            # the kernel's test: restage when the row count or any row's offset differs (rows ≥ the count are
            # never read); a skipped restage must leave exactly the rows this run reads
            if staged is None or len(staged) != rows or any(staged[m] != need[m] for m in range(rows)):
                staged = list(need)
            assert staged == need
            # stage: row L of the item ← expert row n(L); pairs = 1 as the row copies put it (warp L // 2),
            # which is also the block copies' order; pairs = 2 only as one block copy of rows rg·64 ..
            stage = {}
            if pairs == 1:
                for w in range(WARPS):
                    for h in range(2):
                        L = 2 * w + h
                        n = (L >> 4) * I + rg * 16 + (L & 15) if fuse else rg * ROWS + L
                        stage[L] = n
            else:
                for L in range(IR):
                    stage[L] = rg * IR + L
            assert sorted(stage) == list(range(IR))
            # x staging: unit index → (m, k0) as mv_stage_x writes it
            xs = {}
            for m in range(rows):
                for u in range(K // 8):
                    c, t, q = u >> 4, (u >> 2) & 3, u & 3
                    idx = ((c * 4 + q) * mmr + m) * 4 + t
                    assert idx not in xs
                    xs[idx] = (m, u * 8)
            # per warp and tile pair: fragment sums over its chunks; C[pr][rt][row][col]
            red = [[[[[0] * 8 for _ in range(16)] for _ in range(2)] for _ in range(pairs)] for _ in range(WARPS)]
            for w in range(WARPS):
              for pr in range(pairs):
                for c in range(w, K // 128, WARPS):
                    for rt in range(2):
                        for g in range(8):
                            for t in range(4):
                                for hh in range(2):
                                    L = pr * ROWS + rt * 16 + g + 8 * hh
                                    n = stage[L]
                                    kw = c * 128 + t * 32  # the lane's 32 k of this row (one scale block)
                                    for qq in range(4):
                                        # x unit the lane reads for word qq, as column gx of B for each g'
                                        for gx in range(8):
                                            if gx >= rows:
                                                continue
                                            idx = ((c * 4 + qq) * mmr + gx) * 4 + t
                                            m, k0 = xs[idx]
                                            assert m == gx and k0 == kw + 8 * qq
                                            # pairs {j, j+4}: A word pair j = k0 + j, k0 + j + 4; B the same
                                            xr = members[m]
                                            xrow = X[xr if per_slot else xr // topk]
                                            s = sum(W[e][n][k0 + j] * xrow[k0 + j] for j in range(8))
                                            red[w][pr][rt][g + 8 * hh][gx] += s
            # reduction decode as the kernel's store
            if not fuse:
                for tid in range(256 * pairs):
                    pr, rt, r, ln = tid >> 8, (tid >> 7) & 1, (tid >> 5) & 3, tid & 31
                    row, col = (ln >> 2) + 8 * (r >> 1), 2 * (ln & 3) + (r & 1)
                    v = sum(red[w][pr][rt][row][col] for w in range(WARPS))
                    if col < rows:
                        key = (members[col], rg * IR + pr * ROWS + rt * 16 + row)
                        assert key not in y
                        y[key] = v
            else:
                for tid in range(128):
                    r, ln = tid >> 5, tid & 31
                    row, col = (ln >> 2) + 8 * (r >> 1), 2 * (ln & 3) + (r & 1)
                    gt = sum(red[w][0][0][row][col] for w in range(WARPS))
                    up = sum(red[w][0][1][row][col] for w in range(WARPS))
                    if col < rows:
                        key = (members[col], rg * 16 + row)
                        assert key not in y
                        y[key] = (gt, up)
            c_rg += 1
            if c_rg == RG:
                c_rg, c_run = 0, c_run + 1
            c_st += 1
            if c_st == S_ring:
                c_st, c_ph = 0, c_ph ^ 1
    # every slot and output exactly once, exact
    ncol = I if fuse else N
    assert len(y) == S * ncol, (len(y), S * ncol)
    for j in range(S):
        xrow = X[j if per_slot else j // topk]
        for n in range(ncol):
            if fuse:
                ref = (sum(a * b for a, b in zip(W[sel[j]][n], xrow)), sum(a * b for a, b in zip(W[sel[j]][I + n], xrow)))
            else:
                ref = sum(a * b for a, b in zip(W[sel[j]][n], xrow))
            assert y[(j, n)] == ref, (j, n)


def main():
    rng = random.Random(7)
    shapes = [  # T, topk, E, N, K, per_slot, fuse, G, pairs, ring stages
        (1, 6, 16, 64, 512, False, False, 5, 1, 3),
        (1, 6, 16, 64, 512, False, True, 7, 1, 2),
        (3, 6, 2, 32, 512, True, False, 3, 1, 5),
        (5, 6, 6, 64, 1024, False, True, 13, 1, 2),
        (8, 6, 8, 32, 512, True, False, 132, 1, 4),
        (8, 8, 4, 96, 1536, True, False, 4, 1, 3),
        (2, 3, 3, 64, 2048, False, False, 1, 1, 2),
        # 64-row items (the routed w2's form)
        (1, 6, 16, 128, 512, True, False, 5, 2, 2),
        (3, 6, 4, 64, 1024, True, False, 3, 2, 2),
        (8, 6, 8, 128, 512, False, False, 11, 2, 3),
        (2, 3, 3, 64, 2048, True, False, 1, 2, 2),
    ]
    for sh in shapes:
        model(*sh[:8], rng, pairs=sh[8], S_ring=sh[9])
        print("ok", sh)


if __name__ == "__main__":
    main()
