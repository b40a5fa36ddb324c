"""Read a launch file (launches.jsonl, plain or .gz/.xz/.zst) into the launches and params frames.

Why: parsing up to millions of JSON lines is the expensive part of loading a dump, so it is done
once, in parallel and without holding the data twice: the file is cut into complete-line chunks,
each parsed by pyarrow's JSON reader on a worker thread and turned there into frame column parts
(`mining/frames.py`), gathered in file order into the two frames (`gather`, shared with the
binary reader, mining/binload.py). `mining/load.py` calls `read_frames` and owns the chunk size
(`mining.load.CHUNK`), passed in as `chunk`.

The reader: only the keys the frames are built from are parsed (`frames.READ_SCHEMA`); compact
launches (`fn`) are joined with functions.jsonl per chunk (`mining/functions.py`, `expand`). A chunk
the fast reader rejects is bisected down to the lines it refuses on their own (`_read_lines`);
those, and records with a field outside its documented range (`frames.valid_rows`: no `seq`, neither
`symbol` nor `fn`, a number a dtype of the frames cannot hold, a shape the driver would refuse for a
launch it accepted) or a seq an earlier line of the chunk had (a duplicated line), are dropped,
counted in one warning, and reported with their byte ranges (`mining/damage.py`).

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

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from mining import schema
from mining.allocs import Offline
from mining.damage import FileReport
from mining.errors import DumpError
from mining.frames import READ_SCHEMA, Columns, launch_part, param_part, valid_rows
from mining.functions import Functions, expand


# How a cold load stays inside its budget (1 M launches, 1.2 GB of JSON: < 10 s, < 2 GB peak RSS
# on 2 cores; benchmarks/bench_load.py): the file is cut into complete-line chunks read without
# extra copies; each chunk is parsed by pyarrow's JSON reader on a worker thread (it releases the
# GIL) and turned, on that worker, straight into compact column parts in their final dtypes (the
# arrow table is dropped before the next chunk is taken). Only `workers + 1` raw chunks are in
# flight. At the end each column is concatenated once, freeing its parts as it goes, so the frames
# are never held twice; the parquet cache is written from those same buffers (zero-copy).
BLOCK = 4 << 20   # pyarrow block size inside a task (smaller blocks parse faster than one big one)


def _chunks(src: Path, warnings: list[str], chunk: int, rep: FileReport):
    """(offset, complete-line byte chunk) of the (decompressed) launch file; drops a truncated
    last line (reported in `rep`)."""
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
    pos = 0   # file offset of the next byte yielded
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
                yield pos, (memoryview(block)[:cut] if tail else block)
                pos += cut
                del block, new
    except (OSError, pa.ArrowException, lzma.LZMAError, EOFError) as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None
    head, _, last = rest.rpartition(b"\0")   # the mmap writer's NUL padding is not a record
    if head.strip(b"\0").strip():            # but a record cut short by it was one
        warnings.append("dropped 1 record(s) lost to NUL bytes (a writer died mid-record)")
        rep.skip(pos, pos + len(head) + 1, "NUL bytes (a record in flight when the writer died)")
    if last.strip():
        warnings.append(f"dropped a truncated last line ({len(last)} bytes)")
        rep.skip(pos + len(rest) - len(last), pos + len(rest), "truncated last line (the writer died mid-record)")


_OPTS = pj.ParseOptions(explicit_schema=READ_SCHEMA, unexpected_field_behavior="ignore")


def _parse_chunk(task, warnings: list[str], src: Path, offline: Offline | None = None,
                 fns: Functions | None = None, parts: dict | None = None):
    """(offset, chunk of complete lines) -> (its bytes, (launch column parts, param column parts)
    or None); what was skipped goes into parts[offset] (a FileReport of this chunk)."""
    base, data = task
    rep = FileReport("")
    if parts is not None:
        parts[base] = rep
    nbytes = len(data)
    info = None
    if _has_nul(data):
        info, data = _drop_nuls(data, warnings, base, rep)
    if not data:
        rep.flush()
        return nbytes, None
    t = _read_lines((base, info, data), warnings, rep)
    rep.flush()
    rep.read += t.num_rows
    del data
    t, lay = expand(t, fns)  # compact launches: per-function columns and param off/size joined in
    if t.num_rows == 0:
        return nbytes, None
    return nbytes, (launch_part(t), param_part(t, offline, lay))


def _has_nul(data) -> bool:
    """memchr over the chunk (a bytes object or a view of one), without copying it."""
    if isinstance(data, memoryview):
        return data.obj.find(b"\0", 0, len(data)) >= 0
    return b"\0" in data


def _drop_nuls(data, warnings: list[str], base: int, rep: FileReport):
    """The reader rule for NUL bytes: split on newlines, keep each line's bytes after its last NUL,
    skip what is left empty. A complete line of NULs (and text before them) stood for a record that
    was in flight when the writer died: one lost record. A line whose text after the last NUL
    still parses is that record plus a lost one glued in front of it (counted once it parsed);
    one whose text does not parse is one damaged record (`_read_lines` reports the whole line).
    The unterminated NUL padding after the last record never reaches here (`_chunks` drops it).
    Returns ((line start, line end, NUL prefix end or -1) per kept line, the kept texts joined)."""
    out, starts, ends, glue, lost, pos = [], [], [], [], 0, base
    for line in bytes(data).split(b"\n"):
        head, nul, tail = line.rpartition(b"\0")
        lost += bool(nul)
        if tail.strip():
            out.append(tail)
            starts.append(pos)
            ends.append(pos + len(line) + 1)
            glue.append(pos + len(head) + 1 if nul else -1)
        elif nul:
            rep.defer(pos, pos + len(line) + 1, "NUL bytes (a record in flight when the writer died)")
        pos += len(line) + 1
    if lost:
        warnings.append(f"dropped {lost} record(s) lost to NUL bytes (a writer died mid-record)")
    info = (np.array(starts, np.int64), np.array(ends, np.int64), np.array(glue, np.int64))
    return info, (b"\n".join(out) + b"\n" if out else b"")


def read_frames(src: Path, warnings: list[str], offline: Offline | None = None,
                fns: Functions | None = None, *, chunk: int,
                report: FileReport | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The launch file -> (launches, params) frames; `chunk` bytes of JSON per parse task. What
    was skipped is added to `report` (per chunk, merged in file order)."""
    size = src.stat().st_size
    plain = not src.name.endswith((".xz", ".gz", ".zst"))
    rep = report if report is not None else FileReport(src.name)
    parts: dict[int, FileReport] = {}
    tail = FileReport("")
    try:
        return gather(_chunks(src, warnings, chunk, tail),
                      lambda task: _parse_chunk(task, warnings, src, offline, fns, parts),
                      size if plain else 8 * size, src)
    finally:
        for k in sorted(parts):
            rep.merge(parts[k])
        rep.merge(tail)


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


