"""Host-to-device copies (`copies.jsonl`, docs/dump-format.md "Copy log"): the reader, and what a
device range held when a launch ran.

Why: a launch record names its buffers, not their contents. The inputs of a forward (token ids,
positions, slot mapping, sequence lengths, block tables, query start offsets) are what the host
copied into device buffers before the launches that read them. `mine replay` fills attention's
metadata buffers with zeros unless it knows those bytes; `mine compile` names an input by matching
them against the request. `read_copies` reads the log into one frame (COPY_COLUMNS), with the
launch seq each copy precedes; `bytes_before` answers "what did the host last put in
[base, base + size) before launch s", byte by byte, from that frame alone; `fills_before` gives
the same as (address, bytes) runs of the known bytes only, for a range as large as an allocation
(what a replay uploads over its fill).

Device-side records (`op` "dtod": a device-to-device copy, "memset": a memset, never with bytes)
are split off by `split_copies` (`Dump.device_ops`): the rule below is over host-to-device copies.

The rule (the docs' reader rule): a copy with `result` 0 that is not part of a graph (neither a
copy made inside a stream capture nor a memcpy node's definition: those run at replays, not when
recorded) wrote `[dst, dst + size)` for every launch with `seq >= seq_before`; of the copies that
wrote a byte before launch s, the one with the largest copy `seq` holds it. A copy recorded without
its bytes (larger than MINE_CAPTURE_COPY_BYTES) still overwrote the range: the bytes it covers are
unknown, not the older copy's.
Not checked: that a copy's bytes reached the device before the launch ran on another stream (an
async copy is ordered before later launches on its own stream only; the engine's events order the
rest), that the buffer was not freed and reused in between (join with `Dump.allocs` for that),
and kernels or device-to-device copies that overwrote the range after the host's copy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mining.damage import FileReport, lines_report

COPIES = "copies.jsonl"
COPY_COLUMNS = {"seq": "int64", "seq_before": "int64", "t_ns": "int64", "tid": "int32", "dev": "int16",
                "api": "category", "stream": "uint64", "async": "bool", "dst": "uint64", "src": "uint64",
                "size": "int64", "result": "int32", "in_graph": "bool", "graph": "uint64", "capture_id": "int64",
                "node": "uint64", "has_bytes": "bool", "data": "object", "op": "object", "value": "int64",
                "elem": "int8"}
OPS = ("htod", "dtod", "memset")   # vocab.capture_tables.COPY_OPS: what a record is
_ADDR = re.compile(r"0x[0-9a-fA-F]{1,16}\Z")
_HEX = re.compile(r"(?:[0-9a-f]{2})*\Z")
SIZE_LIMIT = 1 << 48


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _addr(v) -> int | None:
    return int(v, 16) if isinstance(v, str) and _ADDR.match(v) else None


def _copy(line: bytes):
    """One copies.jsonl line -> its row, or None when a field lies outside its documented range."""
    try:
        r = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(r, dict):
        return None
    if not (_int(r.get("seq"), 0, 1 << 62) and _int(r.get("seq_before"), 0, 1 << 62)
            and _int(r.get("t_ns"), 0, 1 << 63) and _int(r.get("tid"), 0, 1 << 31)
            and _int(r.get("dev"), -1, 128) and isinstance(r.get("api"), str) and r.get("async") in (0, 1)
            and not isinstance(r.get("async"), bool) and _int(r.get("size"), 0, SIZE_LIMIT)
            and _int(r.get("result"), 0, 1 << 31)):
        return None
    addrs = {k: _addr(r.get(k)) for k in ("stream", "dst", "src")}
    if None in addrs.values():
        return None
    node = 0
    if "node" in r:
        node = _addr(r["node"])
        if node is None:
            return None
    g = r.get("graph")
    graph, capid = 0, -1
    if g is not None:
        if not isinstance(g, dict) or _addr(g.get("graph")) is None or not _int(g.get("capture_id"), 0, 1 << 62):
            return None
        graph, capid = _addr(g["graph"]), g["capture_id"]
    op = r.get("op", "htod")   # a record of a dump from before device copies were logged is host-to-device
    if op not in OPS:
        return None
    value, elem = -1, 0
    if op == "memset":
        if not (_int(r.get("value"), 0, 1 << 32) and r.get("elem") in (1, 2, 4) and not isinstance(r.get("elem"), bool)
                and r["size"] % r["elem"] == 0):
            return None
        value, elem = r["value"], r["elem"]
    elif "value" in r or "elem" in r:
        return None
    if op != "htod" and "hex" in r:
        return None   # the bytes of a device-side copy are never read from the CPU
    data = None
    if "hex" in r:
        h = r["hex"]
        if not isinstance(h, str) or len(h) != 2 * r["size"] or not _HEX.match(h):
            return None
        data = bytes.fromhex(h)
    return {"seq": r["seq"], "seq_before": r["seq_before"], "t_ns": r["t_ns"], "tid": r["tid"], "dev": r["dev"],
            "api": r["api"], "stream": addrs["stream"], "async": bool(r["async"]), "dst": addrs["dst"],
            "src": addrs["src"], "size": r["size"], "result": r["result"], "in_graph": g is not None,
            "graph": graph, "capture_id": capid, "node": node, "has_bytes": data is not None, "data": data,
            "op": op, "value": value, "elem": elem}


def read_copies(path: Path, warnings: list[str] | None = None, report: FileReport | None = None) -> pd.DataFrame:
    """copies.jsonl -> one row per copy (COPY_COLUMNS), in file order; damaged lines (unparsable,
    a field outside its range, NUL bytes, a cut last line) are dropped, counted in `warnings` and
    reported per line in `report`. `data` holds the copied bytes (None when not recorded)."""
    rows, rep = lines_report(COPIES, Path(path).read_bytes(), _copy,
                             lambda line: "not a copy record of the documented types and ranges")
    if rep.skipped and warnings is not None:
        warnings.append(f"{COPIES}: dropped {rep.skipped} damaged record(s)")
    if report is not None:
        report.merge(rep)
    return copies_frame(rows)


def copies_frame(rows: list[dict]) -> pd.DataFrame:
    """The frame of parsed copy rows (also the empty frame, with its dtypes)."""
    df = pd.DataFrame(rows, columns=list(COPY_COLUMNS))
    return df.astype(COPY_COLUMNS)


def split_copies(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(host-to-device copies, device-side operations: device-to-device copies and memsets), each in
    file order. Why two frames: the host's copies are a forward's inputs (what `bytes_before`
    answers from); a device-to-device copy or a memset is part of the computation, made between or
    inside the launches (a CUDA graph's copy of its output into a static buffer), whose bytes
    come from the device."""
    host = df["op"] == "htod"
    return df[host].reset_index(drop=True), df[~host].reset_index(drop=True)


