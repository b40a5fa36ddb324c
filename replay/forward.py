"""A forward replayed in order on rebuilt memory: read and write sets of kernels whose work depends
on what memory holds.

Why: `replay.run` measures one launch alone on synthetic fills. That is exact for a norm or an
activation, and blind for attention: its sequence lengths, query offsets and block tables come
from memory, and on small-integer fills it attends to nothing, so it seems to read nothing. Here
the launches of a window run in the captured order on one `replay.memory.Memory`: before each,
the host's writes it followed (the copy log's bytes, its own host pointees) are applied; each
launch runs on the bytes its regions hold and its output is written back. The engine's staging
kernels thus rebuild the device's metadata from the host's tables, and the target forward's
layers run on it. A warm-up window (by default from the previous forward of the analysis) gives
the staging the forward's inputs come from.

Per target launch (`measure`), on the rebuilt bytes S:
  1. run on S twice: the baseline and the determinism check;
  2. per pointer word alone in its region: poison its span (as `replay.run`, bounded first) and
     run: read when anything the baseline wrote, or anything outside the poisoned bytes, changes,
     or the launch faults (the bytes steered addresses);
  3. per word that shares its region with words at other offsets (q/k views of one tensor, a K/V
     cache interleaved every 256 bytes): the word points at a *private copy* of the region, the
     others at the original; writes through the word land in the copy only, so they are its own,
     wherever they fall (a span cannot tell interleaved K from V). The copy is then poisoned from
     the word's offset on: read when the outputs change.
  Written bytes are those changed from the fill in any run (the poisoned runs show writes of the
  value that was already there). Launches without a cubin (closed libraries) cannot run: their
  outputs stay what memory held, which the result lists (`skipped`).
Not rebuilt: device-to-device copies and memsets (not logged), copies larger than
MINE_CAPTURE_COPY_BYTES (kept without bytes), host tables beyond the pointee bytes kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from replay import flow as FL
from replay import runs as RN
from replay import host_gemm
from replay.gpu import CudaError
from replay.memory import Memory, blind_copies, copy_writes, pointee_writes, timeline
from replay.plan import REGION_ALIGN, LaunchPlan, PlanError, Region, plan_launch, read_attrs, read_host_ranges, read_tensormaps
from replay.run import POISONS, WRITTEN_RANGES, Faulted, LaunchResult, WordFlow, _Setup

FORWARD_REGION = 64 << 20     # bytes past a truncated allocation's highest used offset (block tables
                              # can point far into a KV pool)


@dataclass
class ForwardReplay:
    results: list[LaunchResult]            # the target launches, in order
    window: tuple[int, int]                # first and last seq replayed
    ran: int = 0                           # launches of the window that ran
    on_host: list[int] = field(default_factory=list)   # cuBLASLt launches computed on the host (replay.host_gemm)
    skipped: list[tuple[int, str]] = field(default_factory=list)   # (seq, why): could not run
    # window launches that faulted on the rebuilt bytes: (seq, driver error, the launches left out
    # earlier in the window that were given one of its buffers: their output, never computed, is
    # what it read -- a sampled token index, a gather's indices)
    faults: list[tuple[int, str, list[int]]] = field(default_factory=list)
    host_writes: int = 0                   # copies and pointees applied
    # where the time went (wall seconds): planning and host bookkeeping, the runner's unmeasured
    # and measured launches; workers started (1 + one a fault); why: a window of a few hundred
    # launches takes minutes on a GPU host, and the next change to it needs to know which part
    seconds: dict = field(default_factory=lambda: {"plan": 0.0, "run": 0.0, "measure": 0.0})
    workers_started: int = 0
    copies_without_bytes: int = 0
    blind: list[int] = field(default_factory=list)   # copies without bytes into a target launch's regions
    warnings: list[str] = field(default_factory=list)
    contents: list = field(default_factory=list)     # vocab.contents.Word: first-use bytes per forward span


@dataclass
class Window:
    """What an in-order replay runs, in the order the captured process ran it. Why apart from a
    seq range: a CUDA graph's kernels carry the seqs of its capture (made at start-up), while each
    replay runs them again where the host launched the graph, between the live launches that
    staged its inputs and the ones that read its outputs; in seq order they would run once, at
    the capture, on the warm-up's bytes. Without graph replays a window is a seq range
    (`seq_window`), as it always was."""
    seqs: list[int]                      # launch records, in execution order (a graph node once per replay)
    t_ns: list[int]                      # each execution's host time (a graph node: its replay's launch)
    live: list[bool]                     # launched by the host when it ran (no graph node)
    targets: set[int]                    # indices of the executions measured
    spans: list[tuple[int, int, int]] = field(default_factory=list)   # (first, last index, span id) recorded

    def __post_init__(self):
        if not self.seqs:
            raise PlanError("no launches to replay")


def seq_window(dump, targets: list[int], warm_from: int | None, spans=None) -> Window:
    """Every launch record from `warm_from` (default: the first target) to the last target, in seq
    order; `spans`: (first, last seq) of each forward whose contents are recorded, its first seq
    its id."""
    if not targets:
        raise PlanError("no launches to replay")
    targets = sorted(targets)
    lo = targets[0] if warm_from is None else min(warm_from, targets[0])
    L = dump.launches
    m = (L["seq"].to_numpy() >= lo) & (L["seq"].to_numpy() <= targets[-1])
    order = np.argsort(L["seq"].to_numpy()[m], kind="stable")
    seqs = L["seq"].to_numpy(np.int64)[m][order].tolist()
    t = L["t_ns"].to_numpy(np.int64)[m][order].tolist() if "t_ns" in L else [0] * len(seqs)
    want = set(targets)
    arr = np.array(seqs, np.int64)
    sp = []
    for a, b in spans or []:
        k = np.flatnonzero((arr >= a) & (arr <= b))
        if len(k):
            sp.append((int(k[0]), int(k[-1]), int(a)))
    return Window(seqs, t, [True] * len(seqs), {k for k, q in enumerate(seqs) if q in want}, sp)


def executed_window(executed, warm_forward: int, target_forwards: list[int]) -> Window:
    """The executions of the analysis' timeline (`mining.forwards` `executed`: one row per kernel
    execution, graph replays expanded, in order) from the first of `warm_forward` to the last of
    the last target forward; the targets' executions are measured, and every forward in it is a
    span whose id is its first live launch's seq (`compiler.inputs` ties a forward's replayed
    bytes to it by that id)."""
    E = executed
    fw = E["forward"].to_numpy()
    starts = np.flatnonzero(fw == warm_forward)
    ends = np.flatnonzero(np.isin(fw, target_forwards))
    if not len(starts) or not len(ends):
        raise PlanError(f"the analysis' timeline holds no execution of forward {warm_forward}"
                        if not len(starts) else "the analysis' timeline holds no execution of the target forwards")
    lo, hi = int(starts[0]), int(ends[-1])
    part = E.iloc[lo:hi + 1]
    seqs = part["seq"].to_numpy(np.int64).tolist()
    live = (part["replay"].to_numpy() < 0).tolist()
    f = part["forward"].to_numpy()
    spans = []
    for x in sorted({int(v) for v in f if v >= 0}):
        k = np.flatnonzero(f == x)
        lv = [seqs[j] for j in k if live[j]]
        spans.append((int(k[0]), int(k[-1]), int(min(lv) if lv else seqs[k[0]])))
    return Window(seqs, part["t_ns"].to_numpy(np.int64).tolist(), live,
                  {int(j) for j in np.flatnonzero(np.isin(f, target_forwards))}, spans)


def _private(plan: LaunchPlan, k: int) -> tuple[LaunchPlan, int]:
    """(`plan` with word k pointing at a copy of its region, appended as the last region, and
    where the copy starts in the original). The copy starts at the word's offset rounded down to
    REGION_ALIGN, as a plan's regions start at their lowest word: what lies below it is other
    words' memory, and copying a whole allocator segment per word made the copies most of a
    launch's traffic. The copy's loaded pointers are rewritten like the original's."""
    w = plan.words[k]
    g = plan.regions[w.region]
    cut = w.offset // REGION_ALIGN * REGION_ALIGN
    words = list(plan.words)
    new = len(plan.regions)
    words[k] = replace(w, region=new, offset=w.offset - cut)
    ind = plan.indirect + [(new, off - cut, tk, toff, cap) for r, off, tk, toff, cap in plan.indirect
                           if r == w.region and off >= cut]
    copy = replace(g, start=g.start + cut, length=g.length - cut)
    return replace(plan, regions=plan.regions + [copy], words=words, indirect=ind), cut


