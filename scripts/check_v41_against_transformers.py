#!/usr/bin/env python3
"""Check the DeepSeek-V4.1 reference fixtures against transformers' own `deepseek_v41` model.

No transformers release on PyPI contains `deepseek_v41` (5.25.0 has `deepseek_v4` only), but the
model exists on GitHub (huggingface/transformers, src/transformers/models/deepseek_v41/). This script
imports those files from a local folder (`--hf-src`, holding `__init__.py`,
`configuration_deepseek_v41.py`, `modeling_deepseek_v41.py` exactly as on GitHub; they are
third-party code used as a test oracle and are NOT part of this repository) as the package
`transformers.models.deepseek_v41` of an installed transformers (tested with 5.25.0), loads every
fixture's model directory into `DeepseekV41ForCausalLM` in float64 on the CPU, runs it on the
fixture's token ids and compares with the fixture's reference logits (ref.safetensors).

Per fixture, sequence and mode it prints the median and max per-position relative L2 error
||a_t - b_t|| / ||b_t|| and the argmax agreement. Modes:

  full          one forward over the whole sequence, use_cache=True (transformers' default path)
  full-nocache  one forward with use_cache=False (transformers' cache-less path)
  full-nocache+reset  the same with a diagnostic patch (GroupResetNoCache below) that makes
                each KV source start its own shared compressed KV / index keys
  decode        prefill of --decode-prefix tokens, then one token per forward through the cache
  chunked       chunks of 5 then 7 tokens through the cache

Every mode but `full` is also compared with transformers' own `full` logits ("vs hf-full").

Loading: a fixture stored in transformers' layout (`model.` prefix, `lm_head.weight`) is loaded
with `from_pretrained`; any other layout (the release's native names, FP8 / FP4 / BF16 storage, or
the reference code's flat config) is dequantized here into float64 tensors under transformers'
names and written to a temporary transformers-layout directory, which is then loaded with
`from_pretrained` as well. The Engram compressed-token map comes from the fixture's
`engram_token_map.safetensors` (a tiny model has no tokenizer): transformers'
`build_compressed_token_map(tokenizer)` is replaced by that map before `bind_tokenizer`.

Config variants: when a fixture's `rope_scaling` spells the YaRN type with the legacy key `type`
(not `rope_type`), transformers' V4.1 config does not enable YaRN (its `__post_init__` only reads
`rope_type` and defaults it to "default"). The script then runs twice: `cfg=as-is` (exactly the
fixture's config) and `cfg=rope_type` (the same config with `type` renamed to `rope_type`, the
spelling of the released config); the `as-is` variant then runs only `--as-is-modes` (default full).

    python3 scripts/check_v41_against_transformers.py --hf-src /path/to/deepseek_v41 \
        [--fixtures tests/fixtures/v41] [--only tiny_hf] [--json out.json]

Needs torch, numpy, sympy, safetensors and transformers (5.25.0 tested).
"""
import argparse
import glob
import importlib.util
import json
import math
import os
import struct
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ----------------------------------------------------------------------------------------------
# importing transformers' deepseek_v41 from a folder
# ----------------------------------------------------------------------------------------------


def patch_cache_utils():
    """transformers 5.25.0's `get_layer_types_and_kwargs` passes `config` only to the V4 layer types
    (`heavily_compressed_attention`, `compressed_sparse_attention`), so `DynamicCache(config=...)`
    cannot build V4.1's `DeepseekV41CSACache(config)` for `shared_compressed_attention` layers (the
    transformers PR that adds deepseek_v41 registers the type there). Same fix, applied at run time
    to the installed transformers only when it lacks it."""
    from transformers import cache_utils

    orig = cache_utils.get_layer_types_and_kwargs
    if getattr(orig, "_v41_patched", False):
        return

    def get_layer_types_and_kwargs(config):
        layer_types, per_layer_kwargs = orig(config)
        layer_configs = config.per_layer_config
        for i, (t, kw) in enumerate(zip(layer_types, per_layer_kwargs)):
            if t == "shared_compressed_attention" and "config" not in kw:
                kw["config"] = layer_configs[i]
        return layer_types, per_layer_kwargs

    get_layer_types_and_kwargs._v41_patched = True
    cache_utils.get_layer_types_and_kwargs = get_layer_types_and_kwargs


