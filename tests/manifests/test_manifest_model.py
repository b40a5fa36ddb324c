"""The schema_version 7 model: exact round trip, strict parsing, constants, deterministic bytes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from manifests import jsonload
from manifests.model import Manifest, ModelError, dumps, load
from paths import CORPUS

BASES = sorted(CORPUS.glob("*.json"))


def _minimal() -> dict:
    return json.loads((CORPUS / "minimal.json").read_text())


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.stem)
def test_round_trip_is_exact(path):
    obj = json.loads(path.read_text())
    m = Manifest.from_json(obj)
    expected = {k: v for k, v in obj.items() if k != "constants"}
    if "constants" in obj:  # constants are substituted, never written back
        assert "constants" not in m.to_json()
        assert m.to_json() != expected
    else:
        assert m.to_json() == expected
    again = Manifest.from_json(json.loads(dumps(m)))
    assert dumps(again) == dumps(m)


def test_to_json_orders_keys_like_kern_and_dumps_is_the_canonical_form():
    """`to_json` keeps kern's field order and sorts name maps; `dumps` writes the one canonical
    form the generators commit (vocab.dumps: every key sorted, compact), whatever the input order."""
    obj = _minimal()
    shuffled = dict(reversed(list(obj.items())))
    shuffled["buffers"] = dict(reversed(list(obj["buffers"].items())))
    m = Manifest.from_json(shuffled)
    assert list(m.to_json()) == ["schema_version", "model", "vars", "buffers", "modules",
                                 "ops", "programs"]
    assert list(m.to_json()["buffers"]) == ["x", "y"]
    text = dumps(m)
    assert text == dumps(Manifest.from_json(obj))
    assert text == json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"


def test_load_reads_a_file(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(_minimal()))
    assert load(p).ops["dbl"].params[2] == "i32"


@pytest.mark.parametrize("edit, fact", [
    (lambda m: m.update(surprise=1), "unknown field `surprise`"),
    (lambda m: m["buffers"]["x"].update(dtype="f64"), "unknown dtype `f64`"),
    (lambda m: m["buffers"]["x"].update(kind="Input"), "unknown kind"),
    (lambda m: m["vars"]["n"].update(max=-1), "outside the u64 range"),
    (lambda m: m["vars"]["n"].update(max=2**64), "outside the u64 range"),
    (lambda m: m["vars"]["n"].update(max=1024.0), "expected u64"),
    (lambda m: m["vars"]["n"].update(max=True), "expected u64"),
    (lambda m: m["ops"]["dbl"]["impl"]["launches"][0].update(block=[2**32, 1, 1]), "neither"),
    (lambda m: m["ops"]["dbl"].update(params=["in buffer<f32>", "out buffer<f32>", "bytes<0>"]),
     "invalid param type"),
    (lambda m: m.pop("modules"), "missing field `modules`"),
    (lambda m: m.update(constants={"n": 3}), "conflicts with a var"),
    (lambda m: m.update(constants={"K": "x"}), "numeric literal"),
])
def test_strict_parse_rejects(edit, fact):
    m = _minimal()
    edit(m)
    with pytest.raises(ModelError) as exc:
        Manifest.from_json(m)
    assert fact in str(exc.value)


def test_constants_are_substituted_in_numeric_positions():
    m = _minimal()
    m["constants"] = {"THREADS": 128, "CAP": 64}
    m["ops"]["dbl"]["impl"]["launches"][0]["block"] = ["THREADS", 1, 1]
    m["buffers"]["x"]["shape"] = ["n", "CAP"]
    parsed = Manifest.from_json(copy.deepcopy(m))
    assert parsed.ops["dbl"].impl.launches[0].block == [128, 1, 1]
    assert parsed.buffers["x"].shape == ["n", 64]
    m["ops"]["dbl"]["impl"]["launches"][0]["block"] = ["NOPE", 1, 1]
    with pytest.raises(ModelError):
        Manifest.from_json(m)


def test_duplicate_keys_are_rejected_at_any_depth():
    text = json.dumps(_minimal()).replace('"max": 1024', '"max": 1024, "max": 2')
    with pytest.raises(jsonload.ManifestReadError, match="duplicate key `max`"):
        jsonload.loads(text)