def _shared(plan: LaunchPlan) -> list[bool]:
    offs: dict[int, set] = {}
    for w in plan.words:
        offs.setdefault(w.region, set()).add(w.offset)
    return [len(offs[w.region]) > 1 for w in plan.words]


def _poison_loop(live: RN.Live, fill: RN.Fill, base: RN.Out, span: FL.Span, key, seed, faulted,
                 runs: RN.Masks, base_masks: RN.Masks) -> tuple[bool, str]:
    """Poison `span` (POISONS in order: small, bounded, any bytes, all ones) until a read shows;
    (read, how): "fault" for a span whose run faulted in an earlier worker, else "output" with
    whether the last poisoned run showed a read; a new fault raises Faulted(key). A run's read is
    judged on its own writes and the baseline's in the span's region, never on another run's (a
    run with another span poisoned may write elsewhere -- an index moved a scatter -- and those
    bytes, unwritten here, hold this span's poison: a read of nothing)."""
    if key in faulted:
        return True, "fault"
    read = False
    for kind in POISONS:
        fill_p = fill.with_poison(span.region, span.lo, FL.poison(span.hi - span.lo, seed, kind))
        try:
            got = live.run(fill_p)
        except CudaError as exc:
            if not exc.sticky:
                raise
            raise Faulted(key, str(exc)) from None
        mine = RN.Masks(len(fill.base)).add(got)
        runs.add(got)
        read = RN.read_changed(base, got, base_masks.merged_with(mine, span.region), span.region, span.lo, span.hi)
        if read:
            break
    return read, "output"


