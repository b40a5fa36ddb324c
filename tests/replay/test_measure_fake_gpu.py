"""`replay.forward.measure_in_context` against a CPU model of the device (tests/helpers/cpugpu.py):
the read and write sets of launches whose behaviour is known, what crosses the bus, and that the
device-side compare (`Gpu.diff`) measures exactly what a host compare of whole regions measures.
Why: the measurement runs one launch dozens of times; it once re-sent and re-downloaded every
region each run, and a KV pool or an allocator segment of tens of MiB made that most of a
replay's time. What moving only the changes must not change is what is measured."""

from __future__ import annotations

import numpy as np
import pytest
from cpugpu import CpuGpu

from replay.forward import measure_in_context
from replay.gpu import CudaError
from replay.plan import LaunchPlan, PtrWord, Region
from replay.run import Faulted


def _copy_plus_one(dev, params, grid, block):
    """Reads 8 bytes through param 0 and writes them, plus one, through param 1."""
    src, dst = dev.ptr(params, 0), dev.ptr(params, 1)
    dev.write(dst, dev.read(src, 8) + 1)


def _plan(lengths, words, indirect=()) -> LaunchPlan:
    """Regions of these lengths; words (region, offset), one 8-byte param each."""
    regions = [Region(1 + k, 0x10000000 * (k + 1), n + (1 << 16), 0, n, False) for k, n in enumerate(lengths)]
    ws = [PtrWord(k, 0, 8 * k, r, off, regions[r].alloc_base + off) for k, (r, off) in enumerate(words)]
    params = [(regions[r].alloc_base + off).to_bytes(8, "little") for r, off in words]
    return LaunchPlan(7, "k", "0" * 64, None, (1, 1, 1), (32, 1, 1), 0, None, {}, params,
                      [8 * k for k in range(len(words))], ws, [], regions, indirect=list(indirect))


def _full(init, changes):
    out = []
    for b, ch in zip(init, changes):
        x = b.copy()
        for lo, d in ch:
            x[lo:lo + len(d)] = d
        out.append(x)
    return out


@pytest.mark.parametrize("with_diff", [True, False])
def test_directions_of_a_known_launch_and_the_big_region_sent_once(with_diff):
    big = 1 << 20
    plan = _plan([64, 64, big], [(0, 0), (1, 0), (2, 0)])
    rng = np.random.default_rng(3)
    init = [rng.integers(0, 255, 64, dtype=np.uint8), np.zeros(64, np.uint8), rng.integers(0, 255, big, dtype=np.uint8)]
    dev = CpuGpu(lambda d, p, g, b: _copy_plus_one(d, p[:2], g, b), with_diff)
    res, changes = measure_in_context(dev, plan, init, True)
    assert res.deterministic
    assert {w.i: w.direction for w in res.words} == {0: "in", 1: "out", 2: "unused"}
    assert res.words[1].written_bytes == 8 and res.words[0].written_bytes == 0
    after = _full(init, changes)
    assert np.array_equal(after[1][:8], init[0][:8] + 1)
    assert np.array_equal(after[0], init[0]) and np.array_equal(after[2], init[2])
    # eleven runs: baseline, determinism check, word 0's span poisoned once (read at the first
    # poison), words 1 and 2 four times each (no poison shows a read). The output region is
    # written by every run, so its changed bytes are sent back every run; the input region where
    # its fill changed (the baseline, its poisoned run, the run after it); the large unused region
    # for the baseline and its own four poisoned fills (its span is all of it)
    r0, r1, r2 = (dev.uploads[b] for b in sorted(dev.uploads))
    assert (r0, r1, r2) == (3, 11, 5)
    if with_diff:
        # the device compares: of 11 runs over 1 MiB + 128 bytes only the output's chunk comes back
        assert dev.downloaded == 11 * 64
    else:
        assert dev.downloaded == 11 * (big + 128)


def _gather_kernel(dev, params, grid, block, bound=1 << 40):
    """idx = u64 at param 0 (a fault when above `bound`, as Inductor's index asserts: 2^40 stands
    for any table of 16 rows or more); writes the 8 bytes at param 1 + 8 * (idx % 32), plus one,
    at param 2 + 16 * (idx % 4); with four params, the sum of 64 bytes at param 3 at param 2 +
    1500 (a write past the next word's offset when words share a region)."""
    ps = [dev.ptr(params, k) for k in range(len(params))]
    v = int(dev.read(ps[0], 8).view("<u8")[0])
    if v > bound:
        raise CudaError("cuCtxSynchronize", "CUDA_ERROR_ASSERT", True)
    src = dev.read(ps[1] + 8 * (v % 32), 8).copy()
    dev.write(ps[2] + 16 * (v % 4), ((src.astype(np.uint16) + 1) & 255).astype(np.uint8))
    if len(ps) > 3:
        s = int(dev.read(ps[3], 64).astype(np.uint64).sum())
        dev.write(ps[2] + 1500, np.frombuffer(s.to_bytes(8, "little"), np.uint8))


