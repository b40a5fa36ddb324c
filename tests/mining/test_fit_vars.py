"""Fits over tokens and sequences (mining/fit.py) and the forward variables (mining/fwdvars.py),
on plain samples and on simulated dumps whose truth is planted (tests/helpers/dumpsim_batched.py).

Why: a batched engine's launches follow two variables. The fitter must separate them where the
samples do, say `underdetermined` with the competing forms where they do not (never pick), and
leave a one-sequence capture's fits as they were.
"""

from __future__ import annotations

import numpy as np
import pytest

from dumpsim_batched import ATTN, BATCHED, MIX, SINGLE, UNSEPARATED, simulate
from mining import fwdvars as FV
from mining.analyze import analyze, document
from mining.fit import evaluate, fit, parse, render
from mining.load import load_dump
from vocab.analysis import from_json

# steps of a batched engine: prefills of several prompts, decodes of one token per sequence,
# one mixed step (a prompt chunk with the running decodes)
TOK = np.array([300, 1, 1, 614, 7, 7, 6, 3783, 28, 24, 19, 16, 45, 12, 8, 4])
SEQ = np.array([1, 1, 1, 8, 7, 7, 6, 32, 28, 24, 19, 16, 6, 12, 8, 4])


@pytest.mark.parametrize("text", [
    "seqs", "mul(seqs, 4)", "add(seqs, 3)",
    "add(tokens, seqs)",
    "add(ceil_div(tokens, 64), mul(seqs, 2))",
    "add(add(ceil_div(add(tokens, 1), 16), seqs), -1)",       # floor(tokens / 16) + seqs
    "add(add(mul(tokens, 3), ceil_div(seqs, 4)), 5)",
])
def test_planted_two_variable_forms_come_back(text):
    env = {"tokens": TOK, "seqs": SEQ}
    v = evaluate(parse(text), env)
    f = fit(env, v)
    assert f.status == "fit", (text, f.text)
    assert render(f.expr) == text
    assert f.points == len({(t, s) for t, s in zip(TOK, SEQ)})


