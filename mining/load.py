"""Load a dump (docs/dump-format.md, format_version 1) into the canonical frames.

Why: every analysis in `mining/` works on three frames (launches, params in long form, modules;
columns declared in `schema.py`), so the expensive part -- parsing up to millions of JSON lines --
happens once, here, on pyarrow's multi-threaded JSON reader, and is cached as parquet next to the
dump (`<pid dir>/.mine-cache/`, keyed on the source's size, mtime and FRAME_VERSION).

Accepted paths: a `pid<N>/` folder, a whole dump folder (the pid with the most launches unless
`pid=` picks one), or a bare `launches.jsonl` (plain, .gz, .xz or .zst).

Damage is tolerated, not hidden: a truncated last line or unparsable lines are dropped and each
drop is reported in `Dump.warnings`; missing cubins are flagged per module. What is refused
(`DumpError`, a ValueError): no launch file, an empty launch file, a meta.json whose
format_version or top-level keys this reader does not know.
Not checked: that `seq` is gap-free or that records are in time order (analyses sort by seq).
"""

from __future__ import annotations

import io
import json
import lzma
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from mining import schema


class DumpError(ValueError):
    """A dump that cannot be read; the message is one sentence naming the path."""


META_KEYS = {"format_version", "pid", "ppid", "argv", "start_ns", "start_unix_ns",
             "driver_version", "cupti_version", "devices", "options", "counters", "end_ns",
             "disabled"}
LAUNCH_NAMES = ("launches.jsonl", "launches.jsonl.gz", "launches.jsonl.xz", "launches.jsonl.zst")


@dataclass
class Dump:
    launches: pd.DataFrame
    params: pd.DataFrame
    modules: pd.DataFrame
    meta: dict
    source: Path                       # the launches file that was read
    pid: int | None = None
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ locating the files
def _launch_file(folder: Path) -> Path | None:
    for name in LAUNCH_NAMES:
        if (folder / name).is_file():
            return folder / name
    return None


def _pid_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("pid*") if p.is_dir() and p.name[3:].isdigit())


def _launch_count_hint(pid_dir: Path) -> int:
    try:
        meta = json.loads((pid_dir / "meta.json").read_text())
        return int(meta["counters"]["launches_recorded"])
    except (OSError, ValueError, KeyError, TypeError):
        f = _launch_file(pid_dir)
        return f.stat().st_size if f else -1


