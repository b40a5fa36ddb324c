"""The captured process's memory as a forward replay rebuilds it: sparse bytes by captured address,
and the timeline of what the host put there (pure numpy, no GPU).

Why: a kernel whose work depends on what memory holds -- attention reading sequence lengths,
query offsets and block tables; a cache write at the slots it is given -- shows its real read and
write sets only on realistic contents, and synthetic fills give it none (it attends to nothing).
The capture does not snapshot device memory around launches, but it records what the host gave
the device: the copy log (host-to-device copies with their bytes, `mining.copies`) and, per launch,
the bytes behind its words into pinned host memory (MINE_CAPTURE_HOST_BYTES, the pointees). A
forward replayed *in order* from those, each launch's output written back, rebuilds the rest: the
staging kernels turn the host's tables into the device's metadata, and the layers read it.

`Memory` is addressed like the captured process (device and host share one unified address
space), in 64 KiB pages created on first write; a byte never written reads as zero. `events`
orders the host's writes by the launch they precede.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAGE = 1 << 16


class Memory:
    """Sparse bytes by captured address; unwritten bytes read as zero."""

    def __init__(self) -> None:
        self.pages: dict[int, np.ndarray] = {}

    def _chunks(self, addr: int, n: int):
        """(page number, offset in page, offset in the range, length) covering [addr, addr + n)."""
        pos = 0
        while pos < n:
            a = addr + pos
            p, o = divmod(a, PAGE)
            k = min(PAGE - o, n - pos)
            yield p, o, pos, k
            pos += k

    def read(self, addr: int, n: int) -> np.ndarray:
        out = np.zeros(n, np.uint8)
        for p, o, pos, k in self._chunks(addr, n):
            page = self.pages.get(p)
            if page is not None:
                out[pos:pos + k] = page[o:o + k]
        return out

    def write(self, addr: int, data) -> None:
        src = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
        for p, o, pos, k in self._chunks(addr, len(src)):
            page = self.pages.get(p)
            if page is None:
                page = self.pages[p] = np.zeros(PAGE, np.uint8)
            page[o:o + k] = src[pos:pos + k]

    def write_changed(self, addr: int, before: np.ndarray, after: np.ndarray) -> int:
        """Write `after` where it differs from `before` (what this range held); returns the bytes
        changed. Pages where nothing changed are not created (a 64 MiB window over a KV pool costs
        only the pages the launch wrote)."""
        diff = before != after
        changed = int(diff.sum())
        if not changed:
            return 0
        for p, o, pos, k in self._chunks(addr, len(after)):
            if diff[pos:pos + k].any():
                self.write(addr + pos, after[pos:pos + k])
        return changed

    def present(self, addr: int, n: int) -> list[tuple[int, int]]:
        """[lo, hi) ranges of [addr, addr + n), relative to addr, that lie in pages ever written
        (outside them every byte is zero): what a replay sends of a region. Why: a rebuilt region
        is mostly pages nothing wrote (a KV pool's window, a weight no launch of the window made),
        and moving tens of MiB of zeros to a worker and the device was a replay's largest cost."""
        out: list[list[int]] = []
        for p, _o, pos, k in self._chunks(addr, n):
            if p in self.pages:
                if out and out[-1][1] == pos:
                    out[-1][1] = pos + k
                else:
                    out.append([pos, pos + k])
        return [(a, b) for a, b in out]

    @property
    def nbytes(self) -> int:
        return len(self.pages) * PAGE


@dataclass(frozen=True)
class HostWrite:
    """Bytes the host put at a captured address before launch `seq_before` ran."""
    seq_before: int
    order: int          # among writes before the same launch: copies by copy seq, then pointees
    addr: int
    data: bytes
    source: str         # copy | pointee
    t_ns: int | None = None   # a copy's host time (orders it against a CUDA graph's replay)


def _applied(copies) -> np.ndarray:
    """The copies that wrote memory when recorded (`mining.copies` rule): succeeded, not part of a
    graph, not empty."""
    return (copies["result"].to_numpy() == 0) & ~copies["in_graph"].to_numpy(bool) & (copies["size"].to_numpy() > 0)


def copy_writes(copies) -> tuple[list[HostWrite], int]:
    """The copy log's writes with bytes (`mining.copies` rule: succeeded, not part of a graph),
    and how many copies wrote bytes the log does not hold (larger than MINE_CAPTURE_COPY_BYTES:
    those ranges keep what the replay had there)."""
    if copies is None or len(copies) == 0:
        return [], 0
    ok = _applied(copies)
    out, unknown = [], 0
    t = copies["t_ns"].to_numpy(np.int64)[ok] if "t_ns" in copies else np.full(int(ok.sum()), -1, np.int64)
    for seq, before, dst, data, tn in zip(copies["seq"].to_numpy()[ok], copies["seq_before"].to_numpy()[ok],
                                          copies["dst"].to_numpy(np.uint64)[ok], copies["data"].to_numpy(object)[ok], t):
        if data is None:
            unknown += 1
            continue
        out.append(HostWrite(int(before), int(seq), int(dst), bytes(data), "copy", int(tn) if tn >= 0 else None))
    return out, unknown


def blind_copies(copies) -> list[tuple[int, int, int, int]]:
    """(copy seq, seq_before, dst, size) of the copies that wrote bytes the log does not hold."""
    if copies is None or len(copies) == 0:
        return []
    ok = _applied(copies) & ~copies["has_bytes"].to_numpy(bool)
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(
        copies["seq"].to_numpy()[ok], copies["seq_before"].to_numpy()[ok],
        copies["dst"].to_numpy(np.uint64)[ok], copies["size"].to_numpy()[ok])]


def pointee_writes(pointees: dict) -> list[HostWrite]:
    """The launch records' host pointees (`mining.pointees.host_pointees` shape: (seq, i, at) ->
    (address, bytes)) as writes just before their own launch, after that launch's copies."""
    return [HostWrite(seq, 1 << 62, addr, data, "pointee")
            for (seq, _, _), (addr, data) in sorted(pointees.items()) if data]


def timeline(writes: list[HostWrite]) -> list[HostWrite]:
    return sorted(writes, key=lambda w: (w.seq_before, w.order))
