"""`mine replay`'s library half on CPU: which launches it picks (replay/select.py) and the analysis
it writes with `--flow-out` (replay.sites.with_flow), on the bundled vLLM capture; bad selections
are one UsageError each, naming what is wrong."""

from __future__ import annotations

import json

import pytest

from replay.run import LaunchResult, WordFlow
from replay.select import select
from replay.sites import with_flow
from vocab.errors import UsageError


@pytest.fixture(scope="module")
def dump(offline_dump):
    return offline_dump   # the bundled vLLM capture, loaded once per session (tests/conftest.py)


@pytest.fixture(autouse=True)
def analysed_once(monkeypatch, offline_dump, offline_analysis):
    """`select` by forward analyses the dump it is given; that dump's analysis is the session's
    (the analysis itself is tested in tests/mining), so it is not made again for every call."""
    import mining.analyze as A

    real = A.analyze
    monkeypatch.setattr(A, "analyze", lambda d, *a, **k: offline_analysis if d is offline_dump and not (a or k)
                        else real(d, *a, **k))


def dump_analysis(dump):
    import mining.analyze as A

    return A.analyze(dump)


def test_by_seq_kernel_and_forward(dump):
    seqs = dump.launches["seq"].tolist()
    assert select(dump, [seqs[3], seqs[0]], None, None, 20) == [seqs[3], seqs[0]]  # as given, in order
    picked = select(dump, [], "rms_norm", None, 5)
    names = dict(zip(seqs, dump.launches["symbol"].astype(str)))
    assert len(picked) == 5 and all("rms_norm" in names[s] for s in picked)
    one = select(dump, [], None, 1, 20)
    assert one == sorted(one) and len(one) > 100            # every launch of forward 1
    assert set(select(dump, [], "rms_norm", 1, 10**6)) <= set(one)
    # a call site: one launch per forward that runs it, the k-th launch of its symbol there
    site = [s for s in __import__("mining.analyze", fromlist=["x"]).document(dump_analysis(dump)).sites
            if "rms_norm" in s.symbol][1]
    at = select(dump, [], None, None, 10**6, site=site.site)
    assert len(at) == site.n_forwards and at == sorted(at) and all(site.symbol == names[s] for s in at)
    assert select(dump, [], None, 1, 20, site=site.site) == [s for s in at if s in set(one)]


@pytest.mark.parametrize("args, phrase", [
    (([-5], None, None), "no launch record with seq -5"),
    (([], "(", None), "is not a regular expression"),
    (([], "no_such_kernel_xyz", None), "matches --kernel"),
    (([], None, 999), "finds no forward 999"),
    (([], None, None), "say which launches"),
])
def test_bad_selections_are_one_usage_error(dump, args, phrase):
    with pytest.raises(UsageError, match=phrase):
        select(dump, *args, 20)


def test_an_unknown_site_is_one_usage_error(dump):
    with pytest.raises(UsageError, match="has no call site 'no_such_site#0'"):
        select(dump, [], None, None, 20, site="no_such_site#0")


def test_with_flow_fills_the_flow_section_of_the_analysis(dump, offline_document, tmp_path):
    doc = offline_document
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc.to_json()))
    seq = doc.passes.forwards[1].seqs[0][0]
    sym = dump.launches.set_index("seq").loc[seq, "symbol"]
    ok = LaunchResult(seq, str(sym), "ok", words=[WordFlow(0, 0, 0, 0, 64, 1, False, "", "out")])
    got = with_flow(dump, [ok, LaunchResult(seq + 1, "x", "fault")], path)
    assert got.source.launches == doc.source.launches
    assert [(w.site, w.i, w.direction, w.written_bytes, w.seq) for w in got.flow] == \
        [(f"{sym}#0", 0, "out", 64, seq)]  # the first launch of its symbol in forward 1: site 0
    other = json.loads(path.read_text())
    other["source"]["launches"] += 1
    path.write_text(json.dumps(other))
    with pytest.raises(UsageError, match="the analysis of another capture"):
        with_flow(dump, [ok], path)
