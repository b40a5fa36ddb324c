"""tri_serve: issue 22's third target, a program that is no LLM engine, compiled from its capture.

examples/planted/serve.py served four seeded requests (7, 33, 90 and 150 prompt tokens, 8 new
each) through the planted Triton engine (one dense and three gated layers, hidden 256, vocabulary
4096, KV cache 256 rows per layer), staging token ids and positions from pinned host memory,
decoding eagerly for the first request and by CUDA-graph replay after it. Captured on an H100 on
2026-12-07 with copies and host pointees; the flow and contents are those of its in-order replay
of forwards 10 (a 33-token prefill) and 13 (a graph-replayed decode), tests/gpu_results/session20.
On the GPU the manifest compiled from it passed `mine compare` against the run's own reference:
32 of 32 steps match, logits error 0.0. The fixture carries no snapshot (its weights are the
checkpoint the program wrote), so weights bind `capture.<name>` here.

What it shows that no vLLM capture does: a KV cache of 128 KiB a layer that the caching allocator
put into one 2 MiB block with the activations (the analysis' kv_pool region rule cannot see it),
and logits written by a Triton kernel, not a cuBLASLt GEMM.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kern_verdicts import accepted_by_both

sys.path.insert(0, str(Path(__file__).parent))
from replayed import FIX, compile_replayed  # noqa: E402

from compare.serving import serving  # noqa: E402
from compiler.buffers import _logits_rows  # noqa: E402

CONFIG = json.loads((FIX / "tri_serve.config.json").read_text())


@pytest.fixture(scope="module")
def tri(tmp_path_factory):
    return compile_replayed("tri_serve", tmp_path_factory.mktemp("tri_serve"))


def _calls(m: dict, prog: str, entry: str) -> list[dict]:
    return [c for c in m["programs"][prog]["calls"] if m["ops"][c["op"]]["impl"]["launches"][0]["entry"] == entry]


def test_both_verifiers_accept(tri):
    res, out = tri
    accepted_by_both(res, out)


def test_a_one_sequence_host_serves_it_from_the_manifest_alone(tri):
    res, _ = tri
    s = serving(res.manifest)
    assert set(s.inputs) == {"token", "position"}
    assert s.vocab == CONFIG["vocab_size"] and s.prefill == "prefill" and s.decode == "decode"
    assert res.manifest["buffers"][s.logits]["shape"] == [1, CONFIG["vocab_size"]]
    assert s.chunk == 150                      # the longest prompt's prefill
    assert s.max_len == CONFIG["max_position_embeddings"]
    assert res.manifest["programs"]["decode"].get("graph") is True


def test_each_gated_layers_cache_is_state_and_no_activation_is(tri):
    res, _ = tri
    m = res.manifest
    gated = CONFIG["layer_kinds"].count("gated")
    for prog in ("decode", "prefill"):
        writes = _calls(m, prog, "kv_write_kernel")
        reads = _calls(m, prog, "context_attend_kernel")
        assert len(writes) == 2 * gated and len(reads) == gated
        where = [(w["args"][1]["state"], w["args"][1]["offset"]) for w in writes]
        assert len(set(where)) == 2 * gated                        # K and V of every layer apart
        for k, r in enumerate(reads):                              # attention reads what its layer wrote
            assert [(a["state"], a["offset"]) for a in r["args"][1:3]] == where[2 * k:2 * k + 2]
        for c in m["programs"][prog]["calls"]:
            entry = m["ops"][c["op"]]["impl"]["launches"][0]["entry"]
            if entry not in ("kv_write_kernel", "context_attend_kernel"):
                assert not any("state" in a for a in c["args"] if isinstance(a, dict)), c["label"]
    assert len(m["states"]) == 1                                   # one allocation holds them all


def test_logits_rows_only_for_a_write_of_exactly_the_vocabulary_a_row():
    def use(written, seq=5):
        return SimpleNamespace(flow=SimpleNamespace(context="in-order", written_bytes=written, seq=seq))
    prog = SimpleNamespace(rep=SimpleNamespace(tokens=1))
    rows = {5: 33}
    assert _logits_rows(use(33 * 4096 * 2), prog, rows, 4096, 1 << 20) == (1, 4096)
    assert _logits_rows(use(33 * 4096 * 2 + 2), prog, rows, 4096, 1 << 20) is None   # not whole rows
    assert _logits_rows(use(33 * 4096 * 2), prog, rows, 2048, 1 << 20) is None      # another vocabulary
    assert _logits_rows(use(33 * 4096 * 2), prog, rows, None, 1 << 20) is None      # no config
    assert _logits_rows(use(33 * 4096 * 2, seq=6), prog, rows, 4096, 1 << 20) is None  # forward unknown
    big = SimpleNamespace(rep=SimpleNamespace(tokens=200))
    assert _logits_rows(use(33 * 4096 * 2), big, rows, 4096, 1 << 20) is None        # past the word's extent


def test_every_request_step_is_a_serving_forward():
    """The four prefills and their 7 decodes each, in order, are the serving forwards; the first
    prefill too, which follows the decode graph's capture with no gap (torch's two set-up fills
    before the capture once made it one start-up forward with them)."""
    import lzma

    from mining.analyze import analyze
    from mining.load import load_dump

    a = analyze(load_dump(FIX / "tri_serve.tar.xz", cache=False))
    ref = json.loads(lzma.decompress((FIX / "tri_serve.ref.json.xz").read_bytes()))
    want = [n for r in ref["requests"] for n in [len(r["prompt"])] + [1] * (len(r["output"]) - 1)]
    serve = a.forwards[a.forwards["phase"] == "serve"]
    assert serve["tokens"].astype(int).tolist() == want
    assert any("graph-capture phase" in n for n in a.notes)
