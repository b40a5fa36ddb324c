"""The mining truth suite: nine real H200 captures (tests/fixtures/suite/README.md), each checked
against what its program asked for, written by the program itself.

Why: the analysis must hold on captures it was not tuned on, so the suite differs in everything a
detector could overfit: 2, 3, 4, 5, 6, 9, 12 and 36 layers; GQA 1, 2, 3, 4; hidden 128-4096;
vLLM eager, vLLM's default torch.compile + CUDA-graph mode in-process and served, and a Triton
program of our own with a heterogeneous stack and graph-replayed decode; 2-4 requests of
different lengths. Expectations come from the truth files only: a vLLM request is one prefill
of len(prompt) tokens and len(output) - 1 one-token decode steps; the Triton program lists its
forwards. Nothing here names a kernel of a fixture.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from mining.analyze import analyze, to_json
from vocab.analysis import from_json
from mining.fit import evaluate, parse
from mining.load import load_dump
from paths import ROOT, FIXTURES

SUITE = FIXTURES / "suite"
VLLM_EAGER = ["q1e", "q2e", "q4e", "q12e", "q36e"]
VLLM_DEFAULT = ["q3d", "q3ds"]
PLANTED = ["tri_mixed", "tri_dense", "tri_gated", "tri_more"]
ALL = VLLM_EAGER + VLLM_DEFAULT + PLANTED
# vLLM 0.26's default cudagraph_capture_sizes (its config line in the capture log): a
# graph-replayed forward runs at the smallest size that holds its tokens
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))


@lru_cache(maxsize=None)
def analysed(name: str):
    a = analyze(load_dump(SUITE / f"{name}.tar.xz", cache=False))
    return a, json.loads((SUITE / f"{name}.truth.json").read_text())


def expected_forwards(truth: dict) -> list[int]:
    if "requests" in truth:
        out: list[int] = []
        for r in truth["requests"]:
            out += [len(r["prompt"])] + [1] * (len(r["output"]) - 1)
        return out
    return [f["tokens"] for f in truth["forwards"] if f["kind"] in ("prefill", "decode")]


def padded(n: int) -> int:
    return next(s for s in CAPTURE_SIZES if s >= n)


def layer_count(truth: dict) -> int:
    return truth["geometry"]["num_hidden_layers"] if "geometry" in truth else len(truth["layer_kinds"])


@pytest.mark.parametrize("name", VLLM_EAGER + PLANTED)
def test_serving_forwards_are_the_requests(name):
    """Count, order and token values of the real forwards, start-up passes kept out."""
    a, truth = analysed(name)
    f = a.forwards
    serve = f[f["phase"] == "serve"]
    assert serve["tokens"].tolist() == expected_forwards(truth)
    assert a.passes.method == "layer_stacks"
    # an eager reference launch gives the real count; a replayed one says it is a graph's size
    want = ["graph" if g else "launch" for g in
            (f["graph"] for f in truth.get("forwards", []) if f["kind"] in ("prefill", "decode"))]
    assert serve["tokens_from"].tolist() == (want or ["launch"] * len(serve))
    # every start-up pass precedes every request
    assert (f["phase"] == "startup").any()
    assert f[f["phase"] == "startup"]["forward"].max() < serve["forward"].min()


@pytest.mark.parametrize("name", VLLM_DEFAULT)
def test_graph_mode_forwards_are_the_requests(name):
    """vLLM's default mode: decode steps are full-graph replays, prefills piecewise replays with
    eager attention between them; each forward runs at its graph's padded size. The ~100 compile
    and capture warm-ups at every capture size are start-up, the captures themselves no forward."""
    a, truth = analysed(name)
    f = a.forwards
    serve = f[f["phase"] == "serve"]
    assert serve["tokens"].tolist() == [padded(n) for n in expected_forwards(truth)]
    # and the analysis says so: every one of those values is a graph's capture size
    assert (serve["tokens_from"] == "graph").all()
    assert (serve["replayed"] > 0).all()
    decode = serve[serve["tokens"] == 1]
    assert (decode["graph_execs"] == 1).all() and (decode["replayed"] > 0).all()
    startup = f[f["phase"] == "startup"]
    assert len(startup) >= len(CAPTURE_SIZES)
    # launches recorded inside a stream capture ran in no forward at that time
    captured = a.dump.launches["capture_id"].to_numpy() >= 0
    assert captured.any() and (a.passes.forward[captured] == -1).all()
    assert len(a.passes.captures) == int(captured.sum() > 0) * a.passes.captures["capture_id"].nunique()


@pytest.mark.parametrize("name", ALL)
def test_layer_count_on_every_serving_forward(name):
    a, truth = analysed(name)
    serve = a.forwards[a.forwards["phase"] == "serve"]
    assert (serve["layers"] == layer_count(truth)).all()


@pytest.mark.parametrize("name", PLANTED)
def test_heterogeneous_stack_pattern(name):
    """The planted stack's kinds in order (dense blocks before gated ones) come back as the
    pattern: one letter per run of a kind, with the run's length."""
    a, truth = analysed(name)
    kinds = truth["layer_kinds"]
    runs = []
    for k in kinds:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    serve = a.forwards[a.forwards["phase"] == "serve"]
    for pat in serve["pattern"].unique():
        got = [(tok.split("×")[0], int(tok.split("×")[1])) for tok in pat.split()]
        assert [c for _, c in got] == [c for _, c in runs]
        assert len({k for k, _ in got}) == len(runs)


