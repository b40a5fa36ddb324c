"""Inputs by provenance (compiler.requests, fills, inputs, input_fills): the host's copies and
host-mapped reads of each forward, named against the requests, onto the manifest's fills.

Real capture: q2b (batched vLLM, groups of 1, 8 and 32, with its copy log), whose copies and
host-mapped staging reads are matched against its truth. Known truth:
copy logs planted (tests/compiler/copyplant.py) into the dump simulator and into the q2e capture,
whose compiled manifest then carries the planted fills and passes kern's verification."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from paths import FIXTURES, ROOT

sys.path.insert(0, str(Path(__file__).parent))
import copyplant  # noqa: E402
from compiler import fills, input_fills, inputs
from compiler.errors import CompileError
from compiler.requests import Request, read_requests, steps
from kern_verdicts import kern_violations

Q2B = FIXTURES / "batched" / "q2b.tar.xz"
Q2B_TRUTH = FIXTURES / "batched" / "q2b.truth.json"


def _arr(v, dt="<i4") -> bytes:
    return np.asarray(v).astype(dt).tobytes()


# ------------------------------------------------------------------ requests: the step hypothesis
def test_steps_batch_a_group_and_chunk_to_the_budget():
    reqs = [Request((1, 2, 3), (7, 8, 9), 0), Request((4, 5), (6,), 0), Request((9,) * 5, (1, 2), 1)]
    st = steps(reqs, budget=4)
    # group 0: 3 + 1 prompt tokens (the second prompt cut), then the first decodes while the rest is fed
    assert [[(r.request, r.start, len(r.tokens)) for r in s.runs] for s in st[:3]] == [
        [(0, 0, 3), (1, 0, 1)], [(0, 3, 1), (1, 1, 1)], [(0, 4, 1)]]
    assert st[1].runs[0].tokens == (7,) and st[2].runs[0].tokens == (8,)
    # group 1 starts after group 0 finished; its prompt (5 tokens) is chunked to 4 + 1
    g1 = [s for s in st if any(r.request == 2 for r in s.runs)]
    assert [len(s.runs[0].tokens) for s in g1] == [4, 1, 1] and g1[-1].runs[0].start == 5
    assert all(s.tokens <= 4 for s in st)


def test_read_requests_refuses_a_file_without_requests(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"requests": []}))
    with pytest.raises(CompileError, match="holds no requests"):
        read_requests(p)
    p.write_text("{")
    with pytest.raises(CompileError, match="not a readable JSON"):
        read_requests(p)


# ------------------------------------------------------------------ fills: matching bytes
def _step(*runs):
    from compiler.requests import Run, Step
    return Step(0, tuple(Run(i, s, tuple(t)) for i, (s, t) in enumerate(runs)))


def test_match_names_each_serving_array_in_either_width_and_any_sequence_order():
    st = _step((0, [11, 12, 13, 14, 15]), (7, [99]), (3, [5, 6]))
    want = {"token": [99, 11, 12, 13, 14, 15, 5, 6], "position": [7, 0, 1, 2, 3, 4, 3, 4],
            "seq_len": [5, 8, 5], "cu_seqlens": [0, 5, 6, 8]}
    for fill, v in want.items():
        for dt, code in (("i32", "<i4"), ("i64", "<i8")):
            m = fills.match(_arr(v, code), st)
            assert m and m[0].fill == fill and m[0].dtype == dt and m[0].sure == "exact", (fill, dt, m)
    # slots: the engine's pages (not in any request), page 16
    pages = {0: [40], 1: [3], 2: [9]}
    slots = [pages[1][0] * 16 + 7] + [pages[0][0] * 16 + q for q in range(5)] + [pages[2][0] * 16 + q for q in (3, 4)]
    m = fills.match(_arr(slots, "<i8"), st)
    assert m[0].fill == "slot" and m[0].sure == "structure" and m[0].page in (8, 16)
    assert not fills.match(_arr([5, 1, 9, 2, 7, 3, 3, 1]), st)          # nothing it could be


def test_match_a_prefix_and_a_one_token_step_are_weak_where_they_should_be():
    st = _step((40, [5]))
    m = fills.match(_arr([40 * 16 + 40 % 16 + 160], "<i8"), st)          # one slot: any v with v % P right
    assert m and m[0].fill == "slot" and m[0].sure == "weak"
    many = _step(*[(10 + k, [500 + k]) for k in range(20)])
    offs = fills.match(_arr(list(range(1, 17))), many, prefix=True)      # a decode's end offsets: an arange
    assert offs and offs[0].fill == "cu_seqlens" and offs[0].sure == "weak"
    pre = _step((0, list(range(100, 107))), (0, list(range(200, 330))), (0, list(range(400, 530))))
    host = _arr([7, 137, 267, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5])     # a pinned buffer's first 64 B
    m = fills.match(host, pre, prefix=True)
    assert m[0].fill == "cu_seqlens" and m[0].sure == "exact" and m[0].prefix


def test_match_without_requests_names_only_offsets_by_structure():
    m = fills.match(_arr([0, 3, 3, 10]), None, tokens=10)
    assert [(x.fill, x.sure) for x in m] == [("cu_seqlens", "structure")]
    assert not fills.match(_arr([4, 9, 2]), None, tokens=10)


# ------------------------------------------------------------------ the simulator with a planted copy log
@lru_cache(maxsize=None)
def _sim(tmp: str):
    from dumpsim import INPUTS, IN_IDS, IN_POS, IN_SLOT, SimConfig, simulate
    from mining.analyze import analyze, document
    from mining.load import load_dump

    pid, _ = simulate(Path(tmp) / "sim", SimConfig(extra_pid=False))
    doc = document(analyze(load_dump(pid)))
    base = INPUTS[0]
    dst = {"token": base + IN_IDS, "position": base + IN_POS, "slot": base + IN_SLOT,
           "seq_len": base + 0x40000, "cu_seqlens": base + 0x50000, "blocks": base + 0x60000}
    reqs, at = copyplant.plant(pid, doc, dst, big=base + 0x70000)
    rf = copyplant.requests_file(Path(tmp) / "requests.json", reqs)
    dump = load_dump(pid, cache=False)
    return dump, doc, dst, at, read_requests(rf)


def test_planted_copies_are_tied_to_their_forward_readers_and_names(tmp_path_factory):
    dump, doc, dst, at, reqs = _sim(str(tmp_path_factory.mktemp("sim")))
    fwds = {f.forward: f for f in inputs.collect(dump, doc)}
    inputs.name(list(fwds.values()), reqs)
    by_dst = {v: k for k, v in dst.items()}
    named = 0
    for forward, r, k in at:
        fi = fwds[forward]
        copies = [a for a in fi.arrays if a.source == "copy"]
        assert len(copies) == len(dst) + 1 and all(a.where == "before" for a in copies)
        assert fi.step is not None and fi.step.runs[0].request == r
        for a in copies:
            if a.dst not in by_dst:                      # the planted copy over the byte limit
                assert a.data is None and not a.matches and "did not keep" in a.note
                continue
            want = by_dst[a.dst]
            m = a.named
            assert m is not None and m.fill == want, (forward, want, a.matches)
            named += 1
        ids = next(a for a in copies if a.dst == dst["token"])
        assert ids.readers and all(fi.first <= x.seq <= fi.last for x in ids.readers)   # the embedding reads it
    assert named == len(at) * len(dst)
    entries = input_fills.by_kind(list(fwds.values()))
    kinds = {(e.kind, e.fill()) for e in entries if e.fill()}
    assert {("prefill", ("token", "i32")), ("decode", ("token", "i32")), ("prefill", ("slot", "i64")),
            ("prefill", ("blocks", "i32"))} <= kinds
    text = "\n".join(input_fills.lines(entries))
    assert "not named" in text and "over MINE_CAPTURE_COPY_BYTES" in text


# ------------------------------------------------------------------ a real capture with a planted copy log: the manifest
def test_q2e_with_a_planted_copy_log_compiles_to_filled_inputs_kern_accepts(tmp_path):
    from compiler.compile import compile_capture
    from manifests.verify import verify
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(FIXTURES / "suite" / "q2e.tar.xz")
    doc = document(analyze(dump))
    plain = compile_capture(dump, doc, label="t")
    ins = sorted((d for d, b in plain.manifest["buffers"].items() if b["kind"] == "input"),
                 key=lambda n: -plain.provenance["declarations"][n]["bytes"])
    decl = plain.provenance["declarations"]
    order = ["token", "position", "slot", "seq_len", "cu_seqlens"]
    assert len(ins) >= len(order)
    dst = {fill: int(decl[n]["alloc_base"], 16) + decl[n]["alloc_offset"] for fill, n in zip(order, ins)}
    folder = tmp_path / "q2e"
    shutil.copytree(dump.source.parent, folder)
    reqs, _ = copyplant.plant(folder, doc, dst)
    rq = read_requests(copyplant.requests_file(tmp_path / "r.json", reqs))
    dump2 = load_dump(folder, cache=False)
    res = compile_capture(dump2, doc, label="t", requests=rq)
    m = res.manifest
    assert verify(m) == []
    # a named input is one buffer named for its fill (compiler.input_fills.merge)
    got = {f: m["buffers"].get(f, {}).get("fill") for f in order}
    assert got == {f: f for f in order}, res.provenance["inputs"]["manifest"]
    assert not set(ins[:len(order)]) & set(m["buffers"])
    for fill in order:
        assert m["buffers"][fill]["dtype"] == copyplant.DTYPE[fill].replace("<", "").replace("i4", "i32").replace("i8", "i64")
        assert res.provenance["inputs"]["manifest"][fill]["fill"] == fill
    rest = [n for n in ins[len(order):]]
    assert all("fill" not in m["buffers"][n] for n in rest)
    assert all(res.provenance["inputs"]["manifest"][n]["because"].startswith("no host-to-device copy") for n in rest)
    assert kern_violations(m, ".", tmp_path) == []


# ------------------------------------------------------------------ q2b: the real batched capture
@lru_cache(maxsize=None)
def _q2b():
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(Q2B)
    doc = document(analyze(dump))
    reqs = read_requests(Q2B_TRUTH)
    fwds = inputs.collect(dump, doc)
    inputs.name(fwds, reqs)
    return dump, doc, reqs, fwds


def test_q2b_steps_follow_its_truth_groups():
    _, _, reqs, _ = _q2b()
    truth = json.loads(Q2B_TRUTH.read_text())
    pre = [s for s in reqs.steps if len(s.runs) > 1 and all(r.start == 0 for r in s.runs)]
    assert [len(s.runs) for s in pre] == [g["size"] for g in truth["groups"] if g["size"] > 1]
    assert sum(len(s.runs) for s in reqs.steps) == sum(len(r["output"]) for g in truth["groups"] for r in g["requests"])


def test_q2b_host_mapped_reads_are_found_and_the_prefill_offsets_named():
    dump, doc, reqs, fwds = _q2b()
    serve = [f for f in fwds if f.phase == "serve" and f.tokens]
    # every serving forward's staging launches read pinned host memory the copy log cannot see
    assert all(any(a.source == "host" for a in f.arrays) for f in serve)
    host = [a for f in fwds for a in f.arrays if a.source == "host"]
    assert sum(a.data is not None for a in host) > len(host) // 2
    # the batched prompts' query end offsets sit in a host-mapped buffer: named against the truth
    hits = [(f, a) for f in fwds for a in f.arrays if a.named and a.named.fill == "cu_seqlens"
            and a.named.sure == "exact"]
    assert hits
    for f, a in hits:
        assert f.step is not None and len(f.step.runs) > 1 and f.step.prefill
        v = fills.arrays(a.data)[a.named.dtype][:len(f.step.runs)]
        left = [len(r.tokens) for r in f.step.runs]      # each difference is one prompt's length
        for d in np.diff(np.concatenate(([0], v))).tolist():
            left.remove(d)
    prefill_groups = {len(s.runs) for s in reqs.steps if len(s.runs) > 1 and s.prefill}
    assert {len(f.step.runs) for f, _ in hits} == prefill_groups


def test_q2b_copies_name_the_batched_prefill_inputs_against_the_truth():
    """q2b's copy log: each copy tied to one forward, and the batched prompts' token ids (and the
    sequence lengths) named exactly against the truth's prefill steps; the bytes the log did not
    keep are said so."""
    dump, doc, reqs, fwds = _q2b()
    assert dump.copies is not None and len(dump.copies)
    copies = [a for f in fwds for a in f.arrays if a.source == "copy"]
    ok = dump.copies[(dump.copies["result"] == 0) & ~dump.copies["in_graph"] & (dump.copies["size"] > 0)]
    assert len(copies) == len({a.seq for a in copies}) == len(ok)          # each copy in one forward
    toks = [(f, a) for f in fwds for a in f.arrays
            if a.source == "copy" and a.named and a.named.fill == "token" and a.named.sure == "exact"]
    assert toks and all(f.step.prefill and a.size == 4 * f.step.tokens for f, a in toks)
    assert any(len(f.step.runs) > 1 for f, _ in toks)                       # a batched prompt set
    big = [a for a in copies if a.size > 4096]
    assert big and all(a.data is None and "did not keep" in a.note for a in big)


def test_q2b_explain_inputs_cli(tmp_path):
    out = tmp_path / "x"
    r = subprocess.run([sys.executable, "-m", "mine.cli", "compile", str(Q2B), "-o", str(out), "--explain-inputs",
                        "--requests", str(Q2B_TRUTH)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "a copy log" in r.stdout and "decode:" in r.stdout and "prefill:" in r.stdout
    assert "cu_seqlens i32" in r.stdout and "copy to alloc" in r.stdout
    doc = json.loads((out / "inputs.json").read_text())
    assert any(e["fill"] == "cu_seqlens" for e in doc["by_kind"])
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    r = subprocess.run([sys.executable, "-m", "mine.cli", "compile", str(Q2B), "-o", str(tmp_path / "y"),
                        "--explain-inputs", "--requests", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "holds no requests" in r.stderr and "Traceback" not in r.stderr


def test_replayed_bytes_are_the_ones_current_at_the_programs_first_reader():
    """Of an address's contents records in a forward, `add_replayed` takes the one current at the
    first launch of the program that passes it: the staging kernels before it (left out of the
    program) wrote the forward's values over the previous step's."""
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from vocab import contents as C

    dump = load_dump(FIXTURES / "replay" / "q2r.tar.xz")
    doc = document(analyze(dump))
    fwds = inputs.collect(dump, doc)
    fi = next(f for f in fwds if f.tokens == 1 and f.phase == "serve")
    P = dump.params
    P = P[P["is_ptr"] & (P["seq"] >= fi.first) & (P["seq"] <= fi.last)]
    addr = int(P["value"].astype("uint64").iloc[len(P) // 2])
    seqs = sorted(int(s) for s in P[P["value"].astype("uint64") == addr]["seq"])
    if len(seqs) < 2:
        seqs = [fi.first] + seqs
    stale, fresh = seqs[0], seqs[-1]
    words = [C.Word(fi.first, stale, 0, 0, addr, b"\x01" * 8), C.Word(fi.first, fresh, 0, 0, addr, b"\x02" * 8)]
    contents = C.Contents(len(dump.launches), (fi.first, fi.last), 8, words)

    def got(kept):
        fs = inputs.collect(dump, doc)
        inputs.add_replayed(dump, fs, contents, kept)
        f = next(x for x in fs if x.forward == fi.forward)
        return [a.data for a in f.arrays if a.source == "replay" and a.dst == addr]

    assert got(None) == [b"\x01" * 8]                          # no program known: the first record
    assert got({fi.forward: {fresh}}) == [b"\x02" * 8]         # the reader is the later launch
    assert got({fi.forward: {stale}}) == [b"\x01" * 8]