def _measured(plan, init, kernel, with_diff, nonzero=None, faults=None):
    """As `replay.forward._run_job`: a poisoned span's fault ends the device, the launch is measured
    again on a fresh one with that span counted as read (`faults`: a list the faulted spans go to)."""
    faulted: set = set()
    while True:
        dev = CpuGpu(kernel, with_diff)
        try:
            res, changes = measure_in_context(dev, plan, [x.copy() for x in init], True, faulted=frozenset(faulted),
                                              nonzero=nonzero)
            if faults is not None:
                faults.extend(sorted(faulted))
            return res, _full(init, changes), dev
        except Faulted as f:
            assert f.span is not None and f.span not in faulted, "the baseline itself faulted"
            faulted.add(f.span)


@pytest.mark.parametrize("bound,read_by", [(1 << 40, "output"), (1 << 16, "output"), (3, "fault")])
def test_an_index_read_shows_by_output_inside_its_table_and_as_a_fault_past_it(bound, read_by):
    """The first poison keeps every 8-byte word below 16: an index into a table of 16 rows or more
    (a vocabulary, a rope cache) stays in range, so its read shows in the output and the device
    is never lost to an assert (each loss is a new worker and the launch measured again). An
    index whose table is smaller still trips the assert, and the fault counts as its read. The
    output stays `out`: the poisoned index moved the write, but the output's own poisoned run is
    judged on its writes and the baseline's, not on the moved write's bytes."""
    from functools import partial

    n = 8192
    plan = _plan([n, n, n], [(0, 0), (1, 0), (2, 256)])
    init = [np.zeros(n, np.uint8), np.arange(n, dtype=np.uint64).astype(np.uint8)[:n], np.zeros(n, np.uint8)]
    init[0][0] = 2
    faults: list = []
    res, after, _ = _measured(plan, init, partial(_gather_kernel, bound=bound), True, faults=faults)
    got = {w.i: (w.direction, w.read_by) for w in res.words}
    assert got[0] == ("in", read_by)
    assert len(faults) == (read_by == "fault")
    assert got[1] == ("in", "output")
    assert got[2][0] == "out"
    v = 2
    assert np.array_equal(after[2][256 + 16 * (v % 4):256 + 16 * (v % 4) + 8], init[1][8 * v:8 * v + 8] + 1)


def test_words_sharing_a_region_keep_their_own_writes():
    """Params 2 and 3 point into one region, 3 below 2's write at +1500: the private copies give
    the write to param 2 alone, and param 3 is read only."""
    n = 65536
    plan = _plan([4096, 4096, n], [(0, 0), (1, 0), (2, 1024), (2, 2048)])
    rng = np.random.default_rng(5)
    init = [np.zeros(4096, np.uint8), rng.integers(0, 255, 4096, dtype=np.uint8), rng.integers(0, 255, n, dtype=np.uint8)]
    res, after, _ = _measured(plan, init, _gather_kernel, True)
    w2, w3 = res.words[2], res.words[3]
    assert w2.shared and w3.shared
    assert w2.direction == "out" and w2.written_bytes == 8 + 8 - int(np.sum(after[2][2524:2532] == init[2][2524:2532]))
    assert w3.direction == "in" and w3.written_bytes == 0
    # written_at is from the word's own address: its first 8 bytes, and +1500
    assert w2.written_at[0][0] == 0 and w2.written_at[-1][1] <= 1508


def test_a_loaded_pointer_reaches_the_fresh_region_and_reads_back_as_captured():
    """Region 0 holds at 64 the captured address of region 1 + 128 (a block table's pointer): the
    kernel follows it and writes there; memory after keeps the captured address."""
    plan = _plan([4096, 4096], [(0, 0), (1, 0)])
    cap = plan.regions[1].alloc_base + 128
    plan.indirect.append((0, 64, 1, 128, cap))
    init = [np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)]
    init[0][64:72] = np.frombuffer(cap.to_bytes(8, "little"), np.uint8)

    def follow(dev, params, grid, block):
        table = dev.ptr(params, 0)
        p = int(dev.read(table + 64, 8).view("<u8")[0])
        dev.write(p, np.full(8, 9, np.uint8))

    for with_diff in (True, False):
        res, after, _ = _measured(plan, init, follow, with_diff)
        assert np.array_equal(after[0], init[0])
        assert (after[1][128:136] == 9).all() and after[1][:128].sum() == 0
        # the table's word reads as unused: the loaded pointer is rebased over any poison, so its
        # read cannot show, and nothing else of the table is read
        assert {w.i: w.direction for w in res.words} == {0: "unused", 1: "out"}


