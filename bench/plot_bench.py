#!/usr/bin/env python3
"""Plot `deepinfer bench` against transformers on the same slice: total decode tokens/s (y) against
tokens/s per user (x), one point per batch size, log-log; and print a markdown table of every case.

  python3 bench/plot_bench.py --deepinfer OUT/bench.json [--hf OUT/hf.json] --png OUT/bench.png [--md OUT/bench.md]

Draws with matplotlib when it is installed, else with Pillow (the GPU image has it through
torchvision), else writes a plain PNG with the points and lines only (labels are in the table).
"""
import argparse
import json
import math
import struct
import sys
import zlib


def load(path):
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"plot_bench: {path}: {e}", file=sys.stderr)
        return None


def decode_points(res):
    pts = []
    for c in (res or {}).get("cases", []):
        if c.get("kind") == "decode" and c.get("error") is None and c.get("tokens_per_s"):
            pts.append((c["per_user_tokens_per_s"], c["tokens_per_s"], c["batch"]))
    return sorted(pts, key=lambda p: p[2])


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def table(di, hf):
    hf_cases = {}
    for c in (hf or {}).get("cases", []):
        hf_cases[(c["kind"], c["batch"], c.get("context") if c["kind"] == "decode" else c.get("prompt"))] = c
    lines = []
    if di:
        lines.append(f"DeepInfer: {di.get('config_name')} slice, {di.get('layers')} layers, backend "
                     f"{di.get('backend')} on {di.get('device')}")
    if hf:
        lines.append(f"transformers {hf.get('transformers_version')} (bf16, {hf.get('attn_implementation')} attention, "
                     f"experts {hf.get('experts_implementation')}), {hf.get('layers')} layers on {hf.get('device')}")
    lines += ["", "| case | batch | ctx/prompt | DeepInfer tok/s | tok/s/user | ms/step | % HBM roofline | % fp8 peak "
                  "| transformers tok/s | tok/s/user | % HBM | % fp8 | speedup |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in (di or {}).get("cases", []):
        n = c.get("context") if c["kind"] == "decode" else c.get("prompt")
        h = hf_cases.get((c["kind"], c["batch"], n), {})
        row = [c["kind"], str(c["batch"]), str(n)]
        if c.get("error") is None:
            row += [fmt(c["tokens_per_s"]), fmt(c["per_user_tokens_per_s"], 2), fmt(c["ms_per_step"], 2),
                    fmt(c.get("pct_hbm"), 2), fmt(c.get("pct_fp8"), 3)]
        else:
            row += [f"error: {c['error'][:60]}", "", "", "", ""]
        if h.get("error") is None and h.get("tokens_per_s"):
            sp = c["tokens_per_s"] / h["tokens_per_s"] if c.get("error") is None else None
            row += [fmt(h["tokens_per_s"]), fmt(h["per_user_tokens_per_s"], 2), fmt(h.get("pct_hbm"), 2),
                    fmt(h.get("pct_fp8"), 3), "–" if sp is None else f"{sp:.2f}x"]
        elif h:
            row += [f"{h.get('error', '')[:60]}", "", "", "", ""]
        else:
            row += ["–", "", "", "", ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_matplotlib(series, title, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for name, pts, color in series:
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=name)
        for x, y, b in pts:
            ax.annotate(f"B={b}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8, color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens/s per user")
    ax.set_ylabel("total tokens/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)


class Canvas:
    """Log-log axes on an RGB canvas, drawn through a `pixel(x, y, rgb)` and optional `text` hook."""

    def __init__(self, series, w=960, h=640):
        self.w, self.h, self.l, self.r, self.t, self.b = w, h, 90, 30, 50, 70
        xs = [p[0] for _, pts, _ in series for p in pts] or [1]
        ys = [p[1] for _, pts, _ in series for p in pts] or [1]
        self.x0, self.x1 = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)) + 1e-9)
        self.y0, self.y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)) + 1e-9)
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1

    def px(self, x, y):
        fx = (math.log10(x) - self.x0) / (self.x1 - self.x0)
        fy = (math.log10(y) - self.y0) / (self.y1 - self.y0)
        return (self.l + fx * (self.w - self.l - self.r), self.h - self.b - fy * (self.h - self.t - self.b))


def line_pixels(a, b):
    (x0, y0), (x1, y1) = a, b
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    return [(round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n)) for i in range(n + 1)]


