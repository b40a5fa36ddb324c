"""Binary launch records (`launches.bin`, MINE_CAPTURE_FORMAT=bin): scan, decode, rewrite as JSON.

    python -m vocab.binfmt PID_DIR [--out FILE]

Why: the binary form exists so that recording a launch costs a header store and a memcpy instead
of JSON formatting (docs/dump-format.md, "Binary launch records", the contract this module
follows). Everything downstream still speaks the compact JSON form, so this module is the one
place that knows the layout: `scan` finds the records (the reader rule for damage), `headers`
decodes every header at once into numpy arrays (mining/binload.py builds its frames from them),
and `decode_records` / the CLI give the records exactly as the C library's compact JSON writer
would have formatted them (key order, `"0x.."` pointers, lowercase hex, `host` entries), so a
binary dump can be read by anything that reads launches.jsonl.

Scanning: one vectorised pass lists every 8-aligned position holding the magic at +4 and a header
whose every field lies in its documented range, with a `len` that is exactly the sum of its parts
(docs/dump-format.md "Reading damaged dumps"); an undamaged file is then recognised with a few
vector compares (the headers chain from 0 to the end, seq rising by one). Otherwise the walk
follows chains of abutting records whose seq rises by one, in one step each, and where it meets a
position that does not continue the chain, resumes at the first valid header whose seq continues
the sequence (above the last good one by at most 1 + bytes skipped / 112): the Python work is per
damaged spot, not per record. `Scan.skips` lists every byte range skipped, why, and the records
it held (the seq gap; None after the last record read); `Scan.damaged` sums them (at least one
for a damaged tail). The mmap writer's NUL tail is not a record.

numpy only (no pyarrow, no stage): the capture side writes this format and mining reads it, so it
lives in the bottom layer both import.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

from vocab.errors import DumpError
from vocab.capture_tables import API_NAMES, ATTR_BY_ID  # the api byte's names, launch attributes

MAGIC = 0x314C434D          # the bytes "MCL1", at +4 of every record
HEADER = 112
ATTR = 72                   # a raw CUlaunchAttribute: u32 id, 4 bytes padding, 64-byte value
F_GRAPH, F_EXTRA, F_NOBYTES = 1, 2, 4
LAUNCHES_BIN = "launches.bin"
FUNCTIONS = "functions.jsonl"


def api_name(code: int) -> str:
    """The `api` string of an api byte (a byte this reader does not know reads `api_<n>`)."""
    return API_NAMES[code] if code < len(API_NAMES) else f"api_{code}"


# ------------------------------------------------------------------ finding the records
# The ranges a header field must lie in (docs/dump-format.md "Reading damaged dumps"). Each is a
# bound the writer (capture/src/record.c) cannot exceed, so a record outside one is damage.
MAX_ATTRS = 64              # record.c keeps at most 64 launch attributes
MAX_BLOB = 32768            # MC_PARAM_MAX: the most parameter bytes a record holds
MAX_HOST = 8                # MC_HOST_WORDS: host sections per record
MAX_POINTEE = 4096          # MINE_CAPTURE_HOST_BYTES is capped there
MAX_SEQ = 1 << 62           # far above any count of launches; below int64's limit
MAX_DEV = 128             # the frames hold dev as int8


def _valid(u8: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Which 8-aligned positions `start` (magic at +4) hold a header whose every field lies in its
    documented range and whose len is exactly the sum of its parts (header, attributes, padded
    blob, host sections). One vectorised pass; the host sections are walked section by section
    for all candidates together (at most MAX_HOST steps)."""
    n = len(u8)
    n8 = n - n % 8
    w32 = u8[:n8].view("<u4")
    w64 = u8[:n8].view("<u8")
    q = start // 4
    ln = w32[q].astype(np.int64)
    ok = (ln % 8 == 0) & (ln >= HEADER) & (ln <= n8 - start)
    b = w32[q + 25]                       # api, flags, nattrs, nhost (bytes 100-103)
    api, flags, nattrs, nhost = b & 0xFF, (b >> 8) & 0xFF, (b >> 16) & 0xFF, b >> 24
    blob_len = w32[q + 26].astype(np.int64)
    e = start // 8
    graph_ok = ((flags & F_GRAPH) != 0) | ((w64[e + 6] == 0) & (w64[e + 7] == 0))
    result = w32[q + 17].view("<i4")
    dev = w32[q + 7].view("<i4")
    ok &= (w32[q + 27] == 0) & (api < len(API_NAMES)) & (flags < 8) & (nattrs <= MAX_ATTRS)
    ok &= (nhost <= MAX_HOST) & (blob_len <= MAX_BLOB) & graph_ok & (w64[e + 1] < MAX_SEQ)
    ok &= (dev >= -1) & (dev < MAX_DEV)
    ok &= (w32[q + 16] < (1 << 31)) & (w32[q + 6] < (1 << 31))   # fn, tid
    # a launch the driver accepted (result 0) had a shape the driver accepts
    g = [w32[q + 18 + k].astype(np.int64) for k in range(6)]
    shape = (g[0] >= 1) & (g[0] < 1 << 31) & (g[1] >= 1) & (g[1] < 1 << 16) & (g[2] >= 1) & (g[2] < 1 << 16)
    shape &= (g[3] >= 1) & (g[4] >= 1) & (g[5] >= 1) & (g[3] <= 1024) & (g[4] <= 1024) & (g[5] <= 64)
    shape &= g[3] * g[4] * g[5] <= 1024
    shape &= w32[q + 24] < (1 << 24)      # smem
    ok &= (result != 0) | shape
    # exact length: walk the host sections of every candidate that is still plausible
    end = start + ln
    pos = start + HEADER + ATTR * nattrs.astype(np.int64) + _pad8(blob_len)
    ok &= pos <= end
    for k in range(MAX_HOST):
        live = ok & (nhost > k)
        if not live.any():
            break
        live &= pos + 16 <= end
        ok &= live | (nhost <= k)
        idx = np.flatnonzero(live)
        pq = pos[idx] // 4
        at = w32[pq].astype(np.int64)
        cnt = w32[pq + 1].astype(np.int64)
        good = (at % 8 == 0) & (at + 8 <= blob_len[idx]) & (cnt <= MAX_POINTEE)
        ok[idx] &= good
        pos[idx] += 16 + _pad8(cnt)
    return ok & (pos == end)