def resolve(path: str | os.PathLike, pid: int | None = None) -> Path:
    """The launches file that `path` (+ optional pid) designates."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or folder")
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
        raise DumpError(f"{p}: neither a launches.jsonl nor pid<N>/ folders holding one")
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


# ------------------------------------------------------------------ raw JSON -> arrow
CHUNK = 48 << 20  # bytes of JSON per parse task; bounded memory, one task per core in flight


def _chunks(src: Path, warnings: list[str]):
    """Complete-line byte chunks of the (decompressed) launch file; drops a truncated last line."""
    name = src.name
    try:
        if name.endswith((".xz", ".gz", ".zst")):
            if name.endswith(".xz"):
                raw = lzma.decompress(src.read_bytes())
            else:
                codec = "gzip" if name.endswith(".gz") else "zstd"
                raw = pa.input_stream(str(src), compression=codec).read()
            fh = io.BytesIO(raw)
        else:
            fh = open(src, "rb")
    except (OSError, pa.ArrowException, lzma.LZMAError, EOFError) as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None
    rest = b""
    with fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            if cut:
                yield block[:cut]
    if rest.strip():
        warnings.append(f"dropped a truncated last line ({len(rest)} bytes)")


def _parse_chunk(data: bytes, warnings: list[str], src: Path):
    opts = pj.ParseOptions(explicit_schema=schema.LAUNCH_RECORD, unexpected_field_behavior="ignore")
    try:
        t = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(
            block_size=max(1 << 20, len(data) + 1), use_threads=False), parse_options=opts)
    except pa.ArrowInvalid:
        t = _slow_table(pa.py_buffer(data), opts, warnings, src)
    if t.num_rows == 0:
        return None
    n_params = pc.fill_null(pc.list_value_length(t.column("params")), 0)
    return t.drop_columns(["params"]).append_column("n_params", n_params), _param_frame(t)


def _read_frames(src: Path, warnings: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(os.cpu_count() or 1, 8))
    results, pending = [], []
    with ThreadPoolExecutor(workers) as pool:
        for data in _chunks(src, warnings):
            pending.append(pool.submit(_parse_chunk, data, warnings, src))
            if len(pending) > workers:
                results.append(pending.pop(0).result())
        results += [f.result() for f in pending]
    results = [r for r in results if r is not None]
    if not results:
        raise DumpError(f"{src}: holds no launch records")
    launches = _launch_frame(pa.concat_tables([r[0] for r in results]))
    params = pd.concat([r[1] for r in results], ignore_index=True) if len(results) > 1 else results[0][1]
    return launches, params


def _slow_table(buf: pa.Buffer, opts, warnings: list[str], src: Path) -> pa.Table:
    """Line-by-line fallback: keep every line the fast reader accepts on its own."""
    good, bad = [], 0
    for line in io.BytesIO(buf.to_pybytes()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "symbol" not in rec or "seq" not in rec:
                raise ValueError
            pj.read_json(io.BytesIO(line), parse_options=opts)
        except (ValueError, pa.ArrowException):
            bad += 1
            continue
        good.append(line)
    if bad:
        warnings.append(f"dropped {bad} unparsable line(s)")
    if not good:
        return pa.Table.from_pylist([], schema=schema.LAUNCH_RECORD)
    return pj.read_json(io.BytesIO(b"".join(good)), parse_options=opts)


# ------------------------------------------------------------------ hex decoding, vectorised
_LUT = np.zeros(256, np.uint8)
for _c in b"0123456789":
    _LUT[_c] = _c - 48
for _c in b"abcdef":
    _LUT[_c] = _c - 87
    _LUT[_c - 32] = _c - 87


def _fixed16_bytes(arr: pa.Array) -> np.ndarray:
    """(N, 8) bytes from N strings of exactly 16 hex characters."""
    arr = pa.array(arr) if not isinstance(arr, pa.Array) else arr
    n = len(arr)
    if n == 0:
        return np.zeros((0, 8), np.uint8)
    start = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset]
    chars = np.frombuffer(arr.buffers()[2], np.uint8)[start:start + 16 * n].reshape(n, 16)
    nib = _LUT[chars]
    return (nib[:, 0::2] << 4) | nib[:, 1::2]


def hex_le_u64(hexes: pa.Array) -> np.ndarray:
    """Little-endian value of the first 8 bytes of each memory-order hex string (null -> 0)."""
    s = pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(hexes, ""), 0, 16), 16, "0")
    return _fixed16_bytes(pc.cast(s, pa.string())).copy().view("<u8").ravel()


def hex_num_u64(nums: pa.Array) -> np.ndarray:
    """Value of each '0x...' string (null -> 0)."""
    s = pc.utf8_ltrim(pc.fill_null(nums, "0x0"), "0x")
    s = pc.utf8_lpad(pc.utf8_slice_codeunits(s, 0, 16), 16, "0")
    return _fixed16_bytes(pc.cast(s, pa.string())).copy().view(">u8").ravel().astype("<u8")


# ------------------------------------------------------------------ arrow -> frames
def _col(t: pa.Table, name: str) -> pa.ChunkedArray:
    return t.column(name)


def _dim(t: pa.Table, name: str, k: int) -> np.ndarray:
    arr = pc.list_element(pc.fill_null(_col(t, name), pa.scalar([1, 1, 1], pa.list_(pa.int64()))), k)
    return pc.fill_null(arr, 1).to_numpy()


def _launch_frame(t: pa.Table) -> pd.DataFrame:
    cols: dict[str, object] = {}
    for name in ("seq", "t_ns", "tid", "dev", "result", "smem", "module"):
        default = -1 if name == "module" else 0
        cols[name] = pc.fill_null(_col(t, name), default).to_numpy()
    graph = _col(t, "graph")
    cols["capture_id"] = pc.fill_null(pc.struct_field(graph, "capture_id"), -1).to_numpy()
    cols["regs"] = pc.fill_null(pc.struct_field(_col(t, "attrs"), "regs"), 0).to_numpy()
    for k, ax in enumerate("xyz"):
        cols[f"grid_{ax}"] = _dim(t, "grid", k)
        cols[f"block_{ax}"] = _dim(t, "block", k)
    cols["n_params"] = _col(t, "n_params").to_numpy()
    for name in ("stream", "api", "handle", "sha256", "symbol", "name", "layout", "packing"):
        cols[name] = pc.dictionary_encode(pc.fill_null(_col(t, name), "")).to_pandas()
    df = pd.DataFrame({c: cols[c] for c in schema.LAUNCH_COLUMNS})
    return df.astype(schema.LAUNCH_COLUMNS)


def _param_frame(t: pa.Table) -> pd.DataFrame:
    parts = []
    seqs = pc.fill_null(_col(t, "seq"), 0).to_numpy()
    row0 = 0
    for chunk in _col(t, "params").chunks:
        parts.append(_param_chunk(chunk, seqs[row0:row0 + len(chunk)]))
        row0 += len(chunk)
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in schema.PARAM_COLUMNS.items()})
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return df.astype(schema.PARAM_COLUMNS)


def _param_chunk(chunk: pa.ListArray, seqs: np.ndarray) -> pd.DataFrame:
    flat = pc.list_flatten(chunk)
    parent = pc.list_parent_indices(chunk).to_numpy()
    n = len(flat)
    size = pc.fill_null(pc.struct_field(flat, "size"), 0).to_numpy()
    hexes = pc.struct_field(flat, "hex")
    cols = {
        "seq": seqs[parent], "i": pc.fill_null(pc.struct_field(flat, "i"), -1).to_numpy(),
        "off": pc.fill_null(pc.struct_field(flat, "off"), 0).to_numpy(), "size": size,
        "at": np.zeros(n, np.int32), "word": np.zeros(n, bool), "value": hex_le_u64(hexes),
        "is_ptr": np.zeros(n, bool), "alloc_base": np.zeros(n, np.uint64),
        "alloc_size": np.zeros(n, np.int64), "buffer_id": np.full(n, -1, np.int64),
        "ptr_off": np.zeros(n, np.int64),
    }
    wide = pa.array(size > 8)
    cols["hex"] = pd.array(pc.if_else(wide, hexes, pa.scalar(None, pa.string())),
                           dtype=pd.ArrowDtype(pa.string()))
    ptrs = pc.struct_field(flat, "ptrs")
    pflat = pc.list_flatten(ptrs)
    if len(pflat) == 0:
        return pd.DataFrame(cols)
    owner = pc.list_parent_indices(ptrs).to_numpy()
    at = pc.fill_null(pc.struct_field(pflat, "at"), 0).to_numpy()
    base = hex_num_u64(pc.struct_field(pflat, "base"))
    asz = pc.fill_null(pc.struct_field(pflat, "size"), 0).to_numpy()
    bid = pc.fill_null(pc.struct_field(pflat, "id"), -1).to_numpy()
    poff = pc.fill_null(pc.struct_field(pflat, "off"), 0).to_numpy()
    first = at == 0
    o = owner[first]
    cols["is_ptr"][o] = True
    cols["alloc_base"][o] = base[first]
    cols["alloc_size"][o] = asz[first]
    cols["buffer_id"][o] = bid[first]
    cols["ptr_off"][o] = poff[first]
    rest = ~first
    if rest.any():
        o = owner[rest]
        words = {
            "seq": cols["seq"][o], "i": cols["i"][o], "off": cols["off"][o],
            "size": np.full(len(o), 8), "at": at[rest], "word": np.ones(len(o), bool),
            "value": base[rest] + poff[rest].astype(np.uint64), "is_ptr": np.ones(len(o), bool),
            "alloc_base": base[rest], "alloc_size": asz[rest], "buffer_id": bid[rest],
            "ptr_off": poff[rest],
            "hex": pd.array([None] * len(o), dtype=pd.ArrowDtype(pa.string())),
        }
        return pd.concat([pd.DataFrame(cols), pd.DataFrame(words)], ignore_index=True)
    return pd.DataFrame(cols)


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


# ------------------------------------------------------------------ cache + entry point
def _cache_paths(src: Path) -> tuple[Path, str]:
    st = src.stat()
    return src.parent / ".mine-cache", f"{src.name}-{st.st_size}-{st.st_mtime_ns}-v{schema.FRAME_VERSION}"


def _read_cache(src: Path):
    folder, key = _cache_paths(src)
    files = [folder / f"{key}.{part}.parquet" for part in ("launches", "params")]
    note = folder / f"{key}.warnings.json"
    if not all(f.is_file() for f in files) or not note.is_file():
        return None
    try:
        return (pd.read_parquet(files[0]), pd.read_parquet(files[1]), json.loads(note.read_text()))
    except (OSError, ValueError, pa.ArrowException):
        return None


def _write_cache(src: Path, launches: pd.DataFrame, params: pd.DataFrame, warnings: list[str]):
    folder, key = _cache_paths(src)
    try:
        folder.mkdir(exist_ok=True)
        for old in folder.glob(f"{src.name}-*"):
            old.unlink()
        launches.to_parquet(folder / f"{key}.launches.parquet", index=False)
        params.to_parquet(folder / f"{key}.params.parquet", index=False)
        (folder / f"{key}.warnings.json").write_text(json.dumps(warnings))
    except OSError:
        pass  # a read-only dump is still readable; it is just not cached


def load_dump(path: str | os.PathLike, pid: int | None = None, cache: bool = True) -> Dump:
    """Read the dump at `path` into frames (see the module docstring for accepted paths)."""
    src = resolve(path, pid)
    folder = src.parent
    warnings: list[str] = []
    meta = read_meta(folder)
    hit = _read_cache(src) if cache else None
    if hit is not None:
        launches, params, warnings = hit
    else:
        try:
            launches, params = _read_frames(src, warnings)
        except DumpError:
            if any("unparsable" in w for w in warnings):
                raise DumpError(f"{src}: holds no parsable launch record") from None
            raise
        order = np.argsort(launches["seq"].to_numpy(), kind="stable")
        if (np.diff(order) != 1).any():
            launches = launches.iloc[order].reset_index(drop=True)
        if cache:
            _write_cache(src, launches, params, warnings)
    if len(launches) == 0:
        raise DumpError(f"{src}: holds no launch records")
    modules = _module_frame(folder, warnings)
    name = folder.name
    pid_v = meta.get("pid") or (int(name[3:]) if name.startswith("pid") and name[3:].isdigit() else None)
    return Dump(launches, params, modules, meta, src, pid_v, warnings)
