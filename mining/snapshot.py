"""The snapshot of a capture (`snapshot.jsonl` + `snapshot/<base>.bin`, MINE_CAPTURE_SNAPSHOT_*):
which device allocations were copied out, and the bytes of an address range they cover.

Why: `mine compile --weights` binds a weight buffer to checkpoint tensors by its bytes
(compiler/weights.py), and a buffer is an address range of the capture. The library writes one
record per allocation it knew of (`ok` with its file, `skipped` over the byte budget, `failed`
with the call that failed) and an `end` record (docs/dump-format.md "Snapshot"). This reader
checks each record's fields against their documented ranges (a damaged line is reported and
skipped), keeps an `ok` region as a source of bytes only when its file exists with exactly
`size` bytes (else one warning: a fixture packed without its files, a file cut short), and
answers `read(address, n)`: the bytes when [address, address + n) lies inside regions that touch
end to end (VMM chunks mapped side by side read as one range), else None. Files are read on
demand, never loaded whole. Not checked: that the bytes still are what the process held later
(the snapshot is one instant: `seq_before` says which launches had completed).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mining.damage import FileReport, lines_report

SNAPSHOT = "snapshot.jsonl"
STATUSES = ("ok", "skipped", "failed")


@dataclass(frozen=True)
class Region:
    base: int
    size: int
    id: int
    status: str                  # ok | skipped | failed | missing (ok in the file, its bytes absent)
    file: Optional[str]          # relative to the pid folder ("snapshot/<base hex>.bin")
    reason: str = ""
    seq_before: int = 0


@dataclass
class Snapshot:
    folder: Path
    regions: list[Region]        # address order, every record the file holds
    status: str                  # the end record's: ok | partial | failed; "incomplete" without one
    seq_before: Optional[int]    # launches with seq < this had completed when the bytes were read
    end: dict = field(default_factory=dict)
    _starts: list[int] = field(default_factory=list, repr=False)
    _ok: list[Region] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._ok = sorted((r for r in self.regions if r.status == "ok"), key=lambda r: r.base)
        self._starts = [r.base for r in self._ok]

    def _pieces(self, address: int, n: int) -> Optional[list[tuple[Region, int, int]]]:
        """(region, offset, length) covering [address, address + n) end to end, or None."""
        out, at, end = [], address, address + n
        i = bisect.bisect_right(self._starts, at) - 1
        while at < end:
            if i < 0 or i >= len(self._ok):
                return None
            r = self._ok[i]
            if not r.base <= at < r.base + r.size:
                return None
            take = min(end, r.base + r.size) - at
            out.append((r, at - r.base, take))
            at += take
            i += 1
        return out

    def covers(self, address: int, n: int) -> bool:
        return n >= 0 and self._pieces(address, n) is not None

    def read(self, address: int, n: int) -> Optional[bytes]:
        """The snapshot's bytes of [address, address + n), or None when they are not all in it."""
        pieces = self._pieces(address, n) if n >= 0 else None
        if pieces is None:
            return None
        chunks = []
        for r, off, length in pieces:
            with open(self.folder / r.file, "rb") as f:
                f.seek(off)
                chunks.append(f.read(length))
        data = b"".join(chunks)
        return data if len(data) == n else None

    def lines(self) -> list[str]:
        ok = [r for r in self.regions if r.status == "ok"]
        return [f"snapshot: {self.status}, {len(ok)} of {len(self.regions)} allocations copied "
                f"({sum(r.size for r in ok)} bytes) after launch seq {self.seq_before}"]


def _is_u(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _hex(v) -> Optional[int]:
    if not isinstance(v, str) or not v.startswith("0x") or not 3 <= len(v) <= 18:
        return None
    try:
        return int(v, 16)
    except ValueError:
        return None


def _record(line: bytes):
    try:
        r = json.loads(line)
    except ValueError:
        return None
    if not isinstance(r, dict):
        return None
    if r.get("event") == "end":
        return r if isinstance(r.get("status"), str) and _is_u(r.get("seq_before")) else None
    if r.get("event") != "region":
        return None
    base = _hex(r.get("base"))
    ok = (base is not None and _is_u(r.get("size")) and _is_u(r.get("id")) and _is_u(r.get("seq_before"))
          and r.get("status") in STATUSES and (r.get("file") is None or isinstance(r.get("file"), str))
          and isinstance(r.get("reason", ""), str))
    if not ok or (r["status"] == "ok") != isinstance(r.get("file"), str):
        return None
    if r["file"] is not None and (r["file"].startswith("/") or ".." in Path(r["file"]).parts):
        return None
    return Region(base, r["size"], r["id"], r["status"], r["file"], r.get("reason", ""), r["seq_before"])


def read_snapshot(folder: Path, warnings: list[str], report: Optional[FileReport] = None) -> Optional[Snapshot]:
    """The snapshot of the pid folder `folder`, or None when it has no snapshot.jsonl."""
    folder = Path(folder)
    src = folder / SNAPSHOT
    if not src.is_file():
        return None
    rows, rep = lines_report(SNAPSHOT, src.read_bytes(), _record,
                             lambda line: "not a snapshot record of the documented fields and ranges")
    if report is not None:
        report.merge(rep)
    if rep.skipped:
        warnings.append(f"{SNAPSHOT}: dropped {rep.skipped} damaged line(s)")
    ends = [r for r in rows if isinstance(r, dict)]
    regions, gone = [], []
    for r in (x for x in rows if isinstance(x, Region)):
        if r.status == "ok":
            f = folder / r.file
            if not f.is_file() or f.stat().st_size != r.size:
                gone.append(r.file)
                r = Region(r.base, r.size, r.id, "missing", r.file, "the file is absent or not `size` bytes long",
                           r.seq_before)
        regions.append(r)
    if gone:
        warnings.append(f"{SNAPSHOT}: {len(gone)} region file(s) absent or of another size ({', '.join(gone[:3])}"
                        f"{', ...' if len(gone) > 3 else ''}): their bytes are not in the snapshot")
    end = ends[-1] if ends else {}
    seq = end.get("seq_before", regions[0].seq_before if regions else None)
    return Snapshot(folder, sorted(regions, key=lambda r: r.base), end.get("status", "incomplete"), seq, end)
