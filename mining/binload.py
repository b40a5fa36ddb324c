"""Read a binary launch file (launches.bin, MINE_CAPTURE_FORMAT=bin) into the launches and params frames.

Why: a binary dump must mine exactly like its compact JSON twin (the same records written as
launches.jsonl, docs/dump-format.md "Binary launch records"), so nothing downstream learns a second
format: per chunk of records this module builds the arrow table the JSON reader would have parsed
(`frames.READ_SCHEMA`, compact form: `fn`, params of `{i, hex}`) and hands it to the same
`functions.expand`, `frames.launch_part` and `frames.param_part`; offline pointer classification
from allocs.jsonl therefore happens as for JSON. No per-record Python: the records are found and
their headers decoded by `vocab/binfmt.py` (numpy), parameter hex strings are cut out of the
blobs with one gather and a 256-entry two-character table straight into an arrow string buffer.
Host-pointee sections and launch attributes are not read: no frame column comes from them.

Damage (`binfmt.scan`, the reader rule of docs/dump-format.md "Reading damaged dumps"): every
header field is checked against its documented range and the record's len against the sum of its
parts; damaged records are skipped, reading resumes at the next valid header whose seq continues the
sequence, and each skipped byte range goes into the file's `FileReport` (mining/damage.py) with the
records it held (the seq gap), plus one warning; the mmap writer's NUL tail is not a record. Records naming a function functions.jsonl lacks are dropped
by `expand` and counted as for JSON. Refused (`DumpError`): a file that cannot be read, and one
that holds no record.
"""

from __future__ import annotations

import lzma
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from vocab.binfmt import API_NAMES, F_EXTRA, F_GRAPH, F_NOBYTES, HEADER, headers, scan
from mining.allocs import Offline
from mining.damage import FileReport
from mining.errors import DumpError
from mining.frames import READ_SCHEMA, launch_part, param_part
from mining.functions import Functions, expand
from mining.jsonl import gather

MAX_RECORDS = 256 << 10   # records per task, whatever `chunk` says
# A binary record is about a third of its compact JSON twin's bytes: tasks of chunk / 4 bytes hold
# about as many records as a JSON task, so the per-task temporaries (and the peak RSS) match.
BIN_PER_JSON = 4
MAX_TASK_BYTES = 256 << 20  # file bytes per task at most: a task's hex must fit int32 offsets
_HEX2 = np.frombuffer(b"".join(f"{b:02x}".encode() for b in range(256)),
                      np.uint16)  # byte -> its two hex characters, in memory order
_PARAM = READ_SCHEMA.field("params").type.value_type
_API = pa.array(list(API_NAMES) + [f"api_{k}" for k in range(len(API_NAMES), 256)], pa.string())
_PACKING = pa.array(["params", "extra"], pa.string())


