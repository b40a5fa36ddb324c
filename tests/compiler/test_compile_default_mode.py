"""`mine compile` on vLLM's default mode (torch.compile + CUDA graphs): Inductor's fused kernels.

Three real H200 captures: q3d and q3ds (tests/fixtures/suite, hidden 1024) and q3u
(tests/fixtures/compile, hidden 256, prompts of odd lengths). vLLM pads a compiled step's tokens to a
captured size, so every prefill sample is a multiple of 8 and many forms agree on all of them. Two
rules tell them apart, from the launch itself rather than from more samples:
- a kernel's own int scalar is an element count or a stride: its form without a ceil_div;
- a Triton grid axis is ceil_div(xnumel, XBLOCK), and an Inductor combo kernel's is the sum over its
  sub-kernels, with each xnumel one of the launch's scalar params.
q3w (the same engine and checkpoint as q3u, prompts of 1, 29, 113, 171 and 9 tokens) is the
capture the analysis first failed on: its decode-only split-KV reduction had become the tokens
reference (tests/mining/test_default_mode_q3u.py). q3ds, q3u, q3w and q3y (another checkpoint: 4 layers,
hidden 512) compile and both verifiers
accept them; q3d's prefill is left out at its attention, whose
grid counts the unpadded tokens (no form of the padded rows gives it).
"""

from __future__ import annotations

import pytest
from kern_verdicts import accepted_by_both
from paths import FIXTURES

from compiler.compile import compile_dump
from manifests.verify import verify
from vocab import expr as V

CASES = {"q3ds": FIXTURES / "suite" / "q3ds.tar.xz", "q3u": FIXTURES / "compile" / "q3u.tar.xz",
         "q3w": FIXTURES / "compile" / "q3w.tar.xz", "q3y": FIXTURES / "compile" / "q3y.tar.xz"}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    return request.param, compile_dump(CASES[request.param], out, cache=False), out


def test_compiles_and_both_verifiers_accept(compiled):
    name, res, out = compiled
    m = res.manifest
    accepted_by_both(res, out, name)
    assert {"decode", "prefill"} <= set(m["programs"])
    # Inductor's kernels are what runs: generated names, pinned by sha256
    triton = [ln for op in m["ops"].values() for ln in op["impl"].get("launches", [])
              if ln.get("entry", "").startswith("triton_")]
    assert len(triton) >= 4, name
    assert m["programs"]["decode"].get("graph") is True


def _launches(m, prog):
    for c in m["programs"][prog]["calls"]:
        for ln in m["ops"][c["op"]]["impl"].get("launches", []):
            yield c, ln


def test_every_grid_reproduces_the_captures_samples(compiled):
    """Whatever form was chosen, at each serving prefill's rows it gives the grid that forward's
    launch had (the program's calls are its steps, one to one)."""
    from compiler import programs as P
    from mining.analyze import analyze, document
    from mining.load import load_dump

    name, res, _ = compiled
    m = res.manifest
    dump = load_dump(CASES[name], cache=False)
    progs, _ = P.programs(dump, document(analyze(dump)))
    prog = next(p for p in progs if p.name == "prefill")
    calls = m["programs"]["prefill"]["calls"]
    checked = 0
    serve = [s for s in prog.samples if s.phase == "serve"]     # the warm-ups' dummy steps may differ
    for s in serve:
        for k, c in enumerate(calls[:len(s.steps)]):
            for ln in m["ops"][c["op"]]["impl"].get("launches", []):
                w = ln.get("when")
                if "grid" not in ln or (w and not (w["min"] <= s.tokens <= w.get("max", s.tokens))):
                    continue
                got = tuple(int(V.evaluate(V.from_wire(g), {"rows": s.tokens})) if isinstance(g, dict)
                            else (s.tokens if g == "rows" else int(g)) for g in ln["grid"])
                assert got == tuple(s.steps[k].launch.grid), (name, s.forward, k, ln["entry"][:40], got)
                checked += 1
    assert serve and checked >= 3 * len(serve), name
    if name in ("q3u", "q3w"):       # hidden 256: Inductor's combo kernels of 4 and 2 rows a token
        assert [n for n in res.notes if "element counts in blocks" in n], name


def test_a_combo_kernels_grid_is_the_sum_of_its_sub_kernels_blocks():
    """q3u's fused q-norm + k-norm kernel: xnumel 4 and 2 rows a token, 8 rows a block. At padded
    sizes 3 * tokens / 4 fits; at 5 tokens the kernel needs ceil(20/8) + ceil(10/8) = 5 blocks."""
    res = compile_dump(CASES["q3u"], None, cache=False)
    m = res.manifest
    grids = [ln["grid"][0] for _, ln in _launches(m, "prefill")
             if ln.get("entry", "").startswith("triton_per_fused") and isinstance(ln["grid"][0], dict)
             and "add" in ln["grid"][0]]
    assert grids
    for g in grids:
        e = V.from_wire(g)
        got = [int(V.evaluate(e, {"rows": t})) for t in (5, 8, 23, 24)]
        assert got == [-(-4 * t // 8) + -(-2 * t // 8) for t in (5, 8, 23, 24)], g


def test_q3d_leaves_out_the_prefill_whose_attention_counts_unpadded_tokens():
    """q3d's prompts of 5, 60 and 200 tokens ran padded to 8, 64 and 200; Inductor's kernels count
    the padded rows, vLLM's attention the real ones (5 // 8 + 1, 60 // 8 + 1, 200 // 8 + 1 = 1, 8, 26
    q blocks). No form of the padded rows gives that, and a grid is never taken from one forward:
    the prefill program is left out with that sentence; the decode program still serves (a host
    feeds the prompt through it, `mine compare --prefill-rows 0`)."""
    res = compile_dump(FIXTURES / "suite" / "q3d.tar.xz", None, cache=False)
    assert set(res.manifest["programs"]) == {"decode"}
    why = [n for n in res.notes if n.startswith("prefill: left out of the manifest")]
    assert len(why) == 1 and "kernel_unified_attention" in why[0] and "[1, 8, 26]" in why[0]
    assert verify(res.manifest) == []
