"""The analysis' `flow` section from real replay results: the H200 replays of the bundled vLLM
capture's decode forward (tests/gpu_results/replay/results.tar.xz, made by tests/replay/test_replay_gpu.py)
mapped onto the call sites of that capture's analysis, on any machine."""

from __future__ import annotations

import copy
import json
import tarfile
from pathlib import Path

import pytest

from vocab.analysis import from_json
from replay.run import LaunchResult, WordFlow
from replay.sites import flow_words, site_of
from paths import ROOT


@pytest.fixture(scope="module")
def case(offline_dump, offline_document):
    with tarfile.open(ROOT / "tests/gpu_results/replay/results.tar.xz") as t:
        raw = json.load(t.extractfile("vllm_decode.json"))
    results = [LaunchResult(**{**r, "words": [WordFlow(**w) for w in r["words"]]}) for r in raw]
    d, doc = offline_dump, offline_document   # the session's (tests/conftest.py)
    symbols = dict(zip(d.launches["seq"].tolist(), d.launches["symbol"].astype(str).tolist()))
    return results, doc, symbols


def test_every_replayed_launch_gets_its_site(case):
    results, doc, symbols = case
    sites = site_of(doc, symbols)
    known = {s.site for s in doc.sites}
    ok = [r for r in results if r.status == "ok"]
    assert all(r.seq in sites and sites[r.seq] in known for r in ok)
    flow, outside = flow_words(results, doc, symbols)
    assert outside == 0
    assert {w.site for w in flow} == {sites[r.seq] for r in ok if r.words}


def test_measured_norm_directions_per_site(case):
    """Every rms_norm call site of the forward: output written, input and weight read only."""
    results, doc, symbols = case
    flow, _ = flow_words(results, doc, symbols)
    norms = {}
    for w in flow:
        if w.site.startswith("_ZN4vllm15rms_norm_kernel"):
            norms.setdefault(w.site, {})[w.i] = w.direction
    assert len(norms) >= 28
    assert all(d == {0: "out", 1: "in", 7: "in"} for d in norms.values()), norms


def test_flow_round_trips_through_the_contract(case):
    results, shared, symbols = case
    doc = copy.copy(shared)   # the session's document stays as analysed
    doc.flow, _ = flow_words(results, doc, symbols)
    back = from_json(json.loads(json.dumps(doc.to_json())))
    assert back.flow == doc.flow and len(back.flow) > 100
