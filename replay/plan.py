"""What it takes to run one captured launch again, alone: its plan, made on the CPU from the dump.

Why a plan apart from the GPU: every decision that can be wrong -- which bytes form the
parameter buffer, which words are device pointers and into what, how much of each allocation a
fresh copy needs, which 128-byte windows are tensor maps to encode again -- is made here, from the
dump alone, and tested against committed captures on any machine. `replay.gpu` only executes it.

A plan rebases memory per *allocation*: every pointer word lands in a captured allocation (buffer
id, base, size, offset); all the words of one launch that land in one allocation share one fresh
region, so their distances stay as captured (q, k and v views of one tensor remain views). A
region covers the allocation from its lowest used offset (rounded down to REGION_ALIGN, which
keeps every pointer's alignment modulo that) to the allocation's end, or, for a large one (a KV
pool is most of the GPU), `max_region` bytes past its highest used offset: a launch that reaches
further faults, and the replay says which region was truncated. Words into pinned host memory that the
allocation log records (`host_alloc` / `host_register` in allocs.jsonl: an engine's staging
buffers, which its kernels read through the mapping) get a fresh *mapped* host region the same
way. Other words that point at host memory (cuBLASLt's alpha/beta, a host-pointer scalar) keep
their value: the kernel never dereferences them. Tensor maps (TMA descriptors passed by value) are found as 64-byte-aligned 128-byte windows
of a parameter equal to an encode recorded in tensormaps.jsonl; the GPU side encodes them again
with the same arguments onto the region holding their global address.
Not handled: pointers the kernel loads from device memory (a pointer table in a buffer keeps the
captured addresses), graph-memory nodes, and launches whose cubin the dump does not hold (closed
libraries are kept by hash only): those plans carry `missing`, one sentence, and never run.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vocab.errors import MineError

REGION_ALIGN = 1 << 16
MAX_REGION = 4 << 20           # bytes past the highest used offset of a truncated allocation
MAX_TOTAL = 24 << 30           # all regions of one launch together
ADDRESS_LO, ADDRESS_HI = 1 << 32, 1 << 47   # where x86-64 user-space pointers of a CUDA process live


class PlanError(MineError, ValueError):
    """The dump cannot give a runnable plan for this launch: one sentence saying why."""


@dataclass
class Region:
    buffer_id: int
    alloc_base: int
    alloc_size: int
    start: int                 # offset in the allocation where the fresh copy begins
    length: int
    truncated: bool            # the fresh copy ends before the allocation did
    host: bool = False         # pinned host memory mapped into the device (allocs.jsonl host_*)


@dataclass
class PtrWord:
    i: int                     # parameter index
    at: int                    # byte offset inside that parameter
    pos: int                   # byte offset in the whole parameter buffer
    region: int                # index into LaunchPlan.regions
    offset: int                # byte offset inside the region (captured offset - region start)
    captured: int              # the captured value, for reports


@dataclass
class TensorMap:
    i: int                     # the by-value parameter holding it
    at: int                    # its byte offset in that parameter (64-aligned)
    encode: dict               # the tensormaps.jsonl record
    region: int | None         # the region of its global address (None: outside every allocation)
    offset: int


@dataclass
class LaunchPlan:
    seq: int
    symbol: str
    sha256: str
    cubin: Path | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    cluster: tuple[int, int, int] | None
    attrs: dict                # every launch attribute recorded (cluster, pdl, priority, ...)
    params: list[bytes]        # each parameter's captured bytes, in ABI order
    offsets: list[int]         # each parameter's offset in the buffer
    words: list[PtrWord]
    tmaps: list[TensorMap]
    regions: list[Region]
    unmapped: list[tuple[int, int, int]] = field(default_factory=list)  # (i, at, value): address-like, in no allocation
    missing: str | None = None # why it cannot run (no cubin, no layout); None: runnable
    # pointers the kernel loads from memory (a table of buffer addresses), found in a forward
    # replay's bytes (replay.forward.find_tables): (region, byte offset, target region, target
    # offset, captured value); each is rewritten onto the target's fresh region before a run
    indirect: list[tuple[int, int, int, int, int]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(r.length for r in self.regions)


def _param_bytes(row) -> bytes:
    size = int(row["size"])
    hx = row.get("hex")
    if size > 8:
        if not isinstance(hx, str) or len(hx) != 2 * size:
            raise PlanError(f"launch {int(row['seq'])}: parameter {int(row['i'])} ({size} bytes) has no "
                            "captured bytes")
        return bytes.fromhex(hx)
    v = int(row["value"]) & ((1 << (8 * size)) - 1) if size else 0
    return v.to_bytes(size, "little")


def read_attrs(folder: Path, seqs: set[int]) -> dict[int, dict]:
    """launch_attrs of the records `seqs` (the loaded frames leave them out): from launches.bin
    through vocab.binfmt, or from launches.jsonl lines."""
    out: dict[int, dict] = {}
    if (folder / "launches.bin").is_file():
        from vocab import binfmt

        for rec in binfmt.BinDump(folder).records():
            if rec["seq"] in seqs:
                out[rec["seq"]] = rec.get("launch_attrs") or {}
        return out
    src = folder / "launches.jsonl"
    if src.is_file():
        with open(src, "rb") as f:
            for line in f:
                if b'"launch_attrs":{}' in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("seq") in seqs:
                    out[rec["seq"]] = rec.get("launch_attrs") or {}
    return out


def _records(src: Path):
    """The JSON objects of a side file's lines; a damaged line is skipped (the analysis' own
    readers report damage, mining/damage.py; a plan only needs the records that are whole)."""
    if not src.is_file():
        return
    for line in src.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def read_tensormaps(folder: Path) -> list[dict]:
    return [r for r in _records(folder / "tensormaps.jsonl")
            if isinstance(r.get("hex"), str) and len(r["hex"]) == 256]


def read_host_ranges(folder: Path) -> list[tuple[int, int, int, int]]:
    """Pinned host allocations of the log as (base, size, first seq, end seq): live for launches
    first <= seq < end (docs/dump-format.md, "Allocation log": events apply in (seq_before,
    order) order; a free or unregister ends the range at its base)."""
    ev = []
    for r in _records(folder / "allocs.jsonl"):
        if r.get("result") != 0 or not str(r.get("event", "")).startswith("host_"):
            continue
        try:
            ev.append((int(r["seq_before"]), int(r.get("order", 0)), r["event"], int(r["base"], 16), r.get("size")))
        except (KeyError, TypeError, ValueError):
            continue
    live: dict[int, tuple[int, int]] = {}
    out = []
    for seq, _, kind, base, size in sorted(ev):
        if kind in ("host_alloc", "host_register") and isinstance(size, int) and size > 0:
            if base in live:
                out.append((base, live[base][0], live[base][1], seq))
            live[base] = (size, seq)
        elif kind in ("host_free", "host_unregister") and base in live:
            size0, first = live.pop(base)
            out.append((base, size0, first, seq))
    out += [(b, s, f, 1 << 62) for b, (s, f) in live.items()]
    return sorted(out)


HOST_ID = 1 << 60              # region ids of host ranges (apart from device buffer ids)


def _words8(params: list[bytes], taken: set):
    """(param, byte offset, value) of every 8-byte-aligned little-endian word not in `taken`."""
    for i, b in enumerate(params):
        for at in range(0, len(b) - 7, 8):
            if (i, at) not in taken:
                yield i, at, struct.unpack_from("<Q", b, at)[0]


def _host_words(params: list[bytes], offsets: list[int], taken: set, ranges, seq: int):
    """8-byte words of the parameters that point into a pinned host range live at `seq`, as
    words-frame rows (i, at, buffer_id, alloc_base, alloc_size, ptr_off, value)."""
    live = sorted((b, s) for b, s, first, end in ranges if first <= seq < end)
    rows = []
    if live:
        lo = min(b for b, _ in live)
        hi = max(b + s for b, s in live)
        for i, b in enumerate(params):
            n = len(b) // 8
            if not n:
                continue
            v = np.frombuffer(b, "<u8", n)
            # words that can be host pointers at all, before the per-range test (a 1 KB struct has
            # 128 words; most params have none near the host ranges)
            for k in np.flatnonzero((v >= np.uint64(lo)) & (v < np.uint64(hi))).tolist():
                at, val = k * 8, int(v[k])
                if (i, at) in taken:
                    continue
                for base, size in live:
                    if base <= val < base + size:
                        rows.append({"i": i, "at": at, "buffer_id": HOST_ID + base, "alloc_base": base,
                                     "alloc_size": size, "ptr_off": val - base, "value": val})
                        break
    return pd.DataFrame(rows, columns=["i", "at", "buffer_id", "alloc_base", "alloc_size", "ptr_off", "value"])


def _regions(words: pd.DataFrame, extra: list[tuple[int, int, int, int]], max_region: int
             ) -> tuple[list[Region], dict[int, int]]:
    """One region per allocation the launch points into: `words` rows (buffer_id, alloc_base,
    alloc_size, ptr_off) plus `extra` (the same four, tensor-map globals)."""
    used: dict[int, list] = {}
    for bid, base, size, off in list(zip(words["buffer_id"], words["alloc_base"], words["alloc_size"],
                                         words["ptr_off"])) + extra:
        used.setdefault(int(bid), [int(base), int(size), []])[2].append(int(off))
    regions, index = [], {}
    for bid, (base, size, offs) in sorted(used.items()):
        start = min(offs) // REGION_ALIGN * REGION_ALIGN
        whole = size - start
        length = min(whole, max(offs) - start + max_region)
        index[bid] = len(regions)
        regions.append(Region(bid, base, size, start, max(length, 1), length < whole, bid >= HOST_ID))
    return regions, index


def plan_launch(dump, seq: int, max_region: int = MAX_REGION, attrs: dict | None = None,
                tensormaps: list[dict] | None = None, max_total: int = MAX_TOTAL,
                host_ranges: list | None = None) -> LaunchPlan:
    """The plan of launch `seq` of a loaded dump (`mining.load.load_dump`). `attrs`,
    `tensormaps` and `host_ranges` (from `read_attrs` / `read_tensormaps` / `read_host_ranges`)
    can be passed when planning many."""
    L = dump.launches
    hit = np.flatnonzero(L["seq"].to_numpy() == seq)
    if len(hit) == 0:
        raise PlanError(f"{dump.source}: no launch record with seq {seq}")
    r = L.iloc[int(hit[0])]
    folder = dump.source.parent
    sha = str(r["sha256"])
    cubin = folder / "cubins" / f"{sha}.cubin"
    missing = None
    if not cubin.is_file():
        missing = (f"launch {seq} (`{r['symbol']}`) ran a module whose cubin the dump does not hold "
                   f"({sha[:16]}...: closed libraries are kept by hash only, and a packed fixture may "
                   "have dropped others): it cannot be replayed")
        cubin = None
    if str(r["layout"]) == "none":
        missing = missing or f"launch {seq} (`{r['symbol']}`) has no parameter layout: its bytes cannot be rebuilt"
    p = dump.params
    p = p[p["seq"].to_numpy() == seq].sort_values(["i", "at"], kind="stable")
    heads = p[~p["word"].to_numpy()]
    params, offsets = [], []
    for _, row in heads.iterrows():
        params.append(_param_bytes(row))
        offsets.append(int(row["off"]))
    if len(params) != int(r["n_params"]) and missing is None:
        missing = f"launch {seq}: {len(params)} of its {int(r['n_params'])} parameters were recorded"
    ptr = p[p["is_ptr"].to_numpy() & (p["buffer_id"].to_numpy() >= 0)]
    tmaps_all = read_tensormaps(folder) if tensormaps is None else tensormaps
    by_hex = {t["hex"]: t for t in tmaps_all}
    found: list[tuple[int, int, dict]] = []
    for i, b in enumerate(params):
        for at in range(0, len(b) - 127, 64):
            t = by_hex.get(b[at:at + 128].hex())
            if t is not None:
                found.append((i, at, t))
    # a pointer word inside a tensor map is the map's own business (it is encoded again)
    inside = {(i, a) for i, at, _ in found for a in range(at, at + 128, 8)}
    ptr = ptr[[(int(i), int(a)) not in inside for i, a in zip(ptr["i"], ptr["at"])]]
    ptr = ptr[["i", "at", "buffer_id", "alloc_base", "alloc_size", "ptr_off", "value"]]
    host = _host_words(params, offsets, {(int(i), int(a)) for i, a in zip(ptr["i"], ptr["at"])} | inside,
                       read_host_ranges(folder) if host_ranges is None else host_ranges, seq)
    if len(host):
        ptr = pd.concat([ptr.astype("int64"), host.astype("int64")], ignore_index=True)
    extra = []
    for _, _, t in found:
        tp = t.get("ptr")
        if isinstance(tp, dict) and tp.get("id") is not None:
            extra.append((int(tp["id"]), int(tp["base"], 16), int(tp["size"]), int(tp["off"])))
    regions, index = _regions(ptr, extra, max_region)
    words = [PtrWord(int(w["i"]), int(w["at"]), offsets[int(w["i"])] + int(w["at"]), index[int(w["buffer_id"])],
                     int(w["ptr_off"]) - regions[index[int(w["buffer_id"])]].start, int(w["value"]) & (2**64 - 1))
             for _, w in ptr.iterrows()]
    tmaps = []
    for i, at, t in found:
        tp = t.get("ptr")
        if isinstance(tp, dict) and tp.get("id") is not None:
            k = index[int(tp["id"])]
            tmaps.append(TensorMap(i, at, t, k, int(tp["off"]) - regions[k].start))
        else:
            tmaps.append(TensorMap(i, at, t, None, 0))
    total = sum(g.length for g in regions)
    if total > max_total and missing is None:
        missing = (f"launch {seq}: its {len(regions)} regions need {total / 2**30:.1f} GiB, above the "
                   f"{max_total / 2**30:.0f} GiB limit")
    # 8-byte words that look like user-space addresses but lie in no captured device allocation:
    # host memory the kernel may read through a mapping (pinned staging buffers), which a replay
    # cannot give it; named when such a launch faults
    taken = {(w.i, w.at) for w in words} | {(t.i, a) for t in tmaps for a in range(t.at, t.at + 128, 8)}
    unmapped = [(i, at, v) for i, at, v in _words8(params, taken) if ADDRESS_LO <= v < ADDRESS_HI and v % 256 == 0]
    a = attrs if attrs is not None else read_attrs(folder, {seq}).get(seq, {})
    cl = a.get("cluster")
    return LaunchPlan(seq, str(r["symbol"]), sha, cubin,
                      (int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])),
                      (int(r["block_x"]), int(r["block_y"]), int(r["block_z"])), int(r["smem"]),
                      tuple(int(x) for x in cl) if isinstance(cl, list) and len(cl) == 3 else None,
                      a, params, offsets, words, tmaps, regions, unmapped, missing=missing)


def rebased(plan: LaunchPlan, bases: list[int], maps: dict[int, bytes] | None = None) -> list[bytes]:
    """The plan's parameters with every pointer word moved onto fresh regions (`bases`, one device
    address per region) and every tensor map replaced by its new encoding (`maps`: index into
    plan.tmaps -> 128 bytes)."""
    out = [bytearray(b) for b in plan.params]
    for w in plan.words:
        struct.pack_into("<Q", out[w.i], w.at, bases[w.region] + w.offset)
    for k, t in enumerate(plan.tmaps):
        if maps and k in maps:
            out[t.i][t.at:t.at + 128] = maps[k]
    return [bytes(b) for b in out]
