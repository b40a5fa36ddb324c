"""Corrupted variants of the committed real dumps, and the checks every variant must pass.

Why a module of its own: tests/mining/test_fuzz_dumps.py runs it in the slow tests, and a person chasing
a finding re-runs one variant by its (dump, file, kind, seed) with `variant()` and `run_reader()`
or `run_analyze()`. Every variant is deterministic from its seed.

Mutation kinds (`KINDS`): a bit flip, a byte set to another value, a byte set to NUL, a
truncation, a zeroed stretch, random bytes inserted; for JSON-lines files also a line deleted,
duplicated, swapped with its neighbour, a line of garbage inserted, and one value of a record
replaced by a value of another type (string, list, object, float, bool, null, a huge or negative
integer); for launches.bin also a record deleted, duplicated or swapped with its neighbour.

Checks (`Outcome`): no exception escapes except `DumpError` with a one-line message (the project's
typed refusal, the only thing `mine analyze` may turn into its one sentence); the damage report is
sound (ranges ordered, non-overlapping, inside the file); and for byte damage (flip, byte, NUL) a
bound on loss: a flip inside one record loses at most that record; in a JSON-lines file a flip of
a record's newline (length damage: two records become one line) loses at most those two, the
next newline being the resynchronisation point. In launches.bin the resynchronisation point is
the next record: the report's ranges must end there.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vocab import binfmt
from mining.errors import DumpError

SIDE = ("functions.jsonl", "allocs.jsonl", "modules.jsonl", "graphs.jsonl", "copies.jsonl", "meta.json")
BYTE_KINDS = ("flip", "byte", "nul")
KINDS_ANY = BYTE_KINDS + ("truncate", "zero", "insert")
KINDS_LINES = ("del_line", "dup_line", "swap_lines", "garbage_line", "type_swap")
KINDS_BIN = ("del_record", "dup_record", "swap_records")
SWAPS = ('"x"', "[]", "{}", "1.5", "true", "null", str(1 << 70), "-7", "[1,2,3]", '"0xzz"', "0")


@dataclass
class Outcome:
    escaped: list = field(default_factory=list)   # (label, traceback text)
    broken: list = field(default_factory=list)    # (label, what is wrong)
    refused: int = 0
    count: int = 0

    def add(self, other: "Outcome") -> None:
        self.escaped += other.escaped
        self.broken += other.broken
        self.refused += other.refused
        self.count += other.count


def kinds_for(name: str) -> tuple[str, ...]:
    if name.startswith("launches.bin"):
        return KINDS_ANY + KINDS_BIN
    if name == "meta.json":
        return KINDS_ANY + ("type_swap",)
    return KINDS_ANY + KINDS_LINES


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def variant(data: bytes, kind: str, rng: random.Random, offs: np.ndarray | None = None):
    """(mutated bytes, the byte position hit or None). `offs`: record starts of a launches.bin."""
    n = len(data)
    b = bytearray(data)
    if kind in BYTE_KINDS:
        if not n:
            return bytes(b), None
        p = rng.randrange(n)
        if kind == "flip":
            b[p] ^= 1 << rng.randrange(8)
        elif kind == "byte":
            b[p] = (b[p] + rng.randrange(1, 256)) % 256
        else:
            b[p] = 0
        return bytes(b), p
    if kind == "truncate":
        return bytes(b[:rng.randrange(n + 1)]), None
    if kind == "zero":
        p = rng.randrange(n + 1)
        q = min(n, p + rng.choice((1, 8, 64, 500, 5000)))
        b[p:q] = bytes(q - p)
        return bytes(b), None
    if kind == "insert":
        p = rng.randrange(n + 1)
        k = rng.choice((1, 7, 8, 112, 300))
        return bytes(b[:p]) + bytes(rng.randrange(256) for _ in range(k)) + bytes(b[p:]), None
    if kind in KINDS_BIN:
        if offs is None or len(offs) < 2:
            return bytes(b), None
        ends = list(offs[1:].tolist()) + [int(offs[-1]) + int.from_bytes(data[int(offs[-1]):int(offs[-1]) + 4], "little")]
        k = rng.randrange(len(offs) - 1)
        a, e, e2 = int(offs[k]), ends[k], ends[k + 1]
        if kind == "del_record":
            return data[:a] + data[e:], None
        if kind == "dup_record":
            return data[:e] + data[a:e] + data[e:], None
        return data[:a] + data[e:e2] + data[a:e] + data[e2:], None
    lines = _lines(data)
    if not lines:
        return bytes(b), None
    k = rng.randrange(len(lines))
    if kind == "del_line":
        del lines[k]
    elif kind == "dup_line":
        lines.insert(k, lines[k])
    elif kind == "swap_lines" and k + 1 < len(lines):
        lines[k], lines[k + 1] = lines[k + 1], lines[k]
    elif kind == "garbage_line":
        lines.insert(k, rng.choice((b"garbage\n", b"{}\n", b"[1]\n", b'{"seq":\n', b"\n", b"null\n",
                                    b'{"fn":1e400}\n', b'"str"\n')))
    elif kind == "type_swap":
        lines[k] = _type_swap(lines[k], rng)
    return b"".join(lines), None


def _type_swap(line: bytes, rng: random.Random) -> bytes:
    """One value of the record (any depth) replaced by a value of another type."""
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    spots = []

    def walk(v, parent, key):
        if parent is not None:
            spots.append((parent, key))
        if isinstance(v, dict):
            for k2, x in v.items():
                walk(x, v, k2)
        elif isinstance(v, list) and len(v) < 64:
            for i, x in enumerate(v):
                walk(x, v, i)

    walk(obj, None, None)
    if not spots:
        return line
    parent, key = rng.choice(spots)
    parent[key] = json.loads(rng.choice(SWAPS))
    end = b"\n" if line.endswith(b"\n") else b""
    return json.dumps(obj, separators=(",", ":")).encode() + end


# ------------------------------------------------------------------ checking one variant
def _one_line(exc: BaseException) -> bool:
    return isinstance(exc, DumpError) and "\n" not in str(exc) and bool(str(exc))


def _sound(rep, size: int) -> str | None:
    last = 0
    for r in rep.ranges:
        if not (last <= r.start <= r.end <= size):
            return f"range [{r.start}, {r.end}) out of order or outside the file ({size} bytes)"
        last = r.end
    if rep.read < 0 or rep.skipped < 0:
        return "negative counts"
    return None


def _record_at(offs: np.ndarray, p: int) -> int:
    return int(np.searchsorted(offs, p, side="right")) - 1


def check_bin(label: str, base: bytes, base_offs: np.ndarray, data: bytes, kind: str, hit, out: Outcome):
    """launches.bin through the reader's record finding (binfmt.scan, headers)."""
    try:
        sc = binfmt.scan(data)
        binfmt.headers(data, sc.offsets)
    except Exception:
        out.escaped.append((label, traceback.format_exc()))
        return
    n = len(base_offs)
    for a, b, _, _ in sc.skips:
        if not (0 <= a <= b <= len(data)):
            out.broken.append((label, f"skip [{a}, {b}) outside the file"))
    if kind in BYTE_KINDS and hit is not None:
        k = _record_at(base_offs, hit)
        nxt = int(base_offs[k + 1]) if 0 <= k < n - 1 else len(data)
        if len(sc.offsets) < n - 1 or sc.damaged > 1:
            out.broken.append((label, f"byte {hit} (record {k}) lost {n - len(sc.offsets)} record(s), "
                                      f"reported {sc.damaged}"))
        for a, b, _, _ in sc.skips:
            if k >= 0 and (a < int(base_offs[k]) or (b > nxt and a < nxt)):
                out.broken.append((label, f"byte {hit} (record {k}): skipped [{a}, {b}) past the next "
                                          f"record at {nxt}"))


