"""Offline pointer classification from the allocation log (`allocs.jsonl`, docs/dump-format.md).

Why: classifying every 8-byte parameter word with a driver call inside the launch callback costs
0.35-0.55 us per launch (docs/benchmarks.md, "Capture overhead"). With MINE_CAPTURE_ALLOC_LOG=1
the capture logs every allocation, free and mapping instead, and a capture can skip the per-launch
lookups (MINE_CAPTURE_CLASSIFY=0); this module answers "which live allocation does this word
point into at launch seq s" afterwards, for all words at once.

The rule (docs/dump-format.md "allocs.jsonl"): events are applied in (seq_before, order) order
(file order when `order` is absent); a launch with seq s sees the events with seq_before <= s.
An allocation or mapping (`alloc`, `map`, `ipc_open`, `import`, `ext_map`, `gfx_map`) that
succeeded (result 0) is live from its seq_before until the next event at the same base address
(its free, unmap or ipc_close, or a new allocation reusing the address), or until a `cuMemUnmap`
whose range covers its base. Reservations (`reserve`), physical handles (`create`, `release`),
access changes and host memory (`host_*`) never make device memory live. Buffer ids: the logged
`id` (the driver's BUFFER_ID, the same number the capture puts in `ptrs`), else
SYNTHETIC_ID + the event's index, so a reused address always gets a new id.

The lookup is vectorised: intervals sorted by (base, seq_from); for each word, the group of
intervals with the largest base <= value, then, inside it, the one with the largest seq_from <= s
(one searchsorted over a combined key). If that one is not live at s the word steps to the
previous base group (only words still unresolved, with a running maximum of interval ends
cutting off words that no earlier interval reaches). Live intervals never overlap, so the first
live interval found decides: the word is inside it, or in no live allocation.

Not checked: that the log is complete (a free the capture did not see leaves an allocation live
until its address is reused; meta.json counters.alloc_dropped says when records were lost).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pj

from mining import schema
from mining.damage import FileReport

ALLOC_LOG = "allocs.jsonl"
CREATE = ("alloc", "map", "ipc_open", "import", "ext_map", "gfx_map")
END_AT_BASE = ("free", "ipc_close", "unmap")
SYNTHETIC_ID = 1 << 48   # ids for allocations the log has no driver id for
NEVER = np.iinfo(np.int64).max
PLAUSIBLE_LO, PLAUSIBLE_HI = 0x10000, 0x800000000000   # as the capture's filter (alloc.c)


def _valid_events(t: pa.Table) -> np.ndarray:
    """Which allocs.jsonl records have every field inside its documented range: seq_before and
    t_ns non-negative, size absent or non-negative, base absent or a '0x' hex number of at most
    16 digits, event and api present (docs/dump-format.md "Allocation log")."""
    import pyarrow.compute as pc

    def ints(name, default):
        return np.asarray(t.column(name).fill_null(default).to_numpy(), np.int64)

    if t.num_rows == 0:
        return np.zeros(0, bool)
    sb = t.column("seq_before")
    ok = sb.is_valid().to_numpy(zero_copy_only=False).copy()
    ok &= (ints("seq_before", 0) >= 0) & (ints("seq_before", 0) < 1 << 62)
    ok &= (ints("t_ns", 0) >= 0) & (ints("size", 0) >= -1) & (ints("id", -1) >= -1)
    ok &= (ints("order", 0) >= -1)
    ok &= t.column("event").is_valid().to_numpy(zero_copy_only=False)
    base = t.column("base")
    good = pc.match_substring_regex(base.fill_null("0x0"), r"^0x[0-9a-fA-F]{1,16}$")
    ok &= good.to_numpy(zero_copy_only=False)
    return ok


def read_alloc_log(path: Path, warnings: list[str], report: FileReport | None = None) -> pd.DataFrame:
    """allocs.jsonl -> one row per event (schema.ALLOC_COLUMNS), in file order; tolerant of a
    truncated last line, NUL bytes, unparsable lines and records with a field outside its range
    (dropped, counted in `warnings` and reported per line in `report`)."""
    from mining.jsonl import read_lines_file  # not at the top: mining.jsonl imports this module

    opts = pj.ParseOptions(explicit_schema=schema.ALLOC_RECORD, unexpected_field_behavior="ignore")
    t, rep = read_lines_file(Path(path).name, Path(path).read_bytes(), opts, _valid_events, warnings,
                             "allocation event(s)")
    if report is not None:
        report.merge(rep)
    return _frame(t)


def _frame(t: pa.Table) -> pd.DataFrame:
    from mining.frames import hex_num_u64  # not at the top: mining.frames imports this module

    n = t.num_rows

    def ints(name, default):
        return t.column(name).fill_null(default).to_numpy().astype(schema.ALLOC_COLUMNS[name])

    order = t.column("order")
    df = pd.DataFrame({
        "seq_before": ints("seq_before", 0),
        "order": ints("order", -1) if order.null_count < n else np.arange(n, dtype=np.int64),
        "t_ns": ints("t_ns", 0),
        "event": pd.Categorical(t.column("event").fill_null("").to_pandas()),
        "api": pd.Categorical(t.column("api").fill_null("").to_pandas()),
        "base": hex_num_u64(t.column("base")) if n else np.zeros(0, np.uint64),
        "has_base": t.column("base").is_valid().to_numpy(zero_copy_only=False).astype(bool),
        "size": ints("size", -1),
        "id": ints("id", -1),
        "result": ints("result", 0),
    })
    return df.astype(schema.ALLOC_COLUMNS)


@dataclass
class Intervals:
    """Device-live intervals [base, end) x [seq_from, seq_to), sorted by (base, seq_from)."""
    base: np.ndarray      # uint64
    end: np.ndarray       # uint64
    seq_from: np.ndarray  # int64
    seq_to: np.ndarray    # int64 (NEVER: live to the end)
    id: np.ndarray        # int64

    def __len__(self) -> int:
        return len(self.base)


def intervals(events: pd.DataFrame) -> Intervals:
    """The live device intervals an event frame (read_alloc_log) describes."""
    ev = events[(events["result"] == 0) & events["has_base"]]
    ev = ev.iloc[np.lexsort((np.arange(len(ev)), ev["order"].to_numpy(), ev["seq_before"].to_numpy()))]
    kind = ev["event"].astype(str).to_numpy()
    base = ev["base"].to_numpy(np.uint64)
    size = ev["size"].to_numpy(np.int64)
    seq = ev["seq_before"].to_numpy(np.int64)
    ids = ev["id"].to_numpy(np.int64)
    pos = np.arange(len(ev))
    is_create = np.isin(kind, CREATE) & (base != 0) & (size > 0)
    is_end = np.isin(kind, END_AT_BASE)
    addr = np.nonzero(is_create | is_end)[0]          # events that open or close an address
    o = addr[np.lexsort((pos[addr], base[addr]))]     # by base, then by time
    same_next = np.zeros(len(o), bool)
    same_next[:-1] = base[o[1:]] == base[o[:-1]]
    nxt = np.full(len(o), -1)
    nxt[:-1] = o[1:]
    c = is_create[o]
    creates = o[c]
    end_pos = np.where(same_next[c], nxt[c], len(ev))  # index (in time order) of the closing event
    # cuMemUnmap of a range holding several mappings: closes those with a base inside the range
    # (the common one-mapping unmap at the same base is covered above).
    is_map = kind[creates] == "map"
    if is_map.any():
        for u in np.nonzero((kind == "unmap") & (size > 0))[0]:
            lo, hi = base[u], base[u] + np.uint64(size[u])
            hit = is_map & (base[creates] > lo) & (base[creates] < hi) & (creates < u) & (end_pos > u)
            end_pos[hit] = u
    seq_ext = np.append(seq, NEVER)
    ids_c = ids[creates]
    ids_c = np.where(ids_c >= 0, ids_c, SYNTHETIC_ID + creates)
    iv_base = base[creates]
    iv_from = seq[creates]
    iv_to = seq_ext[end_pos]
    keep = iv_to > iv_from                               # freed before any launch saw it: nothing
    srt = np.lexsort((iv_from[keep], iv_base[keep]))
    return Intervals(iv_base[keep][srt], (iv_base + size[creates].astype(np.uint64))[keep][srt],
                     iv_from[keep][srt], iv_to[keep][srt], ids_c[keep][srt])


def lookup(iv: Intervals, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """For each word (launch seq s, value v): the index of the interval holding it, else -1."""
    n = len(s)
    out = np.full(n, -1, np.int64)
    if n == 0 or len(iv) == 0:
        return out
    v = np.asarray(v, np.uint64)
    s = np.asarray(s, np.int64)
    ub, gstart = np.unique(iv.base, return_index=True)
    gid = np.repeat(np.arange(len(ub), dtype=np.int64), np.diff(np.append(gstart, len(iv))))
    froms = np.unique(iv.seq_from)
    k = np.int64(len(froms) + 1)
    keys = gid * k + np.searchsorted(froms, iv.seq_from)     # ascending: sorted by (base, from)
    reach = np.maximum.accumulate(np.maximum.reduceat(iv.end, gstart))  # max end over groups <= g
    g = np.searchsorted(ub, v, "right").astype(np.int64) - 1
    idx = np.nonzero((g >= 0) & (v >= PLAUSIBLE_LO) & (v < PLAUSIBLE_HI))[0]
    gg = g[idx]
    keep = reach[gg] > v[idx]
    idx, gg = idx[keep], gg[keep]
    rank = np.searchsorted(froms, s[idx], "right").astype(np.int64) - 1
    while len(idx):
        r = np.searchsorted(keys, gg * k + rank, "right") - 1
        live = (r >= gstart[gg]) & (iv.seq_to[r] > s[idx])
        hit = live & (iv.end[r] > v[idx])
        out[idx[hit]] = r[hit]
        cont = ~live
        idx, gg, rank = idx[cont], gg[cont] - 1, rank[cont]
        keep = gg >= 0
        idx, gg, rank = idx[keep], gg[keep], rank[keep]
        keep = reach[gg] > v[idx]
        idx, gg, rank = idx[keep], gg[keep], rank[keep]
    return out


@dataclass
class Offline:
    """What load.py hands the chunk workers: the intervals and what to do with them."""
    iv: Intervals
    mode: str                 # "fill": no ptrs were recorded; "check": compare with ptrs
    disagree: list            # per chunk, words where the log and the recorded ptrs differ


def classify_words(iv: Intervals, seqs: np.ndarray, value: np.ndarray, at: np.ndarray,
                   owner: np.ndarray) -> dict:
    """Words (owner row, byte offset `at`, value, launch seq) -> the pointer words among them, in
    the shape load.py builds from recorded `ptrs`: owner, at, base, size, id, off."""
    r = lookup(iv, seqs, value)
    hit = r >= 0
    r = r[hit]
    base = iv.base[r]
    return {"owner": owner[hit], "at": at[hit], "base": base,
            "size": (iv.end[r] - base).astype(np.int64), "id": iv.id[r],
            "off": (value[hit] - base).astype(np.int64)}


def disagreements(rec: dict, off: dict) -> int:
    """Words where the recorded ptrs (rec) and the offline classification (off) differ: present in
    one only, or another base/size, or another id where the log had the driver's id."""
    def key(d):
        return d["owner"].astype(np.int64) * 8192 + d["at"].astype(np.int64) // 8

    ka, kb = key(rec), key(off)
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=False, return_indices=True)
    only = len(np.setdiff1d(ka, kb)) + len(np.setdiff1d(kb, ka))
    logged = off["id"][ib] < SYNTHETIC_ID
    diff = (rec["base"][ia] != off["base"][ib]) | (rec["size"][ia] != off["size"][ib]) \
        | (logged & (rec["id"][ia] != off["id"][ib]))
    return int(only + diff.sum())
