"""Replay a launch on the original run's bytes and compare what it writes with what the original
run wrote: the proof that a rebuilt launch (rebased pointers, re-encoded tensor maps, host-pointer
scalars kept, cluster dimension passed) computes the same thing, not only that it runs.

The bytes come from a side file the captured program writes (`mine-probe-io/1`, the capture probe's
PROBE_IO: examples/capture_probe/probe.cu): per launch, identified by kernel name and occurrence, the
captured device addresses of the buffers it touches, with their bytes before and after the launch;
`"beyond": "zero"` says every other byte of those allocations was zero. A capture cannot give
these bytes in general (it would have to snapshot device memory around every launch), which is why
the read/write sets of `replay.run` use synthetic fills.

Per launch: every region of the plan is zeroed, each buffer's `before` bytes are written at the
region offset of its captured address, the launch runs once, and the bytes at each address are read
back and compared with `after`. Not checked: bytes outside the snapshotted ranges (they are zero
before; a write there shows as a region change the report counts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vocab.errors import UsageError

FORMAT = "mine-probe-io/1"


@dataclass
class Snapshot:
    addr: int
    before: bytes
    after: bytes


@dataclass
class IoLaunch:
    kernel: str          # a substring of the launch's symbol
    nth: int             # its occurrence among the process's launches of that symbol, from 0
    buffers: list[Snapshot]


@dataclass
class ContentResult:
    seq: int
    symbol: str
    kernel: str
    status: str                      # same | differs | fault | missing | error
    message: str = ""
    buffers: list[dict] = field(default_factory=list)   # addr, bytes, differing, first_diff, changed_by_launch


def read_io(path: Path) -> list[IoLaunch]:
    """The side file, checked: one sentence (UsageError) for anything not of the format."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable {FORMAT} file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("beyond") != "zero":
        raise UsageError(f"{path}: not a {FORMAT} file (its format or 'beyond' key differs)")
    out = []
    try:
        for r in doc["launches"]:
            bufs = [Snapshot(int(b["addr"], 16), bytes.fromhex(b["before"]), bytes.fromhex(b["after"]))
                    for b in r["buffers"]]
            if any(len(b.before) != len(b.after) for b in bufs):
                raise ValueError("a buffer's before and after differ in length")
            out.append(IoLaunch(str(r["kernel"]), int(r["nth"]), bufs))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: a launch record of the {FORMAT} file is malformed ({exc})") from None
    return out


def match(dump, io: list[IoLaunch]) -> list[tuple[int | None, IoLaunch]]:
    """Each side-file launch's seq in the dump (None: the dump has no such launch)."""
    L = dump.launches.sort_values("seq")
    syms = L["symbol"].astype(str).tolist()
    seqs = L["seq"].tolist()
    out = []
    for r in io:
        hits = [s for s, y in zip(seqs, syms) if r.kernel in y]
        out.append((hits[r.nth] if r.nth < len(hits) else None, r))
    return out


def _place(plan, addr: int, n: int) -> tuple[int, int] | None:
    """(region index, offset) of captured bytes [addr, addr + n) inside one region of the plan."""
    for k, g in enumerate(plan.regions):
        lo = g.alloc_base + g.start
        if lo <= addr and addr + n <= lo + g.length:
            return k, addr - lo
    return None