@dataclass(frozen=True)
class Filled:
    """What [base, base + size) held before a launch, as far as the copy log tells."""
    base: int
    data: bytes             # the bytes; 0 where not known
    known: np.ndarray       # bool per byte: a recorded copy's byte
    copy_seq: np.ndarray    # int64 per byte: the copy that last wrote it (-1: none recorded)

    @property
    def complete(self) -> bool:
        """Every byte of the range comes from a copy whose bytes were recorded."""
        return bool(self.known.all())


def _live(copies: pd.DataFrame, seq: int, base: int, size: int):
    """(dst, end, mask): the copies that wrote part of [base, base + size) before launch `seq`."""
    dst = copies["dst"].to_numpy(np.uint64)
    end = dst + copies["size"].to_numpy(np.int64).astype(np.uint64)
    lo, hi = np.uint64(base), np.uint64(base + size)
    live = ((copies["result"].to_numpy() == 0) & ~copies["in_graph"].to_numpy(bool)
            & (copies["seq_before"].to_numpy(np.int64) <= seq) & (dst < hi) & (end > lo)
            & (copies["size"].to_numpy(np.int64) > 0))
    return dst, end, live


def bytes_before(copies: pd.DataFrame, seq: int, base: int, size: int) -> Filled:
    """The bytes the host last copied into [base, base + size) before launch `seq` (the newest
    copy overlapping each byte; the module docstring states the rule). A pure function of the
    frame `read_copies` returns."""
    if size < 0 or base < 0:
        raise ValueError(f"bytes_before: a range needs base >= 0 and size >= 0, got base {base}, size {size}")
    data = np.zeros(size, np.uint8)
    known = np.zeros(size, bool)
    owner = np.full(size, -1, np.int64)
    if size == 0 or len(copies) == 0:
        return Filled(base, data.tobytes(), known, owner)
    dst, end, live = _live(copies, seq, base, size)
    idx = np.flatnonzero(live)
    idx = idx[np.argsort(copies["seq"].to_numpy(np.int64)[idx], kind="stable")[::-1]]   # newest first
    unset = np.ones(size, bool)
    seqs = copies["seq"].to_numpy(np.int64)
    payload = copies["data"].to_numpy(object)
    for i in idx:
        a, b = max(int(dst[i]), base) - base, min(int(end[i]), base + size) - base
        free = np.flatnonzero(unset[a:b]) + a
        if len(free) == 0:
            continue
        owner[free] = seqs[i]
        blob = payload[i]
        if blob is not None:
            src = np.frombuffer(blob, np.uint8)
            data[free] = src[free + base - int(dst[i])]
            known[free] = True
        unset[free] = False
        if not unset.any():
            break
    return Filled(base, data.tobytes(), known, owner)


def fills_before(copies: pd.DataFrame, seq: int, base: int, size: int) -> list[tuple[int, bytes]]:
    """The known bytes of [base, base + size) before launch `seq`, as (address, bytes) runs in
    address order: what a replay uploads over its own fill of a region (bytes no recorded copy
    gives keep the fill). Only the parts some copy wrote are looked at, so the range may be a
    whole allocation (a region of `mine replay`, a KV pool) at no cost for its size."""
    if size <= 0 or len(copies) == 0:
        return []
    dst, end, live = _live(copies, seq, base, size)
    idx = np.flatnonzero(live)
    spans = sorted((max(int(dst[i]), base), min(int(end[i]), base + size)) for i in idx)
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out = []
    for a, b in merged:
        f = bytes_before(copies, seq, a, b - a)
        k = np.flatnonzero(np.diff(np.concatenate(([0], f.known.view(np.int8), [0]))))
        out += [(a + int(s), f.data[int(s):int(e)]) for s, e in zip(k[::2], k[1::2])]
    return out
