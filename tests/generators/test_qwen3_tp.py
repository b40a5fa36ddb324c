"""The TP Qwen3 manifest (generators/qwen3/tp.py) from simulated tensor-parallel vLLM captures
(tests/helpers/sim_ranks.py) at several tp sizes, layer counts and geometries.

Asserts: the manifest passes mine's verifier and kern-llm's CPU verification as every rank of its
topology; every rank's weight binds fit the full checkpoint's tensors and add up to the buffers
(column-parallel rows, row-parallel columns, replicated KV heads when fewer than tp), and the
ranks' rows of a column-parallel tensor tile it exactly; an NCCL all-reduce follows every
row-parallel GEMM, which writes a partial sum; two runs give the same bytes. Refused, with one
sentence: a one-process dump, ranks that part, collectives not where TP puts them, a tp that does
not divide the model; and both verifiers reject the manifest without its topology or with a
ranked bind of the wrong length.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest

import sim_ranks as SR
from generators.k3.binds import check_binds
from generators.qwen3 import build
from generators.qwen3.mined import WiringMismatch
from generators.qwen3.tp import ALLREDUCE, build_tp_manifest, shard_config
from manifests.verify import verify
from paths import ROOT
from qwen3_sim import simulate
from vocab.errors import ConfigError, UsageError

CONFIG = ROOT / "examples/vllm_qwen3/reference/config.json"
KEYS = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
        "head_dim": "head_dim", "inter": "intermediate_size"}


def _config(tmp_path, layers: int, **over):
    raw = json.loads(CONFIG.read_text())
    raw["num_hidden_layers"] = layers
    raw.update({KEYS[k]: v for k, v in over.items()})
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path, SR.model_config(layers, **over)


def _build(tmp_path, layers=2, over=None, **sim):
    path, cfg = _config(tmp_path, layers, **(over or {}))
    SR.simulate_tp(tmp_path / "dump", cfg, SR.TPSim(layers=layers, **sim))
    return build_tp_manifest(tmp_path / "dump", path, cache=False), cfg


def _checkpoint(cfg, m: dict) -> dict:
    """The full model's tensors as a safetensors header lists them: name -> (dtype, shape) (the
    bindings file's rope table as the manifest sizes it)."""
    H, D = cfg.hidden, cfg.head_dim
    t = {"model.embed_tokens.weight": ("bf16", [cfg.vocab, H]), "model.norm.weight": ("bf16", [H]),
         "mine.rope.cos_sin": ("bf16", m["buffers"]["cos_sin"]["shape"]), "mine.kv_scale": ("f32", [1])}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": ("bf16", [H]), p + "post_attention_layernorm.weight": ("bf16", [H]),
                  p + "self_attn.q_norm.weight": ("bf16", [D]), p + "self_attn.k_norm.weight": ("bf16", [D]),
                  p + "self_attn.q_proj.weight": ("bf16", [cfg.heads * D, H]),
                  p + "self_attn.k_proj.weight": ("bf16", [cfg.kv_heads * D, H]),
                  p + "self_attn.v_proj.weight": ("bf16", [cfg.kv_heads * D, H]),
                  p + "self_attn.o_proj.weight": ("bf16", [H, cfg.heads * D]),
                  p + "mlp.gate_proj.weight": ("bf16", [cfg.inter, H]), p + "mlp.up_proj.weight": ("bf16", [cfg.inter, H]),
                  p + "mlp.down_proj.weight": ("bf16", [H, cfg.inter])})
    return t


def _kern_verdicts(m: dict, tp: int, tmp_path) -> list[str]:
    """kern-llm's CPU verdict on the manifest as each rank of its topology: "accepted" (it went on
    to load libcuda) or the ValueError's text."""
    kern = pytest.importorskip("kern")
    from manifests.kern_oracle import quiet_stderr

    path = tmp_path / "tp.json"
    path.write_text(build.dumps(m))
    os.environ.setdefault("RUST_BACKTRACE", "0")
    out = []
    for r in range(tp):
        with quiet_stderr():
            try:
                kern.Runtime(str(path), str(tmp_path), [], 0, {"tp": (r, tp)})
                out.append("loaded")
            except ValueError as exc:
                out.append(str(exc))
            except BaseException:  # noqa: BLE001 - accepted, then no GPU (pyo3's PanicException)
                out.append("accepted")
    return out


