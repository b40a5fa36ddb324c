"""Replay captured launches on this machine's GPU: run each alone, measure its read and write
sets, check it is deterministic, time it.

Per launch (`replay_one`): plan it (`replay.plan`), allocate its regions, encode its tensor maps
again, rebase its pointer words, then
  1. run it on zero-filled regions and on tagged ones (`replay.flow`): the write set;
  2. run it on the tagged fill again: identical memory after both, or the launch is not
     deterministic (its reads are then not judged);
  3. per pointer word, run it with the word's span poisoned: the read set;
  4. time `reps` launches with CUDA events on the tagged fill, L2 flushed before each.
A launch that faults is reported with the driver's error and the context is reset; the next
launch runs on a fresh one. Timings of kernels whose work depends on memory contents (attention
reading sequence lengths, for one) are of the fill's data, which the result says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay import flow as FL
from replay.gpu import CudaError, Gpu
from replay.plan import LaunchPlan, PlanError, plan_launch, read_attrs, read_tensormaps, rebased

FILL_TIMED = "tagged"


@dataclass
class WordFlow:
    i: int
    at: int
    region: int
    offset: int
    written_bytes: int
    written_ranges: int
    read: bool | None          # None: not judged (not deterministic, or --no-flow)
    read_by: str               # output | fault | "" (how the read showed)
    direction: str             # in | out | inout | unused | in? | out?


@dataclass
class LaunchResult:
    seq: int
    symbol: str
    status: str                # ok | missing | fault | error
    message: str = ""
    deterministic: bool | None = None
    time_us: float | None = None       # median of the timed launches
    time_us_min: float | None = None
    reps: int = 0
    fill: str = FILL_TIMED
    bytes_written: int = 0
    regions: list[dict] = field(default_factory=list)
    words: list[WordFlow] = field(default_factory=list)


class _Setup:
    """A plan made live on the GPU: regions allocated, tensor maps encoded, params rebased."""

    def __init__(self, gpu: Gpu, plan: LaunchPlan):
        self.gpu, self.plan = gpu, plan
        self.lengths = [r.length for r in plan.regions]
        self.spans = FL.spans(plan.words, self.lengths)
        self.tagged = FL.tagged(self.lengths, self.spans)
        self.zero = [np.zeros(n, np.uint8) for n in self.lengths]
        self.bases = [gpu.alloc(r.length) for r in plan.regions]
        maps = {}
        for k, t in enumerate(plan.tmaps):
            if t.region is not None:
                maps[k] = gpu.encode_tiled(t.encode, self.bases[t.region] + t.offset)
        self.params = rebased(plan, self.bases, maps)
        self.fn = gpu.function(plan.cubin, plan.symbol, plan.smem)

    def fill(self, pattern: str, poison: FL.Span | None = None, seed: int = 0) -> list[np.ndarray]:
        """Fill every region (`zero` or `tagged`), then poison one span; returns the fill."""
        host = self.zero if pattern == "zero" else self.tagged
        for b, h in zip(self.bases, host):
            if pattern == "zero":
                self.gpu.fill(b, len(h), "zero")
            else:
                self.gpu.upload(b, h)
        if poison is not None:
            n = poison.hi - poison.lo
            if n > 0:
                self.gpu.fill(self.bases[poison.region] + poison.lo, n, "random", seed)
        return host

    def run(self) -> list[np.ndarray]:
        p = self.plan
        self.gpu.launch(self.fn, p.grid, p.block, p.smem, self.params, p.cluster)
        self.gpu.sync()
        return [self.gpu.download(b, r.length) for b, r in zip(self.bases, p.regions)]


def replay_one(gpu: Gpu, plan: LaunchPlan, reps: int = 20, judge_reads: bool = True, seed: int = 1
               ) -> LaunchResult:
    res = LaunchResult(plan.seq, plan.symbol, "ok",
                       regions=[{"buffer_id": r.buffer_id, "start": r.start, "length": r.length,
                                 "alloc_size": r.alloc_size, "truncated": r.truncated} for r in plan.regions])
    if plan.missing:
        res.status, res.message = "missing", plan.missing
        return res
    no_map = [t for t in plan.tmaps if t.region is None]
    try:
        s = _Setup(gpu, plan)
        fill0 = s.fill("zero")
        after0 = s.run()
        fill1 = s.fill("tagged")
        after1 = s.run()
        s.fill("tagged")
        again = s.run()
        res.deterministic = all(np.array_equal(a, b) for a, b in zip(after1, again))
        wrote = FL.written([(fill0, after0), (fill1, after1)])
        res.bytes_written = int(sum(int(w.sum()) for w in wrote))
        sp = s.spans
        judged: dict[tuple[int, int, int], tuple[bool | None, str]] = {}
        for w, span in zip(plan.words, sp):
            key = (span.region, span.lo, span.hi)
            if key not in judged:
                judged[key] = (None, "")
                if judge_reads and res.deterministic:
                    judged[key] = _judge(gpu, plan, s, span, after1, wrote, seed)
                    if judged[key][1] == "fault":
                        s = _Setup(gpu, plan)           # the context was reset
            read, how = judged[key]
            m = wrote[span.region][span.lo:span.hi]
            res.words.append(WordFlow(w.i, w.at, w.region, w.offset, int(m.sum()), len(FL.ranges(m)), read, how,
                                      FL.direction(bool(m.any()), read)))
        s.fill(FILL_TIMED)
        t = gpu.time_launches(s.fn, plan.grid, plan.block, plan.smem, s.params, plan.cluster, reps)
        res.time_us, res.time_us_min, res.reps = float(np.median(t)), float(min(t)), len(t)
        if no_map:
            res.message = f"{len(no_map)} tensor map(s) point outside every allocation: kept as captured"
        if any(r.truncated for r in plan.regions):
            res.message = (res.message + "; " if res.message else "") + \
                "regions truncated: " + ", ".join(f"buffer {r.buffer_id} ({r.length >> 20} of "
                                                  f"{r.alloc_size >> 20} MiB)" for r in plan.regions if r.truncated)
    except CudaError as exc:
        res.status, res.message = ("fault" if exc.sticky else "error"), str(exc)
        if exc.sticky:
            gpu.reset()
    finally:
        if gpu.allocs:
            gpu.free_all()
    return res


def _judge(gpu: Gpu, plan: LaunchPlan, s: _Setup, span: FL.Span, baseline, wrote, seed: int):
    """(read?, how) for one span: poisoned, run, compared (flow.read_changed); a fault is a read."""
    s.fill("tagged", poison=span, seed=seed)
    try:
        after = s.run()
    except CudaError as exc:
        if not exc.sticky:
            raise
        gpu.reset()
        return True, "fault"
    return FL.read_changed(baseline, after, wrote, span), "output"


def replay_seqs(dump, seqs: list[int], gpu: Gpu | None = None, reps: int = 20, judge_reads: bool = True,
                max_region: int | None = None, progress=None) -> list[LaunchResult]:
    """Plan and replay each launch of `seqs` (in order); planning errors become results too."""
    from replay.plan import MAX_REGION

    folder = dump.source.parent
    attrs = read_attrs(folder, set(seqs))
    tmaps = read_tensormaps(folder)
    gpu = gpu or Gpu()
    out = []
    for n, seq in enumerate(seqs):
        try:
            plan = plan_launch(dump, seq, max_region or MAX_REGION, attrs.get(seq, {}), tmaps)
        except PlanError as exc:
            out.append(LaunchResult(seq, "", "missing", str(exc)))
            continue
        out.append(replay_one(gpu, plan, reps, judge_reads))
        if progress:
            progress(n + 1, len(seqs), out[-1])
    return out
