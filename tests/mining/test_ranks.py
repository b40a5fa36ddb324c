"""The cross-rank analysis (mining/ranks.py, docs/ranks.md) on simulated tensor-parallel captures
with known truth (tests/helpers/sim_ranks.py), at several tp sizes, layer counts, geometries and
collective kinds; and what it must leave alone: one-process dumps, which keep their analysis as is.

Asserts: the rank processes are found (the API server's folder left out) and ordered by RANK, by
device, or by pid with a note; every rank's forwards line up; a rank that runs another kernel or
skips one is reported at the forward and call site where it parts; the collectives are the
planted ones, with their op and library, each between the GEMM that made the partial sums and the
residual add that consumes them; the GEMM shards carry N/tp and K/tp on every rank; the custom
all-reduce's rank argument is the rank's own index; its peer Signal* words land in peer memory.
"""

from __future__ import annotations

import json

import pytest

import sim_ranks as SR
from dumpsim import SimConfig, simulate
from mining.ranks import analyze_ranks, document_with_ranks, lines
from vocab.analysis import from_json, site_name

GEMM_SYM = {g: SR.qwen3_sim.SYM[g] for g in SR.GEMMS}
FADD = SR.qwen3_sim.SYM["fadd"]


def _run(tmp_path, cfg=None, **kw):
    truth = SR.simulate_tp(tmp_path, cfg or SR.model_config(2), SR.TPSim(**kw))
    return analyze_ranks(tmp_path, cache=False), truth


def _gemm_site(g: str, layer: int) -> str:
    return site_name(GEMM_SYM[g], layer)   # each projection's GEMM runs once per layer


CASES = [  # tp, layers, collective, model overrides
    (2, 2, "custom", {}),
    (4, 3, "nccl", {}),
    (2, 3, "mixed", {"hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 64, "inter": 6144}),
    (4, 1, "custom", {"heads": 16, "kv_heads": 2, "inter": 2048}),
]


@pytest.mark.parametrize("tp,layers,collective,over", CASES)
def test_ranks_line_up_with_the_planted_truth(tmp_path, tp, layers, collective, over):
    result, truth = _run(tmp_path, SR.model_config(layers, **over), tp=tp, layers=layers, collective=collective)
    doc = result.doc
    assert [r.pid for r in doc.ranks] == truth.pids and truth.extra_pid not in [r.pid for r in doc.ranks]
    assert [r.rank for r in doc.ranks] == list(range(tp)) and {r.rank_from for r in doc.ranks} == {"env:RANK"}
    assert [r.device for r in doc.ranks] == truth.devices
    assert all(r.uuid == f"{0xab00 + r.device:032x}" for r in doc.ranks)
    assert doc.aligned and doc.mismatches == [] and doc.forwards == truth.forwards
    # two all-reduces per layer, each after a row-parallel GEMM, before the residual add
    colls = doc.collectives
    assert len(colls) == truth.collectives_per_layer * layers * (2 if collective == "mixed" else 1)
    assert {c.op for c in colls} == {"all_reduce"}
    libs = {"custom": {"vllm_custom"}, "nccl": {"nccl"}, "mixed": {"vllm_custom", "nccl"}}[collective]
    assert {c.library for c in colls} == libs
    sym_of = dict(zip(result.main.sites.index["site"].astype(str), result.main.sites.index["symbol"].astype(str)))
    assert {sym_of[c.after] for c in colls} == {GEMM_SYM["o"], GEMM_SYM["down"]}
    assert {sym_of[c.before] for c in colls} == {FADD}
    assert all(c.ranks == tp for c in colls)
    assert {c.peer_words for c in colls if c.library == "vllm_custom"} <= {tp - 1}
    assert {c.peer_words for c in colls if c.library == "nccl"} <= {0}
    # the shard of every projection GEMM: N (param 4) and K (param 5) on every rank
    shards = {(s.site, s.field): s for s in doc.shards}
    for layer in range(layers):
        for g in ("qkv", "o", "gate_up", "down"):
            site = _gemm_site(g, layer)
            assert shards[(site, "param4")].values == [truth.gemm_n[g]] * tp, (g, layer)
            assert shards[(site, "param5")].values == [truth.gemm_k[g]] * tp, (g, layer)
    assert truth.gemm_n["qkv"] == truth.shard.qkv_size and truth.gemm_k["down"] * tp == SR.model_config(layers, **over).inter
    own = [s for s in doc.shards if s.rank_index]
    if collective != "nccl":
        assert own and all(s.values == list(range(tp)) for s in own)
        assert {s.site for s in own} <= {c.site for c in colls if c.library == "vllm_custom"}
    else:
        assert own == [] and doc.peers == []
    assert not [s for s in doc.shards if not s.same and not s.rank_index]


def test_peer_words_are_the_other_ranks_signals(tmp_path):
    result, truth = _run(tmp_path, tp=4, layers=1)
    words = {(p.site, p.at): p.ranks for p in result.doc.peers}
    coll = [c.site for c in result.doc.collectives]
    # param 1 (RankSignals by value) holds one Signal* per rank: word k is peer memory on every rank but k
    assert {s for s, _ in words} == set(coll)
    assert all(words[(s, 8 * k)] == truth.tp - 1 for s in coll for k in range(truth.tp))


def test_a_rank_that_parts_is_named_with_its_forward_and_call_site(tmp_path):
    def plant(rank, recs):
        if rank != 1:
            return
        # drop rank 1's first collective after the second prefill starts (an all-reduce it skipped)
        embeds = [k for k, r in enumerate(recs) if r["symbol"] == SR.qwen3_sim.SYM["embed"]]
        k = next(j for j in range(embeds[5], len(recs)) if recs[j]["symbol"] == SR.CUSTOM_AR)
        del recs[k]
        for seq, r in enumerate(recs):
            r["seq"] = seq

    result, truth = _run(tmp_path, plant=plant)
    doc = result.doc
    assert not doc.aligned and doc.forwards == truth.forwards - 1
    (m,) = doc.mismatches
    assert (m.rank, m.forward) == (1, 5)
    assert m.expected.startswith(SR.CUSTOM_AR) and m.got.startswith(FADD)
    assert any("NOT aligned" in ln for ln in lines(doc)) and any("rank 1 forward 5" in ln for ln in lines(doc))


def test_rank_order_follows_the_environment_then_the_device_then_the_pid(tmp_path):
    # RANK reversed against the pids: the environment decides
    truth = SR.simulate_tp(tmp_path / "env", SR.model_config(1), SR.TPSim(layers=1, tp=2))
    for r, pid in enumerate(truth.pids):
        f = tmp_path / "env" / f"pid{pid}" / "meta.json"
        meta = json.loads(f.read_text())
        meta["env"]["RANK"] = str(1 - r)
        f.write_text(json.dumps(meta))
    doc = analyze_ranks(tmp_path / "env", cache=False).doc
    assert [r.pid for r in doc.ranks] == truth.pids[::-1] and doc.ranks[0].rank_from == "env:RANK"
    # no environment: the device ordinals (here GPUs 2..5 of a larger host)
    result, truth = _run(tmp_path / "dev", SR.model_config(1), layers=1, tp=4, env_rank=False, device_base=2)
    assert [(r.rank, r.device, r.rank_from) for r in result.doc.ranks] == [(k, 2 + k, "device") for k in range(4)]
    # every worker sees its GPU as ordinal 0: only the pids are left, and a note says so
    result, truth = _run(tmp_path / "one", SR.model_config(1), layers=1, tp=2, env_rank=False, one_device=True)
    doc = result.doc
    assert [r.pid for r in doc.ranks] == truth.pids and doc.ranks[0].rank_from == "pid"
    assert any("ordered by pid" in n for n in doc.notes)
    assert len({r.uuid for r in doc.ranks}) == 2


def test_one_process_dumps_are_not_multi_rank(tmp_path):
    simulate(tmp_path / "sim", SimConfig(layers=2))          # a main process and a small second one
    assert analyze_ranks(tmp_path / "sim", cache=False) is None
    SR.simulate_tp(tmp_path / "tp1", SR.model_config(1), SR.TPSim(tp=2, layers=1))
    for d in sorted((tmp_path / "tp1").glob("pid*"))[1:]:   # one rank left beside the API server
        if d.name != "pid7099":
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
    assert analyze_ranks(tmp_path / "tp1", cache=False) is None


def test_the_ranks_section_round_trips_and_one_process_json_has_none(tmp_path, offline_analysis_json):
    result, _ = _run(tmp_path, tp=2, layers=1)
    doc = document_with_ranks(result)
    obj = json.loads(json.dumps(doc.to_json()))
    assert obj["ranks"]["version"] == 1
    back = from_json(obj)
    assert back.ranks == doc.ranks and back.source.pid == result.doc.ranks[0].pid
    one = json.loads(offline_analysis_json.read_text())
    assert "ranks" not in one and from_json(one).ranks is None
    bad = dict(obj, ranks={**obj["ranks"], "surprise": 1})
    with pytest.raises(ValueError, match="analysis.ranks: unknown key"):
        from_json(bad)


def _mine(capsys, *args) -> tuple[int, str]:
    from mine.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*map(str, args)])
    return exc.value.code, capsys.readouterr().out