def _launch_ok(t: pa.Table) -> np.ndarray:
    return valid_rows(t) & _first_seq(t)


def _read_lines(data, warnings: list[str], rep: FileReport, opts=None, valid=_launch_ok,
                what: str = "launch record(s)") -> pa.Table:
    """The records of (base, line offsets or None, complete lines) that parse and whose fields lie
    in their documented ranges (`frames.valid_rows`), and whose seq no earlier line of the chunk
    had, as one arrow table; the rest is reported.

    Fast path: one pyarrow read of the whole chunk and one vectorised range check. Only a chunk
    with damage pays more: the lines are located (one newline search), a chunk the reader refuses
    is bisected down to the lines it refuses on their own (a handful of reads per bad line), and
    a record outside its ranges is dropped by its row (rows follow the non-blank lines)."""
    base, info, buf = data
    opts = opts or _OPTS
    t = None
    if _starts_with_object(buf):   # pyarrow 26's JSON reader crashes on input that starts otherwise
        try:
            t = pj.read_json(pa.BufferReader(pa.py_buffer(buf)), read_options=pj.ReadOptions(
                block_size=BLOCK, use_threads=False), parse_options=opts)
            t.validate(full=True)   # the JSON reader lets invalid UTF-8 into strings (~1 ms per 16 MB)
        except pa.ArrowInvalid:
            t = None
    if t is not None:
        ok = valid(t)
        if ok.all():
            if info is not None:
                _glued(info, np.arange(len(info[0])), rep)
            return t
    fs, fe, rel = _spans(buf, base, info)
    if t is not None and len(fs) == t.num_rows:
        lines = np.arange(t.num_rows)
    else:   # the lines that are JSON objects, read in runs; a run the reader refuses is bisected
        mv = memoryview(buf) if not isinstance(buf, memoryview) else buf
        ln = fe - fs   # bytes of each line with its newline
        obj = _object_lines(buf, rel)
        for k in np.flatnonzero(obj).tolist():   # syntax first (json: ~20 us a line, the reader ~1 ms a call)
            obj[k] = _is_object(bytes(mv[rel[k]:rel[k] + ln[k]]))
        parts, idx, bad = [], [], 0

        def take(lo: int, hi: int) -> None:
            nonlocal bad
            if lo >= hi:
                return
            piece = bytes(mv[rel[lo]:rel[hi - 1] + ln[hi - 1]])
            try:
                if not obj[lo:hi].all():   # not handed to the reader (see _starts_with_object)
                    raise pa.ArrowInvalid("a line that is not a JSON object")
                part = pj.read_json(io.BytesIO(piece), parse_options=opts)
                part.validate(full=True)
                if part.num_rows != hi - lo:
                    raise pa.ArrowInvalid("rows and lines differ")
            except pa.ArrowInvalid:
                if hi - lo == 1:
                    rep.defer(int(fs[lo]), int(fe[lo]), "not a JSON record of the documented types")
                    bad += 1
                    return
                mid = (lo + hi) // 2
                take(lo, mid)
                take(mid, hi)
                return
            parts.append(part)
            idx.append(np.arange(lo, hi))

        edges = np.flatnonzero(np.diff(np.concatenate([[0], obj.astype(np.int8), [0]])))
        for lo in np.flatnonzero(~obj).tolist():   # each line that is no JSON object: one record
            take(lo, lo + 1)
        for lo, hi in zip(edges[0::2].tolist(), edges[1::2].tolist()):   # runs, in file order
            take(lo, hi)
        if bad:
            warnings.append(f"dropped {bad} unparsable line(s)")
        t = pa.concat_tables(parts) if parts else pa.Table.from_pylist([], schema=opts.explicit_schema)
        lines = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    ok = valid(t)
    if info is not None:
        _glued(info, lines[ok], rep)
    if ok.all():
        return t
    for k in lines[~ok].tolist():
        rep.defer(int(fs[k]), int(fe[k]), "a field outside its documented range, or a seq an earlier "
                  "line had")
    warnings.append(f"dropped {int((~ok).sum())} {what} with a field outside its documented "
                    f"range or a seq an earlier line had")
    return t.filter(pa.array(ok))


