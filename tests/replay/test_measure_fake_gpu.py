"""`replay.forward.measure_in_context` against a CPU model of the device: the read and write sets of
a launch whose behaviour is known, and the upload rule (a region is sent again only when the
device no longer holds the run's fill). Why: the measurement runs one launch dozens of times with
one span poisoned; it once re-sent every region each run, and a KV pool or an allocator segment
of tens of MiB made that most of the replay's time. What the rule must not change is what is
measured."""

from __future__ import annotations

import numpy as np

from replay.forward import measure_in_context
from replay.plan import LaunchPlan, PtrWord, Region


class CpuDevice:
    """Allocations as numpy arrays; the 'kernel' reads 8 bytes through param 0 and writes them,
    plus one, through param 1; param 2 points at a large region it never touches."""

    def __init__(self):
        self.mem, self.next, self.uploads = {}, 1 << 40, {}

    def alloc(self, n):
        p, self.next = self.next, self.next + n + (1 << 20)
        self.mem[p] = np.zeros(n, np.uint8)
        return p

    alloc_host = alloc

    def free_all(self):
        self.mem = {}

    def function(self, *a):
        return None

    def upload(self, p, h):
        self.uploads[p] = self.uploads.get(p, 0) + 1
        self.mem[p][:len(h)] = h

    def download(self, p, n):
        return self.mem[p][:n].copy()

    def sync(self):
        pass

    def launch(self, fn, grid, block, smem, params, cluster=None):
        src, dst = (int.from_bytes(params[k][:8], "little") for k in (0, 1))
        self.mem[dst][:8] = self.mem[src][:8] + 1


def _plan(big: int) -> LaunchPlan:
    regions = [Region(1, 0x1000, 64, 0, 64, False), Region(2, 0x2000, 64, 0, 64, False),
               Region(3, 0x100000, big, 0, big, False)]
    words = [PtrWord(k, 0, 8 * k, k, 0, r.alloc_base) for k, r in enumerate(regions)]
    params = [r.alloc_base.to_bytes(8, "little") for r in regions]
    return LaunchPlan(7, "copy_plus_one", "0" * 64, None, (1, 1, 1), (32, 1, 1), 0, None, {}, params,
                      [0, 8, 16], words, [], regions)


def test_directions_of_a_known_launch_and_the_big_region_sent_once():
    dev, big = CpuDevice(), 1 << 20
    plan = _plan(big)
    rng = np.random.default_rng(3)
    init = [rng.integers(0, 255, 64, dtype=np.uint8), np.zeros(64, np.uint8), rng.integers(0, 255, big, dtype=np.uint8)]
    res, after = measure_in_context(dev, plan, init, True)
    assert res.deterministic
    got = {w.i: w.direction for w in res.words}
    assert got == {0: "in", 1: "out", 2: "unused"}
    assert res.words[1].written_bytes == 8 and res.words[0].written_bytes == 0
    assert np.array_equal(after[1][:8], init[0][:8] + 1)
    # nine runs: baseline, determinism check, word 0's span poisoned once (read at the first
    # poison), words 1 and 2 three times each (no poison shows a read). The output region is
    # rewritten by every run, so it is sent every run; the input region only where its fill
    # changed (the baseline, its poisoned run, the run after it); the large unused region only
    # for the baseline and its own three poisoned fills
    r0, r1, r2 = (dev.uploads[b] for b in sorted(dev.uploads))
    assert (r0, r1, r2) == (3, 9, 4)
