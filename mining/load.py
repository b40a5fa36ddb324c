"""Load a dump (docs/dump-format.md, format_version 1) into the canonical frames.

Why: every analysis in `mining/` works on three frames (launches, params in long form, modules;
columns declared in `schema.py`), so the expensive part -- parsing up to millions of JSON lines --
happens once, here: pyarrow's JSON reader on one chunk of lines per worker thread, each chunk turned
into its frame columns on the spot (see "raw JSON -> arrow" below), and the result is cached as
parquet next to the dump (`<pid dir>/.mine-cache/`, keyed on the source's size, mtime and
FRAME_VERSION).

Accepted paths: a `pid<N>/` folder, a whole dump folder (the pid with the most launches unless
`pid=` picks one), or a bare `launches.jsonl` (plain, .gz, .xz or .zst).

Damage is tolerated, not hidden: a truncated last line or unparsable lines are dropped and each
drop is reported in `Dump.warnings`; missing cubins are flagged per module. NUL bytes (the mmap
writer's preallocated tail, or a record in flight when the process died) follow the reader rule of
docs/dump-format.md "Writers": of each line only the bytes after its last NUL count; chunks without
a NUL never pay for it. What is refused
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
from mining.allocs import Offline, classify_words, disagreements, intervals, read_alloc_log
from mining.archive import unpack
from mining.functions import FUNCTIONS, Functions, expand, read_functions


class DumpError(ValueError):
    """A dump that cannot be read; the message is one sentence naming the path."""


META_KEYS = {"format_version", "pid", "ppid", "argv", "start_ns", "start_unix_ns",
             "driver_version", "cupti_version", "devices", "options", "counters", "end_ns",
             "disabled"}
ALLOC_LOG = "allocs.jsonl"
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
# How a cold load stays inside its budget (1 M launches, 1.2 GB of JSON: < 10 s, < 2 GB peak RSS
# on 2 cores; benchmarks/bench_load.py): the file is cut into complete-line chunks read without
# extra copies; each chunk is parsed by pyarrow's JSON reader on a worker thread (it releases the
# GIL) and turned, on that worker, straight into compact column parts in their final dtypes (the
# arrow table is dropped before the next chunk is taken). Only `workers + 1` raw chunks are in
# flight. At the end each column is concatenated once, freeing its parts as it goes, so the frames
# are never held twice; the parquet cache is written from those same buffers (zero-copy).
CHUNK = 16 << 20  # bytes of JSON per parse task
BLOCK = 4 << 20   # pyarrow block size inside a task (smaller blocks parse faster than one big one)


def _chunks(src: Path, warnings: list[str]):
    """Complete-line byte chunks of the (decompressed) launch file; drops a truncated last line."""
    name = src.name
    try:
        if name.endswith(".xz"):
            fh = lzma.open(src, "rb")
        elif name.endswith((".gz", ".zst")):
            fh = pa.input_stream(str(src), compression="gzip" if name.endswith(".gz") else "zstd")
        else:
            fh = open(src, "rb")
    except (OSError, pa.ArrowException, lzma.LZMAError, EOFError) as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None
    seekable = not name.endswith((".xz", ".gz", ".zst"))
    rest = b""
    try:
        with fh:
            while True:
                new = fh.read(CHUNK)
                if not new:
                    break
                block = rest + new if rest else new
                rest = b""
                cut = block.rfind(b"\n") + 1
                if not cut:             # no line end yet (a huge line): carry the bytes over
                    rest = block
                    continue
                tail = len(block) - cut
                if tail and seekable and len(new) == CHUNK:
                    fh.seek(-tail, os.SEEK_CUR)  # re-read the partial line with the next chunk
                elif tail:
                    rest = block[cut:]
                # a view, not a copy: the worker parses the bytes in place
                yield memoryview(block)[:cut] if tail else block
                del block, new
    except (OSError, pa.ArrowException, lzma.LZMAError, EOFError) as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None
    head, _, rest = rest.rpartition(b"\0")   # the mmap writer's NUL padding is not a record
    if head.strip(b"\0").strip():            # but a record cut short by it was one
        warnings.append("dropped 1 record(s) lost to NUL bytes (a writer died mid-record)")
    if rest.strip():
        warnings.append(f"dropped a truncated last line ({len(rest)} bytes)")


def _read_schema() -> pa.Schema:
    """schema.LAUNCH_RECORD cut down to the keys the frames are built from.

    Keys outside it (ctx, func, launch_attrs, extra_hex, most of attrs) are skipped by the reader
    without being converted or type-checked: ~10 % less parse time, and a launch is no longer
    dropped for a malformed key that no frame column comes from.
    """
    sub = {"graph": {"capture_id"}, "attrs": {"regs"}}
    keep = set(_LAUNCH_INTS) | set(_LAUNCH_STRS) | {"grid", "block", "params", "fn"} | set(sub)
    fields = []
    for f in schema.LAUNCH_RECORD:
        if f.name in sub:
            f = pa.field(f.name, pa.struct([s for s in f.type if s.name in sub[f.name]]))
        if f.name in keep:
            fields.append(f)
    return pa.schema(fields)


def _parse_chunk(data, warnings: list[str], src: Path, offline: Offline | None = None,
                 fns: Functions | None = None):
    """Chunk of complete lines -> (its bytes, (launch column parts, param column parts) or None)."""
    opts = pj.ParseOptions(explicit_schema=_READ_SCHEMA, unexpected_field_behavior="ignore")
    nbytes = len(data)
    if _has_nul(data):
        data = _drop_nuls(data, warnings)
        if not data:
            return nbytes, None
    buf = pa.py_buffer(data)
    try:
        t = pj.read_json(pa.BufferReader(buf), read_options=pj.ReadOptions(
            block_size=BLOCK, use_threads=False), parse_options=opts)
    except pa.ArrowInvalid:
        t = _slow_table(buf, opts, warnings, src)
    del buf, data
    t, lay = expand(t, fns)  # compact launches: per-function columns and param off/size joined in
    if t.num_rows == 0:
        return nbytes, None
    return nbytes, (_launch_part(t), _param_part(t, offline, lay))


def _has_nul(data) -> bool:
    """memchr over the chunk (a bytes object or a view of one), without copying it."""
    if isinstance(data, memoryview):
        return data.obj.find(b"\0", 0, len(data)) >= 0
    return b"\0" in data


def _drop_nuls(data, warnings: list[str]) -> bytes:
    """The reader rule for NUL bytes: split on newlines, keep each line's bytes after its last NUL,
    skip what is left empty. Every complete line holding a NUL stood for a record that was in flight
    when the writer died (cut short, or reserved and never written, its NULs maybe glued in front of
    the next record); they are counted in one warning. The unterminated NUL padding after the last
    record never reaches here (`_chunks` drops it)."""
    out, lost = [], 0
    for line in bytes(data).split(b"\n"):
        head, nul, tail = line.rpartition(b"\0")
        lost += bool(nul)
        if tail.strip():
            out.append(tail)
    if lost:
        warnings.append(f"dropped {lost} record(s) lost to NUL bytes (a writer died mid-record)")
    return b"\n".join(out) + b"\n" if out else b""


def _read_frames(src: Path, warnings: list[str], offline: Offline | None = None,
                 fns: Functions | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(os.cpu_count() or 1, 8))
    size = src.stat().st_size
    plain = not src.name.endswith((".xz", ".gz", ".zst"))
    launches = _Columns(schema.LAUNCH_COLUMNS)
    params = _Columns(schema.PARAM_COLUMNS)
    done = 0  # input bytes whose parts have been appended

    def take(fut) -> None:
        nonlocal done
        nbytes, res = fut.result()
        done += nbytes
        if res is None:
            return
        if not launches.cap:   # first parsed chunk: size the columns for the whole file
            total = size if plain else 8 * size
            launches.reserve(len(res[0]["seq"]) * total / done)
            params.reserve(len(res[1]["seq"]) * total / done)
        launches.append(res[0])
        params.append(res[1])

    pending: list = []
    with ThreadPoolExecutor(workers) as pool:
        for data in _chunks(src, warnings):
            pending.append(pool.submit(_parse_chunk, data, warnings, src, offline, fns))
            del data
            while len(pending) > workers:
                take(pending.pop(0))
        while pending:
            take(pending.pop(0))
    if not launches.n:
        raise DumpError(f"{src}: holds no launch records")
    return launches.frame(), params.frame()


def _slow_table(buf: pa.Buffer, opts, warnings: list[str], src: Path) -> pa.Table:
    """Line-by-line fallback: keep every line the fast reader accepts on its own."""
    good, bad = [], 0
    for line in io.BytesIO(buf.to_pybytes()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or ("symbol" not in rec and "fn" not in rec) or "seq" not in rec:
                raise ValueError
            pj.read_json(io.BytesIO(line), parse_options=opts)
        except (ValueError, pa.ArrowException):
            bad += 1
            continue
        good.append(line)
    if bad:
        warnings.append(f"dropped {bad} unparsable line(s)")
    if not good:
        return pa.Table.from_pylist([], schema=opts.explicit_schema)
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


def hex_le_u64(hexes) -> np.ndarray:
    """Little-endian value of the first 8 bytes of each memory-order hex string (null -> 0)."""
    s = pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(hexes, ""), 0, 16), 16, "0")
    return _fixed16_bytes(_one_chunk(pc.cast(s, pa.string()))).copy().view("<u8").ravel()


def hex_num_u64(nums) -> np.ndarray:
    """Value of each '0x...' string (null -> 0)."""
    s = pc.utf8_ltrim(pc.fill_null(nums, "0x0"), "0x")
    s = pc.utf8_lpad(pc.utf8_slice_codeunits(s, 0, 16), 16, "0")
    raw = _fixed16_bytes(_one_chunk(pc.cast(s, pa.string())))
    return raw.copy().view(">u8").ravel().astype("<u8")


def _one_chunk(arr):
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


# ------------------------------------------------------------------ arrow -> column parts
# A part is a dict column -> numpy array (already in the frame's dtype) or, for string columns,
# an arrow array (dictionary-encoded for the launch frame's categories). Parts are built on the
# workers; `_Columns` gathers them, in file order, into the frames.
_LAUNCH_INTS = {"seq": 0, "t_ns": 0, "tid": 0, "dev": 0, "result": 0, "smem": 0, "module": -1}
_LAUNCH_STRS = ("stream", "api", "handle", "sha256", "symbol", "name", "layout", "packing")
_DIM_DEFAULT = pa.scalar([1, 1, 1], pa.list_(pa.int64()))
_READ_SCHEMA = _read_schema()


def _np(arr, dtype: str) -> np.ndarray:
    """A null-free int/bool arrow array -> numpy in `dtype` (one copy at most)."""
    return np.asarray(_one_chunk(arr).to_numpy(zero_copy_only=False), dtype=dtype)


def _launch_part(t: pa.Table) -> dict:
    L = schema.LAUNCH_COLUMNS
    cols: dict[str, object] = {}
    for name, default in _LAUNCH_INTS.items():
        cols[name] = _np(pc.fill_null(t.column(name), default), L[name])
    cols["capture_id"] = _np(pc.fill_null(pc.struct_field(t.column("graph"), "capture_id"), -1),
                             L["capture_id"])
    cols["regs"] = _np(pc.fill_null(pc.struct_field(t.column("attrs"), "regs"), 0), L["regs"])
    for name in ("grid", "block"):
        dims = pc.fill_null(t.column(name), _DIM_DEFAULT)
        for k, ax in enumerate("xyz"):
            cols[f"{name}_{ax}"] = _np(pc.fill_null(pc.list_element(dims, k), 1), L[f"{name}_{ax}"])
    cols["n_params"] = _np(pc.fill_null(pc.list_value_length(t.column("params")), 0), L["n_params"])
    for name in _LAUNCH_STRS:
        cols[name] = _one_chunk(pc.dictionary_encode(pc.fill_null(t.column(name), "")))
    return cols


def _param_part(t: pa.Table, offline: Offline | None = None, lay=None) -> dict:
    seqs = pc.fill_null(t.column("seq"), 0).to_numpy()
    params = _one_chunk(t.column("params"))
    return _param_chunk(params, seqs, offline, lay)


def _hex_words(hexes, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every whole 8-byte word of every parameter (as the capture classifies them: at 0, 8, ...
    below `size`, where the hex has the bytes): owner row, byte offset, little-endian value."""
    arr = _one_chunk(pc.fill_null(hexes, ""))
    n = len(arr)
    offs = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None \
        else np.zeros(0, np.uint8)
    nw = np.minimum(np.asarray(size, np.int64) // 8, np.diff(offs) // 16).clip(0)
    total = int(nw.sum())
    owner = np.repeat(np.arange(n, dtype=np.int64), nw)
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(nw) - nw, nw)
    chars = data[(offs[owner] + 16 * j)[:, None] + np.arange(16)]
    nib = _LUT[chars]
    raw = (nib[:, 0::2] << 4) | nib[:, 1::2]
    return owner, 8 * j, raw.copy().view("<u8").ravel()


