"""mine gen qwen3 on a hand-made vLLM capture (tests/helpers/qwen3_sim.py); the real fixture when present.

Asserts: the manifest passes mine's verifier and kern-llm's; two runs give identical bytes; a
wiring fact broken in the capture stops generation with a sentence naming the call site; the
bindings file holds vLLM's rotary cache; with the real capture, the ABI check passes on its cubins.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from generators.qwen3 import bindings, build, config, mined
from generators.qwen3.generate import build_manifest
from manifests.verify import verify
from paths import ROOT
from qwen3_sim import simulate

CONFIG = ROOT / "examples/vllm_qwen3/reference/config.json"
REAL = ROOT / "tests/fixtures/vllm/vllm-offline.tar.xz"


def _gen(capsys, *args) -> tuple[int, str]:
    """`mine gen qwen3 ARGS` run in this process, through the entry point the installed `mine`
    calls (the end-to-end run in a child process: test_real_capture_verifies_and_fits_its_cubins):
    its exit code and stderr."""
    from mine.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["gen", "qwen3", *map(str, args)])
    return exc.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def cfg():
    return config.load(CONFIG)


@pytest.fixture(scope="module")
def sim(tmp_path_factory, cfg):
    d = tmp_path_factory.mktemp("q3dump")
    simulate(d, cfg)
    return d


def test_manifest_verifies_and_is_stable(sim, tmp_path):
    _, mm, _, m = build_manifest(sim, CONFIG, ROOT / "kernels.toml", 2048)
    assert verify(m) == []
    assert [p for _, p, _ in mm.forwards].count("p") == 3 and mm.skipped == 1
    assert (mm.block_size, mm.table_width, mm.segments) == (16, 256, 16)
    prefill, decode = m["programs"]["prefill"], m["programs"]["decode"]
    assert decode["graph"] is True and "graph" not in prefill
    assert decode["calls"][-1]["op"] == "d.argmax" and prefill["calls"][-1]["label"] == "l27.cache"
    assert sorted(m["states"]) == sorted(f"kv.{i}" for i in range(28))
    _, _, _, again = build_manifest(sim, CONFIG, ROOT / "kernels.toml", 2048)
    assert build.dumps(m) == build.dumps(again)


def test_kern_llm_accepts(sim, tmp_path):
    pytest.importorskip("kern")
    _, _, _, m = build_manifest(sim, CONFIG, ROOT / "kernels.toml", 2048)
    path = tmp_path / "qwen3.json"
    path.write_text(build.dumps(m))
    r = subprocess.run([sys.executable, "-m", "manifests.kern_oracle", str(path), str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout


def test_scalars_follow_tokens(sim, cfg):
    from mining.analyze import analyze, document
    from mining.load import load_dump
    d = load_dump(sim, cache=False)
    mm = mined.mine(d, cfg, document(analyze(d)))
    q = mm.instances[("p", "q_norm")][0]
    assert q.scalars[10] == ("affine", "i32", cfg.heads, 0)
    assert mm.instances[("d", "q_norm")][0].scalars[10] == ("const", "i32", cfg.heads)
    assert mm.instances[("p", "in_norm")][0].scalars[9][2] == np.float32(1e-6)


@pytest.mark.parametrize("layer,role,index,delta,needle", [
    (3, "k_norm", 1, 2, "layer 3 k_norm"),           # k view not at q + 4096 B of the fused qkv
    (5, "cache", 1, -2, "layer 5 cache"),            # cached value not at the v view
    (7, "post_norm", 2, 4096, "layer 7 post_norm"),  # a second residual address
    (9, "attn", 2, 64, "layer 9 attn"),              # attention reads another key cache than the write
])
def test_planted_mismatch_names_the_call_site(tmp_path, capsys, cfg, layer, role, index, delta, needle):
    def plant(l, r, params):
        if l == layer and r == role:
            kind, alloc, off = params[index]
            params[index] = (kind, alloc, off + delta)
    simulate(tmp_path, cfg, plant=plant)
    code, err = _gen(capsys, "--dump", tmp_path, "--config", CONFIG, "--out", tmp_path / "out")
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "out" / "qwen3.json").exists()


def test_bad_config_is_one_sentence(tmp_path, capsys, sim):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama"}))
    code, err = _gen(capsys, "--dump", sim, "--config", bad, "--out", tmp_path / "o")
    assert code == 2 and "model_type" in err and "Traceback" not in err


def test_bindings_rope_cache(tmp_path, cfg):
    path = bindings.write(tmp_path / "b.safetensors", cfg, 64)
    head = bindings.read_header(path)
    assert head["mine.rope.cos_sin"]["shape"] == [64, cfg.head_dim]
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    a, b = head["mine.rope.cos_sin"]["data_offsets"]
    bits = np.frombuffer(raw[8 + n + a:8 + n + b], np.uint16).reshape(64, cfg.head_dim)
    vals = (bits.astype(np.uint32) << 16).view(np.float32)
    p, i = 37, 5
    ang = p * cfg.theta ** (-2 * i / cfg.head_dim)
    assert abs(vals[p, i] - np.cos(ang)) < 1e-2 and abs(vals[p, cfg.head_dim // 2 + i] - np.sin(ang)) < 1e-2
    assert vals[0, 0] == 1.0 and vals[0, cfg.head_dim // 2] == 0.0


def test_real_capture_verifies_and_fits_its_cubins(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mine.cli", "gen", "qwen3", "--dump", str(REAL), "--config", str(CONFIG),
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    from manifests.abi import check_abi
    m = json.loads((tmp_path / "qwen3.json").read_text())
    assert verify(m) == []
    assert check_abi(m, tmp_path / "kernels") == []  # every launch fits the cubin vLLM really ran
    # the committed manifest is exactly what the generator makes of the committed capture
    assert (tmp_path / "qwen3.json").read_bytes() == (ROOT / "manifests/qwen3/qwen3.json").read_bytes()


def test_binary_capture_gives_the_same_manifest(tmp_path, capsys, offline_bin_analysis_json):
    """The same workload captured again in the binary form (launches.bin): the generated manifest
    is the committed one, except the capture's pid in its `model` label."""
    bin_dump = ROOT / "tests/fixtures/vllm/vllm-offline-bin.tar.xz"
    code, err = _gen(capsys, "--dump", bin_dump, "--config", CONFIG, "--analysis", offline_bin_analysis_json,
                     "--out", tmp_path)
    assert code == 0, err
    got = json.loads((tmp_path / "qwen3.json").read_text())
    want = json.loads((ROOT / "manifests/qwen3/qwen3.json").read_text())
    assert got.pop("model").replace("pid2047", "PID") == want.pop("model").replace("pid600", "PID")
    assert got == want


