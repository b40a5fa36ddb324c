"""What the readers could not read: one report per dump file (records read, records skipped, the
byte ranges skipped and why).

Why: a dump is often read after the captured process was killed, its disk ran full, or it was
copied half-way. The readers (mining/load.py and the modules it reads with) take what can be
read and resynchronise after damage; this report is how they say exactly what they left out, so
a user can tell a clean dump from one that lost most of its records (docs/dump-format.md,
"Reading damaged dumps", holds the rule). `Dump.damage` carries it, the analysis contract copies
it (vocab/analysis.py `FileDamage`), `mine analyze` prints it.

Ranges are byte offsets in the file as read (for a compressed file, in its decompressed bytes),
end exclusive. Adjacent ranges with the same reason are merged; at most MAX_RANGES are listed per
file and `ranges_left_out` counts the rest, so a file that is all damage does not make a report
as large as itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_RANGES = 64
MOSTLY = 0.5   # a file that lost more than this share of its records is "mostly damage"


@dataclass
class Skipped:
    start: int
    end: int
    reason: str
    records: int | None        # records lost in the range; None where nothing tells how many


@dataclass
class FileReport:
    file: str
    read: int = 0
    skipped: int = 0
    ranges: list[Skipped] = field(default_factory=list)
    ranges_left_out: int = 0

    def skip(self, start: int, end: int, reason: str, records: int | None = 1, exact: bool = True) -> None:
        """Counts `records` lost in [start, end) for `reason`; `exact` False: at least that many
        (the range is listed with records None)."""
        self.skipped += records or 0
        if not exact:
            records = None
        last = self.ranges[-1] if self.ranges else None
        if last is not None and last.end == start and last.reason == reason and not self.ranges_left_out:
            last.end = end
            last.records = None if last.records is None or records is None else last.records + records
            return
        if len(self.ranges) < MAX_RANGES:
            self.ranges.append(Skipped(int(start), int(end), reason, records))
        else:
            self.ranges_left_out += 1

    def defer(self, start: int, end: int, reason: str, records: int | None = 1) -> None:
        """Like skip, applied at `flush` in file order (readers that find damage out of order)."""
        self.__dict__.setdefault("_pending", []).append((int(start), int(end), reason, records))

    def flush(self) -> None:
        for a, b, why, n in sorted(self.__dict__.pop("_pending", [])):
            self.skip(a, b, why, n)

    def merge(self, other: "FileReport") -> None:
        """Adds a report of a later part of the same file (the chunked readers)."""
        self.read += other.read
        for r in other.ranges:
            self.skip(r.start, r.end, r.reason, r.records or 0, r.records is not None)
        self.skipped += other.skipped - sum(r.records or 0 for r in other.ranges)
        self.ranges_left_out += other.ranges_left_out

    @property
    def damaged(self) -> bool:
        return bool(self.skipped or self.ranges or self.ranges_left_out)

    @property
    def mostly_damage(self) -> bool:
        return self.skipped > MOSTLY * (self.read + self.skipped)

    def sentence(self) -> str:
        """One line for the terminal: the counts and the first ranges."""
        if not self.damaged:
            return f"{self.file}: {self.read} record(s) read, nothing skipped"
        nbytes = sum(r.end - r.start for r in self.ranges)
        unsure = any(r.records is None for r in self.ranges)
        s = (f"{self.file}: {self.read} record(s) read, {self.skipped}{'+' if unsure else ''} skipped "
             f"in {len(self.ranges) + self.ranges_left_out} damaged range(s) ({nbytes} bytes listed)")
        if self.mostly_damage:
            s += "; the file is mostly damage"
        shown = "; ".join(f"[{r.start}, {r.end}) {r.reason}" + ("" if r.records is None else f" ({r.records} lost)")
                          for r in self.ranges[:3])
        more = len(self.ranges) - 3 + self.ranges_left_out
        return s + (f": {shown}" if shown else "") + (f"; {more} more range(s)" if more > 0 else "")

    def to_json(self) -> dict:
        return {"file": self.file, "read": self.read, "skipped": self.skipped,
                "ranges": [{"start": r.start, "end": r.end, "reason": r.reason, "records": r.records}
                           for r in self.ranges], "ranges_left_out": self.ranges_left_out}

    @classmethod
    def from_json(cls, d: dict) -> "FileReport":
        """The inverse of to_json (the parquet cache keeps the launch file's report this way)."""
        return cls(str(d["file"]), int(d["read"]), int(d["skipped"]),
                   [Skipped(int(r["start"]), int(r["end"]), str(r["reason"]),
                            None if r["records"] is None else int(r["records"])) for r in d["ranges"]],
                   int(d["ranges_left_out"]))


def lines_report(name: str, data: bytes, keep, reason_of) -> tuple[list[int], FileReport]:
    """Splits a JSON-lines file's bytes on newlines and reports per line (not used on the launch
    file, which has its own chunked reader). `keep(line) -> obj or None`; `reason_of(line)` names
    why a rejected line was rejected. Returns the kept objects and the report. The reader rule of
    docs/dump-format.md "Writers" applies: of each line only the bytes after its last NUL count,
    and a line cut short at the end of the file is one lost record."""
    rep = FileReport(name)
    out = []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl
        line = data[pos:end]
        body = line.rpartition(b"\0")[2]
        if nl < 0:
            if line.strip(b"\0").strip():
                rep.skip(pos, n, "truncated last line (the writer died mid-record)")
            break
        if body.strip():
            obj = keep(body)
            if obj is None:   # one damaged line is one record, NULs in it or not
                rep.skip(pos, end + 1, reason_of(body) if len(body) == len(line) else
                         "NUL bytes inside a record that does not parse")
            else:
                rep.read += 1
                out.append(obj)
                if len(body) != len(line):   # a record in flight glued in front of this one
                    rep.skip(pos, end - len(body), "NUL bytes (a record in flight when the writer died)")
        elif b"\0" in line:
            rep.skip(pos, end + 1, "NUL bytes (a record in flight when the writer died)")
        pos = end + 1
    return out, rep