def import_hf_v41(src):
    """Registers the folder as `transformers.models.deepseek_v41` and returns (config module,
    modeling module)."""
    import transformers  # noqa: F401  (the parent package of the relative imports)
    import transformers.models  # noqa: F401

    name = "transformers.models.deepseek_v41"
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    init = os.path.join(src, "__init__.py")
    if not os.path.isfile(init):
        sys.exit(f"--hf-src {src}: no __init__.py")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[src])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    patch_cache_utils()
    cfgm = importlib.import_module(name + ".configuration_deepseek_v41")
    modm = importlib.import_module(name + ".modeling_deepseek_v41")
    from transformers import AutoConfig, AutoModelForCausalLM

    for mt, cls in (("deepseek_v41", cfgm.DeepseekV41Config), ("deepseek_v41_text", cfgm.DeepseekV41TextConfig),
                    ("deepseek_v41_vision", cfgm.DeepseekV41VisionConfig)):
        try:
            AutoConfig.register(mt, cls, exist_ok=True)
        except Exception as e:  # noqa: BLE001
            print(f"note: AutoConfig.register({mt}): {e}")
    try:
        AutoModelForCausalLM.register(cfgm.DeepseekV41Config, modm.DeepseekV41ForCausalLM, exist_ok=True)
    except Exception as e:  # noqa: BLE001
        print(f"note: AutoModelForCausalLM.register: {e}")
    return cfgm, modm


# ----------------------------------------------------------------------------------------------
# safetensors reading and dequantization (own reader: F8_E8M0 and packed FP4 need no library)
# ----------------------------------------------------------------------------------------------

NP_DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.uint8, "U8": np.uint8, "BOOL": np.uint8,
         "F8_E4M3": np.uint8, "F8_E8M0": np.uint8}