def read_lines_file(name: str, data: bytes, opts, valid, warnings: list[str], what: str):
    """A whole small JSON-lines side file (allocs.jsonl) read like a launch chunk: the NUL rule, a
    truncated last line, then `_read_lines` with that file's schema and range check `valid`.
    Returns (table, FileReport)."""
    rep = FileReport(name)
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    if tail.rpartition(b"\0")[2].strip():
        warnings.append(f"{name}: dropped a truncated last line ({len(tail)} bytes)")
        rep.defer(cut, len(data), "truncated last line (the writer died mid-record)")
    body = data[:cut]
    info = None
    if b"\0" in body:
        info, body = _drop_nuls(body, warnings, 0, rep)
    if not body.strip():
        rep.flush()
        return pa.Table.from_pylist([], schema=opts.explicit_schema), rep
    t = _read_lines((0, info, body), warnings, rep, opts, valid, what)
    rep.flush()
    rep.read += t.num_rows
    return t, rep


_WS = b" \t\r\n"


def _starts_with_object(buf) -> bool:
    """Whether the first thing in buf past whitespace is '{'. Why: pyarrow 26.0's JSON reader
    crashes the process (a segmentation fault) when its input starts with `null`; every record is
    an object, so input that starts with anything else goes line by line instead."""
    mv = memoryview(buf)
    for k in range(0, len(mv), 4096):
        head = bytes(mv[k:k + 4096]).lstrip(_WS)
        if head:
            return head[:1] == b"{"
    return False


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _object_lines(buf, rel: np.ndarray) -> np.ndarray:
    """For each line starting at rel (non-blank lines): whether its first non-blank byte is '{'."""
    u8 = np.frombuffer(buf, np.uint8)
    nws = np.flatnonzero((u8 != 32) & (u8 != 9) & (u8 != 13) & (u8 != 10))
    if not len(rel):
        return np.zeros(0, bool)
    at = np.searchsorted(nws, rel).clip(0, max(len(nws) - 1, 0))
    return u8[nws[at]] == ord("{") if len(nws) else np.zeros(len(rel), bool)


def _glued(info, kept: np.ndarray, rep: FileReport) -> None:
    """A kept line that had NULs in front of its record: the record in flight there was lost."""
    starts, _, glue = info
    for k in np.flatnonzero(glue[kept] >= 0).tolist():
        j = kept[k]
        rep.defer(int(starts[j]), int(glue[j]), "NUL bytes (a record in flight when the writer died)")


def _first_seq(t: pa.Table) -> np.ndarray:
    """False for each record whose seq an earlier record of the chunk already had (a duplicated
    line: the capture gives every record its own seq). Not checked across chunks."""
    sq = np.asarray(pc.fill_null(t.column("seq"), -1).to_numpy(), np.int64)
    ok = np.ones(len(sq), bool)
    if len(sq) > 1:
        _, first = np.unique(sq, return_index=True)
        ok[:] = False
        ok[first] = True
    return ok


def _spans(buf, base: int, info) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-blank lines of a chunk: (file start, file end with the newline, start in buf).
    `info`: the file ranges of the lines of a NUL-cleaned chunk (`_drop_nuls`; None: buf is the
    file from `base` on); every line of a cleaned chunk is non-blank."""
    u8 = np.frombuffer(buf, np.uint8)
    nl = np.flatnonzero(u8 == 10).astype(np.int64)
    ls = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64) if len(nl) else np.zeros(0, np.int64)
    if info is not None:
        return info[0], info[1], ls
    ws = (u8 == 32) | (u8 == 9) | (u8 == 13) | (u8 == 10)
    nws = np.flatnonzero(~ws)
    keep = np.searchsorted(nws, nl) > np.searchsorted(nws, ls)
    return (base + ls)[keep], (base + nl + 1)[keep], ls[keep]
