"""The mining on a real batched capture (tests/fixtures/batched/README.md): vLLM 0.26 eager
serving three groups of 1, 8 and 32 concurrent requests of mixed prompt lengths, each checked
against the engine steps its truth file implies.

Why: the vLLM truth suite (test_truth_suite.py) serves one sequence at a time, so a kernel that
counts sequences (a sampler's) and one that counts tokens (a layer's) agree on every decode step
there; here they part (a prefill of 8 prompts is 614 tokens and 8 sequences, a decode of 28
sequences 28 tokens), and batch-sized builds of the GEMM, gather and sort kernels vary the
launches between steps.

Expectations come from the truth file alone, through `compiler.requests.steps` (groups in order,
running sequences decode first, prompts chunked to the scheduler's token budget): the serving
forwards are the steps, in order, each with the step's tokens (the sum over its sequences), every
one with the truth's layer count, and each group's steps in one request window of its own.

Not checked, because the dump cannot say it: the number of sequences of a forward. The analysis
reports none (its variables are tokens and the context accumulated in a window); launches whose
grids follow the sequence count exist (per-sequence sampling and input staging), but which launch
variable counts sequences rather than, say, requests sampled or blocks gathered is the engine's
knowledge, not the capture's.
"""

from __future__ import annotations

import json
from functools import lru_cache

from compiler.requests import read_requests
from mining.analyze import analyze, document
from mining.load import load_dump
from paths import FIXTURES

BATCHED = FIXTURES / "batched"
NAMES = ["q2b"]


@lru_cache(maxsize=None)
def analysed(name: str):
    a = analyze(load_dump(BATCHED / f"{name}.tar.xz", cache=False))
    truth = json.loads((BATCHED / f"{name}.truth.json").read_text())
    return a, truth, read_requests(BATCHED / f"{name}.truth.json")


def serving(a):
    f = a.forwards
    return f[f["phase"] == "serve"].reset_index(drop=True)


def test_serving_forwards_are_the_steps():
    """Count and order of the serving forwards and each one's tokens equal the steps'."""
    for name in NAMES:
        a, _, reqs = analysed(name)
        serve = serving(a)
        want = [s.tokens for s in reqs.steps]
        got = serve["tokens"].tolist()
        print(f"{name}: {len(got)} serving forwards (steps: {len(want)}); tokens {got}")
        assert got == want, name
        # eager launches: every value is the launched size, none a graph's capture size
        assert (serve["tokens_from"] == "launch").all(), name
        # start-up passes (profile and warm-up runs) precede every step
        f = a.forwards
        assert (f["phase"] == "startup").any()
        assert f.loc[f["phase"] == "startup", "forward"].max() < serve["forward"].min()


def test_layer_count_on_every_serving_forward():
    for name in NAMES:
        a, truth, _ = analysed(name)
        serve = serving(a)
        assert (serve["layers"] == truth["geometry"]["num_hidden_layers"]).all(), name


def test_each_group_is_one_request_window():
    """The requests of a group were submitted together and the groups one after the other: each
    group's steps lie in one request window, and no two groups share one."""
    for name in NAMES:
        a, _, reqs = analysed(name)
        serve = serving(a)
        groups = [reqs.requests[s.runs[0].request].group for s in reqs.steps]
        windows = serve["window"].tolist()
        by_group: dict[int, set] = {}
        for g, w in zip(groups, windows):
            by_group.setdefault(g, set()).add(w)
        assert all(len(ws) == 1 for ws in by_group.values()), (name, by_group)
        assert len({min(ws) for ws in by_group.values()}) == len(by_group), (name, by_group)


def test_document_says_the_same():
    """The typed document (`mine analyze --json`) carries the same serving forwards."""
    for name in NAMES:
        a, truth, reqs = analysed(name)
        doc = document(a)
        serve = doc.serve_forwards()
        assert [f.tokens for f in serve] == [s.tokens for s in reqs.steps], name
        assert {f.layers for f in serve} == {truth["geometry"]["num_hidden_layers"]}, name
