#!/usr/bin/env python3
"""Host model of moe_gemv3's index math (src/ops/cuda/moe_gemv3.cu), no GPU, pure Python.

Mirrors, on integer data, what changed from moe_gemv2 (tests/cuda/moe_gemv2_model.py models the rest):
the block's item counters (run, rg), the rows an item has (32, or 64 with two tiles a warp) for the compute and copy sides, the stage ring (stage, phase), the
copier lanes (lanes 0..3 of warps 0..7 copy row 4·warp + lane), the x buffers (which run's rows a buffer
holds, same_x sharing, up-front staging of two distinct x, restaging into the other buffer), the
coalesced staging (float4 i → row m, f; lane pairs swap halves; the unit index), the lane reads with
the slice pointers (weights, scale byte, x unit), the compact partial sums [buf][tile][slice][16·mmr]
and the reduction decode (tid → row, column) with the output index. Every (slot, n) must be written
exactly once with the exact dot product, and each stage must hold the item the compute side expects.
(Not modelled: timing, i.e. that the barrier order keeps a partial-sum buffer and a stage from being
rewritten early; that argument is in the kernel's comments.)
Run: python3 tests/cuda/moe_gemv3_model.py   (a few seconds)
"""
import random

WARPS, SLICES, ROWS, NT = 32, 16, 32, 1024


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


