"""`mine analyze` end to end: report, JSON, plot, trace; bad input is one sentence and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dumpsim import SimConfig, simulate
from vocab.analysis import ANALYSIS_SCHEMA_VERSION


def run(*args):
    out = subprocess.run([sys.executable, "-m", "mine.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    out.stderr = " ".join(out.stderr.split())  # rich wraps long sentences
    return out


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    simulate(root, SimConfig(prompts=(34, 85), decode_steps=2))
    return root


def test_analyze_writes_everything(dump, tmp_path):
    out = run("analyze", dump, "--json", tmp_path / "a.json", "--plot", tmp_path / "t.png",
              "--trace", tmp_path / "tr.json")
    assert out.returncode == 0, out.stderr
    assert "tokens reference" in out.stdout and "layers: 4" in out.stdout
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["schema_version"] == ANALYSIS_SCHEMA_VERSION and doc["fits"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "tr.json").read_text())
    assert any(e["name"].startswith("forward") for e in trace["traceEvents"])


@pytest.mark.parametrize("content,phrase", [
    (b"", "no launch records"),
    (b"garbage\nmore garbage\n", "no parsable launch record"),
])
def test_bad_input_is_one_sentence(tmp_path, content, phrase):
    f = tmp_path / "launches.jsonl"
    f.write_bytes(content)
    out = run("analyze", f)
    assert out.returncode == 2
    assert phrase in out.stderr and "Traceback" not in out.stderr


def test_missing_path_and_bad_option(tmp_path, dump):
    out = run("analyze", tmp_path / "missing")
    assert out.returncode == 2 and "no such file" in out.stderr and "Traceback" not in out.stderr
    out = run("analyze", dump, "--per-forward", "7")
    assert out.returncode == 2 and "does not divide" in out.stderr


def test_damaged_dump_still_reports(dump, tmp_path):
    import shutil
    shutil.copytree(dump, tmp_path / "d")
    f = tmp_path / "d" / "pid4242" / "launches.jsonl"
    data = f.read_bytes()
    f.write_bytes(data[:200] + b"\n" + data[:-30])   # a garbage line and a truncated tail
    for c in (tmp_path / "d" / "pid4242" / "cubins").iterdir():
        c.unlink()
    out = run("analyze", tmp_path / "d")
    assert out.returncode == 0, out.stderr
    assert "truncated" in out.stdout and "no cubin" in out.stdout and "Traceback" not in out.stderr
