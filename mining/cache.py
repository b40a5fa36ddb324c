"""The parquet cache of a dump's launches and params frames, next to the dump.

Why: parsing the JSON is the slow part of a load (`mining/jsonl.py`); a second load of the same
files reads the frames back from `<pid dir>/.mine-cache/` instead (lz4 parquet, plus the load's
warnings and the launch file's damage report as JSON, mining/damage.py). The key is the launch
file's name (launches.jsonl or launches.bin, plain or
compressed), size and mtime, schema.FRAME_VERSION, and the size and mtime of allocs.jsonl and
functions.jsonl when present (the frames depend on both); writing a new key removes the launch
file's older entries.

Tolerant both ways: an entry that is missing, partial or unreadable is a miss (`read_cache` returns
None); a folder that cannot be written (a read-only dump) is simply not cached.
Not checked: file contents against the key (a file rewritten with the same size and mtime_ns
reads stale frames).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from mining import schema
from mining.allocs import ALLOC_LOG
from mining.damage import FileReport
from mining.functions import FUNCTIONS


def _cache_paths(src: Path) -> tuple[Path, str]:
    st = src.stat()
    key = f"{src.name}-{st.st_size}-{st.st_mtime_ns}-v{schema.FRAME_VERSION}"
    log = src.parent / ALLOC_LOG
    if log.is_file():  # the params frame depends on the allocation log too
        a = log.stat()
        key += f"-allocs{a.st_size}-{a.st_mtime_ns}"
    fns = src.parent / FUNCTIONS
    if fns.is_file():  # compact form: the frames join it
        f = fns.stat()
        key += f"-fns{f.st_size}-{f.st_mtime_ns}"
    return src.parent / ".mine-cache", key


def read_cache(src: Path):
    folder, key = _cache_paths(src)
    files = [folder / f"{key}.{part}.parquet" for part in ("launches", "params")]
    note = folder / f"{key}.warnings.json"
    if not all(f.is_file() for f in files) or not note.is_file():
        return None
    try:
        note_v = json.loads(note.read_text())
        if not isinstance(note_v, dict):   # an entry from before the damage report: a miss
            return None
        report = FileReport.from_json(note_v["damage"])
        return (pd.read_parquet(files[0]), pd.read_parquet(files[1]), list(note_v["warnings"]), report)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def write_cache(src: Path, launches: pd.DataFrame, params: pd.DataFrame, warnings: list[str],
                report: FileReport):
    folder, key = _cache_paths(src)
    try:
        folder.mkdir(exist_ok=True)
        for old in folder.glob(f"{src.name}-*"):
            old.unlink()
        # lz4 without dictionary pages for the numeric params: the fastest write and read of the
        # codecs measured (benchmarks/bench_load.py); arrow wraps the frames' buffers, no copy.
        launches.to_parquet(folder / f"{key}.launches.parquet", index=False, compression="lz4")
        params.to_parquet(folder / f"{key}.params.parquet", index=False, compression="lz4",
                          use_dictionary=False)
        (folder / f"{key}.warnings.json").write_text(json.dumps({"warnings": warnings,
                                                                 "damage": report.to_json()}))
    except OSError:
        pass  # a read-only dump is still readable; it is just not cached
