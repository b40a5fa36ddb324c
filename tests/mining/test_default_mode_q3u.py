"""Forwards of vLLM's default mode (torch.compile + CUDA graphs) on a small model: q3u.

tests/fixtures/compile/q3u: vLLM 0.26.0 in its default mode, captured on one H200 on 2026-12-02, on the
q3s checkpoint (3 layers, hidden 256), serving six requests one after another (prompts of 1, 23, 77,
190, 6 and 131 tokens, 8 new tokens each; q3u.ref.json.xz). Each decode step is one replay of the
whole-model decode graph between eager staging and sampling kernels; the prefills run Inductor's
kernels eagerly. Its warm-up forwards (the engine's graph captures at 104 sizes) repeat a 64-kernel
block, which covers more launches than any layer. Before `steps._holding` the layer finder took
that block for the layer and found 12 forwards; the truth is 6 x 8 serving forwards. Its
one-per-forward kernels all count blocks of 4 rows (Inductor's fused embedding at hidden 256); the
tokens are the KV writer's grid, a per-layer kernel (`sites._finer`).

q3w: the same engine, mode and checkpoint, other prompts (1, 29, 113, 171 and 9 tokens, seed 47;
H200, 2026-12-02). Its five requests make 40 serving forwards of which 36 are decodes: the split-KV
reduction, a decode-only per-layer kernel, ran in 90% of them and was taken for the tokens (every
prefill lost its count), and the warm-up's 51 forwards outnumbered the requests' 36 of the layer
stack, whose pattern then named the model's layers (5, where it has 3).

q3y: the same engine and mode on another checkpoint (4 layers, hidden 512, 8 heads, 4 KV heads,
vocabulary 16384) and other prompts (1, 37, 95, 150 and 12 tokens, seed 61; H100, 2026-12-05), a
capture none of these rules was written on.
"""

from __future__ import annotations

import json
import lzma

import pytest
from paths import FIXTURES

from mining.analyze import analyze, document
from mining.load import load_dump

FIX = FIXTURES / "compile"


@pytest.fixture(scope="module", params=["q3u", "q3w", "q3y"])
def name(request):
    return request.param


@pytest.fixture(scope="module")
def doc(name):
    return document(analyze(load_dump(FIX / f"{name}.tar.xz", cache=False)))


@pytest.fixture(scope="module")
def ref(name):
    return json.loads(lzma.decompress((FIX / f"{name}.ref.json.xz").read_bytes()))


def test_one_serving_forward_per_step_of_every_request(doc, ref):
    steps = sum(len(r["output"]) for r in ref["requests"])
    serve = [f for f in doc.passes.forwards if f.phase == "serve" and f.n_launches]
    assert len(serve) == steps
    # per request: its prompt's forward, then one decode forward per new token but the last
    k = 0
    for r in ref["requests"]:
        group = serve[k:k + len(r["output"])]
        k += len(r["output"])
        assert all(f.tokens == 1 for f in group[1:]), [f.tokens for f in group]
        # the prompt's tokens as the engine ran them: padded up to a captured size (vLLM pads a
        # compiled step's tokens to its next cudagraph size), never fewer, never a block count
        p = len(r["prompt"])
        assert group[0].tokens == 1 if p == 1 else p <= group[0].tokens < 2 * p, (p, group[0].tokens)


def test_the_layer_is_the_models_layer_not_the_warm_up_forward(doc, ref):
    """Three layers a forward (the checkpoint's num_hidden_layers), each of about a dozen kernels: a
    decode layer (with the split-KV reduction) of one more kernel than a prefill one."""
    n = ref["model"]["num_hidden_layers"]
    lay = doc.layers
    assert lay.layers == n and 8 <= lay.sites_per_layer <= 16
    kinds = {k.sites_per_layer for sh in lay.shapes for k in sh.kinds if k.count == n}
    assert kinds and max(kinds) < 20          # no whole step (58 kernels) or warm-up (64) taken for a layer


def test_the_tokens_reference_runs_in_every_serving_forward(doc):
    """A decode-only kernel (the split-KV reduction) counts one token wherever it runs, as the KV
    writer does, and knows nothing of the prefills: the reference must count every request's
    forward, the prompts' included."""
    serve = [f for f in doc.passes.forwards if f.phase == "serve" and f.n_launches]
    assert all(f.tokens for f in serve), [(f.forward, f.tokens) for f in serve if not f.tokens]
    assert any(f.tokens > 1 for f in serve)
