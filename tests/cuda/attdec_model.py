# Host model of attdec (sink_attn_dec_kernel, attention_mma.cu) against v2 (sink_attn_mma2_kernel): the
# products are stand-ins (S given, P·V as a float sum of 16 terms a k-step), but every softmax, chain and
# merge operation is the kernels' in the kernels' order, with attdec's index maps (splits, chunks, tiles,
# (head, tile) pairs, prefix max, l chain, O chain, merge). Bitwise equality expected; a mutant (p taken
# against the tile's own max instead of the running max) must differ. Also the shared-memory layout.
import struct, math, random
INF = float('inf')
def f32(x):
    if x == INF or x == -INF: return x
    return struct.unpack('f', struct.pack('f', x))[0]
KT, KS_, CT, HG = 32, 4, 5, 16
def fma(a, b, c): return f32(float(a) * float(b) + float(c))
def bf16(x):
    b = struct.unpack('I', struct.pack('f', x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack('f', struct.pack('I', b))[0]
def tree_sum(v):  # xor butterfly like warp_sum: every lane ends with the same value; lane 0's
    v = list(v)
    o = 16
    while o:
        v = [f32(v[i] + v[i ^ o]) for i in range(32)]
        o >>= 1
    return v[0]
def wmax(v): return max(v)
def run_v2(n, S, V, scale, sinks, H):
    T = (n + KT - 1) // KT; ns = max(1, min(KS_, T))
    res = []
    ML = []; OS = []
    for split in range(KS_):
        t0 = split * T // ns if split < ns else T; t1 = (split + 1) * T // ns if split < ns else T
        m = [f32(-INF)] * H; l = [f32(0)] * H; O = [[f32(0)] * len(V[0]) for _ in range(H)]
        for t in range(t0, t1):
            nv = min(KT, n - t * KT)
            for h in range(H):
                s = [f32(S[h][t * KT + i] * scale) if i < nv else f32(-INF) for i in range(KT)]
                mo = m[h]; mn = max(mo, wmax(s))
                p = [f32(0) if x == -INF else f32(math.exp(f32(x - mn))) for x in s]
                c = f32(1) if mn == -INF else f32(math.exp(f32(mo - mn)))
                l[h] = fma(l[h], c, tree_sum(p)); m[h] = mn
                pb = [bf16(x) for x in p]
                for col in range(len(V[0])):
                    acc = f32(O[h][col] * c)
                    for ks in range(2):
                        acc = f32(acc + sum(float(pb[16*ks+i]) * float(V[t*KT+16*ks+i][col]) if t*KT+16*ks+i < len(V) else 0.0 for i in range(16)))
                    O[h][col] = acc
        ML.append((m, l)); OS.append(O)
    return merge(ML, OS, sinks, H, len(V[0]))
def merge(ML, OS, sinks, H, d):
    out = [[0.0] * d for _ in range(H)]
    for h in range(H):
        mx = f32(sinks[h]); w = []
        for j in range(KS_): w.append(ML[j][0][h]); mx = max(mx, w[j])
        L = f32(math.exp(f32(sinks[h] - mx)))
        for j in range(KS_):
            w[j] = f32(0) if w[j] == -INF else f32(math.exp(f32(w[j] - mx)))
            L = fma(ML[j][1][h], w[j], L)
        inv = f32(f32(1) / L)
        for c in range(d):
            a = f32(0)
            for j in range(KS_):
                if w[j] == 0: continue
                a = fma(OS[j][h][c], w[j], a)
            out[h][c] = f32(a * inv)
    return out
def run_dec(n, S, V, scale, sinks, H):
    T = (n + KT - 1) // KT; ns = max(1, min(KS_, T))
    NCH = ((T + ns - 1) // ns + CT - 1) // CT
    ML = []; OS = []
    for split in range(KS_):
        t0 = split * T // ns if split < ns else T; t1 = (split + 1) * T // ns if split < ns else T
        m = [f32(-INF)] * H; l = [f32(0)] * H; O = [[f32(0)] * len(V[0]) for _ in range(H)]
        for c in range(NCH):
            ntc = max(0, min(t1 - (t0 + c * CT), CT)); kb = (t0 + c * CT) * KT
            kv = max(0, min(n - kb, ntc * KT))
            Mt = {}; Sc = {}; Ct = {}; Sm = {}; Ps = {}
            for pr in range(HG * CT):
                h, t = pr // CT, pr % CT
                if not (t < ntc) or h >= H: continue
                s = []
                for lane in range(KT):
                    key = t * KT + lane
                    s.append(f32(S[h][kb + key] * scale) if key < kv else f32(-INF))
                Sc[h, t] = s; Mt[h, t] = max(s)
            Mraw = dict(Mt)
            for h in range(H):
                mo = m[h]
                for t in range(ntc):
                    mn = max(mo, Mt[h, t]); Ct[h, t] = f32(1) if mn == -INF else f32(math.exp(f32(mo - mn)))
                    Mt[h, t] = mn; mo = mn
                m[h] = mo
            for (h, t), s in Sc.items():
                mref = Mraw[h, t] if MUTANT else Mt[h, t]
                p = [f32(0) if x == -INF else f32(math.exp(f32(x - mref))) for x in s]
                Sm[h, t] = tree_sum(p); Ps[h, t] = [bf16(x) for x in p]
            for h in range(H):
                for t in range(ntc): l[h] = fma(l[h], Ct[h, t], Sm[h, t])
            for h in range(H):
                for col in range(len(V[0])):
                    acc = O[h][col]
                    for t in range(ntc):
                        acc = f32(acc * Ct[h, t])
                        for ks in range(2):
                            k0 = kb + t * KT + 16 * ks
                            acc = f32(acc + sum(float(Ps[h, t][16*ks+i]) * float(V[k0+i][col]) if k0 + i < kb + kv else 0.0 for i in range(16)))
                    O[h][col] = acc
        ML.append((m, l)); OS.append(O)
    return merge(ML, OS, sinks, H, len(V[0]))
MUTANT = False
bad = 0
for CT in (5, 2):  # the backend's chunk, the narrow variant's
    random.seed(1)
    for n in [0, 1, 31, 32, 33, 100, 161, 640, 700, 1000]:
        H, d = 2, 3
        S = [[f32(random.gauss(0, 3)) for _ in range(max(n, 1))] for _ in range(H)]
        V = [[bf16(f32(random.gauss(0, 1))) for _ in range(d)] for _ in range(max(n, 1))]
        sinks = [f32(random.gauss(0, 1)) for _ in range(H)]
        a = run_v2(n, S, V, f32(0.7), sinks, H)
        MUTANT = False
        b = run_dec(n, S, V, f32(0.7), sinks, H)
        MUTANT = True
        mb = run_dec(n, S, V, f32(0.7), sinks, H)
        MUTANT = False
        ok = a == b
        bad += not ok
        print(f"CT={CT} n={n}: attdec {'==' if ok else '!='} v2; mutant {'==' if a == mb else '!='} v2")
        if n == 640 and a == mb:
            print("FAIL: the mutant was not detected"); bad += 1

# Shared-memory layout (AdLayout) for every d: 16-byte aligned regions, fits 227 KB, bank properties.
for D, CT in ((64, 5), (128, 5), (256, 5), (512, 5), (512, 2)):
    DH = D // 2; KC = CT * KT
    k = 0; q = k + KC * (DH + 8) * 4; sp = q + HG * (DH + 8) * 2; sc = sp + HG * (KC + 4) * 4
    p = sc + HG * (KC + 4) * 4; mt = p + HG * (KC + 8) * 2; ct = mt + HG * CT * 4; sm = ct + HG * CT * 4
    ml = sm + HG * CT * 4; wt = ml + HG * 2 * 4; rows = wt + (HG // KS_) * (KS_ + 1) * 4; total = rows + KC * 4
    for name, off in (("q", q), ("sp", sp), ("sc", sc), ("p", p), ("mt", mt)):
        if off % 16: print(f"FAIL: D={D} region {name} at {off} not 16-byte aligned"); bad += 1
    if total + 1024 > 232448: print(f"FAIL: D={D} {total} B of shared memory"); bad += 1
    if CT == 2 and 2 * (total + 1024) > 233472: print(f"FAIL: narrow: two CTAs do not fit an SM"); bad += 1
    if HG * DH * 4 > q: print(f"FAIL: D={D} merge O does not fit"); bad += 1
    KSr = DH + 8
    # S: float2 reads of a half warp (gq 0..3 or 4..7, cq 0..3) hit 32 distinct banks
    for hw in (0, 1):
        banks = set()
        for lane in range(16 * hw, 16 * hw + 16):
            gq, cq = lane >> 2, lane & 3
            w = gq * KSr + 2 * cq
            banks |= {w % 32, (w + 1) % 32}
        if len(banks) != 32: print(f"FAIL: D={D} S key reads conflict"); bad += 1
    # ldmatrix rows of Q (stride (DH+8)·2 B) and P (stride (KC+8)·2 B): 8 rows in distinct 16-byte bank groups
    for stride in ((DH + 8) * 2, (KC + 8) * 2):
        if len({(r * stride // 16) % 8 for r in range(8)}) != 8: print(f"FAIL: D={D} ldmatrix stride {stride}"); bad += 1
    print(f"D={D} CT={CT}: {total} B shared (+1 KB static)")
print("FAILED" if bad else "all checks passed")
raise SystemExit(1 if bad else 0)
