#!/usr/bin/env python3
"""Train the nano DeepSeek-V4 (main model + one MTP layer) and export it in the published layout.

  python scripts/nano/train.py --minutes 6 --out OUTDIR            # H200
  python scripts/nano/train.py --device cpu --steps 3 --batch 2    # smoke test

Model: transformers' DeepseekV4ForCausalLM built from the nano config (common.NANO), f32 master
weights, bf16 autocast on CUDA, AdamW, warmup + cosine schedule driven by the wall-clock budget
(or --steps). The MTP block (common.MTP) gets the main model's final residual streams (input of
model.hc_head, captured with a hook) and embed(token_{t+1}), and is trained on token t+2 with
weight --mtp-weight. Score-routed layers use DeepSeek's aux-loss-free balancing: after every step
e_score_correction_bias += u * sign(mean_load - load) (u = --bias-update). Hash layers use a fixed
random tid2eid table (seed 0). The held-out loss is evaluated periodically and the best weights
are kept (early stopping: the corpus is ~1M tokens, small for many epochs).
Writes OUTDIR/{config.json, generation_config.json, model.safetensors, train_log.json}.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def build_model(seed=0):
    from transformers import DeepseekV4ForCausalLM
    torch.manual_seed(seed)
    cfg = C.hf_config()
    cfg._experts_implementation = "eager"
    lm = DeepseekV4ForCausalLM(cfg)
    lm.add_module("mtp", C.MTP(cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i, layer in enumerate(lm.model.layers):
            if cfg.mlp_layer_types[i] == "hash_moe":
                E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
                tab = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(cfg.vocab_size)])
                layer.mlp.gate.tid2eid.copy_(tab)
    return lm, cfg


class Capture:
    """Hooks: residual streams entering hc_head and the attention mask the model built."""

    def __init__(self, lm):
        self.streams = None
        self.mask = None
        lm.model.hc_head.register_forward_pre_hook(self._hc)
        lm.model.layers[0].register_forward_pre_hook(self._mask, with_kwargs=True)

    def _hc(self, mod, args):
        self.streams = args[0]

    def _mask(self, mod, args, kwargs):
        self.mask = kwargs.get("attention_mask")


def forward_losses(lm, cap, ids, mtp=True):
    """ids [B,S]. Returns (main CE, MTP CE, main logits, mtp logits)."""
    B, S = ids.shape
    h = lm.model(input_ids=ids, use_cache=False).last_hidden_state
    logits = lm.lm_head(h).float()
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    if not mtp:
        return loss, None, logits, None
    X = cap.streams[:, : S - 1]
    nxt = lm.model.embed_tokens(ids[:, 1:])
    pos = torch.arange(S - 1, device=ids.device).unsqueeze(0).expand(B, -1)
    mask = cap.mask[..., : S - 1, : S - 1] if isinstance(cap.mask, torch.Tensor) else cap.mask
    hm = lm.mtp(X, nxt, lm.model.rotary_emb, pos, mask)
    mlog = lm.lm_head(hm).float()[:, : S - 2]
    mloss = F.cross_entropy(mlog.reshape(-1, mlog.shape[-1]), ids[:, 2:].reshape(-1))
    return loss, mloss, logits, mlog


def token_streams(tok):
    ch = C.load_chapters()
    train = [c for c in ch if c["split"] == "train"]
    held = [c for c in ch if c["split"] == "heldout"]

    def enc(texts):
        out = []
        for t in texts:
            out += tok.encode(t, add_special_tokens=True).ids + [1]  # BOS ... EOS
        return out

    chat = [C.chat_text(u, a) for u, a in C.chat_pairs(train, 4000)]
    tr = enc([C.chapter_text(c) for c in train])
    docs_starts = [i for i, x in enumerate(tr) if x == 0]
    chat_ids = enc(chat)
    return tr, docs_starts, chat_ids, enc([C.chapter_text(c) for c in held])


def heldout_windows(held, L):
    n = len(held) // L
    return torch.tensor(held[: n * L]).view(n, L)


def sample_batch(rng, tr, starts, chat_ids, B, L):
    rows = []
    for b in range(B):
        r = rng.random()
        if r < 0.1:  # a window of verse-recitation chat samples
            s = rng.randrange(0, len(chat_ids) - 2 * L)
            while chat_ids[s] != 0:  # start at a sample's BOS (samples are ~45 tokens)
                s += 1
            rows.append(chat_ids[s: s + L])
            continue
        if r < 0.5:  # document-aligned (starts with BOS at position 0)
            s = rng.choice(starts)
            s = min(s, len(tr) - L)
        else:
            s = rng.randrange(0, len(tr) - L)
        rows.append(tr[s: s + L])
    return torch.tensor(rows)


@torch.no_grad()
def evaluate(lm, cap, win, device, bs=16, autocast=True):
    lm.eval()
    tot, mtot, n, mn, mcorrect = 0.0, 0.0, 0, 0, 0
    for i in range(0, win.shape[0], bs):
        ids = win[i: i + bs].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and device.type == "cuda"):
            loss, mloss, _, mlog = forward_losses(lm, cap, ids)
        k = ids.shape[0] * (ids.shape[1] - 1)
        mk = ids.shape[0] * (ids.shape[1] - 2)
        tot += loss.item() * k; n += k
        mtot += mloss.item() * mk; mn += mk
        mcorrect += (mlog.argmax(-1) == ids[:, 2:]).sum().item()
    lm.train()
    return tot / n, mtot / mn, mcorrect / mn


def export(lm, cfg, out):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    nat = C.to_native({k: v.detach().cpu() for k, v in lm.state_dict().items()}, cfg)
    save_file(nat, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(C.published_config(), f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "do_sample": True,
                   "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 128,
                   "transformers_version": "5.17.0"}, f, indent=2)
    return nat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/nano-out"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (overrides --minutes)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-update", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-eval-windows", type=int, default=0, help="0 = all held-out windows")
    a = ap.parse_args()
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(C.MODEL_DIR, "tokenizer.json"))
    tr, starts, chat_ids, held = token_streams(tok)
    win = heldout_windows(held, a.seq)
    if a.max_eval_windows:
        win = win[: a.max_eval_windows]
    print(f"train tokens {len(tr)} (+{len(chat_ids)} chat), held-out tokens {len(held)} -> {win.shape[0]} windows of {a.seq}",
          flush=True)

    lm, cfg = build_model(a.seed)
    lm.to(device).train()
    cap = Capture(lm)
    nparams = sum(p.numel() for p in lm.parameters())
    nmtp = sum(p.numel() for p in lm.mtp.parameters())
    print(f"params {nparams} (MTP {nmtp})", flush=True)

    decay = [p for n, p in lm.named_parameters() if p.ndim >= 2 and "hc" not in n and "embed" not in n]
    nodecay = [p for n, p in lm.named_parameters() if not (p.ndim >= 2 and "hc" not in n and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")

    routers = [L.mlp.gate for L in list(lm.model.layers) + [lm.mtp.layer] if not L.mlp.is_hash]
    loads = {}

    def load_hook(mod, args, out):
        idx = out[2]
        loads[id(mod)] = loads.get(id(mod), 0) + torch.bincount(idx.reshape(-1), minlength=mod.num_experts)

    for r in routers:
        r.register_forward_hook(load_hook)

    rng = random.Random(a.seed)
    budget = a.minutes * 60.0
    t0 = time.time()
    log, best = [], (float("inf"), None, -1)
    step = 0
    best_holder = [best]
    state = {"step": 0}
    try:
        while True:
            el = time.time() - t0
            frac = step / a.steps if a.steps else el / budget
            if frac >= 1.0:
                break
            if step < a.warmup:
                lr = a.lr * (step + 1) / a.warmup
            else:
                lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
            for gr in opt.param_groups:
                gr["lr"] = lr
            ids = sample_batch(rng, tr, starts, chat_ids, a.batch, a.seq).to(device)
            loads.clear()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss, mloss, _, _ = forward_losses(lm, cap, ids)
                total = loss + a.mtp_weight * mloss
            opt.zero_grad(set_to_none=True)
            total.backward()
            gn = torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                for r in routers:
                    ld = loads.get(id(r))
                    if ld is not None:
                        ld = ld.float()
                        r.e_score_correction_bias.add_(a.bias_update * torch.sign(ld.mean() - ld))
            step += 1
            state["step"] = step
            if step % 25 == 0 or step == 1:
                rec = {"step": step, "t": round(time.time() - t0, 1), "lr": lr, "loss": loss.item(),
                       "mtp_loss": mloss.item(), "gnorm": gn.item()}
                log.append(rec)
                print(json.dumps(rec), flush=True)
            if step % a.eval_every == 0:
                hl, hm, hacc = evaluate(lm, cap, win, device)
                rec = {"step": step, "t": round(time.time() - t0, 1), "heldout_loss": hl, "heldout_mtp_loss": hm,
                       "heldout_mtp_acc": hacc}
                log.append(rec)
                print(json.dumps(rec), flush=True)
                if hl < best[0]:
                    best_holder[0] = best = (hl, {k: v.detach().clone() for k, v in lm.state_dict().items()}, step)
    except Exception:  # keep what was trained: export it anyway, the log says what happened
        import traceback
        traceback.print_exc()
        log.append({"error": traceback.format_exc()[-2000:]})
        step = state["step"]
        best = best_holder[0]
        opt.zero_grad(set_to_none=True)
    hl, hm, hacc = evaluate(lm, cap, win, device)
    log.append({"step": step, "t": round(time.time() - t0, 1), "heldout_loss": hl, "heldout_mtp_loss": hm,
                "heldout_mtp_acc": hacc})
    print(json.dumps(log[-1]), flush=True)
    if best[1] is not None and best[0] < hl:
        lm.load_state_dict(best[1])
        print(f"restored best weights from step {best[2]} (held-out {best[0]:.4f})", flush=True)
        kept = best[2]
    else:
        kept = step
    nat = export(lm, cfg, a.out)
    info = {"steps": step, "kept_step": kept, "params": nparams, "mtp_params": nmtp, "args": vars(a),
            "train_tokens": len(tr), "chat_tokens": len(chat_ids), "heldout_tokens": len(held),
            "wall_s": time.time() - t0, "n_tensors": len(nat), "log": log}
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"exported {len(nat)} tensors to {a.out}; steps {step}, kept {kept}", flush=True)


if __name__ == "__main__":
    main()