def test_mine_analyze_reports_and_writes_the_ranks(tmp_path, capsys):
    truth = SR.simulate_tp(tmp_path / "d", SR.model_config(1), SR.TPSim(tp=2, layers=1, collective="nccl"))
    code, out = _mine(capsys, "analyze", tmp_path / "d", "--json", tmp_path / "a.json")
    assert code == 0
    assert "ranks: 2 (ordered by env:RANK); aligned over 13 forward(s)" in out
    assert "collectives: 2 all_reduce (nccl)" in out
    obj = json.loads((tmp_path / "a.json").read_text())
    assert [r["pid"] for r in obj["ranks"]["ranks"]] == truth.pids and obj["source"]["pid"] == truth.pids[0]
    # --pid picks one process: a one-process analysis, no ranks section
    code, out = _mine(capsys, "analyze", tmp_path / "d", "--pid", truth.pids[1], "--json", tmp_path / "b.json")
    assert code == 0 and "ranks:" not in out and "ranks" not in json.loads((tmp_path / "b.json").read_text())


def test_vocab_parallel_edges_are_collectives_outside_the_layers(tmp_path):
    result, truth = _run(tmp_path, tp=2, layers=2, edges=True)
    doc = result.doc
    assert doc.aligned
    ops = sorted((c.library, c.op) for c in doc.collectives)
    assert ops.count(("nccl", "all_gather")) == 1 and ops.count(("nccl", "all_reduce")) == 1
    assert ops.count(("vllm_custom", "all_reduce")) == 2 * 2
    sym_of = dict(zip(result.main.sites.index["site"].astype(str), result.main.sites.index["symbol"].astype(str)))
    ag = next(c for c in doc.collectives if c.op == "all_gather")
    assert sym_of[ag.after] == GEMM_SYM["lm_head"]
    emb = next(c for c in doc.collectives if c.library == "nccl" and c.op == "all_reduce")
    assert sym_of[emb.after] == SR.qwen3_sim.SYM["embed"]
