"""`mine k3 memory` / `mine k3 binds` on generated manifests and a synthetic headers-only checkpoint;
kern-llm's verifier on all nine manifests for both expert counts; the CLI end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from generators.k3 import config, decode, layout
from generators.k3.binds import check_binds, read_checkpoint
from generators.k3.memory import rank_memory
from manifests.kernels import load_kernels
from generators.k3.generate import write_decode, write_prefill
from k3_checkpoint import k3_tensors, write_checkpoint
from paths import ROOT

CFG = config.load()
TABLE = load_kernels(ROOT / "kernels.toml")


@pytest.fixture(scope="module")
def out224(tmp_path_factory):
    out = tmp_path_factory.mktemp("k3-224")
    write_prefill(CFG, TABLE, out, 8, 224, 8192, 16, 262144)
    write_decode(CFG, TABLE, out, 224, 8, 262144)
    return out


@pytest.fixture(scope="module")
def ckpt224(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "kimi-k3-pruned-75pct", k3_tensors(224))


def load(p):
    return json.loads(p.read_text())


def test_memory_decode_896():
    m = decode.generate(CFG, TABLE, 896)
    r = rank_memory(m, hbm_gib=274.2, reserve_gib=8)
    experts = 92 * 112 * layout.expert_bytes(CFG)
    assert r["by_kind"]["source"] >= experts and r["by_kind"]["carry"] >= experts
    wkda = 69 * (4 * 1536 + 256) * 7168 * 2  # the fused per-member KDA projection, packed by derive
    assert 0 < r["by_kind"]["carry"] - experts - wkda < 2**28  # the rest are small folds
    assert r["seq_slots"] == 66
    assert r["state_bytes_per_seq"] == 69 * 814_080
    assert r["state_bytes_per_token"] == 24 * 1152
    assert r["kv_tokens_per_group"] == 8 * r["kv_tokens_per_rank"] > 0
    held = r["by_kind"]["weight"] + r["by_kind"]["carry"] + r["by_kind"]["workspace"] + 66 * 69 * 814_080
    assert r["kv_tokens_per_rank"] == (r["hbm"] - r["reserve"] - held) // (24 * 1152)


def test_memory_stage_state_slots(out224):
    r = rank_memory(load(out224 / "p" / "stage1.json"))
    assert r["seq_slots"] == 16 + 2
    assert r["state_bytes_per_seq"] == 9 * 6_512_640 and r["state_bytes_per_token"] == 3 * 1152
    assert r["position_group"] == 1


def test_binds_clean(out224, ckpt224):
    tensors = read_checkpoint(ckpt224)
    for name in ("p/stage0.json", "p/stage7.json", "d.json"):
        r = check_binds(load(out224 / name), tensors)
        assert r["problems"] == [], (name, r["problems"][:3])
        assert r["segments_checked"] > 0
    d = check_binds(load(out224 / "d.json"), tensors)
    # 28 experts per rank of 224, each 17,547,264 bytes, over 92 MoE layers: the raw sources
    assert d["bytes_rank0"]["source"] >= 92 * 28 * layout.expert_bytes(CFG)


def test_binds_mismatches(out224, tmp_path):
    t = k3_tensors(224)
    t["language_model.model.layers.13.self_attn.q_proj.weight"] = ("F32", [12288, 7168])
    del t["language_model.model.layers.14.block_sparse_moe.experts.9.w1.weight_packed"]
    t["language_model.model.layers.15.self_attn.o_proj.weight"] = ("BF16", [7168, 6000])
    r = check_binds(load(out224 / "p" / "stage1.json"), read_checkpoint(write_checkpoint(tmp_path / "bad", t)))
    text = "\n".join(r["problems"])
    assert "layers.13.self_attn.q_proj.weight` is f32" in text
    assert "layers.14.block_sparse_moe.experts.9.w1.weight_packed` is not in the checkpoint" in text
    assert "l15.o_proj" in text and len(r["problems"]) == 3


def _kern_accepts(path) -> str:
    r = subprocess.run([sys.executable, "-m", "manifests.kern_oracle", str(path)], capture_output=True, text=True,
                       cwd=ROOT)
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("experts", [224, 896])
def test_kern_llm_accepts_all_nine(experts, tmp_path):
    pytest.importorskip("kern")
    paths = write_prefill(CFG, TABLE, tmp_path, 8, experts, 8192, 16, 262144)
    paths.append(write_decode(CFG, TABLE, tmp_path, experts, 8, 262144))
    for p in paths:
        out = _kern_accepts(p)
        # verified: a one-GPU stage goes on to look for libcuda, the tp8 decode asks for its rank
        assert out.startswith("ACCEPTED") and ("cuda" in out or "topology" in out), (p.name, out[:500])


def _mine(*args):
    return subprocess.run([sys.executable, "-m", "mine.cli", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli(out224, ckpt224, tmp_path):
    r = _mine("k3", "memory", str(out224 / "d.json"), "--hbm", "139")
    assert r.returncode == 0 and "per group of 8" in r.stdout
    r = _mine("k3", "binds", str(out224 / "d.json"), str(ckpt224))
    assert r.returncode == 0 and "0 mismatches" in r.stdout
    r = _mine("verify", str(out224 / "d.json"), str(out224 / "p" / "stage3.json"))
    assert r.returncode == 0, r.stdout
    for bad in (["gen", "k3", "--experts", "100", "--out", str(tmp_path)],
                ["gen", "k3", "--decode", "--out", str(tmp_path)],
                ["k3", "memory", str(tmp_path / "missing.json")],
                ["k3", "binds", str(out224 / "d.json"), str(tmp_path / "nockpt")]):
        r = _mine(*bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr, bad
