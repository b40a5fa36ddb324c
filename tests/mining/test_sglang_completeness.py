"""A capture against a torch profiler trace of the same run (mining/completeness.py).

Synthetic first: kineto-shaped chrome traces (kernel events among CPU ops, runtime calls, copies
and flow arrows) read back to their kernels; a hand-made dump whose window holds two CUDA-graph
replays, an eager launch, a failed launch and a stream capture; and the dump simulator's engine
(graph-replayed decode, a jittered sampling kernel, a kernel without a parameter layout) against a
trace written from the simulator's own launch plan, not from the dump -- complete, and every kind
of difference (a kernel missing, one extra, a grid changed) caught.

Then the committed SGLang fixtures (tests/fixtures/sglang/, made by examples/sglang_qwen3/
device_run.sh on an H200): each capture, cut to the window its truth file records, against the
kernel events of SGLang's own torch profiler trace of that run (`<name>.profile.json.gz`). A fixture
is every `<name>.truth.json` there: committing the three files of a run is all it takes. In CUDA-graph
mode the trace holds three `memcpy32_post` kernels the capture has no launch of: SGLang's prefill
graphs end with a device-to-device copy node (their capture records one node more than its kernels),
which the driver runs as a copy kernel of its own, one per replay (grids 96/192/352 blocks of 1 KiB:
a 48-, 96- and 176-token hidden state in bf16, each right after the graph's final norm). They are
accounted for against the copy nodes the replays in the window ran (`copy_nodes`), by name absent
from every loaded module -- never against a kernel the process loaded.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest

import dumpsim
from mining import completeness as C
from mining.load import load_dump
from paths import FIXTURES

SGLANG = sorted(p.name[:-len(".truth.json")] for p in (FIXTURES / "sglang").glob("*.truth.json"))


def kineto(kernels: list[tuple[str, list[int], list[int]]]) -> dict:
    """A chrome trace shaped like kineto's export: the kernels among the events it also writes."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 3.0, "pid": 1, "tid": 1,
           "args": {"External id": 7}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2.0, "dur": 1.0, "args": {}},
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 2.5, "dur": 1.0,
           "args": {"grid": [1, 1, 1]}},
          {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "ts": 2.0},
          {"ph": "i", "cat": "kernel", "name": "not a duration event", "ts": 9.0}]
    for k, (name, grid, block) in enumerate(kernels):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 + k, "dur": 0.5,
                   "args": {"External id": k, "device": 0, "stream": 7, "correlation": 100 + k,
                            "registers per thread": 32, "shared memory": 0, "grid": grid, "block": block}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": ev,
            "traceName": "x.trace.json"}


def write(path, doc, gz=True):
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_trace_kernels_only(tmp_path):
    doc = kineto([("void k<2>(float*,  int)", [4, 1, 1], [128, 1, 1]), ("triton_poi_0", [1, 2, 3], [32, 1, 1])])
    for gz in (True, False):
        t = C.read_trace(write(tmp_path / f"t{gz}.json", doc, gz))
        assert t["name"].tolist() == ["void k<2>(float*, int)", "triton_poi_0"]   # whitespace collapsed
        assert t[["grid_x", "grid_y", "grid_z", "block_x"]].to_numpy().tolist() == [[4, 1, 1, 128], [1, 2, 3, 32]]
        assert t["stream"].tolist() == [7, 7]
    small = tmp_path / "small.json.gz"
    assert C.reduce_trace(write(tmp_path / "big.json.gz", doc), small) == 2
    back = C.read_trace(small)
    assert back[C.KEY].equals(C.read_trace(tmp_path / "big.json.gz")[C.KEY])
    assert len(gzip.decompress(small.read_bytes())) < len(json.dumps(doc))


