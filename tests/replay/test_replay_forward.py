"""`replay.memory` and `replay.forward`'s window on the CPU: memory rebuilt in capture order.

The GPU half (each launch run on the rebuilt bytes) is tests/replay/test_replay_gpu.py; here a CPU
model of a launch stands in for the device, so what is tested is the bookkeeping that decides
what a kernel sees: the host's writes applied before the launch they precede, each launch's output
written back for the next, launches without a cubin left out and said, the window's start. On
q2b (vLLM eager serving batches, copy log and pinned host staging) and a planted dump.
"""

from __future__ import annotations

import numpy as np
import pytest

from mining.load import load_dump
from replay.forward import _private, _shared, replay_forward
from replay.memory import PAGE, HostWrite, Memory, copy_writes, pointee_writes, timeline
from replay.run import LaunchResult
from replay.select import forward_seqs, warm_start
from paths import FIXTURES


@pytest.fixture(scope="module")
def q2b():
    return load_dump(FIXTURES / "batched" / "q2b.tar.xz", cache=False)


def test_memory_reads_zero_until_written_and_across_pages():
    m = Memory()
    assert not m.read(PAGE - 3, 8).any()
    m.write(PAGE - 3, bytes(range(1, 9)))
    assert m.read(PAGE - 3, 8).tolist() == list(range(1, 9))
    assert m.read(PAGE - 5, 4).tolist() == [0, 0, 1, 2]
    assert len(m.pages) == 2
    before = m.read(0, 4 * PAGE)
    after = before.copy()
    after[3 * PAGE + 7] = 9
    assert m.write_changed(0, before, after) == 1
    assert len(m.pages) == 3            # only the page that changed was created
    assert m.read(3 * PAGE + 7, 1)[0] == 9


def test_host_writes_in_launch_order_copies_before_pointees(q2b):
    cw, unknown = copy_writes(q2b.copies)
    C = q2b.copies
    with_bytes = int(((C["result"] == 0) & ~C["in_graph"] & C["has_bytes"] & (C["size"] > 0)).sum())
    assert len(cw) == with_bytes and unknown == int(((C["result"] == 0) & ~C["in_graph"] & ~C["has_bytes"]).sum())
    pw = pointee_writes({(10, 0, 0): (0x7000, b"ab"), (5, 1, 8): (0x7100, b"c"), (7, 2, 0): (0x7200, b"")})
    t = timeline(cw + pw + [HostWrite(10, 3, 0x9000, b"z", "copy")])
    keys = [(w.seq_before, w.order) for w in t]
    assert keys == sorted(keys)
    assert [w.source for w in t if w.seq_before == 10][-1] == "pointee"   # after that launch's copies
    assert all(w.data for w in t)   # an empty pointee is no write


def _echo_runner(log):
    """A CPU launch: records what it was given, writes (seq & 255) at its first region's start."""
    def run(plan, init, measure):
        log.append((plan, [x.copy() for x in init], measure))
        after = [x.copy() for x in init]
        after[0][0] = plan.seq & 255
        return LaunchResult(plan.seq, plan.symbol, "ok", fill="forward"), after
    return run


