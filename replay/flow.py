"""Read and write sets of one launch from memory snapshots: pure numpy, no GPU.

Why snapshots and not a model of the kernel: the kernel is a cubin; what it reads and writes is
measured by running it. `written` compares each region after a run with what was put there, over
two fills: all zeros, and `tagged` (span k holds the u64 value k + 1 repeated: small integers,
tiny floats, so a kernel reading them as indices stays in bounds, and different per span, so a
kernel copying one buffer into another changes the copy). A byte the kernel writes with the
fill's own value in one run still shows in the other. A parameter word is *read* when poisoning
the bytes it points at (seeded random bytes over its span, `poison`, bounded first and then
unbounded; every other byte as in the tagged run) changes anything the tagged run wrote, or anything outside the poisoned bytes, or makes the
launch fault (the bytes steer addresses: indices, block tables); the poisoned span's own bytes the
kernel never wrote are not compared (they hold the poison either way).

A word's span is its bytes up to the next word into the same region (or the region's end):
words at one address share a span (one buffer, read and written as one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np



@dataclass
class Span:
    region: int
    lo: int
    hi: int


def spans(words, region_lengths: list[int]) -> list[Span]:
    """Per word (in `words` order; each has .region and .offset), its span."""
    by: dict[int, list[int]] = {}
    for w in words:
        by.setdefault(w.region, []).append(w.offset)
    nxt: dict[tuple[int, int], int] = {}
    for r, offs in by.items():
        u = sorted(set(offs))
        for a, b in zip(u, u[1:] + [region_lengths[r]]):
            nxt[(r, a)] = b
    return [Span(w.region, w.offset, max(nxt[(w.region, w.offset)], w.offset)) for w in words]


def tagged(lengths: list[int], spans_: list[Span]) -> list[np.ndarray]:
    """The second fill, per region: zeros, then distinct span k (in first-seen order) holds the
    little-endian u64 value k + 1 repeated from its start."""
    out = [np.zeros(n, np.uint8) for n in lengths]
    tags: dict[tuple[int, int, int], int] = {}
    for s in spans_:
        k = tags.setdefault((s.region, s.lo, s.hi), len(tags) + 1)
        v = out[s.region][s.lo:s.hi]
        v[0::8] = k & 0xFF
        v[1::8] = (k >> 8) & 0xFF
    return out


_MASTERS: dict[tuple[int, str], np.ndarray] = {}
MASTER_MAX = 256 << 20      # poisons up to this size are prefixes of one cached array per seed and kind


SMALL = 16        # `small` poison's bound: every table the engines index has at least this many rows


def poison(n: int, seed: int, kind: str) -> np.ndarray:
    """Seeded poison bytes: `small` (each 8-byte word a random value below 16, read as i64 or as
    two i32s: an index into any table of 16 or more rows stays in range), `random` (any byte),
    `random16` (each 4-byte lane a random value below 2^16: random bf16 halves, bounded
    integers) or `ones` (0xFF: NaN as any float, -1 as any integer). The first n bytes of one
    array per (seed, kind), generated once at the largest size asked (why: a forward replay poisons hundreds of spans of up to tens of MiB, and drawing
    each afresh was a tenth of its time); callers must not write into it."""
    if kind == "ones":
        return np.full(n, 0xFF, np.uint8)
    if kind not in ("random", "random16", "small"):
        raise ValueError(f"unknown poison {kind!r}")
    if n > MASTER_MAX:
        return _drawn(n, seed, kind)
    m = _MASTERS.get((seed, kind))
    if m is None or len(m) < n:
        m = _MASTERS[(seed, kind)] = _drawn(max(n, min(MASTER_MAX, max(1 << 20, 2 * len(m) if m is not None else 0))), seed, kind)
    return m[:n]


def _drawn(n: int, seed: int, kind: str) -> np.ndarray:
    if kind == "small":
        b = np.zeros(n, np.uint8)
        b[:n // 8 * 8:8] = np.random.default_rng(seed).integers(0, SMALL, n // 8, dtype=np.uint8)
        return b
    b = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if kind == "random16":
        k = n // 4 * 4
        b[:k].reshape(-1, 4)[:, 2:] = 0
        b[k + 2:] = 0
    return b


def changed(fill: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Byte mask of `after != fill`. Why by 8-byte words first: a replayed region is mostly bytes
    the kernel never touched (a KV pool, a weight), and comparing words then bytes only in the
    words that differ is several times faster than a byte compare of the whole region."""
    n = len(fill)
    m = np.zeros(n, bool)
    if fill is after:
        return m
    k = n // 8 * 8
    if k:
        d = fill[:k].view(np.uint64) != after[:k].view(np.uint64)
        w = np.flatnonzero(d)
        if len(w) * 16 > len(d):       # much of it differs: one byte compare is cheaper
            m[:k] = fill[:k] != after[:k]
        elif len(w):
            m[:k].reshape(-1, 8)[w] = fill[:k].reshape(-1, 8)[w] != after[:k].reshape(-1, 8)[w]
    if k < n:
        m[k:] = fill[k:] != after[k:]
    return m


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bytes (by 8-byte words where the length allows; `changed`'s reason)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    k = len(a) // 8 * 8
    return bool(np.array_equal(a[:k].view(np.uint64), b[:k].view(np.uint64)) and np.array_equal(a[k:], b[k:]))


def written(runs: list[tuple[list[np.ndarray], list[np.ndarray]]]) -> list[np.ndarray]:
    """Per region, a mask of the bytes the kernel wrote: changed from the fill in any of the
    (fill, after) runs."""
    masks = None
    for fill, after in runs:
        m = [changed(f, a) for f, a in zip(fill, after)]
        masks = m if masks is None else [x | y for x, y in zip(masks, m)]
    return masks or []


def read_changed(baseline: list[np.ndarray], poisoned: list[np.ndarray], wrote: list[np.ndarray],
                 span: Span) -> bool:
    """Did poisoning `span` change what the launch left in memory (module docstring)? Of `wrote`
    only the span's region is read."""
    for r, (b, p) in enumerate(zip(baseline, poisoned)):
        if r != span.region:
            if not same(b, p):
                return True
            continue
        lo, hi = span.lo, span.hi
        if not (same(b[:lo], p[:lo]) and same(b[hi:], p[hi:])):
            return True
        if (changed(b[lo:hi], p[lo:hi]) & wrote[r][lo:hi]).any():
            return True
    return False


def ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of True in a byte mask."""
    if not mask.any():
        return []
    d = np.diff(np.concatenate([[0], mask.view(np.int8) if mask.dtype == bool else mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def direction(wrote: bool, read: bool | None) -> str:
    """in | out | inout | unused (read None: not judged, from the write set alone)."""
    if read is None:
        return "out?" if wrote else "in?"
    if wrote:
        return "inout" if read else "out"
    return "in" if read else "unused"
