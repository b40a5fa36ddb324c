"""Device-to-device copies and memsets inside a forward (compiler/device_ops.py), on launches built
here with known truth: where each op lands among the launches (eager, and inside each replay of a
captured graph), which later words read a copy's source instead of its destination, when an alias
ends (a write of the destination) or must be refused (the source overwritten before the read), and
memsets dropped only when nothing reads the cleared bytes. Plus the graph-completeness check on
the committed default-mode capture q3z (recorded before device copies were logged: its decode
graphs hold one node the dump lacks)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from compiler import device_ops as D
from compiler.errors import CompileError
from compiler.launches import Launch, Param, Word
from vocab.analysis import site_name

A, B, OUT = 0x7000_0000_0000, 0x7100_0000_0000, 0x7200_0000_0000   # three allocations of 1 MiB
MIB = 1 << 20


def _launch(seq: int, sym: str, *ptrs: int) -> Launch:
    words, params = [], []
    for i, v in enumerate(ptrs):
        base = next(b for b in (A, B, OUT) if b <= v < b + MIB)
        words.append(Word(i, 0, v, base, MIB))
        params.append(Param(i, 8, v, None, True, 8 * i))
    return Launch(seq, sym, "sha", (1, 1, 1), (32, 1, 1), 0, params, words)


def _flow(order, own, dirs):
    """(site, i, at) -> direction, sites named as the compiler names them."""
    occ, out = {}, {}
    for s in order:
        x = own[s]
        site = site_name(x.symbol, occ.get(x.symbol, 0))
        occ[x.symbol] = occ.get(x.symbol, 0) + 1
        for i, d in enumerate(dirs[s]):
            out[(site, i, 0)] = d
    return out


def _op(kind, dst, src, size, seq_before, cap=-1, value=0, elem=0):
    return D.Op(kind, dst, src, size, value, elem, seq_before, cap)


F = SimpleNamespace(forward=3)


def test_a_copy_at_a_graphs_end_is_read_through_its_source_by_the_eager_launch_after_the_replay():
    # graph (capture 9): norm writes A+0x100; the graph then copies A+0x100.. to OUT (its last node);
    # after the replay an eager gather reads OUT+0x40 and writes B
    order = [10, 11, 50]
    own = {10: _launch(10, "mm", A, A + 0x100), 11: _launch(11, "norm", A + 0x100, A + 0x100),
           50: _launch(50, "gather", OUT + 0x40, B)}
    cap = {10: 9, 11: 9, 50: -1}
    ops = D.Placed(graph={9: [_op("dtod", OUT, A + 0x100, 0x200, seq_before=12, cap=9)]})
    at = D.positions(order, cap, ops)
    assert list(at) == [2]                                  # after the graph's last kernel
    flow = _flow(order, own, {10: ["in", "out"], 11: ["in", "out"], 50: ["in", "out"]})
    got, notes, _ = D.apply(F, order, own, at, flow)
    w = got[50].words[0]
    assert (w.value, w.base, w.alloc_size) == (A + 0x140, A, MIB) and got[50].params[0].value == A + 0x140
    assert got[50].words[1].value == B and got[10] is own[10]
    assert own[50].words[0].value == OUT + 0x40             # the caller's launches are not touched
    assert notes and "1 later pointer word" in notes[0]


def test_a_graph_replayed_twice_in_a_forward_places_its_copy_in_each_replay():
    order = [10, 11, 10, 11]
    cap = {10: 9, 11: 9}
    ops = D.Placed(graph={9: [_op("dtod", OUT, A, 64, seq_before=11, cap=9)]})
    assert D.positions(order, cap, ops) == {1: ops.graph[9], 3: ops.graph[9]}


def test_eager_ops_land_before_the_launch_they_precede_but_not_before_the_forwards_first():
    order = [20, 21, 22]
    cap = {20: -1, 21: -1, 22: -1}
    first, mid = _op("dtod", OUT, A, 64, 20), _op("memset", B, 0, 64, 22, value=0, elem=4)
    at = D.positions(order, cap, D.Placed(eager={20: [first], 22: [mid]}))
    assert at == {2: [mid]}


def test_a_write_of_the_destination_ends_the_alias():
    order = [1, 2, 3]
    own = {1: _launch(1, "k", A), 2: _launch(2, "w", OUT), 3: _launch(3, "r", OUT)}
    at = {1: [_op("dtod", OUT, A, 64, 2)]}
    flow = _flow(order, own, {1: ["out"], 2: ["out"], 3: ["in"]})
    got, _, _ = D.apply(F, order, own, at, flow)
    assert got[3].words[0].value == OUT and got[2].words[0].value == OUT


def test_a_read_through_an_alias_whose_source_was_overwritten_is_refused():
    order = [1, 2, 3]
    own = {1: _launch(1, "k", A), 2: _launch(2, "w", A + 8), 3: _launch(3, "r", OUT)}
    at = {1: [_op("dtod", OUT, A, 64, 2)]}
    flow = _flow(order, own, {1: ["out"], 2: ["inout"], 3: ["in"]})
    _, _, refused = D.apply(F, order, own, at, flow)
    assert list(refused) == [3] and "overwrote the copy's source" in refused[3]


def test_a_copy_of_a_copy_reads_the_first_source():
    order = [1, 2]
    own = {1: _launch(1, "k", A), 2: _launch(2, "r", B + 0x10)}
    at = {1: [_op("dtod", OUT, A, 64, 2), _op("dtod", B, OUT, 64, 2)]}
    got, _, _ = D.apply(F, order, own, at, _flow(order, own, {1: ["out"], 2: ["in"]}))
    assert got[2].words[0].value == A + 0x10


def test_memsets_are_dropped_when_overwritten_and_refused_when_read():
    order = [1, 2]
    own = {1: _launch(1, "k", A), 2: _launch(2, "acc", B)}
    at = {1: [_op("memset", B, 0, 256, 2, value=0, elem=4)]}
    got, notes, refused = D.apply(F, order, own, at, _flow(order, own, {1: ["out"], 2: ["out"]}))
    assert got[2] is own[2] and "1 memset(s): 1 overwritten" in notes[-1] and refused == {}
    _, _, refused = D.apply(F, order, own, at, _flow(order, own, {1: ["out"], 2: ["inout"]}))
    assert list(refused) == [2] and "reads bytes a memset cleared" in refused[2]
    # cuBLASLt's own workspace counter, cleared before its GEMM: kern's extern GEMM keeps its own
    own[2] = _launch(2, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", B)
    got, notes, refused = D.apply(F, order, own, at, _flow(order, own, {1: ["out"], 2: ["in"]}))
    assert "1 of them cuBLASLt's own workspace" in notes[-1] and refused == {}


def test_no_ops_leaves_the_launches_as_they_are():
    own = {1: _launch(1, "k", A)}
    assert D.apply(F, [1], own, {}, {}) == (own, [], {})


def _graphs(rows):
    cols = ("event", "capture_id", "nodes", "kernel_nodes", "memcpy_nodes", "memset_nodes", "other_nodes")
    df = pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=list(cols))
    for c in cols[1:]:
        df[c] = pd.array(df[c], dtype="Int64")
    return df


def _dump(caps, copies=None, dev=None):
    return SimpleNamespace(launches=pd.DataFrame({"seq": range(len(caps)), "capture_id": caps}),
                           copies=copies, device_ops=dev)


def test_graph_gaps_name_the_nodes_a_dump_lacks_by_type_and_by_count():
    dump = _dump([5, 5, 5, 6, 6])
    dev = pd.DataFrame({"in_graph": [True], "result": [0], "capture_id": [5], "op": ["dtod"]})
    dump.device_ops = dev
    g = _graphs([("capture_end", 5, 4, 3, 1, 0, 0), ("capture_end", 6, 4, 2, 0, 1, 1)])
    (gap,) = D.graph_gaps(dump, g, {5, 6})
    assert gap.startswith("graph capture 6 holds 1 memset node(s), 1 node(s) of other types")
    old = _graphs([("capture_end", 6, 3, None, None, None, None)])
    (gap,) = D.graph_gaps(_dump([6, 6]), old, {6})
    assert "holds 3 nodes, the dump records 2" in gap
    assert D.graph_gaps(_dump([6, 6]), old, {7}) == []


def test_q3z_decode_graphs_hold_a_node_the_capture_did_not_record():
    """q3z was captured before device-to-device copies were logged: each decode graph ends with a
    copy the dump lacks (50 nodes, 49 kernel launches)."""
    from paths import FIXTURES
    from mining.graphs import of_dump as read
    from mining.load import load_dump
    dump = load_dump(FIXTURES / "compile" / "q3z.tar.xz", cache=False)
    caps = set(dump.launches.loc[dump.launches["capture_id"] >= 0, "capture_id"].astype(int))
    gaps = D.graph_gaps(dump, read(dump), caps)
    assert len(gaps) >= 1 and all("the dump records" in g for g in gaps)
    assert any("holds 50 nodes, the dump records 49" in g for g in gaps)
