"""`replay.contents` on CPU: the side file's checks, matching its launches to the dump, and the
whole check path (regions filled with the original bytes at the captured addresses, the launch run,
the bytes read back and compared) with a stand-in device that executes the probe's axpy and struct
kernels in numpy on the rebased parameter bytes. The real GPU run is tests/replay/test_replay_gpu.py.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from mining.load import load_dump
from replay.contents import IoLaunch, Snapshot, check_one, match, read_io
from replay.plan import plan_launch
from paths import FIXTURES
from vocab.errors import UsageError


@pytest.fixture(scope="module")
def probe():
    return load_dump(FIXTURES / "capture" / "probe.tar.xz", cache=False)


class NumpyGpu:
    """Just enough of replay.gpu.Gpu: memory as numpy arrays at fake addresses; `launch` runs the
    probe's k_axpy (y += a x) or k_struct (y = x scale + z[0]) on the parameter bytes it is given."""

    def __init__(self):
        self.mem: dict[int, np.ndarray] = {}
        self.next = 0x7F00_0000_0000
        self.launched = 0

    def alloc(self, n):
        p, self.next = self.next, self.next + (1 << 32)
        self.mem[p] = np.zeros(n, np.uint8)
        return p

    alloc_host = alloc

    def _at(self, ptr, n):
        for base, m in self.mem.items():
            if base <= ptr and ptr + n <= base + len(m):
                return m[ptr - base:ptr - base + n]
        raise AssertionError(f"{ptr:#x} outside every allocation")

    def upload(self, ptr, host):
        self._at(ptr, len(host))[:] = host

    def download(self, ptr, n):
        return self._at(ptr, n).copy()

    def zero(self, ptr, n):
        self._at(ptr, n)[:] = 0

    def function(self, cubin, symbol, smem):
        return symbol

    def encode_tiled(self, rec, address):
        return bytes(128)

    def sync(self):
        pass

    def free_all(self):
        self.mem.clear()

    def _f32(self, ptr, n):
        return self._at(ptr, 4 * n).view(np.float32)

    def launch(self, fn, grid, block, smem, params, cluster=None):
        self.launched += 1
        n_threads = grid[0] * block[0]
        if "k_axpy" in fn:
            y, x = (struct.unpack("<Q", p)[0] for p in params[:2])
            a, = struct.unpack("<f", params[2])
            n = min(struct.unpack("<i", params[3])[0], n_threads)
            Y = self._f32(y, n)
            Y[:] = Y + np.float32(a) * self._f32(x, n)
        elif "k_struct" in fn:
            x, y, n, _pad, scale, z = struct.unpack("<QQiidQ", params[0])
            n = min(n, n_threads)
            self._f32(y, n)[:] = (self._f32(x, n) * scale).astype(np.float32) + self._f32(z, 1)[0]
        else:
            raise AssertionError(fn)


def _buffers(dump, seq):
    """The captured base address of each allocation the launch points into."""
    plan = plan_launch(dump, seq)
    return plan, sorted({plan.regions[w.region].alloc_base for w in plan.words})


