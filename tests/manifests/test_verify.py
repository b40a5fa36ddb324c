"""The verifier: one base manifest plus one mutation per rule, asserting rule ids and paths;
and `mine verify` on good, bad and unreadable input (exit 0 / 1 / 2, never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.verify import verify, verify_file
from paths import CORPUS



def base(name: str = "minimal") -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def launch(m: dict) -> dict:
    return m["ops"]["dbl"]["impl"]["launches"][0]


CASES = [
    ("version", lambda m: m.update(schema_version=5), "version.unsupported", "$.schema_version"),
    ("zero dim", lambda m: m["buffers"].update(t={"dtype": "f32", "shape": [0], "kind":
     "workspace"}), "buffer.zero_dim", "$.buffers.t.shape[0]"),
    ("unused buffer", lambda m: m["buffers"].update(t={"dtype": "f32", "shape": [4], "kind":
     "workspace"}), "unused.buffer", "$.buffers.t"),
    ("var max", lambda m: m["vars"]["n"].update(max=0), "var.zero_max", "$.vars.n.max"),
    ("block", lambda m: launch(m).update(block=[1024, 2, 1]), "launch.block",
     "$.ops.dbl.impl.launches[0].block"),
    ("grid div0", lambda m: launch(m).update(grid=[{"ceil_div": ["n", 0]}, 1, 1]),
     "expr.division_by_zero", "$.ops.dbl.impl.launches[0].grid[0]"),
    ("grid limit", lambda m: launch(m).update(grid=[1, {"mul": ["n", 128]}, 1]),
     "launch.grid_limit", "$.ops.dbl.impl.launches[0].grid[1]"),
    ("shared mem", lambda m: launch(m).update(shared_mem=232449), "launch.shared_mem",
     "$.ops.dbl.impl.launches[0].shared_mem"),
    ("cluster", lambda m: launch(m).update(cluster=[3, 1, 1]), "launch.cluster_grid",
     "$.ops.dbl.impl.launches[0].grid[0]"),
    ("dtype", lambda m: m["ops"]["dbl"]["params"].__setitem__(0, "in buffer<bf16>"),
     "call.dtype", "$.programs.main.calls[0].args[0]"),
    ("out never written", lambda m: m["ops"]["dbl"]["params"].__setitem__(1, "in buffer<f32>"),
     "program.never_written", "$.buffers.y"),
    ("write input", lambda m: m["ops"]["dbl"]["params"].__setitem__(0, "inout buffer<f32>"),
     "call.write_read_only", "$.programs.main.calls[0].args[0]"),
    ("read before write", lambda m: m["buffers"]["x"].update(kind="workspace"),
     "call.read_before_write", "$.programs.main.calls[0].args[0]"),
    ("offset", lambda m: m["programs"]["main"]["calls"][0]["args"][1].update(offset=6),
     "call.offset_align", "$.programs.main.calls[0].args[1].offset"),
    ("unknown module", lambda m: launch(m).update(module="nope"), "launch.unknown_module",
     "$.ops.dbl.impl.launches[0].module"),
    ("sha", lambda m: m["modules"]["dbl"].update(sha256="abc"), "module.sha256",
     "$.modules.dbl.sha256"),
    ("fill kind", lambda m: m["buffers"]["y"].update(fill="token", dtype="i32"),
     "buffer.fill_kind", "$.buffers.y.fill"),
    ("once+batch", lambda m: m["programs"]["main"].update(once=True, batch={"groups": 1,
     "rows": 1}), "program.once_batch", "$.programs.main"),
    ("graph", lambda m: m["programs"]["main"].update(graph=True), "program.graph_without_batch",
     "$.programs.main"),
    ("arity", lambda m: m["programs"]["main"]["calls"][0]["args"].pop(), "call.arity",
     "$.programs.main.calls[0].args"),
    ("var to f32", lambda m: m["ops"]["dbl"]["params"].__setitem__(2, "f32"), "call.var_to_f32",
     "$.programs.main.calls[0].args[2]"),
    ("domain", lambda m: m["buffers"]["x"].update(domain={}), "domain.empty",
     "$.buffers.x.domain"),
    ("extern geometry", lambda m: launch(m).update(entry="extern:cublaslt_bf16_tn"),
     "launch.extern_with_module", "$.ops.dbl.impl.launches[0].entry"),
    ("parse", lambda m: m.update(surprise=1), "parse.schema", "$"),
]


@pytest.mark.parametrize("label, edit, rule, path", CASES, ids=[c[0] for c in CASES])
def test_one_mutation_one_rule(label, edit, rule, path):
    m = base()
    edit(m)
    diags = verify(m)
    assert (rule, path) in {(d.rule, d.path) for d in diags}, [str(d) for d in diags]
    assert all(d.message and "\n" not in d.message for d in diags)


def test_every_violation_is_reported():
    m = base()
    m["schema_version"] = 6
    launch(m)["block"] = [0, 1, 1]
    m["buffers"]["t"] = {"dtype": "f32", "shape": [4], "kind": "workspace"}
    rules = [d.rule for d in verify(m)]
    assert rules == ["version.unsupported", "launch.block", "unused.buffer"]


def test_batch_and_multi_rank_bases_verify():
    for name in ("serving", "multirank", "derive"):
        assert verify(base(name)) == []


def test_verify_file_reads_strictly(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(base()))
    assert verify_file(p) == []


def mine(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "mine.cli", "verify", *map(str, args)],
                       capture_output=True, text=True, timeout=60)
    r.stderr = " ".join(r.stderr.split())  # rich wraps long lines at the terminal width
    return r


def test_cli_exit_codes(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(base()))
    m = base()
    m["schema_version"] = 4
    launch(m)["block"] = [2048, 1, 1]
    bad.write_text(json.dumps(m))
    r = mine(good)
    assert r.returncode == 0 and "verified" in r.stdout
    r = mine(good, bad)
    assert r.returncode == 1
    assert "$.schema_version" in r.stdout and "$.ops.dbl.impl.launches[0].block" in r.stdout


@pytest.mark.parametrize("content, fact", [
    ('{"schema_version": 7,', "not valid JSON"),
    ("[1, 2, 3]", "does not start with a JSON object"),
    ('"manifest"', "does not start with a JSON object"),
    ("", "empty"),
    ('{"a": 1, "a": 2}', "duplicate key"),
])
def test_cli_unreadable_input_is_one_sentence_exit_2(tmp_path, content, fact):
    p = tmp_path / "m.json"
    p.write_text(content)
    r = mine(p)
    assert r.returncode == 2, r.stderr
    assert fact in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("error:") == 1


def test_cli_missing_file_exit_2(tmp_path):
    r = mine(tmp_path / "nope.json")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_cli_rejects_a_1gb_garbage_file_without_reading_it(tmp_path):
    p = tmp_path / "huge.json"
    with p.open("wb") as fh:
        fh.write(b'{"schema_version": 7, ' + b"\x00garbage" * 64)
        fh.truncate(1 << 30)  # sparse: 1 GiB on paper, a few bytes on disk
    r = mine(p)
    assert r.returncode == 2 and "limit" in r.stderr and "Traceback" not in r.stderr
    q = tmp_path / "noise.bin"
    with q.open("wb") as fh:
        fh.write(b"\x7fELF not json")
        fh.truncate(1 << 30)
    r = mine(q)
    assert r.returncode == 2 and "not a manifest" in r.stderr
