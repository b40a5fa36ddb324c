"""Where mine keeps what it can recompute: one cache folder per user, never beside the input.

Why one place: a dump or archive may sit in a read-only folder, on a shared disk, or in the
repository; writing beside it (the old `.mine-cache/`) failed on the first, littered the others and
doubled the space when an archive was touched. `cache_root` names the folder: `--cache-dir` when a
command is given one, else `$MINE_CACHE_DIR`, else `$XDG_CACHE_HOME/mine`, else `~/.cache/mine`.
It holds two kinds of entries (the README says the same, under "Use"):

- `archives/<name>-<hash>/`: a dump archive unpacked (`mining/archive.py`), one per archive path;
  a changed archive replaces its entry.
- `frames/<pid dir>-<hash>/`: the parquet frames of one launch file (below), one key per file;
  writing a new key removes that file's older ones.

`<hash>` is of the input's absolute path, so two dumps of the same name never share an entry. With
`cache=False` (`--no-cache`) nothing is read from or written to the cache: `load_dump` parses the
files and an archive is unpacked into a temporary folder removed when the process ends.

The frames cache: parsing the JSON is the slow part of a load (`mining/jsonl.py`); a second load of
the same launch file reads the frames back (lz4 parquet, plus the load's warnings and the launch
file's damage report as JSON, mining/damage.py). The key is the launch file's name (launches.jsonl
or launches.bin, plain or compressed), size and mtime, schema.FRAME_VERSION, and the size and
mtime of allocs.jsonl and functions.jsonl when present (the frames depend on both).

Tolerant both ways: an entry that is missing, partial or unreadable is a miss (`read_cache`
returns None); a cache folder that cannot be written is simply not used (the load still works).
Not checked: file contents against the key (a file rewritten with the same size and mtime_ns
reads stale frames); the cache's size (remove the folder at any time, nothing is lost).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

from mining import schema
from mining.allocs import ALLOC_LOG
from mining.damage import FileReport
from mining.functions import FUNCTIONS

ENV = "MINE_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder: `cache_dir`, else $MINE_CACHE_DIR, else $XDG_CACHE_HOME/mine, else
    ~/.cache/mine (a relative XDG_CACHE_HOME is ignored, as the XDG spec asks)."""
    if cache_dir is not None and str(cache_dir):
        return Path(cache_dir).expanduser()
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "mine"


def entry_name(path: Path) -> str:
    """`<name>-<hash of the absolute path>`: readable, and unique per input."""
    absolute = os.path.abspath(path)
    return f"{path.name}-{hashlib.sha256(absolute.encode()).hexdigest()[:16]}"


def _cache_paths(src: Path, cache_dir) -> tuple[Path, str]:
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
    return cache_root(cache_dir) / "frames" / entry_name(src.parent), key


def read_cache(src: Path, cache_dir: str | os.PathLike | None = None):
    folder, key = _cache_paths(src, cache_dir)
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
                report: FileReport, cache_dir: str | os.PathLike | None = None):
    folder, key = _cache_paths(src, cache_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"{src.name}-*"):
            old.unlink()
        # lz4 without dictionary pages for the numeric params: the fastest write and read of the
        # codecs measured (benchmarks/bench_load.py); arrow wraps the frames' buffers, no copy.
        # Each part is written under a temporary name and renamed: a reader never sees half a file.
        parts = [(f"{key}.launches.parquet", lambda t: launches.to_parquet(t, index=False, compression="lz4")),
                 (f"{key}.params.parquet", lambda t: params.to_parquet(t, index=False, compression="lz4",
                                                                         use_dictionary=False)),
                 (f"{key}.warnings.json", lambda t: t.write_text(json.dumps(
                     {"warnings": warnings, "damage": report.to_json()})))]
        for name, write in parts:
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            write(tmp)
            tmp.replace(folder / name)
    except OSError:
        pass  # a cache that cannot be written is not used; the load itself succeeded
