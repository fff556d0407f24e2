#!/usr/bin/env python3
"""Check 5 of the nano-model issue: DeepInfer (CPU) against the PyTorch model.

  python scripts/nano/check_deepinfer.py --deepinfer build-nano/deepinfer --model models/nano-v4 \
      --greedy models/nano-v4/greedy_reference.json [--max-windows N] [--out report.json]

1. Held-out perplexity: the held-out windows of train.py/eval.py (512 tokens each, every window a
   fresh sequence from position 0) go through `deepinfer logits`; its mean next-token cross entropy
   is compared with PyTorch's on the same windows (float32 on the bf16-rounded weights, which is
   what the engine computes with). Pass: |ppl_deepinfer / ppl_torch - 1| <= 0.5 %.
2. Greedy: for each reference continuation (prompt + 128 greedy tokens from PyTorch), DeepInfer's
   argmax at every generated position must equal the token PyTorch chose. The same teacher-forced
   argmax is also recomputed here with PyTorch on CPU (a greedy sequence is exactly one whose every
   step is the argmax of its prefix), and the top-1/top-2 logit gap is reported for any mismatch.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import eval as E  # noqa: E402
import train as T  # noqa: E402


def deepinfer_logits(exe, model, ids, threads=0):
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as d:
        p, o = os.path.join(d, "ids.json"), os.path.join(d, "out.safetensors")
        json.dump([int(x) for x in ids], open(p, "w"))
        cmd = [exe, "logits", "--model", model, "--ids-file", p, "--out", o]
        if threads:
            cmd += ["--threads", str(threads)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"deepinfer failed ({r.returncode}): {r.stderr[-2000:]}")
        return load_file(o)["logits"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", default=os.path.join(C.REPO, "build-nano/deepinfer"))
    ap.add_argument("--model", default=C.MODEL_DIR)
    ap.add_argument("--greedy", default=os.path.join(C.MODEL_DIR, "greedy_reference.json"))
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0, help="0 = all held-out windows")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--skip-greedy", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    lm, cfg, cap = E.load_nano(a.model, "cpu")
    rep = {}

    if not a.skip_ppl:
        _, _, _, held = T.token_streams(tok)
        win = T.heldout_windows(held, a.seq)
        if a.max_windows:
            win = win[: a.max_windows]
        nll_t = nll_d = 0.0
        n = 0
        worst = 0.0
        t0 = time.time()
        for i in range(win.shape[0]):
            ids = win[i]
            lt = lm(input_ids=ids[None], use_cache=False).logits[0].float()
            ld = deepinfer_logits(a.deepinfer, a.model, ids.tolist(), a.threads).float()
            tgt = ids[1:]
            ct = F.cross_entropy(lt[:-1], tgt, reduction="sum").item()
            cd = F.cross_entropy(ld[:-1], tgt, reduction="sum").item()
            nll_t += ct
            nll_d += cd
            n += tgt.numel()
            worst = max(worst, (ld - lt).abs().max().item())
            print(f"window {i}: torch {ct / tgt.numel():.5f} deepinfer {cd / tgt.numel():.5f} "
                  f"max|dlogit| {(ld - lt).abs().max().item():.2e} ({time.time() - t0:.0f}s)", flush=True)
        pt, pd = math.exp(nll_t / n), math.exp(nll_d / n)
        rel = pd / pt - 1
        rep["perplexity"] = {"windows": int(win.shape[0]), "tokens": n, "torch_loss": nll_t / n,
                             "deepinfer_loss": nll_d / n, "torch_ppl": pt, "deepinfer_ppl": pd,
                             "rel_diff": rel, "max_abs_logit_diff": worst, "pass": abs(rel) <= 0.005}
        print(json.dumps(rep["perplexity"]), flush=True)

    if not a.skip_greedy:
        refs = json.load(open(a.greedy))
        res = []
        for r in refs:
            ids, p = r["ids"], len(r["prompt_ids"])
            gen = ids[p:]
            ld = deepinfer_logits(a.deepinfer, a.model, ids[:-1], a.threads).float()
            lt = lm(input_ids=torch.tensor([ids[:-1]]), use_cache=False).logits[0].float()
            tgt = torch.tensor(gen)
            am_d = ld[p - 1:].argmax(-1)
            am_t = lt[p - 1:].argmax(-1)
            mis_d = (am_d != tgt).nonzero().flatten().tolist()
            mis_t = (am_t != tgt).nonzero().flatten().tolist()
            gaps = []
            for k in mis_d[:5]:
                top2 = lt[p - 1 + k].topk(2).values
                gaps.append(round((top2[0] - top2[1]).item(), 6))
            res.append({"prompt": r["prompt"], "kind": r["kind"], "generated": len(gen),
                        "deepinfer_mismatches": mis_d, "torch_cpu_mismatches": mis_t, "torch_top2_gap_at_mismatch": gaps,
                        "max_abs_logit_diff": (ld - lt).abs().max().item()})
            print(json.dumps(res[-1]), flush=True)
        rep["greedy"] = {"prompts": len(res), "all_equal": all(not x["deepinfer_mismatches"] for x in res),
                         "tokens_checked": sum(x["generated"] for x in res), "per_prompt": res}
        print(f"greedy: {rep['greedy']['prompts']} prompts, {rep['greedy']['tokens_checked']} tokens, "
              f"all equal: {rep['greedy']['all_equal']}", flush=True)
    if a.out:
        json.dump(rep, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
