#!/usr/bin/env python3
"""transformers' DeepseekV4ForCausalLM on the same DeepSeek-V4 slice as `deepinfer bench`, side by side.

Builds the model from the slice config that `deepinfer bench --json` wrote (same layers, real shapes),
in bf16 with random weights initialised on the device (no checkpoint), eager attention, and times

  * decode at each batch size with a C-token context: one sequence is prefilled with C tokens
    through transformers' own cache, and that cache is replicated to the B sequences (the same
    fast-forward idea as deepinfer's; every sequence then has identical state, which does not
    change the work of a step); then `--steps` decode steps of B random tokens;
  * prefill of each prompt length in one forward (transformers does not chunk).

Each case runs under try/except with a per-case time cap and a total budget; an out-of-memory or a
timeout is recorded for that case and the script goes on. The JSON uses deepinfer bench's per-case
format; bytes / FLOPs / % of roofline are copied from the deepinfer result for the same case (the
cost model counts what must be read and computed, whatever the implementation).

Usage (on the GPU machine, after `deepinfer bench --json OUT/bench.json`):
  python3 bench/hf_slice_bench.py --deepinfer-json OUT/bench.json --json OUT/hf.json
  python3 bench/hf_slice_bench.py --config-json CONFIG.json --layers 2 --device cpu --json hf.json  # no GPU

transformers versions: models/deepseek_v4 is in transformers >= 5.8.0, so the H200 image's 5.17 has
it (shared/docs/deepseek-v4.md: "verified by importing it from the 5.17.0 wheel"; the forward takes
`past_key_values=`, which 5.25 still accepts). If the machine's transformers lacks it, carry a wheel:
  pip download transformers==5.25.0 --no-deps -d .gpu/wheels        # here, then carry .gpu
and pass --transformers-wheel .gpu/wheels/transformers-5.25.0-py3-none-any.whl: the script installs it
with `pip install --no-deps --target` into a temporary directory and imports it from there.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

DROP_KEYS = ("quantization_config", "architectures", "torch_dtype", "expert_dtype", "topk_method")


def log(*a):
    print("hf_slice_bench:", *a, file=sys.stderr, flush=True)


def import_transformers(wheel):
    if wheel:
        target = tempfile.mkdtemp(prefix="hf_tf_")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel],
                       check=True)
        sys.path.insert(0, target)
    import transformers  # noqa: F401
    return transformers


def build_model(torch, transformers, cfg, device, experts_impl):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    d = {k: v for k, v in cfg.items() if k not in DROP_KEYS}
    d["num_nextn_predict_layers"] = 0
    # The schedule in transformers' own spelling (its legacy mapping knows only the ratios 0/4/128).
    n = d["num_hidden_layers"]
    csa, hca = d.pop("compress_rate_csa", 4), d.pop("compress_rate_hca", 128)
    if "compress_ratios" in d and "layer_types" not in d:
        names = {0: "sliding_attention", csa: "compressed_sparse_attention", hca: "heavily_compressed_attention"}
        d["layer_types"] = [names[r] for r in d.pop("compress_ratios")[:n]]
        d["compress_rates"] = {"compressed_sparse_attention": csa, "heavily_compressed_attention": hca}
    if "mlp_layer_types" not in d:
        h = d.pop("num_hash_layers", 3)
        d["mlp_layer_types"] = ["hash_moe"] * min(n, h) + ["moe"] * max(0, n - h)
    d["tie_word_embeddings"] = False
    config = DeepseekV4Config(**d)
    kwargs = {"attn_implementation": "eager"}
    if experts_impl:
        kwargs["experts_implementation"] = experts_impl
    with torch.device(device):
        try:
            model = DeepseekV4ForCausalLM._from_config(config, dtype=torch.bfloat16, **kwargs)
        except TypeError:  # older spelling
            model = DeepseekV4ForCausalLM._from_config(config, torch_dtype=torch.bfloat16, **kwargs)
    model.eval()
    # Hash routers come with tid2eid = 0 (all tokens to expert 0); give each token k distinct experts,
    # as a real table does, so hash layers do the real amount of expert work.
    E, k = config.n_routed_experts, config.num_experts_per_tok
    g = torch.Generator(device=device).manual_seed(1)
    for m in model.modules():
        if hasattr(m, "tid2eid") and isinstance(m.tid2eid, torch.Tensor):
            V = m.tid2eid.shape[0]
            ids = torch.rand(V, E, generator=g, device=device).argsort(dim=1)[:, :k]
            with torch.no_grad():
                m.tid2eid.copy_(ids.to(m.tid2eid.dtype))
    return model, config


def new_cache(transformers, config):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def replicate_cache(torch, cache, B):
    """A batch-1 cache -> B identical sequences: every tensor with a leading batch dim of 1 (keys,
    values, compressor buffers, compressed entries, overlap halves) is repeated along it."""
    idx = None

    def rep(t):
        nonlocal idx
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == 1:
            if idx is None or idx.device != t.device:
                idx = torch.zeros(B, dtype=torch.long, device=t.device)
            return t.index_select(0, idx)
        return t

    for layer in cache.layers:
        for name, val in list(vars(layer).items()):
            if isinstance(val, torch.Tensor):
                setattr(layer, name, rep(val))
            elif isinstance(val, dict):
                for k2, v2 in list(val.items()):
                    val[k2] = rep(v2)
    return cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepinfer-json", help="deepinfer bench's JSON: config, layers, cases to mirror")
    ap.add_argument("--config-json", help="a config.json (when there is no deepinfer JSON)")
    ap.add_argument("--layers", type=int, default=0, help="slice layers (default: the deepinfer JSON's)")
    ap.add_argument("--batch", default="", help="decode batch sizes (default: the deepinfer JSON's, else 1,8,32,128,256)")
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--prefill", default=None)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--case-seconds", type=float, default=30.0, help="time cap of one case's timed steps")
    ap.add_argument("--budget-seconds", type=float, default=240.0, help="cases after this are skipped")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--experts-implementation", default=None, help="transformers' experts backend (default: its own)")
    ap.add_argument("--transformers-wheel", default=None)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    t_start = time.time()

    di = None
    if a.deepinfer_json:
        with open(a.deepinfer_json) as f:
            di = json.load(f)
    if di is not None:
        cfg = di["config"]
    elif a.config_json:
        with open(a.config_json) as f:
            cfg = json.load(f)
    else:
        ap.error("--deepinfer-json or --config-json is required")
    cfg = dict(cfg)
    layers = a.layers or (di["layers"] if di else cfg["num_hidden_layers"])
    if layers < cfg["num_hidden_layers"]:
        cfg["num_hidden_layers"] = layers
        for key in ("compress_ratios", "layer_types", "mlp_layer_types"):
            if isinstance(cfg.get(key), list):
                cfg[key] = cfg[key][:layers]
    di_cases = {}
    if di:
        for c in di.get("cases", []):
            n = c.get("context") if c["kind"] == "decode" else c.get("prompt")
            di_cases[(c["kind"], c["batch"], n)] = c
    batches = [int(x) for x in a.batch.split(",") if x] if a.batch else (
        sorted({c["batch"] for c in di["cases"] if c["kind"] == "decode"}) if di else [1, 8, 32, 128, 256])
    context = a.context or (di["context"] if di else 4096)
    steps = a.steps or (di["steps"] if di else 16)
    if a.prefill is not None:
        prefills = [int(x) for x in a.prefill.split(",") if x and int(x) > 0]
    else:
        prefills = sorted({c["prompt"] for c in di["cases"] if c["kind"] == "prefill"}) if di else [4096, 16384]

    import torch
    transformers = import_transformers(a.transformers_wheel)
    device = a.device
    out = {"tool": "transformers", "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "device": device, "dtype": "bfloat16",
           "attn_implementation": "eager", "layers": layers, "config": cfg, "context": context,
           "steps": steps, "cases": []}
    if device.startswith("cuda"):
        out["device"] = torch.cuda.get_device_name(0)

    def save():
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def free_memory():
        if device.startswith("cuda"):
            torch.cuda.empty_cache()

    try:
        t0 = time.time()
        model, config = build_model(torch, transformers, cfg, device, a.experts_implementation)
        sync()
        out["load_seconds"] = time.time() - t0
        out["experts_implementation"] = str(getattr(config, "_experts_implementation", None))
        if device.startswith("cuda"):
            out["model_bytes"] = torch.cuda.memory_allocated()
        log(f"transformers {transformers.__version__}: {layers} layers in bf16 on {out['device']}, "
            f"built in {out['load_seconds']:.1f} s")
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log("cannot build the model:", out["error"])
        for B in batches:
            out["cases"].append({"kind": "decode", "batch": B, "context": context, "prompt": None, "error": out["error"]})
        for P in prefills:
            out["cases"].append({"kind": "prefill", "batch": 1, "context": None, "prompt": P, "error": out["error"]})
        save()
        return 0
    V = config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(2)

    def rand_ids(b, n):
        return torch.randint(0, V, (b, n), generator=gen).to(device)

    def forward(ids, cache):
        with torch.no_grad():
            return model(input_ids=ids, past_key_values=cache, use_cache=cache is not None, logits_to_keep=1)

    def finish(case, seconds, nsteps, tokens, partial):
        case.update({"steps": nsteps, "seconds": seconds, "tokens_per_s": tokens / seconds,
                     "per_user_tokens_per_s": (nsteps / seconds) if case["kind"] == "decode" else tokens / seconds,
                     "ms_per_step": 1e3 * seconds / nsteps, "partial": partial, "error": None})
        n = case["context"] if case["kind"] == "decode" else case["prompt"]
        ref = di_cases.get((case["kind"], case["batch"], n))
        if ref and ref.get("error") is None and case["kind"] == "decode":
            # one decode step here does the work of one deepinfer decode step
            for k in ("bytes", "flops", "hbm_floor_ms", "fp8_floor_ms"):
                case[k] = ref.get(k)
            case["pct_hbm"] = 100.0 * case["hbm_floor_ms"] / case["ms_per_step"]
            case["pct_fp8"] = 100.0 * case["fp8_floor_ms"] / case["ms_per_step"]
        elif ref and ref.get("error") is None and not ref.get("partial"):
            # prefill: the FLOPs of deepinfer's chunked prompt are this forward's (but for the head
            # rows of the chunk ends); its bytes are not (weights are read once per chunk there)
            case["flops"] = ref["flops"] * ref["steps"]
            case["fp8_floor_ms"] = ref["fp8_floor_ms"] * ref["steps"]
            case["pct_fp8"] = 100.0 * case["fp8_floor_ms"] / case["ms_per_step"]

    def over_budget():
        return time.time() - t_start > a.budget_seconds

    # Warm-up (kernels, allocator).
    try:
        forward(rand_ids(1, 16), new_cache(transformers, config))
        sync()
    except Exception as e:  # noqa: BLE001
        log("warm-up failed:", e)

    # Decode: prefill one sequence with the context once, replicate its cache per batch size.
    base_cache, base_error = None, None
    if batches:
        try:
            t0 = time.time()
            base_cache = new_cache(transformers, config)
            if context > 0:
                forward(rand_ids(1, context), base_cache)
            sync()
            out["context_prefill_seconds"] = time.time() - t0
            log(f"context of {context} tokens prefilled in {out['context_prefill_seconds']:.1f} s")
        except Exception as e:  # noqa: BLE001
            base_error = f"context prefill failed: {type(e).__name__}: {str(e)[:300]}"
            base_cache = None
            free_memory()
    for B in batches:
        case = {"kind": "decode", "batch": B, "context": context, "prompt": None}
        out["cases"].append(case)
        if base_error:
            case["error"] = base_error
        elif over_budget():
            case["error"] = "skipped: total time budget spent"
        else:
            cache = None
            try:
                cache = replicate_cache(torch, copy.deepcopy(base_cache), B)
                for _ in range(a.warmup):
                    forward(rand_ids(B, 1), cache)
                sync()
                t0 = time.time()
                n, partial = 0, False
                for s in range(steps):
                    forward(rand_ids(B, 1), cache)
                    n += 1
                    if s + 1 < steps and time.time() - t0 > a.case_seconds:
                        partial = True
                        break
                sync()
                finish(case, time.time() - t0, n, B * n, partial)
            except Exception as e:  # noqa: BLE001
                case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if "out of memory" not in str(e):
                    traceback.print_exc()
            del cache
            free_memory()
        log(f"decode batch {B}: " + (f"{case['tokens_per_s']:.1f} tok/s" if case.get("error") is None else case["error"]))
        save()
    del base_cache
    free_memory()

    for P in prefills:
        case = {"kind": "prefill", "batch": 1, "context": None, "prompt": P}
        out["cases"].append(case)
        if over_budget():
            case["error"] = "skipped: total time budget spent"
        else:
            try:
                ids = rand_ids(1, P)
                sync()
                t0 = time.time()
                forward(ids, new_cache(transformers, config))
                sync()
                finish(case, time.time() - t0, 1, P, False)
            except Exception as e:  # noqa: BLE001
                case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            free_memory()
        log(f"prefill {P}: " + (f"{case['tokens_per_s']:.1f} tok/s" if case.get("error") is None else case["error"]))
        save()
    out["total_seconds"] = time.time() - t_start
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
