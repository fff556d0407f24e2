"""Shared pieces of the nano DeepSeek-V4 pipeline: corpus formatting, config, MTP module, naming.

Everything here is plain PyTorch / transformers 5.17; it runs on CPU and on the H200.
"""
import copy
import gzip
import json
import os
import random

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../.."))
CORPUS = os.path.join(REPO, "data/nano/kjv.jsonl.gz")
MODEL_DIR = os.path.join(REPO, "models/nano-v4")

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT, THINK, END_THINK = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT, THINK, END_THINK]  # ids 0..6
VOCAB_SIZE = 8192

# DeepSeek-V3 style chat template (chat mode: the assistant turn opens with </think>).
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{{ message['content'] }}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<｜Assistant｜></think>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜></think>' }}{%- endif %}"
)


def load_chapters():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def chapter_text(c):
    """One training document: a heading line, a blank line, one verse per line."""
    return f"{c['book']} {c['chapter']}\n\n" + "\n".join(c["verses"]) + "\n"


def chat_pairs(chapters, n, seed=1234):
    """Verse-recitation chat samples (user: reference, assistant: the verse) from the given chapters."""
    rng = random.Random(seed)
    refs = [(c, i) for c in chapters for i in range(len(c["verses"]))]
    out = []
    for c, i in rng.sample(refs, min(n, len(refs))):
        out.append((f"Recite {c['book']} {c['chapter']}:{i + 1}.", c["verses"][i]))
    return out


def chat_text(user, assistant):
    """Rendered exactly as CHAT_TEMPLATE renders [user, assistant] (without the BOS, added by the encoder)."""
    return f"{USER}{user}{ASSISTANT}{END_THINK}{assistant}{EOS}"


# --------------------------------------------------------------------------------------------
# Model config (nano). Layer schedule: 0 SWA, 1 CSA, 2 HCA, 3 CSA, 4 HCA, 5 CSA; MTP = SWA.
# Layers 0-1 are hash-routed, the others and the MTP layer score-routed.
COMPRESS_RATIOS = [0, 4, 16, 4, 16, 4]
RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 16: "heavily_compressed_attention"}
NUM_HASH_LAYERS = 2

NANO = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=len(COMPRESS_RATIOS),
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=128,
    o_groups=2,
    o_lora_rank=64,
    sliding_window=32,
    index_n_heads=8,
    index_head_dim=32,
    index_topk=16,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    topk_method="noaux_tc",
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                  "beta_fast": 32, "beta_slow": 1},
    max_position_embeddings=4096,
    hidden_act="silu",
    initializer_range=0.02,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    num_nextn_predict_layers=1,
)


def published_config():
    """config.json in the published style: legacy fields plus the HF-readable ones."""
    c = copy.deepcopy(NANO)  # DeepseekV4Config mutates nested dicts it is given
    c.update(
        architectures=["DeepseekV4ForCausalLM"],
        model_type="deepseek_v4",
        torch_dtype="bfloat16",
        compress_ratios=COMPRESS_RATIOS + [0],  # trailing 0 = the MTP layer
        compress_rate_csa=4,
        compress_rate_hca=16,
        num_hash_layers=NUM_HASH_LAYERS,
        # transformers 5.17 maps only ratios 0/4/128 from compress_ratios, so the schedule is
        # also given explicitly (it takes precedence there; the legacy list agrees with it).
        layer_types=[RATIO_TO_TYPE[r] for r in COMPRESS_RATIOS],
        mlp_layer_types=["hash_moe"] * NUM_HASH_LAYERS + ["moe"] * (len(COMPRESS_RATIOS) - NUM_HASH_LAYERS),
        pad_token_id=2,
        transformers_version="5.17.0",
    )
    return c


def hf_config(**over):
    from transformers import DeepseekV4Config
    c = published_config()
    for k in ("architectures", "model_type", "torch_dtype", "compress_ratios", "topk_method", "transformers_version"):
        c.pop(k, None)
    c.update(over)
    cfg = DeepseekV4Config(**c)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def mtp_layer_config():
    """Config under which DeepseekV4DecoderLayer(cfg, layer_idx=N) is a sliding-only, score-routed layer."""
    n = len(COMPRESS_RATIOS)
    return hf_config(num_hidden_layers=n + 1,
                     layer_types=[RATIO_TO_TYPE[r] for r in COMPRESS_RATIOS] + ["sliding_attention"],
                     mlp_layer_types=["hash_moe"] * NUM_HASH_LAYERS + ["moe"] * (n + 1 - NUM_HASH_LAYERS))


