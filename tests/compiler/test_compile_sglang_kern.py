"""`mine compile` on the SGLang capture made for kern (issue 21): graph mode, a copy log, an in-order
replay's flow and contents, and the run's own reference (SGLang's answers with top-k log-probabilities).

tests/gpu_results/session21 (run7): SGLang 0.5.17 on an H100, the q3d geometry (3 layers), four
prompts of 1, 34, 85 and 175 tokens, 8 new tokens each, every request asking for its top-20
log-probabilities (examples/sglang_qwen3/run_serve.py --reference --snapshot). What is checked:

- the reference is SGLang's: the outputs run.json recorded, every position's top-k, and
  compare.reference reads it;
- the capture compiles with the flow, contents and requests; both verifiers accept the manifest;
  decode is one CUDA-graph program of one row whose token and sequence-length inputs are named
  (kern `fill`s); the sampler's top-k after the logits, which reads bytes a memset cleared, is not
  part of the program and stops nothing (before, the whole compile was refused for it);
- what is not named yet is said: the inputs without a fill (SGLang's slots, request-pool index and
  its token table arrive through device-side buffers that one-token decode steps do not tell apart);
- what the manifest passes wrong is said (compiler.restaged, session 23's findings in
  tests/gpu_results/session23/sglang_findings.md): the decode's left-out scheduler launches
  rewrite the sequence length (seq_lens + 1) and the positions (clamp_position) between its calls,
  over addresses earlier calls used, so the graph's copy reads the earlier bytes; and the
  request-to-token table the prefill writes is a workspace of each program, dead between runs.
"""

from __future__ import annotations

import json
import lzma
from functools import lru_cache

from paths import FIXTURES

import pytest

from compare import reference
from compiler.compile import compile_dump
from kern_verdicts import accepted_by_both
from paths import ROOT

SG = FIXTURES / "sglang"
NAME = "sglang_graph_kern"
RUN = ROOT / "tests/gpu_results/session21/run7"


def _xz_json(p):
    return json.loads(lzma.decompress(p.read_bytes()))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp(NAME)
    for part in ("flow", "contents", "ref"):
        (tmp / f"{part}.json").write_bytes(lzma.decompress((SG / f"{NAME}.{part}.json.xz").read_bytes()))
    res = compile_dump(SG / f"{NAME}.tar.xz", tmp / "out", analysis=tmp / "flow.json", contents=tmp / "contents.json",
                       requests=tmp / "ref.json", config=SG / f"{NAME}.config.json", cache=False)
    return res, tmp / "out"


def test_the_reference_is_the_runs_own():
    ref = reference.read(SG / f"{NAME}.ref.json.xz")
    assert ref.engine == "sglang 0.5.17" and ref.mode == "graph" and ref.top_k == 20
    assert [len(r.prompt) for r in ref.requests] == [1, 34, 85, 175]
    run = json.loads((RUN / "run.json").read_text())
    assert [list(r.output) for r in ref.requests] == [q["output"] for q in run["requests"]]
    for r in ref.requests:
        assert len(r.output) == 8 and len(r.steps) == 8
        for tok, st in zip(r.output, r.steps):
            assert st.ids[0] == tok and len(st.ids) >= 20


def test_it_compiles_and_both_verifiers_accept(compiled):
    res, out = compiled
    accepted_by_both(res, out)
    dec = res.manifest["programs"]["decode"]
    assert dec.get("graph") is True and dec["batch"] == {"groups": 1, "rows": 1}


def test_token_and_length_inputs_are_named(compiled):
    res, _ = compiled
    named = {b["fill"] for b in res.manifest["buffers"].values() if b["kind"] == "input" and b.get("fill")}
    assert {"token", "seq_len"} <= named
    unnamed = [n for n, b in res.manifest["buffers"].items() if b["kind"] == "input" and not b.get("fill")]
    # session 23: naming them would not make the manifest servable (test_what_the_manifest_passes_wrong_is_said)
    assert unnamed, "SGLang's slots and request-pool tables are not named yet; a change that names them updates this"
    assert "position" not in named


def test_the_samplers_memset_read_after_the_logits_stops_nothing(compiled):
    res, _ = compiled
    assert any("launches after the logits read bytes a memset cleared" in n for n in res.notes)


def test_what_the_manifest_passes_wrong_is_said(compiled):
    """The decode's graph copy (call 2, a foreach copy into the graph's static inputs) reads the
    positions at param 0@8 and the sequence lengths at @32 after left-out launches rewrote them
    (clamp_position over the block call 0's slot copy used; seq_lens + 1 over the lengths call 1
    indexed the table with): both are recorded with the launch that rewrote them and the call
    that used the address before."""
    res, _ = compiled
    got = {(r["program"], r["call"], r["at"]): r for r in res.provenance["restaged"]}
    assert set(got) == {("decode", 2, 8), ("decode", 2, 32)}
    pos, lens = got[("decode", 2, 8)], got[("decode", 2, 32)]
    assert "clamp_position" in pos["rewritten_by"][1] and pos["used_before_by_call"] == 0
    assert pos["passed"] == ["decode.ws.2", "workspace"]
    assert "CUDAFunctorOnSelf_add" in lens["rewritten_by"][1] and lens["used_before_by_call"] == 1
    assert lens["passed"] == ["seq_len", "input"]
    assert any(n.startswith("decode: 2 word(s) read bytes a left-out launch rewrote") for n in res.notes)


def test_the_table_the_prefill_writes_for_the_decode_is_said(compiled):
    """write_req_to_token_pool_triton (prefill call 0) writes the request's row of the table and no
    later prefill call reads it; the decode reads the same address (its own index_put writes one
    entry, create_flashinfer_kv_indices_triton reads the row): a workspace in each program, dead
    between runs, which the note says."""
    res, _ = compiled
    m = res.manifest
    assert m["programs"]["prefill"]["calls"][0]["op"].endswith("write_req_to_token_pool_triton")
    table = [n for n in res.notes if "dead between runs" in n]
    assert len(table) == 1 and table[0].startswith("prefill writes prefill.ws.4 ")
    assert "decode reads the same address as decode.ws.3" in table[0]
    assert m["buffers"]["prefill.ws.4"]["kind"] == m["buffers"]["decode.ws.3"]["kind"] == "workspace"