def _headers_only_checkpoint(folder: Path, cfg, drop: str | None = None) -> Path:
    """A safetensors file with the Qwen3 tensor names and shapes in its header and no weights."""
    H, D, I = cfg.hidden, cfg.head_dim, cfg.inter
    shapes = {"model.embed_tokens.weight": [cfg.vocab, H], "model.norm.weight": [H]}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                       p + "self_attn.q_proj.weight": [cfg.q_size, H], p + "self_attn.k_proj.weight": [cfg.kv_size, H],
                       p + "self_attn.v_proj.weight": [cfg.kv_size, H], p + "self_attn.o_proj.weight": [H, cfg.q_size],
                       p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                       p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                       p + "mlp.down_proj.weight": [H, I]})
    shapes.pop(drop, None)
    header, off = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return folder


def test_weights_fit_the_checkpoint_or_one_sentence(tmp_path, capsys, cfg, offline_analysis_json):
    good = _headers_only_checkpoint(tmp_path / "good", cfg)
    run = lambda ckpt, out: _gen(capsys, "--dump", REAL, "--config", CONFIG,  # noqa: E731
                                 "--analysis", offline_analysis_json, "--weights", ckpt, "--out", out)
    code, err = run(good, tmp_path / "a")
    assert code == 0, err
    bad = _headers_only_checkpoint(tmp_path / "bad", cfg, drop="model.layers.7.mlp.up_proj.weight")
    code, err = run(bad, tmp_path / "b")
    assert code == 2 and "Traceback" not in err
    assert "l7.gate_up" in err and "checkpoint does not fit" in err
    assert not (tmp_path / "b" / "qwen3.json").exists()


def test_config_of_another_model_is_blamed_on_the_config(tmp_path, capsys, offline_analysis_json):
    cfg = json.loads(CONFIG.read_text())
    cfg["hidden_size"] *= 2
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(cfg))
    code, err = _gen(capsys, "--dump", REAL, "--config", bad, "--analysis", offline_analysis_json,
                     "--out", tmp_path / "o")
    assert code == 2 and "Traceback" not in err
    assert f"the config's hidden_size is {cfg['hidden_size']}" in err and "another model" in err
