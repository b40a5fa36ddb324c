"""A headers-only K3 safetensors checkpoint for tests, listed from the architecture facts.

The tensor list is written here independently of generators/k3/weights.py (names and shapes as the
K3 checkpoint stores them), so `mine k3 binds` is checked against something it did not produce.
Each file is an 8-byte little-endian header length, then the JSON header; no tensor data follows.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

H, V, INNER, HEADS = 7168, 163840, 12288, 96


def k3_tensors(experts: int, layers: int = 93) -> dict:
    t = {}
    p = "language_model."
    t[p + "model.embed_tokens.weight"] = ("BF16", [V, H])
    t[p + "lm_head.weight"] = ("BF16", [V, H])
    t[p + "model.norm.weight"] = ("BF16", [H])
    t[p + "model.output_attn_res_norm.weight"] = ("BF16", [H])
    t[p + "model.output_attn_res_proj.weight"] = ("BF16", [1, H])
    for i in range(layers):
        L = f"{p}model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "mlp_res_norm"):
            t[L + n + ".weight"] = ("BF16", [H])
        t[L + "mlp_res_proj.weight"] = ("BF16", [1, H])
        if i > 0:
            t[L + "self_attention_res_norm.weight"] = ("BF16", [H])
            t[L + "self_attention_res_proj.weight"] = ("BF16", [1, H])
        a = L + "self_attn."
        if i % 4 == 3 or i == 92:
            t[a + "q_a_proj.weight"] = ("BF16", [1536, H])
            t[a + "kv_a_proj_with_mqa.weight"] = ("BF16", [576, H])
            t[a + "g_proj.weight"] = ("BF16", [INNER, H])
            t[a + "q_a_layernorm.weight"] = ("BF16", [1536])
            t[a + "kv_a_layernorm.weight"] = ("BF16", [512])
            t[a + "q_b_proj.weight"] = ("BF16", [18432, 1536])
            t[a + "kv_b_proj.weight"] = ("BF16", [HEADS * 256, 512])
        else:
            for n in "qkvg":
                t[a + f"{n}_proj.weight"] = ("BF16", [INNER, H])
            t[a + "b_proj.weight"] = ("BF16", [HEADS, H])
            t[a + "f_a_proj.weight"] = ("BF16", [128, H])
            t[a + "f_b_proj.weight"] = ("BF16", [INNER, 128])
            for n in "qkv":
                t[a + f"{n}_conv1d.weight"] = ("F32", [INNER, 1, 4])
            t[a + "dt_bias"] = ("F32", [INNER])
            t[a + "A_log"] = ("F32", [1, 1, HEADS, 1])
            t[a + "o_norm.weight"] = ("F32", [128])
        t[a + "o_proj.weight"] = ("BF16", [H, INNER])
        if i == 0:
            t[L + "mlp.gate_proj.weight"] = ("BF16", [33792, H])
            t[L + "mlp.up_proj.weight"] = ("BF16", [33792, H])
            t[L + "mlp.down_proj.weight"] = ("BF16", [H, 33792])
            continue
        m = L + "block_sparse_moe."
        t[m + "gate.weight"] = ("BF16", [experts, H])
        t[m + "gate.e_score_correction_bias"] = ("F32", [experts])
        t[m + "routed_expert_down_proj.weight"] = ("BF16", [3584, H])
        t[m + "routed_expert_up_proj.weight"] = ("BF16", [H, 3584])
        t[m + "routed_expert_norm.weight"] = ("BF16", [3584])
        t[m + "shared_experts.gate_proj.weight"] = ("BF16", [6144, H])
        t[m + "shared_experts.up_proj.weight"] = ("BF16", [6144, H])
        t[m + "shared_experts.down_proj.weight"] = ("BF16", [H, 6144])
        for e in range(experts):
            x = f"{m}experts.{e}."
            for w in ("w1", "w3"):
                t[x + w + ".weight_packed"] = ("U8", [3072, 1792])
                t[x + w + ".weight_scale"] = ("U8", [3072, 112])
            t[x + "w2.weight_packed"] = ("U8", [3584, 1536])
            t[x + "w2.weight_scale"] = ("U8", [3584, 96])
    return t


def write_checkpoint(directory: Path, tensors: dict, shards: int = 4) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    size = {"BF16": 2, "F32": 4, "U8": 1}
    for s in range(shards):
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n in names[s::shards]:
            dtype, shape = tensors[n]
            nbytes = size[dtype]
            for d in shape:
                nbytes *= d
            header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
            off += nbytes
        raw = json.dumps(header).encode()
        (directory / f"model-{s:05d}-of-{shards:05d}.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return directory
