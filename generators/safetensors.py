"""The safetensors header reader both generators check checkpoints with (no weights are read).

Why one: `mine gen qwen3 --weights` and `mine k3 binds` both match a manifest's binds against the
tensor names and shapes of a checkpoint's headers; a damaged header is one `CheckpointError`
naming the file, never a struct or JSON exception. `tensor_ranges` and `tensors` add where each
tensor's bytes lie, for the readers of the bytes (`mine compare`'s checkpoint fingerprint, the
compiler's weight binder). `write` makes a file of named tensors (the compiler's
weights/extra.safetensors: the bytes of weight ranges no checkpoint tensor holds).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from vocab.errors import MineError

MAX_HEADER = 1 << 30


class CheckpointError(MineError, OSError):
    """A checkpoint directory or a safetensors header that cannot be read."""


def read_header(path: Path) -> dict:
    """tensor name -> {dtype, shape, data_offsets} of the safetensors file `path` (no metadata);
    every tensor's dtype is a string and its shape a list of sizes."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path.name}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise CheckpointError(f"{path.name}: header length {n} is not plausible", value=n, limit=MAX_HEADER)
        text = f.read(n)
    try:
        header = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path.name}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    for name, info in header.items():
        ok = (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
              and all(type(d) is int and d >= 0 for d in info["shape"]))
        if not ok:
            raise CheckpointError(f"{path.name}: tensor `{name}` has no dtype and shape in the header", value=name)
    return header


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset of the data in `file`
    end: int


def tensor_ranges(path: Path) -> list[Tensor]:
    """The tensors of one safetensors file with their data's absolute byte ranges (for readers of
    the bytes: a checkpoint's fingerprint, the compiler's weight binder)."""
    path = Path(path)
    try:
        head = read_header(path)
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


def tensors(paths: list[Path]) -> dict[str, Tensor]:
    """Every tensor of the given files by name; a name in two files is refused (kern would bind one)."""
    out: dict[str, Tensor] = {}
    for p in paths:
        for t in tensor_ranges(p):
            if t.name in out:
                raise CheckpointError(f"tensor {t.name!r} is in both {out[t.name].file.name} and {p.name}")
            out[t.name] = t
    return out


def write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file of `tensors` (name -> (dtype as safetensors spells it, shape, bytes)), names
    in sorted order, the header padded to 8 bytes; written to a temporary name and renamed."""
    path = Path(path)
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(bytes(data))
        at += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head += b" " * (-len(head) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)
    tmp.replace(path)
    return path


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, in name order; one sentence when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} is not a directory", value=folder)
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"checkpoint {folder} holds no *.safetensors file", value=folder)
    return found