def _original(plan, bases, nbytes, seed):
    """Seeded before-bytes per buffer and the after-bytes the kernel gives, computed by the stand-in
    on the captured addresses themselves (an independent run of the same arithmetic)."""
    rng = np.random.default_rng(seed)
    g = NumpyGpu()
    for b in bases:
        g.mem[b] = np.zeros(plan.regions[0].alloc_size, np.uint8)
        g.mem[b][:nbytes] = (rng.integers(-8, 8, nbytes // 4).astype(np.float32) * 0.5).view(np.uint8)
    before = {b: g.mem[b][:nbytes].tobytes() for b in bases}
    g.launch(plan.symbol, plan.grid, plan.block, plan.smem, plan.params)
    return [Snapshot(b, before[b], g.mem[b][:nbytes].tobytes()) for b in bases]


@pytest.mark.parametrize("kernel", ["k_axpy", "k_struct"])
def test_a_launch_on_the_original_bytes_writes_what_the_original_wrote(probe, kernel):
    (seq, io), = [(s, r) for s, r in match(probe, [IoLaunch(kernel, 0, [])])]
    plan, bases = _buffers(probe, seq)
    io.buffers = _original(plan, bases, 24576, seed=seq)
    assert any(b.before != b.after for b in io.buffers)       # the launch changes something
    res = check_one(NumpyGpu(), plan, io)
    assert res.status == "same", res.message
    assert all(b["in_plan"] and b["differing"] == 0 for b in res.buffers)


def test_a_wrong_original_is_found_and_located(probe):
    (seq, io), = match(probe, [IoLaunch("k_axpy", 0, [])])
    plan, bases = _buffers(probe, seq)
    snaps = _original(plan, bases, 4096, seed=3)
    y = next(b for b in snaps if b.before != b.after)
    bad = bytearray(y.after)
    bad[404] ^= 0x40
    y.after = bytes(bad)
    res = check_one(NumpyGpu(), plan, IoLaunch("k_axpy", 0, snaps))
    assert res.status == "differs"
    hit = [b for b in res.buffers if b["differing"]]
    assert len(hit) == 1 and hit[0]["first_diff"] == 404 and hit[0]["addr"] == hex(y.addr)


def test_a_changed_buffer_the_launch_does_not_point_to_differs(probe):
    (seq, io), = match(probe, [IoLaunch("k_axpy", 0, [])])
    plan, bases = _buffers(probe, seq)
    snaps = _original(plan, bases, 1024, seed=4)
    far = Snapshot(0x10, b"\0" * 8, b"\1" * 8)               # in no region of the plan, changed
    res = check_one(NumpyGpu(), plan, IoLaunch("k_axpy", 0, snaps + [far]))
    assert res.status == "differs" and "does not point into it" in res.message


def test_match_by_kernel_and_occurrence(probe):
    L = probe.launches.sort_values("seq")
    axpy = L.loc[L["symbol"].astype(str).str.contains("k_axpy"), "seq"].tolist()
    got = match(probe, [IoLaunch("k_axpy", 0, []), IoLaunch("k_axpy", 2, []), IoLaunch("k_axpy", 10 ** 6, []),
                        IoLaunch("no_such_kernel", 0, [])])
    assert [s for s, _ in got] == [axpy[0], axpy[2], None, None]


def _write(tmp_path, doc) -> object:
    p = tmp_path / "io.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize("doc, phrase", [
    ("{not json", "not a readable"),
    ({"format": "other"}, "not a mine-probe-io/1 file"),
    ({"format": "mine-probe-io/1", "beyond": "random", "launches": []}, "not a mine-probe-io/1 file"),
    ({"format": "mine-probe-io/1", "beyond": "zero", "launches": [{"kernel": "k"}]}, "malformed"),
    ({"format": "mine-probe-io/1", "beyond": "zero",
      "launches": [{"kernel": "k", "nth": 0, "buffers": [{"addr": "0x10", "before": "00", "after": "0000"}]}]},
     "malformed"),
    ({"format": "mine-probe-io/1", "beyond": "zero",
      "launches": [{"kernel": "k", "nth": 0, "buffers": [{"addr": "zz", "before": "00", "after": "00"}]}]},
     "malformed"),
])
def test_bad_side_files_are_one_sentence(tmp_path, doc, phrase):
    with pytest.raises(UsageError, match=phrase):
        read_io(_write(tmp_path, doc))


def test_a_good_side_file_reads(tmp_path):
    doc = {"format": "mine-probe-io/1", "beyond": "zero", "bytes": 2, "launches": [
        {"kernel": "k_axpy", "nth": 1, "buffers": [{"addr": "0x7f00", "before": "0001", "after": "0203"}]}]}
    (r,) = read_io(_write(tmp_path, doc))
    assert (r.kernel, r.nth, r.buffers[0].addr, r.buffers[0].before, r.buffers[0].after) == \
        ("k_axpy", 1, 0x7F00, b"\0\1", b"\2\3")