def model(T, topk, E, N, K, per_slot, fuse, G, S, xbufs, nred, rng, tpw=1):
    assert tpw == 1 or not fuse
    IROWS = ROWS * tpw  # an item's rows
    slots = T * topk
    mmr = 1 if T <= 1 else 2 if T <= 2 else 4 if T <= 4 else 8
    sel = [rng.randrange(E) for _ in range(slots)]
    W = [[[rng.randrange(-3, 4) for _ in range(K)] for _ in range(N)] for _ in range(E)]
    nx = slots if per_slot else T
    X = [[rng.randrange(-5, 6) for _ in range(K)] for _ in range(nx)]
    I = N // 2
    RG = I // 16 if fuse else N // IROWS
    runs = runs_of(sel, mmr)
    nitems = len(runs) * RG
    xrow = lambda slot: slot if per_slot else slot // topk

    def same_x(ra, rb):
        a, b = runs[ra][1], runs[rb][1]
        return len(a) == len(b) and all(xrow(i) == xrow(j) for i, j in zip(a, b))

    y = {}
    for blk in range(G):
        i0, i1 = nitems * blk // G, nitems * (blk + 1) // G
        nq = i1 - i0
        if nq <= 0:
            continue
        ring = {}  # stage → (run, rg, rows dict L → n)
        pending = {}  # stage → phase that will complete it

        def issue(run, rg, st):
            rowsmap = {}
            for w in range(8):
                for lane in range(IROWS // 8):
                    crow = (IROWS // 8) * w + lane
                    wrow = (crow >> 4) * I + (crow & 15) if fuse else crow
                    n = wrow + rg * (16 if fuse else IROWS)
                    assert crow not in rowsmap
                    rowsmap[crow] = n
            assert sorted(rowsmap) == list(range(IROWS))
            assert st not in ring, "stage refilled before it was consumed"
            ring[st] = (run, rg, rowsmap)

        run_i, rg_i = i0 // RG, i0 % RG
        for q in range(min(S, nq)):
            issue(run_i, rg_i, q)
            rg_i += 1
            if rg_i == RG:
                rg_i, run_i = 0, run_i + 1

        xbuf = [dict() for _ in range(2)]  # buffer → unit index → 4 words (lo, hi)

        def stage_x(ra, ba, rb, bb):
            q4 = K // 4
            n0 = len(runs[ra][1]) * q4
            total = n0 + (len(runs[rb][1]) * q4 if rb >= 0 else 0)
            assert total % 32 == 0 and n0 % 32 == 0
            loaded = {}
            for i in range(total):  # every thread's float4 (warps all in or all out)
                second = i >= n0
                ii = i - (n0 if second else 0)
                m, f = divmod(ii, q4)
                members = runs[rb if second else ra][1]
                loaded[i] = X[xrow(members[m])][4 * f:4 * f + 4]
            for i in range(total):
                second = i >= n0
                ii = i - (n0 if second else 0)
                m, f = divmod(ii, q4)
                h, u = f & 1, f >> 1
                assert (i & 1) == h  # lane parity = the half it holds
                v, partner = loaded[i], loaded[i ^ 1]
                s0, s1 = (v[0], v[1]) if h else (v[2], v[3])
                # the partner sends its (s0, s1)
                po = (partner[0], partner[1]) if not h else (partner[2], partner[3])
                o0, o1 = po
                words = [(o0, v[2]), (o1, v[3])] if h else [(v[0], o0), (v[1], o1)]
                c, tt, qw = u >> 4, (u >> 2) & 3, u & 3
                unit = ((c * 4 + qw) * mmr + m) * 4 + tt
                b = bb if second else ba
                ent = xbuf[b].setdefault(unit, [None] * 4)
                for k, wd in enumerate(words):
                    assert ent[2 * h + k] is None or True
                    ent[2 * h + k] = wd

        run_c, rg_c = i0 // RG, i0 % RG
        buf_run = [run_c, -1]
        if xbufs > 1:
            for r in range(run_c + 1, (i1 - 1) // RG + 1):
                if not same_x(r, run_c):
                    buf_run[1] = r
                    break
        for b in range(2):
            xbuf[b].clear()
        stage_x(buf_run[0], 0, buf_run[1], 1)

        red = [dict() for _ in range(nred)]
        red_item = [None] * nred  # item whose sums a buffer holds, not yet reduced
        cur_run, cur_b = -1, 0
        st, phase = 0, 0
        for q in range(nq):
            run, rg = run_c, rg_c
            if run != cur_run:
                b = -1
                if buf_run[0] == run or same_x(buf_run[0], run):
                    b = 0
                elif buf_run[1] >= 0 and (buf_run[1] == run or same_x(buf_run[1], run)):
                    b = 1
                if b < 0:
                    b = cur_b ^ 1 if xbufs > 1 else 0
                    xbuf[b].clear()
                    stage_x(run, b, -1, 0)
                    buf_run[b] = run
                cur_run, cur_b = run, b
            rows = len(runs[run][1])
            e, members = runs[run]
            assert st in ring and ring[st][:2] == (run, rg), "wrong item in the stage"
            rowsmap = ring[st][2]
            rbuf = q & 1 if nred > 1 else 0
            assert red_item[rbuf] is None, "partial sums overwritten before their reduction"
            red[rbuf] = {}
            tile_f, slice_f = SLICES * 16 * mmr, 16 * mmr
            for warp, j in [(w, j) for w in range(WARPS) for j in range(tpw)]:
                rt, sl = (warp >> 4) + 2 * j, warp & 15
                for g in range(8):
                    for t in range(4):
                        acc = [0, 0, 0, 0]
                        for c in range(sl, K // 128, SLICES):
                            for hh in range(2):  # rows g (w0) and g + 8 (w1)
                                L = rt * 16 + g + 8 * hh
                                n = rowsmap[L]
                                for gx in range(8):  # MMA column gx: the x unit lane (gx, t) reads
                                    if gx >= rows:
                                        continue
                                    # xl0 + qq·4·mmr, advanced 256·mmr a slice step from sl·16·mmr
                                    for qq in range(4):
                                        idx = min(gx, rows - 1) * 4 + t + sl * 16 * mmr + ((c - sl) // SLICES) * 16 * mmr * SLICES + qq * mmr * 4
                                        words = xbuf[cur_b][idx]
                                        k0 = c * 128 + t * 32 + 8 * qq  # the lane's weight word qq
                                        wv = W[e][n][k0:k0 + 8]
                                        sdot = sum(wv[j] * words[j][0] + wv[j + 4] * words[j][1] for j in range(4))
                                        # register r: row g + 8·(r / 2), column 2t' + r % 2 of lane (g, t')
                                        acc_key = (hh, gx)
                                        red_k = (rt, sl, g + 8 * hh, gx)
                                        red[rbuf][red_k] = red[rbuf].get(red_k, 0) + sdot
            # (the compact store keeps columns < mmr at rb[(row)·mmr + col] of [tile][slice]; model by keys)
            for k in list(red[rbuf]):
                rt, sl, row, col = k
                assert col < mmr
            red_item[rbuf] = q
            # barrier; copy the next item into this stage
            del ring[st]
            if q + S < nq:
                issue(run_i, rg_i, st)
                rg_i += 1
                if rg_i == RG:
                    rg_i, run_i = 0, run_i + 1
            st += 1
            if st == S:
                st, phase = 0, phase ^ 1
            rg_c += 1
            if rg_c == RG:
                rg_c, run_c = 0, run_c + 1
            # reduction: threads tid < 32·mmr (or 16·mmr fused), slices 0..15 in order
            rq = red[rbuf]
            if not fuse:
                for tid in range(NT - IROWS * mmr, NT):  # the last threads
                    row, col = divmod(tid - (NT - IROWS * mmr), mmr)
                    v = sum(rq.get((row >> 4, s, row & 15, col), 0) for s in range(SLICES))
                    if col < rows:
                        key = (members[col], rg * IROWS + row)
                        assert key not in y
                        y[key] = v
            else:
                for tid in range(NT - 16 * mmr, NT):
                    row, col = divmod(tid - (NT - 16 * mmr), mmr)
                    gt = sum(rq.get((0, s, row, col), 0) for s in range(SLICES))
                    up = sum(rq.get((1, s, row, col), 0) for s in range(SLICES))
                    if col < rows:
                        key = (members[col], rg * 16 + row)
                        assert key not in y
                        y[key] = (gt, up)
            red_item[rbuf] = None
        assert run_c * RG + rg_c == i1
    ncol = I if fuse else N
    assert len(y) == slots * ncol, (len(y), slots * ncol)
    for j in range(slots):
        xr = X[xrow(j)]
        for n in range(ncol):
            if fuse:
                ref = (sum(a * b for a, b in zip(W[sel[j]][n], xr)), sum(a * b for a, b in zip(W[sel[j]][I + n], xr)))
            else:
                ref = sum(a * b for a, b in zip(W[sel[j]][n], xr))
            assert y[(j, n)] == ref, (j, n)


def main():
    rng = random.Random(11)
    shapes = [  # T, topk, E, N, K, per_slot, fuse, G, S, xbufs, nred
        (1, 6, 16, 64, 512, False, False, 5, 3, 1, 2),
        (1, 6, 16, 64, 512, False, True, 7, 3, 1, 2),
        (1, 6, 16, 64, 512, True, False, 3, 5, 2, 2),
        (3, 6, 2, 32, 512, True, False, 3, 4, 2, 2),
        (5, 6, 6, 64, 1024, False, True, 2, 2, 1, 1),
        (8, 6, 8, 32, 512, True, False, 1, 2, 2, 1),
        (8, 2, 4, 96, 1536, True, False, 4, 5, 2, 2),
        (2, 3, 3, 64, 2048, False, False, 1, 2, 2, 2),
        (4, 2, 3, 64, 1024, True, True, 2, 6, 1, 2),
    ]
    for sh in shapes:
        model(*sh, rng)
        print("ok", sh)
    for sh in [(1, 6, 16, 128, 2048, True, False, 5, 2, 2, 2), (3, 4, 4, 64, 2048, True, False, 2, 2, 1, 1),
               (8, 2, 3, 128, 2048, False, False, 3, 2, 2, 2)]:  # two tiles a warp (w2: K = 2048, not fused)
        model(*sh, rng, tpw=2)
        print("ok tpw=2", sh)


if __name__ == "__main__":
    main()
