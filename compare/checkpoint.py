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

from vocab.errors import MineError

SAMPLE = 64 * 1024
HEADER_LIMIT = 100 * 1024 * 1024  # a safetensors header larger than this is not one


class CheckpointError(MineError, ValueError):
    """A checkpoint folder or file that cannot be used, in one sentence naming it."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset of the data in `file`
    end: int


def read_header(path: Path) -> list[Tensor]:
    """The tensors of one safetensors file (its 8-byte length, then the JSON header)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > HEADER_LIMIT:
                raise CheckpointError(f"{path} is not a safetensors file (header length {n} bytes)")
            head = f.read(n)
            size = f.seek(0, 2)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        meta = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is not a safetensors file (its header is not a JSON object)")
    base, out = 8 + n, []
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        try:
            b, e = (int(x) for x in t["data_offsets"])
            shape = tuple(int(x) for x in t["shape"])
            dtype = str(t["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets") from None
        if not 0 <= b <= e or base + e > size:
            raise CheckpointError(f"{path}: tensor {name!r} lies outside the file (offsets {b}..{e}, "
                                  f"{size - base} data bytes)")
        out.append(Tensor(name, dtype, shape, path, base + b, base + e))
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
