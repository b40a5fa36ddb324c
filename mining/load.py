"""Load a dump (docs/dump-format.md, format_version 1) into the canonical frames: the facade.

Why: every analysis in `mining/` works on three frames (launches, params in long form, modules;
columns declared in `schema.py`), so the expensive part -- parsing up to millions of JSON lines --
happens once, through `load_dump`: the launch file is read in chunks on worker threads
(`mining/jsonl.py`), each chunk turned into its frame columns on the spot (`mining/frames.py`), and
the result is cached as parquet in the user's cache folder (`mining/cache.py`: `--cache-dir`,
$MINE_CACHE_DIR or ~/.cache/mine; keyed on the source's size, mtime and FRAME_VERSION; nothing
is ever written beside the dump, and `cache=False` writes nothing anywhere).
This module finds the files, checks meta.json, builds the modules frame and assembles the `Dump`. `CHUNK` (bytes of JSON per parse
task) is set here and passed down to the reader.

Accepted paths: a `pid<N>/` folder, a whole dump folder (the pid with the most launches unless
`pid=` picks one), or a bare `launches.jsonl` or `launches.bin` (plain, .gz, .xz or .zst).

Binary launch records (`launches.bin`, MINE_CAPTURE_FORMAT=bin; `mining/binload.py`): read into
the same frames as their compact JSON twin (always with functions.jsonl and, classify being 0,
pointer columns from allocs.jsonl). A folder holding both launch files is read from
launches.jsonl (e.g. after `python -m vocab.binfmt` rewrote the binary file). Damaged records
are skipped with one warning. The cache is keyed on launches.bin as on launches.jsonl.

Damage is tolerated, not hidden (docs/dump-format.md "Reading damaged dumps"): every reader checks
each field against its documented range before use, resynchronises after damage (per line in the
JSON files, at the next valid header whose seq continues the sequence in launches.bin), and reports
per file what it skipped (`Dump.damage`, mining/damage.py: records read and skipped, the byte
ranges and why); each drop is also a line in `Dump.warnings`, and a file that lost most of its
records says so. Missing cubins are flagged per module. NUL bytes (the mmap writer's preallocated
tail, or a record in flight when the process died) follow the reader rule of "Writers". A
meta.json that is not a JSON object, or has a key of the wrong type, is damage: reported and read
around. What is refused (`DumpError`, a ValueError, one sentence): no launch file, a launch file
with no readable record, a meta.json whose format_version or top-level keys this reader does not
know (another format, not damage).
Not checked: that records are in time order (analyses sort by seq); a seq repeated across two
parse chunks of launches.jsonl.

Allocation log (`allocs.jsonl`, MINE_CAPTURE_ALLOC_LOG=1; `mining/allocs.py`): read into
`Dump.allocs`. When the launches carry no `ptrs` (meta.json `options.classify` is 0), the params
frame's pointer columns are filled from it offline, word rows included, exactly as recorded `ptrs`
would fill them. When both exist, the recorded `ptrs` are kept and a warning counts the words
where the log says otherwise. The parquet cache is keyed on the log too.

Compact form (`functions.jsonl`, MINE_CAPTURE_COMPACT=1; `mining/functions.py`): launches that
carry `fn` get their per-function columns and their parameters' off/size from that file, so the
frames equal those of the same launches in the default form. Launches naming a function the file
lacks are dropped with one warning. The cache is keyed on functions.jsonl too.

Copy log (`copies.jsonl`, MINE_CAPTURE_COPY_LOG=1, the default; `mining/copies.py`): read into
`Dump.copies` (host-to-device), each copy with the launch seq it precedes; `mining.copies.bytes_before`
answers what a device range held before a launch. Device-to-device copies and memsets go to
`Dump.device_ops` (the same columns). Not cached (the file is small next to the launch file).

Snapshot (`snapshot.jsonl` + `snapshot/`, MINE_CAPTURE_SNAPSHOT_*; `mining/snapshot.py`): read into
`Dump.snapshot`, whose `read(address, n)` gives the bytes of a range the copied allocations cover.
Not cached (one line per allocation; the bytes are read on demand).

Re-exported for callers of `mining.load`: `DumpError` (mining/errors.py), `hex_le_u64` and
`hex_num_u64` (mining/frames.py), `ALLOC_LOG` (mining/allocs.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mining import schema
from mining.allocs import ALLOC_LOG, Offline, intervals, read_alloc_log
from mining.archive import unpack
from mining.binload import read_bin_frames
from mining.cache import read_cache, write_cache
from mining.errors import DumpError
from mining.frames import hex_le_u64, hex_num_u64  # re-exported: tests import them from here
from mining.copies import COPIES, read_copies, split_copies
from mining.damage import FileReport, lines_report
from mining.functions import FUNCTIONS, Functions, read_functions
from mining.graphs import GRAPHS, read_graphs
from mining.jsonl import read_frames
from mining.snapshot import SNAPSHOT, Snapshot, read_snapshot
from vocab import capture_tables

# The API of `mining.load`; hex_le_u64 and hex_num_u64 are re-exports (home: mining/frames.py).
__all__ = ["ALLOC_LOG", "CHUNK", "LAUNCH_NAMES", "META_KEYS", "Dump", "DumpError", "hex_le_u64",
           "hex_num_u64", "load_dump", "read_meta", "resolve"]


META_KEYS = frozenset(capture_tables.META_KEYS)  # the capture's meta.json keys (vocab/capture_tables.py)
LAUNCH_NAMES = ("launches.jsonl", "launches.jsonl.gz", "launches.jsonl.xz", "launches.jsonl.zst",
                "launches.bin", "launches.bin.gz", "launches.bin.xz", "launches.bin.zst")  # JSON first
CHUNK = 16 << 20  # bytes of JSON per parse task (mining/jsonl.py; tests set it here)


@dataclass
class Dump:
    launches: pd.DataFrame
    params: pd.DataFrame
    modules: pd.DataFrame
    meta: dict
    source: Path                       # the launches file that was read
    pid: int | None = None
    warnings: list[str] = field(default_factory=list)
    allocs: pd.DataFrame | None = None  # allocs.jsonl events (schema.ALLOC_COLUMNS), if any
    damage: list[FileReport] = field(default_factory=list)  # per file read: what was skipped (damage.py)
    copies: pd.DataFrame | None = None  # copies.jsonl host-to-device copies (mining/copies.py), if any
    snapshot: Snapshot | None = None    # snapshot.jsonl + snapshot/ device bytes (mining/snapshot.py), if any
    device_ops: pd.DataFrame | None = None  # copies.jsonl device-to-device copies and memsets (split_copies)
    graphs: pd.DataFrame | None = None  # graphs.jsonl events (mining.graphs.read_graphs), read once here


# ------------------------------------------------------------------ locating the files
def _launch_file(folder: Path) -> Path | None:
    for name in LAUNCH_NAMES:
        if (folder / name).is_file():
            return folder / name
    return None


def _pid_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("pid*") if p.is_dir() and p.name[3:].isdigit())


def _launch_count_hint(pid_dir: Path) -> int:
    """How much a process launched, comparable across processes: the size of its launches file
    without the zeros the mmap writer granted ahead and a process that ended by _exit (no exit
    handler) left in place (a killed process has no counters, so counts and sizes must not be mixed)."""
    f = _launch_file(pid_dir)
    if f is None:
        return -1
    size = f.stat().st_size
    if f.suffix not in (".jsonl", ".bin"):
        return size                        # compressed: no preallocated tail
    block = 1 << 16
    with f.open("rb") as fh:
        end = size
        while end > 0:
            lo = max(0, end - block)
            fh.seek(lo)
            chunk = fh.read(end - lo).rstrip(b"\0")
            if chunk:
                return lo + len(chunk)
            end = lo
    return 0


def resolve(path: str | os.PathLike, pid: int | None = None, cache: bool = True,
            cache_dir: str | os.PathLike | None = None) -> Path:
    """The launches file that `path` (+ optional pid) designates (an archive is unpacked into the
    cache, or with `cache=False` into a temporary folder: mining/archive.py)."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or folder")
    p = unpack(p, cache=cache, cache_dir=cache_dir)  # a dump archive (.tar.xz) reads as its folder
    if p.is_file():
        return p
    if (f := _launch_file(p)) is not None and pid is None:
        return f
    pids = _pid_dirs(p)
    if pid is not None:
        want = p / f"pid{pid}"
        if want not in pids or (f := _launch_file(want)) is None:
            have = ", ".join(d.name[3:] for d in pids) or "none"
            raise DumpError(f"{p}: no launches for pid {pid} (pids with a folder: {have})")
        return f
    cands = [d for d in pids if _launch_file(d) is not None]
    if not cands:
        raise DumpError(f"{p}: neither a launches.jsonl (or launches.bin) nor pid<N>/ folders holding one")
    return _launch_file(max(cands, key=_launch_count_hint))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < 1 << 63


