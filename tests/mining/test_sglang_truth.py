"""SGLang's captures against their truth: the mining truth suite's checks, engine-generic.

Why: the analysis must hold on SGLang as on vLLM without SGLang-specific rules, so these are the
checks tests/mining/test_truth_suite.py makes of the vLLM captures, written against the truth file
alone (examples/sglang_qwen3/truth.py writes it; the vLLM suite's files have the same `geometry`,
`requests` and `mode`): the serving forwards are the requests (a prefill of the prompt, then one-token
decode steps -- in CUDA-graph mode each at the smallest size SGLang captured a graph at, as the
server reported its `cuda_graph_config`), every serving forward has the checkpoint's layer count,
the KV pool sits at one stride in every layer and two kernels share it, per-layer weights span the
layers, every pointer word inside a by-value struct is classified with a role, every struct word
fitted to the token count reproduces the bytes it was fitted to, and the analysis JSON reads back.

Cases: every `tests/fixtures/sglang/<name>.truth.json` (device_run.sh's fixtures: committing the
files of a run adds them), and the vLLM suite's q2e, so the checks themselves run on a real
capture before any SGLang fixture exists.
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


def expected_forwards(truth: dict) -> list[int]:
    pre, dec = graph_sizes(truth, "prefill"), graph_sizes(truth, "decode")
    out: list[int] = []
    for r in truth["requests"]:
        out += [padded(len(r["prompt"]), pre)] + [padded(1, dec)] * (len(r["output"]) - 1)
    return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_serving_forwards_are_the_requests(case):
    a, truth = analysed(*case)
    f = a.forwards
    serve = f[f["phase"] == "serve"]
    assert a.passes.method == "layer_stacks"
    assert serve["tokens"].tolist() == expected_forwards(truth)
    assert (f["phase"] == "startup").any()
    assert f[f["phase"] == "startup"]["forward"].max() < serve["forward"].min()
    if graph_sizes(truth, "decode"):
        decode = serve[serve["tokens"] == padded(1, graph_sizes(truth, "decode"))]
        assert (decode["replayed"] > 0).all() and (decode["tokens_from"] == "graph").all()
    elif not graph_sizes(truth, "prefill"):
        assert (serve["replayed"] == 0).all() and (serve["tokens_from"] == "launch").all()


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
    w = st[st["role"] == "weight"]
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
