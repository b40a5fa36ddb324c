"""The safetensors header reader both generators check checkpoints with (no weights are read).

Why one: `mine gen qwen3 --weights` and `mine k3 binds` both match a manifest's binds against the
tensor names and shapes of a checkpoint's headers; a damaged header is one `CheckpointError`
naming the file, never a struct or JSON exception.
"""

from __future__ import annotations

import json
import struct
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