def check_one(gpu, plan, io: IoLaunch) -> ContentResult:
    """Run `plan` once on `io`'s before-bytes and compare with its after-bytes (in this process)."""
    from replay.run import _Setup

    res = ContentResult(plan.seq, plan.symbol, io.kernel, "same")
    if plan.missing:
        res.status, res.message = "missing", plan.missing
        return res
    places = [(_place(plan, b.addr, len(b.before)), b) for b in io.buffers]
    s = _Setup(gpu, plan)
    try:
        host = [np.zeros(n, np.uint8) for n in s.lengths]
        for where, b in places:
            if where is not None:
                k, off = where
                host[k][off:off + len(b.before)] = np.frombuffer(b.before, np.uint8)
        for base, h in zip(s.bases, host):
            gpu.upload(base, h)
        after = s.run()
        for where, b in places:
            if where is None:     # a buffer the launch does not point into: it must be unchanged
                same = b.before == b.after
                res.buffers.append({"addr": hex(b.addr), "bytes": len(b.before), "in_plan": False,
                                    "differing": 0 if same else -1, "first_diff": None,
                                    "changed_by_launch": not same})
                if not same:
                    res.status = "differs"
                    res.message = f"buffer {b.addr:#x} changed in the original run but the launch does not point into it"
                continue
            k, off = where
            got = after[k][off:off + len(b.after)]
            want = np.frombuffer(b.after, np.uint8)
            diff = np.flatnonzero(got != want)
            res.buffers.append({"addr": hex(b.addr), "bytes": len(b.after), "in_plan": True,
                                "differing": int(diff.size), "first_diff": int(diff[0]) if diff.size else None,
                                "changed_by_launch": b.before != b.after})
            if diff.size:
                res.status = "differs"
        if res.status == "differs" and not res.message:
            bad = [b for b in res.buffers if b["differing"]]
            res.message = f"{len(bad)} buffer(s) differ from the original run, first {bad[0]['addr']} at byte {bad[0]['first_diff']}"
    finally:
        gpu.free_all()
    return res


def _worker(conn, jobs, device) -> None:
    from replay.gpu import CudaError, Gpu

    try:
        gpu = Gpu(device)
    except Exception as exc:  # noqa: BLE001 -- sent to the parent, which says it in one sentence
        conn.send(("nogpu", str(exc)))
        return
    for plan, io in jobs:
        try:
            conn.send(("ok", check_one(gpu, plan, io)))
        except CudaError as exc:
            conn.send(("fault", ContentResult(plan.seq, plan.symbol, io.kernel, "fault", str(exc))))
            return    # the parent goes on in a fresh worker (a sticky error leaves no usable context)
    conn.send(("done",))


def check_dump(dump, io_path: Path, device: int = 0, max_region: int | None = None) -> list[ContentResult]:
    """Every launch of the side file, replayed on its before-bytes in worker processes (a fault ends
    a worker; the next launch goes on in a fresh one)."""
    import multiprocessing as mp

    from replay.gpu import NoGpu
    from replay.plan import MAX_REGION, PlanError, plan_launch, read_attrs, read_host_ranges, read_tensormaps

    folder = dump.source.parent
    pairs = match(dump, read_io(io_path))
    results: list[ContentResult] = []
    jobs = []
    seqs = {s for s, _ in pairs if s is not None}
    attrs, tmaps, hosts = read_attrs(folder, seqs), read_tensormaps(folder), read_host_ranges(folder)
    for seq, io in pairs:
        if seq is None:
            results.append(ContentResult(-1, "", io.kernel, "missing",
                                         f"the dump has no launch {io.nth} of a symbol containing {io.kernel!r}"))
            continue
        try:
            jobs.append((plan_launch(dump, seq, max_region or MAX_REGION, attrs.get(seq, {}), tmaps,
                                     host_ranges=hosts), io))
        except PlanError as exc:
            results.append(ContentResult(seq, "", io.kernel, "missing", str(exc)))
    ctx = mp.get_context("spawn")
    while jobs:
        rx, tx = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(tx, jobs, device), daemon=True)
        p.start()
        tx.close()
        while jobs:
            if not rx.poll(120):
                p.kill()
                plan, io = jobs.pop(0)
                results.append(ContentResult(plan.seq, plan.symbol, io.kernel, "error", "no result within 120 s"))
                break
            try:
                msg = rx.recv()
            except EOFError:
                plan, io = jobs.pop(0)
                results.append(ContentResult(plan.seq, plan.symbol, io.kernel, "error", "the replay worker died"))
                break
            if msg[0] == "nogpu":
                raise NoGpu(msg[1])
            if msg[0] == "done":
                break
            results.append(msg[1])
            jobs.pop(0)
            if msg[0] == "fault":
                break
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return results
