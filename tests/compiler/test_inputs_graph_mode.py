"""What the host gave each forward when the forwards replay CUDA graphs: q3w.

tests/fixtures/compile/q3w: vLLM 0.26.0 in its default mode (torch.compile + CUDA graphs) on one H200,
2026-12-02, the q3s checkpoint, prompts of 1, 29, 113, 171 and 9 tokens (q3w.ref.json.xz). Every
decode step replays the decode graph captured at start-up, and the prefills replay piecewise graphs:
their kernels carry the seqs of their capture, long before the request. Placed by those seqs, every
decode forward began at the capture and spanned all the later ones, every copy went to the last
of them, and no forward was tied to a step. A forward's extent is that of its live launches.
"""

from __future__ import annotations

import json
import lzma

import numpy as np
import pytest
from paths import FIXTURES

from compiler import inputs
from compiler.requests import read_requests
from mining.analyze import analyze, document
from mining.load import load_dump

FIX = FIXTURES / "compile"


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    dump = load_dump(FIX / "q3w.tar.xz", cache=False)
    doc = document(analyze(dump))
    ref = tmp_path_factory.mktemp("q3w") / "ref.json"
    ref.write_bytes(lzma.decompress((FIX / "q3w.ref.json.xz").read_bytes()))
    return dump, doc, inputs.collect(dump, doc), read_requests(ref), json.loads(ref.read_text())


def test_serving_forwards_do_not_overlap(collected):
    _dump, _doc, fwds, _reqs, _ref = collected
    serve = [fi for fi in fwds if fi.phase == "serve"]
    assert len(serve) > 30
    firsts = np.array([fi.first for fi in serve])
    lasts = np.array([fi.last for fi in serve])
    assert (np.diff(firsts) > 0).all()
    assert (lasts[:-1] < firsts[1:]).all(), "a forward's live launches run past the next forward's first"


def test_each_prompt_is_copied_to_its_own_prefill(collected):
    """The prompt's token ids (i32, as the engine copies them) land in the serving forward that ran
    it: one whose token count (padded to a captured size) holds the prompt, and no other."""
    _dump, _doc, fwds, _reqs, ref = collected
    for r in ref["requests"]:
        ids = np.array(r["prompt"], "<i4").tobytes()
        if len(r["prompt"]) < 4:
            continue          # a one-token prompt's id also equals many other one-element copies
        got = [fi for fi in fwds for a in fi.arrays if a.source == "copy" and a.data == ids]
        assert len(got) == 1, (len(r["prompt"]), [fi.forward for fi in got])
        fi = got[0]
        assert fi.phase == "serve" and fi.tokens >= len(r["prompt"]), (fi.forward, fi.tokens)


def test_the_prefills_take_their_steps(collected):
    _dump, _doc, fwds, reqs, ref = collected
    inputs.name(fwds, reqs)
    pre = [s for s in reqs.steps if s.tokens > 1]
    tied = {fi.step.index for fi in fwds if fi.phase == "serve" and fi.step is not None}
    assert {s.index for s in pre} <= tied
