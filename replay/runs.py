"""One launch run many times on one live plan, moving only what changes: the core of a forward
replay's measurement (`replay.forward.measure_in_context`).

Why: a measured launch runs dozens of times (baseline, determinism check, a poisoned run per span,
a private copy per shared word), and its regions are tens of MiB (an allocator segment, windows of
a KV pool) of which it writes a few KiB. Sending every region before each run, downloading it after
and comparing it on the host took minutes per window. Here the host keeps what the device holds as
a `Fill` (the bytes it was given) plus the *patches* of the last run (the ranges where the device
found its bytes changed, with their bytes), so
  - a run uploads only what differs from what the device already holds (the last run's patches,
    the poisoned span it had and the one it gets), or a region whole when its base changed;
  - after a run, the device compares each region with a shadow copy of what it was given
    (`Gpu.diff`, chunks of CHUNK bytes) and only the chunks that differ are downloaded; a device
    without `diff` (mapped host regions; CPU models of the device) downloads the region and the
    same chunks are found on the host;
  - every comparison after that (written bytes, determinism, did a poison change anything) looks
    only at patches, so its cost follows what the kernel wrote, not the regions' size.
What is measured is unchanged: an `Out` gives any byte range of the memory after a run exactly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

CHUNK = 4096          # bytes per compared chunk: a KV page's slice of a token, a small output
MAX_PATCHES = 4096    # more changed chunk runs than this in one region: downloaded whole


@dataclass
class Fill:
    """What a run gives the launch: per region a base array (not modified), and at most one span of
    one region replaced by poison bytes."""
    base: list[np.ndarray]
    poison: tuple[int, int, np.ndarray] | None = None     # (region, lo, bytes)
    # per region, [lo, hi) ranges outside which its base is all zeros (None: not known): a region
    # sent whole is zeroed on the device and only these ranges are uploaded
    nonzero: list[list[tuple[int, int]] | None] | None = None

    def with_poison(self, region: int, lo: int, data: np.ndarray) -> "Fill":
        return Fill(self.base, (region, lo, data), self.nonzero)

    def poisoned(self, r: int) -> tuple[int, int] | None:
        p = self.poison
        return (p[1], p[1] + len(p[2])) if p is not None and p[0] == r and len(p[2]) else None

    def slice(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Bytes [lo, hi) of region r (a view of the base where the poison does not reach)."""
        v = self.base[r][lo:hi]
        sp = self.poisoned(r)
        if sp is not None:
            a, b = max(lo, sp[0]), min(hi, sp[1])
            if a < b:
                v = v.copy()
                v[a - lo:b - lo] = self.poison[2][a - sp[0]:b - sp[0]]
        return v


@dataclass
class Out:
    """The memory after one run: its fill, and per region the sorted, disjoint (lo, bytes) ranges
    the device found changed (bytes outside them are the fill's)."""
    fill: Fill
    patches: list[list[tuple[int, np.ndarray]]]

    def ranges(self, r: int) -> list[tuple[int, int]]:
        return [(lo, lo + len(d)) for lo, d in self.patches[r]]

    def slice(self, r: int, lo: int, hi: int) -> np.ndarray:
        v = self.fill.slice(r, lo, hi)
        ps = self.patches[r]
        if not ps:
            return v
        k = max(bisect.bisect_right([p[0] for p in ps], lo) - 1, 0)
        copied = False
        for plo, d in ps[k:]:
            if plo >= hi:
                break
            a, b = max(lo, plo), min(hi, plo + len(d))
            if a < b:
                if not copied:
                    v, copied = v.copy(), True
                v[a - lo:b - lo] = d[a - plo:b - plo]
        return v

    def region(self, r: int) -> np.ndarray:
        return self.slice(r, 0, len(self.fill.base[r]))

    def changes(self) -> list[list[tuple[int, np.ndarray]]]:
        """The patches alone (what a worker sends back: the caller holds the fill)."""
        return self.patches

    def written(self, r: int) -> list[tuple[int, np.ndarray]]:
        """(lo, byte mask) per patch of region r: bytes that differ from the fill."""
        return [(lo, d != self.fill.slice(r, lo, lo + len(d))) for lo, d in self.patches[r]]


