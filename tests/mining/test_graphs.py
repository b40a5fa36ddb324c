"""The executed stream (mining/graphs.py): graph replays expanded into the kernels they ran.

Handles are addresses the driver reuses, so each replay is resolved as of its time; capture-time
launches are in no executed position; damaged graphs.jsonl lines are dropped and counted. Plus
the simulator's graph-mode capture analysed end to end (tests/helpers/dumpsim.py, graph_decode)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from dumpsim import SimConfig, simulate
from mining.analyze import analyze
from mining.graphs import executed, read_graphs
from mining.load import load_dump


def _launches(rows):
    """rows: (seq, t_ns, capture_id, symbol)."""
    df = pd.DataFrame(rows, columns=["seq", "t_ns", "capture_id", "symbol"])
    return df.astype({"symbol": "category"})


def _graphs(tmp_path, events):
    (tmp_path / "graphs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return read_graphs(tmp_path)


def test_reused_exec_address_resolves_by_time(tmp_path):
    L = _launches([(0, 10, -1, "eager"), (1, 20, 1, "a"), (2, 21, 1, "b"), (3, 40, 2, "c"),
                   (4, 41, 2, "d"), (5, 42, 2, "e")])
    g = _graphs(tmp_path, [
        {"event": "capture_end", "t_ns": 22, "graph": "0xg", "capture_id": 1},
        {"event": "instantiate", "t_ns": 23, "graph": "0xg", "exec": "0xe"},
        {"event": "launch", "t_ns": 30, "exec": "0xe"},
        {"event": "exec_destroy", "t_ns": 31, "exec": "0xe"},
        {"event": "graph_destroy", "t_ns": 32, "graph": "0xg"},
        # the same graph and exec addresses, handed out again for another capture
        {"event": "capture_end", "t_ns": 43, "graph": "0xg", "capture_id": 2},
        {"event": "instantiate", "t_ns": 44, "graph": "0xg", "exec": "0xe"},
        {"event": "launch", "t_ns": 50, "exec": "0xe"},
        {"event": "launch", "t_ns": 60, "exec": "0xe"},
    ])
    ex = executed(L, g)
    f = ex.frame
    assert f["seq"].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5]
    assert f["replay"].tolist() == [-1, 0, 0, 1, 1, 1, 2, 2, 2]
    assert f["t_ns"].tolist() == [10, 30, 30, 50, 50, 50, 60, 60, 60]
    assert ex.captured.tolist() == [1, 2, 3, 4, 5]
    assert ex.replays["kernels"].tolist() == [2, 3, 3]


def test_unknown_exec_is_counted_not_invented(tmp_path):
    L = _launches([(0, 10, -1, "eager")])
    g = _graphs(tmp_path, [{"event": "launch", "t_ns": 30, "exec": "0xdead"}])
    ex = executed(L, g)
    assert ex.frame["seq"].tolist() == [0]
    assert any("1 graph launch(es) of an exec" in n for n in ex.notes)


def test_damaged_graph_lines_dropped_and_counted(tmp_path):
    (tmp_path / "graphs.jsonl").write_text(
        '{"event":"launch","t_ns":5,"exec":"0x1"}\n{"event":"launch","t_ns":"x"}\nnot json\n'
        '{"event":7}\n\x00\x00\n')
    warnings: list[str] = []
    g = read_graphs(tmp_path, warnings)
    assert len(g) == 1 and warnings == [   # a line of NULs is a record in flight (the NUL rule)
        "graphs.jsonl: dropped 3 unparsable line(s)",
        "graphs.jsonl: dropped 1 record(s) lost to NUL bytes or cut short (a writer died mid-record)"]


def test_simulated_graph_mode_forwards(tmp_path):
    """Decode steps replayed from a graph captured twice at one exec address: every forward, its
    tokens and which ones were replays come back; the captures are in no forward."""
    _, truth = simulate(tmp_path, SimConfig(graph_decode=True, prompts=(3, 60, 17), decode_steps=5))
    a = analyze(load_dump(tmp_path, cache=False))
    f = a.forwards
    assert f["tokens"].tolist() == truth.forwards
    assert (f["replayed"] > 0).tolist() == truth.replayed
    assert (f["layers"] == truth.layers).all()
    assert len(a.passes.captures) == 2
    captured = a.dump.launches["capture_id"].to_numpy() >= 0
    assert (a.passes.forward[captured] == -1).all()
    # the replayed kernels carry the captured records' seqs
    rep = a.passes.executed[a.passes.executed["replay"] >= 0]
    assert set(rep["seq"]) <= set(a.dump.launches["seq"].to_numpy()[captured])
    assert np.all(f.loc[f["replayed"] > 0, "graph_execs"] == 1)
