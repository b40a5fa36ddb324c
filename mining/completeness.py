"""Is a capture complete? Its kernels against a torch profiler trace of the same run, per kernel.

Why: the capture library sees launches through CUPTI's callback API; the torch profiler (kineto)
sees kernel executions through CUPTI's activity API, a different path through the driver. Two
records of one run that agree on every kernel -- how often each ran with each grid and block --
say nothing was missed (a launch API the library does not subscribe, a graph replay not put back
on the timeline, a process not injected) and nothing was invented.

- `read_trace(path)`: the kernel events of a chrome trace as kineto writes it (`export_chrome_trace`,
  `.json` or `.json.gz`): name, grid, block, ts (us), dur, stream;
- `capture_kernels(dump, start_ns, end_ns)`: what the dump's process ran in a host-time window
  (CLOCK_MONOTONIC, as the capture's `t_ns`): eager launches that succeeded plus every kernel of
  every CUDA-graph replay (mining/graphs.py), never the launches recorded inside a stream capture
  (they defined a graph, they did not run then);
- `compare(trace, capture)`: per (name, grid, block), the count on each side (`Completeness`);
- `reduce_trace(src, dst)`: a trace cut down to its kernel events, small enough to commit;
- `copy_nodes(dump, start_ns, end_ns)` and `loaded_names(dump)`: what accounts for the driver's
  own copy kernels (below).

Driver copy kernels. A CUDA graph's memcpy node (a D2D copy captured with the kernels, as a
graph copying its result into its static output buffer) can run on the GPU as a kernel of the
driver's own (`memcpy32_post` on the H200's driver 580): kineto reports it among the kernels, but
no launch API call exists for it, so no launch callback sees it, and no module the process loaded
holds it. The capture knows such nodes only as a count: a capture's `nodes` above the kernels
recorded into it. So `compare(..., copy_nodes=n, names=loaded_names(dump))` accounts for at most n
trace executions, of kernels whose name no loaded module carries, as `driver` (reported
separately, never as matched); any other difference stays missing or extra.

Names are compared after collapsing whitespace: kineto demangles with the C++ runtime's demangler,
the capture with the same one (`name`), so both carry the same text; a capture name left mangled
falls back to its symbol. Not compared: timings (host launch time and device start differ by
queueing), memcpy and memset activity (kineto's `gpu_memcpy`/`gpu_memset` events, not kernels),
and kernels of other processes (a trace covers one process, as `load_dump` picks one).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vocab.errors import MineError

KEY = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
TRACE_COLS = KEY + ["ts", "dur", "stream"]


class TraceError(MineError, ValueError):
    """A trace file that cannot be read as a chrome trace: names the file and what is wrong."""


def _norm(name: str) -> str:
    return re.sub(r"\s+", " ", str(name)).strip()


def _load_json(path: Path):
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, EOFError) as exc:   # JSONDecodeError, UnicodeDecodeError, a cut gzip stream
        raise TraceError(f"{path}: not a JSON chrome trace ({exc})") from None


def kernel_events(doc) -> list[dict]:
    """The kernel events of a parsed chrome trace (an object with `traceEvents`, or the list)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError("no traceEvents list")
    return [e for e in events if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel"
            and e.get("ph") == "X"]


def _dims(v) -> list[int]:
    if isinstance(v, (list, tuple)) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v):
        return [int(x) for x in v]
    return [-1, -1, -1]


def _file_events(path: Path) -> list[dict]:
    """The kernel events of the trace file at `path`; a TraceError names the file."""
    doc = _load_json(path)
    try:
        return kernel_events(doc)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None


def read_trace(path) -> pd.DataFrame:
    """The kernel events of the chrome trace at `path` (columns TRACE_COLS; -1 for a dim the event
    does not carry)."""
    events = _file_events(Path(path))
    rows = []
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        g, b = _dims(args.get("grid")), _dims(args.get("block"))
        rows.append([_norm(e.get("name", "")), *g, *b, float(e.get("ts", 0.0)), float(e.get("dur", 0.0)),
                     int(args.get("stream", -1)) if isinstance(args.get("stream"), int) else -1])
    return pd.DataFrame(rows, columns=TRACE_COLS).astype({c: "int64" for c in KEY[1:]})


def reduce_trace(src, dst) -> int:
    """Write `dst` (gzip when it ends .gz): `src`'s kernel events only, each with its name, ts,
    dur and the args grid, block, stream. Returns how many."""
    src, dst = Path(src), Path(dst)
    events = _file_events(src)
    keep = []
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        keep.append({"ph": "X", "cat": "kernel", "name": e.get("name", ""), "ts": e.get("ts", 0),
                     "dur": e.get("dur", 0),
                     "args": {k: args[k] for k in ("grid", "block", "stream") if k in args}})
    data = json.dumps({"traceEvents": keep}, separators=(",", ":")).encode()
    dst.write_bytes(gzip.compress(data, mtime=0) if dst.name.endswith(".gz") else data)
    return len(keep)


