#!/usr/bin/env python3
"""The kernel timeline of `deepinfer bench --kernel-trace N` (the JSON of --json), readable.

For each decode case with a trace: a listing of the first kernels of the window in start order (start, duration,
the gap or overlap to the latest end before it, the marginal time: how far its end moved the latest end — the
step's time is the sum of the marginal times and the gaps), then a PNG per case (OUT_DIR/trace_bB.png) with the
kernels as bars on their streams over one step's worth of time and the kernels' marginal times per step.

Usage: python3 bench/plot_kernel_trace.py BENCH_JSON [OUT_DIR] [--rows N] [--us T0:T1]
"""
import json
import os
import sys


def category(name):
    n = name.lower()
    for key, cat in (("moe", "moe"), ("gemv", "gemv"), ("gemm", "gemm"), ("attention", "attention"), ("att", "attention"),
                     ("hc_", "mhc"), ("norm_rope", "norm/rope"), ("rope", "norm/rope"), ("norm", "norm/rope"),
                     ("indexer", "indexer"), ("topk", "indexer"), ("compress", "compressor"), ("sample", "sampling"),
                     ("argmax", "sampling"), ("edits", "sampling"), ("route", "moe"), ("copy", "copies")):
        if key in n:
            return cat
    return "other"


def listing(records, rows, lo_us=None, hi_us=None):
    latest = None
    print(f"  {'#':>4} {'start us':>9} {'dur us':>8} {'gap us':>8} {'marg us':>8} {'stream':>6} {'blocks':>6}  kernel")
    shown = 0
    for i, r in enumerate(records):
        name, start, dur, _node, blocks, _threads, stream = (r + [0] * 7)[:7]
        s, e = start / 1e3, (start + dur) / 1e3
        if latest is None:
            latest = s
        gap = s - latest  # > 0 idle, < 0 started early (under what ran before)
        marg = max(0.0, e - max(latest, s))
        latest = max(latest, e)
        if (lo_us is not None and s < lo_us) or (hi_us is not None and s > hi_us):
            continue
        if shown < rows:
            print(f"  {i:4d} {s:9.1f} {e - s:8.2f} {gap:8.2f} {marg:8.2f} {stream:6d} {blocks:6d}  {name[:60]}")
            shown += 1


def plot(case, out_png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (no matplotlib: no PNG)")
        return
    t = case["kernel_trace"]
    recs = t["records"]
    steps = max(1, t["steps"])
    span_ns = max(r[1] + r[2] for r in recs)
    window = span_ns / steps  # one step's worth, from the start
    streams = sorted({(r + [0] * 7)[6] for r in recs})
    cats = sorted({category(r[0]) for r in recs})
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(cats)}
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(16, 9), gridspec_kw={"height_ratios": [1, 2]})
    for i, r in enumerate(recs):
        name, start, dur, _n, _b, _t, stream = (r + [0] * 7)[:7]
        if start > window:
            break
        y = streams.index(stream) + (0.22 if i % 2 else -0.22)  # staggered: a kernel started early shows under the last
        ax.barh(y, dur / 1e3, left=start / 1e3, height=0.42, color=colors[category(name)], edgecolor="none")
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels([f"stream {s}" for s in streams])
    ax.set_xlabel("us from the window's first kernel (one step's worth)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[c]) for c in cats], labels=cats, ncol=6, fontsize=8,
              loc="upper right")
    ks = t["kernels"][:25]
    bx.barh(range(len(ks))[::-1], [k["marginal_us_per_step"] for k in ks],
            color=[colors[category(k["kernel"])] for k in ks])
    bx.set_yticks(range(len(ks))[::-1])
    bx.set_yticklabels([f"{k['kernel'][:48]} ({k['calls_per_step']:.0f}x)" for k in ks], fontsize=7)
    bx.set_xlabel("marginal us per step (the step is their sum plus idle)")
    fig.suptitle(f"decode batch {case['batch']}: traced span {t['span_ms_per_step']:.3f} ms/step, idle "
                 f"{t['idle_ms_per_step']:.3f} ms, {t['kernels_per_step']:.0f} kernels/step "
                 f"(untraced {case['ms_per_step']:.3f} ms/step)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"  wrote {out_png}")


def main():
    args = [a for a in sys.argv[1:]]
    rows, lo, hi = 80, None, None
    if "--rows" in args:
        i = args.index("--rows")
        rows = int(args[i + 1])
        del args[i:i + 2]
    if "--us" in args:
        i = args.index("--us")
        lo, hi = (float(x) for x in args[i + 1].split(":"))
        del args[i:i + 2]
    if not args:
        print(__doc__)
        return 2
    with open(args[0]) as f:
        data = json.load(f)
    out_dir = args[1] if len(args) > 1 else os.path.dirname(os.path.abspath(args[0]))
    for case in data.get("cases", []):
        if "kernel_trace" not in case:
            continue
        print(f"decode batch {case['batch']}: first kernels of the traced window")
        listing(case["kernel_trace"]["records"], rows, lo, hi)
        plot(case, os.path.join(out_dir, f"trace_b{case['batch']}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