def measure_in_context(gpu, plan: LaunchPlan, init: list[np.ndarray], measure: bool = True, seed: int = 1,
                       faulted: frozenset = frozenset(), nonzero=None) -> tuple[LaunchResult, list | None]:
    """Run `plan` on `init` (its regions' bytes; `nonzero`: per region the ranges outside which
    they are zero, or None) and, when `measure`, its read and write sets by the module
    docstring's rules; returns (result, the baseline's changes: per region the (offset, bytes)
    ranges it changed, `replay.runs.Out.changes`). Faults raise `Faulted` (the caller restarts the
    worker; a poisoned span's fault counts as a read)."""
    res = LaunchResult(plan.seq, plan.symbol, "ok", fill="forward",
                       regions=[{"buffer_id": r.buffer_id, "start": r.start, "length": r.length,
                                 "alloc_size": r.alloc_size, "truncated": r.truncated, "host": r.host}
                                for r in plan.regions])
    s = _Setup(gpu, plan)
    fill = RN.Fill(list(init), nonzero=nonzero)
    try:
        live = RN.Live(s)
        try:
            after = live.run(fill)
        except CudaError as exc:
            if exc.sticky:
                raise Faulted(None, str(exc)) from None
            raise
        if not measure:
            return res, after.changes()
        again = live.run(fill)
        res.deterministic = RN.same(after, again)
        base_masks = RN.Masks(len(init)).add(after)
        runs = RN.Masks(len(init)).add(after)
        spans = FL.spans(plan.words, s.lengths)
        shared = _shared(plan)
        got: dict = {}
        if res.deterministic:
            for span, sh in zip(spans, shared):
                key = (span.region, span.lo, span.hi)
                if not sh and key not in got:
                    got[key] = _poison_loop(live, fill, after, span, key, seed, faulted, runs, base_masks)
        priv: dict[int, tuple[np.ndarray, bool | None, str]] = {}
        for k, (w, sh) in enumerate(zip(plan.words, shared)):
            if sh:
                priv[k] = _private_flow(gpu, plan, k, fill, seed, faulted, res.deterministic)
    finally:
        gpu.free_all()
    dense = [runs.dense(r, n) for r, n in enumerate(s.lengths)]
    res.bytes_written = int(sum(int(m.sum()) for m in dense))
    for k, (w, span, sh) in enumerate(zip(plan.words, spans, shared)):
        if sh:
            m, read, how = priv[k]
        else:
            m = dense[span.region][span.lo:span.hi]
            read, how = got.get((span.region, span.lo, span.hi), (None, ""))
        rg = FL.ranges(m)
        res.words.append(WordFlow(w.i, w.at, w.region, w.offset, int(m.sum()), len(rg), read, how,
                                  FL.direction(bool(m.any()), read), sh, bool(dense[w.region].any()), len(m),
                                  [list(r) for r in rg[:WRITTEN_RANGES]]))
    return res, after.changes()


