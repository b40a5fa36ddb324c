"""A capture's launches as the compiler reads them: parameters, pointer words, host staging.

Why a module of its own: every later step (programs, buffers, expressions, externs) asks the same
questions of a launch record -- its parameters in ABI order with their bytes, the pointer words
inside them (a top-level pointer, or a word inside a by-value struct), and whether it reads host
memory -- and each answer comes from the dump's frames (`mining.load.Dump`), read once here.

Host staging: a kern manifest passes device buffers only, so a launch that dereferences host
memory (an engine's pinned staging buffers, read through a mapping) cannot be one of its calls.
With an allocation log (allocs.jsonl `host_alloc` / `host_register`) a word is host memory when
it lands in one of those ranges (frees are not subtracted: a range once host stays host). Without
one the rule is weaker, and says so in the provenance: an 8-byte-aligned, 8-byte word that is no
device pointer yet reads as a user-space address (2^40 <= value < 2^48).

A word inside a by-value struct whose address is odd is read as an integer that happens to
land in an allocation, not as a pointer (kept as the struct's bytes; `compiler.exprs` fits or
notes it).

Not decided here: what a word *is* (weight, activation, state) -- `compiler.buffers` does that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HOST_LO, HOST_HI = 1 << 40, 1 << 48


@dataclass(frozen=True)
class Word:
    """A pointer word: param `i`, byte `at` inside it, the address and its device allocation."""
    i: int
    at: int
    value: int
    base: int           # allocation base (0 where no device allocation holds it)
    alloc_size: int

    @property
    def off(self) -> int:
        return self.value - self.base


@dataclass
class Param:
    i: int
    size: int
    value: int            # little-endian value of the first min(size, 8) bytes
    raw: bytes | None     # every byte, where the dump kept them (structs); None for plain words
    pointer: bool         # the whole parameter is one device pointer
    off: int = 0          # byte offset in the kernel's parameter buffer

    @property
    def aligned(self) -> bool:
        """At its size's natural alignment. kern lays a scalar param at it (an i64 at a multiple
        of 8); a param of 8 bytes at offset 28 is a struct of 4-byte members (ATen's
        TrivialOffsetCalculator), which only a byte pack places right."""
        return self.off % self.size == 0


@dataclass
class Launch:
    seq: int
    symbol: str
    sha256: str
    grid: tuple
    block: tuple
    smem: int
    params: list[Param]
    words: list[Word]               # every device pointer word, in ABI order
    host_words: list[tuple] = field(default_factory=list)   # (i, at, value) into host memory
    site: str = ""                  # the analysis' call site name (symbol#occurrence in the forward)
    pos: int = -1                   # for a staging launch: how many program calls precede it

    def word(self, i: int, at: int = 0) -> Word | None:
        return next((w for w in self.words if w.i == i and w.at == at), None)


def host_ranges(dump) -> list[tuple[int, int]] | None:
    """Pinned host ranges of the allocation log as [lo, hi), or None when the dump has no log."""
    a = getattr(dump, "allocs", None)
    if a is None or len(a) == 0:
        return None
    h = a[a["event"].astype(str).str.startswith("host_") & (a["result"] == 0) & (a["size"] > 0)]
    return sorted((int(b), int(b) + int(s)) for b, s in zip(h["base"], h["size"]))


def _in(ranges, v: int) -> bool:
    return any(lo <= v < hi for lo, hi in ranges)


def read_launches(dump, seqs: list[int]) -> dict[int, Launch]:
    """seq -> Launch for the given launch records (each read once)."""
    want = np.unique(np.asarray(seqs, np.int64))
    L = dump.launches
    L = L[L["seq"].isin(want)]
    P = dump.params
    P = P[P["seq"].isin(want)].sort_values(["seq", "i", "at"], kind="stable")
    hosts = host_ranges(dump)
    by: dict[int, list] = {}
    cols = ("i", "size", "at", "word", "value", "is_ptr", "alloc_base", "alloc_size", "hex", "off")
    for row in zip(P["seq"].to_numpy(), *(P[c].to_numpy() for c in cols)):
        by.setdefault(int(row[0]), []).append(row[1:])
    out = {}
    for r in L.itertuples(index=False):
        params, words, host = [], [], []
        for i, size, at, word, value, is_ptr, base, asize, hx, off in by.get(int(r.seq), []):
            i, size, at, value, off = int(i), int(size), int(at), int(value), int(off)
            if not word:
                raw = bytes.fromhex(hx) if isinstance(hx, str) and hx else None
                if raw is None and not is_ptr and 0 < size < 8 and size not in (1, 4):
                    # a small by-value type (a 2-byte fill value, a 3/5/6/7-byte struct): the
                    # frames keep bytes as hex only past 8 bytes; below, `value` holds them
                    raw = value.to_bytes(8, "little")[:size]
                if raw is None and not is_ptr and 0 < size <= 8 and off % size:
                    raw = value.to_bytes(8, "little")[:size]      # a struct of smaller members (Param.aligned)
                params.append(Param(i, size, value, raw, bool(is_ptr) and size == 8, off))
                if is_ptr:
                    words.append(Word(i, 0, value, int(base), int(asize)))
                elif size == 8 and _hostlike(value, hosts):
                    host.append((i, 0, value))
            elif is_ptr and value % 2 == 0:
                words.append(Word(i, at, value, int(base), int(asize)))
            elif is_ptr:
                # an odd "pointer" inside a struct: an integer that landed in an allocation's
                # range (element pointers of 2-byte and wider data are even); kept as bytes
                pass
            elif _hostlike(value, hosts) and at % 8 == 0:
                host.append((i, at, value))
        out[int(r.seq)] = Launch(int(r.seq), str(r.symbol), str(r.sha256 or ""),
                                 (int(r.grid_x), int(r.grid_y), int(r.grid_z)),
                                 (int(r.block_x), int(r.block_y), int(r.block_z)), int(r.smem),
                                 params, words, host)
    return out


def _hostlike(v: int, hosts) -> bool:
    if hosts is not None:
        return _in(hosts, v)
    return HOST_LO <= v < HOST_HI and v % 8 == 0


def struct_u32(p: Param, at: int) -> int | None:
    """The u32 at byte `at` of a by-value parameter, None past its kept bytes."""
    if p.raw is None or at + 4 > len(p.raw):
        return None
    return int.from_bytes(p.raw[at:at + 4], "little")