def read_bin_frames(src: Path, warnings: list[str], offline: Offline | None, fns: Functions, *,
                    chunk: int, report: FileReport | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """launches.bin (plain or .gz/.xz/.zst) -> (launches, params); `chunk`: the JSON reader's task size.

    The whole file is read once to find the records; a plain file is then let go and each task
    reads back only its own byte range (from the page cache), so the file is never held next to
    the growing frames."""
    plain = not src.name.endswith((".xz", ".gz", ".zst"))
    data = _read(src)
    sc = scan(data)
    offs = sc.offsets
    rep = report if report is not None else FileReport(src.name)
    rep.read += len(offs)
    for a, b, why, lost in sc.skips:
        # lost None: nothing after the damage tells how many records it held (at least one)
        rep.skip(a, b, why, 1 if lost is None else lost, exact=lost is not None)
    if sc.skips:
        warnings.append(f"dropped {sc.damaged} damaged record(s) of {src.name} in {len(sc.skips)} "
                        f"damaged range(s); reading resumed at the next valid record each time")
    if not len(offs):
        raise DumpError(f"{src}: holds no launch records")
    ends = offs + np.frombuffer(data, "<u4", count=len(data) // 4)[offs // 4]
    size = len(data)
    step = min(max(chunk // BIN_PER_JSON, HEADER), MAX_TASK_BYTES)
    cuts = np.searchsorted(offs, np.arange(0, int(offs[-1]) + 1, step))
    bounds = []
    for a, b in zip(cuts.tolist(), cuts[1:].tolist() + [len(offs)]):
        bounds += [(s, min(s + MAX_RECORDS, b)) for s in range(a, b, MAX_RECORDS)]
    if plain:
        del data

    def parse(task):
        a, b = task
        lo, hi = int(offs[a]), int(ends[b - 1])
        if plain:
            piece = os.pread(fd, hi - lo, lo)
            if len(piece) != hi - lo:
                raise DumpError(f"{src}: the file changed while it was read")
        else:
            piece = memoryview(data)[lo:hi]
        t = _table(piece, offs[a:b] - lo, fns)
        t, lay = expand(t, fns)
        if t.num_rows == 0:
            return hi - lo, None
        return hi - lo, (launch_part(t), param_part(t, offline, lay))

    try:
        fd = os.open(src, os.O_RDONLY) if plain else -1
    except OSError as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None
    try:
        return gather(bounds, parse, size, src)
    finally:
        if plain:
            os.close(fd)


def _read(src: Path) -> bytes:  # the whole (decompressed) file
    name = src.name
    try:
        if name.endswith(".xz"):
            with lzma.open(src, "rb") as fh:
                return fh.read()
        if name.endswith((".gz", ".zst")):
            with pa.input_stream(str(src), compression="gzip" if name.endswith(".gz") else "zstd") as fh:
                return fh.read()
        return src.read_bytes()
    except (OSError, pa.ArrowException, lzma.LZMAError, EOFError) as exc:
        raise DumpError(f"{src}: cannot read ({exc})") from None


def _ptr_strings(v: np.ndarray) -> pa.Array:
    """'0x..' strings (lowercase, no leading zeros) of u64 values; formatted once per distinct value."""
    uniq, inv = np.unique(v, return_inverse=True)
    return pa.array([f"0x{x:x}" for x in uniq.tolist()], pa.string()).take(pa.array(inv.ravel()))


def hex_strings(u8: np.ndarray, start: np.ndarray, length: np.ndarray) -> pa.StringArray:
    """Lowercase hex of u8[start:start+length] for each pair, as one arrow string array.
    (int32 byte indices relative to the lowest start: a task's bytes stay far below 2 GiB.)"""
    length = np.asarray(length, np.int64)
    n, total = len(length), int(length.sum())
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(2 * length, out=offsets[1:])
    lo = int(start.min()) if n else 0
    idx = np.repeat((np.asarray(start, np.int64) - lo - offsets[:-1] // 2).astype(np.int32), length)
    idx += np.arange(total, dtype=np.int32)
    chars = _HEX2[u8[lo:][idx]]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))


def _dims(a: np.ndarray) -> pa.ListArray:
    n = len(a)
    return pa.ListArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)),
                                    pa.array(a.astype(np.int64).ravel()))


def _table(data, offs: np.ndarray, F: Functions) -> pa.Table:
    """The records at `offs` as the arrow table the JSON reader gives for their compact JSON twin."""
    h = headers(data, offs)
    u8 = np.frombuffer(data, np.uint8)
    n = len(offs)
    fn = h["fn"].astype(np.int64)
    if len(F.ids):
        row = np.searchsorted(F.ids, fn).clip(0, len(F.ids) - 1)
        known = F.ids[row] == fn
        npar = np.where(known, F.lay_n[row], 0)
    else:  # every record is dropped by expand; no params needed
        row, npar = np.zeros(n, np.int64), np.zeros(n, np.int64)
    # parameters, flattened: owner record, index, and off/size from the function's layout
    owner = np.repeat(np.arange(n, dtype=np.int64), npar)
    first = np.cumsum(npar) - npar
    i = np.arange(len(owner), dtype=np.int64) - first[owner]
    pos = F.lay_start[row[owner]] + i if len(owner) else owner
    off, size = (F.lay_off[pos], F.lay_size[pos]) if len(owner) else (owner, owner)
    have = ((h["flags"][owner] & F_NOBYTES) == 0) & (off + size <= h["blob_len"][owner])
    hexes = hex_strings(u8, h["blob"][owner] + off, np.where(have, size, 0))
    m = len(owner)
    flat = pa.StructArray.from_arrays(  # off/size come from functions.jsonl (expand), ptrs from allocs
        [pa.array(i), pa.nulls(m, pa.int64()), pa.nulls(m, pa.int64()), hexes,
         pa.nulls(m, _PARAM.field("ptrs").type)], fields=list(_PARAM))
    plist = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(npar)]).astype(np.int32)), flat)
    in_graph = (h["flags"] & F_GRAPH) != 0
    none_s, none_i = pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())  # filled in by expand
    cols = {
        "seq": pa.array(h["seq"].astype(np.int64)), "t_ns": pa.array(h["t_ns"].astype(np.int64)),
        "tid": pa.array(h["tid"].astype(np.int64)), "dev": pa.array(h["dev"].astype(np.int64)),
        "stream": _ptr_strings(h["stream"]), "api": _API.take(pa.array(h["api"])),
        "result": pa.array(h["result"].astype(np.int64)),
        "graph": pa.StructArray.from_arrays(
            [pa.array(h["capture_id"].astype(np.int64), mask=~in_graph)], ["capture_id"],
            mask=pa.array(~in_graph)),
        "handle": none_s, "module": none_i, "sha256": none_s, "symbol": none_s, "name": none_s,
        "grid": _dims(h["grid"]), "block": _dims(h["block"]),
        "smem": pa.array(h["smem"].astype(np.int64)),
        "attrs": pa.StructArray.from_arrays([none_i], ["regs"]),
        "packing": _PACKING.take(pa.array(((h["flags"] & F_EXTRA) != 0).astype(np.int8))),
        "layout": none_s, "params": plist, "fn": pa.array(fn),
    }
    return pa.Table.from_arrays([cols[f.name] for f in READ_SCHEMA], schema=READ_SCHEMA)
