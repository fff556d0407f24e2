#!/usr/bin/env python3
"""Host model of gemv_q_v7's index math (src/ops/cuda/gemv_q_v7.cu), no GPU, pure Python.

Mirrors the kernel's warp schedule on integer data: rows w0, w0 + T, ... of a warp, slots (row, j) with
chunk lane + 32j, the batches of 8 slots, the load and compute cursors (g7_next), the ping-pong over the
two register buffers, the early return past the warp's rows and the row end (j == cpl - 1). Every
(row, chunk) must be computed exactly once, from the buffer slot that was loaded for it, in ascending
chunk order a lane, and every row stored exactly once. Also: the shared-memory x layout (chunk c at
c·XS floats, XS = KC + 4) puts the 8 lanes of each quarter-warp's 16-byte reads on distinct bank groups,
and the staging writes (float4 i = k 4i..4i+3) stay inside one chunk. (Not modelled: timing.)
Run: python3 tests/cuda/gemv_q_v7_model.py   (a few seconds)
"""

NL = 8  # loads a lane a batch


def warp(N, C, T, w0, done, stores):
    cpl = (C + 31) // 32
    rows = (N - w0 + T - 1) // T if w0 < N else 0
    nb = (rows * cpl + NL - 1) // NL
    for lane in range(32):
        cl, cc = [w0, 0], [w0, 0]
        order = {}

        def nxt(c):
            c[1] += 1
            if c[1] == cpl:
                c[1] = 0
                c[0] += T

        def load(buf):
            for u in range(NL):
                ch = lane + 32 * cl[1]
                buf[u] = (cl[0], ch) if cl[0] < N and ch < C else None  # (None: registers left stale)
                nxt(cl)

        def comp(buf):
            for u in range(NL):
                if cc[0] >= N:
                    return
                ch = lane + 32 * cc[1]
                if ch < C:
                    assert buf[u] == (cc[0], ch), (buf[u], cc)
                    done[(cc[0], ch)] = done.get((cc[0], ch), 0) + 1
                    assert order.get(cc[0], -1) < ch
                    order[cc[0]] = ch
                if cc[1] == cpl - 1 and lane == 0:
                    stores.append(cc[0])
                nxt(cc)

        wa, wb = [None] * NL, [None] * NL
        if nb > 0:
            load(wa)
        b = 0
        while b < nb:
            if b + 1 < nb:
                load(wb)
            comp(wa)
            if b + 1 >= nb:
                break
            if b + 2 < nb:
                load(wa)
            comp(wb)
            b += 2


def model(N, K, bf16, sms):
    KC = 8 if bf16 else 16
    C = K * (2 if bf16 else 1) // 16
    smem = (K // KC) * (KC + 4) * 4
    bps = 2 if 2 * smem + 2048 <= 227 * 1024 else 1
    T = min((N + 7) // 8, bps * sms) * 8
    done, stores = {}, []
    for w0 in range(T):
        warp(N, C, T, w0, done, stores)
    assert len(done) == N * C and all(v == 1 for v in done.values()), (N, K, bf16)
    assert sorted(stores) == list(range(N)), (N, K, bf16)


def banks(bf16):
    KC = 8 if bf16 else 16
    XS = KC + 4
    for j in range(4):  # cpl slots
        for q in range(KC // 4):  # the chunk's float4 reads
            for quarter in range(4):
                groups = set()
                for lane in range(8 * quarter, 8 * quarter + 8):
                    f = (lane + 32 * j) * XS + 4 * q
                    groups.add((f % 32) // 4)
                assert len(groups) == 8, (bf16, j, q, quarter)
    for i in range(4096 // 4):  # staging: a float4 never straddles chunks
        k = 4 * i
        assert k % KC + 4 <= KC


def main():
    for bf16 in (False, True):
        banks(bf16)
    shapes = [(44, 128, False), (264, 512, False), (1000, 1152, False), (97, 256, True), (1000, 1152, True),
              (264, 16384, False), (40, 32768, True), (1001, 4096, False), (1001, 4096, True), (256, 4096, True),
              (2000, 1024, False)]
    for N, K, bf16 in shapes:
        model(N, K, bf16, sms=132)
        print("ok", N, K, "bf16" if bf16 else "fp8")
    model(300, 1024, False, sms=2)  # many rows a warp, 4 rows a batch
    model(50, 4096, True, sms=1)
    print("ok small grids")


if __name__ == "__main__":
    main()
