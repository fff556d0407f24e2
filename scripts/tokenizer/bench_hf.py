#!/usr/bin/env python3
"""HF `tokenizers` side of bench_tokenizer: encode throughput on the same corpus.
Usage: bench_hf.py TOKENIZER_JSON[.gz] CORPUS.jsonl.gz [repeats]
Prints: hf_single_mb_s=<float> hf_batch_mb_s=<float> threads=<n>"""
import gzip
import json
import os
import sys
import time

from tokenizers import Tokenizer

path, corpus_path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
tk = Tokenizer.from_str(raw.decode())
texts = [json.loads(l) for l in gzip.open(corpus_path, "rt", encoding="utf-8")]
nbytes = sum(len(t.encode("utf-8")) for t in texts)
for t in texts[:2000]:  # warm-up
    tk.encode(t, add_special_tokens=False)
best = 0.0
for _ in range(reps):
    t0 = time.perf_counter()
    for t in texts:
        tk.encode(t, add_special_tokens=False)
    best = max(best, nbytes / (time.perf_counter() - t0) / 1e6)
bbest = 0.0
for _ in range(reps):
    t0 = time.perf_counter()
    tk.encode_batch(texts, add_special_tokens=False)
    bbest = max(bbest, nbytes / (time.perf_counter() - t0) / 1e6)
print(f"hf_single_mb_s={best:.3f} hf_batch_mb_s={bbest:.3f} threads={os.cpu_count()}")
