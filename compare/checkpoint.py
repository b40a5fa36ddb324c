"""A checkpoint's tensors, read from safetensors headers, and a fingerprint of its contents.

Why a fingerprint: a reference recorded on one checkpoint says nothing about another of the same
geometry (two seeds give two models with equal configs). Hashing whole checkpoints costs seconds
per gigabyte, so the fingerprint hashes every tensor's name, dtype, shape and the first and last
64 KiB of its bytes: any re-seeded or re-shaped checkpoint differs, a single flipped byte deep
inside a tensor may not (that is not what it guards against).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from generators.safetensors import CheckpointError, checkpoint_files as files, tensors

SAMPLE = 64 * 1024


def fingerprint(folder: Path) -> str:
    """`sha256:<hex>` over every tensor's name, dtype, shape and the first and last 64 KiB of its data."""
    h = hashlib.sha256()
    for t in sorted(tensors(files(folder)).values(), key=lambda t: t.name):
        h.update(json.dumps([t.name, t.dtype, list(t.shape), t.end - t.begin]).encode())
        with open(t.file, "rb") as f:
            f.seek(t.begin)
            h.update(f.read(min(SAMPLE, t.end - t.begin)))
            if t.end - t.begin > 2 * SAMPLE:
                f.seek(t.end - SAMPLE)
                h.update(f.read(SAMPLE))
    return "sha256:" + h.hexdigest()


def config(folder: Path) -> dict:
    """The checkpoint's config.json (the model's geometry), {} when it has none."""
    p = Path(folder) / "config.json"
    if not p.is_file():
        return {}
    try:
        c = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {p} as JSON: {e}") from None
    if not isinstance(c, dict):
        raise CheckpointError(f"{p} is not a JSON object")
    return c
