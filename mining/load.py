"""Load a dump (docs/dump-format.md, format_version 1) into the canonical frames: the facade.

Why: every analysis in `mining/` works on three frames (launches, params in long form, modules;
columns declared in `schema.py`), so the expensive part -- parsing up to millions of JSON lines --
happens once, through `load_dump`: the launch file is read in chunks on worker threads
(`mining/jsonl.py`), each chunk turned into its frame columns on the spot (`mining/frames.py`), and
the result is cached as parquet next to the dump (`mining/cache.py`: `<pid dir>/.mine-cache/`,
keyed on the source's size, mtime and FRAME_VERSION). This module finds the files, checks
meta.json, builds the modules frame and assembles the `Dump`. `CHUNK` (bytes of JSON per parse
task) is set here and passed down to the reader.

Accepted paths: a `pid<N>/` folder, a whole dump folder (the pid with the most launches unless
`pid=` picks one), or a bare `launches.jsonl` or `launches.bin` (plain, .gz, .xz or .zst).

Binary launch records (`launches.bin`, MINE_CAPTURE_FORMAT=bin; `mining/binload.py`): read into
the same frames as their compact JSON twin (always with functions.jsonl and, classify being 0,
pointer columns from allocs.jsonl). A folder holding both launch files is read from
launches.jsonl (e.g. after `python -m capture.binfmt` rewrote the binary file). Damaged records
are skipped with one warning. The cache is keyed on launches.bin as on launches.jsonl.

Damage is tolerated, not hidden: a truncated last line or unparsable lines are dropped and each
drop is reported in `Dump.warnings`; missing cubins are flagged per module. NUL bytes (the mmap
writer's preallocated tail, or a record in flight when the process died) follow the reader rule of
docs/dump-format.md "Writers" (`mining/jsonl.py`). What is refused
(`DumpError`, a ValueError): no launch file, an empty launch file, a meta.json whose
format_version or top-level keys this reader does not know.
Not checked: that `seq` is gap-free or that records are in time order (analyses sort by seq).

Allocation log (`allocs.jsonl`, MINE_CAPTURE_ALLOC_LOG=1; `mining/allocs.py`): read into
`Dump.allocs`. When the launches carry no `ptrs` (meta.json `options.classify` is 0), the params
frame's pointer columns are filled from it offline, word rows included, exactly as recorded `ptrs`
would fill them. When both exist, the recorded `ptrs` are kept and a warning counts the words
where the log says otherwise. The parquet cache is keyed on the log too.

Compact form (`functions.jsonl`, MINE_CAPTURE_COMPACT=1; `mining/functions.py`): launches that
carry `fn` get their per-function columns and their parameters' off/size from that file, so the
frames equal those of the same launches in the default form. Launches naming a function the file
lacks are dropped with one warning. The cache is keyed on functions.jsonl too.

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
from mining.functions import FUNCTIONS, Functions, read_functions
from mining.jsonl import read_frames

# The API of `mining.load`; hex_le_u64 and hex_num_u64 are re-exports (home: mining/frames.py).
__all__ = ["ALLOC_LOG", "CHUNK", "LAUNCH_NAMES", "META_KEYS", "Dump", "DumpError", "hex_le_u64",
           "hex_num_u64", "load_dump", "read_meta", "resolve"]


META_KEYS = {"format_version", "pid", "ppid", "argv", "start_ns", "start_unix_ns",
             "driver_version", "cupti_version", "devices", "options", "counters", "end_ns",
             "disabled"}
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
    (a killed process has no counters, so counts and sizes must not be mixed)."""
    f = _launch_file(pid_dir)
    return f.stat().st_size if f else -1


