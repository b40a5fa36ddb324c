"""Read a launch file (launches.jsonl, plain or .gz/.xz/.zst) into the launches and params frames.

Why: parsing up to millions of JSON lines is the expensive part of loading a dump, so it is done
once, in parallel and without holding the data twice: the file is cut into complete-line chunks,
each parsed by pyarrow's JSON reader on a worker thread and turned there into frame column parts
(`mining/frames.py`), gathered in file order into the two frames (`gather`, shared with the
binary reader, mining/binload.py). `mining/load.py` calls `read_frames` and owns the chunk size
(`mining.load.CHUNK`), passed in as `chunk`.

The reader: only the keys the frames are built from are parsed (`frames.READ_SCHEMA`); compact
launches (`fn`) are joined with functions.jsonl per chunk (`mining/functions.py`, `expand`). A chunk
the fast reader rejects is re-read line by line (`_slow_table`): lines that are not JSON objects
with `seq` and `symbol` or `fn`, or that the fast reader refuses on their own, are dropped and
counted in one warning.

Damage is tolerated, not hidden (each drop is a line in `warnings`): a truncated last line, and
NUL bytes (the mmap writer's preallocated tail, or a record in flight when the process died)
following the reader rule of docs/dump-format.md "Writers": of each line only the bytes after its
last NUL count; chunks without a NUL never pay for it. Refused (`DumpError`): a file that cannot be
opened or decompressed, and one that yields no launch record.
Not checked: that `seq` is gap-free or that records are in time order (`load_dump` sorts by seq).
"""

from __future__ import annotations

import io
import json
import lzma
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.json as pj

from mining import schema
from mining.allocs import Offline
from mining.errors import DumpError
from mining.frames import READ_SCHEMA, Columns, launch_part, param_part
from mining.functions import Functions, expand


# How a cold load stays inside its budget (1 M launches, 1.2 GB of JSON: < 10 s, < 2 GB peak RSS
# on 2 cores; benchmarks/bench_load.py): the file is cut into complete-line chunks read without
# extra copies; each chunk is parsed by pyarrow's JSON reader on a worker thread (it releases the
# GIL) and turned, on that worker, straight into compact column parts in their final dtypes (the
# arrow table is dropped before the next chunk is taken). Only `workers + 1` raw chunks are in
# flight. At the end each column is concatenated once, freeing its parts as it goes, so the frames
# are never held twice; the parquet cache is written from those same buffers (zero-copy).
BLOCK = 4 << 20   # pyarrow block size inside a task (smaller blocks parse faster than one big one)


def _chunks(src: Path, warnings: list[str], chunk: int):
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
                new = fh.read(chunk)
                if not new:
                    break
                block = rest + new if rest else new
                rest = b""
                cut = block.rfind(b"\n") + 1
                if not cut:             # no line end yet (a huge line): carry the bytes over
                    rest = block
                    continue
                tail = len(block) - cut
                if tail and seekable and len(new) == chunk:
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


def _parse_chunk(data, warnings: list[str], src: Path, offline: Offline | None = None,
                 fns: Functions | None = None):
    """Chunk of complete lines -> (its bytes, (launch column parts, param column parts) or None)."""
    opts = pj.ParseOptions(explicit_schema=READ_SCHEMA, unexpected_field_behavior="ignore")
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
    return nbytes, (launch_part(t), param_part(t, offline, lay))


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


def read_frames(src: Path, warnings: list[str], offline: Offline | None = None,
                fns: Functions | None = None, *, chunk: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The launch file -> (launches, params) frames; `chunk` bytes of JSON per parse task."""
    size = src.stat().st_size
    plain = not src.name.endswith((".xz", ".gz", ".zst"))
    return gather(_chunks(src, warnings, chunk),
                  lambda data: _parse_chunk(data, warnings, src, offline, fns),
                  size if plain else 8 * size, src)


def gather(tasks, parse, total: int, src: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs `parse(task) -> (input bytes, (launch parts, param parts) or None)` on worker threads,
    at most `workers + 1` tasks in flight, and appends the parts in task order into the frames.
    `total`: the input's bytes, to size the columns from the first part (also the binary reader's)."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(os.cpu_count() or 1, 8))
    launches = Columns(schema.LAUNCH_COLUMNS)
    params = Columns(schema.PARAM_COLUMNS)
    done = 0  # input bytes whose parts have been appended

    def take(fut) -> None:
        nonlocal done
        nbytes, res = fut.result()
        done += nbytes
        if res is None:
            return
        if not launches.cap:   # first parsed chunk: size the columns for the whole file
            launches.reserve(len(res[0]["seq"]) * total / done)
            params.reserve(len(res[1]["seq"]) * total / done)
        launches.append(res[0])
        params.append(res[1])

    pending: list = []
    with ThreadPoolExecutor(workers) as pool:
        for task in tasks:
            pending.append(pool.submit(parse, task))
            del task
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
