"""SGLang's captures against their truth: the mining truth suite's checks, engine-generic.

Why: the analysis must hold on SGLang as on vLLM without SGLang-specific rules, so these are the
checks tests/mining/test_truth_suite.py makes of the vLLM captures, written against the truth file
alone (examples/sglang_qwen3/truth.py writes it; the vLLM suite's files have the same `geometry`,
`requests` and `mode`): the forwards the requests made are a prefill of the prompt, then one-token
decode steps -- in CUDA-graph mode each decode step at the smallest size SGLang captured a decode
graph at, and each prefill the server logged as a graph replay (`requests[].prefill.cuda_graph`:
SGLang runs a prefill eagerly when padding it to a captured size would waste too much, as the
1-token prompt) at the smallest captured prefill size, the others at their own length -- every
serving forward has the checkpoint's layer count, the KV pool sits at one stride in every layer
and two kernels share it, per-layer weights span the layers, every pointer word inside a by-value
struct is classified with a role, every struct word fitted to the token count reproduces the
bytes it was fitted to, and the analysis JSON reads back.

Which forwards are the requests: SGLang's server sends itself a warm-up request over its own HTTP
API once it is up (a 3-token prompt, 8 new tokens), after start-up and after its CUDA graphs are
captured. In the dump it is a request like any other, so the analysis tags it `serve` (what it can
tell apart is start-up: profile and warm-up passes, graph-capture passes, tagged `startup`). The
truth's `window` -- the CLOCK_MONOTONIC span from before the first request was sent to after the
last was answered, the clock of the capture's launch times -- is what selects the requests'
forwards here; the analysis must tag each of them `serve` and every `startup` forward before them.

Cases: every `tests/fixtures/sglang/<name>.truth.json` (device_run.sh's fixtures: committing the
files of a run adds them), and the vLLM suite's q2e, so the checks themselves run on a real
capture without a window too.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from mining.analyze import analyze, to_json
from mining.fit import evaluate, parse
from mining.load import load_dump
from paths import FIXTURES
from vocab.analysis import from_json

SGLANG = sorted(("sglang", p.name[:-len(".truth.json")]) for p in (FIXTURES / "sglang").glob("*.truth.json"))
CASES = [("suite", "q2e")] + SGLANG
IDS = [f"{d}/{n}" for d, n in CASES]


@lru_cache(maxsize=None)
def analysed(folder: str, name: str):
    a = analyze(load_dump(FIXTURES / folder / f"{name}.tar.xz", cache=False))
    return a, json.loads((FIXTURES / folder / f"{name}.truth.json").read_text())


def graph_sizes(truth: dict, phase: str) -> list[int]:
    """The sizes the server captured `phase` (decode | prefill) graphs at; [] in eager mode."""
    cfg = (truth.get("cuda_graph_config") or {}).get(phase) or {}
    if truth.get("mode") != "graph" or cfg.get("backend") in (None, "disabled"):
        return []
    return sorted(int(x) for x in cfg.get("bs") or [])


def padded(n: int, sizes: list[int]) -> int:
    return next((s for s in sizes if s >= n), n)


def expected_forwards(truth: dict) -> list[tuple[int, bool]]:
    """(tokens, run from a CUDA graph) of every forward the requests made, in order."""
    pre, dec = graph_sizes(truth, "prefill"), graph_sizes(truth, "decode")
    out: list[tuple[int, bool]] = []
    for r in truth["requests"]:
        n = len(r["prompt"])
        graph = bool(pre) and n <= pre[-1] and bool((r.get("prefill") or {}).get("cuda_graph", True))
        out.append((padded(n, pre), True) if graph else (n, False))
        step = (padded(1, dec), True) if dec else (1, False)
        out += [step] * (len(r["output"]) - 1)
    return out


def requested(a, truth: dict):
    """The forwards the truth's requests made: those inside its `window` (the vLLM suite's files
    have none: there the serving phase is the requests)."""
    f = a.forwards
    w = truth.get("window")
    if not w:
        return f[f["phase"] == "serve"]
    return f[(f["start_ns"] >= w["start_ns"]) & (f["end_ns"] <= w["end_ns"])]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_serving_forwards_are_the_requests(case):
    a, truth = analysed(*case)
    f = a.forwards
    req = requested(a, truth)
    want = expected_forwards(truth)
    assert a.passes.method == "layer_stacks"
    assert req["tokens"].tolist() == [n for n, _ in want]
    assert (req["phase"] == "serve").all()
    assert (req["replayed"] > 0).tolist() == [g for _, g in want]
    assert req["tokens_from"].tolist() == ["graph" if g else "launch" for _, g in want]
    startup, serve = f[f["phase"] == "startup"], f[f["phase"] == "serve"]
    assert len(startup) and startup["forward"].max() < serve["forward"].min()
    if truth.get("window"):
        w = truth["window"]
        assert w["clock"] == "CLOCK_MONOTONIC"
        t = a.dump.launches["t_ns"]
        assert t.min() < w["start_ns"] < t.max() <= w["end_ns"]    # the capture's clock: the last
        # launch (the last request's last decode step) falls inside the window
        # serving forwards outside the window: the engine's own requests before the client's
        outside = serve[~serve["forward"].isin(req["forward"])]
        assert (outside["end_ns"] < w["start_ns"]).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer_count_on_every_serving_forward(case):
    a, truth = analysed(*case)
    serve = a.forwards[a.forwards["phase"] == "serve"]
    assert (serve["layers"] == truth["geometry"]["num_hidden_layers"]).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kv_pool_and_weight_strides(case):
    a, truth = analysed(*case)
    layers = truth["geometry"]["num_hidden_layers"]
    st = a.strides
    kv = st[(st["role"] == "kv_pool") & st["stride"].notna() & (st["layers"] == layers)]
    assert len(kv) and kv.groupby("stride")["symbol"].nunique().max() >= 2
    # per-layer weights of the kernels the requests ran: in CUDA-graph mode the start-up warm-ups
    # at every capture size run other GEMM builds (the library picks one per shape), so a stride
    # row of such a build holds only the layers where it ran in those warm-ups
    t = a.sites.table
    ran = set(t.loc[t["forward"].isin(requested(a, truth)["forward"]), "symbol"].astype(str))
    w = st[(st["role"] == "weight") & st["symbol"].isin(ran)]
    assert len(w) and (w["layers"] == layers).mean() > 0.9


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_struct_pointer_word_classified(case):
    """Every word the capture found pointing into an allocation inside a by-value struct of a call
    site is a pointer word of the structs section, with the role the pointer table gives it."""
    a, _ = analysed(*case)
    p = a.dump.params
    wide = p.loc[~p["word"] & (p["size"] > 8), ["seq", "i"]]
    inner = p.loc[p["is_ptr"], ["seq", "i", "at"]].merge(wide, on=["seq", "i"])
    kept = a.sites.table.loc[a.sites.table["kept"], ["seq", "site"]].astype({"site": str})
    want = {(s, int(i), int(at)) for s, i, at in inner.merge(kept, on="seq")[["site", "i", "at"]].to_numpy()}
    w = a.structs
    ptr = w[(w["scope"] == "site") & w["kind"].isin(["pointer", "maybe_pointer"])]
    got = {(s, int(i), int(at)): r for s, i, at, r in zip(ptr["site"], ptr["i"], ptr["at"], ptr["role"])}
    assert want and want <= set(got)
    assert all(got[k] for k in want)                    # each with a role


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_struct_sizes_reproduce_their_bytes(case):
    a, _ = analysed(*case)
    w = a.structs
    tok = a.reference.tokens
    kept = a.sites.table[a.sites.table["kept"]].astype({"site": str})
    prm = a.dump.params.loc[~a.dump.params["word"], ["seq", "i", "hex"]]
    for r in w[(w["scope"] == "site") & w["kind"].isin(["size", "lanes"])].itertuples():
        fits = ([(ln["lane"], ln["expr"]) for ln in r.lanes if ln["kind"] == "size"] if r.kind == "lanes"
                else [(None, r.expr)])
        fits = [(lane, e) for lane, e in fits if e and e.startswith(("tokens", "mul", "ceil_div", "add"))
                and "ctx" not in e]
        if not fits:
            continue
        rows = kept[kept["site"] == r.site].merge(prm[prm["i"] == r.i], on="seq")
        rows = rows[rows["forward"].isin(tok.index)]
        x = tok.reindex(rows["forward"]).to_numpy()
        for lane, expr in fits:
            lo, n = (r.at, r.wsize) if lane is None else (r.at + 4 * lane, 4)
            got = np.array([int.from_bytes(bytes.fromhex(h)[lo:lo + n], "little", signed=True) for h in rows["hex"]])
            assert (got == evaluate(parse(expr), {"tokens": x})).all(), (r.site, r.at, lane, expr)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_contract_round_trip(case):
    a, _ = analysed(*case)
    j = to_json(a)
    doc = from_json(json.loads(json.dumps(j, allow_nan=False)))
    assert doc.to_json() == j
    for fw in doc.passes.forwards:
        assert sum(n for _, n in fw.seqs) == fw.n_launches
