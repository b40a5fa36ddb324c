"""The analysis recovers every fact the simulator planted (tests/helpers/dumpsim.py)."""

from __future__ import annotations

import json

import pytest

from dumpsim import INPUTS, KV, LAYER_STRIDE, KV_HALF, SimConfig, simulate
from mining.analyze import analyze, to_json
from mining.load import load_dump
from vocab.analysis import ANALYSIS_SCHEMA_VERSION


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    main, truth = simulate(root)
    return analyze(load_dump(root)), truth


def fit_of(a, symbol_part: str, occ: int, field: str):
    f = a.fits
    row = f[f["symbol"].str.contains(symbol_part) & (f["occ"] == occ) & (f["field"] == field)]
    assert len(row) == 1, (symbol_part, occ, field)
    return row.iloc[0]


def test_passes_match_truth(sim):
    a, truth = sim
    fw = a.forwards
    assert fw["tokens"].tolist() == truth.forwards
    assert fw["n_launches"].tolist() == truth.launches_per_forward
    per_window = fw.groupby("window").size().tolist()
    assert per_window == truth.windows


def test_reference_is_the_invertible_kernel(sim):
    a, _ = sim
    assert "embed" in a.reference.symbol and a.reference.axis == "grid_x"
    losers = [c for c in a.reference.candidates if "prep_positions" in c["symbol"]]
    assert losers and losers[0]["failures"] > a.reference.candidates[0]["failures"]


def test_layer_structure(sim):
    a, truth = sim
    main = max(a.layers, key=lambda b: b["forwards"])
    assert main["layers"] == truth.layers
    assert main["sites_per_layer"] == truth.sites_per_layer_decode
    st = a.strides
    weights = st[st["role"] == "weight"]["stride"].tolist()
    assert weights and set(weights) == {LAYER_STRIDE}
    assert set(st[st["role"] == "kv_pool"]["stride"]) == {truth.kv_layer_stride}


@pytest.mark.parametrize("sym,occ,field,expr", [
    ("embed", 0, "grid_x", "tokens"),
    ("rms_norm", 3, "grid_x", "tokens"),
    ("rms_norm", 0, "param4", "tokens"),
    ("rms_norm", 0, "param5", "1024"),
    ("gemm_bf16", 0, "grid_x", "ceil_div(tokens, 128)"),
    ("gemm_bf16", 2, "grid_y", "48"),
    ("qk_norm", 0, "grid_x", "mul(tokens, 16)"),
    ("qk_norm", 1, "grid_x", "mul(tokens, 8)"),
    ("rope", 2, "param3", "add(tokens, 64)"),
    ("silu_and_mul", 1, "param3", "mul(tokens, 3072)"),
    ("attn_2d", 0, "grid_x", "ceil_div(tokens, 16)"),
    ("prep_positions", 0, "grid_x", "ceil_div(tokens, 256)"),
    ("reshape_and_cache", 0, "param6", "piecewise(tokens==1: 512; tokens>1: 3072)"),
])
def test_planted_expressions(sim, sym, occ, field, expr):
    a, _ = sim
    row = fit_of(a, sym, occ, field)
    assert row["expr"] == expr
    assert row["holdout"] == "ok"
    assert row["points"] >= 6


def test_decode_only_kernels_are_underdetermined(sim):
    a, _ = sim
    row = fit_of(a, "attn_3d", 0, "grid_y")
    assert row["status"] == "underdetermined"
    assert "16" in row["alternatives"] and "mul(tokens, 16)" in row["alternatives"]


def test_f32_constant_is_shown(sim):
    a, _ = sim
    assert fit_of(a, "attn_2d", 0, "param4")["as_f32"] == pytest.approx(0.125)


def test_pointer_roles(sim):
    a, _ = sim
    p = a.pointers

    def role(sym, occ, i, at=0):
        r = p[(p["symbol"].str.contains(sym)) & (p["site"].str.endswith(f"#{occ}"))
              & (p["i"] == i) & (p["at"] == at)]
        assert len(r) == 1, (sym, occ, i, at)
        return r.iloc[0]

    assert role("gemm_bf16", 5, 1)["role"] == "weight"
    assert role("rms_norm", 2, 2)["role"] == "weight"
    k, v = role("reshape_and_cache", 1, 2), role("reshape_and_cache", 1, 3)
    assert k["role"] == v["role"] == "kv_pool"
    assert k["buffer_id"] == v["buffer_id"] == KV[2] and v["offset"] - k["offset"] == KV_HALF
    assert role("attn_3d", 1, 1)["role"] == "kv_pool"
    assert role("embed", 0, 1)["role"] == "input"
    assert role("rope", 0, 0, at=8)["role"] == "input"          # a pointer inside a struct param
    assert role("reshape_and_cache", 2, 4)["role"] == "input"
    assert role("argmax_sample", 0, 1)["role"] == "input"
    assert role("embed", 0, 2)["role"] == "persistent"          # large table outside the layers
    assert role("rope", 1, 1)["role"] == "persistent"           # shared by every layer
    assert role("rms_norm", 8, 2)["role"] == "persistent"       # final norm weight
    assert role("silu_and_mul", 0, 0)["role"] == "workspace"
    assert role("argmax_sample", 0, 2)["role"] == "maybe_pointer"
    b = a.buffers
    kv = b[b["buffer_id"] == KV[2]]
    assert kv["offsets_in_alloc"].iloc[0] == 2 * 4              # K and V per layer in one range
    assert set(b[b["buffer_id"] == INPUTS[2]]["role"]) == {"input"}


def test_no_layout_kernels_listed(sim):
    a, _ = sim
    assert a.no_layout["symbol"].str.contains("nvjet").any()


def test_json_is_complete(sim):
    a, truth = sim
    doc = json.loads(json.dumps(to_json(a)))
    assert doc["schema_version"] == ANALYSIS_SCHEMA_VERSION
    assert doc["layers"]["layers"] == truth.layers
    assert [f["tokens"] for f in doc["passes"]["forwards"]] == truth.forwards
    roles = {p["role"] for p in doc["pointers"]}
    assert {"weight", "kv_pool", "input", "workspace", "persistent", "maybe_pointer"} <= roles
    assert any(f["status"] == "piecewise" for f in doc["fits"])


def test_one_forward_dump_is_honest(tmp_path):
    cfg = SimConfig(prompts=(), warmups=(), extra_pid=False)
    simulate(tmp_path, cfg)
    a = analyze(load_dump(tmp_path))
    assert len(a.forwards) == 1
    assert any("only 1 forward" in n or "no tokens reference" in n for n in a.notes)