def _candidates(u8: np.ndarray):
    """Every 8-aligned position holding a valid header (`_valid`): (starts, lens, seqs)."""
    n = len(u8)
    n8 = n - n % 8
    w32 = u8[:n8].view("<u4")
    k = np.flatnonzero(w32[1::2] == MAGIC)
    start = 8 * k.astype(np.int64)
    start = start[start + HEADER <= n8]
    start = start[_valid(u8, start)] if len(start) else start
    ln = w32[start // 4].astype(np.int64)
    seq = u8[:n8].view("<u8")[start // 8 + 1].astype(np.int64)
    return start, ln, seq


class Scan(tuple):
    """What `scan` found: unpacks as (offsets, damaged); also `.offsets`, `.damaged` (records lost:
    seq numbers missing between the records read, plus one per damaged stretch after the last
    record read), `.seq` (the records' seq numbers, uint64) and `.skips`: every byte range that was
    not read, as (start, end, reason, records lost in it; None where no record follows to tell)."""

    def __new__(cls, offsets: np.ndarray, damaged: int, seq: np.ndarray, skips=()):
        self = super().__new__(cls, (offsets, damaged))
        self.seq = seq
        self.skips = list(skips)
        return self

    offsets = property(lambda self: self[0])
    damaged = property(lambda self: self[1])


def scan(data) -> Scan:
    """Record start offsets (int64, file order) and the records lost to damage (reader rule of
    docs/dump-format.md "Reading damaged dumps"). `data`: the file's bytes, or its path.

    Fast path (an undamaged file): the valid headers chain from offset 0 to the end (or to the NUL
    tail) and their seq rises by one from record to record; checked with a few vector operations.
    Otherwise the file is walked by chains: a chain of abutting records whose seq rises by one is
    taken whole; where the walk meets a position that does not continue it (no valid header, or
    one whose seq does not follow), reading resumes at the first valid header after it whose seq
    continues the sequence: above the last good one by at most one plus the bytes skipped / 112
    (every lost record took at least a header's bytes). The seq gap is the number of records lost."""
    if isinstance(data, (str, os.PathLike)):
        data = Path(data).read_bytes()
    u8 = np.frombuffer(data, np.uint8)
    n = len(u8)
    C, L, S = _candidates(u8)
    nxt = C + L
    # breaks: record i does not chain into i + 1, by position or by seq
    breaks = np.flatnonzero((nxt[:-1] != C[1:]) | (S[1:] != S[:-1] + 1))
    if len(C) and C[0] == 0 and S[0] == 0 and not len(breaks) and not u8[int(nxt[-1]):].any():
        return Scan(C, 0, S.astype(np.uint64), [])
    tail = n - int(np.argmax(u8[::-1] != 0)) if u8.any() else 0   # where the NUL tail starts
    runs, skips, lost, p, last = [], [], 0, 0, -1
    first = True
    while p < tail:
        k = int(np.searchsorted(C, p))
        if k < len(C) and C[k] == p and (S[k] == last + 1 or (first and _confirmed(k, breaks, len(C)))):
            b = int(np.searchsorted(breaks, k))
            end = int(breaks[b]) if b < len(breaks) else len(C) - 1
            runs.append((k, end + 1))
            last, p, first = int(S[end]), int(nxt[end]), False
            continue
        j = _resync(C, S, k + (k < len(C) and C[k] == p), last, p)
        if j < 0:
            skips.append((p, tail, _why(u8, p, tail, "no valid record follows; the rest of the file "
                                     "is unread"), None))
            lost += 1
            break
        gap = int(S[j]) - last - 1
        skips.append((p, int(C[j]), _why(u8, p, int(C[j]), "damaged record(s); reading resumed at the next "
                                         "valid header whose seq continues the sequence"), gap))
        lost += gap
        p, last, first = int(C[j]), int(S[j]) - 1, False
    offs = np.concatenate([C[a:b] for a, b in runs]) if runs else np.zeros(0, np.int64)
    seqs = np.concatenate([S[a:b] for a, b in runs]) if runs else np.zeros(0, np.int64)
    return Scan(offs.astype(np.int64), lost, seqs.astype(np.uint64), skips)


def _confirmed(k: int, breaks: np.ndarray, n: int) -> bool:
    """The first record of a file may start anywhere in seq when its successor continues it."""
    b = int(np.searchsorted(breaks, k))
    return (int(breaks[b]) if b < len(breaks) else n - 1) > k


def _why(u8: np.ndarray, a: int, b: int, reason: str) -> str:
    return ("NUL bytes (a record in flight when the writer died); " + reason) if not u8[a:b].any() else reason


def _resync(C: np.ndarray, S: np.ndarray, j: int, last: int, p: int) -> int:
    """First candidate index >= j whose seq continues the sequence after `last` given the bytes
    skipped from `p` (-1: none); windows double, so a long stretch of stale headers costs a few
    vector compares."""
    w = 64
    while j < len(S):
        s, c = S[j:j + w], C[j:j + w]
        hit = np.flatnonzero((s > last) & (s - last - 1 <= (c - p) // HEADER))
        if len(hit):
            return j + int(hit[0])
        j += w
        w *= 2
    return -1


def _pad8(x):
    return (x + 7) & ~7


# ------------------------------------------------------------------ headers, vectorised
def headers(data, offs: np.ndarray) -> dict[str, np.ndarray]:
    """Every header field of the records at `offs`, as numpy arrays (one gather of 14 words a
    record). `blob`: where each blob starts; `host`: where the host sections start."""
    u8 = np.frombuffer(data, np.uint8)
    n8 = len(u8) - len(u8) % 8
    w64 = u8[:n8].view("<u8")
    W = w64[(np.asarray(offs, np.int64) // 8)[:, None] + np.arange(HEADER // 8)]
    W32, W8 = W.view("<u4"), W.view(np.uint8)
    h = {
        "len": W32[:, 0].astype(np.int64), "seq": W[:, 1].copy(), "t_ns": W[:, 2].copy(),
        "tid": W32[:, 6].copy(), "dev": W32[:, 7].view("<i4").copy(), "ctx": W[:, 4].copy(),
        "stream": W[:, 5].copy(), "graph": W[:, 6].copy(), "capture_id": W[:, 7].copy(),
        "fn": W32[:, 16].copy(), "result": W32[:, 17].view("<i4").copy(),
        "grid": W32[:, 18:21].copy(), "block": W32[:, 21:24].copy(), "smem": W32[:, 24].copy(),
        "api": W8[:, 100].copy(), "flags": W8[:, 101].copy(), "nattrs": W8[:, 102].copy(),
        "nhost": W8[:, 103].copy(), "blob_len": W32[:, 26].astype(np.int64),
    }
    h["blob"] = np.asarray(offs, np.int64) + HEADER + ATTR * h["nattrs"].astype(np.int64)
    h["host"] = h["blob"] + _pad8(h["blob_len"])
    return h


# ------------------------------------------------------------------ functions.jsonl
def read_functions(path: Path) -> dict[int, dict]:
    """functions.jsonl -> {fn id: its record}; damaged lines are skipped (the NUL rule of
    docs/dump-format.md "Writers"; a cut last line; unparsable lines), as mining does. A missing
    file reads as no functions. The one reader of that file on the capture side."""
    path = Path(path)
    if not path.is_file():
        return {}
    out = {}
    lines = path.read_bytes().split(b"\n")
    lines.pop()  # after the last newline: empty, or a record cut short
    for line in lines:
        line = line.rpartition(b"\0")[2]
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            out[int(r["fn"])] = r
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read_layouts(path: Path) -> dict[int, tuple[str, list[tuple[int, int]]]]:
    """fn id -> (layout, [(off, size) of parameter 0, 1, ...]); functions whose layout is malformed
    are left out."""
    out = {}
    for fn, r in read_functions(path).items():
        try:
            lay = {int(i): (int(o), int(s)) for i, o, s in (r.get("params_layout") or [])}
            out[fn] = (str(r.get("layout")), [lay[i] for i in range(len(lay))])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


# ------------------------------------------------------------------ records as compact JSON
def _ptr(v: int) -> str:
    return f"0x{v:x}"


def _event(v: bytes, fmt: str, names: tuple[str, ...]) -> dict:
    ev, *rest = struct.unpack_from(fmt, v)
    return {"event": _ptr(ev), **dict(zip(names, rest))}


# How each launch attribute shape reads the 64-byte value union (vocab/capture_tables.py ATTR_SHAPES).
_ATTR_READ = {
    "dim3": lambda v: list(struct.unpack_from("<3I", v)),
    "i32": lambda v: struct.unpack_from("<i", v)[0],
    "u32": lambda v: struct.unpack_from("<I", v)[0],
    "pdl_event": lambda v: _event(v, "<Qii", ("flags", "trigger_at_block_start")),  # {CUevent, int, int}
    "completion_event": lambda v: _event(v, "<Qi", ("flags",)),                     # {CUevent, int}
    "domain_map": lambda v: [v[0], v[1]],
}


def _launch_attrs(raw: bytes) -> dict:
    """The raw CUlaunchAttribute array -> launches.jsonl `launch_attrs` (as capture/src/record.c,
    both from the table in vocab/capture_tables.py; an id it lacks: `attr_<id>`, the value's hex)."""
    out = {}
    for k in range(0, len(raw) - ATTR + 1, ATTR):
        aid = struct.unpack_from("<I", raw, k)[0]
        v = raw[k + 8:k + ATTR]
        a = ATTR_BY_ID.get(aid)
        if a is None:
            out[f"attr_{aid}"] = v.hex()
        else:
            out[a.key] = _ATTR_READ[a.shape](v)
    return out


def _host_sections(data, start: int, end: int, count: int):
    """(at, addr, pointee bytes) of each host section between start and end."""
    p = start
    for _ in range(count):
        if p + 16 > end:
            return
        at, n, addr = struct.unpack_from("<IIQ", data, p)
        if p + 16 + n > end:
            return
        yield at, addr, bytes(data[p + 16:p + 16 + n])
        p += 16 + _pad8(n)


class BinDump:
    """A process folder's launches.bin, scanned, with its headers and function layouts."""

    def __init__(self, folder):
        folder = Path(folder)
        src = folder / LAUNCHES_BIN
        if not src.is_file():
            raise DumpError(f"{folder}: no {LAUNCHES_BIN} in this folder")
        if not (folder / FUNCTIONS).is_file():
            raise DumpError(f"{folder}: no {FUNCTIONS} (the parameter layouts the records need)")
        self.data = src.read_bytes()
        self.offs, self.damaged = scan(self.data)
        self.h = headers(self.data, self.offs)
        self.layouts = read_layouts(folder / FUNCTIONS)
        self.unknown_fn = 0   # records naming a function functions.jsonl lacks (params left empty)

    def records(self):
        """Each record as the compact JSON writer would have written it, in file order."""
        h, data = self.h, self.data
        cols = {k: v.tolist() for k, v in h.items()}
        for r in range(len(self.offs)):
            flags = cols["flags"][r]
            blob, blen = cols["blob"][r], cols["blob_len"][r]
            rec = {"seq": cols["seq"][r], "t_ns": cols["t_ns"][r], "tid": cols["tid"][r],
                   "dev": cols["dev"][r], "ctx": _ptr(cols["ctx"][r]), "stream": _ptr(cols["stream"][r]),
                   "api": api_name(cols["api"][r]), "result": cols["result"][r],
                   "graph": ({"graph": _ptr(cols["graph"][r]), "capture_id": cols["capture_id"][r]}
                             if flags & F_GRAPH else None),
                   "fn": cols["fn"][r], "grid": cols["grid"][r], "block": cols["block"][r],
                   "smem": cols["smem"][r],
                   "launch_attrs": _launch_attrs(data[blob - ATTR * cols["nattrs"][r]:blob]),
                   "packing": "extra" if flags & F_EXTRA else "params"}
            fn = self.layouts.get(cols["fn"][r])
            if fn is None:
                self.unknown_fn += 1
            layout, lay = fn if fn is not None else ("none", [])
            nobytes = bool(flags & F_NOBYTES)
            params = [{"i": i, "hex": "" if nobytes or off + size > blen else
                       data[blob + off:blob + off + size].hex()} for i, (off, size) in enumerate(lay)]
            end = self.offs[r] + cols["len"][r]
            for at, addr, pointee in _host_sections(data, cols["host"][r], int(end), cols["nhost"][r]):
                for (off, size), p in zip(lay, params):
                    if off <= at < off + size and p["hex"]:
                        p.setdefault("host", []).append({"at": at - off, "addr": _ptr(addr),
                                                         "hex": pointee.hex()})
                        break
            rec["params"] = params
            if fn is not None and layout == "none" and flags & F_EXTRA and not nobytes:
                rec["extra_hex"] = data[blob:blob + blen].hex()
            yield rec


def decode_records(folder) -> list[dict]:
    """A process folder's launches.bin as compact launches.jsonl records (dicts, file order)."""
    return list(BinDump(folder).records())


# ------------------------------------------------------------------ CLI
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage first)
        print(f"vocab.binfmt: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    ap = _Parser(prog="python -m vocab.binfmt",
                 description="Rewrite a process folder's launches.bin as compact launches.jsonl.")
    ap.add_argument("pid_dir", type=Path)
    ap.add_argument("--out", type=Path, help="output file (default: PID_DIR/launches.jsonl)")
    args = ap.parse_args(argv)
    out = args.out or args.pid_dir / "launches.jsonl"
    if out.exists() or out.is_symlink():
        print(f"vocab.binfmt: {out} exists; remove it or pass another --out", file=sys.stderr)
        return 2
    try:
        dump = BinDump(args.pid_dir)
    except (ValueError, OSError) as exc:
        print(f"vocab.binfmt: {exc}", file=sys.stderr)
        return 2
    try:
        with open(out, "x") as fh:
            for rec in dump.records():
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    except OSError as exc:
        print(f"vocab.binfmt: cannot write {out} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    notes = []
    if dump.damaged:
        notes.append(f"skipped {dump.damaged} damaged record(s)")
    if dump.unknown_fn:
        notes.append(f"{dump.unknown_fn} record(s) name a function {FUNCTIONS} lacks (written with no params)")
    print(f"vocab.binfmt: wrote {len(dump.offs)} record(s) to {out}"
          + (f"; {'; '.join(notes)}" if notes else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
