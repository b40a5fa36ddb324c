"""Binary launch records (`launches.bin`, MINE_CAPTURE_FORMAT=bin): scan, decode, rewrite as JSON.

    python -m capture.binfmt PID_DIR [--out FILE]

Why: the binary form exists so that recording a launch costs a header store and a memcpy instead
of JSON formatting (docs/dump-format.md, "Binary launch records", the contract this module
follows). Everything downstream still speaks the compact JSON form, so this module is the one
place that knows the layout: `scan` finds the records (the reader rule for damage), `headers`
decodes every header at once into numpy arrays (mining/binload.py builds its frames from them),
and `decode_records` / the CLI give the records exactly as the C library's compact JSON writer
would have formatted them (key order, `"0x.."` pointers, lowercase hex, `host` entries), so a
binary dump can be read by anything that reads launches.jsonl.

Scanning: one vectorised pass lists every 8-aligned position holding the magic at +4 with a sane
`len`; the walk by `len` then follows runs of records that chain into each other in one step, so
the Python work is per damaged spot (or per false magic inside a blob), not per record. Damage:
where the walk lands on a position that is not such a header, the rest of the file is either NUL
bytes (the mmap writer's preallocated tail: not a record) or the walk resumes at the next header
whose `seq` exceeds the last good one, counting one damaged record per damaged stretch (also when
no header follows it). A record whose attributes and blob do not fit inside its `len` is dropped and
counted the same way. Not checked: that `seq` is gap-free or in order after a good record.

numpy only (no pyarrow, no mining/): the capture side must stay importable on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = 0x314C434D          # the bytes "MCL1", at +4 of every record
HEADER = 112
ATTR = 72                   # a raw CUlaunchAttribute: u32 id, 4 bytes padding, 64-byte value
F_GRAPH, F_EXTRA, F_NOBYTES = 1, 2, 4
API_NAMES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
             "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz",
             # kernel nodes of explicitly built graphs, recorded when defined (dump-format.md)
             "cuGraphAddKernelNode", "cuGraphAddKernelNode_v2", "cuGraphAddNode", "cuGraphAddNode_v2",
             "cuGraphKernelNodeSetParams", "cuGraphKernelNodeSetParams_v2", "cuGraphExecKernelNodeSetParams",
             "cuGraphExecKernelNodeSetParams_v2", "cuGraphNodeSetParams", "cuGraphExecNodeSetParams")
LAUNCHES_BIN = "launches.bin"
FUNCTIONS = "functions.jsonl"


def api_name(code: int) -> str:
    """The `api` string of an api byte (a byte this reader does not know reads `api_<n>`)."""
    return API_NAMES[code] if code < len(API_NAMES) else f"api_{code}"


# ------------------------------------------------------------------ finding the records
def _candidates(u8: np.ndarray):
    """Every 8-aligned position with the magic at +4 and a sane len: (starts, lens, seqs)."""
    n = len(u8)
    n8 = n - n % 8
    w32 = u8[:n8].view("<u4")
    k = np.flatnonzero(w32[1::2] == MAGIC)
    start = 8 * k.astype(np.int64)
    ln = w32[2 * k].astype(np.int64)
    ok = (ln % 8 == 0) & (ln >= HEADER) & (ln <= n - start)
    start, ln = start[ok], ln[ok]
    seq = u8[:n8].view("<u8")[start // 8 + 1]
    return start, ln, seq


class Scan(tuple):
    """What `scan` found: unpacks as (offsets, damaged); also `.offsets`, `.damaged` and `.seq`
    (the records' seq numbers, uint64)."""

    def __new__(cls, offsets: np.ndarray, damaged: int, seq: np.ndarray):
        self = super().__new__(cls, (offsets, damaged))
        self.seq = seq
        return self

    offsets = property(lambda self: self[0])
    damaged = property(lambda self: self[1])


def scan(data) -> Scan:
    """Record start offsets (int64, file order) and the number of damaged records (reader rule of
    docs/dump-format.md "Commit order and damage"). `data`: the file's bytes, or its path."""
    if isinstance(data, (str, os.PathLike)):
        data = Path(data).read_bytes()
    u8 = np.frombuffer(data, np.uint8)
    n = len(u8)
    C, L, S = _candidates(u8)
    nxt = C + L
    breaks = np.flatnonzero(nxt[:-1] != C[1:])       # record i does not chain into i + 1
    runs, damaged, p, last = [], 0, 0, None
    while p < n:
        k = int(np.searchsorted(C, p))
        if k < len(C) and C[k] == p:                   # a header: take its whole chain at once
            b = int(np.searchsorted(breaks, k))
            end = int(breaks[b]) if b < len(breaks) else len(C) - 1
            runs.append((k, end + 1))
            last, p = int(S[end]), int(nxt[end])
            continue
        if not u8[p:].any():                           # the NUL tail: not a record
            break
        damaged += 1
        j = _resync(S, int(np.searchsorted(C, p, side="right")), last)
        if j < 0:
            break
        p = int(C[j])
    offs = np.concatenate([C[a:b] for a, b in runs]) if runs else np.zeros(0, np.int64)
    if len(offs):   # a record whose attributes and blob overrun its len is not a record either
        w32 = u8[:len(u8) - len(u8) % 8].view("<u4")
        ln = w32[offs // 4].astype(np.int64)
        nattrs = (w32[offs // 4 + 25] >> 16) & 0xFF
        blob_len = w32[offs // 4 + 26].astype(np.int64)
        fits = HEADER + ATTR * nattrs + _pad8(blob_len) <= ln
        damaged += int((~fits).sum())
        offs = offs[fits]
    offs = offs.astype(np.int64)
    return Scan(offs, damaged, u8[:len(u8) - len(u8) % 8].view("<u8")[offs // 8 + 1])


def _resync(S: np.ndarray, j: int, last: int | None) -> int:
    """First candidate index >= j whose seq exceeds `last` (-1: none); windows double, so a long
    stretch of stale headers costs a few vector compares."""
    if last is None:
        return j if j < len(S) else -1
    w = 64
    while j < len(S):
        hit = np.flatnonzero(S[j:j + w] > np.uint64(last))
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


def _launch_attrs(raw: bytes) -> dict:
    """The raw CUlaunchAttribute array -> launches.jsonl `launch_attrs` (as capture/src/record.c)."""
    out = {}
    for k in range(0, len(raw) - ATTR + 1, ATTR):
        aid = struct.unpack_from("<I", raw, k)[0]
        v = raw[k + 8:k + ATTR]
        i32 = struct.unpack_from("<i", v)[0]
        if aid in (4, 11):      # CLUSTER_DIMENSION, PREFERRED_CLUSTER_DIMENSION
            out["cluster" if aid == 4 else "preferred_cluster"] = list(struct.unpack_from("<3I", v))
        elif aid == 5:
            out["cluster_scheduling"] = i32
        elif aid == 6:
            out["pdl"] = i32
        elif aid == 7:          # PROGRAMMATIC_EVENT: {CUevent, int flags, int triggerAtBlockStart}
            ev, fl, trig = struct.unpack_from("<Qii", v)
            out["pdl_event"] = {"event": _ptr(ev), "flags": fl, "trigger_at_block_start": trig}
        elif aid == 8:
            out["priority"] = i32
        elif aid == 2:
            out["cooperative"] = i32
        elif aid == 10:
            out["mem_sync_domain"] = i32
        elif aid == 9:          # MEM_SYNC_DOMAIN_MAP: {unsigned char default_, remote}
            out["mem_sync_domain_map"] = [v[0], v[1]]
        elif aid == 12:         # LAUNCH_COMPLETION_EVENT: {CUevent, int flags}
            ev, fl = struct.unpack_from("<Qi", v)
            out["completion_event"] = {"event": _ptr(ev), "flags": fl}
        elif aid == 14:
            out["smem_carveout"] = struct.unpack_from("<I", v)[0]
        else:
            out[f"attr_{aid}"] = v.hex()
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
            raise ValueError(f"{folder}: no {LAUNCHES_BIN} in this folder")
        if not (folder / FUNCTIONS).is_file():
            raise ValueError(f"{folder}: no {FUNCTIONS} (the parameter layouts the records need)")
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
        print(f"capture.binfmt: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    ap = _Parser(prog="python -m capture.binfmt",
                 description="Rewrite a process folder's launches.bin as compact launches.jsonl.")
    ap.add_argument("pid_dir", type=Path)
    ap.add_argument("--out", type=Path, help="output file (default: PID_DIR/launches.jsonl)")
    args = ap.parse_args(argv)
    out = args.out or args.pid_dir / "launches.jsonl"
    if out.exists() or out.is_symlink():
        print(f"capture.binfmt: {out} exists; remove it or pass another --out", file=sys.stderr)
        return 2
    try:
        dump = BinDump(args.pid_dir)
    except (ValueError, OSError) as exc:
        print(f"capture.binfmt: {exc}", file=sys.stderr)
        return 2
    try:
        with open(out, "x") as fh:
            for rec in dump.records():
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    except OSError as exc:
        print(f"capture.binfmt: cannot write {out} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    notes = []
    if dump.damaged:
        notes.append(f"skipped {dump.damaged} damaged record(s)")
    if dump.unknown_fn:
        notes.append(f"{dump.unknown_fn} record(s) name a function {FUNCTIONS} lacks (written with no params)")
    print(f"capture.binfmt: wrote {len(dump.offs)} record(s) to {out}"
          + (f"; {'; '.join(notes)}" if notes else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
