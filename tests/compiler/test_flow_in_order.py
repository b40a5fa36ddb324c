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
