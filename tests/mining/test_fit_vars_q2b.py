"""The forward variables and two-variable fits on the real batched capture (q2b: vLLM 0.26 eager
serving groups of 1, 8 and 32 concurrent requests), checked against the steps its truth implies.

Why: the analysis reads the sequences of a step from the capture alone (mining/fwdvars.py). The
truth (`compiler.requests.steps`: tokens, sequences and longest context of every step) says
what they are. Every value the truth's variables explain must be fitted to the same expression
from the capture's own variables. The ones the truth's variables leave open stay open in the
capture too, and are listed.

Checked on the serving forwards (the truth's steps; start-up passes have no truth). The
analysis' fit covers every forward of a site, so it may be pinned where the serving forwards
alone are not: there, its expression must still reproduce the serving values.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from compiler.requests import read_requests
from mining import fwdvars as FV
from mining.analyze import analyze
from mining.fit import evaluate, fit, parse
from mining.load import load_dump
from paths import FIXTURES

Q2B = FIXTURES / "batched" / "q2b"


@lru_cache(maxsize=None)
def analysed():
    a = analyze(load_dump(Q2B.with_suffix(".tar.xz"), cache=False))
    reqs = read_requests(Q2B.with_suffix(".truth.json"))
    f = a.forwards
    serve = f.loc[f["phase"] == "serve", "forward"].tolist()
    truth = {fw: {"tokens": st.tokens, "seqs": len(st.runs), "ctx": max(r.end for r in st.runs)}
             for fw, st in zip(serve, reqs.steps)}
    return a, truth


def capture_env(a, fw: np.ndarray) -> dict[str, np.ndarray]:
    """The capture's own variables at forwards `fw`, as the analysis offers them to a site: those
    known at every one of them, `seqs` only where it varies."""
    env = {}
    for k, ser in a.fvars.values.items():
        x = np.array([ser.get(f, -1) for f in fw], np.int64)
        if (x >= 0).all() and (k != "seqs" or len(np.unique(x)) > 1):
            env[k] = x
    return env


@lru_cache(maxsize=None)
def compared():
    """Per (site, field) varying over the serving forwards: the fit from the truth's tokens and
    sequences, the same with the truth's longest context too, the fit from the capture's own
    variables over the same forwards, and the analysis' fit (over every forward of the site)."""
    a, truth = analysed()
    fields = FV.field_values(a.dump.launches, a.dump.params, a.sites.table)
    fields = fields[fields["forward"].isin(truth)]
    fits = a.fits.set_index(["site", "field"])
    out = []
    for (site, fld), g in fields.groupby(["site", "field"], sort=False):
        v = g["value"].to_numpy()
        if (site, fld) not in fits.index or len(np.unique(v)) < 2:
            continue
        fw = g["forward"].to_numpy()
        env = {k: np.array([truth[x][k] for x in fw]) for k in ("tokens", "seqs")}
        with_ctx = {**env, "ctx": np.array([truth[x]["ctx"] for x in fw])}
        out.append((site, fld, fw, v, fit(env, v, piecewise=False), fit(with_ctx, v, piecewise=False),
                    fits.loc[(site, fld)], fit(capture_env(a, fw), v, piecewise=False)))
    return out


def test_sequences_are_the_truths():
    a, truth = analysed()
    seqs = a.fvars.values["seqs"]
    assert {fw: int(seqs[fw]) for fw in truth} == {fw: t["seqs"] for fw, t in truth.items()}
    src = next(s for s in a.fvars.sources if s.var == "seqs")
    assert src.kernels >= 2
    print(f"seqs from {len(src.fields)} fields of {src.kernels} kernels:",
          sorted({s.split('#')[0][:40] for s, _ in src.fields}))


def test_ctx_only_where_one_sequence_is_served():
    a, truth = analysed()
    ctx = a.fvars.values.get("ctx")
    assert ctx is not None
    for fw in ctx.index.intersection(list(truth)):
        assert truth[fw]["seqs"] == 1 and int(ctx[fw]) == truth[fw]["ctx"]
    assert any(t["seqs"] > 1 for t in truth.values())


def test_what_the_truth_explains_the_capture_fits_alike():
    """Over the serving forwards, the capture's variables give the truth's fit wherever the
    truth's variables pin one; the analysis' fit over all of a site's forwards agrees with it
    wherever it is a fit too (start-up passes can leave it no_fit: another build, a dummy batch)."""
    rows = compared()
    pinned = [r for r in rows if r[4].status == "fit"]
    both = [r for r in pinned if "tokens" in r[4].text and "seqs" in r[4].text]
    assert len(pinned) >= 40 and both, (len(pinned), len(both))
    startup = []
    for site, fld, fw, v, truth_fit, _, a, mine in pinned:
        assert (mine.status, mine.text) == ("fit", truth_fit.text), (site, fld, truth_fit.text, mine.text)
        if a["status"] == "fit":
            assert a["expr"] == truth_fit.text, (site, fld, truth_fit.text, a["expr"])
        else:
            startup.append((site.split("#")[0][:48], fld, truth_fit.text, a["status"]))
    assert len(startup) < len(pinned) // 4
    print("two-variable fits:", sorted({(r[0].split("#")[0], r[1], r[4].text) for r in both}))
    print("pinned over the steps, not over every forward:", startup)


def test_the_analysis_never_contradicts_the_truth():
    """Where the analysis fits a value (over every forward of its site), its expression gives the
    serving values at the truth's variables, and a fit the truth leaves open is never pinned
    from the serving forwards alone."""
    _, truth = analysed()
    open_ = []
    for site, fld, fw, v, truth_fit, _, a, _ in compared():
        if a["status"] == "fit":
            env = {k: np.array([truth[x][k] for x in fw]) for k in ("tokens", "seqs", "ctx")}
            assert np.array_equal(evaluate(parse(a["expr"]), env), v), (site, fld, a["expr"])
        if truth_fit.status == "underdetermined":
            open_.append((site.split("#")[0][:48], fld, truth_fit.alternatives[:3], a["status"]))
    print(f"{len(open_)} values the truth's variables leave open:")
    for row in open_:
        print("  ", row)
    assert open_   # the decode-only reduction (tokens == seqs there) at least


def test_longest_context_explains_nothing_more():
    """The longest context is not measured from the capture; on q2b it explains no value that
    tokens and sequences do not."""
    for site, fld, _, _, truth_fit, with_ctx, _, _ in compared():
        if with_ctx.status == "fit":
            assert truth_fit.status == "fit" and with_ctx.text == truth_fit.text, (site, fld)