def _private_flow(gpu, plan, k, given: RN.Fill, seed, faulted, judge) -> tuple[np.ndarray, bool | None, str]:
    """(bytes written through word k, from its offset, read?, how) with word k on a private copy of
    its region."""
    p, cut = _private(plan, k)
    w = p.words[k]
    r0 = plan.words[k].region
    nz = given.nonzero
    if nz is not None:
        nz = list(nz) + [None if nz[r0] is None else [(a - cut, b - cut) for a, b in RN.clipped(nz[r0], cut, 1 << 62)]]
    fill = RN.Fill(list(given.base) + [given.base[r0][cut:]], nonzero=nz)
    s = _Setup(gpu, p)
    try:
        live = RN.Live(s)
        after = live.run(fill)
        runs = RN.Masks(len(fill.base)).add(after)
        if not judge:
            return runs.dense(w.region, s.lengths[w.region])[w.offset:], None, ""
        span = FL.Span(w.region, w.offset, s.lengths[w.region])
        base_masks = RN.Masks(len(fill.base)).add(after)
        judged = _poison_loop(live, fill, after, span, ("private", plan.seq, k), seed, faulted, runs, base_masks)
        m = runs.dense(w.region, s.lengths[w.region])[w.offset:]
        return (m, *judged)
    finally:
        gpu.free_all()


# ---------------------------------------------------------------------------------- the window

def _worker(conn, device) -> None:
    """A replay process: jobs (plan, init, measure, faulted) in, (kind, payload) out; a fault ends it."""
    from replay.gpu import Gpu

    try:
        gpu = Gpu(device)
    except Exception as exc:  # noqa: BLE001 -- sent to the parent, which says it in one sentence
        conn.send(("nogpu", str(exc)))
        return
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        plan, packed, measure, faulted = job
        init, nonzero = _unpacked(packed)
        try:
            conn.send(("ok", measure_in_context(gpu, plan, init, measure, faulted=faulted, nonzero=nonzero)))
        except Faulted as f:
            conn.send(("fault", (f.span, f.message)))
            return
        except CudaError as exc:
            conn.send(("error", str(exc)))


class _Workers:
    """One live worker at a time; a new one after a fault or a death. A spare is started beside
    it: a poisoned span that faults kills its worker (the context's error is sticky), and a
    window of a few hundred launches has dozens of such spans; the next worker is then ready
    instead of starting Python, the driver and a context on the replay's path."""

    def __init__(self, device: int, timeout_s: float):
        import multiprocessing as mp

        self.ctx, self.device, self.timeout_s = mp.get_context("spawn"), device, timeout_s
        self.p = self.conn = None
        self.spare = None
        self.started = 0

    def _spawn(self):
        conn, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.device), daemon=True)
        p.start()
        child.close()
        return p, conn

    def _start(self):
        from replay.gpu import NoGpu

        self.p, self.conn = self.spare if self.spare is not None else self._spawn()
        self.spare = None
        try:
            kind, msg = self.conn.recv()
        except EOFError:            # the spare died waiting: start one in the foreground
            self.p, self.conn = self._spawn()
            kind, msg = self.conn.recv()
        if kind == "nogpu":
            raise NoGpu(msg)
        self.started += 1
        self.spare = self._spawn()

    @staticmethod
    def _end(p, conn):
        try:
            conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        p.join(timeout=10)
        if p.is_alive():
            p.kill()

    def _drop(self):
        """End the live worker (the spare stays)."""
        if self.p is not None:
            self._end(self.p, self.conn)
        self.p = self.conn = None

    def stop(self):
        self._drop()
        if self.spare is not None:
            self._end(*self.spare)
            self.spare = None

    def call(self, job):
        """(kind, payload); kind "dead" when the worker gave nothing in time or died."""
        if self.p is None or not self.p.is_alive():
            self._start()
        self.conn.send(job)
        if not self.conn.poll(self.timeout_s):
            self.p.kill()
            self.p = None
            return "dead", f"no result within {self.timeout_s:.0f} s (a kernel that does not end on these bytes)"
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            self.p = None
            return "dead", "the replay worker died"
        if kind == "fault":
            self._drop()
        return kind, payload


def _region_addr(r: Region) -> int:
    return r.alloc_base + r.start


TABLE_SCAN = 4 << 20          # regions up to this size are searched for loaded pointers


