"""The tensors a Qwen3 manifest binds that no checkpoint holds, written as safetensors.

`mine.rope.cos_sin` is vLLM's rotary cache: for position p and i < head_dim/2, cos then sin of
p * theta^(-2i/head_dim), computed in float32 and rounded to bf16 (round to nearest even), one
row per position; `mine.kv_scale` is the f32 1.0 the cache-write and attention kernels take a
pointer to (read only for fp8 caches). The file format is written here (8-byte little-endian
header length, JSON header, data), so no dependency is needed. `checkpoint_problems` reads only
safetensors headers to say which tensors a manifest binds that a checkpoint lacks.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from generators.safetensors import read_header


def bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def cos_sin(head_dim: int, theta: float, positions: int) -> np.ndarray:
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))).astype(np.float32)
    freqs = np.arange(positions, dtype=np.float32)[:, None] * inv[None, :]
    return bf16_bits(np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1))


def write(path: Path, cfg, positions: int) -> Path:
    tensors = {"mine.kv_scale": ("F32", [1], np.ones(1, np.float32).tobytes()),
               "mine.rope.cos_sin": ("BF16", [positions, cfg.head_dim], cos_sin(cfg.head_dim, cfg.theta, positions).tobytes())}
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


def checkpoint_problems(manifest: dict, files: list[Path]) -> list[str]:
    """Binds of `manifest` whose tensor none of `files` holds, or holds with another element count."""
    have = {}
    for f in files:
        for name, t in read_header(f).items():
            have[name] = t
    out = []
    for bname, b in sorted(manifest["buffers"].items()):
        segs = b.get("bind") or []
        if not segs:
            continue  # not a weight: nothing to find in the checkpoint
        if not all(isinstance(d, int) for d in b["shape"]):
            out.append(f"weight buffer `{bname}` has a var-sized shape {b['shape']}; weights are fixed-size")
            continue
        want = int(np.prod(b["shape"]))
        got = 0
        for s in segs:
            t = have.get(s["tensor"])
            if t is None:
                out.append(f"buffer `{bname}` binds `{s['tensor']}`, which no weight file holds")
                break
            got += int(np.prod(t["shape"]))
        else:
            if segs and got != want:
                out.append(f"buffer `{bname}` holds {want} elements but its tensors hold {got}")
    return out