def merged(ranges) -> list[tuple[int, int]]:
    """Sorted union of [lo, hi) ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def clipped(ranges, lo: int, hi: int, inside: bool = True) -> list[tuple[int, int]]:
    """`ranges` cut to [lo, hi) (inside) or to what lies outside it."""
    out = []
    for a, b in ranges:
        if inside:
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append((a, b))
        else:
            if a < lo:
                out.append((a, min(b, lo)))
            if b > hi:
                out.append((max(a, hi), b))
    return out


def chunk_runs(chunks: np.ndarray, n: int, chunk: int = CHUNK) -> list[tuple[int, int]]:
    """Byte ranges of runs of consecutive chunk indices, clipped to n."""
    if len(chunks) == 0:
        return []
    c = np.asarray(chunks, np.int64)
    brk = np.flatnonzero(np.diff(c) != 1)
    starts = np.concatenate([[c[0]], c[brk + 1]])
    ends = np.concatenate([c[brk], [c[-1]]]) + 1
    return [(int(a) * chunk, min(int(b) * chunk, n)) for a, b in zip(starts, ends)]


def host_chunks(before: np.ndarray, after: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """Indices of the chunks where two equal-length byte arrays differ (the host's `Gpu.diff`)."""
    n = len(before)
    k = n // 8 * 8
    idx = np.flatnonzero(before[:k].view(np.uint64) != after[:k].view(np.uint64)) * 8 // chunk
    if k < n and not np.array_equal(before[k:], after[k:]):
        idx = np.append(idx, k // chunk)
    return np.unique(idx)


class Live:
    """A `replay.run._Setup` (regions allocated, params rebased) run on `Fill`s, tracking what the
    device holds. Loaded pointer tables (`plan.indirect`) hold the fresh regions' addresses on the
    device and the captured ones on the host, as `replay.forward` always kept them."""

    def __init__(self, s):
        self.s = s
        n = len(s.plan.regions)
        self.held: list[Out | None] = [None] * n
        self.shadow: list[int | None] = [None] * n
        self.on_device = callable(getattr(s.gpu, "diff", None))
        self.ind: dict[int, list[tuple[int, bytes]]] = {}
        for r, off, tk, toff, _cap in s.plan.indirect:
            if off + 8 <= s.lengths[r]:
                self.ind.setdefault(r, []).append((off, (s.bases[tk] + toff).to_bytes(8, "little")))
        self.uploaded = 0          # bytes sent (why: the benchmark's and the tests' measure)

    def _given(self, fill: Fill, r: int, lo: int, hi: int) -> np.ndarray:
        """Bytes [lo, hi) of region r as the device gets them: the fill, loaded pointers rebased."""
        v = fill.slice(r, lo, hi)
        ent = self.ind.get(r)
        if ent:
            copied = False
            for off, new in ent:
                a, b = max(lo, off), min(hi, off + 8)
                if a < b:
                    if not copied:
                        v, copied = v.copy(), True
                    v[a - lo:b - lo] = np.frombuffer(new, np.uint8)[a - off:b - off]
        return v

    def _send(self, fill: Fill, r: int) -> None:
        s, n = self.s, self.s.lengths[r]
        h = self.held[r]
        if h is None or h.fill.base[r] is not fill.base[r]:
            nz = fill.nonzero[r] if fill.nonzero is not None else None
            if nz is None or s.plan.regions[r].host:
                todo = [(0, n)]
            else:
                s.gpu.zero(s.bases[r], n)
                todo = merged(list(nz) + [x for x in (fill.poisoned(r),) if x])
        else:
            todo = merged(h.ranges(r) + [x for x in (h.fill.poisoned(r), fill.poisoned(r)) if x])
            if sum(b - a for a, b in todo) * 2 > n:
                todo = [(0, n)]
        for lo, hi in todo:
            s.gpu.upload(s.bases[r] + lo, self._given(fill, r, lo, hi))
            self.uploaded += hi - lo

    def _found(self, fill: Fill, r: int) -> list[tuple[int, np.ndarray]]:
        """The changed ranges of region r after the launch, downloaded."""
        s, n = self.s, self.s.lengths[r]
        if self.on_device and not s.plan.regions[r].host:
            chunks = s.gpu.diff(s.bases[r], self.shadow[r], n, CHUNK)
            runs = chunk_runs(chunks, n)
            if len(runs) > MAX_PATCHES:
                runs = [(0, n)]
            got = [(lo, s.gpu.download(s.bases[r] + lo, hi - lo)) for lo, hi in runs]
        else:
            full = s.gpu.download(s.bases[r], n)
            got = [(lo, full[lo:hi].copy()) for lo, hi in chunk_runs(host_chunks(self._given(fill, r, 0, n), full), n)]
        # a loaded pointer the launch left alone goes back to the fill's (captured) value
        for off, new in self.ind.get(r, ()):
            for lo, d in got:
                if lo <= off and off + 8 <= lo + len(d) and d[off - lo:off + 8 - lo].tobytes() == new:
                    d[off - lo:off + 8 - lo] = fill.slice(r, off, off + 8)
        return got

    def run(self, fill: Fill) -> Out:
        s = self.s
        for r in range(len(s.lengths)):
            self._send(fill, r)
        if self.on_device:
            for r, reg in enumerate(s.plan.regions):
                if not reg.host:
                    if self.shadow[r] is None:
                        self.shadow[r] = s.gpu.alloc(s.lengths[r])
                    s.gpu.copy(self.shadow[r], s.bases[r], s.lengths[r])
        p = s.plan
        # the device state is unknown from here until the patches are read: a fault leaves it so
        self.held = [None] * len(s.lengths)
        s.gpu.launch(s.fn, p.grid, p.block, p.smem, s.params, p.cluster)
        s.gpu.sync()
        out = Out(fill, [self._found(fill, r) for r in range(len(s.lengths))])
        self.held = [out] * len(s.lengths)
        return out


def same(a: Out, b: Out, regions=None) -> bool:
    """Equal memory after two runs of one fill base and poison (where either changed anything)."""
    for r in (range(len(a.patches)) if regions is None else regions):
        for lo, hi in merged(a.ranges(r) + b.ranges(r)):
            if not np.array_equal(a.slice(r, lo, hi), b.slice(r, lo, hi)):
                return False
    return True


class Masks:
    """Per region, byte masks kept as (lo, mask) pieces: what runs wrote (`Out.written`), or'ed."""

    def __init__(self, n: int):
        self.pieces: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]

    def add(self, out: Out, regions=None) -> "Masks":
        for r in (range(len(self.pieces)) if regions is None else regions):
            self.pieces[r].extend(p for p in out.written(r) if p[1].any())
        return self

    def merged_with(self, other: "Masks", region: int) -> "Masks":
        """A copy of these masks with `other`'s of one region or'ed in."""
        m = Masks(0)
        m.pieces = [list(p) for p in self.pieces]
        m.pieces[region].extend(other.pieces[region])
        return m

    def dense(self, r: int, n: int) -> np.ndarray:
        m = np.zeros(n, bool)
        for lo, x in self.pieces[r]:
            m[lo:lo + len(x)] |= x
        return m

    def positions(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sorted byte offsets in [lo, hi) any piece of region r marks."""
        got = [np.flatnonzero(x) + plo for plo, x in self.pieces[r] if plo < hi and plo + len(x) > lo]
        if not got:
            return np.zeros(0, np.int64)
        p = np.unique(np.concatenate(got))
        return p[(p >= lo) & (p < hi)]


def read_changed(base: Out, poisoned: Out, wrote: Masks, region: int, lo: int, hi: int) -> bool:
    """Did poisoning [lo, hi) of `region` change what the launch left in memory: any byte outside
    the span, or a byte inside it that a run wrote (`replay.flow.read_changed`'s rule; the two
    runs' fills differ only in the span, so only their patches and the span need looking at)."""
    for r in range(len(base.patches)):
        rs = merged(base.ranges(r) + poisoned.ranges(r))
        if r == region:
            rs = clipped(rs, lo, hi, inside=False)
        for a, b in rs:
            if not np.array_equal(base.slice(r, a, b), poisoned.slice(r, a, b)):
                return True
    pos = wrote.positions(region, lo, hi)
    if len(pos):
        a, b = int(pos[0]), int(pos[-1]) + 1
        x, y = base.slice(region, a, b), poisoned.slice(region, a, b)
        if (x[pos - a] != y[pos - a]).any():
            return True
    return False