CASES = [  # tp, layers, collective, model overrides
    (2, 2, "custom", {}),
    (4, 1, "nccl", {}),
    (2, 3, "mixed", {"hidden": 2048, "heads": 32, "kv_heads": 8, "head_dim": 64, "inter": 6144}),
    (4, 2, "custom", {"heads": 8, "kv_heads": 2, "head_dim": 256, "inter": 2048}),   # KV heads replicated
]


@pytest.mark.parametrize("tp,layers,collective,over", CASES)
def test_tp_manifest_verifies_binds_and_all_reduces(tmp_path, tp, layers, collective, over):
    res, cfg = _build(tmp_path, layers, over, tp=tp, collective=collective)
    m = res.manifest
    assert res.tp == tp and m["topology"] == {"groups": {"tp": tp}} and f"qwen3 tp{tp} " in m["model"]
    assert verify(m) == []
    assert _kern_verdicts(m, tp, tmp_path) == ["accepted"] * tp
    # the shard every rank mined, and the weights bound per rank from the full checkpoint
    assert res.shard == shard_config(cfg, tp) and len(res.mined) == tp
    binds = check_binds(m, _checkpoint(cfg, m))
    assert binds["problems"] == [] and binds["segments_checked"] > 0
    qkv = m["buffers"]["l0.qkv"]
    assert qkv["shape"] == [res.shard.qkv_size, cfg.hidden]
    q_rows = qkv["bind"][0]["rows"]["ranges"]
    assert q_rows == [[r * res.shard.q_size, (r + 1) * res.shard.q_size] for r in range(tp)]   # tiles q_proj
    kv_rows = qkv["bind"][1]["rows"]["ranges"]
    if cfg.kv_heads >= tp:
        assert kv_rows[-1][1] == cfg.kv_heads * cfg.head_dim and len({tuple(r) for r in kv_rows}) == tp
    else:
        assert len({tuple(r) for r in kv_rows}) == cfg.kv_heads          # each head kept by tp / kv_heads ranks
    assert m["buffers"]["l0.down"]["bind"][0]["cols"]["ranges"][-1] == [(tp - 1) * res.shard.inter, cfg.inter]
    assert m["buffers"]["embed"]["bind"] == [{"tensor": "model.embed_tokens.weight"}]        # whole on every rank
    # an all-reduce of the partial sum after each row-parallel GEMM, into what it used to write
    assert m["ops"]["allreduce"] == {"params": ALLREDUCE[1], "impl": {"launches": [{"entry": ALLREDUCE[0]}]}}
    for prog, n in (("decode", layers), ("prefill", layers - 1)):
        calls = m["programs"][prog]["calls"]
        ar = [k for k, c in enumerate(calls) if c["op"] == "allreduce"]
        assert len(ar) == 2 * n
        for k in ar:
            gemm, c = calls[k - 1], calls[k]
            assert gemm["op"] == "gemm" and gemm["label"].endswith(("o_proj", "down_proj"))
            assert gemm["args"][2] == {"buf": "partial"} and c["args"][0] == {"buf": "partial"}
            assert c["args"][1] == {"buf": "h"} and c["args"][3] == {"rank": "tp"}
            assert calls[k + 1]["label"].endswith(("post_norm", "in_norm")) or calls[k + 1]["label"] == "final_norm"
    again, _ = _build(tmp_path / "again", layers, over, tp=tp, collective=collective)
    assert build.dumps(again.manifest) == build.dumps(m)


def test_both_verifiers_reject_a_broken_topology(tmp_path):
    res, _ = _build(tmp_path, 1, tp=2)
    no_topo = copy.deepcopy(res.manifest)
    del no_topo["topology"]
    assert verify(no_topo) and all(v != "accepted" for v in _kern_verdicts(no_topo, 1, tmp_path))
    short = copy.deepcopy(res.manifest)
    short["buffers"]["l0.o_proj"]["bind"][0]["cols"]["ranges"].pop()
    assert verify(short)
    verdicts = _kern_verdicts(short, 2, tmp_path)
    assert all("o_proj" in v for v in verdicts), verdicts


