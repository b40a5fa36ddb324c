"""Which checkpoint tensors a weight range of a capture holds, found from the bytes alone.

Why bytes: an engine loads a checkpoint into buffers of its own layout -- vLLM fuses q, k and v
into one qkv weight and gate and up into one, shards rows across tensor-parallel ranks, keeps the
tied embedding once. A per-model generator writes those layouts down by hand; a compiler that
serves any model must find them. The bytes a run only reads are the checkpoint's bytes, moved:
so a range is explained by walking it and, at each position, finding the checkpoint tensor
bytes that continue it the longest. The result is a list of pieces (tensor, byte offset in the
tensor, length): one piece covering a whole tensor is an exact binding, several whole tensors
back to back a concatenation, a piece inside a tensor a slice; bytes no tensor holds are left as
gaps (the compiler writes those into a safetensors file of its own).

Candidates are found through an index of every tensor's bytes at every row start (a row is the
tensor's last dimension): a range piece starts at a row boundary of its tensor in every layout an
engine makes by concatenating or sharding along rows. Equal-content tensors (a random-init norm
weight of ones in every layer) are all listed as alternatives of a piece; which one is meant is
not a question the bytes can answer, and the binder says so rather than guessing (each
alternative with its byte offset; compiler/weight_binds.py decides by address neighbours). A piece
that stops inside its tensor is cut back to a row boundary of the index (`Index.align`): bytes past
the end of a slice may agree with the tensor's next ones by chance.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from generators.safetensors import Tensor, tensors as checkpoint_tensors

KEY = 64  # bytes of a row start that index it; shorter rows are indexed by their whole length

@dataclass(frozen=True)
class Piece:
    tensor: str
    start: int  # byte offset in the tensor
    length: int  # bytes
    alternatives: tuple[str, ...] = ()  # other tensors holding the same bytes (by name)
    alt_starts: tuple[int, ...] = ()    # where in each alternative (byte offset), in the same order


@dataclass(frozen=True)
class Gap:
    start: int  # byte offset in the range
    length: int


@dataclass(frozen=True)
class Binding:
    size: int
    pieces: tuple  # Piece | Gap, in range order

    @property
    def kind(self) -> str:
        """exact | concat | slice | partial (some gap) | none."""
        ps = [p for p in self.pieces if isinstance(p, Piece)]
        if not ps:
            return "none"
        if any(isinstance(p, Gap) for p in self.pieces):
            return "partial"
        return "exact" if len(ps) == 1 and ps[0].start == 0 else ("concat" if len(ps) > 1 else "slice")

    def binds(self, sizes: dict[str, int]) -> Optional[list[dict]]:
        """The manifest `bind` list for this range when it is whole tensors back to back, else None."""
        ps = list(self.pieces)
        if not ps or any(isinstance(p, Gap) or p.start != 0 or p.length != sizes[p.tensor] for p in ps):
            return None
        return [{"tensor": p.tensor} for p in ps]


@dataclass
class Index:
    """Row starts of every tensor, keyed by their first bytes; the tensors' bytes mapped, not read."""

    tensors: dict[str, Tensor]
    rows: dict[bytes, list[tuple[str, int]]] = field(default_factory=dict)
    align: int = 1  # the gcd of every tensor's row bytes: pieces of whole rows start on it
    key_lengths: tuple[int, ...] = ()  # the lengths of the row keys, longest first
    _maps: dict = field(default_factory=dict)

    def data(self, name: str) -> memoryview:
        t = self.tensors[name]
        if t.file not in self._maps:
            with open(t.file, "rb") as f:
                self._maps[t.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return memoryview(self._maps[t.file])[t.begin:t.end]

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()


def row_bytes(t: Tensor) -> int:
    """Bytes of one row (the last dimension), from the tensor's size: no dtype table needed."""
    rows = 1
    for d in t.shape[:-1]:
        rows *= d
    return (t.end - t.begin) // rows if rows else 0


def index(files: Iterable[Path]) -> Index:
    """The index of the checkpoint files' tensors (safetensors)."""
    ix = Index(checkpoint_tensors(list(files)))
    ix.align = math.gcd(*(max(1, row_bytes(t)) for t in ix.tensors.values())) if ix.tensors else 1
    for name, t in sorted(ix.tensors.items()):
        data, step = ix.data(name), max(1, row_bytes(t))
        for at in range(0, len(data), step):
            key = bytes(data[at:at + min(KEY, step)])
            ix.rows.setdefault(key, []).append((name, at))
    ix.key_lengths = tuple(sorted({len(k) for k in ix.rows}, reverse=True))
    return ix


def _common(a: memoryview, b: memoryview) -> int:
    """The length of the common prefix of two byte views."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.frombuffer(a[:n], np.uint8)
    y = np.frombuffer(b[:n], np.uint8)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


def bind(data: bytes | memoryview, ix: Index, min_piece: int = KEY) -> Binding:
    """Walk `data` and explain it by checkpoint tensor bytes (see the module docstring)."""
    view, pos, out, gap_at = memoryview(data).cast("B"), 0, [], None
    while pos < len(view):
        best, best_len, alts = None, 0, []
        for k in ix.key_lengths:
            for name, off in ix.rows.get(bytes(view[pos:pos + k]), ()):
                n = _common(view[pos:], ix.data(name)[off:])
                if n > best_len:
                    best, best_len, alts = (name, off), n, []
                elif n == best_len and best is not None and n > 0:
                    alts.append((name, off))
            if best is not None:
                break
        if best is not None and pos + best_len < len(view) and best[1] + best_len < len(ix.data(best[0])):
            best_len -= best_len % ix.align  # a piece ends on a row boundary: a chance match past it is not one
        if best is None or best_len < min(min_piece, len(view) - pos) or best_len == 0:
            gap_at = pos if gap_at is None else gap_at
            pos += ix.align  # a piece starts on a row boundary of the range's layout
            continue
        if gap_at is not None:
            out.append(Gap(gap_at, pos - gap_at))
            gap_at = None
        alt = dict(sorted((a for a in alts if a[0] != best[0]), reverse=True))  # one offset per name
        out.append(Piece(best[0], best[1], best_len, tuple(sorted(alt)), tuple(alt[k] for k in sorted(alt))))
        pos += best_len
    if gap_at is not None:
        out.append(Gap(gap_at, len(view) - gap_at))
    return Binding(len(view), tuple(_merge(out)))


def _merge(pieces: list) -> list:
    """Adjacent gaps as one (the walk may end a gap and start another)."""
    out: list = []
    for p in pieces:
        if out and isinstance(p, Gap) and isinstance(out[-1], Gap) and out[-1].start + out[-1].length == p.start:
            out[-1] = Gap(out[-1].start, out[-1].length + p.length)
        else:
            out.append(p)
    return out