def capture_kernels(dump, start_ns: int | None = None, end_ns: int | None = None) -> pd.DataFrame:
    """Kernel executions of `dump` (mining.load.Dump) in [start_ns, end_ns] (either None: open):
    columns KEY + t_ns + seq + replay (-1 for an eager launch)."""
    from mining.graphs import executed, of_dump

    L = dump.launches
    ex = executed(L, of_dump(dump)).frame
    rows = ex["row"].to_numpy()
    t = ex["t_ns"].to_numpy()
    ok = L["result"].to_numpy()[rows] == 0
    if start_ns is not None:
        ok &= t >= start_ns
    if end_ns is not None:
        ok &= t <= end_ns
    rows, t = rows[ok], t[ok]
    name = L["name"].astype(str).to_numpy()[rows]
    sym = L["symbol"].astype(str).to_numpy()[rows]
    name = np.where((name == "") | (name == sym), sym, name)
    out = pd.DataFrame({"name": [_norm(n) for n in name]})
    for c in KEY[1:]:
        out[c] = L[c].to_numpy()[rows].astype(np.int64)
    out["t_ns"] = t
    out["seq"] = ex["seq"].to_numpy()[ok]
    out["replay"] = ex["replay"].to_numpy()[ok]
    return out


def copy_nodes(dump, start_ns: int | None = None, end_ns: int | None = None) -> int:
    """Non-kernel nodes the graph replays in [start_ns, end_ns] ran: per replay, its graph's node
    count (graphs.jsonl `capture_end` `nodes`) less the kernels captured into it."""
    from mining.graphs import executed, of_dump

    g = of_dump(dump)
    rep = executed(dump.launches, g).replays
    if rep.empty:
        return 0
    t = rep["t_ns"].astype("int64")
    ok = np.ones(len(rep), bool)
    if start_ns is not None:
        ok &= (t >= start_ns).to_numpy()
    if end_ns is not None:
        ok &= (t <= end_ns).to_numpy()
    g = g[g["t_ns"].notna()].astype({"t_ns": "int64"}).sort_values("t_ns", kind="stable")
    inst, ends = g[g["event"] == "instantiate"], g[g["event"] == "capture_end"]
    n = 0
    for x, when, kernels in rep.loc[ok, ["exec", "t_ns", "kernels"]].itertuples(index=False):
        i = inst[(inst["exec"] == x) & (inst["t_ns"] <= when)]
        c = ends[(ends["graph"] == i["graph"].iloc[-1]) & (ends["t_ns"] <= i["t_ns"].iloc[-1])] if len(i) else i
        if len(c) and pd.notna(c["nodes"].iloc[-1]):
            n += max(int(c["nodes"].iloc[-1]) - int(kernels), 0)
    return n


def loaded_names(dump) -> set[str]:
    """Every function name the process had: its launches' names and symbols, and the entries of
    every module it loaded (modules.jsonl)."""
    L = dump.launches
    out = set(L["name"].astype(str)) | set(L["symbol"].astype(str))
    src = dump.source.parent / "modules.jsonl"
    if src.is_file():
        for line in src.read_bytes().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and isinstance(r.get("entries"), list):
                out |= {e for e in r["entries"] if isinstance(e, str)}
    return {_norm(n) for n in out}


def _loaded(name: str, names: set[str]) -> bool:
    """Does a loaded function carry `name` (as-is, or demangled: its innermost identifier appears
    length-prefixed, as the Itanium mangling writes it, in a loaded symbol)."""
    if name in names:
        return True
    head = re.split(r"[(<]", name.replace("(anonymous namespace)", "anon"))[0].split()
    ident = re.findall(r"[A-Za-z_]\w*", head[-1].split("::")[-1]) if head else []
    if not ident:
        return False
    tag = f"{len(ident[-1])}{ident[-1]}"
    return any(tag in n for n in names)


