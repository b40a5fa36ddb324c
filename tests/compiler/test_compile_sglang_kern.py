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
  its token table arrive through device-side buffers that one-token decode steps do not tell apart).
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
    assert unnamed, "SGLang's slots and request-pool tables are not named yet; a change that names them updates this"


def test_the_samplers_memset_read_after_the_logits_stops_nothing(compiled):
    res, _ = compiled
    assert any("launches after the logits read bytes a memset cleared" in n for n in res.notes)
