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
import struct
from dataclasses import dataclass
from pathlib import Path

from generators.safetensors import CheckpointError, read_header as _header

SAMPLE = 64 * 1024


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset of the data in `file`
    end: int


def read_header(path: Path) -> list[Tensor]:
    """The tensors of one safetensors file, with their data's absolute byte ranges (the header is
    read and checked by generators.safetensors, the one reader of it)."""
    path = Path(path)
    try:
        head = _header(path)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            size = f.seek(0, 2)
    except OSError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    out = []
    for name, t in head.items():
        try:
            b, e = (int(x) for x in t["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has no valid data_offsets") from None
        if not 0 <= b <= e or 8 + n + e > size:
            raise CheckpointError(f"{path}: tensor {name!r} lies outside the file (offsets {b}..{e}, "
                                  f"{size - 8 - n} data bytes)")
        out.append(Tensor(name, str(t["dtype"]), tuple(t["shape"]), path, 8 + n + b, 8 + n + e))
    return out


def files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, in name order; one sentence when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} is not a folder")
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"checkpoint {folder} holds no *.safetensors file")
    return found


def tensors(paths: list[Path]) -> dict[str, Tensor]:
    """Every tensor of the given files by name; a name in two files is refused (kern would bind one)."""
    out: dict[str, Tensor] = {}
    for p in paths:
        for t in read_header(p):
            if t.name in out:
                raise CheckpointError(f"tensor {t.name!r} is in both {out[t.name].file.name} and {p.name}")
            out[t.name] = t
    return out


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
