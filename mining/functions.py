"""The compact dump form (MINE_CAPTURE_COMPACT=1): functions.jsonl, joined back into launches.

Why: a compact capture writes each distinct function once to `functions.jsonl` (`fn` id, handle,
func, module, sha256, symbol, name, attrs, layout, params_layout) and launch records carry `"fn"`
instead of those keys, with params of `{"i", "hex"}` (+ ptrs/host/tmap) only. `mining/jsonl.py`
calls `expand()` on every parsed chunk, before the frame columns are built, so a compact dump gives
exactly the frames its default-form twin gives: per-function columns are taken from the function
table, each parameter's off/size from its function's layout by index `i`.

Mixed files are fine: a launch without `fn` (the capture writes a launch in the default form when
it could not write its function record) keeps its own keys. Damage: a functions.jsonl cut short
(truncated last line), lines that do not parse, lines with a field outside its documented range
(an id, a layout entry, a module, regs) and a second line for an id are dropped, warned about and
reported per line (`mining/damage.py`); launches whose `fn` is not in the file are
dropped and counted (one warning, `Functions.missing`), never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mining.damage import FileReport, lines_report
from mining.frames import MAX_PARAM_BYTES, MAX_PARAMS

FUNCTIONS = "functions.jsonl"
_STRS = ("handle", "sha256", "symbol", "name", "layout")


@dataclass
class Functions:
    ids: np.ndarray                    # sorted function ids
    cols: dict                         # column -> arrow array, one row per id (in `ids` order)
    lay_start: np.ndarray              # row -> first entry of its layout in lay_off/lay_size
    lay_n: np.ndarray                  # row -> number of parameters in its layout
    lay_off: np.ndarray
    lay_size: np.ndarray
    missing: list[int] = field(default_factory=list)  # per chunk: launches dropped (unknown fn)


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _str(v) -> bool:
    return v is None or isinstance(v, str)


def _function(line: bytes):
    """One functions.jsonl line -> (id, its row), or None when a field is outside its documented
    range (docs/dump-format.md "Compact form" and "Reading damaged dumps")."""
    try:
        r = json.loads(line)
    except ValueError:
        return None
    if not isinstance(r, dict) or not _int(r.get("fn"), 0, 1 << 31):
        return None
    lay = r.get("params_layout") or []
    if not isinstance(lay, list) or len(lay) > MAX_PARAMS:
        return None
    for e in lay:
        if not (isinstance(e, list) and len(e) == 3 and _int(e[0], 0, MAX_PARAMS)
                and _int(e[1], 0, MAX_PARAM_BYTES + 1) and _int(e[2], 0, MAX_PARAM_BYTES + 1)):
            return None
    if sorted(e[0] for e in lay) != list(range(len(lay))):   # parameter i once each, 0..n-1
        return None
    attrs = r.get("attrs") or {}
    regs = attrs.get("regs") if isinstance(attrs, dict) else None
    module = r.get("module")
    if not (all(_str(r.get(k)) for k in _STRS) and (module is None or _int(module, -1, 1 << 62))
            and (regs is None or _int(regs, 0, 1 << 15))):
        return None
    return int(r["fn"]), {"handle": r.get("handle"), "module": module, "sha256": r.get("sha256"),
                          "symbol": r.get("symbol"), "name": r.get("name"), "layout": r.get("layout"),
                          "regs": regs, "lay": [tuple(e) for e in lay]}


def read_functions(path: Path, warnings: list[str], report: FileReport | None = None) -> Functions:
    """functions.jsonl -> Functions; damaged lines (not JSON, a field outside its range, an id an
    earlier line had) are dropped with a warning and reported per line."""
    data = path.read_bytes()
    seen: set[int] = set()

    def keep(line):
        got = _function(line)
        if got is None or got[0] in seen:
            return None
        seen.add(got[0])
        return got

    def why(line):
        got = _function(line)
        return "not a function record of the documented types and ranges" if got is None else \
            f"fn {got[0]} again (an earlier line has it)"

    got, rep = lines_report(FUNCTIONS, data, keep, why)
    if report is not None:
        report.merge(rep)
    recs = dict(got)
    cut = [r for r in rep.ranges if r.reason.startswith("truncated")]
    if cut:
        warnings.append(f"{FUNCTIONS}: dropped a truncated last line ({cut[0].end - cut[0].start} bytes)")
    if rep.skipped > len(cut):
        warnings.append(f"{FUNCTIONS}: dropped {rep.skipped - len(cut)} unparsable line(s)")
    ids = np.array(sorted(recs), np.int64)
    rows = [recs[i] for i in ids.tolist()]
    cols = {c: pa.array([r[c] for r in rows], pa.string()) for c in _STRS}
    cols["module"] = pa.array([r["module"] for r in rows], pa.int64())
    cols["regs"] = pa.array([r["regs"] for r in rows], pa.int64())
    lay_n = np.array([len(r["lay"]) for r in rows], np.int64)
    lay_start = np.concatenate([[0], np.cumsum(lay_n)[:-1]]).astype(np.int64) if len(rows) else lay_n
    lay_off = np.zeros(int(lay_n.sum()), np.int64)
    lay_size = np.zeros(int(lay_n.sum()), np.int64)
    for r, s in zip(rows, lay_start.tolist()):
        for i, o, z in r["lay"]:   # i is 0..n-1 once each (checked by _function)
            lay_off[s + i], lay_size[s + i] = o, z
    return Functions(ids, cols, lay_start, lay_n, lay_off, lay_size)


def expand(t: pa.Table, F: Functions | None) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray] | None]:
    """A parsed chunk -> (the chunk with per-function columns filled in, (off, size) per flattened
    parameter or None when no launch of the chunk is compact)."""
    fn = t.column("fn")
    if fn.null_count == len(fn):
        return t, None
    fnv = pc.fill_null(fn, -1).to_numpy()
    has = fnv >= 0
    if F is None or not len(F.ids):
        row = np.full(len(fnv), -1, np.int64)
    else:
        row = np.searchsorted(F.ids, fnv).clip(0, len(F.ids) - 1)
        row = np.where(F.ids[row] == fnv, row, -1)
    lost = has & (row < 0)
    if F is not None:
        F.missing.append(int(lost.sum()))
    if lost.any():
        keep = ~lost
        t = t.filter(pa.array(keep))
        has, row = has[keep], row[keep]
    if F is None or not has.any():
        return t, None
    mask = pa.array(has)
    take = pa.array(np.where(has, row, 0))
    for c in _STRS + ("module",):
        t = t.set_column(t.schema.get_field_index(c), c,
                         pc.if_else(mask, F.cols[c].take(take), _one(t.column(c))))
    regs = pc.if_else(mask, F.cols["regs"].take(take), _one(pc.struct_field(t.column("attrs"), "regs")))
    t = t.set_column(t.schema.get_field_index("attrs"), "attrs",
                     pa.StructArray.from_arrays([regs], ["regs"]))
    params = _one(t.column("params"))
    flat = pc.list_flatten(params)
    parent = pc.list_parent_indices(params).to_numpy()
    off = pc.fill_null(pc.struct_field(flat, "off"), 0).to_numpy().astype(np.int64)
    size = pc.fill_null(pc.struct_field(flat, "size"), 0).to_numpy().astype(np.int64)
    i = pc.fill_null(pc.struct_field(flat, "i"), -1).to_numpy().astype(np.int64)
    prow = row[parent]
    comp = has[parent]
    ok = comp & (i >= 0) & (i < F.lay_n[prow.clip(0)])
    pos = F.lay_start[prow.clip(0)] + i
    off = np.where(comp, 0, off)
    size = np.where(comp, 0, size)
    off[ok] = F.lay_off[pos[ok]]
    size[ok] = F.lay_size[pos[ok]]
    return t, (off, size)


def _one(arr):
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr
