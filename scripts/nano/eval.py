#!/usr/bin/env python3
"""Evaluate an exported nano checkpoint (native layout) in PyTorch, float32 on the bf16 weights.

  python scripts/nano/eval.py --model models/nano-v4 [--device cuda] [--greedy-out greedy.json]

Reports: held-out loss / perplexity (same 512-token windows as the trainer and check_deepinfer.py),
loss on 64 fixed random train windows (seed 99), next-token top-1 accuracy of the main head, the MTP layer's
next-next-token (t+2) top-1 accuracy and loss, and greedy continuations (128 tokens, full recompute,
no cache) for the 10 check prompts. Also checks that transformers' own from_pretrained loads the
native checkpoint with no missing/unexpected keys and gives the same logits.
"""
import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import train as T  # noqa: E402

# 8 raw-text prompts (BOS + text) and 2 chat prompts (chat template, generation prompt).
PROMPTS = [
    ("raw", "In the beginning"),
    ("raw", "And God said,"),
    ("raw", "The LORD is my shepherd;"),
    ("raw", "Blessed are the"),
    ("raw", "Psalms 23\n\n"),
    ("raw", "And it came to pass, when the king"),
    ("raw", "For God so loved the world,"),
    ("raw", "Then Jesus said unto them,"),
    ("chat", "Recite John 3:16."),
    ("chat", "Recite Genesis 1:1."),
]


def prompt_ids(tok, kind, text):
    if kind == "raw":
        return tok.encode(text, add_special_tokens=True).ids
    return tok.encode(C.BOS + C.USER + text + C.ASSISTANT + C.END_THINK, add_special_tokens=False).ids


def load_native(model_dir):
    from safetensors.torch import load_file
    return load_file(os.path.join(model_dir, "model.safetensors"))


def load_nano(model_dir, device="cpu"):
    lm, cfg = T.build_model(0)
    sd = C.from_native(load_native(model_dir), cfg, torch.float32)
    missing, unexpected = lm.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    if missing or unexpected:
        raise RuntimeError(f"missing {missing[:8]} unexpected {unexpected[:8]}")
    lm.to(device).float().eval()
    return lm, cfg, T.Capture(lm)


@torch.no_grad()
def greedy(lm, ids, n, device):
    seq = list(ids)
    for _ in range(n):
        x = torch.tensor([seq], device=device)
        logits = lm(input_ids=x, use_cache=False).logits[0, -1]
        nxt = int(logits.argmax())
        seq.append(nxt)
        if nxt == 1:
            break
    return seq


@torch.no_grad()
def hf_roundtrip(model_dir, lm, device):
    """transformers' own loader on the native checkpoint (conversion mapping), logits vs ours."""
    from transformers import DeepseekV4ForCausalLM
    ref, info = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True,
                                                      experts_implementation="eager")
    ref = ref.float().to(device).eval()
    ids = torch.tensor([list(range(0, 8192, 41))[:160]], device=device)
    a = lm(input_ids=ids, use_cache=False).logits
    b = ref(input_ids=ids, use_cache=False).logits
    return {"missing": sorted(info.get("missing_keys", [])),
            "unexpected": sorted(k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")),
            "n_unexpected_mtp": len([k for k in info.get("unexpected_keys", []) if k.startswith("mtp.")]),
            "max_abs_logit_diff": (a - b).abs().max().item(), "max_abs_logit": a.abs().max().item()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=C.MODEL_DIR)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--greedy-out", default="")
    ap.add_argument("--out", default="", help="write the metrics JSON here")
    ap.add_argument("--skip-greedy", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--train-windows", type=int, default=64)
    a = ap.parse_args()
    dev = torch.device(a.device)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    tr, starts, chat_ids, held = T.token_streams(tok)
    win = T.heldout_windows(held, a.seq)
    if a.max_windows:
        win = win[: a.max_windows]
    lm, cfg, cap = load_nano(a.model, dev)
    t0 = time.time()
    hl, hm, hacc = T.evaluate(lm, cap, win, dev, autocast=False)
    # next-token accuracy of the main head on the same windows
    correct = total = 0
    with torch.no_grad():
        for i in range(0, win.shape[0], 16):
            ids = win[i: i + 16].to(dev)
            lg = lm(input_ids=ids, use_cache=False).logits
            correct += (lg[:, :-1].argmax(-1) == ids[:, 1:]).sum().item()
            total += ids[:, 1:].numel()
    rng = random.Random(99)
    trw = torch.tensor([tr[s: s + a.seq] for s in (rng.randrange(0, len(tr) - a.seq) for _ in range(a.train_windows))])
    tl, tm, tacc = T.evaluate(lm, cap, trw, dev, autocast=False)
    m = {"heldout_windows": int(win.shape[0]), "seq": a.seq, "heldout_loss": hl, "heldout_ppl": float(torch.exp(torch.tensor(hl))),
         "heldout_top1_acc": correct / total, "heldout_mtp_loss": hm, "heldout_mtp_top1_acc_t+2": hacc,
         "train_windows": a.train_windows, "train_loss": tl, "train_mtp_loss": tm, "train_mtp_top1_acc_t+2": tacc,
         "eval_s": time.time() - t0}
    print(json.dumps(m, indent=1), flush=True)
    if not a.skip_hf:
        try:
            m["hf_from_pretrained"] = hf_roundtrip(a.model, lm, dev)
        except Exception as e:  # reported, not fatal
            m["hf_from_pretrained"] = {"error": repr(e)[:500]}
        print(json.dumps(m["hf_from_pretrained"]), flush=True)
    if not a.skip_greedy:
        outs = []
        for kind, text in PROMPTS:
            ids = prompt_ids(tok, kind, text)
            seq = greedy(lm, ids, a.new_tokens, dev)
            outs.append({"kind": kind, "prompt": text, "prompt_ids": ids, "ids": seq,
                         "text": tok.decode(seq[len(ids):], skip_special_tokens=False)})
            print(f"--- [{kind}] {text!r}\n{outs[-1]['text']}", flush=True)
        if a.greedy_out:
            with open(a.greedy_out, "w") as f:
                json.dump(outs, f, ensure_ascii=False, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
