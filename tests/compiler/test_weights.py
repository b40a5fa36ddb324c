"""The weight binder (compiler/weights.py) finds, from bytes alone, the layouts the Qwen3
generator writes down by hand: the committed manifest's binds (q|k|v fused, gate|up fused,
single tensors) are rebuilt byte for byte from a small seeded checkpoint with the same tensor
names, and the binder names every tensor of every bind, in order. Slices (a tensor-parallel
shard), gaps (bytes of no tensor) and equal-content tensors are reported as what they are."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
from paths import ROOT

from compiler import weights

H, I, V, D, HEADS, KV, LAYERS = 64, 96, 256, 16, 4, 2, 2  # a tiny Qwen3 geometry


def _shapes() -> dict[str, tuple[int, ...]]:
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        s.update({p + "self_attn.q_proj.weight": (HEADS * D, H), p + "self_attn.k_proj.weight": (KV * D, H),
                  p + "self_attn.v_proj.weight": (KV * D, H), p + "self_attn.o_proj.weight": (H, HEADS * D),
                  p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                  p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                  p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                  p + "post_attention_layernorm.weight": (H,)})
    return s


def _write(path, seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    data = {}
    for name, shape in sorted(_shapes().items()):
        if len(shape) == 1:  # norms start at ones, as a random init leaves them
            data[name] = np.full(shape, 0x3F80, np.uint16).tobytes()
        else:
            data[name] = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).tobytes()
    header, at = {}, 0
    for name in sorted(data):
        header[name] = {"dtype": "BF16", "shape": list(_shapes()[name]), "data_offsets": [at, at + len(data[name])]}
        at += len(data[name])
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(data[n] for n in sorted(data)))
    return data


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    p = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    data = _write(p)
    ix = weights.index([p])
    yield ix, data
    ix.close()


def _committed_binds() -> dict[str, list[str]]:
    """The committed manifest's weight binds of layers 0 and 1, the embedding and the final norm."""
    m = json.loads((ROOT / "manifests/qwen3/qwen3.json").read_text())
    out = {}
    for name, b in m["buffers"].items():
        names = [x["tensor"] for x in b.get("bind", [])]
        if b.get("kind") != "weight" or not names or any(t.startswith("mine.") for t in names):
            continue
        layer = re.match(r"model\.layers\.(\d+)\.", names[0])
        if layer is None or int(layer.group(1)) < LAYERS:
            out[name] = names
    return out


def test_the_generators_layouts_are_found_from_bytes(ckpt):
    ix, data = ckpt
    sizes = {n: len(b) for n, b in data.items()}
    binds = _committed_binds()
    assert any(len(v) == 3 for v in binds.values()) and any(len(v) == 2 for v in binds.values())
    for buf, names in sorted(binds.items()):
        engine_bytes = b"".join(data[n] for n in names)  # the engine's buffer, as the generator says
        got = weights.bind(engine_bytes, ix)
        if all(len(_shapes()[n]) == 1 for n in names):
            # a norm of ones: every norm of that size is these bytes; the binder lists them all
            assert got.kind == "exact" and set(names) <= {got.pieces[0].tensor, *got.pieces[0].alternatives}
            continue
        assert got.binds(sizes) == [{"tensor": n} for n in names], buf
        assert got.kind == ("exact" if len(names) == 1 else "concat")


def test_a_tensor_parallel_shard_is_a_slice(ckpt):
    ix, data = ckpt
    name = "model.layers.1.mlp.gate_proj.weight"
    row = H * 2
    shard = data[name][32 * row:64 * row]  # rows 32..63 of 96
    got = weights.bind(shard, ix)
    assert got.kind == "slice" and got.pieces == (weights.Piece(name, 32 * row, 32 * row),)
    assert got.binds({n: len(b) for n, b in data.items()}) is None


def test_bytes_of_no_tensor_are_a_gap(ckpt):
    ix, data = ckpt
    a, b = "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"
    junk = np.random.default_rng(99).integers(0, 256, size=10 * ix.align, dtype=np.uint8).tobytes()
    got = weights.bind(data[a] + junk + data[b], ix)
    assert got.kind == "partial"
    assert [type(p).__name__ for p in got.pieces] == ["Piece", "Gap", "Piece"]
    assert got.pieces[0].tensor == a and got.pieces[2].tensor == b
    assert got.pieces[1] == weights.Gap(len(data[a]), len(junk))


def test_nothing_known_is_none(ckpt):
    ix, _ = ckpt
    junk = np.random.default_rng(7).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    got = weights.bind(junk, ix)
    assert got.kind == "none" and got.pieces == (weights.Gap(0, 4096),)
