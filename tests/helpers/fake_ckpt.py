"""A checkpoint that holds every tensor a manifest binds, as a sparse safetensors file (CPU tests).

The data region is a hole (zeros on read, no disk used), so a 0.6B-geometry checkpoint costs
nothing; the bytes at one tensor can be set to make two checkpoints differ. Only what
`mine compare`'s checks read is real: names, dtypes, shapes (a multi-tensor bind splits its
buffer's first dimension, the remainder on the first tensor), offsets.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

DT = {"bf16": ("BF16", 2), "f32": ("F32", 4), "i32": ("I32", 4), "i64": ("I64", 8), "u8": ("U8", 1)}


def write(m: dict, folder: Path, config: dict, skip: tuple = (), stamp: bytes = b"", own: bool = False) -> Path:
    """config.json + model.safetensors (or, with own=True, only the `mine.*` tensors the generator
    writes beside the manifest, as <folder>/bindings.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    header, off = {}, 0
    for name, b in sorted(m["buffers"].items()):
        if b.get("kind") != "weight":
            continue
        binds = [x["tensor"] for x in b.get("bind", [])]
        shape = [int(d) for d in b["shape"]]
        for k, t in enumerate(binds):
            if t in skip or t.startswith("mine.") != own:
                continue
            part = list(shape)
            if len(binds) > 1:
                part[0] = shape[0] // len(binds) + (shape[0] % len(binds) if k == 0 else 0)
            code, size = DT[b["dtype"]]
            n = size
            for d in part:
                n *= d
            header[t] = {"dtype": code, "shape": part, "data_offsets": [off, off + n]}
            off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / ("bindings.safetensors" if own else "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if stamp:
            f.write(stamp)
        f.truncate(8 + len(raw) + off)
    if not own:
        (folder / "config.json").write_text(json.dumps(config))
    return path