def test_bad_traces_are_one_sentence(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(C.TraceError, match="a.json: not a JSON chrome trace"):
        C.read_trace(tmp_path / "a.json")
    write(tmp_path / "b.json", {"events": []}, gz=False)
    with pytest.raises(C.TraceError, match="b.json: no traceEvents list"):
        C.read_trace(tmp_path / "b.json")
    with pytest.raises(C.TraceError, match="cannot be read"):
        C.read_trace(tmp_path / "missing.json")


def hand_made_dump(root):
    """Eager kA at t=100; kB, kC captured into a graph (t=200-210, run only when replayed); the
    graph's exec replayed at t=500 and t=600; kD eager at t=700; a failed kE at t=550."""
    L = lambda s, g: (s, g, [64, 1, 1], [], "kernel")   # noqa: E731
    launches = [L("kA", [1, 1, 1]), (*L("kB", [2, 1, 1]), (1, "0xg1")), (*L("kC", [3, 1, 1]), (1, "0xg1")),
                L("kE", [9, 1, 1]), L("kD", [4, 1, 1])]
    times = [100, 200, 210, 550, 700]
    graphs = [{"event": "capture_begin", "t_ns": 190, "stream": "0x5", "capture_id": 1},
              {"event": "capture_end", "t_ns": 220, "stream": "0x5", "graph": "0xg1", "capture_id": 1,
               "seq_first": 1, "seq_last": 2, "nodes": 2},
              {"event": "instantiate", "t_ns": 230, "graph": "0xg1", "exec": "0xe1"},
              {"event": "launch", "t_ns": 500, "stream": "0x0", "exec": "0xe1"},
              {"event": "launch", "t_ns": 600, "stream": "0x0", "exec": "0xe1"}]
    dumpsim._write_pid(root / "pid77", 77, launches, times, graphs)
    p = root / "pid77" / "launches.jsonl"
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    lines[3]["result"] = 700                                # CUDA_ERROR_LAUNCH_FAILED
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return load_dump(root, cache=False)


def test_window_replays_and_failed_launches(tmp_path):
    d = hand_made_dump(tmp_path)
    every = C.capture_kernels(d)
    assert every["name"].tolist() == ["kA", "kB", "kC", "kB", "kC", "kD"]
    assert every["replay"].tolist() == [-1, 0, 0, 1, 1, -1]
    win = C.capture_kernels(d, 450, 650)
    assert win["name"].tolist() == ["kB", "kC", "kB", "kC"] and win["grid_x"].tolist() == [2, 3, 2, 3]
    trace = C.read_trace(write(tmp_path / "t.json.gz", kineto([("kB", [2, 1, 1], [64, 1, 1]), ("kC", [3, 1, 1], [64, 1, 1])] * 2)))
    r = C.compare(trace, win)
    assert r.complete and r.trace_kernels == r.capture_kernels == 4
    r = C.compare(trace, every)
    assert not r.complete and set(r.extra["name"]) == {"kA", "kD"} and r.missing.empty


def planned_kernels(cfg: dumpsim.SimConfig) -> list[tuple[str, list[int], list[int]]]:
    """What the simulator's engine ran, from its own plan (dumpsim.simulate's loop): the start-up
    kernels, then every forward's launches -- a replayed decode runs the graph's, which are a decode
    forward's; the launches recorded while capturing that graph ran nothing."""
    rng = random.Random(cfg.seed)          # only parameter values draw from it, never a grid
    out = [("init_fill_kernel", [4, 1, 1], [256, 1, 1])] * 5
    windows = [[cfg.profile_tokens], list(cfg.warmups)] + [[p] + [1] * cfg.decode_steps for p in cfg.prompts]
    fidx = 0
    for w_i, w in enumerate(windows):
        if cfg.graph_decode and w_i == 2:
            for _ in range(2):                                  # the two captures draw from the rng too
                dumpsim._Forward(1, fidx, cfg, rng).build()
        for t in w:
            out += [(sym, grid, block) for sym, grid, block, *_ in dumpsim._Forward(t, fidx, cfg, rng).build()]
            fidx += 1
    return out


@pytest.mark.parametrize("graph_decode", [False, True])
def test_simulated_engine_is_complete_and_differences_are_caught(tmp_path, graph_decode):
    cfg = dumpsim.SimConfig(graph_decode=graph_decode)
    main, _ = dumpsim.simulate(tmp_path, cfg)
    d = load_dump(main, cache=False)
    cap = C.capture_kernels(d)
    plan = planned_kernels(cfg)
    r = C.compare(C.read_trace(write(tmp_path / "t.json.gz", kineto(plan))), cap)
    assert r.complete, r.lines()
    assert r.trace_kernels == len(plan) and (cap["replay"] >= 0).any() == graph_decode
    # one kernel the trace saw and the capture did not, one the other way, a grid that differs
    k = next(i for i, (s, _, _) in enumerate(plan) if s == "rope_kernel")
    changed = plan[:k] + [("rope_kernel", [plan[k][1][0] + 1, 1, 1], plan[k][2])] + plan[k + 1:]
    for bad, missing, extra in ((plan + [plan[-1]], 1, 0), (plan[:-1], 0, 1), (changed, 1, 1)):
        r = C.compare(C.read_trace(write(tmp_path / "b.json.gz", kineto(bad))), cap)
        assert not r.complete and len(r.missing) == missing and len(r.extra) == extra
        assert r.lines()[0].startswith("completeness: DIFFERS")
    j = r.to_json()
    assert j["missing"][0]["name"] == "rope_kernel" and j["missing"][0]["grid"] == changed[k][1]


def test_driver_copy_kernels_against_graph_copy_nodes(tmp_path):
    """A graph whose capture holds one node more than its kernels (a memcpy node) ran, per
    replay, one kernel of the driver's own: trace kernels of a name no loaded module carries are
    accounted for against those nodes, never more of them than there are nodes, and a kernel the
    process did load that the capture lacks stays missing."""
    d = hand_made_dump(tmp_path)
    g = tmp_path / "pid77" / "graphs.jsonl"
    ev = [json.loads(x) for x in g.read_text().splitlines()]
    for e in ev:
        if e["event"] == "capture_end":
            e["nodes"] = 3                                   # kB, kC and one copy node
    g.write_text("".join(json.dumps(e) + "\n" for e in ev))
    d = load_dump(tmp_path, cache=False)                     # the dump reads graphs.jsonl once, at load
    assert C.copy_nodes(d) == 2 and C.copy_nodes(d, 450, 550) == 1
    names = C.loaded_names(d)
    assert {"kA", "kB", "kC", "kD", "kE"} <= names and "memcpy32_post" not in names
    run = [("kB", [2, 1, 1], [64, 1, 1]), ("kC", [3, 1, 1], [64, 1, 1]), ("memcpy32_post", [96, 1, 1], [256, 1, 1])]
    win = C.capture_kernels(d, 450, 650)
    trace = C.read_trace(write(tmp_path / "t.json.gz", kineto(run * 2)))
    assert not C.compare(trace, win).complete                        # no accounting asked for
    r = C.compare(trace, win, C.copy_nodes(d, 450, 650), names)
    assert r.complete and r.driver_kernels == 2 and r.capture_kernels == 4
    assert r.to_json()["driver"][0]["name"] == "memcpy32_post" and "driver copy kernels: 2" in r.lines()[1]
    r = C.compare(trace, win, 1, names)                              # one node: one copy kernel too many
    assert not r.complete and r.missing["name"].tolist() == ["memcpy32_post"] and r.driver_kernels == 1
    extra_kd = C.read_trace(write(tmp_path / "u.json.gz", kineto(run * 2 + [("kD", [4, 1, 1], [64, 1, 1])])))
    r = C.compare(extra_kd, win, 5, names)                           # kD was loaded: a real miss
    assert not r.complete and r.missing["name"].tolist() == ["kD"]


def test_events_without_dims_count_by_name(tmp_path):
    d = hand_made_dump(tmp_path)
    doc = kineto([("kB", [2, 1, 1], [64, 1, 1])] * 2)
    doc["traceEvents"] += [{"ph": "X", "cat": "Kernel", "name": "kC", "ts": 50.0, "dur": 1.0, "args": {}}] * 2
    r = C.compare(C.read_trace(write(tmp_path / "t.json.gz", doc)), C.capture_kernels(d, 450, 650))
    assert r.complete


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_capture_is_complete(name):
    """The committed SGLang capture holds, in its window, exactly the kernels SGLang's own torch
    profiler saw -- every kernel as often, with the same grid and block."""
    base = FIXTURES / "sglang"
    truth = json.loads((base / f"{name}.truth.json").read_text())
    w = truth["window"]
    d = load_dump(base / f"{name}.tar.xz", cache=False)
    trace = C.read_trace(base / f"{name}.profile.json.gz")
    a, b = w["start_ns"], w["end_ns"]
    r = C.compare(trace, C.capture_kernels(d, a, b), C.copy_nodes(d, a, b), C.loaded_names(d))
    assert r.trace_kernels > 100
    assert r.complete, "\n".join(r.lines())
    # the driver's copy kernels are no more than the copy nodes the replays in the window ran, and
    # of no function the process loaded (eager: none)
    assert r.driver_kernels <= r.copy_nodes
    assert not any(C._loaded(n, C.loaded_names(d)) for n in r.driver["name"])
    if truth["mode"] == "eager":
        assert r.driver_kernels == r.copy_nodes == 0