def allocations(dump) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bases, sizes, buffer ids) of every device allocation a pointer word of the dump lands in,
    sorted by base: where a pointer loaded from memory can be told from data."""
    P = dump.params
    P = P[P["is_ptr"].to_numpy() & (P["buffer_id"].to_numpy() >= 0)]
    u = P.drop_duplicates("buffer_id")[["alloc_base", "alloc_size", "buffer_id"]].sort_values("alloc_base")
    return (u["alloc_base"].to_numpy(np.uint64), u["alloc_size"].to_numpy(np.uint64), u["buffer_id"].to_numpy(np.int64))


def find_tables(plan: LaunchPlan, init: list[np.ndarray], allocs, max_region: int, memory: Memory
                ) -> tuple[LaunchPlan, list[np.ndarray]]:
    """`plan` with the pointers its regions' bytes hold (8-aligned words whose value lies inside a
    captured device allocation: a table of buffer addresses, as vLLM's block-table kernels load)
    in `indirect`, and a region for each target allocation the plan lacks (its bytes read from
    `memory`). A random data word lands inside an allocation with odds of its total size over 2^64;
    zeros and small integers never do. Only device regions up to TABLE_SCAN are searched."""
    bases, sizes, ids = allocs
    if len(bases) == 0:
        return plan, init
    regions, init, ind = list(plan.regions), list(init), []
    index = {r.buffer_id: k for k, r in enumerate(regions)}
    for k, r in enumerate(plan.regions):
        if r.host or r.length > TABLE_SCAN or r.length < 8:
            continue
        n = r.length // 8 * 8
        v = init[k][:n].view("<u8")
        cand = np.flatnonzero((v >= np.uint64(1 << 32)) & (v < np.uint64(1 << 47)))
        if len(cand) == 0:
            continue
        j = np.searchsorted(bases, v[cand], side="right") - 1
        ok = (j >= 0) & (v[cand] < bases[np.maximum(j, 0)] + sizes[np.maximum(j, 0)])
        for pos, jj in zip(cand[ok].tolist(), j[ok].tolist()):
            val, base, size, bid = int(v[pos]), int(bases[jj]), int(sizes[jj]), int(ids[jj])
            off = val - base
            t = index.get(bid)
            if t is None:
                start = off // (1 << 16) * (1 << 16)
                length = min(size - start, off - start + max_region)
                t = index[bid] = len(regions)
                regions.append(Region(bid, base, size, start, max(length, 1), length < size - start))
                init.append(memory.read(base + start, max(length, 1)))
            g = regions[t]
            if not (g.start <= off < g.start + g.length):
                continue      # beyond the region the launch's own words needed: left as captured
            ind.append((k, pos * 8, t, off - g.start, val))
    if not ind:
        return plan, init
    return replace(plan, regions=regions, indirect=ind), init


def _next_live(window: Window) -> list[int]:
    """Per execution, the seq of the first live launch at or after it (past the end: one more than
    the window's largest seq): where the copies a graph replay reads were counted."""
    out, nxt = [0] * len(window.seqs), max(window.seqs) + 1
    for k in range(len(window.seqs) - 1, -1, -1):
        if window.live[k]:
            nxt = window.seqs[k]
        out[k] = nxt
    return out


def replay_forward(dump, targets: list[int], warm_from: int | None = None, max_region: int = FORWARD_REGION,
                   device: int = 0, timeout_s: float = 120.0, progress=None, runner=None,
                   spans: list[tuple[int, int]] | None = None, contents_bytes: int = 0,
                   window: Window | None = None) -> ForwardReplay:
    """Replay every launch record from `warm_from` (default: the first target) to the last target
    in seq order on rebuilt memory, measuring the `targets` (module docstring); or, given a
    `window` (`executed_window`), its executions in the order they ran, measuring its targets.
    `runner(plan, init, measure) -> (LaunchResult, after | None)` runs one launch (default: on
    this machine's GPU in worker processes; tests pass a CPU model). With `contents_bytes`, every
    device address a launch of a span (`spans`: first and last seq of each forward of interest;
    a window's own spans) passes is recorded per span, with up to that many bytes of it before
    the launch (`vocab.contents`). Host writes land before the live launch they precede; before
    a graph replay's kernels, the copies made before that replay was launched (by host time)."""
    from mining.pointees import host_pointees

    if window is None:
        window = seq_window(dump, targets, warm_from, spans)
    seqs = window.seqs
    uniq = set(seqs)
    folder = dump.source.parent
    attrs, tmaps, hosts = read_attrs(folder, uniq), read_tensormaps(folder), read_host_ranges(folder)
    writes, unknown = copy_writes(getattr(dump, "copies", None))
    writes = timeline(writes + pointee_writes(host_pointees(dump, uniq)))
    out = ForwardReplay([], (seqs[0], seqs[-1]), copies_without_bytes=unknown)
    copies = getattr(dump, "copies", None)
    if copies is None:
        out.warnings.append("the capture has no copy log (copies.jsonl): memory holds only what the window's "
                            "launches wrote, so kernels that read the host's metadata see zeros")
    blind = blind_copies(copies)
    blind_hit: set[int] = set()
    mem = Memory()
    gemms = host_gemm.find(dump, sorted(uniq))
    allocs = allocations(dump)
    P = dump.params
    P = P[P["is_ptr"].to_numpy() & np.isin(P["seq"].to_numpy(), np.fromiter(uniq, np.int64))]
    ptr_values: dict[int, set] = {}
    for sq, v in zip(P["seq"].to_numpy(np.int64).tolist(), P["value"].to_numpy(np.uint64).tolist()):
        ptr_values.setdefault(sq, set()).add(int(v))
    fed: dict[int, int] = {}          # pointer value -> the first left-out launch given it
    seen_in: dict[int, set] = {}      # span start -> addresses recorded there
    want = window.targets
    at = 0
    early: set[int] = set()           # writes applied ahead of their launch, before a graph replay
    nxt = _next_live(window)
    workers = None
    if runner is None:
        workers = _Workers(device, timeout_s)
        runner = lambda plan, init, measure: _run_job(workers, plan, init, measure, mem)  # noqa: E731
    try:
        for n, seq in enumerate(seqs):
            if window.live[n]:
                while at < len(writes) and writes[at].seq_before <= seq:
                    if at not in early:
                        mem.write(writes[at].addr, writes[at].data)
                        out.host_writes += 1
                    at += 1
            else:
                # a graph node: the copies the host made before it launched the replay (they
                # precede the next live launch and came earlier in time); its own launch record's
                # pointees were the capture's
                k = at
                while k < len(writes) and writes[k].seq_before <= nxt[n]:
                    w = writes[k]
                    if k not in early and w.source == "copy" and w.t_ns is not None and w.t_ns <= window.t_ns[n]:
                        mem.write(w.addr, w.data)
                        early.add(k)
                        out.host_writes += 1
                    k += 1
            t0 = time.perf_counter()
            try:
                plan = plan_launch(dump, seq, max_region, attrs.get(seq, {}), tmaps, host_ranges=hosts)
            except PlanError as exc:
                plan, why = None, str(exc)
            else:
                why = plan.missing
            if contents_bytes and plan is not None:
                _record(out.contents, plan, seq, [(sid, a, b) for a, b, sid in window.spans if a <= n <= b],
                        seen_in, mem, contents_bytes)
            g = gemms.get(seq)
            if why and g is not None:
                if g.seq == seq:             # its split-K reduction, if any, is computed with it
                    host_gemm.run(g, mem)
                out.on_host.append(seq)
                if n in want:
                    out.results.append(LaunchResult(seq, plan.symbol if plan else "", "missing",
                                                    f"{why}; computed on the host (cuBLASLt GEMM)", fill="forward"))
                continue
            if why:
                out.skipped.append((seq, why))
                for v in ptr_values.get(seq, ()):
                    fed.setdefault(v, seq)
                if n in want:
                    out.results.append(LaunchResult(seq, plan.symbol if plan else "", "missing", why, fill="forward"))
                continue
            if n in want:
                for cs, before, dst, size in blind:
                    if before <= seq and any(_region_addr(r) < dst + size and dst < _region_addr(r) + r.length
                                             for r in plan.regions):
                        blind_hit.add(cs)
            init = [mem.read(_region_addr(r), r.length) for r in plan.regions]
            plan, init = find_tables(plan, init, allocs, max_region, mem)
            t1 = time.perf_counter()
            out.seconds["plan"] += t1 - t0
            res, after = runner(plan, init, n in want)
            out.seconds["measure" if n in want else "run"] += time.perf_counter() - t1
            if after is not None:
                out.ran += 1
                _write_back(mem, plan, init, after)
            elif res is not None:
                out.faults.append((seq, res.message, sorted({fed[w.captured] for w in plan.words if w.captured in fed})))
            if n in want:
                out.results.append(res)
            if progress:
                progress(n + 1, len(seqs), seq)
    finally:
        if workers is not None:
            out.workers_started = workers.started
            workers.stop()
    out.blind = sorted(blind_hit)
    if blind_hit:
        big = max(size for cs, _, _, size in blind if cs in blind_hit)
        out.warnings.append(f"{len(blind_hit)} host copies into the target launches' regions were logged without "
                            f"their bytes (up to {big} bytes, over MINE_CAPTURE_COPY_BYTES): those bytes are stale "
                            "or zero here; capture with MINE_CAPTURE_COPY_BYTES=65536")
    return out


def _write_back(mem: Memory, plan: LaunchPlan, init, after) -> None:
    """A launch's output into the rebuilt memory: `after` is per region either the (offset, bytes)
    ranges it changed (`replay.runs.Out.changes`, what the GPU runner sends) or the region's
    bytes whole (a CPU model of a launch)."""
    for r, b, a in zip(plan.regions, init, after):
        if isinstance(a, np.ndarray):
            mem.write_changed(_region_addr(r), b, a)
        else:
            for lo, d in a:
                mem.write_changed(_region_addr(r) + lo, b[lo:lo + len(d)], d)


def _record(out: list, plan: LaunchPlan, seq: int, spans, seen_in: dict, mem: Memory, limit: int) -> None:
    """The bytes of each device word of launch `seq`, in each span holding it (`spans`: (id, first,
    last index) of the window's spans around this execution; module
    `vocab.contents`): up to `limit` bytes of the word's span, as memory holds them before the
    launch runs -- at the first launch of the span that passes the address, and again at every
    later one that finds them changed. Why again: an engine's staging kernels write a forward's
    inputs inside the forward, before the layers read them; the first launch passing such an
    address is the staging kernel itself, which finds the previous step's values there."""
    from vocab.contents import Word

    lengths = [r.length for r in plan.regions]
    word_spans = FL.spans(plan.words, lengths)
    for span in (sid for sid, _a, _b in spans):    # forwards may overlap (sampling after the next's head)
        seen = seen_in.setdefault(span, {})
        for w, sp in zip(plan.words, word_spans):
            if plan.regions[w.region].host:
                continue
            n = min(limit, sp.hi - sp.lo)
            if n <= 0:
                continue
            now = mem.read(w.captured, n).tobytes()
            last = seen.get(w.captured)
            if last is not None and now[:len(last)] == last[:len(now)]:
                continue
            seen[w.captured] = now
            out.append(Word(span, seq, w.i, w.at, w.captured, now))


def _packed(init: list[np.ndarray], present: list[list[tuple[int, int]]]) -> list:
    """A job's regions as sent to a worker: per region (length, [(lo, bytes)] of the ranges that
    may be non-zero, `Memory.present`)."""
    return [(len(a), [(lo, a[lo:hi]) for lo, hi in nz]) for a, nz in zip(init, present)]


def _unpacked(packed) -> tuple[list[np.ndarray], list[list[tuple[int, int]]]]:
    init, nonzero = [], []
    for n, parts in packed:
        a = np.zeros(n, np.uint8)
        for lo, d in parts:
            a[lo:lo + len(d)] = d
        init.append(a)
        nonzero.append([(lo, lo + len(d)) for lo, d in parts])
    return init, nonzero


def _run_job(workers: _Workers, plan: LaunchPlan, init, measure: bool, mem: Memory):
    """(result, after) of one launch; a poisoned span's fault is retried in a fresh worker with
    that span counted as read; a baseline fault gives (fault result, None). Only the regions'
    written pages travel to the worker (`_packed`)."""
    faulted: set = set()
    job = _packed(init, [mem.present(_region_addr(r), r.length) for r in plan.regions])
    while True:
        kind, payload = workers.call((plan, job, measure, frozenset(faulted)))
        if kind == "ok":
            return payload
        if kind == "fault" and payload[0] is not None and payload[0] not in faulted:
            faulted.add(payload[0])
            continue
        status = "fault" if kind == "fault" else "error"
        msg = payload[1] if kind == "fault" else payload
        return LaunchResult(plan.seq, plan.symbol, status, msg, fill="forward"), None
