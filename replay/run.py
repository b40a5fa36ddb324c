"""Replay captured launches on this machine's GPU: run each alone, measure its read and write
sets, check it is deterministic, time it.

Per launch (`replay_one`): plan it (`replay.plan`), allocate its regions, encode its tensor maps
again, rebase its pointer words, then
  1. run it on zero-filled regions and on tagged ones (`replay.flow`): the write set;
  2. run it on the tagged fill again: identical memory after both, or the launch is not
     deterministic (its reads are then not judged);
  3. per pointer word, run it with the word's span poisoned (`POISONS`): the read set;
  4. time `reps` launches with CUDA events on the tagged fill, L2 flushed before each, and the
     same launch 20 times back to back in one CUDA graph (L2 warm), as kern replays a step.
A launch that faults is reported with the driver's error; the fault ends its worker process and the
next launch runs in a fresh one (`run_isolated`). Timings of kernels whose work depends on memory contents (attention
reading sequence lengths, for one) are of the fill's data, which the result says.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from replay import flow as FL
from replay.gpu import CudaError, Gpu
from replay.plan import (LaunchPlan, PlanError, plan_launch, read_attrs, read_host_ranges, read_tensormaps,
                         rebased)
from vocab.errors import MineError

FILL_TIMED = "tagged"
# poisons tried in order until one shows a read: small first (every 8-byte word below 16, so an
# index read from it stays inside any table of 16 rows or more: Inductor's embedding and rope
# kernels assert `index out of bounds` on larger ones, and an assert is sticky: it ends the
# worker, and a new one must be started and the launch measured again; an 8-layer default-mode
# window spent most of its time so, H200 2026-12-07), then bounded (every 4-byte lane below 2^16,
# so a loop bound or an index read from it cannot make a kernel run for ever), then any bytes,
# then all ones (NaN in every float width, -1 in every integer width): a read whose value
# cancels out (a softmax's running max over one active segment) still carries a NaN into the output
POISONS = ("small", "random16", "random", "ones")
WRITTEN_RANGES = 16


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
    direction: str             # in | out | inout | unused | in? | out?, over the word's span
    shared: bool = False       # other words point into its region at other offsets: a write past
                               # the next one's offset (an interleaved K/V cache) counts to that one
    region_written: bool = False
    span_bytes: int = 0        # bytes of the word's span (its private region from its offset, in a forward replay)
    written_at: list = field(default_factory=list)   # the first WRITTEN_RANGES [start, end) written, from the word's address


@dataclass
class LaunchResult:
    seq: int
    symbol: str
    status: str                # ok | missing | fault | error
    message: str = ""
    deterministic: bool | None = None
    time_us: float | None = None       # median of the timed launches
    time_us_min: float | None = None
    time_us_graph: float | None = None # per launch, back to back in one CUDA graph, L2 warm (Gpu.time_graph)
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
        self.bases = [gpu.alloc_host(r.length) if r.host else gpu.alloc(r.length) for r in plan.regions]
        maps = {}
        for k, t in enumerate(plan.tmaps):
            if t.region is not None:
                maps[k] = gpu.encode_tiled(t.encode, self.bases[t.region] + t.offset)
        self.params = rebased(plan, self.bases, maps)
        self.fn = gpu.function(plan.cubin, plan.symbol, plan.smem)

    @functools.cached_property
    def tagged(self) -> list[np.ndarray]:
        """The tagged fill (built on first use: an in-order replay never fills synthetically)."""
        return FL.tagged(self.lengths, self.spans)

    @functools.cached_property
    def zero(self) -> list[np.ndarray]:
        return [np.zeros(n, np.uint8) for n in self.lengths]

    def fill(self, pattern: str, poison: FL.Span | None = None, seed: int = 0, kind: str = "random16"
             ) -> list[np.ndarray]:
        """Fill every region (`zero` or `tagged`), then poison one span; returns the fill."""
        host = self.zero if pattern == "zero" else self.tagged
        for b, h in zip(self.bases, host):
            if pattern == "zero":
                self.gpu.zero(b, len(h))
            else:
                self.gpu.upload(b, h)
        if poison is not None and poison.hi > poison.lo:
            host = [h.copy() for h in host]
            rnd = FL.poison(poison.hi - poison.lo, seed, kind)
            host[poison.region][poison.lo:poison.hi] = rnd
            self.gpu.upload(self.bases[poison.region] + poison.lo, rnd)
        return host

    def run(self) -> list[np.ndarray]:
        p = self.plan
        self.gpu.launch(self.fn, p.grid, p.block, p.smem, self.params, p.cluster)
        self.gpu.sync()
        return [self.gpu.download(b, r.length) for b, r in zip(self.bases, p.regions)]


def replay_one(gpu: Gpu, plan: LaunchPlan, reps: int = 20, judge_reads: bool = True, seed: int = 1,
               faulted: frozenset = frozenset()) -> LaunchResult:
    """One launch, in this process. `faulted`: spans whose poisoned run already faulted (in an
    earlier worker, which the fault ended); a new fault raises `Faulted`."""
    res = LaunchResult(plan.seq, plan.symbol, "ok",
                       regions=[{"buffer_id": r.buffer_id, "start": r.start, "length": r.length,
                                 "alloc_size": r.alloc_size, "truncated": r.truncated, "host": r.host}
                                for r in plan.regions])
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
        runs = [(fill0, after0), (fill1, after1)]
        poisoned: dict[tuple[int, int, int], list | str | None] = {}
        reads: dict[tuple[int, int, int], bool] = {}    # the poison loop's judgement of its last run
        for span in s.spans:
            key = (span.region, span.lo, span.hi)
            if key in faulted:
                poisoned[key] = "fault"
                continue
            if key in poisoned or not (judge_reads and res.deterministic):
                poisoned.setdefault(key, None)
                continue
            for kind in POISONS:
                fill = s.fill("tagged", poison=span, seed=seed, kind=kind)
                try:
                    after = s.run()
                except CudaError as exc:
                    if not exc.sticky:
                        raise
                    raise Faulted(key, str(exc)) from None
                poisoned[key] = after
                runs.append((fill, after))
                reads[key] = FL.read_changed(after1, after, FL.written([(fill, after)] + runs[:2]), span)
                if reads[key]:
                    break
        # written: changed from what was put there, in any run (a poisoned span shows a kernel
        # that scales its data in place, which the small fills hide)
        wrote = FL.written(runs)
        res.bytes_written = int(sum(int(w.sum()) for w in wrote))
        for w, span in zip(plan.words, s.spans):
            # read: judged as the poison loop judged it, on the poisoned run's own writes (a run
            # with another span poisoned may have written elsewhere: not this span's read)
            key = (span.region, span.lo, span.hi)
            p = poisoned[key]
            read, how = (None, "") if p is None else (True, "fault") if isinstance(p, str) else (reads[key], "output")
            m = wrote[span.region][span.lo:span.hi]
            shared = len({x.offset for x in plan.words if x.region == w.region}) > 1
            rg = FL.ranges(m)
            res.words.append(WordFlow(w.i, w.at, w.region, w.offset, int(m.sum()), len(rg), read, how,
                                      FL.direction(bool(m.any()), read), shared, bool(wrote[span.region].any()),
                                      span.hi - span.lo, [list(r) for r in rg[:WRITTEN_RANGES]]))
        s.fill(FILL_TIMED)
        t = gpu.time_launches(s.fn, plan.grid, plan.block, plan.smem, s.params, plan.cluster, reps)
        res.time_us, res.time_us_min, res.reps = float(np.median(t)), float(min(t)), len(t)
        try:
            res.time_us_graph = gpu.time_graph(s.fn, plan.grid, plan.block, plan.smem, s.params, plan.cluster)
        except CudaError as exc:
            if exc.sticky:
                raise
            res.message = f"not timed in a graph ({exc})"
        if no_map:
            res.message = f"{len(no_map)} tensor map(s) point outside every allocation: kept as captured"
        if any(r.truncated for r in plan.regions):
            res.message = (res.message + "; " if res.message else "") + \
                "regions truncated: " + ", ".join(f"buffer {r.buffer_id} ({r.length >> 20} of "
                                                  f"{r.alloc_size >> 20} MiB)" for r in plan.regions if r.truncated)
    except CudaError as exc:
        if exc.sticky:
            why = str(exc)
            if plan.unmapped:
                i, at, v = plan.unmapped[0]
                why += (f"; {len(plan.unmapped)} parameter word(s) look like addresses outside every captured "
                        f"device allocation (param #{i}{'+' + str(at) if at else ''} = {v:#x}): host memory "
                        "the kernel reads through a mapping, which a replay cannot give it")
            raise Faulted(None, why) from None
        res.status, res.message = "error", str(exc)
    finally:
        if gpu.allocs or gpu.host_allocs:
            gpu.free_all()
    return res


class Faulted(Exception):
    """A launch faulted on the device: the CUDA context of this process is lost for good (the
    driver refuses even a reset after an illegal address), so the worker ends. `span`: the poisoned
    span whose run faulted (a read), or None when the launch faulted on the baseline fills."""

    def __init__(self, span, message: str):
        super().__init__(message)
        self.span, self.message = span, message


def _worker(conn, plans, reps, judge_reads, faulted, device) -> None:
    """A replay process: one context, plans in order, each result sent back; ends at a fault."""
    try:
        gpu = Gpu(device)
    except (MineError, OSError) as exc:  # no driver, no device: the parent raises it as one sentence
        conn.send(("nogpu", str(exc)))
        return
    for k, plan in enumerate(plans):
        try:
            res = replay_one(gpu, plan, reps, judge_reads, faulted=frozenset(faulted) if k == 0 else frozenset())
        except Faulted as f:
            conn.send(("fault", plan.seq, f.span, f.message))
            return
        conn.send(("ok", res))
    conn.send(("done",))


def run_isolated(plans: list[LaunchPlan], reps: int = 20, judge_reads: bool = True, device: int = 0,
                 launch_timeout_s: float = 120.0, progress=None) -> list[LaunchResult]:
    """Replay `plans` in worker processes: a fault ends its worker and the next one goes on (with
    the launch that faulted, when the fault came from a poisoned span, which then counts as read);
    a launch that gives no result within `launch_timeout_s` (a kernel that never ends) is reported
    as hung and its worker killed."""
    import multiprocessing as mp

    from replay.gpu import NoGpu

    ctx = mp.get_context("spawn")
    out: list[LaunchResult] = []
    todo = list(plans)
    faulted: dict[int, set] = {}
    while todo:
        rx, tx = ctx.Pipe(duplex=False)
        first = todo[0]
        p = ctx.Process(target=_worker, args=(tx, todo, reps, judge_reads, faulted.get(first.seq, set()), device),
                        daemon=True)
        p.start()
        tx.close()
        while todo:
            if not rx.poll(launch_timeout_s):
                p.kill()
                out.append(LaunchResult(todo[0].seq, todo[0].symbol, "error",
                                        f"no result within {launch_timeout_s:.0f} s (a kernel that does not "
                                        "end on the replay's data); its worker was killed"))
                todo.pop(0)
                break
            try:
                msg = rx.recv()
            except EOFError:
                out.append(LaunchResult(todo[0].seq, todo[0].symbol, "error", "the replay worker died"))
                todo.pop(0)
                break
            if msg[0] == "nogpu":
                raise NoGpu(msg[1])
            if msg[0] == "done":
                break
            if msg[0] == "ok":
                out.append(msg[1])
                todo.pop(0)
            elif msg[0] == "fault":
                _, seq, span, message = msg
                if span is None:
                    out.append(LaunchResult(seq, todo[0].symbol, "fault", message))
                    todo.pop(0)
                else:
                    faulted.setdefault(seq, set()).add(span)
                break
            if progress:
                progress(len(out), len(out) + len(todo), out[-1])
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return out


def replay_seqs(dump, seqs: list[int], reps: int = 20, judge_reads: bool = True,
                max_region: int | None = None, progress=None, device: int = 0) -> list[LaunchResult]:
    """Plan and replay each launch of `seqs` (in order, in worker processes: `run_isolated`);
    launches the plan cannot run become results too."""
    from replay.plan import MAX_REGION

    folder = dump.source.parent
    attrs = read_attrs(folder, set(seqs))
    tmaps = read_tensormaps(folder)
    hosts = read_host_ranges(folder)
    results: dict[int, LaunchResult] = {}
    plans = []
    for seq in seqs:
        try:
            plan = plan_launch(dump, seq, max_region or MAX_REGION, attrs.get(seq, {}), tmaps,
                               host_ranges=hosts)
        except PlanError as exc:
            results[seq] = LaunchResult(seq, "", "missing", str(exc))
            continue
        if plan.missing:
            results[seq] = replay_one(None, plan)
        else:
            plans.append(plan)
    for r in run_isolated(plans, reps, judge_reads, device, progress=progress):
        results[r.seq] = r
    return [results[s] for s in seqs if s in results]


def read_results(path) -> list[LaunchResult]:
    """LaunchResults as `mine replay --json` (or the GPU tests' MINE_GPU_OUT files) wrote them; a
    `.xz` file is read through lzma. A file of another shape is a UsageError, one sentence."""
    import json
    import lzma
    from pathlib import Path

    from vocab.errors import UsageError

    p = Path(path)
    try:
        raw = lzma.open(p).read() if p.suffix == ".xz" else p.read_bytes()
        rows = json.loads(raw)
        names = {f.name for f in __import__("dataclasses").fields(WordFlow)}
        return [LaunchResult(**{**r, "words": [WordFlow(**{k: v for k, v in w.items() if k in names}) for w in r["words"]]})
                for r in rows]
    except (OSError, lzma.LZMAError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{p}: not a file of replay results ({exc})") from None