# what each kind of layer launches, as examples/planted/triton_engine.py's Engine.forward does (the
# captures committed before the program wrote it into its truth file lack the key)
PLANTED_LAYER_KERNELS = {"dense": ["norm_kernel", "proj_kernel", "act_kernel", "proj_kernel"],
                         "gated": ["norm_kernel", "kv_write_kernel", "kv_write_kernel", "proj_kernel",
                                   "proj_kernel", "act_kernel", "proj_kernel"]}


@pytest.mark.parametrize("name", PLANTED)
def test_planted_call_sites_of_each_layer(name):
    """In every serving forward, each layer's call sites are exactly the kernels the program
    launched for that layer, in order."""
    a, truth = analysed(name)
    want = truth.get("layer_kernels", PLANTED_LAYER_KERNELS)
    t = a.sites.table
    serve = a.forwards.loc[a.forwards["phase"] == "serve", "forward"]
    for fw in serve:
        g = t[(t["forward"] == fw) & (t["layer_e"] >= 0)]
        got = [grp["symbol"].astype(str).tolist() for _, grp in g.groupby("layer_e")]
        assert got == [want[k] for k in truth["layer_kinds"]], fw


@pytest.mark.parametrize("name", PLANTED)
def test_planted_data_flow(name):
    """The buffer views equal the program's own data flow (truth `flow`: the buffer each pointer
    parameter of each layer kernel names): every pair of words naming one buffer -- in a layer
    or across layers -- is at distance 0, a layer's V cache rows at the planted distance from its
    K rows, and words naming different buffers are never at one address."""
    a, truth = analysed(name)
    flow = truth["flow"]
    rel = from_json(to_json(a)).relation()
    words = []   # ((site, i, 0), buffer key)
    idx = a.sites.index
    for layer, kind in enumerate(truth["layer_kinds"]):
        sites = idx[idx["layer"] == layer].sort_values("pos")["site"].tolist()
        assert len(sites) == len(flow["layer"][kind])
        for site, params in zip(sites, flow["layer"][kind]):
            for i, buf in params.items():
                words.append(((site, int(i), 0), (buf, layer if buf in flow["per_layer"] else None)))
    assert len(words) > 10
    same = apart = 0
    for n, (w1, b1) in enumerate(words):
        for w2, b2 in words[n + 1:]:
            d = rel.distance(w1, w2)
            if b1 == b2:
                assert d == 0, (w1, w2, b1)
                same += 1
            elif b1[1] is not None and b1[1] == b2[1]:
                kv = flow["kv1_minus_kv0"]
                assert d == (kv if b1[0] == "kv0" else -kv), (w1, w2)
            else:
                assert d != 0, (w1, w2, b1, b2)
                apart += 1
    assert same > len(truth["layer_kinds"]) and apart > same


@pytest.mark.parametrize("name", PLANTED)
def test_planted_graph_replays_attributed(name):
    """Each forward the program replayed from its CUDA graph is found, at its place, with the
    graph's kernels; the eager ones have none."""
    a, truth = analysed(name)
    serve = a.forwards[a.forwards["phase"] == "serve"]
    want = [f["graph"] for f in truth["forwards"] if f["kind"] in ("prefill", "decode")]
    assert (serve["replayed"] > 0).tolist() == want
    assert len(a.passes.captures) == truth.get("graph_captures", 0)


