#!/usr/bin/env python3
"""Writes engram_token_map.safetensors for a DeepSeek-V4.1 model directory.

DeepSeek-V4.1's Engram hashes compressed token ids (spec shared/docs/deepseek-v4.1.md §3.1 step 1):
every id v is decoded alone (byte-level, special tokens kept); a text holding U+FFFD (a partial
UTF-8 token) keys on the raw token string, any other text on its normalised form (NFKC, NFD,
combining accents removed, lowercased, runs of space/tab/CR/LF collapsed to one space, stripped,
except that a text that is exactly one space stays one space; empty results fall back to the raw
text). Keys get ids in order of first appearance by ascending v. The engine reads the map instead
of normalising Unicode itself (different Unicode tables would silently rehash the tables).

    python3 scripts/make_engram_token_map.py MODEL_DIR [--expect 99092]

Needs only the Python standard library (and the model's tokenizer.json).
"""
import argparse
import json
import os
import re
import struct
import unicodedata


def byte_decoder():
    # GPT-2 byte-level alphabet: printable bytes map to themselves, the others to U+0100 + n.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def normalise(text):
    t = unicodedata.normalize("NFKC", text)
    t = unicodedata.normalize("NFD", t)
    t = "".join(ch for ch in t if not unicodedata.combining(ch)).lower()
    t = re.sub(r"[ \t\r\n]+", " ", t)
    if t == " ":
        return t
    t = t.strip()
    return t if t else text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--expect", type=int, default=None, help="required number of distinct keys")
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = dict(tj["model"]["vocab"])
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    text_cfg = cfg.get("text_config", cfg)
    V = text_cfg["vocab_size"]
    expect = a.expect or text_cfg.get("engram_compressed_vocab_size")
    by_id = {i: s for s, i in vocab.items()}
    added = {t["content"] for t in tj.get("added_tokens", [])}
    dec = byte_decoder()
    keys, out = {}, []
    for v in range(V):
        raw = by_id.get(v, "")
        if raw in added:
            text = raw
        else:
            text = bytes(dec.get(ch, 0) for ch in raw).decode("utf-8", errors="replace")
        key = raw if "\ufffd" in text else normalise(text)
        out.append(keys.setdefault(key, len(keys)))
    if expect is not None and len(keys) != expect:
        raise SystemExit(f"{len(keys)} distinct keys, the config expects {expect}: the map would rehash the tables")
    data = struct.pack(f"<{V}q", *out)
    header = json.dumps({"token_map": {"dtype": "I64", "shape": [V], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    path = os.path.join(a.model_dir, "engram_token_map.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
    print(f"{path}: {V} ids -> {len(keys)} keys")


if __name__ == "__main__":
    main()
