"""The copy log's reader (mining/copies.py): fields checked, damage reported per line, and
`bytes_before`, the bytes a device range held before a launch.

The records here are written as the capture writes them (docs/dump-format.md "Copy log"); the
library's own output is read in tests/capture/test_copies.py. Damaged files go through the same
variants as every other side file (tests/helpers/fuzz_dumps.py): no exception but a one-line
DumpError, a sound report, and a byte flip inside one record costs that record only.
"""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from fuzz_dumps import Outcome, check_lines, kinds_for, variant
from mining.copies import COPIES, bytes_before, copies_frame, read_copies
from mining.damage import FileReport
from mining.load import load_dump
from paths import FIXTURES
from mining.archive import unpack

BASE = 0x7D0000000000


def _rec(seq, seq_before, dst, data: bytes | None, size=None, **kw) -> dict:
    r = {"seq": seq, "seq_before": seq_before, "t_ns": 1000 + seq, "tid": 7, "dev": 0, "api": "cuMemcpyHtoDAsync_v2",
         "stream": "0x5d00", "async": 1, "dst": hex(dst), "src": "0x55a4657f4600",
         "size": len(data) if size is None else size, "result": 0, "graph": None}
    if data is not None:
        r["hex"] = data.hex()
    r.update(kw)
    return r


def _lines(recs) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)


def _frame(tmp_path, recs):
    (tmp_path / COPIES).write_bytes(_lines(recs))
    return read_copies(tmp_path / COPIES)


def test_the_newest_copy_of_each_byte_before_the_launch_wins(tmp_path):
    df = _frame(tmp_path, [
        _rec(0, 0, BASE, bytes(range(16))),                      # before launch 0
        _rec(1, 2, BASE + 4, b"\xaa" * 4),                        # before launch 2: bytes 4..7
        _rec(2, 2, BASE + 6, b"\xbb" * 4),                        # and then 6..9 (newer: seq 2)
        _rec(3, 5, BASE, b"\xcc" * 16),                           # only from launch 5 on
    ])
    f = bytes_before(df, 1, BASE, 16)
    assert f.data == bytes(range(16)) and f.complete and list(f.copy_seq) == [0] * 16
    f = bytes_before(df, 2, BASE, 12)
    assert f.data == bytes([0, 1, 2, 3]) + b"\xaa\xaa\xbb\xbb\xbb\xbb" + bytes([10, 11])
    assert list(f.copy_seq) == [0] * 4 + [1, 1] + [2] * 4 + [0, 0]
    assert bytes_before(df, 5, BASE + 2, 4).data == b"\xcc" * 4
    before = bytes_before(df, 0, BASE - 4, 8)        # a range reaching below the first copy
    assert before.data == bytes(4) + bytes(range(4)) and list(before.known) == [False] * 4 + [True] * 4
    assert list(before.copy_seq[:4]) == [-1] * 4 and not before.complete


def test_a_copy_without_bytes_still_hides_older_bytes_and_graphs_failures_do_not_count(tmp_path):
    df = _frame(tmp_path, [
        _rec(0, 0, BASE, b"\x11" * 8),
        _rec(1, 1, BASE, None, size=8192),                        # too large for the byte knob
        _rec(2, 1, BASE + 16, b"\x22" * 4, result=1),             # failed: wrote nothing
        _rec(3, 1, BASE + 16, b"\x33" * 4, graph={"graph": "0x9e77", "capture_id": 5}),  # captured: runs at replay
        _rec(4, 1, BASE + 20, b"\x44" * 4, graph={"graph": "0x9800", "capture_id": 0}, node="0xd700"),  # a node
    ])
    assert bytes_before(df, 0, BASE, 8).data == b"\x11" * 8
    f = bytes_before(df, 1, BASE, 8)
    assert not f.known.any() and list(f.copy_seq) == [1] * 8 and f.data == bytes(8)
    g = bytes_before(df, 9, BASE + 16, 8)
    assert list(g.copy_seq) == [1] * 8 and not g.known.any()   # the 8 KB copy covers them; the rest never ran
    assert bytes_before(df, 0, BASE + 16, 8).copy_seq.tolist() == [-1] * 8
    assert bytes_before(copies_frame([]), 3, BASE, 4).data == bytes(4)
    with pytest.raises(ValueError, match="base >= 0 and size >= 0"):
        bytes_before(df, 0, BASE, -1)


def test_many_copies_of_one_buffer_are_resolved_newest_first(tmp_path):
    rng = np.random.default_rng(3)
    recs, truth = [], {}
    for s in range(400):          # one metadata buffer written before every launch
        data = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        recs.append(_rec(s, s, BASE, data))
        truth[s] = data
    df = _frame(tmp_path, recs)
    for s in (0, 1, 199, 399, 4000):
        assert bytes_before(df, s, BASE, 64).data == truth[min(s, 399)]


