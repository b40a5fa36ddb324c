"""CUDA-graph replays put back on the launch timeline: the executed stream.

Why: a graph replay (`cuGraphLaunch`) makes no kernel-launch callback, so in an engine that decodes
from CUDA graphs (vLLM's default mode) most forwards are invisible in launches.bin: what the dump
holds is the graph's definition (the launches recorded while the stream was being captured, each
carrying `capture_id`) and, in graphs.jsonl, which exec came from which graph and when each exec
was launched. Forward detection needs what the GPU *ran*, in order, so:

- `read_graphs(folder)` reads graphs.jsonl into a frame (unparsable lines dropped and counted);
- `executed(launches, graphs)` is the executed stream: every launch that ran eagerly (not inside a
  stream capture) plus, for every graph launch, the launches captured into that exec's graph, in
  capture order, placed at the replay's host time and tagged with the replay number and the exec.
  Capture-time launches themselves are left out: they defined a graph, they did not run then
  (their rows are `Executed.captured`).

Kernel nodes of hand-built graphs (graphs.jsonl `kernel_node`) are expanded the same way, by the
graph (or exec) they were added to. `*SetParams` updates after instantiation are not applied: the
captured parameter bytes are what a replay is taken to run (stated in each replay's notes when
the dump records such updates). Not handled: graphs launched from another graph (device launch),
conditional nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mining.damage import FileReport, lines_report

GRAPHS = "graphs.jsonl"
GRAPH_COLUMNS = ("event", "t_ns", "stream", "graph", "exec", "capture_id", "seq_first", "seq_last",
                 "nodes", "seq", "kernel_nodes", "memcpy_nodes", "memset_nodes", "other_nodes")
NODE_TYPES = ("kernel", "memcpy", "memset", "other")   # capture_end `node_types` (capture/src/graphs.c)


def _graph_event(line: bytes):
    """One graphs.jsonl line -> its row, or None when it is not an event of the documented types
    and ranges (numbers non-negative integers below 2^62, handles strings)."""
    try:
        r = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(r, dict) or not isinstance(r.get("event"), str):
        return None
    row = {k: r.get(k) for k in GRAPH_COLUMNS if not k.endswith("_nodes")}
    types = r.get("node_types")
    if types is not None:   # the captured graph's nodes by type; they add up to `nodes`
        if not isinstance(types, dict) or set(types) != set(NODE_TYPES) or not isinstance(r.get("nodes"), int):
            return None
        if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62 for v in types.values()) \
                or sum(types.values()) != r["nodes"]:
            return None
    for t in NODE_TYPES:
        row[f"{t}_nodes"] = None if types is None else types[t]
    for k in _NUMS:
        v = row[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62):
            return None
    for k in ("stream", "graph", "exec"):
        if row[k] is not None and not isinstance(row[k], str):
            return None
    return row


_NUMS = ("t_ns", "capture_id", "seq_first", "seq_last", "nodes", "seq", "kernel_nodes", "memcpy_nodes", "memset_nodes",
         "other_nodes")


def read_graphs(folder: Path, warnings: list[str] | None = None,
                report: FileReport | None = None) -> pd.DataFrame:
    """graphs.jsonl as a frame (GRAPH_COLUMNS; ids as strings, numbers as Int64); empty when absent.
    Damaged lines are dropped, counted in `warnings` and reported per line in `report`."""
    rows: list = []
    src = Path(folder) / GRAPHS
    rep = FileReport(GRAPHS)
    if src.is_file():
        rows, rep = lines_report(GRAPHS, src.read_bytes(), _graph_event,
                                 lambda line: "not a graph event of the documented types and ranges")
    bad = sum(r.records or 0 for r in rep.ranges if r.reason.startswith("not a graph event"))
    if bad and warnings is not None:
        warnings.append(f"{GRAPHS}: dropped {bad} unparsable line(s)")
    if rep.skipped > bad and warnings is not None:
        warnings.append(f"{GRAPHS}: dropped {rep.skipped - bad} record(s) lost to NUL bytes or cut short "
                        f"(a writer died mid-record)")
    if report is not None:
        report.merge(rep)
    df = pd.DataFrame(rows, columns=list(GRAPH_COLUMNS))
    for k in _NUMS:
        df[k] = pd.array(df[k], dtype="Int64")
    return df


def of_dump(dump) -> pd.DataFrame | None:
    """A loaded dump's graphs frame: the one `mining.load` read, else (a Dump built in memory with
    no frame) its folder's graphs.jsonl; None for a dump with neither."""
    g = getattr(dump, "graphs", None)
    if g is not None:
        return g
    src = getattr(dump, "source", None)
    if src is None:
        return None
    try:
        return read_graphs(Path(src).parent)
    except OSError:
        return None


@dataclass
class Executed:
    """The stream the GPU ran, one row per kernel execution, in host-time order.

    `frame` columns: `row` (index into the dump's launches frame), `seq` (the launch record: for a
    replayed kernel, the record captured into the graph), `t_ns` (the launch's, or the replay's),
    `replay` (-1 for an eager launch, else the replay's number), `exec` (the replayed exec, "" for
    eager). `captured`: rows of the launches frame recorded inside a stream capture (or defined as
    hand-built kernel nodes), not executed at that time."""
    frame: pd.DataFrame
    captured: np.ndarray
    replays: pd.DataFrame            # replay, exec, t_ns, kernels, capture_id (-1 if unknown)
    notes: list[str] = field(default_factory=list)