def run_reader(folder: Path, name: str, data: bytes, fns, rep_cls, full: bool = True):
    """The reader of `name` on folder/name (holding `data`): its FileReport and records read.
    full False: only the stage that decides what is read and what is reported (the per-line
    checks and the report, no frames), the same functions the full reader calls first."""
    from mining import allocs, copies, damage, functions, graphs, load
    from mining.jsonl import _OPTS, _launch_ok, read_frames, read_lines_file

    (folder / name).write_bytes(data)
    rep = rep_cls(name)
    w: list[str] = []
    if not full and name in ("modules.jsonl", "graphs.jsonl", "functions.jsonl", "copies.jsonl"):
        keep = {"modules.jsonl": load._module_event, "graphs.jsonl": graphs._graph_event,
                "functions.jsonl": functions._function, "copies.jsonl": copies._copy}[name]
        rows, rep = damage.lines_report(name, data, keep, lambda line: "damaged")
        return rep, len(rows)
    if not full and name in ("allocs.jsonl", "launches.jsonl"):
        import pyarrow.json as pj
        from mining import schema
        opts = _OPTS if name == "launches.jsonl" else pj.ParseOptions(
            explicit_schema=schema.ALLOC_RECORD, unexpected_field_behavior="ignore")
        valid = _launch_ok if name == "launches.jsonl" else allocs._valid_events
        t, rep = read_lines_file(name, data, opts, valid, w, "records")
        return rep, t.num_rows
    if name == "functions.jsonl":
        f = functions.read_functions(folder / name, w, rep)
        return rep, len(f.ids)
    if name == "allocs.jsonl":
        return rep, len(allocs.read_alloc_log(folder / name, w, rep))
    if name == "graphs.jsonl":
        return rep, len(graphs.read_graphs(folder, w, rep))
    if name == "copies.jsonl":
        return rep, len(copies.read_copies(folder / name, w, rep))
    if name == "modules.jsonl":
        return rep, len(load._module_frame(folder, w, rep))
    if name == "meta.json":
        return rep, len(load.read_meta(folder, w, rep))
    if name.startswith("launches.bin"):
        from mining.binload import read_bin_frames
        launches, _ = read_bin_frames(folder / name, w, None, fns, chunk=1 << 20, report=rep)
        return rep, len(launches)
    launches, _ = read_frames(folder / name, w, None, fns, chunk=1 << 20, report=rep)
    return rep, rep.read