_NULL_STR = pa.scalar(None, pa.string())


def _param_chunk(chunk: pa.ListArray, seqs: np.ndarray, offline: Offline | None = None,
                 lay=None) -> dict:
    """Long-form rows of one chunk: one per parameter, each followed by its inner pointer words.
    `lay`: (off, size) per parameter when they come from functions.jsonl (compact form)."""
    P = schema.PARAM_COLUMNS
    flat = pc.list_flatten(chunk)
    parent = pc.list_parent_indices(chunk).to_numpy()
    n = len(flat)
    size = pc.fill_null(pc.struct_field(flat, "size"), 0).to_numpy() if lay is None else lay[1]
    hexes = pc.struct_field(flat, "hex")
    cols = {
        "seq": seqs[parent].astype(P["seq"], copy=False),
        "i": _np(pc.fill_null(pc.struct_field(flat, "i"), -1), P["i"]),
        "off": (_np(pc.fill_null(pc.struct_field(flat, "off"), 0), P["off"]) if lay is None
                else lay[0].astype(P["off"])),
        "size": size.astype(P["size"]),
        "at": np.zeros(n, P["at"]), "word": np.zeros(n, bool), "value": hex_le_u64(hexes),
        "is_ptr": np.zeros(n, bool), "alloc_base": np.zeros(n, np.uint64),
        "alloc_size": np.zeros(n, np.int64), "buffer_id": np.full(n, -1, np.int64),
        "ptr_off": np.zeros(n, np.int64),
        "hex": _one_chunk(pc.if_else(pa.array(size > 8), hexes, _NULL_STR)),
    }
    del parent
    ptrs = pc.struct_field(flat, "ptrs")
    pflat = pc.list_flatten(ptrs)
    rec = None
    if len(pflat):
        rec = {"owner": pc.list_parent_indices(ptrs).to_numpy(),
               "at": pc.fill_null(pc.struct_field(pflat, "at"), 0).to_numpy(),
               "base": hex_num_u64(pc.struct_field(pflat, "base")),
               "size": pc.fill_null(pc.struct_field(pflat, "size"), 0).to_numpy(),
               "id": pc.fill_null(pc.struct_field(pflat, "id"), -1).to_numpy(),
               "off": pc.fill_null(pc.struct_field(pflat, "off"), 0).to_numpy()}
    if offline is not None and (rec is None or offline.mode == "check"):
        w_owner, w_at, w_val = _hex_words(hexes, size)
        off = classify_words(offline.iv, cols["seq"][w_owner], w_val, w_at, w_owner)
        del w_owner, w_at, w_val
        if offline.mode == "check":
            empty = {k: np.zeros(0, np.uint64 if k == "base" else np.int64) for k in off}
            offline.disagree.append(disagreements(rec if rec is not None else empty, off))
        else:
            rec = off
    del size
    if rec is None or len(rec["owner"]) == 0:
        return cols
    owner, at, base, asz, bid, poff = (rec[k] for k in ("owner", "at", "base", "size", "id", "off"))
    del rec
    first = at == 0
    o = owner[first]
    cols["is_ptr"][o] = True
    cols["alloc_base"][o] = base[first]
    cols["alloc_size"][o] = asz[first]
    cols["buffer_id"][o] = bid[first]
    cols["ptr_off"][o] = poff[first]
    rest = ~first
    if not rest.any():
        return cols
    o = owner[rest]
    m = len(o)
    words = {
        "seq": cols["seq"][o], "i": cols["i"][o], "off": cols["off"][o],
        "size": np.full(m, 8, P["size"]), "at": at[rest].astype(P["at"]), "word": np.ones(m, bool),
        "value": base[rest] + poff[rest].astype(np.uint64), "is_ptr": np.ones(m, bool),
        "alloc_base": base[rest], "alloc_size": asz[rest], "buffer_id": bid[rest],
        "ptr_off": poff[rest],
    }
    # Each parameter's word rows go right after it (rows in launch, i, at order), so the row order
    # depends on the file only, not on how it was cut into chunks. `o` is non-decreasing: parameter
    # j moves down by the words owned by parameters before it; word r lands after its owner and
    # the r words before it.
    ppos = np.arange(n) + np.searchsorted(o, np.arange(n), side="left")
    wpos = o + 1 + np.arange(m)
    for c, w in words.items():
        out = np.empty(n + m, P[c])
        out[ppos] = cols[c]
        out[wpos] = w
        cols[c] = out
    take = np.empty(n + m, np.int64)
    take[ppos] = np.arange(n)
    take[wpos] = -1
    cols["hex"] = cols["hex"].take(pa.array(take, mask=take < 0))
    return cols