@pytest.mark.parametrize("name", PLANTED)
def test_planted_grid_expressions(name):
    """Every planted grid expression equals the fitted one on a range of token counts."""
    a, truth = analysed(name)
    fits = a.fits
    xs = np.arange(1, 600)
    for kernel, expr in truth["grids"].items():
        rows = fits[(fits["symbol"] == kernel) & (fits["field"] == "grid_x")]
        if kernel in ("kv_write_kernel", "attend_kernel") and "gated" not in truth["layer_kinds"]:
            assert rows.empty
            continue
        assert len(rows), kernel
        want = evaluate(parse(expr), {"tokens": xs})
        for _, r in rows.iterrows():
            assert r["status"] == "fit", (kernel, r["site"], r["status"])
            assert (evaluate(parse(r["expr"]), {"tokens": xs}) == want).all(), (kernel, r["expr"], expr)


@pytest.mark.parametrize("name", PLANTED)
def test_planted_weight_strides(name):
    """Layer weights sit in one arena per layer kind at a fixed stride; the KV cache one region
    per gated layer: the per-layer address strides and the pool's role equal what the program
    allocated and did."""
    a, truth = analysed(name)
    st = a.strides.dropna(subset=["stride"])
    found = set(st["stride"].astype(int).tolist())
    for kind, stride in truth["weights"]["arena_stride"].items():
        n = truth["layer_kinds"].count(kind)
        if n >= 2:
            assert stride in found, (kind, stride, found)
    if truth["layer_kinds"].count("gated") >= 2:
        # the cache is written by one kernel and read back by another: a KV pool, one region per
        # gated layer at the stride the program allocated
        kv = st[(st["role"] == "kv_pool") & (st["stride"] != 0)]
        assert set(kv["stride"].astype(int)) == {truth["weights"]["kv_layer_stride"]}
        assert set(kv["symbol"]) == {"kv_write_kernel", "attend_kernel"}


@pytest.mark.parametrize("name", PLANTED)
def test_planted_pointer_roles_in_a_stack_of_two_kinds(name):
    """Each layer kernel's weight words (the pointer params the truth's flow leaves out) have the
    role weight, and its activation words (the residual stream, the normed input, the MLP
    activations and the staged position, which every layer shares) never do. Why: position k of a
    dense layer and position k of a gated one are different kernels; judged together, a shared
    activation looks like a per-layer address (tri_serve showed every activation as a weight)."""
    a, truth = analysed(name)
    flow = truth["flow"]
    p = a.pointers
    roles = {(r.site, int(r.i)): r.role for r in p.itertuples()}
    idx = a.sites.index
    checked = 0
    for layer, kind in enumerate(truth["layer_kinds"]):
        sites = idx[idx["layer"] == layer].sort_values("pos")["site"].tolist()
        for site, params in zip(sites, flow["layer"][kind]):
            ptr_params = sorted({i for (s_, i) in roles if s_ == site})
            for i in ptr_params:
                name_ = params.get(str(i))
                if name_ is None:
                    assert roles[(site, i)] == "weight", (layer, site, i, roles[(site, i)])
                elif name_ not in flow["per_layer"]:
                    assert roles[(site, i)] not in ("weight", "kv_pool"), (layer, site, i, name_)
                checked += 1
    assert checked > 4 * len(truth["layer_kinds"])


@pytest.mark.parametrize("name", [n for n in VLLM_EAGER if n != "q1e"])
def test_vllm_weights_and_kv_strides(name):
    """In vLLM eager, the KV pool is found in every layer at one constant stride, used by two
    kernels, and the per-layer weights span the model's layers."""
    a, truth = analysed(name)
    st = a.strides
    L = layer_count(truth)
    kv = st[(st["role"] == "kv_pool") & st["stride"].notna() & (st["layers"] == L)]
    # one pool stride shared by the kernel that writes the cache and the one that reads it
    assert len(kv) and kv.groupby("stride")["symbol"].nunique().max() >= 2
    w = st[st["role"] == "weight"]
    # cuBLAS may pick another GEMM kernel for the first or last layer: those sites span fewer
    assert len(w) and (w["layers"] == L).mean() > 0.9 and (w["layers"] >= L - 2).all()


@pytest.mark.parametrize("name", ALL)
def test_contract_round_trip(name):
    """The analysis JSON reads back to the same typed records, and every forward's seq runs
    add up to its launches."""
    a, _ = analysed(name)
    j = to_json(a)
    doc = from_json(json.loads(json.dumps(j, allow_nan=False)))
    assert doc.to_json() == j
    for fw in doc.passes.forwards:
        assert sum(n for _, n in fw.seqs) == fw.n_launches
    assert len(doc.serve_forwards()) == int((a.forwards["phase"] == "serve").sum())


