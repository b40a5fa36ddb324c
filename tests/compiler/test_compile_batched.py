"""Batched serving manifests (issue 17, compile side): a `seqs` var, programs by step kind and range
of sequences, expressions in `seqs` (compiler/programs.py, compiler/exprs.py, compiler/emit.py).

Why: a batched engine serves several sequences per step; a decode of 7 sequences is 7 tokens and
runs decode's kernels, so programs split by step kind (tokens == seqs: decode) and a decode's
sizes follow its sequences. q2b (vLLM 0.26 eager, groups of 1, 8 and 32 requests) is the real
capture; the batched simulator (tests/helpers/dumpsim_batched.py) plants every form with known
truth. Single-sequence captures compile byte for byte as before (checked by hand against main's
HEAD for every fixture; test_compile.py and friends pin their shapes).
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from compiler.compile import compile_capture, compile_dump, write
from compiler.errors import CompileError
from dumpsim_batched import ATTN, BATCHED, MIX, SINGLE, plan, simulate
from kern_verdicts import kern_violations
from manifests.abi import check_abi
from manifests.verify import verify
from mining import fit as F
from paths import FIXTURES
from vocab import expr as V

Q2B = FIXTURES / "batched"


@lru_cache(maxsize=None)
def _q2b():
    from compiler import facts
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(Q2B / "q2b.tar.xz")
    doc = document(analyze(dump))
    res = compile_capture(dump, doc, label="test", model=facts.read(Q2B / "q2b.config.json"))
    return dump, doc, res


def _uses(m: dict, prog: str, var: str) -> int:
    return json.dumps(m["programs"][prog]["calls"]).count(f'"{var}"') + sum(
        json.dumps(m["ops"][c["op"]]["impl"]).count(f'"{var}"') for c in m["programs"][prog]["calls"])


def test_q2b_compiles_and_both_verifiers_and_the_abi_check_accept(tmp_path):
    dump, _, res = _q2b()
    m = res.manifest
    assert verify(m) == []
    write(res, tmp_path / "out", dump)          # raises on an ABI finding
    assert kern_violations(m, tmp_path / "out" / "kernels", tmp_path) == []
    assert [d for d in check_abi(m, tmp_path / "out" / "kernels") if d.rule != "abi.module-file"] == []


def test_q2b_has_a_seqs_var_and_decode_programs_by_range_of_sequences():
    _, doc, res = _q2b()
    m = res.manifest
    assert m["vars"]["seqs"]["axis"] == "groups"
    decodes = {n: p for n, p in m["programs"].items() if n.startswith("decode")}
    assert len(decodes) >= 2
    # every decode step the capture served with more than one sequence is in a batched decode program
    prov = res.provenance["batched"]["programs"]
    served = {r.seqs for r, f in zip(doc.forward_vars.forwards, doc.passes.forwards)
              if f.phase == "serve" and r.seqs is not None and r.seqs == f.tokens}
    for n, p in decodes.items():
        assert p["batch"]["rows"] == 1 and p["batch"]["groups"] == prov[n]["groups"]
        assert prov[n]["kind"] == "decode" and prov[n]["var"] == "seqs"
        lo, hi = prov[n]["seen_seqs"]
        assert p["batch"]["groups"] >= hi
    assert m["vars"]["seqs"]["max"] == max(p["batch"]["groups"] for p in m["programs"].values())
    multi = [n for n, p in decodes.items() if p["batch"]["groups"] > 1]
    assert multi and all(_uses(m, n, "seqs") > 0 for n in multi)
    # the one-sequence decode has every value constant and runs as a graph; the others use seqs
    one = [n for n, p in decodes.items() if p["batch"]["groups"] == 1]
    assert one and all(m["programs"][n].get("graph") is True and _uses(m, n, "seqs") == 0 for n in one)
    assert max(served) <= m["vars"]["seqs"]["max"]
    # no decode program uses the rows var (its rows are its sequences)
    assert all(_uses(m, n, "rows") == 0 for n in decodes)


def test_q2b_expressions_in_seqs_reproduce_every_served_step():
    """Every expression of a batched decode program evaluates, at each of the program's forwards'
    sequence counts, to the value the engine launched (grids of the op's launch)."""
    dump, doc, res = _q2b()
    m = res.manifest
    fits = res.provenance["batched"]["fits"]
    assert any("seqs" in f["written"] for f in fits)
    for f in fits:
        e = F.parse(f["written"])
        assert "rows" not in f["written"] or not f["program"].startswith("decode")
        # written forms are among the forms the samples allowed, with `tokens` read as seqs in decode
        forms = [F.render(F.parse(x)) for x in f["forms"]]
        if f["program"].startswith("decode"):
            s = np.arange(1, m["programs"][f["program"]]["batch"]["groups"] + 1)
            vals = {F.evaluate(F.parse(x), {"tokens": s, "seqs": s}).tobytes() for x in forms}
            assert F.evaluate(e, {"seqs": s}).tobytes() in vals


def test_q2b_left_out_programs_say_why_in_one_sentence():
    _, _, res = _q2b()
    left = res.provenance["batched"]["left_out"]
    for name, why in left.items():
        assert "\n" not in why and name in why
        assert "allow" in why or "negative" in why or "no expression" in why, why


def test_q2b_without_config_compiles_too(tmp_path):
    res = compile_dump(Q2B / "q2b.tar.xz", cache=False)
    assert verify(res.manifest) == [] and "seqs" in res.manifest["vars"]


def _grid_texts(m: dict, prog: str, entry: str) -> set[str]:
    out = set()
    for c in m["programs"][prog]["calls"]:
        for ln in m["ops"][c["op"]]["impl"]["launches"]:
            if ln.get("entry", "").endswith(entry):
                out.add(V.render(V.from_wire(ln["grid"][0])) if not isinstance(ln["grid"][0], int)
                        else str(ln["grid"][0]))
    return out


def _truth_at(text: str, s: np.ndarray) -> np.ndarray:
    return F.evaluate(F.parse(text), {"tokens": s, "seqs": s})


def test_simulated_batch_decode_expressions_equal_the_planted_forms(tmp_path):
    """The planted forms at tokens == seqs, over every sequence count the decode program serves."""
    d, truth = simulate(tmp_path / "b", BATCHED)
    res = compile_dump(d, cache=False)
    m = res.manifest
    assert verify(m) == []
    dec = m["programs"]["decode"]
    G = dec["batch"]["groups"]
    assert G == max(st.seqs for st in truth.steps if st.tokens == st.seqs)
    assert m["vars"]["seqs"] == {"max": G, "axis": "groups"}
    s = np.arange(1, G + 1)
    planted = {"stage_kernel": "add(seqs, 1)", "embed_kernel": "tokens", "rms_norm_kernel": "tokens",
               "attn_kernel": ATTN, "mix_kernel": MIX, "decode_reduce_kernel": "seqs", "sample_kernel": "seqs",
               "gemm_kernel": "ceil_div(tokens, 128)"}
    for kernel, text in planted.items():
        got = _grid_texts(m, "decode", kernel + "v")
        assert got, kernel
        for g in got:
            want = _truth_at(text, s)
            have = F.evaluate(F.parse(g), {"seqs": s}) if not g.isdigit() else np.full(len(s), int(g))
            assert (have == want).all(), (kernel, g, text)
    # the analysis' exact fit is the one written where forms agree (MIX over tokens and seqs)
    assert _grid_texts(m, "decode", "mix_kernelv") == {"add(ceil_div(seqs, 64), mul(seqs, 2))"}
    assert dec.get("graph") is None and dec["batch"]["rows"] == 1


def test_simulated_batch_prefill_is_left_out_naming_the_field_and_forms(tmp_path):
    """The planted prefill GEMM grid ceil_div(t, 128) and ceil_div(t + s, 128) agree on every
    planted prefill: the capture does not pin it, so the prefill program is left out with one
    sentence naming the call, the field and both forms; the decode program still compiles."""
    d, _ = simulate(tmp_path / "b", BATCHED)
    res = compile_dump(d, cache=False)
    why = res.provenance["batched"]["left_out"]["prefill"]
    assert "grid_x" in why and "ceil_div(tokens, 128)" in why and "ceil_div(add(tokens, seqs), 128)" in why
    assert "prefill" not in res.manifest["programs"]


def test_a_batched_capture_with_nothing_pinned_is_refused_in_one_sentence(tmp_path):
    """One decode step size only: nothing varies with the sequences, and the prefill is unpinned;
    the capture's one program that is left is refused with its sentence."""
    groups = (((300, 40), (2, 2)), ((130, 9), (2, 2)))
    d, truth = simulate(tmp_path / "b", groups)
    assert {st.seqs for st in truth.steps if st.tokens == st.seqs} == {2}
    try:
        res = compile_dump(d, cache=False)
    except CompileError as exc:
        assert "\n" not in str(exc)
    else:
        assert verify(res.manifest) == []


def test_single_sequence_sim_declares_no_seqs_var(tmp_path):
    d, _ = simulate(tmp_path / "s", SINGLE)
    try:
        res = compile_dump(d, cache=False)
    except CompileError as exc:
        assert "sequences" not in str(exc)
        return
    assert "seqs" not in res.manifest["vars"]
    assert res.manifest["programs"]["decode"]["batch"] == {"groups": 1, "rows": 1}
