"""The analysis contract (vocab/analysis.py): strict round trip, one sentence per bad input, and
`mine gen qwen3 --analysis` taking it (or refusing an analysis of another capture)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mining.analyze import analyze, to_json
from vocab.analysis import ANALYSIS_SCHEMA_VERSION, AnalysisError, from_json
from mining.fit import parse, render
from mining.load import load_dump
from paths import ROOT

SUITE = ROOT / "tests" / "fixtures" / "suite"
OFFLINE = ROOT / "tests" / "fixtures" / "vllm" / "vllm-offline.tar.xz"
CONFIG = ROOT / "examples" / "vllm_qwen3" / "reference" / "config.json"


@pytest.fixture(scope="module")
def doc():
    return to_json(analyze(load_dump(SUITE / "tri_mixed.tar.xz", cache=False)))


def test_round_trip_is_exact(doc):
    text = json.dumps(doc, allow_nan=False)
    assert from_json(json.loads(text)).to_json() == doc


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(schema_version=1), "schema_version 1 is not the supported"),
    (lambda d: d.pop("fits"), "analysis: missing key(s) ['fits']"),
    (lambda d: d.update(extra=1), "analysis: unknown key(s) ['extra']"),
    (lambda d: d["passes"]["forwards"][0].update(tokens="5"), "analysis.passes.forwards[0].tokens: expected an integer"),
    (lambda d: d["passes"]["forwards"][0].update(layers=True), "analysis.passes.forwards[0].layers: expected an integer"),
    (lambda d: d["passes"]["forwards"][0].update(confidence=float("nan")), "confidence: expected a finite number"),
    (lambda d: d["sites"].__setitem__(0, []), "analysis.sites[0]: expected an object"),
    (lambda d: d["passes"].update(forwards={}), "analysis.passes.forwards: expected a list"),
    (lambda d: d["layers"]["shapes"][0]["kinds"][0].pop("kind"), "kinds[0]: missing key(s) ['kind']"),
])
def test_bad_documents_name_the_path(doc, edit, needle):
    bad = copy.deepcopy(doc)
    edit(bad)
    with pytest.raises(AnalysisError) as e:
        from_json(bad)
    assert needle in str(e.value)


def test_not_an_object():
    with pytest.raises(AnalysisError, match="expected a JSON object"):
        from_json([ANALYSIS_SCHEMA_VERSION])


@pytest.mark.parametrize("text", ["tokens", "12", "-3", "mul(tokens, 16)", "ceil_div(mul(tokens, 512), 1024)",
                                  "add(tokens, 64)", "add(ceil_div(tokens, 2), ctx)"])
def test_fit_expressions_parse_back(text):
    assert render(parse(text)) == text


@pytest.mark.parametrize("text", ["", "mul(tokens)", "mul(tokens, x)", "tokens)", "add(1,", "ceil_div(, 2)"])
def test_bad_expressions_are_refused(text):
    with pytest.raises(ValueError):
        parse(text)


def _gen(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "mine.cli", "gen", "qwen3", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "200"})


def test_gen_reads_the_analysis_file(tmp_path, offline_analysis_json):
    """The analysis as `mine analyze --json` writes it (the session's, tests/conftest.py; the command
    itself: tests/cli/test_mining_cli.py), then `mine gen qwen3 --analysis`: the same manifest as
    computing it."""
    a = offline_analysis_json
    r = _gen(["--dump", str(OFFLINE), "--analysis", str(a), "--config", str(CONFIG), "--out", str(tmp_path / "m")],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "qwen3.json").read_bytes() == (ROOT / "manifests" / "qwen3" / "qwen3.json").read_bytes()


def test_gen_refuses_an_analysis_of_another_capture(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(to_json(analyze(load_dump(SUITE / "q2e.tar.xz", cache=False)))))
    r = _gen(["--dump", str(OFFLINE), "--analysis", str(a), "--config", str(CONFIG), "--out", str(tmp_path / "m")],
             tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the analysis was made from another capture" in r.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("content, needle", [(None, "cannot be read"), ("{", "not valid JSON"),
                                             ('{"schema_version": 1}', "schema_version 1 is not the supported")])
def test_gen_bad_analysis_file_is_one_sentence(tmp_path, content, needle):
    a = tmp_path / "a.json"
    if content is not None:
        a.write_text(content)
    r = _gen(["--dump", str(OFFLINE), "--analysis", str(a), "--config", str(CONFIG), "--out", str(tmp_path / "m")],
             tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_gen_layer_count_mismatch_is_named(tmp_path, offline_analysis_json):
    """A config of another depth than the capture's is refused by the analysis check."""
    cfg = json.loads(CONFIG.read_text())
    cfg["num_hidden_layers"] = 27
    c = tmp_path / "config.json"
    c.write_text(json.dumps(cfg))
    r = _gen(["--dump", str(OFFLINE), "--analysis", str(offline_analysis_json), "--config", str(c),
              "--out", str(tmp_path / "m")], tmp_path)
    assert r.returncode == 2 and "the analysis finds 28 layers per forward" in r.stderr