def read_safetensors(path):
    """name -> (dtype string, numpy array of the raw storage)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=NP_DT[v["dtype"]]).reshape(v["shape"])
        out[name] = (v["dtype"], arr)
    return out


def e4m3_to_f64(b):
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    val = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * np.ldexp(1.0, e - 7))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return sign * val


def e8m0_to_f64(b):
    return np.ldexp(1.0, b.astype(np.int64) - 127)


def bf16_to_f64(u):
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def to_f64(dtype, arr):
    if dtype == "BF16":
        return bf16_to_f64(arr)
    if dtype == "F8_E4M3":
        return e4m3_to_f64(arr)
    if dtype == "F8_E8M0":
        return e8m0_to_f64(arr)
    return arr.astype(np.float64)


def dequantize(raw, block):
    """raw: name -> (dtype, arr) of every shard. Returns name -> float64 array (weights with an
    FP8 / FP4 payload are multiplied by their `.scale` blocks; the weights' `.scale` tensors are
    consumed, the Engram tables' `.scale` is kept as a float tensor since transformers has a
    parameter for it)."""
    out = {}
    for name, (dt, arr) in raw.items():
        if name.endswith(".scale") and name[:-len(".scale")] + ".weight" in raw:
            continue
        if dt in ("F8_E4M3", "I8") and name.endswith(".weight"):
            sname = name[:-len(".weight")] + ".scale"
            sdt, sarr = raw[sname]
            scale = to_f64(sdt, sarr)
            if dt == "I8":  # packed FP4 (E2M1): low nibble = even column, high nibble = odd column
                codes = np.empty((arr.shape[0], arr.shape[1] * 2), dtype=np.uint8)
                codes[:, 0::2] = arr & 0xF
                codes[:, 1::2] = arr >> 4
                w = E2M1[codes]
                br, bc = 1, 32
            else:
                w = e4m3_to_f64(arr)
                o, i = w.shape
                bc = block[1]
                br = block[0] if scale.shape[0] == -(-o // block[0]) else 1
            o, i = w.shape
            assert scale.shape == (-(-o // br), -(-i // bc)), (name, w.shape, scale.shape, br, bc)
            full = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:o, :i]
            out[name] = w * full
            if name.endswith("engram.embed.weight"):
                out[sname] = scale  # transformers' EngramEmbedding.scale (unused in float models)
        else:
            out[name] = to_f64(dt, arr)
    return out


SKIP_PREFIXES = ("mtp.", "vision.", "aligner.", "image_")


def to_hf_names(weights):
    """Native (release / reference-code) names -> transformers names. Returns (dict, skipped)."""
    out, skipped = {}, []
    for name, w in weights.items():
        if name.startswith("model.") or name.startswith("lm_head."):
            out[name] = w
        elif name.startswith(SKIP_PREFIXES):
            skipped.append(name)
        elif name == "head.weight":
            out["lm_head.weight"] = w
        else:
            out["model." + name] = w
    return out, skipped


# the reference code's flat config names (inference/config.json) -> transformers' names
FLAT_TO_HF = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
              "rope_head_dim": "qk_rope_head_dim", "window_size": "sliding_window",
              "kv_source_layers": "kv_source_layer_ids", "index_source_layers": "index_source_layer_ids",
              "candidate_source_layer": "candidate_source_layer_id", "norm_eps": "rms_norm_eps",
              "n_activated_experts": "num_experts_per_tok", "moe_inter_dim": "moe_intermediate_size",
              "score_func": "scoring_func", "route_scale": "routed_scaling_factor",
              "engram_pad_token_id": "engram_pad_id", "inter_dim": "intermediate_size"}


def composite_config(cfg):
    """Any fixture config.json -> a composite transformers config dict (no quantization_config)."""
    cfg = json.loads(json.dumps(cfg))
    if "text_config" in cfg:
        cfg.pop("quantization_config", None)
        text = cfg["text_config"]
        if "engram_pad_token_id" in text and "engram_pad_id" not in text:
            text["engram_pad_id"] = text.pop("engram_pad_token_id")
        cfg["dtype"] = "float64"
        return cfg
    # flat (reference-code) config
    text = {FLAT_TO_HF.get(k, k): v for k, v in cfg.items()
            if k not in ("rope_factor", "original_seq_len", "beta_fast", "beta_slow", "quantization_config", "dtype")}
    if "rope_factor" in cfg:
        text["rope_scaling"] = {"rope_type": "yarn", "factor": cfg["rope_factor"],
                                "original_max_position_embeddings": cfg["original_seq_len"],
                                "beta_fast": cfg.get("beta_fast", 32), "beta_slow": cfg.get("beta_slow", 1)}
    text["model_type"] = "deepseek_v41_text"
    top = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "float64",
           "text_config": text}
    for k in ("image_token_id", "bos_token_id", "eos_token_id"):
        if k in cfg:
            top[k] = cfg[k]
    return top


def config_variants(top):
    """[(label, composite config dict)]: as-is, plus `rope_type` when rope_scaling uses `type`."""
    out = [("as-is", top)]
    rs = top["text_config"].get("rope_scaling")
    if isinstance(rs, dict) and "type" in rs and "rope_type" not in rs:
        fixed = json.loads(json.dumps(top))
        rsf = fixed["text_config"]["rope_scaling"]
        rsf["rope_type"] = rsf.pop("type")
        out.append(("rope_type", fixed))
    return out


# ----------------------------------------------------------------------------------------------
# comparison
# ----------------------------------------------------------------------------------------------


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    e = np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-300)
    return {"median": float(np.median(e)), "max": float(e.max()), "argmax_pos": int(e.argmax()),
            "argmax_agree": float(np.mean(a.argmax(-1) == b.argmax(-1)))}


def load_fixture_model(torch, cfgm, modm, mdir, top, tmpdir):
    """Returns (model, notes)."""
    notes = {}
    files = sorted(glob.glob(os.path.join(mdir, "*.safetensors")))
    files = [f for f in files if os.path.basename(f) != "engram_token_map.safetensors"]
    raw = {}
    for f in files:
        raw.update(read_safetensors(f))
    hf_layout = all(n.startswith(("model.", "lm_head.")) for n in raw)
    config = cfgm.DeepseekV41Config(**{k: v for k, v in top.items() if k not in ("architectures", "dtype")})
    if hf_layout:
        load_dir = mdir
        notes["loader"] = "from_pretrained(fixture model dir)"
    else:
        from safetensors.torch import save_file

        qc = json.load(open(os.path.join(mdir, "config.json"))).get("quantization_config") or {}
        block = qc.get("weight_block_size", [32, 32])
        weights, skipped = to_hf_names(dequantize(raw, block))
        notes["loader"] = "dequantized to float64 under transformers names, then from_pretrained(temp dir)"
        notes["skipped_tensors"] = skipped
        load_dir = tmpdir
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()},
                  os.path.join(tmpdir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmpdir, "config.json"), "w") as f:
            json.dump(top, f)
    model, info = modm.DeepseekV41ForCausalLM.from_pretrained(load_dir, config=config, dtype=torch.float64,
                                                              output_loading_info=True, use_kernels=False)
    notes["missing_keys"] = sorted(info.get("missing_keys", []))
    notes["unexpected_keys"] = sorted(info.get("unexpected_keys", []))
    notes["mismatched_keys"] = [str(x) for x in info.get("mismatched_keys", [])]
    notes["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    model.eval()
    return model, notes


def bind_token_map(modm, model, mdir):
    tm = os.path.join(mdir, "engram_token_map.safetensors")
    if not model.config.engram_layer_ids:
        return None
    tmap = read_safetensors(tm)["token_map"][1].astype(np.int64).tolist()
    orig = modm.build_compressed_token_map
    modm.build_compressed_token_map = lambda tokenizer: (tmap, len(set(tmap)))
    try:
        model.model.bind_tokenizer(None)
    finally:
        modm.build_compressed_token_map = orig
    return len(set(tmap))


def reset_hash(model):
    hs = model.model.engram_hash_state
    if hs is not None:
        hs.history = None


class GroupResetNoCache:
    """Diagnostic for the `full-nocache+reset` mode: transformers' cache-less path (cache_layer None)
    appends every KV source's compressed entries / index keys to ONE running `shared["compress_kv"]`
    / `shared["index_k"]` (torch.cat on the group axis) instead of replacing them, so a later KV
    source's group sees the earlier groups' entries in front of its own. This context manager drops
    both keys when a KV-source layer starts (what the cached path does by re-publishing its own
    cache), to show that this concatenation is the whole difference."""

    def __init__(self, modm):
        self.cls = modm.DeepseekV41Attention

    def __enter__(self):
        orig = self.orig = self.cls.forward

        def forward(attn, hidden_states, *args, **kwargs):
            if attn.is_kv_source and kwargs.get("past_key_values") is None:
                kwargs["shared"].pop("compress_kv", None)
                kwargs["shared"].pop("index_k", None)
            return orig(attn, hidden_states, *args, **kwargs)

        self.cls.forward = forward

    def __exit__(self, *exc):
        self.cls.forward = self.orig


def run_modes(torch, modm, model, ids, decode_prefix, modes):
    out = {}
    x = torch.tensor(ids, dtype=torch.long)[None]
    T = x.shape[1]
    with torch.no_grad():
        if "full" in modes:
            reset_hash(model)
            out["full"] = model(input_ids=x, use_cache=True).logits[0].double().numpy()
        if "full-nocache" in modes:
            reset_hash(model)
            out["full-nocache"] = model(input_ids=x, use_cache=False).logits[0].double().numpy()
        if "full-nocache+reset" in modes:
            reset_hash(model)
            with GroupResetNoCache(modm):
                out["full-nocache+reset"] = model(input_ids=x, use_cache=False).logits[0].double().numpy()
        for mode, chunks in (("decode", [decode_prefix] + [1] * (T - decode_prefix)),
                             ("chunked", [5] + [7] * math.ceil((T - 5) / 7))):
            if mode not in modes:
                continue
            reset_hash(model)
            pkv, pieces, s = None, [], 0
            for n in chunks:
                if s >= T:
                    break
                r = model(input_ids=x[:, s:s + n], past_key_values=pkv, use_cache=True)
                pkv = r.past_key_values
                pieces.append(r.logits[0].double().numpy())
                s += n
            out[mode] = np.concatenate(pieces)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-src", required=True, help="folder with transformers' deepseek_v41 files (from GitHub)")
    ap.add_argument("--fixtures", default=os.path.join(REPO, "tests", "fixtures", "v41"))
    ap.add_argument("--only", default=None, help="comma-separated fixture names")
    ap.add_argument("--modes", default="full,full-nocache,full-nocache+reset,decode,chunked")
    ap.add_argument("--as-is-modes", default="full",
                    help="modes for the cfg=as-is variant when a cfg=rope_type variant exists")
    ap.add_argument("--decode-prefix", type=int, default=13)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write all results here")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    import transformers

    cfgm, modm = import_hf_v41(os.path.abspath(a.hf_src))
    modes = a.modes.split(",")
    print(f"transformers {transformers.__version__} (deepseek_v41 from {os.path.abspath(a.hf_src)}), "
          f"torch {torch.__version__}, fixtures {os.path.abspath(a.fixtures)}")
    names = sorted(d for d in os.listdir(a.fixtures) if os.path.isfile(os.path.join(a.fixtures, d, "ref.safetensors")))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    results = []
    rows = []
    for name in names:
        fdir = os.path.join(a.fixtures, name)
        mdir = os.path.join(fdir, "model")
        ref = read_safetensors(os.path.join(fdir, "ref.safetensors"))
        seqs = sorted(int(k.split("_")[1]) for k in ref if k.startswith("ids_"))
        top = composite_config(json.load(open(os.path.join(mdir, "config.json"))))
        variants = config_variants(top)
        for label, cfg in variants:
            t0 = time.time()
            with tempfile.TemporaryDirectory() as tmp:
                model, notes = load_fixture_model(torch, cfgm, modm, mdir, cfg, tmp)
            tc = model.config
            notes["compressed_vocab"] = bind_token_map(modm, model, mdir)
            notes["compress_rope"] = dict(tc.rope_parameters["compress"])
            print(f"\n== {name} cfg={label}: {json.dumps(notes)}")
            for k in seqs:
                ids = ref[f"ids_{k}"][1].astype(np.int64)
                want = ref[f"logits_{k}"][1].astype(np.float64)
                vmodes = a.as_is_modes.split(",") if label == "as-is" and len(variants) > 1 else modes
                got = run_modes(torch, modm, model, ids, a.decode_prefix, vmodes)
                for mode, lg in got.items():
                    r = {"fixture": name, "cfg": label, "seq": k, "T": len(ids), "mode": mode, "vs": "fixture",
                         **rel_err(lg, want)}
                    results.append(r)
                    if mode != "full" and "full" in got:
                        r2 = {"fixture": name, "cfg": label, "seq": k, "T": len(ids), "mode": mode, "vs": "hf-full",
                              **rel_err(lg, got["full"])}
                        results.append(r2)
            for r in [r for r in results if r["fixture"] == name and r["cfg"] == label]:
                line = (f"{r['fixture']:<15} {r['cfg']:<9} T={r['T']:<4} {r['mode']:<18} vs {r['vs']:<8} "
                        f"median {r['median']:.3e}  max {r['max']:.3e} (pos {r['argmax_pos']})  "
                        f"argmax agree {r['argmax_agree']:.3f}")
                rows.append(line)
                print(line)
            print(f"   ({time.time() - t0:.1f} s)")
    print("\nsummary")
    for line in rows:
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "hf_src": os.path.abspath(a.hf_src), "fixtures": os.path.abspath(a.fixtures),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
