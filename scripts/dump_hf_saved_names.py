#!/usr/bin/env python3
"""Builds a tiny DeepseekV4ForCausalLM with transformers, save_pretrained()s it and prints the
tensor names (with dtype and shape) that transformers wrote, one per line, sorted.

The loader's name mapping (src/io/checkpoint.cc, Checkpoint::to_native_name) is tested against this
list (tests/data/io/hf_saved_names.txt). Rerun after a transformers upgrade:

    /work/venv-ref/bin/python scripts/dump_hf_saved_names.py > tests/data/io/hf_saved_names.txt
    /work/venv-ref/bin/python scripts/dump_hf_saved_names.py --modules > tests/data/io/hf_module_names.txt

The model covers every kind of layer: sliding, CSA and HCA attention, hash-routed and
score-routed MoE. --modules prints the in-memory state_dict names instead (HF module naming, with
stacked experts), which is what a checkpoint saved without the reverse conversion would hold.
"""
import json
import os
import sys
import tempfile

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM


def build():
    layer_types = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    cfg = DeepseekV4Config(
        vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, partial_rotary_factor=8 / 32, q_lora_rank=32, o_groups=2, o_lora_rank=16,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
        layer_types=layer_types, mlp_layer_types=["hash_moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=8, hc_mult=4, hc_sinkhorn_iters=20, index_n_heads=2, index_head_dim=16, index_topk=3,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return DeepseekV4ForCausalLM(cfg).eval()


def main():
    from safetensors import safe_open

    m = build()
    if "--modules" in sys.argv:
        print(f"# transformers {transformers.__version__}, state_dict of the in-memory model")
        for name, p in sorted(m.state_dict().items()):
            print(f"{name}\t{str(p.dtype).replace('torch.', '')}\t{list(p.shape)}")
        return
    with tempfile.TemporaryDirectory() as d:
        m.save_pretrained(d)
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        rows = []
        for f in files:
            with safe_open(os.path.join(d, f), "pt") as st:
                for k in st.keys():
                    sl = st.get_slice(k)
                    rows.append((k, sl.get_dtype(), sl.get_shape()))
        print(f"# transformers {transformers.__version__}, save_pretrained wrote: {' '.join(sorted(os.listdir(d)))}")
        for k, dt, shape in sorted(rows):
            print(f"{k}\t{dt}\t{list(shape)}")


if __name__ == "__main__":
    main()