class MTP(nn.Module):
    """DeepSeek-V4 MTP block (spec §3.9): streams X_t + embed(token_{t+1}) -> logits for token t+2."""

    def __init__(self, base_cfg):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
            DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RMSNorm)
        cfg = mtp_layer_config()
        self.cfg = cfg
        D = cfg.hidden_size
        self.hc = cfg.hc_mult
        self.enorm = DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.layer = DeepseekV4DecoderLayer(cfg, layer_idx=cfg.num_hidden_layers - 1)
        self.hc_head = DeepseekV4HyperHead(cfg)
        self.norm = DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        std = cfg.initializer_range
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0, std)
            L = self.layer
            L.mlp.experts.gate_up_proj.normal_(0, std)
            L.mlp.experts.down_proj.normal_(0, std)
            L.mlp.gate.weight.normal_(0, std)
            L.mlp.gate.e_score_correction_bias.zero_()
            L.self_attn.sinks.zero_()
            for h in (L.attn_hc, L.ffn_hc):
                h.fn.normal_(0, std); h.base.zero_(); h.scale.fill_(1.0)
            self.hc_head.hc_fn.normal_(0, std); self.hc_head.hc_base.zero_(); self.hc_head.hc_scale.fill_(1.0)

    def forward(self, streams, next_emb, rotary, position_ids, attention_mask):
        """streams [B,S,hc,D] (main model, before hc_head), next_emb [B,S,D] = embed(token_{t+1})."""
        e = self.e_proj(self.enorm(next_emb))  # [B,S,D]
        x = self.h_proj(self.hnorm(streams))  # [B,S,hc,D]
        h = x + e.unsqueeze(2)
        pe = {"main": rotary(next_emb, position_ids=position_ids, layer_type="main")}
        h = self.layer(h, position_embeddings=pe, position_ids=position_ids, attention_mask=attention_mask,
                       input_ids=None, past_key_values=None)
        return self.norm(self.hc_head(h))


# --------------------------------------------------------------------------------------------
# Native (published) tensor names <-> our modules.

def _layer_map(prefix_hf, prefix_nat, ltype, is_hash):
    """Yields (hf_name, native_name, kind) for one decoder layer. kind: 'w' plain, 'f32' kept F32,
    'i64' integer buffer, 'experts' stacked experts."""
    H, N = prefix_hf, prefix_nat
    m = [
        ("input_layernorm.weight", "attn_norm.weight", "w"),
        ("post_attention_layernorm.weight", "ffn_norm.weight", "w"),
        ("attn_hc.fn", "hc_attn_fn", "f32"), ("attn_hc.base", "hc_attn_base", "f32"),
        ("attn_hc.scale", "hc_attn_scale", "f32"),
        ("ffn_hc.fn", "hc_ffn_fn", "f32"), ("ffn_hc.base", "hc_ffn_base", "f32"),
        ("ffn_hc.scale", "hc_ffn_scale", "f32"),
        ("self_attn.sinks", "attn.attn_sink", "f32"),
        ("self_attn.q_a_proj.weight", "attn.wq_a.weight", "w"),
        ("self_attn.q_a_norm.weight", "attn.q_norm.weight", "w"),
        ("self_attn.q_b_proj.weight", "attn.wq_b.weight", "w"),
        ("self_attn.kv_proj.weight", "attn.wkv.weight", "w"),
        ("self_attn.kv_norm.weight", "attn.kv_norm.weight", "w"),
        ("self_attn.o_a_proj.weight", "attn.wo_a.weight", "w"),
        ("self_attn.o_b_proj.weight", "attn.wo_b.weight", "w"),
        ("mlp.gate.weight", "ffn.gate.weight", "w"),
        ("mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight", "w"),
        ("mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight", "w"),
        ("mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight", "w"),
        ("mlp.experts", "ffn.experts", "experts"),
    ]
    m.append(("mlp.gate.tid2eid", "ffn.gate.tid2eid", "i64") if is_hash else
             ("mlp.gate.e_score_correction_bias", "ffn.gate.bias", "f32"))
    if ltype != "sliding_attention":
        m += [
            ("self_attn.compressor.kv_proj.weight", "attn.compressor.wkv.weight", "w"),
            ("self_attn.compressor.gate_proj.weight", "attn.compressor.wgate.weight", "w"),
            ("self_attn.compressor.position_bias", "attn.compressor.ape", "f32"),
            ("self_attn.compressor.kv_norm.weight", "attn.compressor.norm.weight", "w"),
        ]
    if ltype == "compressed_sparse_attention":
        m += [
            ("self_attn.compressor.indexer.q_b_proj.weight", "attn.indexer.wq_b.weight", "w"),
            ("self_attn.compressor.indexer.scorer.weights_proj.weight", "attn.indexer.weights_proj.weight", "w"),
            ("self_attn.compressor.indexer.kv_proj.weight", "attn.indexer.compressor.wkv.weight", "w"),
            ("self_attn.compressor.indexer.gate_proj.weight", "attn.indexer.compressor.wgate.weight", "w"),
            ("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape", "f32"),
            ("self_attn.compressor.indexer.kv_norm.weight", "attn.indexer.compressor.norm.weight", "w"),
        ]
    return [(H + a, N + b, k) for a, b, k in m]