def test_floor_form_is_the_real_attention_grid():
    """vLLM's unified attention launches floor(tokens / BLOCK_Q) + seqs programs: the fitted
    text evaluates to that at every probe pair, not only at the samples."""
    env = {"tokens": TOK, "seqs": SEQ}
    f = fit(env, TOK // 16 + SEQ)
    t, s = np.meshgrid(np.arange(1, 600), np.arange(1, 40))
    assert np.array_equal(evaluate(f.expr, {"tokens": t.ravel(), "seqs": s.ravel()}), t.ravel() // 16 + s.ravel())


def test_equal_tokens_and_seqs_stay_underdetermined():
    """Decode steps only (one token per sequence): a value equal to both is either, and the fit
    says so instead of choosing."""
    m = TOK == SEQ
    f = fit({"tokens": TOK[m], "seqs": SEQ[m]}, SEQ[m])
    assert f.status == "underdetermined"
    assert {"tokens", "seqs"} <= set(f.alternatives)


def test_one_variable_forms_are_unchanged_without_seqs():
    """Without a seqs variable the peers are tokens alone: the old search, the old probe."""
    for text in ("tokens", "ceil_div(tokens, 64)", "add(tokens, 64)"):
        v = evaluate(parse(text), {"tokens": TOK})
        assert fit({"tokens": TOK}, v).text == text
    ctx = np.cumsum(TOK)
    f = fit({"tokens": TOK, "ctx": ctx}, ctx + TOK)
    assert f.text == "add(tokens, ctx)"


def test_no_form_of_the_closed_set_is_no_fit():
    v = TOK * SEQ      # a product of two variables is outside the set
    assert fit({"tokens": TOK, "seqs": SEQ}, v).status == "no_fit"


# ------------------------------------------------------------------ simulated dumps
@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    _, truth = simulate(root, BATCHED)
    return analyze(load_dump(root)), truth


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    _, truth = simulate(root, SINGLE)
    return analyze(load_dump(root)), truth


def fit_of(a, symbol_part: str, field: str, occ: int = 0):
    f = a.fits
    row = f[f["symbol"].str.contains(symbol_part) & (f["occ"] == occ) & (f["field"] == field)]
    assert len(row) == 1, (symbol_part, field)
    return row.iloc[0]


def test_sim_steps_and_their_sequences(batched):
    a, truth = batched
    f = a.forwards
    serve = f[f["phase"] == "serve"]
    assert serve["tokens"].tolist() == [s.tokens for s in truth.steps]
    seqs = a.fvars.values["seqs"]
    assert [int(seqs[x]) for x in serve["forward"]] == [s.seqs for s in truth.steps]
    assert a.variables[:2] == ["tokens", "seqs"]
    src = next(s for s in a.fvars.sources if s.var == "seqs")
    assert {site.split("#")[0] for site, _ in src.fields} == {"_Z11attn_kernelv", "_Z13sample_kernelv",
                                                              "_Z20gather_tables_kernelv"}
    # ctx (one sequence's context) only where the window serves one sequence
    ctx = a.fvars.values.get("ctx")
    one = set(serve.loc[serve["window"] == serve["window"].iloc[0], "forward"])
    assert ctx is None or set(ctx.index) <= one


@pytest.mark.parametrize("sym,field,expr", [
    ("embed", "grid_x", "tokens"),
    ("rms_norm", "grid_x", "tokens"),
    ("rms_norm", "param3", "tokens"),
    ("attn", "grid_x", ATTN),
    ("attn", "param4", "seqs"),
    ("mix", "grid_x", MIX),
    ("sample", "grid_x", "seqs"),
    ("gather_tables", "grid_y", "seqs"),
])
def test_sim_planted_forms_separate(batched, sym, field, expr):
    a, _ = batched
    r = fit_of(a, sym, field)
    assert (r["status"], r["expr"]) == ("fit", expr)


def test_sim_what_the_samples_cannot_separate(batched):
    """decode_reduce runs in decode steps only (tokens == seqs there): both forms are listed.
    The staging grid s + 1 and the GEMM's ceil_div(t, 128) each have a rival the samples allow."""
    a, _ = batched
    r = fit_of(a, "decode_reduce", "grid_x")
    assert r["status"] == "underdetermined" and set(UNSEPARATED) <= set(r["alternatives"])
    r = fit_of(a, "stage", "grid_x")
    assert r["status"] == "underdetermined" and "add(seqs, 1)" in r["alternatives"]
    r = fit_of(a, "gemm", "grid_x")
    assert r["status"] == "underdetermined" and "ceil_div(tokens, 128)" in r["alternatives"]


def test_sim_document_round_trip(batched):
    a, truth = batched
    doc = document(a)
    assert doc.forward_vars is not None and doc.forward_vars.names[:2] == ["tokens", "seqs"]
    back = from_json(doc.to_json())
    assert back.forward_vars == doc.forward_vars
    rows = {r.forward: r for r in back.forward_vars.forwards}
    serve = [f.forward for f in back.serve_forwards()]
    assert [rows[f].seqs for f in serve] == [s.seqs for s in truth.steps]


def test_sim_one_sequence_has_no_seqs_variable(single):
    """Every step serves one sequence: no per-sequence count, so no seqs in any fit."""
    a, truth = single
    assert "seqs" not in a.variables
    assert not any("seqs" in str(e) for e in a.fits["expr"].dropna())
    assert not any("seqs" in x for alts in a.fits["alternatives"] for x in alts)
    assert fit_of(a, "gemm", "grid_x")["expr"] == "ceil_div(tokens, 128)"


def test_sequences_rule_needs_two_kernels():
    """One kernel's count of something other than tokens is not enough for a seqs variable."""
    import pandas as pd

    tok = pd.Series(TOK, index=range(len(TOK)))
    rows = [{"site": "a#0", "field": "grid_x", "forward": i, "value": int(s)} for i, s in enumerate(SEQ)]
    fields = pd.DataFrame(rows)
    seqs, src, note = FV.sequences(fields, tok, set(tok.index), {"a#0": "a"})
    assert src is None and len(seqs) == 0 and "only 1 kernel" in note
    both = pd.concat([fields, fields.assign(site="b#0")], ignore_index=True)
    seqs, src, _ = FV.sequences(both, tok, set(tok.index), {"a#0": "a", "b#0": "b"})
    assert src is not None and seqs.tolist() == SEQ.tolist() and src.kernels == 2
    # a count above the tokens of a step is no sequence count
    over = both.assign(value=both["value"] + 1)
    assert FV.sequences(over, tok, set(tok.index), {"a#0": "a", "b#0": "b"})[1] is None