def plot_pillow(series, title, png):
    from PIL import Image, ImageDraw
    cv = Canvas(series)
    img = Image.new("RGB", (cv.w, cv.h), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([cv.l, cv.t, cv.w - cv.r, cv.h - cv.b], outline="black")
    for e in range(cv.x0, cv.x1 + 1):
        x, _ = cv.px(10 ** e, 10 ** cv.y0)
        d.line([x, cv.t, x, cv.h - cv.b], fill=(225, 225, 225))
        d.text((x - 10, cv.h - cv.b + 6), f"{10 ** e:g}", fill="black")
    for e in range(cv.y0, cv.y1 + 1):
        _, y = cv.px(10 ** cv.x0, 10 ** e)
        d.line([cv.l, y, cv.w - cv.r, y], fill=(225, 225, 225))
        d.text((cv.l - 60, y - 6), f"{10 ** e:g}", fill="black")
    d.text((cv.w // 2 - 60, cv.h - 30), "tokens/s per user (log)", fill="black")
    d.text((8, cv.t - 30), "total tokens/s (log)", fill="black")
    d.text((cv.l, 10), title, fill="black")
    for i, (name, pts, color) in enumerate(series):
        rgb = tuple(int(color[k:k + 2], 16) for k in (1, 3, 5))
        d.text((cv.w - cv.r - 220, cv.h - cv.b - 40 + 16 * i), "o " + name, fill=rgb)
        xy = [cv.px(p[0], p[1]) for p in pts]
        if len(xy) > 1:
            d.line(xy, fill=rgb, width=2)
        for (x, y), p in zip(xy, pts):
            d.ellipse([x - 4, y - 4, x + 4, y + 4], fill=rgb)
            d.text((x + 6, y - 14), f"B={p[2]}", fill=rgb)
    img.save(png)


def plot_raw(series, png):
    cv = Canvas(series)
    buf = bytearray(b"\xff" * (cv.w * cv.h * 3))

    def put(x, y, rgb):
        if 0 <= x < cv.w and 0 <= y < cv.h:
            i = (y * cv.w + x) * 3
            buf[i:i + 3] = bytes(rgb)

    for x in range(cv.l, cv.w - cv.r + 1):
        put(x, cv.h - cv.b, (0, 0, 0))
        put(x, cv.t, (0, 0, 0))
    for y in range(cv.t, cv.h - cv.b + 1):
        put(cv.l, y, (0, 0, 0))
        put(cv.w - cv.r, y, (0, 0, 0))
    for _, pts, color in series:
        rgb = tuple(int(color[k:k + 2], 16) for k in (1, 3, 5))
        xy = [cv.px(p[0], p[1]) for p in pts]
        for a, b in zip(xy, xy[1:]):
            for x, y in line_pixels(a, b):
                put(x, y, rgb)
        for x, y in xy:
            for dx in range(-4, 5):
                for dy in range(-4, 5):
                    if dx * dx + dy * dy <= 16:
                        put(round(x) + dx, round(y) + dy, rgb)
    raw = b"".join(b"\x00" + bytes(buf[y * cv.w * 3:(y + 1) * cv.w * 3]) for y in range(cv.h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)

    with open(png, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", cv.w, cv.h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--hf")
    ap.add_argument("--png", required=True)
    ap.add_argument("--md")
    a = ap.parse_args()
    di, hf = load(a.deepinfer), load(a.hf)
    md = table(di, hf)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    series = [("DeepInfer", decode_points(di), "#1f77b4"), ("transformers (bf16, eager)", decode_points(hf), "#ff7f0e")]
    if not any(pts for _, pts, _ in series):
        print("plot_bench: no decode result to plot", file=sys.stderr)
        return 1
    title = "decode, context %s, %s layers of %s: throughput vs per-user speed" % (
        (di or {}).get("context"), (di or {}).get("layers"), (di or {}).get("config_name"))
    for how in (plot_matplotlib, plot_pillow):
        try:
            how(series, title, a.png)
            print(f"plot_bench: wrote {a.png} ({how.__name__[5:]})", file=sys.stderr)
            return 0
        except ImportError:
            continue
    plot_raw(series, a.png)
    print(f"plot_bench: wrote {a.png} (plain PNG: no matplotlib or Pillow, labels in the table)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