def test_window_applies_copies_before_their_launch_and_writes_back(q2b):
    from mining.analyze import analyze, document

    f = [f for f in document(analyze(q2b)).serve_forwards() if f.tokens == 1][0]
    targets = forward_seqs(q2b, f.forward)
    start = warm_start(q2b, f.forward)
    assert start < targets[0]
    log = []
    fr = replay_forward(q2b, targets, start, runner=_echo_runner(log))
    assert fr.window == (start, targets[-1])
    ran = [p.seq for p, _, _ in log]
    assert ran == sorted(ran) and len(ran) == fr.ran
    assert {s for s, _ in fr.skipped} | set(ran) | set(fr.on_host) == {s for s in q2b.launches["seq"]
                                                                       if start <= s <= targets[-1]}
    assert fr.on_host and not set(fr.on_host) & (set(ran) | {s for s, _ in fr.skipped})
    assert all("cubin" in why or "layout" in why for _, why in fr.skipped)
    assert [r.seq for r in fr.results] == targets
    # q2b's copy log kept vLLM's 4,100-byte query-offset copies without bytes: said, not hidden
    assert fr.blind and any("without their bytes" in w for w in fr.warnings)
    assert all(m == (p.seq in set(targets)) for p, _, m in log)
    # the bytes of the newest copy before a launch are what the launch is given, except a byte a
    # launch of the window wrote since (the CPU model writes each launch's first region's byte 0)
    cw = timeline(copy_writes(q2b.copies)[0])
    from replay.host_gemm import find
    gemm_out = [g for s, g in find(q2b, sorted(set(fr.on_host))).items() if s == g.seq]
    marks = [(q.seq, q.regions[0].alloc_base + q.regions[0].start) for q, _, _ in log]
    checked = 0
    for p, init, _ in log:
        for k, r in enumerate(p.regions):
            lo = r.alloc_base + r.start
            for n, w in enumerate(cw):
                if not (w.seq_before <= p.seq and lo <= w.addr and w.addr + len(w.data) <= lo + r.length):
                    continue
                if any(x.seq_before <= p.seq and x.addr < w.addr + len(w.data) and w.addr < x.addr + len(x.data)
                       for x in cw[n + 1:]):
                    continue          # a newer copy overwrote some of it
                want = np.frombuffer(w.data, np.uint8).copy()
                got = init[k][w.addr - lo:w.addr - lo + len(w.data)]
                hit = [a - w.addr for sq, a in marks if sq < p.seq and w.addr <= a < w.addr + len(w.data)]
                keep = np.ones(len(want), bool)
                keep[hit] = False
                for g in gemm_out:          # and the GEMMs computed on the host since the copy
                    if w.seq_before <= g.seq < p.seq:
                        a, b = max(g.c, w.addr), min(g.c + g.m * g.n * 2, w.addr + len(w.data))
                        if a < b:
                            keep[a - w.addr:b - w.addr] = False
                assert np.array_equal(got[keep], want[keep]), (p.seq, hex(w.addr))
                checked += 1
    assert checked > 0
    # write-back: a launch whose first region starts where an earlier one's did sees its marker
    seen = 0
    for n, (p, init, _) in enumerate(log):
        a = p.regions[0].alloc_base + p.regions[0].start
        prev = [q for q, _, _ in log[:n] if q.regions[0].alloc_base + q.regions[0].start == a]
        if prev and not any(w.seq_before > prev[-1].seq and w.seq_before <= p.seq and w.addr == a for w in cw):
            assert init[0][0] == prev[-1].seq & 255
            seen += 1
    assert seen > 0


def test_private_copy_moves_one_word_only(q2b):
    from replay.plan import REGION_ALIGN, plan_launch

    L = q2b.launches
    seq = int(L.loc[L["symbol"].astype(str).str.contains("reshape_and_cache"), "seq"].iloc[0])
    p = plan_launch(q2b, seq)
    sh = _shared(p)
    kv = [k for k, w in enumerate(p.words) if w.i in (2, 3)]
    assert len(kv) == 2 and all(sh[k] for k in kv)      # K and V caches interleave in one allocation
    q, cut = _private(p, kv[0])
    w, g = p.words[kv[0]], p.regions[p.words[kv[0]].region]
    # the copy starts at the word's offset rounded down to REGION_ALIGN and ends where the region does
    assert cut == w.offset // REGION_ALIGN * REGION_ALIGN
    assert len(q.regions) == len(p.regions) + 1
    assert (q.regions[-1].start, q.regions[-1].start + q.regions[-1].length) == (g.start + cut, g.start + g.length)
    assert q.words[kv[0]].region == len(p.regions) and q.words[kv[0]].offset == w.offset - cut
    assert q.regions[-1].alloc_base + q.regions[-1].start + q.words[kv[0]].offset == w.captured
    assert [w for k, w in enumerate(q.words) if k != kv[0]] == [w for k, w in enumerate(p.words) if k != kv[0]]


def test_warm_start_is_before_the_latest_prefill(q2b):
    from mining.analyze import analyze, document

    fw = sorted((f for f in document(analyze(q2b)).passes.forwards if f.n_launches), key=lambda f: f.first_seq)
    for k in (3, 4, 9, len(fw) - 1):
        s = warm_start(q2b, fw[k].forward)
        pre = [n for n in range(k + 1) if (fw[n].tokens or 0) > 1]
        assert s == fw[max((pre[-1] if pre else k) - 1, 0)].first_seq


@pytest.mark.parametrize("measured,written,span,persistent,want", [
    ("unused", 0, 64, False, {"in", "out"}), ("out", 64, 64, True, {"out"}), ("out", 8, 64, True, {"inout"}),
    ("out", 8, 64, False, {"out"}), ("inout", 8, 64, True, {"inout"}), ("in", 0, 64, True, {"in"}),
    ("out?", 8, 64, True, None)])
def test_kern_directions(measured, written, span, persistent, want):
    from vocab.analysis import kern_directions

    got = kern_directions(measured, written, span, persistent)
    assert (got is None and want is None) or got == frozenset(want)