def check_lines(label: str, folder: Path, name: str, base: bytes, base_read: int, data: bytes,
                kind: str, hit, fns, out: Outcome, full: bool = True):
    from mining.damage import FileReport
    try:
        rep, got = run_reader(folder, name, data, fns, FileReport, full)
    except Exception as exc:  # noqa: BLE001 -- the point: nothing but a one-line DumpError
        if _one_line(exc):
            out.refused += 1
        else:
            out.escaped.append((label, traceback.format_exc()))
        return
    bad = _sound(rep, len(data))
    if bad:
        out.broken.append((label, bad))
    if kind in BYTE_KINDS and hit is not None and name != "meta.json":
        allowed = 2 if base[hit:hit + 1] == b"\n" else 1
        if rep.read < base_read - allowed:
            out.broken.append((label, f"byte {hit} ({kind}) lost {base_read - rep.read} record(s), at most "
                                      f"{allowed} allowed; report {rep.sentence()}"))


def run_analyze(folder: Path):
    """What `mine analyze PID_DIR --json` does, in process: load, analyze, render, the contract
    written and read back."""
    from rich.console import Console

    from mining import report
    from mining.analyze import analyze, document
    from vocab.analysis import from_json
    from mining.load import load_dump

    dump = load_dump(folder, cache=False)
    a = analyze(dump)
    report.render(a, Console(file=io.StringIO(), width=120))
    doc = document(a).to_json()
    text = json.dumps(doc)
    back = from_json(json.loads(text)).to_json()
    if back != json.loads(text):
        raise AssertionError("the contract does not round-trip")
    return dump


def check_analyze(label: str, folder: Path, out: Outcome):
    try:
        run_analyze(folder)
    except Exception as exc:  # noqa: BLE001
        if _one_line(exc):
            out.refused += 1
        else:
            out.escaped.append((label, traceback.format_exc()))


def copy_pid(src: Path, dst: Path) -> Path:
    """A pid folder's dump files (no cubins, no cache): what the variants are made from."""
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and not p.name.startswith("."):
            shutil.copyfile(p, dst / p.name)
    return dst