def name_map(cfg):
    """Full list (hf_state_dict_key, native_key, kind) for model + MTP.
    HF keys of the MTP live under 'mtp.' of our training wrapper (see train.py: NanoV4)."""
    out = [("model.embed_tokens.weight", "embed.weight", "w"), ("lm_head.weight", "head.weight", "w"),
           ("model.norm.weight", "norm.weight", "w"), ("model.hc_head.hc_fn", "hc_head_fn", "f32"),
           ("model.hc_head.hc_base", "hc_head_base", "f32"), ("model.hc_head.hc_scale", "hc_head_scale", "f32")]
    for i in range(cfg.num_hidden_layers):
        out += _layer_map(f"model.layers.{i}.", f"layers.{i}.", cfg.layer_types[i], cfg.mlp_layer_types[i] == "hash_moe")
    out += _layer_map("mtp.layer.", "mtp.0.", "sliding_attention", False)
    out += [("mtp.e_proj.weight", "mtp.0.e_proj.weight", "w"), ("mtp.h_proj.weight", "mtp.0.h_proj.weight", "w"),
            ("mtp.enorm.weight", "mtp.0.enorm.weight", "w"), ("mtp.hnorm.weight", "mtp.0.hnorm.weight", "w"),
            ("mtp.norm.weight", "mtp.0.norm.weight", "w"), ("mtp.hc_head.hc_fn", "mtp.0.hc_head_fn", "f32"),
            ("mtp.hc_head.hc_base", "mtp.0.hc_head_base", "f32"),
            ("mtp.hc_head.hc_scale", "mtp.0.hc_head_scale", "f32")]
    return out


def to_native(sd, cfg):
    """Our state dict (NanoV4) -> native tensors with published dtypes."""
    out = {}
    used = set()
    for hk, nk, kind in name_map(cfg):
        if kind == "experts":
            gu, dn = sd[hk + ".gate_up_proj"], sd[hk + ".down_proj"]
            used |= {hk + ".gate_up_proj", hk + ".down_proj"}
            I = gu.shape[1] // 2
            for e in range(gu.shape[0]):
                out[f"{nk}.{e}.w1.weight"] = gu[e, :I].to(torch.bfloat16).contiguous()
                out[f"{nk}.{e}.w3.weight"] = gu[e, I:].to(torch.bfloat16).contiguous()
                out[f"{nk}.{e}.w2.weight"] = dn[e].to(torch.bfloat16).contiguous()
            continue
        t = sd[hk]
        used.add(hk)
        if kind == "i64":
            out[nk] = t.to(torch.int64).contiguous()
        elif kind == "f32":
            out[nk] = t.to(torch.float32).contiguous()
        else:
            out[nk] = t.to(torch.bfloat16).contiguous()
    skipped = [k for k in sd if k not in used and "inv_freq" not in k]
    if skipped:
        raise RuntimeError(f"unexported tensors: {skipped[:10]}")
    return out


def from_native(nat, cfg, dtype=torch.float32):
    """Native tensors -> NanoV4 state dict (inverse of to_native)."""
    sd = {}
    for hk, nk, kind in name_map(cfg):
        if kind == "experts":
            E = cfg.n_routed_experts
            w1 = [nat[f"{nk}.{e}.w1.weight"] for e in range(E)]
            w3 = [nat[f"{nk}.{e}.w3.weight"] for e in range(E)]
            w2 = [nat[f"{nk}.{e}.w2.weight"] for e in range(E)]
            sd[hk + ".gate_up_proj"] = torch.stack([torch.cat([a, b], 0) for a, b in zip(w1, w3)]).to(dtype)
            sd[hk + ".down_proj"] = torch.stack(w2).to(dtype)
        elif kind == "i64":
            sd[hk] = nat[nk].long()
        else:
            sd[hk] = nat[nk].to(dtype)
    return sd