@pytest.mark.parametrize("field,value", [
    ("seq", -1), ("seq_before", 1 << 62), ("tid", "7"), ("dev", 128), ("async", 2), ("async", True),
    ("dst", "0xzz"), ("dst", 5), ("stream", None), ("size", -1), ("size", 1 << 48), ("result", -1),
    ("graph", {"graph": "0x1"}), ("graph", []), ("hex", "abc"), ("hex", "AABB"), ("hex", "00" * 5),
    ("node", 7), ("api", None)])
def test_a_field_outside_its_range_costs_its_record_only(tmp_path, field, value):
    recs = [_rec(i, i, BASE + 16 * i, bytes([i]) * 4) for i in range(4)]
    recs[1][field] = value
    (tmp_path / COPIES).write_bytes(_lines(recs))
    rep, w = FileReport(COPIES), []
    df = read_copies(tmp_path / COPIES, w, rep)
    assert df["seq"].tolist() == [0, 2, 3] and rep.read == 3 and rep.skipped == 1
    assert rep.ranges[0].reason.startswith("not a copy record") and w == [f"{COPIES}: dropped 1 damaged record(s)"]


def test_nuls_and_a_cut_last_line_are_reported_and_the_loader_carries_them(tmp_path):
    pid = unpack(FIXTURES / "capture" / "probe_bin.tar.xz") / "pid751"
    dst = tmp_path / "pid751"
    shutil.copytree(pid, dst)
    body = _lines([_rec(i, i, BASE + 8 * i, bytes([i]) * 8) for i in range(5)])
    lines = body.splitlines(keepends=True)
    lines[1] = lines[1][:10] + b"\x00" + lines[1][11:]       # a record in flight when the writer died
    (dst / COPIES).write_bytes(b"".join(lines) + b'{"seq":5,"seq_bef')
    d = load_dump(dst, cache=False)
    rep = {r.file: r for r in d.damage}[COPIES]
    assert d.copies["seq"].tolist() == [0, 2, 3, 4] and rep.read == 4 and rep.skipped == 2
    assert [r.reason for r in rep.ranges][-1].startswith("truncated last line")
    assert any(w.startswith(f"{COPIES}: dropped 2") for w in d.warnings)


def test_damaged_copy_logs_pass_the_fuzz_checks(tmp_path):
    base = _lines([_rec(i, i // 2, BASE + 32 * (i % 5), bytes([i % 256]) * (8 + i % 9),
                        **({"graph": {"graph": "0x9e77", "capture_id": 3}} if i % 7 == 0 else {}))
                   for i in range(60)])
    work = tmp_path / "pid1"
    work.mkdir()
    rep0 = FileReport(COPIES)
    (work / COPIES).write_bytes(base)
    assert len(read_copies(work / COPIES, [], rep0)) == 60 and not rep0.damaged
    out = Outcome()
    kinds = kinds_for(COPIES)
    for v in range(6 * len(kinds)):
        rng = random.Random(f"copies/{v}")
        kind = kinds[v % len(kinds)]
        data, hit = variant(base, kind, rng)
        out.count += 1
        check_lines(f"copies {kind} seed {v}", work, COPIES, base, 60, data, kind, hit, None, out, full=v % 2 == 0)
    assert out.escaped == [] and out.broken == [], (out.escaped[:2], out.broken[:2])


def test_fills_before_gives_the_known_runs_of_a_whole_allocation(tmp_path):
    from mining.copies import fills_before
    df = _frame(tmp_path, [
        _rec(0, 0, BASE + 100, b"\x01" * 10),
        _rec(1, 0, BASE + 105, b"\x02" * 10),          # overlaps: one run of 15 bytes
        _rec(2, 0, BASE + 200, None, size=50),          # no bytes: nothing to upload there
        _rec(3, 0, BASE + 220, b"\x03" * 4),            # newer than the byteless copy: known again
        _rec(4, 3, BASE + 300, b"\x04" * 4),            # after the launch asked about
        _rec(5, 0, BASE + (1 << 30) - 2, b"\x05" * 4),  # crosses the range's end
    ])
    runs = fills_before(df, 1, BASE, 1 << 30)           # a 1 GiB allocation: nothing of its size is made
    assert runs == [(BASE + 100, b"\x01" * 5 + b"\x02" * 10), (BASE + 220, b"\x03" * 4),
                    (BASE + (1 << 30) - 2, b"\x05" * 2)]
    full = bytes_before(df, 1, BASE, 400)
    known = [(BASE + i, full.data[i:i + 1]) for i in range(400) if full.known[i]]
    assert [(a + k, d[k:k + 1]) for a, d in runs[:2] for k in range(len(d))] == known
    assert fills_before(df, 0, BASE, 0) == [] and fills_before(df, 9, BASE + 300, 4) == [(BASE + 300, b"\x04" * 4)]