# ------------------------------------------------------------------ column parts -> frames
class _Columns:
    """Appends parts, in file order, into one preallocated numpy array per numeric column.

    The arrays are reserved for the whole file from the first chunk's rows per byte (+25 %); pages
    never written are never resident, so over-reserving costs address space, not memory, and each
    part is copied once and freed at once (no end-of-load concatenation holding everything twice).
    An underestimate (a file whose tail is denser) grows the arrays by half again.
    String columns stay arrow chunks: dictionary-encoded (categories) or plain (`hex`).
    """

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = dtypes
        self.num = {c: np.dtype(d) for c, d in dtypes.items()
                    if d not in ("category", "string[pyarrow]")}
        self.arrs: dict[str, np.ndarray] = {}
        self.strs: dict[str, list] = {c: [] for c in dtypes if c not in self.num}
        self.n = self.cap = 0

    def reserve(self, rows: float) -> None:
        cap = int(rows * 1.25) + 4096
        if cap <= self.cap:
            return
        for c, dt in self.num.items():
            new = np.empty(cap, dt)
            if self.n:
                new[:self.n] = self.arrs[c][:self.n]
            self.arrs[c] = new
        self.cap = cap

    def append(self, part: dict) -> None:
        m = len(part["seq"])
        if self.n + m > self.cap:
            self.reserve(max(self.n + m, self.cap * 1.5) / 1.25)
        for c, arr in self.arrs.items():
            arr[self.n:self.n + m] = part.pop(c)
        for c, chunks in self.strs.items():
            chunks.append(part.pop(c))
        self.n += m

    def frame(self) -> pd.DataFrame:
        cols: dict[str, object] = {}
        for c, dtype in self.dtypes.items():
            if c in self.num:
                cols[c] = self.arrs[c][:self.n]
            elif dtype == "category":   # dictionary chunks -> one pandas Categorical
                codes = pa.chunked_array(self.strs[c]).unify_dictionaries()
                cols[c] = pd.Categorical(codes.to_pandas())
            else:
                cols[c] = pd.array(pa.chunked_array(self.strs[c], pa.string()), dtype=dtype)
        self.arrs, self.strs = {}, {}
        return pd.DataFrame(cols, copy=False)


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
        # lz4 without dictionary pages for the numeric params: the fastest write and read of the
        # codecs measured (benchmarks/bench_load.py); arrow wraps the frames' buffers, no copy.
        launches.to_parquet(folder / f"{key}.launches.parquet", index=False, compression="lz4")
        params.to_parquet(folder / f"{key}.params.parquet", index=False, compression="lz4",
                          use_dictionary=False)
        (folder / f"{key}.warnings.json").write_text(json.dumps(warnings))
    except OSError:
        pass  # a read-only dump is still readable; it is just not cached


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
    hit = _read_cache(src) if cache else None
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
            launches, params = _read_frames(src, warnings, offline, no_fns)
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
            _write_cache(src, launches, params, warnings)
    if len(launches) == 0:
        raise DumpError(f"{src}: holds no launch records")
    modules = _module_frame(folder, warnings)
    name = folder.name
    pid_v = meta.get("pid") or (int(name[3:]) if name.startswith("pid") and name[3:].isdigit() else None)
    return Dump(launches, params, modules, meta, src, pid_v, warnings, allocs)
