"""`mine compile`'s directions from data flow measured in order (replay/forward.py) on the H200.

tests/gpu_results/replay/in_order holds the results of replaying q2r's first decode forward in
capture order on rebuilt memory (2026-12-01, one H200). Read back as the analysis' `flow` section
(`replay.sites.with_flow`), they drive `compiler.buffers`: every pointer parameter of the Qwen3
layer kernels in the compiled decode program then carries the direction the hand-written
generator (generators/qwen3/kernels.py) declares -- a measured partial write of the KV state as
`inout`, a measured `unused` as `in` or `out` by kern's dataflow rule -- with no model knowledge
in the compiler. CPU only: the GPU's answers are the committed results.
"""

from __future__ import annotations

import pytest

from compiler import buffers, programs
from generators.qwen3.kernels import ATTN3D, FAMILIES, tag
from mining.load import load_dump
from paths import FIXTURES, ROOT
from replay.run import read_results
from replay.sites import with_flow
from vocab.errors import UsageError

RESULTS = ROOT / "tests" / "gpu_results" / "replay" / "in_order" / "q2r_in_order_decode.json.xz"


@pytest.fixture(scope="module")
def compiled():
    d = load_dump(FIXTURES / "replay" / "q2r.tar.xz", cache=False)
    doc = with_flow(d, read_results(RESULTS))
    progs, _ = programs.programs(d, doc)
    lay, _ = buffers.layout(progs, doc)
    return doc, {p.name: p for p in progs}, lay


def test_flow_read_back_is_in_order(compiled):
    doc, _, _ = compiled
    assert doc.flow and {w.context for w in doc.flow} == {"in-order"}
    assert all(w.span_bytes >= w.written_bytes for w in doc.flow)


def test_decode_directions_are_the_generators(compiled):
    _, progs, lay = compiled
    dec, L = progs["decode"], lay["decode"]
    seen, diffs = set(), []
    for k, st in enumerate(dec.rep.steps):
        fam = tag(st.launch.symbol)
        if fam is None:
            continue
        n = len({i for (s, i, _) in L.uses if s == k})
        spec = ATTN3D if fam == "attn" and any(s == k and i == 28 for (s, i, _) in L.uses) else FAMILIES[fam]
        seen.add(fam)
        for i, (role, want, _) in spec.ptrs.items():
            u = L.uses.get((k, i, 0))
            if u is None or u.direction != want:
                diffs.append((k, fam, i, role, want, u.direction if u else None, u.evidence if u else "", n))
    assert seen == set(FAMILIES)
    assert diffs == []


def test_a_partial_state_write_and_unused_words_say_why(compiled):
    _, progs, lay = compiled
    dec, L = progs["decode"], lay["decode"]
    k = next(k for k, st in enumerate(dec.rep.steps) if tag(st.launch.symbol) == "cache")
    assert "partial write of a persistent state" in L.uses[(k, 2, 0)].evidence
    assert "measured unused in order" in L.uses[(k, 5, 0)].evidence


def test_read_results_refuses_another_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"a": 1}')
    with pytest.raises(UsageError, match="not a file of replay results"):
        read_results(bad)


def test_device_staging_is_left_out_by_measured_flow():
    """With the in-order flow of q2r's decode and prefill forwards, the launches that read only host
    data -- vLLM's `_prepare_pos_seq_lens_kernel` and `_compute_slot_mappings_kernel` -- leave the
    programs like host staging, and the buffers they write become the decode program's inputs:
    rotary's positions, the KV write's slots, attention's sequence lengths and query offsets. No
    layer kernel and no embedding is taken for staging."""
    from compiler.programs import _seqs, device_staging, read_launches

    d = load_dump(FIXTURES / "replay" / "q2r.tar.xz", cache=False)
    doc = with_flow(d, read_results(RESULTS) + read_results(RESULTS.with_name("q2r_in_order_prefill.json.xz")))
    fw = [f for f in doc.passes.forwards if f.tokens]
    L = read_launches(d, [s for f in fw for s in _seqs(f)])
    st = device_staging(d, doc, fw, L)
    assert st and {L[s].symbol for s in st} == {"_prepare_pos_seq_lens_kernel", "_compute_slot_mappings_kernel"}
    progs, notes = programs.programs(d, doc)
    lay, decls = buffers.layout(progs, doc)
    dec = {p.name: p for p in progs}["decode"]
    assert not any(x.launch.seq in st for x in dec.rep.steps)
    L2 = lay["decode"]
    kinds = {}
    for k, x in enumerate(dec.rep.steps):
        fam = tag(x.launch.symbol)
        for (kk, i, at), where in L2.where.items():
            if kk == k and where[0] == "buf":
                kinds[(fam, i)] = decls[where[1]].kind
    assert kinds[("rope", 0)] == "input"        # positions
    assert kinds[("cache", 4)] == "input"       # slot mapping
    assert kinds[("attn", 5)] == "input" and kinds[("attn", 24)] == "input"   # seq_lens, query offsets
    # without flow the words alone decide nothing
    assert device_staging(d, type(doc)(**{**doc.__dict__, "flow": []}), fw, L) == set()