def resolve(path: str | os.PathLike, pid: int | None = None) -> Path:
    """The launches file that `path` (+ optional pid) designates."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or folder")
    p = unpack(p)  # a dump archive (.tar.xz) reads as its folder
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


def read_meta(folder: Path) -> dict:
    f = folder / "meta.json"
    if not f.is_file():
        return {}
    try:
        meta = json.loads(f.read_text())
    except ValueError as exc:
        raise DumpError(f"{f}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DumpError(f"{f}: expected a JSON object")
    if meta.get("format_version") != schema.DUMP_FORMAT_VERSION:
        raise DumpError(f"{f}: format_version {meta.get('format_version')!r} is not the supported "
                        f"{schema.DUMP_FORMAT_VERSION}")
    unknown = sorted(set(meta) - META_KEYS)
    if unknown:
        raise DumpError(f"{f}: unknown top-level keys {unknown}; this reader knows format_version 1")
    return meta


# ------------------------------------------------------------------ modules + entry point
def _module_frame(folder: Path, warnings: list[str]) -> pd.DataFrame:
    rows, bad = [], 0
    src = folder / "modules.jsonl"
    if src.is_file():
        for line in src.read_bytes().splitlines():
            try:
                r = json.loads(line)
                sha = r.get("sha256") or ""
                rows.append({
                    "event": r["event"], "module": int(r["module"]), "dev": int(r.get("dev", 0)),
                    "t_ns": int(r.get("t_ns", 0)), "sha256": sha, "size": int(r.get("size", 0)),
                    "n_entries": len(r.get("entries") or []),
                    "cubin_present": bool(sha) and (folder / "cubins" / f"{sha}.cubin").is_file(),
                })
            except (ValueError, KeyError, TypeError, AttributeError):
                bad += 1
    if bad:
        warnings.append(f"modules.jsonl: dropped {bad} unparsable line(s)")
    df = pd.DataFrame(rows, columns=list(schema.MODULE_COLUMNS))
    missing = df[(df["event"] == "load") & ~df["cubin_present"].astype(bool)]
    if len(missing):
        warnings.append(f"{missing['sha256'].nunique()} module(s) have no cubin in cubins/")
    return df.astype(schema.MODULE_COLUMNS)


def load_dump(path: str | os.PathLike, pid: int | None = None, cache: bool = True) -> Dump:
    """Read the dump at `path` into frames (see the module docstring for accepted paths)."""
    src = resolve(path, pid)
    folder = src.parent
    warnings: list[str] = []
    meta = read_meta(folder)
    allocs, alloc_warnings = None, []
    if (folder / ALLOC_LOG).is_file():
        allocs = read_alloc_log(folder / ALLOC_LOG, alloc_warnings)
        lost = (meta.get("counters") or {}).get("alloc_dropped") or 0
        if lost:
            alloc_warnings.append(f"{ALLOC_LOG}: the capture could not write {lost} event(s); pointer "
                                  f"columns classified from it may be wrong")
    hit = read_cache(src) if cache else None
    if hit is not None:
        launches, params, warnings = hit
    else:
        offline = None
        if allocs is not None:
            mode = "fill" if (meta.get("options") or {}).get("classify") == 0 else "check"
            offline = Offline(intervals(allocs), mode, [])
        warnings.extend(alloc_warnings)
        fns = read_functions(folder / FUNCTIONS, warnings) if (folder / FUNCTIONS).is_file() else None
        no_fns = Functions(np.zeros(0, np.int64), {}, *(np.zeros(0, np.int64),) * 4) if fns is None else fns
        try:
            read = read_bin_frames if ".bin" in src.name else read_frames
            launches, params = read(src, warnings, offline, no_fns, chunk=CHUNK)
        except DumpError:
            if sum(no_fns.missing):
                raise DumpError(f"{src}: every launch names a function that {folder / FUNCTIONS} "
                                f"{'lacks' if fns is not None else 'would hold (the file is missing)'}") from None
            if any("unparsable" in w for w in warnings):
                raise DumpError(f"{src}: holds no parsable launch record") from None
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
            write_cache(src, launches, params, warnings)
    if len(launches) == 0:
        raise DumpError(f"{src}: holds no launch records")
    modules = _module_frame(folder, warnings)
    name = folder.name
    pid_v = meta.get("pid") or (int(name[3:]) if name.startswith("pid") and name[3:].isdigit() else None)
    return Dump(launches, params, modules, meta, src, pid_v, warnings, allocs)