def _random_case(seed):
    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 4))
    lengths = [int(rng.choice([4096, 8192, 70000, 300000])) for _ in range(R)]
    words = []
    for k in range(int(rng.integers(3, 7))):
        r = int(rng.integers(0, R))
        off = int(rng.integers(0, (lengths[r] - 2048) // 8)) * 8 if rng.random() < 0.7 else 0
        words.append((r, off))
    init = []
    for n in lengths:
        kind = rng.integers(0, 3)
        init.append(np.zeros(n, np.uint8) if kind == 0 else rng.integers(0, 4 if kind == 1 else 256, n, dtype=np.uint8))
    return _plan(lengths, words), init


@pytest.mark.parametrize("seed", range(24))
def test_device_compare_measures_what_a_host_compare_does(seed):
    plan, init = _random_case(seed)
    try:
        on_dev = _measured(plan, init, _gather_kernel, True)
    except AssertionError:
        with pytest.raises(AssertionError):
            _measured(plan, init, _gather_kernel, False)
        return
    on_host = _measured(plan, init, _gather_kernel, False)
    assert on_dev[0].words == on_host[0].words
    assert on_dev[0].bytes_written == on_host[0].bytes_written
    assert all(np.array_equal(a, b) for a, b in zip(on_dev[1], on_host[1]))
    assert on_dev[2].downloaded < on_host[2].downloaded


def test_memory_present_and_the_packed_job_round_trip():
    from replay.forward import _packed, _unpacked
    from replay.memory import PAGE, Memory

    mem = Memory()
    base = 0x7F0000000000
    mem.write(base + 3 * PAGE + 100, b"abc")
    mem.write(base + 4 * PAGE + 5, b"d")            # the next page: one range with the one before
    mem.write(base + 9 * PAGE + PAGE - 1, b"ef")    # straddles pages 9 and 10
    n = 12 * PAGE
    assert mem.present(base, n) == [(3 * PAGE, 5 * PAGE), (9 * PAGE, 11 * PAGE)]
    assert mem.present(base + 3 * PAGE + 50, 60) == [(0, 60)]
    assert mem.present(base, 3 * PAGE) == []
    init = [mem.read(base, n), mem.read(base + 9 * PAGE, 100)]
    job = _packed(init, [mem.present(base, n), mem.present(base + 9 * PAGE, 100)])
    assert sum(len(d) for _n, parts in job for _lo, d in parts) == 4 * PAGE + 100
    back, nonzero = _unpacked(job)
    assert all(np.array_equal(x, y) for x, y in zip(init, back))
    assert nonzero[0] == [(3 * PAGE, 5 * PAGE), (9 * PAGE, 11 * PAGE)]


@pytest.mark.parametrize("with_diff", [True, False])
def test_a_mostly_zero_region_is_zeroed_and_only_its_written_pages_sent(with_diff):
    """The same measurement with and without the regions' non-zero ranges; with them, a 4 MiB
    region of which one 64 KiB page holds data costs its page, not its size."""
    big = 4 << 20
    plan = _plan([4096, 4096, big], [(0, 0), (1, 0), (2, 0), (2, 1 << 20)])
    rng = np.random.default_rng(2)
    init = [np.zeros(4096, np.uint8), rng.integers(0, 255, 4096, dtype=np.uint8), np.zeros(big, np.uint8)]
    init[0][0] = 3
    init[2][(1 << 20):(1 << 20) + 65536] = rng.integers(0, 255, 65536, dtype=np.uint8)
    nonzero = [[(0, 4096)], [(0, 4096)], [((1 << 20), (1 << 20) + 65536)]]
    runs = {}
    for hint in (None, nonzero):
        runs[hint is None] = _measured(plan, init, _gather_kernel, with_diff, hint)
    (a, fa, da), (b, fb, db) = runs[True], runs[False]
    assert a.words == b.words and all(np.array_equal(x, y) for x, y in zip(fa, fb))
    assert db.uploaded < da.uploaded
    # the shared region's private copies and poisons are sent whole either way; the first upload
    # of the region itself (the baseline's) is its one page
    assert da.uploaded - db.uploaded >= big - 65536