# meta.json: the type each top-level key must have (docs/dump-format.md "meta.json"); a key of
# another type is damage: it is left out of Dump.meta and reported.
_META_TYPES = {"pid": _is_int, "ppid": _is_int, "start_ns": _is_int, "start_unix_ns": _is_int,
               "driver_version": _is_int, "cupti_version": _is_int, "end_ns": _is_int,
               "argv": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
               "env": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
               "devices": lambda v: isinstance(v, list), "options": lambda v: isinstance(v, dict),
               "counters": lambda v: isinstance(v, dict), "disabled": lambda v: isinstance(v, str),
               "toggles": lambda v: isinstance(v, list) and all(
                   isinstance(t, list) and len(t) == 2 and _is_int(t[0]) and t[1] in (0, 1) for t in v)}


def read_meta(folder: Path, warnings: list[str] | None = None, report: FileReport | None = None) -> dict:
    """meta.json, checked: a format_version or a top-level key this reader does not know is
    refused (another format, not damage); a file that is not a JSON object, or a key of the wrong
    type, is damage: reported, left out (an empty meta), and the dump is read on."""
    f = folder / "meta.json"
    if not f.is_file():
        return {}
    rep = report if report is not None else FileReport("meta.json")
    try:
        raw = f.read_bytes()
        meta = json.loads(raw)
    except (ValueError, OSError) as exc:
        meta = None
        why = f"not valid JSON ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    else:
        why = "not a JSON object"
    if not isinstance(meta, dict):
        rep.skip(0, len(raw) if "raw" in locals() else 0, f"meta.json is {why}; read without it")
        if warnings is not None:
            warnings.append(f"meta.json is {why}: the dump is read without it (no counters, no options)")
        return {}
    if meta.get("format_version") != schema.DUMP_FORMAT_VERSION:
        raise DumpError(f"{f}: format_version {meta.get('format_version')!r} is not the supported "
                        f"{schema.DUMP_FORMAT_VERSION}")
    unknown = sorted(set(meta) - META_KEYS)
    if unknown:
        raise DumpError(f"{f}: unknown top-level keys {unknown}; this reader knows format_version 1")
    bad = sorted(k for k, ok in _META_TYPES.items() if k in meta and not ok(meta[k]))
    counters = meta.get("counters")
    if isinstance(counters, dict) and not all(_is_int(v) or isinstance(v, dict) for v in counters.values()):
        bad.append("counters")
    options = meta.get("options")
    if isinstance(options, dict) and not all(v is None or _is_int(v) or isinstance(v, str)
                                             for v in options.values()):
        bad.append("options")
    if bad:
        rep.skip(0, len(raw), f"meta.json key(s) {sorted(set(bad))} of the wrong type; left out", 0)
        if warnings is not None:
            warnings.append(f"meta.json: key(s) {sorted(set(bad))} have the wrong type and are left out")
        meta = {k: v for k, v in meta.items() if k not in bad}
    rep.read += 1
    return meta


