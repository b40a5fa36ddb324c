"""`replay.plan` and `replay.flow` on committed real captures and hand-made snapshots (CPU).

The probe capture's launches are the hard ABI cases (tests/fixtures/capture, written by
examples/capture_probe): a by-value struct holding three device pointers, a host-pointer scalar,
a TMA descriptor passed by value, a cluster launch. The plan must put every pointer word on a
fresh region at its captured offset and leave everything else byte for byte.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from mining.load import load_dump
from replay import flow as FL
from replay.plan import REGION_ALIGN, PlanError, plan_launch, rebased
from paths import FIXTURES

FIX = FIXTURES


@pytest.fixture(scope="module")
def probe():
    return load_dump(FIX / "capture" / "probe.tar.xz", cache=False)


@pytest.fixture(scope="module")
def vllm(offline_dump):
    return offline_dump   # the session's (tests/conftest.py)


def by_symbol(dump, needle):
    L = dump.launches
    return int(L.loc[L["symbol"].astype(str).str.contains(needle), "seq"].iloc[0])


def test_every_pointer_word_is_rebased_and_nothing_else(probe):
    for seq in probe.launches["seq"].tolist()[:10]:
        plan = plan_launch(probe, seq)
        assert plan.missing is None, plan.missing
        bases = [0x7F0000000000 + k * (1 << 32) for k in range(len(plan.regions))]
        new = rebased(plan, bases)
        moved = set()
        for w in plan.words:
            got = struct.unpack_from("<Q", new[w.i], w.at)[0]
            r = plan.regions[w.region]
            # the same offset into the same allocation as captured
            assert got - bases[w.region] + r.start == w.captured - r.alloc_base
            moved.update((w.i, w.at + k) for k in range(8))
        for i, (a, b) in enumerate(zip(plan.params, new)):
            assert len(a) == len(b)
            assert all(a[k] == b[k] for k in range(len(a)) if (i, k) not in moved)


def test_struct_with_pointers(probe):
    plan = plan_launch(probe, by_symbol(probe, "k_struct"))
    assert len(plan.params) == 1 and len(plan.params[0]) == 40
    assert sorted(w.at for w in plan.words) == [0, 8, 32]      # x, y and z inside the struct


def test_host_pointer_is_kept(probe):
    plan = plan_launch(probe, by_symbol(probe, "k_hostptr"))
    assert [w.i for w in plan.words] == [0]                      # param 1 points at host memory
    bases = [0x7F0000000000]
    assert rebased(plan, bases)[1] == plan.params[1]


def test_tensor_map_found_and_its_global_gets_a_region(probe):
    plan = plan_launch(probe, by_symbol(probe, "k_tma"))
    assert len(plan.tmaps) == 1
    t = plan.tmaps[0]
    assert (t.i, t.at) == (0, 0) and t.region is not None
    assert t.encode["api"] == "cuTensorMapEncodeTiled"
    # the map's own pointer word is not rebased as a plain word: it is encoded again
    assert all(w.i != 0 for w in plan.words)
    new = rebased(plan, [0x7F0000000000 + k * (1 << 32) for k in range(len(plan.regions))], {0: b"\x07" * 128})
    assert new[0][:128] == b"\x07" * 128


def test_cluster_launch(probe):
    plan = plan_launch(probe, by_symbol(probe, "drv_cluster"))
    assert plan.cluster is not None and all(c >= 1 for c in plan.cluster)
    assert plan.grid[0] % plan.cluster[0] == 0


def test_regions_of_a_real_vllm_launch(vllm):
    """A KV-cache write of the vLLM capture: one region per allocation, aligned, large pools
    truncated past their highest used offset, every word inside its region."""
    plan = plan_launch(vllm, by_symbol(vllm, "reshape_and_cache"), max_region=1 << 20)
    assert plan.missing is None
    ids = [r.buffer_id for r in plan.regions]
    assert len(ids) == len(set(ids))
    for r in plan.regions:
        assert r.start % REGION_ALIGN == 0 and 0 < r.length <= r.alloc_size - r.start
    for w in plan.words:
        assert 0 <= w.offset < plan.regions[w.region].length
    assert any(r.truncated for r in plan.regions)      # the KV pool is most of the GPU


def test_closed_library_launch_says_why(vllm):
    plan = plan_launch(vllm, by_symbol(vllm, "nvjet"))
    assert plan.missing and "by hash only" in plan.missing and "cannot be replayed" in plan.missing


def test_unknown_seq_is_one_sentence(vllm):
    with pytest.raises(PlanError, match="no launch record with seq 99999999"):
        plan_launch(vllm, 99999999)


def test_spans_and_directions():
    W = type("W", (), {})
    words = []
    for region, off in ((0, 0), (0, 256), (0, 256), (1, 64)):
        w = W()
        w.region, w.offset = region, off
        words.append(w)
    sp = FL.spans(words, [1024, 512])
    assert [(s.region, s.lo, s.hi) for s in sp] == [(0, 0, 256), (0, 256, 1024), (0, 256, 1024), (1, 64, 512)]
    assert FL.direction(True, True) == "inout" and FL.direction(True, False) == "out"
    assert FL.direction(False, True) == "in" and FL.direction(False, False) == "unused"


def test_tagged_fill_tells_spans_apart():
    spans = [FL.Span(0, 0, 16), FL.Span(0, 16, 32), FL.Span(0, 16, 32), FL.Span(1, 8, 24)]
    fill = FL.tagged([32, 24], spans)
    assert fill[0][:16].view("<u8").tolist() == [1, 1] and fill[0][16:].view("<u8").tolist() == [2, 2]
    assert fill[1][:8].tolist() == [0] * 8 and fill[1][8:].view("<u8").tolist() == [3, 3]


def test_written_and_read_from_snapshots():
    n = 64
    zero_fill, tag_fill = [np.zeros(n, np.uint8)], FL.tagged([n], [FL.Span(0, 0, 32), FL.Span(0, 32, 64)])
    zero_after, one_after = [zero_fill[0].copy()], [tag_fill[0].copy()]
    zero_after[0][8:16] = 5                  # the kernel wrote bytes 8..16 (seen in the zero run)
    one_after[0][8:16] = 5
    one_after[0][40] = 0                     # and byte 40, with a value equal to the zero fill
    # a copy of span 0 into span 1: invisible in the zero run, seen in the tagged one
    one_after[0][48:56] = tag_fill[0][0:8]
    wrote = FL.written([(zero_fill, zero_after), (tag_fill, one_after)])
    assert FL.ranges(wrote[0]) == [(8, 16), (40, 41), (48, 49)]
    span = FL.Span(0, 32, 64)
    poisoned = [one_after[0].copy()]
    poisoned[0][32:40] = 0xAB                # the poison itself, never written: not a change
    assert not FL.read_changed(one_after, poisoned, wrote, span)
    poisoned[0][10] = 9                      # an output the poison changed: read
    assert FL.read_changed(one_after, poisoned, wrote, span)


def test_host_ranges_follow_the_log(tmp_path):
    import json as _json

    from replay.plan import read_host_ranges
    ev = [{"seq_before": 3, "order": 0, "event": "host_alloc", "base": "0x7f0000000000", "size": 4096, "result": 0},
          {"seq_before": 9, "order": 1, "event": "host_free", "base": "0x7f0000000000", "size": None, "result": 0},
          {"seq_before": 9, "order": 2, "event": "host_alloc", "base": "0x7f0000000000", "size": 8192, "result": 0},
          {"seq_before": 4, "order": 3, "event": "host_register", "base": "0x7f1000000000", "size": 64, "result": 1},
          {"seq_before": 5, "order": 4, "event": "alloc", "base": "0x7e0000000000", "size": 64, "result": 0}]
    (tmp_path / "allocs.jsonl").write_text("\n".join(_json.dumps(e) for e in ev) + "\nnot json\n")
    got = read_host_ranges(tmp_path)
    base = 0x7F0000000000
    assert got == [(base, 4096, 3, 9), (base, 8192, 9, 1 << 62)]   # failed register, device alloc: not host


def test_staging_kernel_gets_a_mapped_host_region():
    """vLLM's model runner stages inputs in pinned host memory its Triton kernels read through
    the mapping: on a capture with an allocation log, those words get host regions."""
    from replay.plan import read_host_ranges
    d = load_dump(FIX / "suite" / "q2e.tar.xz", cache=False)
    hr = read_host_ranges(d.source.parent)
    seq = by_symbol(d, "_gather_block_tables_kernel")
    plan = plan_launch(d, seq, host_ranges=hr)
    host = [r for r in plan.regions if r.host]
    assert host
    assert {w.region for w in plan.words} >= {plan.regions.index(r) for r in host}
    assert not plan.unmapped