def test_one_layer_model_is_anchored_not_invented():
    """A one-layer model has no layer repeat inside a forward; its repeating decode steps are not
    taken for layers (each waits on the host at one place): forwards are anchored on a kernel that
    runs once per step, and the analysis says so."""
    a, truth = analysed("q1e")
    assert any("no layer structure" in n for n in a.notes)
    assert any(n.startswith("one layer: every forward anchored on") for n in a.notes)
    serve = a.forwards[a.forwards["phase"] == "serve"]
    assert serve["tokens"].tolist() == expected_forwards(truth)


def test_boundaries_say_what_decided_them():
    a, _ = analysed("q12e")
    f = a.forwards
    assert set(f["cut_by"]) <= {"capture_edge", "tail_pattern", "unmatched", "request_gap"}
    assert f["confidence"].between(0, 1).all()
    # inside a request the steady decode cycle matches the learnt tail and head exactly
    serve = f[f["phase"] == "serve"]
    assert (serve["cut_by"] == "tail_pattern").mean() > 0.7


def test_no_repeating_step_invents_nothing():
    """The capture probe (every launch path once, no model) has no repeating step: no forward is
    made up, and the notes say why."""
    a = analyze(load_dump(FIXTURES / "capture" / "probe.tar.xz", cache=False))
    assert len(a.forwards) == 0 and a.passes.method == "none"
    assert any(n.startswith("no repeating step found") for n in a.notes)
    doc = from_json(json.loads(json.dumps(to_json(a), allow_nan=False)))
    assert doc.passes.forwards == [] and doc.fits == []


@pytest.mark.parametrize("name", VLLM_EAGER)
def test_gen_qwen3_through_the_analysis(name, tmp_path):
    """`mine gen qwen3` makes a verified manifest from every eager capture of the suite, its forwards
    and layer structure taken from the analysis (the geometry's config comes from the truth)."""
    from generators.qwen3.generate import build_manifest
    from manifests.verify import verify

    a, truth = analysed(name)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(truth["config"]))
    doc = tmp_path / "analysis.json"   # the analysis made above, as `mine analyze --json` writes it
    doc.write_text(json.dumps(to_json(a)))
    _, mm, _, m = build_manifest(SUITE / f"{name}.tar.xz", cfg, ROOT / "kernels.toml", 2048, analysis=doc)
    assert verify(m) == []
    assert len(m["states"]) == layer_count(truth)
    # the forwards it mined are the analysis' own, at the analysis' token counts, and every
    # serving forward is among them
    tokens = a.forwards.set_index("forward")["tokens"]
    assert all(int(tokens[f]) == t for f, _, t in mm.forwards)
    serve = set(a.forwards.loc[a.forwards["phase"] == "serve", "forward"])
    if layer_count(truth) > 1:
        assert serve <= {f for f, _, _ in mm.forwards}
    else:
        # one layer: forwards are anchored on one kernel, and a request's prefill and first
        # decode meet at a cut the generator's walk does not always take whole
        assert len(serve & {f for f, _, _ in mm.forwards}) >= len(serve) // 2


def test_analysis_checks_name_the_call_site():
    """The generator's checks over the analysis: a layer's norm weight shared with another layer,
    or a KV pool no two kernels share, is refused in one sentence naming the call sites."""
    import dataclasses

    from generators.qwen3 import mined
    from mining.analyze import document

    a, truth = analysed("q12e")
    doc = document(a)
    mined.check_weights_distinct(doc)
    picked = [p for p in doc.pointers if p.role == "weight" and p.layer >= 0
              and (mined.tag(p.symbol), p.i) in {("rms", 7), ("fadd", 3)}]
    a0 = next(p for p in picked if p.layer == 0)
    a3 = next(p for p in picked if p.layer == 3 and p.i == a0.i and p.at == a0.at)
    bad = dataclasses.replace(doc, pointers=[dataclasses.replace(p, value=a0.value) if p is a3 else p
                                             for p in doc.pointers])
    with pytest.raises(mined.WiringMismatch, match=rf"call site .* \(layer 3\) takes the weight .* call site "
                                                   rf"{a0.site} \(layer 0\)"):
        mined.check_weights_distinct(bad)
    cfg = type("Cfg", (), {"layers": layer_count(truth)})()
    mined.check_kv_pool(doc, cfg)
    no_pool = dataclasses.replace(doc, layers=dataclasses.replace(
        doc.layers, strides=[s for s in doc.layers.strides if s.role != "kv_pool"]))
    with pytest.raises(mined.WiringMismatch, match="no KV pool that two kernels share in all 12 layers"):
        mined.check_kv_pool(no_pool, cfg)