def test_loaded_pointers_are_found_and_get_a_region():
    """A table of buffer addresses in a region's bytes (vLLM's block-table pointers) becomes
    `indirect` words with a region for their target; random data and small integers do not."""
    from replay.forward import allocations, find_tables
    from replay.plan import plan_launch

    d = load_dump(FIXTURES / "replay" / "q2r.tar.xz", cache=False)
    L = d.launches
    seq = int(L.loc[L["symbol"].astype(str).str.contains("rms_norm_kernel"), "seq"].iloc[0])
    p = plan_launch(d, seq)
    bases, sizes, ids = allocations(d)
    mine = {r.buffer_id for r in p.regions}
    other = next(k for k, b in enumerate(ids) if int(b) not in mine and sizes[k] >= 4096)
    k = next(k for k, r in enumerate(p.regions) if not r.host and 64 <= r.length <= 4 << 20)
    rng = np.random.default_rng(3)
    init = [rng.integers(0, 2**16, r.length // 2, dtype=np.uint16).view(np.uint8).copy()
            if r.length % 2 == 0 else np.zeros(r.length, np.uint8) for r in p.regions]
    q, _ = find_tables(p, init, (bases, sizes, ids), 1 << 20, Memory())
    assert q.indirect == [] and len(q.regions) == len(p.regions)
    target = int(bases[other]) + 4096
    init[k][40:48] = np.frombuffer(target.to_bytes(8, "little"), np.uint8)
    q, init2 = find_tables(p, init, (bases, sizes, ids), 1 << 20, Memory())
    assert len(q.regions) == len(p.regions) + 1 and q.regions[-1].buffer_id == int(ids[other])
    (r, off, tk, toff, cap), = q.indirect
    assert (r, off, tk, cap) == (k, 40, len(p.regions), target)
    assert q.regions[tk].start + toff == 4096 and len(init2) == len(q.regions)


def test_a_capture_without_a_copy_log_is_said(offline_dump):
    """The bundled capture predates the copy log: an in-order replay warns that metadata is zeros."""
    from mining.analyze import analyze, document

    f = [f for f in document(analyze(offline_dump)).serve_forwards() if f.tokens == 1][0]
    seqs = forward_seqs(offline_dump, f.forward)[:3]
    fr = replay_forward(offline_dump, seqs, runner=_echo_runner([]))
    assert any("no copy log" in w for w in fr.warnings) and fr.blind == []


def test_contents_record_each_address_at_its_first_launch_and_at_each_change(q2b, tmp_path):
    """`spans` + `contents_bytes`: every device address a forward's launches pass is recorded at
    its first launch, and again before each later launch of the forward that passes it and finds
    other bytes (the echo model writes each launch's first region's byte 0, as a staging kernel
    writes what the layers then read), with at most the limit of bytes as memory held them before
    that launch; the file round-trips through vocab.contents and a file of another shape is one
    sentence."""
    from mining.analyze import analyze, document
    from vocab import contents as C
    from vocab.errors import UsageError

    fw = sorted((f for f in document(analyze(q2b)).passes.forwards if f.n_launches), key=lambda f: f.first_seq)
    f = [x for x in fw if x.phase == "serve" and x.tokens == 1][0]
    spans = [(x.first_seq, x.last_seq) for x in fw]
    targets = forward_seqs(q2b, f.forward)
    fr = replay_forward(q2b, targets, warm_start(q2b, f.forward), runner=_echo_runner([]), spans=spans,
                        contents_bytes=256)
    assert fr.contents
    keys = [(w.forward, w.addr, w.seq) for w in fr.contents]
    assert len(keys) == len(set(keys))
    assert all(0 < len(w.data) <= 256 for w in fr.contents)
    assert {w.forward for w in fr.contents} <= {a for a, _ in spans}
    P = q2b.params
    by: dict = {}
    for w in fr.contents:
        by.setdefault((w.forward, w.addr), []).append(w)
    again = 0
    for (span, addr), recs in by.items():
        a, b = next(s for s in spans if s[0] == span)
        first = recs[0]                                        # the first launch of its forward to pass it
        hits = P[(P["seq"] >= a) & (P["seq"] <= first.seq) & P["is_ptr"] & (P["value"].astype("uint64") == addr)]
        assert int(hits["seq"].min()) == first.seq
        for x, y in zip(recs, recs[1:]):                       # a later record: other bytes, a later launch
            assert y.seq > x.seq and y.data[:len(x.data)] != x.data[:len(y.data)]
            again += 1
    assert again > 0
    doc = C.Contents(len(q2b.launches), fr.window, 256, fr.contents)
    p = tmp_path / "c.json"
    p.write_text(__import__("json").dumps(doc.to_json()))
    back = C.read(p)
    assert back.words == fr.contents and back.launches == len(q2b.launches)
    p.write_text('{"format": "other"}')
    with pytest.raises(UsageError, match="not a mine-replay-contents/1 file"):
        C.read(p)


# -- cuBLASLt GEMMs computed on the host (replay.host_gemm) --------------------------------------

def test_bf16_round_trip_and_rounding():
    from replay.host_gemm import to_bf16, to_f32

    v = np.array([1.0, -2.5, 3.140625, 1e-3, 65504.0, np.inf, -0.0], np.float32)
    back = to_f32(to_bf16(v))
    assert back[0] == 1.0 and back[1] == -2.5 and back[2] == 3.140625 and np.isinf(back[5])
    assert abs(back[3] - 1e-3) <= 1e-3 * 2 ** -8
    # nearest even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and rounds to 1 (even mantissa)
    assert to_f32(to_bf16(np.array([1 + 2 ** -8], np.float32)))[0] == 1.0
    assert to_f32(to_bf16(np.array([1 + 3 * 2 ** -8], np.float32)))[0] == 1 + 2 ** -6
    assert np.isnan(to_f32(to_bf16(np.array([np.nan], np.float32))))[0]


def test_host_gemm_is_x_times_w_transposed_in_bf16():
    from replay.host_gemm import HostGemm, run, to_bf16, to_f32

    rng = np.random.default_rng(3)
    m, n, k = 3, 5, 7
    x = to_f32(to_bf16(rng.standard_normal((m, k)).astype(np.float32)))
    w = to_f32(to_bf16(rng.standard_normal((n, k)).astype(np.float32)))
    mem = Memory()
    mem.write(0x10000, to_bf16(x).tobytes())
    mem.write(0x20000 + PAGE - 6, to_bf16(w).tobytes())          # across a page
    run(HostGemm(1, None, 0x10000, 0x20000 + PAGE - 6, 0x50000, m, n, k), mem)
    c = to_f32(mem.read(0x50000, m * n * 2)).reshape(m, n)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.allclose(c, want, rtol=2 ** -7, atol=1e-6)
    assert not mem.read(0x50000 + m * n * 2, 16).any()           # nothing past C


def test_real_capture_gemms_are_found_with_their_split_k(q2b):
    """q2b's cuBLASLt launches (nvjet, some with splitKreduce): each reads as a GEMM whose operands
    are the launch's own words; a reduction maps to the GEMM before it."""
    from replay.host_gemm import find

    seqs = q2b.launches["seq"].tolist()
    found = find(q2b, seqs)
    syms = dict(zip(seqs, q2b.launches["symbol"].astype(str).tolist()))
    mains = {g.seq for g in found.values()}
    assert len(mains) > 50 and all("nvjet" in syms[s] for s in mains)
    for s, g in found.items():
        assert g.m >= 1 and g.n >= 1 and g.k >= 1 and len({g.x, g.w, g.c}) == 3
        if s != g.seq:
            assert g.aux == s and "splitKreduce" in syms[s]


@pytest.fixture(scope="module")
def q3w():
    from mining.analyze import analyze
    from mining.load import load_dump

    d = load_dump(FIXTURES / "compile" / "q3w.tar.xz", cache=False)
    return d, analyze(d)


def test_a_graph_replay_runs_where_the_host_launched_it(q3w):
    """q3w (vLLM default mode): each decode step replays the decode graph captured at start-up.
    In execution order its kernels run after the step's live staging launches and before its
    sampling, once per replay; every forward's contents are recorded under its first live launch
    (compiler.inputs ties them by that id). Not checked here: what the kernels compute on the
    rebuilt bytes (a GPU run)."""
    from mining.analyze import document
    from replay.forward import executed_window
    from replay.select import warm_forward

    d, a = q3w
    doc = document(a)
    f = [x for x in doc.passes.forwards if x.phase == "serve" and x.tokens == 1 and x.graph_execs][2]
    win = executed_window(a.passes.executed, warm_forward(d, f.forward, doc), [f.forward])
    E = a.passes.executed
    mine = E[E["forward"] == f.forward]
    assert [win.seqs[k] for k in sorted(win.targets)] == mine["seq"].tolist()
    assert not all(win.live) and not all(win.live[k] for k in win.targets)
    seen = []

    def run(plan, init, measure):
        seen.append((plan.seq, measure))
        return LaunchResult(plan.seq, plan.symbol, "ok", fill="forward"), [x.copy() for x in init]

    fr = replay_forward(d, [], window=win, runner=run, contents_bytes=64)
    assert len(fr.results) == len(win.targets)
    ran = [s for s, _ in seen]
    # the target's graph kernels ran after its first live launch and before its last
    live = [win.seqs[k] for k in sorted(win.targets) if win.live[k]]
    nodes = [win.seqs[k] for k in sorted(win.targets) if not win.live[k]]
    pos = {s: i for i, s in enumerate(ran) if s in set(live) | set(nodes)}
    ran_nodes = [pos[s] for s in nodes if s in pos]
    assert ran_nodes and pos[live[0]] < min(ran_nodes) and max(ran_nodes) < pos[live[-1]]
    # a graph kernel's seq repeats in the window: it ran at every replay in it
    assert len(ran) > len(set(ran))
    ids = {sid for _, _, sid in win.spans}
    assert {w.forward for w in fr.contents} <= ids and min(live) in ids