@dataclass
class Completeness:
    """Per (name, grid, block): `trace` and `capture` counts and `driver`, the trace executions
    accounted for as the driver's copy kernels (`rows`, sorted by name); `copy_nodes`, the
    non-kernel graph nodes that could account for them."""
    rows: pd.DataFrame
    copy_nodes: int = 0

    @property
    def trace_kernels(self) -> int:
        return int(self.rows["trace"].sum())

    @property
    def capture_kernels(self) -> int:
        return int(self.rows["capture"].sum())

    @property
    def driver_kernels(self) -> int:
        return int(self.rows["driver"].sum())

    @property
    def driver(self) -> pd.DataFrame:
        """Kernel shapes (some of) whose trace executions are the driver's copy kernels."""
        return self.rows[self.rows["driver"] > 0]

    @property
    def missing(self) -> pd.DataFrame:
        """Kernel shapes the trace ran more often than the capture holds them (driver copy
        kernels apart)."""
        return self.rows[self.rows["capture"] + self.rows["driver"] < self.rows["trace"]]

    @property
    def extra(self) -> pd.DataFrame:
        """Kernel shapes the capture holds more often than the trace ran them."""
        return self.rows[self.rows["capture"] > self.rows["trace"]]

    @property
    def complete(self) -> bool:
        return bool(len(self.rows)) and self.missing.empty and self.extra.empty

    def to_json(self, limit: int = 50) -> dict:
        def recs(df):
            return [{"name": r.name, "grid": [r.grid_x, r.grid_y, r.grid_z],
                     "block": [r.block_x, r.block_y, r.block_z], "trace": int(r.trace), "capture": int(r.capture)}
                    for r in df.head(limit).itertuples()]
        return {"complete": self.complete, "trace_kernels": self.trace_kernels,
                "capture_kernels": self.capture_kernels, "driver_kernels": self.driver_kernels,
                "copy_nodes": int(self.copy_nodes), "driver": recs(self.driver), "shapes": int(len(self.rows)),
                "names": int(self.rows["name"].nunique()) if len(self.rows) else 0,
                "missing": recs(self.missing), "extra": recs(self.extra),
                "missing_shapes": int(len(self.missing)), "extra_shapes": int(len(self.extra))}

    def lines(self, limit: int = 10) -> list[str]:
        """A few lines for a terminal: the verdict and the first differences."""
        drv = f" + {self.driver_kernels:,} driver copy kernel(s)" if self.driver_kernels else ""
        out = [f"completeness: {'complete' if self.complete else 'DIFFERS'}: trace {self.trace_kernels:,} kernel "
               f"executions, capture {self.capture_kernels:,}{drv}, {len(self.rows):,} (name, grid, block) shapes"]
        if self.driver_kernels:
            names = sorted(set(self.driver["name"]))
            out.append(f"  driver copy kernels: {self.driver_kernels} trace execution(s) of {', '.join(names)[:70]} "
                       f"(in no module the process loaded) for {self.driver_kernels} of the {self.copy_nodes} "
                       f"non-kernel node(s) the graph replays ran")
        for what, df in (("missing from the capture", self.missing), ("extra in the capture", self.extra)):
            for r in df.head(limit).itertuples():
                out.append(f"  {what}: {r.name[:70]} grid {[r.grid_x, r.grid_y, r.grid_z]} "
                           f"block {[r.block_x, r.block_y, r.block_z]}: trace {r.trace}, capture {r.capture}")
        return out


def compare(trace: pd.DataFrame, capture: pd.DataFrame, copy_nodes: int = 0,
            names: set[str] | None = None) -> Completeness:
    """Counts per (name, grid, block) on both sides; a trace event without grid or block (-1)
    counts against the capture's kernels of that name regardless of their shape. With
    `copy_nodes` and `names` (`loaded_names`), up to copy_nodes trace executions the capture lacks,
    of kernels no loaded module carries, are the driver's copy kernels (`driver`)."""
    t = trace[KEY].copy()
    c = capture[KEY].copy()
    blind = (t[KEY[1:]] < 0).any(axis=1)
    if blind.any():   # events without dims: compare those names by name only
        names = set(t.loc[blind, "name"])
        t.loc[t["name"].isin(names), KEY[1:]] = -1
        c.loc[c["name"].isin(names), KEY[1:]] = -1
    tc = t.groupby(KEY).size().rename("trace")
    cc = c.groupby(KEY).size().rename("capture")
    rows = pd.concat([tc, cc], axis=1).fillna(0).astype("int64").reset_index()
    rows = rows.sort_values(KEY, kind="stable").reset_index(drop=True)
    rows["driver"] = 0
    budget = int(copy_nodes) if names is not None else 0
    for k in np.flatnonzero((rows["trace"] > rows["capture"]).to_numpy()):
        if budget <= 0:
            break
        if _loaded(rows.at[k, "name"], names):
            continue
        take = min(int(rows.at[k, "trace"] - rows.at[k, "capture"]), budget)
        rows.at[k, "driver"] = take
        budget -= take
    return Completeness(rows, int(copy_nodes))