def test_refusals_name_what_is_wrong(tmp_path):
    path, cfg = _config(tmp_path, 2)
    simulate(tmp_path / "one", cfg)
    with pytest.raises(UsageError, match="not a multi-rank dump"):
        build_tp_manifest(tmp_path / "one", path, cache=False)

    def skip_one(rank, recs):   # rank 1 skips one all-reduce in its third forward
        if rank == 1:
            embeds = [k for k, r in enumerate(recs) if r["symbol"] == SR.qwen3_sim.SYM["embed"]]
            del recs[next(j for j in range(embeds[2], len(recs)) if recs[j]["symbol"] == SR.CUSTOM_AR)]
            for seq, r in enumerate(recs):
                r["seq"] = seq
    SR.simulate_tp(tmp_path / "parts", cfg, SR.TPSim(layers=2, plant=skip_one))
    with pytest.raises(WiringMismatch, match="rank 1 forward 2 parts from rank 0"):
        build_tp_manifest(tmp_path / "parts", path, cache=False)

    def reduce_early(rank, recs):   # every rank, every layer: the MLP all-reduce before the down GEMM
        for k in [k for k, r in enumerate(recs) if r["symbol"] == SR.qwen3_sim.SYM["down"]]:
            recs[k], recs[k + 1] = recs[k + 1], recs[k]
            recs[k]["t_ns"], recs[k + 1]["t_ns"] = recs[k + 1]["t_ns"], recs[k]["t_ns"]
        for seq, r in enumerate(recs):
            r["seq"] = seq
    SR.simulate_tp(tmp_path / "early", cfg, SR.TPSim(layers=2, plant=reduce_early))
    with pytest.raises(WiringMismatch, match="not between a projection GEMM and a residual add"):
        build_tp_manifest(tmp_path / "early", path, cache=False)

    with pytest.raises(ConfigError, match="not divisible by the 3 ranks"):
        shard_config(cfg, 3)
    with pytest.raises(ConfigError, match="neither divides"):
        shard_config(dataclasses.replace(cfg, kv_heads=3, heads=12), 2)


def test_mine_gen_qwen3_tp_writes_the_manifest_then_checks_the_abi(tmp_path, capsys):
    from mine.cli import main

    path, cfg = _config(tmp_path, 1)
    SR.simulate_tp(tmp_path / "dump", cfg, SR.TPSim(layers=1, tp=2))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["gen", "qwen3", "--tp", "--dump", str(tmp_path / "dump"), "--config", str(path), "-o", str(tmp_path / "out")])
    # everything is written; the ABI check, last, finds the simulator's placeholder cubins unreadable
    # (a real capture's pass it: the single-GPU path, tests/generators/test_qwen3_gen.py)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "the ABI check fails" in err and "is not a readable cubin" in err, err
    m = json.loads((tmp_path / "out" / "qwen3-tp.json").read_text())
    assert m["topology"] == {"groups": {"tp": 2}} and verify(m) == []
    assert (tmp_path / "out" / "qwen3-bindings.safetensors").is_file()
    with pytest.raises(SystemExit) as exc:
        main(["gen", "qwen3", "--tp", "--pid", "7100", "--dump", str(tmp_path / "dump"), "--config", str(path),
              "-o", str(tmp_path / "out2")])
    assert exc.value.code == 2 and "--tp reads every rank" in capsys.readouterr().err


def test_vllms_vocab_parallel_collectives_are_noted_not_generated(tmp_path):
    res, cfg = _build(tmp_path, 2, tp=2, edges=True)
    notes = " ".join(res.notes)
    assert "vocab-parallel embedding's all-reduce" in notes and "all_gather of the logits" in notes
    m = res.manifest
    assert verify(m) == [] and sum(c["op"] == "allreduce" for c in m["programs"]["decode"]["calls"]) == 2 * cfg.layers
