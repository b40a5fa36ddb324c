"""Cut a small layered manifest (prefill + decode batch programs, one KV state per layer, a once
program) into pipeline stages; kern-llm is the oracle that every stage verifies."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys

import pytest

from manifests.cut import CutRefused, cut, cut_id, resolve_labels

from paths import FIXTURES
from kern_verdicts import kern_violations

CUBINS = FIXTURES / "cubins"
LAYERS = 4
N = {"expr": {"mul": ["tokens", 64]}}


def _launch(entry, **extra):
    return {"module": "dbl", "entry": entry, "block": [256, 1, 1],
            "grid": [{"ceil_div": [{"mul": ["tokens", 64]}, 256]}, 1, 1], **extra}


def layered(layers: int = LAYERS) -> dict:
    sha = hashlib.sha256((CUBINS / "dbl.cubin").read_bytes()).hexdigest()
    buffers = {
        "x": {"dtype": "f32", "shape": ["tokens", 64], "kind": "input"},
        "h": {"dtype": "f32", "shape": ["tokens", 64], "kind": "workspace"},
        "t": {"dtype": "f32", "shape": ["tokens", 64], "kind": "workspace"},
        "y": {"dtype": "f32", "shape": ["tokens", 64], "kind": "output"},
        "slots": {"dtype": "i32", "shape": ["tokens"], "kind": "input", "domain": {"index_into": "kv.0"}},
    }
    calls = [{"label": "embed", "op": "dbl", "args": [{"buf": "x"}, {"buf": "h"}, N]}]
    for i in range(layers):
        buffers[f"w.{i}"] = {"dtype": "f32", "shape": [64], "kind": "weight", "bind": [{"tensor": f"layers.{i}.w"}]}
        calls.append({"label": f"l{i}.attn", "op": "attn",
                      "args": [{"buf": "h"}, {"buf": "t"}, {"state": f"kv.{i}"}, {"buf": "slots"}, N]})
        calls.append({"label": f"l{i}.add", "op": "add",
                      "args": [{"buf": "t"}, {"buf": f"w.{i}"}, {"buf": "h"}, N]})
    calls.append({"label": "head", "op": "dbl", "args": [{"buf": "h"}, {"buf": "y"}, N]})
    clear = [{"op": "clear", "args": [{"state": f"kv.{i}"}, {"i32": 0}]} for i in range(layers)]
    return {
        "schema_version": 7, "model": "toy-layers",
        "vars": {"tokens": {"max": 256, "axis": "rows"}},
        "states": {f"kv.{i}": {"bytes_per_token": 256} for i in range(layers)},
        "buffers": buffers,
        "modules": {"dbl": {"source": "dbl.cubin", "sha256": sha}},
        "ops": {
            "dbl": {"params": ["in buffer<f32>", "out buffer<f32>", "i32"], "impl": {"launches": [_launch("dbl")]}},
            "add": {"params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"],
                    "impl": {"launches": [_launch("add")]}},
            "attn": {"params": ["in buffer<f32>", "out buffer<f32>", "inout state", "in buffer<i32>", "i32"],
                     "impl": {"launches": [_launch("dbl", params=["in buffer<f32>", "out buffer<f32>", "i32"],
                                                   args=[{"param": 0}, {"param": 1}, {"param": 4}])]}},
            "clear": {"params": ["inout state", "i32"],
                      "impl": {"launches": [_launch("dbl", params=["inout state", "inout state", "i32"],
                                                    args=[{"param": 0}, {"param": 0}, {"param": 1}])]}},
        },
        "programs": {
            "prefill": {"batch": {"groups": 1, "rows": "tokens"}, "calls": calls},
            "decode": {"batch": {"groups": 8, "rows": 1}, "graph": True, "calls": copy.deepcopy(calls)},
            "setup": {"once": True, "calls": clear},
        },
    }


def test_base_manifest_is_accepted_by_kern(tmp_path):
    assert kern_violations(layered(), CUBINS, tmp_path) == []


def test_three_stages_verify_and_hand_over_the_hidden_state(tmp_path):
    m = layered()
    at = resolve_labels(m, ["l1.attn", "7"])
    assert at == [3, 7]
    stages = cut(m, at)
    assert len(stages) == 3
    for s, st in enumerate(stages):
        assert kern_violations(st, CUBINS, tmp_path) == [], f"stage {s}"
        assert st["cut"] == {"id": cut_id(m, at), "stage": s, "stages": 3}
    kinds = [(st["buffers"]["h"]["kind"], st["buffers"]["h"].get("export", False)) for st in stages]
    assert kinds == [("output", False), ("inout", True), ("inout", True)]
    # t is fully rewritten by each stage before it is read: it never crosses
    assert all(st["buffers"]["t"]["kind"] == "workspace" for st in stages)
    assert [sorted(st["states"]) for st in stages] == [["kv.0"], ["kv.1", "kv.2"], ["kv.3"]]
    # the once program keeps only the clears of the stage's own states
    assert [[c["args"][0]["state"] for c in st["programs"]["setup"]["calls"]] for st in stages] == [
        ["kv.0"], ["kv.1", "kv.2"], ["kv.3"]]
    # the page-table domain pointed at kv.0; later stages point it at a kept paged state
    assert [st["buffers"]["slots"]["domain"]["index_into"] for st in stages] == ["kv.0", "kv.1", "kv.3"]
    assert "y" not in stages[0]["buffers"] and stages[2]["buffers"]["y"]["kind"] == "output"
    assert [len(st["programs"]["decode"]["calls"]) for st in stages] == [3, 4, 3]
    assert stages[1]["programs"]["decode"]["graph"] is True
    assert sorted(stages[0]["ops"]) == ["add", "attn", "clear", "dbl"]
    assert sorted(stages[1]["ops"]) == ["add", "attn", "clear"]


def test_an_input_only_read_arrives_as_input(tmp_path):
    m = layered()
    # make the last layer not write h: it writes y directly, head reads t
    calls = m["programs"]["prefill"]["calls"]
    calls[-2]["args"][2] = {"buf": "y"}
    calls[-1] = {"label": "head", "op": "dbl", "args": [{"buf": "h"}, {"buf": "t"}, N]}
    m["programs"]["decode"]["calls"] = copy.deepcopy(calls)
    assert kern_violations(m, CUBINS, tmp_path) == []
    stages = cut(m, [7])
    assert stages[1]["buffers"]["h"]["kind"] == "input" and stages[1]["buffers"]["h"]["export"] is True
    assert kern_violations(stages[1], CUBINS, tmp_path) == []


def test_cut_id_is_fnv1a64_of_pretty_json_and_indices():
    m = layered()
    h = 0xCBF29CE484222325
    for b in json.dumps(m, indent=2).encode() + (3).to_bytes(8, "little"):
        h = ((h ^ b) * 0x100000001B3) % 2**64
    assert cut_id(m, [3]) == f"{h:016x}"
    assert cut_id(m, [3]) != cut_id(m, [5])


def _both(m, f):
    for p in ("prefill", "decode"):
        f(m["programs"][p]["calls"])


def _refused(m, at) -> list[str]:
    with pytest.raises(CutRefused) as exc:
        cut(m, at)
    return exc.value.reasons


def test_output_written_before_the_last_stage():
    m = layered()
    m["buffers"]["t"]["kind"] = "output"
    reasons = _refused(m, [3])
    assert reasons == ["program `decode` stage 0 writes output buffer `t`; only the last stage may",
                       "program `prefill` stage 0 writes output buffer `t`; only the last stage may"]


def test_non_workspace_crossing_reports_every_reason():
    m = layered()
    m["buffers"]["h"]["kind"] = "carry"
    reasons = _refused(m, [3, 7])
    assert "carry buffer `h` crosses the cut at call 3 of program `decode`; only workspaces cross" in reasons
    assert "carry buffer `h` crosses the cut at call 7 of program `decode`; only workspaces cross" in reasons
    assert "program `prefill` stage 1 writes carry buffer `h`; only the last stage may" in reasons
    assert len(reasons) == 6


def test_passes_through_untouched():
    m = layered()
    m["buffers"]["s"] = {"dtype": "f32", "shape": ["tokens", 64], "kind": "workspace"}

    def edit(calls):
        calls.insert(1, {"label": "skip", "op": "dbl", "args": [{"buf": "x"}, {"buf": "s"}, N]})
        calls[-1] = {"label": "head", "op": "add", "args": [{"buf": "h"}, {"buf": "s"}, {"buf": "y"}, N]}

    _both(m, edit)
    reasons = _refused(m, [4, 8])
    assert reasons == [
        f"buffer `s` crossing the cut at call {a} passes through stage 1 of program `{p}` untouched"
        for p in ("decode", "prefill") for a in (4, 8)]


def test_a_state_region_belongs_to_one_stage():
    m = layered()
    _both(m, lambda calls: calls[3]["args"].__setitem__(2, {"state": "kv.0"}))
    assert _refused(m, [3]) == ["state `kv.0` at offset 0 is touched by stages 0 and 1"]


@pytest.mark.parametrize("at, reason", [
    ([0], "the first cut index is 0; a stage needs at least one call"),
    ([5, 3], "cut indices [5, 3] are not strictly increasing"),
    ([10], "program `decode` has 10 calls, not more than the last cut index 10"),
])
def test_preconditions(at, reason):
    assert reason in _refused(layered(), at)


def test_unknown_label_is_a_lookup_error():
    with pytest.raises(LookupError, match="no call labelled `l9.attn`"):
        resolve_labels(layered(), ["l9.attn"])


def _mine(*args, cwd):
    return subprocess.run([sys.executable, "-m", "mine.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_writes_stages_by_label_and_refuses_in_one_sentence(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(layered()))
    res = _mine("cut", "m.json", "--at", "l1.attn", "--at", "7", "--out", "stages", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    stages = [json.loads((tmp_path / "stages" / f"stage{s}.json").read_text()) for s in range(3)]
    assert stages == cut(layered(), [3, 7])
    bad = layered()
    bad["buffers"]["h"]["kind"] = "carry"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    res = _mine("cut", "bad.json", "--at", "3", "--out", "x", cwd=tmp_path)
    assert res.returncode == 2 and "manifest cannot be cut" in res.stderr and "Traceback" not in res.stderr
    res = _mine("cut", "m.json", "--at", "nolabel", "--out", "x", cwd=tmp_path)
    assert res.returncode == 2 and "no call labelled `nolabel`" in res.stderr


def test_an_unverified_manifest_is_refused_not_crashed():
    m = layered()
    m["programs"]["decode"]["calls"][1]["op"] = "missing_op"
    reasons = _refused(m, [3])
    assert reasons and all(r.startswith("the manifest does not verify:") for r in reasons)
