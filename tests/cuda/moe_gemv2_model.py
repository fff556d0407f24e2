#!/usr/bin/env python3
"""Host model of moe_gemv2's index math (src/ops/cuda/moe_gemv2.cu), no GPU, pure Python.

Mirrors, on integer data: run formation from sel (leaders, run cap mmr), the item ranges of the G blocks,
the rows each warp's bulk copies put in a stage (lane 0 of warp w: rows 2w, 2w + 1), the rows and k
each lane reads back (row rt·16 + g (+ 8), bytes c·64 + 16t of a row = k 128c + 32t .. + 32, scale
byte 4c + t), the x staging unit order of mv_stage_x against the unit each lane reads (the pairing of
the 8 k inside a unit with e2m1x8_raw's A pairs is gemv_q's, not modelled again), the fixed-order
reduction decode (tid → tile, row, column) and the output index. Every (slot, n) output
must be written exactly once with the exact dot product of its expert row and its x row.
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


def model(T, topk, E, N, K, per_slot, fuse, G, rng):
    S = T * topk
    mmr = 1 if T <= 1 else 2 if T <= 2 else 4 if T <= 4 else 8
    sel = [rng.randrange(E) for _ in range(S)]
    W = [[[rng.randrange(-3, 4) for _ in range(K)] for _ in range(N)] for _ in range(E)]
    nx = S if per_slot else T
    X = [[rng.randrange(-5, 6) for _ in range(K)] for _ in range(nx)]
    I = N // 2
    RG = I // 16 if fuse else N // ROWS
    runs = runs_of(sel, mmr)
    nitems = len(runs) * RG
    y = {}
    for b in range(G):
        i0, i1 = nitems * b // G, nitems * (b + 1) // G
        for it in range(i0, i1):
            run, rg = divmod(it, RG)
            e, members = runs[run]
            rows = len(members)
            assert 1 <= rows <= mmr
            # stage: row L of the item ← expert row n(L), copied by warp L // 2
            stage = {}
            for w in range(WARPS):
                for h in range(2):
                    L = 2 * w + h
                    n = (L >> 4) * I + rg * 16 + (L & 15) if fuse else rg * ROWS + L
                    stage[L] = n
            assert sorted(stage) == list(range(ROWS))
            # x staging: unit index → (m, k0) as mv_stage_x writes it
            xs = {}
            for m in range(rows):
                for u in range(K // 8):
                    c, t, q = u >> 4, (u >> 2) & 3, u & 3
                    idx = ((c * 4 + q) * mmr + m) * 4 + t
                    assert idx not in xs
                    xs[idx] = (m, u * 8)
            # per warp: fragment sums over its chunks; C[rt][row][col]
            red = [[[[0] * 8 for _ in range(16)] for _ in range(2)] for _ in range(WARPS)]
            for w in range(WARPS):
                for c in range(w, K // 128, WARPS):
                    for rt in range(2):
                        for g in range(8):
                            for t in range(4):
                                for hh in range(2):
                                    L = rt * 16 + g + 8 * hh
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
                                            red[w][rt][g + 8 * hh][gx] += s
            # reduction decode as the kernel's store
            if not fuse:
                for tid in range(256):
                    rt, r, ln = tid >> 7, (tid >> 5) & 3, tid & 31
                    row, col = (ln >> 2) + 8 * (r >> 1), 2 * (ln & 3) + (r & 1)
                    v = sum(red[w][rt][row][col] for w in range(WARPS))
                    if col < rows:
                        key = (members[col], rg * ROWS + rt * 16 + row)
                        assert key not in y
                        y[key] = v
            else:
                for tid in range(128):
                    r, ln = tid >> 5, tid & 31
                    row, col = (ln >> 2) + 8 * (r >> 1), 2 * (ln & 3) + (r & 1)
                    gt = sum(red[w][0][row][col] for w in range(WARPS))
                    up = sum(red[w][1][row][col] for w in range(WARPS))
                    if col < rows:
                        key = (members[col], rg * 16 + row)
                        assert key not in y
                        y[key] = (gt, up)
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
    shapes = [  # T, topk, E, N, K, per_slot, fuse, G
        (1, 6, 16, 64, 512, False, False, 5),
        (1, 6, 16, 64, 512, False, True, 7),
        (3, 6, 2, 32, 512, True, False, 3),
        (5, 6, 6, 64, 1024, False, True, 13),
        (8, 6, 8, 32, 512, True, False, 132),
        (8, 8, 4, 96, 1536, True, False, 4),
        (2, 3, 3, 64, 2048, False, False, 1),
    ]
    for sh in shapes:
        model(*sh, rng)
        print("ok", sh)


if __name__ == "__main__":
    main()