# ------------------------------------------------------------------ modules + entry point
def _module_event(line: bytes):
    """One modules.jsonl line -> its row (without cubin_present), or None when it is not a module
    event of the documented types and ranges."""
    try:
        r = json.loads(line)
    except ValueError:
        return None
    if not isinstance(r, dict) or r.get("event") not in ("load", "unload"):
        return None
    sha = r.get("sha256") or ""
    entries = r.get("entries") or []
    nums = {k: r.get(k, 0) for k in ("dev", "t_ns", "size")}
    if not (_is_int(r.get("module")) and 0 <= r["module"] < 1 << 62 and isinstance(sha, str)
            and all(_is_int(v) for v in nums.values()) and -1 <= nums["dev"] < 128
            and nums["t_ns"] >= 0 and nums["size"] >= 0 and isinstance(entries, list)):
        return None
    if sha and not (len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        return None
    return {"event": r["event"], "module": r["module"], "dev": nums["dev"], "t_ns": nums["t_ns"],
            "sha256": sha, "size": nums["size"], "n_entries": len(entries)}


def _module_frame(folder: Path, warnings: list[str], report: FileReport | None = None) -> pd.DataFrame:
    rows = []
    src = folder / "modules.jsonl"
    if src.is_file():
        rows, rep = lines_report("modules.jsonl", src.read_bytes(), _module_event,
                                 lambda line: "not a module event of the documented types and ranges")
        if report is not None:
            report.merge(rep)
        if rep.skipped:
            warnings.append(f"modules.jsonl: dropped {rep.skipped} unparsable line(s)")
        have = {p.stem for p in (folder / "cubins").glob("*.cubin")} if (folder / "cubins").is_dir() else set()
        for r in rows:
            r["cubin_present"] = bool(r["sha256"]) and r["sha256"] in have
    df = pd.DataFrame(rows, columns=list(schema.MODULE_COLUMNS))
    missing = df[(df["event"] == "load") & ~df["cubin_present"].astype(bool)]
    if len(missing):
        warnings.append(f"{missing['sha256'].nunique()} module(s) have no cubin in cubins/")
    return df.astype(schema.MODULE_COLUMNS)


def load_dump(path: str | os.PathLike, pid: int | None = None, cache: bool = True,
              cache_dir: str | os.PathLike | None = None) -> Dump:
    """Read the dump at `path` into frames (see the module docstring for accepted paths).
    `cache=False` neither reads nor writes the cache; `cache_dir` overrides where it is
    (mining/cache.py)."""
    src = resolve(path, pid, cache=cache, cache_dir=cache_dir)
    folder = src.parent
    warnings: list[str] = []
    meta_warnings: list[str] = []
    reports = {name: FileReport(name) for name in (src.name, FUNCTIONS, ALLOC_LOG, "modules.jsonl",
                                                   GRAPHS, COPIES, SNAPSHOT, "meta.json")}
    meta = read_meta(folder, meta_warnings, reports["meta.json"])
    allocs, alloc_warnings = None, []
    if (folder / ALLOC_LOG).is_file():
        allocs = read_alloc_log(folder / ALLOC_LOG, alloc_warnings, reports[ALLOC_LOG])
        lost = (meta.get("counters") or {}).get("alloc_dropped") or 0
        if lost:
            alloc_warnings.append(f"{ALLOC_LOG}: the capture could not write {lost} event(s); pointer "
                                  f"columns classified from it may be wrong")
    fn_warnings: list[str] = []
    fns = read_functions(folder / FUNCTIONS, fn_warnings, reports[FUNCTIONS]) \
        if (folder / FUNCTIONS).is_file() else None
    hit = read_cache(src, cache_dir) if cache else None
    if hit is not None:
        launches, params, warnings, reports[src.name] = hit
    else:
        offline = None
        if allocs is not None:
            mode = "fill" if (meta.get("options") or {}).get("classify") == 0 else "check"
            offline = Offline(intervals(allocs), mode, [])
        warnings.extend(alloc_warnings)
        warnings.extend(fn_warnings)
        no_fns = Functions(np.zeros(0, np.int64), {}, *(np.zeros(0, np.int64),) * 4) if fns is None else fns
        rep = reports[src.name]
        try:
            read = read_bin_frames if ".bin" in src.name else read_frames
            launches, params = read(src, warnings, offline, no_fns, chunk=CHUNK, report=rep)
        except DumpError:
            if sum(no_fns.missing):
                raise DumpError(f"{src}: every launch names a function that {folder / FUNCTIONS} "
                                f"{'lacks' if fns is not None else 'would hold (the file is missing)'}") from None
            if rep.damaged:
                more = " or more" if any(r.records is None for r in rep.ranges) else ""
                raise DumpError(f"{src}: holds no parsable launch record ({rep.skipped}{more} damaged "
                                f"record(s) in {len(rep.ranges) + rep.ranges_left_out} range(s))") from None
            raise
        if sum(no_fns.missing):
            warnings.append(f"dropped {sum(no_fns.missing)} launch(es) naming a function missing from "
                            f"{FUNCTIONS}" + ("" if fns is not None else " (the file is missing)"))
        if offline is not None and offline.mode == "check" and sum(offline.disagree):
            warnings.append(f"{ALLOC_LOG}: the offline classification disagrees with the recorded ptrs "
                            f"on {sum(offline.disagree)} word(s); the recorded ptrs are kept")
        order = np.argsort(launches["seq"].to_numpy(), kind="stable")
        if (np.diff(order) != 1).any():
            launches = launches.iloc[order].reset_index(drop=True)
        if cache:
            write_cache(src, launches, params, warnings, reports[src.name], cache_dir)
    if len(launches) == 0:
        raise DumpError(f"{src}: holds no launch records")
    warnings = meta_warnings + warnings
    modules = _module_frame(folder, warnings, reports["modules.jsonl"])
    graphs = read_graphs(folder, None, reports[GRAPHS])
    copies = read_copies(folder / COPIES, warnings, reports[COPIES]) if (folder / COPIES).is_file() else None
    device_ops = None
    if copies is not None:
        copies, device_ops = split_copies(copies)
    if copies is not None and (meta.get("counters") or {}).get("copies_dropped"):
        warnings.append(f"{COPIES}: the capture could not write {meta['counters']['copies_dropped']} copy "
                        f"record(s); the bytes of a range they wrote may be older ones")
    snapshot = read_snapshot(folder, warnings, reports[SNAPSHOT])
    damage = [r for name, r in reports.items() if (folder / name).is_file() or name == src.name]
    warnings += _damage_notes(damage, meta, reports[src.name], len(launches))
    name = folder.name
    pid_v = meta.get("pid") or (int(name[3:]) if name.startswith("pid") and name[3:].isdigit() else None)
    return Dump(launches, params, modules, meta, src, pid_v, warnings, allocs, damage, copies, snapshot, device_ops,
                graphs)


def _damage_notes(damage: list[FileReport], meta: dict, launch: FileReport, kept: int) -> list[str]:
    """The plain sentences about damage (docs/dump-format.md "Reading damaged dumps"): a file
    that lost more than half its records is mostly damage; the launch file's count against
    meta.json's counters when the capture wrote them."""
    out = []
    for r in damage:
        if r.mostly_damage:
            out.append(f"{r.file} is mostly damage: {r.skipped} of {r.read + r.skipped} record(s) lost; "
                       f"the analysis uses the {r.read} that could be read")
    rec = (meta.get("counters") or {}).get("launches_recorded")
    if _is_int(rec) and rec != launch.read + launch.skipped:
        out.append(f"meta.json counts {rec} recorded launch(es); the launch file holds {launch.read} "
                   f"read and {launch.skipped} skipped as damage")
    return out