def _by_capture(launches: pd.DataFrame) -> dict[int, np.ndarray]:
    cap = launches["capture_id"].to_numpy()
    m = cap >= 0
    if not m.any():
        return {}
    rows = np.flatnonzero(m)
    order = np.argsort(cap[m], kind="stable")
    ids, starts = np.unique(cap[m][order], return_index=True)
    return {int(i): part for i, part in zip(ids, np.split(rows[order], starts[1:]))}


def _latest(events: pd.DataFrame, t: int):
    """The row of `events` (one handle's, sorted by t_ns) last at or before t, or None."""
    pos = np.searchsorted(events["t_ns"].to_numpy(np.int64), t, side="right") - 1
    return None if pos < 0 else events.iloc[pos]


def _exec_rows(launches: pd.DataFrame, graphs: pd.DataFrame):
    """A function (exec, t_ns) -> launches-frame rows the exec ran at that time, or None.

    Graph and exec handles are addresses, and the driver reuses them once destroyed (vLLM
    captures ~50 graphs at start-up), so every link is taken as of the time it is needed: the
    exec's latest instantiation before the launch, that graph's latest capture before the
    instantiation, and kernel nodes added to that graph (or exec) before it."""
    by_cap = _by_capture(launches)
    pos = pd.Series(np.arange(len(launches)), index=launches["seq"].to_numpy())
    g = graphs[graphs["t_ns"].notna()].astype({"t_ns": "int64"}).sort_values("t_ns", kind="stable")
    ends = {k: v.reset_index(drop=True) for k, v in g[(g["event"] == "capture_end") & g["graph"].notna()].groupby("graph")}
    inst = {k: v.reset_index(drop=True) for k, v in g[(g["event"] == "instantiate") & g["exec"].notna()].groupby("exec")}
    nodes = g[(g["event"] == "kernel_node") & g["seq"].notna()]
    node_by = {}
    for key in ("graph", "exec"):
        for k, v in nodes[nodes[key].notna()].groupby(key):
            node_by[k] = v.reset_index(drop=True)

    def node_rows(handle: str, t: int) -> np.ndarray:
        v = node_by.get(handle)
        if v is None:
            return np.zeros(0, np.int64)
        v = v[v["t_ns"] <= t]
        return pos.reindex(v["seq"].astype("int64").to_numpy()).dropna().astype(np.int64).to_numpy()

    def rows(exec_: str, t: int):
        got = []
        ins = inst.get(exec_)
        if ins is not None:
            r = _latest(ins, t)
            if r is not None and isinstance(r["graph"], str):
                e = ends.get(r["graph"])
                c = _latest(e, int(r["t_ns"])) if e is not None else None
                if c is not None and pd.notna(c["capture_id"]) and int(c["capture_id"]) in by_cap:
                    got.append(by_cap[int(c["capture_id"])])
                got.append(node_rows(r["graph"], int(r["t_ns"])))
        got.append(node_rows(exec_, t))
        got = [x for x in got if len(x)]
        return np.sort(np.concatenate(got)) if got else None
    return rows


def executed(launches: pd.DataFrame, graphs: pd.DataFrame) -> Executed:
    """The executed stream of `launches` (sorted by seq) given graphs.jsonl's events."""
    notes: list[str] = []
    cap = launches["capture_id"].to_numpy()
    captured = np.flatnonzero(cap >= 0)
    if len(graphs):
        nodes = graphs[graphs["event"] == "kernel_node"]
        if len(nodes):
            node_seqs = set(nodes["seq"].dropna().astype("int64").tolist())
            extra = np.flatnonzero(launches["seq"].isin(node_seqs).to_numpy())
            captured = np.union1d(captured, extra)
    eager = np.setdiff1d(np.arange(len(launches)), captured)
    parts = [pd.DataFrame({"row": eager, "seq": launches["seq"].to_numpy()[eager],
                           "t_ns": launches["t_ns"].to_numpy()[eager], "replay": -1, "exec": ""})]
    replays = pd.DataFrame(columns=["replay", "exec", "t_ns", "kernels"])
    if len(graphs):
        rows_of = _exec_rows(launches, graphs)
        gl = graphs[(graphs["event"] == "launch") & graphs["exec"].notna() & graphs["t_ns"].notna()]
        gl = gl.sort_values("t_ns", kind="stable").reset_index(drop=True)
        unknown = 0
        rec = []
        for k, (x, t) in enumerate(zip(gl["exec"], gl["t_ns"])):
            rows = rows_of(x, int(t))
            if rows is None:
                unknown += 1
                rec.append((k, x, int(t), 0))
                continue
            parts.append(pd.DataFrame({"row": rows, "seq": launches["seq"].to_numpy()[rows],
                                       "t_ns": int(t), "replay": k, "exec": x}))
            rec.append((k, x, int(t), len(rows)))
        replays = pd.DataFrame(rec, columns=["replay", "exec", "t_ns", "kernels"])
        if unknown:
            notes.append(f"{unknown} graph launch(es) of an exec whose captured kernels the dump does not "
                         f"hold (captured before recording began, or filtered): left out of the timeline")
        if (graphs["event"].astype(str).str.contains("set_params|SetParams", regex=True)).any():
            notes.append("the dump records graph parameter updates; replays are expanded with the "
                         "parameters as captured")
    frame = pd.concat(parts, ignore_index=True)
    # host-time order; a replay's kernels keep their capture order (stable sort on (t_ns, part))
    frame["_k"] = np.arange(len(frame))
    frame = frame.sort_values(["t_ns", "replay", "_k"], kind="stable").drop(columns="_k")
    frame = frame.reset_index(drop=True).astype({"row": "int64", "seq": "int64", "t_ns": "int64",
                                                 "replay": "int32", "exec": "category"})
    return Executed(frame, captured, replays, notes)
