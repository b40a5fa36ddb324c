"""A little launches.bin encoder, written from docs/dump-format.md "Binary launch records" alone.

Why: the binary reader (vocab/binfmt.py, mining/binload.py) must be checked against the
contract, not against itself; this encoder shares no code with it (struct.pack of the documented
header, attribute and host-section layouts). Used by tests/capture/test_binfmt.py and
benchmarks/bench_load.py (--bin).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HEAD = struct.Struct("<II QQ Ii QQQQ Ii 3I 3I I BBBB II")
assert HEAD.size == 112
APIS = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz")
BIN_OPTIONS = {"format": "bin", "compact": 1, "alloc_log": 1, "classify": 0}


def pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def image(layout, values) -> bytes:
    """A kernelParams buffer image: parameter i's bytes at its layout offset, gaps zero."""
    end = max((off + size for _, off, size in layout), default=0)
    buf = bytearray(end)
    for (_, off, size), v in zip(layout, values):
        buf[off:off + size] = v[:size]
    return bytes(buf)


def record(seq: int, *, t_ns=0, tid=7, dev=0, ctx=0xC0, stream=0, graph=None, capture_id=0, fn=0,
           result=0, grid=(1, 1, 1), block=(1, 1, 1), smem=0, api="cuLaunchKernel", extra=False,
           nobytes=False, attrs=(), blob=b"", host=()) -> bytes:
    """One record. attrs: (id, value bytes) pairs; host: (at in the blob, addr, pointee bytes)."""
    flags = (graph is not None) | (extra << 1) | (nobytes << 2)
    tail = b"".join(struct.pack("<I4x", aid) + val.ljust(64, b"\0") for aid, val in attrs)
    tail += pad8(blob)
    tail += b"".join(struct.pack("<IIQ", at, len(p), addr) + pad8(p) for at, addr, p in host)
    head = HEAD.pack(112 + len(tail), 0x314C434D, seq, t_ns, tid, dev, ctx, stream, graph or 0,
                     capture_id if graph is not None else 0, fn, result, *grid, *block, smem,
                     APIS.index(api), flags, len(attrs), len(host), len(blob), 0)
    return head + tail


def write_functions(folder: Path, fns: list[dict]) -> None:
    """functions.jsonl from dicts with at least layout and params_layout (fn = list position)."""
    base = {"ctx": "0xc0", "handle": "function", "func": "0x0", "module": None, "sha256": None,
            "symbol": "k", "name": "k", "attrs": {"regs": 32}}
    with open(folder / "functions.jsonl", "w") as fh:
        for k, f in enumerate(fns):
            rec = {"fn": k, **{key: f.get(key, v) for key, v in base.items()}, "layout": f["layout"],
                   "params_layout": f["params_layout"]}
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def write_meta(folder: Path, pid: int = 1) -> None:
    (folder / "meta.json").write_text(json.dumps({"format_version": 1, "pid": pid,
                                                  "options": dict(BIN_OPTIONS)}))
