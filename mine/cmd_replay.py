"""`mine replay DUMP`: re-run captured launches alone on this machine's GPU (replay/).

A thin command: selection (`replay.select`: by seq, by kernel name, by forward of the analysis),
then `replay.run.replay_seqs` (each alone) or `replay.forward.replay_forward` (`--in-order`: the
window before a forward and the forward itself, in order, on memory rebuilt from the copy log and
host pointees), then a table or JSON (`replay.sites.with_flow` for `--flow-out`).
No GPU, no cuda-python, or a dump the plan cannot use: one sentence, exit 2 (mine.cli).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List, Optional

import typer

from vocab.errors import UsageError


def replay_cmd(
    dump_path: Path = typer.Argument(..., help="dump folder, pid<N>/ folder or its .tar.xz"),
    seq: List[int] = typer.Option([], "--seq", help="replay this launch record (repeatable)"),
    site: Optional[str] = typer.Option(None, "--site", help="replay this call site of the analysis (symbol#occurrence), "
                                       "one launch per forward that runs it"),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="replay launches whose symbol or name matches this regex"),
    forward: List[int] = typer.Option([], "--forward", help="replay every launch of this forward of the analysis "
                                      "(repeatable: with --in-order one window from the earliest one's warm start "
                                      "measures each of them)"),
    limit: int = typer.Option(20, "--limit", min=1, help="at most this many launches for --kernel or --site"),
    reps: int = typer.Option(20, "--reps", min=1, help="timed launches per kernel"),
    no_flow: bool = typer.Option(False, "--no-flow", help="skip the read-set runs (write sets and times only)"),
    max_region_mib: int = typer.Option(32, "--max-region-mib", min=1,
                                       help="MiB past the highest used offset of a large allocation"),
    pid: Optional[int] = typer.Option(None, help="pick this pid in a dump folder (default: most launches)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write every result as JSON"),
    no_cache: bool = typer.Option(False, "--no-cache", help="read and write no cache (an archive is unpacked "
                                  "into a temporary folder, removed at exit)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="the cache folder (default: "
                                             "$MINE_CACHE_DIR, else $XDG_CACHE_HOME/mine or ~/.cache/mine)"),
    analysis: Optional[Path] = typer.Option(None, "--analysis",
                                            help="the dump's analysis JSON (mine analyze --json) for --flow-out"),
    flow_out: Optional[Path] = typer.Option(None, "--flow-out",
                                            help="write the analysis with its `flow` section filled from these replays"),
    io: Optional[Path] = typer.Option(None, "--io", help="a mine-probe-io/1 side file of the captured program: "
                                      "replay its launches on the original bytes and compare what they write"),
    ceilings: bool = typer.Option(False, "--ceilings", help="measure the copy and bf16 GEMM ceilings and print "
                                  "each kernel's floor ratio"),
    in_order: bool = typer.Option(False, "--in-order", help="replay the selected launches in capture order on "
                                  "memory rebuilt from the copy log and host pointees (data-dependent kernels "
                                  "such as attention see their real metadata); no timing"),
    warm_from: Optional[int] = typer.Option(None, "--warm-from", help="with --in-order: begin the replay at this "
                                            "launch seq (default for --forward: the forward before the latest "
                                            "prefill at or before it)"),
    contents_out: Optional[Path] = typer.Option(None, "--contents-out", help="with --in-order: write the bytes each "
                                                "forward of the window found at its pointer words "
                                                "(mine-replay-contents/1, for mine compile --contents)"),
) -> None:
    """Run captured launches again, alone, on this GPU: read/write set per pointer parameter,
    determinism, time.

    Examples:

      mine replay tests/fixtures/capture/probe.tar.xz --seq 0 --seq 3

      mine replay dumped-kernels --site 'reshape_and_cache_kernel_flash#0' --limit 3

      mine replay dumped-kernels --forward 5 --ceilings --json replay.json

      mine replay probe-dump --io probe_io.json

      mine replay dumped-kernels --forward 7 --in-order --flow-out flow.json
    """
    from mining.load import load_dump
    from replay.gpu import Gpu
    from replay.run import replay_seqs
    from replay.select import select
    from replay.sites import with_flow

    for out in (json_out, flow_out, contents_out):
        if out is not None and (out.resolve() == dump_path.resolve() or
                                (analysis is not None and out.resolve() == analysis.resolve())):
            raise UsageError(f"{out}: an output may not be one of the inputs")
    if (warm_from is not None or contents_out is not None) and not in_order:
        raise UsageError("--warm-from and --contents-out are read for --in-order; give --in-order too")
    if in_order and (ceilings or io is not None):
        raise UsageError("--in-order measures data flow only: it takes neither --ceilings nor --io")
    if analysis is not None and flow_out is None:
        raise UsageError("--analysis is read for --flow-out; give --flow-out OUT.json too")
    if io is not None:
        from replay.contents import read_io
        read_io(io)   # a bad side file: one sentence before the GPU is touched
    gpu = Gpu()      # no GPU: say so before any work (the replays run in worker processes)
    ceil = None
    if ceilings:
        from replay.ceilings import measure
        ceil = measure(gpu)
    gpu.close()
    dump = load_dump(dump_path, pid=pid, cache=not no_cache, cache_dir=cache_dir)
    if io is not None:
        from replay.contents import check_dump
        _io_table(check_dump(dump, io, max_region=max_region_mib << 20))
        if not (seq or kernel or forward):
            return
    seqs = sorted({s for f in (forward or [None]) for s in select(dump, seq, kernel, f, limit, site=site)})
    if in_order:
        results = _in_order(dump, seqs, forward, warm_from, contents_out)
    else:
        results = replay_seqs(dump, seqs, reps=reps, judge_reads=not no_flow, max_region=max_region_mib << 20)
        _table(results, forward, ceil)
    if json_out:
        json_out.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
        typer.echo(f"wrote {json_out}")
    if flow_out:
        doc = with_flow(dump, results, analysis)
        flow_out.write_text(json.dumps(doc.to_json(), indent=1))
        typer.echo(f"wrote {flow_out} ({len(doc.flow)} measured pointer words)")


def _graph_window(a, doc, dump, forwards, warm_forward):
    """The execution-order window (replay.forward.executed_window) from the earliest warm-up
    forward to the target forwards, when CUDA-graph replays run inside it; else None (a seq range
    is then the same order)."""
    from replay.forward import executed_window

    E = a.passes.executed
    if E is None or not (E["replay"].to_numpy() >= 0).any():
        return None
    start = {f.forward: f.start_ns for f in doc.passes.forwards}
    warm = min((warm_forward(dump, f, doc) for f in forwards), key=lambda x: start[x])
    win = executed_window(E, warm, list(forwards))
    return win if not all(win.live) else None


def _in_order(dump, seqs, forwards, warm_from, contents_out=None):
    from rich.console import Console

    from mine.checks import every
    from mining.analyze import analyze, document
    from replay.forward import replay_forward
    from replay.select import warm_forward, warm_start
    from vocab.contents import Contents

    a = analyze(dump) if (warm_from is None and forwards) or contents_out else None
    doc = document(a) if a is not None else None
    window = None
    if warm_from is None and forwards:
        warm_from = min(warm_start(dump, f, doc) for f in forwards)
        window = _graph_window(a, doc, dump, forwards, warm_forward)
        if window is not None:
            Console().print(f"the window holds CUDA-graph replays: {len(window.seqs)} executions in the order they ran "
                            f"(graph kernels at each replay)")
    spans = None
    if contents_out is not None:
        spans = [(f.first_seq, f.last_seq) for f in doc.passes.forwards if f.n_launches]
    fr = replay_forward(dump, seqs, warm_from, spans=spans, contents_bytes=4096 if contents_out else 0, window=window,
                        progress=every(20.0))
    if contents_out is not None:
        contents_out.write_text(json.dumps(Contents(len(dump.launches), fr.window, 4096, fr.contents).to_json()))
        Console().print(f"wrote {contents_out} ({len(fr.contents)} words)")
    _table(fr.results, forwards)
    Console().print(f"in order from launch {fr.window[0]} to {fr.window[1]}: {fr.ran} ran, {len(fr.on_host)} cuBLASLt "
                    f"launches computed on the host, {len(fr.skipped)} could "
                    f"not (no cubin or layout), {len(fr.faults)} faulted; {fr.host_writes} host writes applied "
                    f"({fr.copies_without_bytes} copies kept without bytes)")
    t = fr.seconds
    Console().print(f"time: {t['measure']:.0f} s measuring the targets, {t['run']:.0f} s running the rest, "
                    f"{t['plan']:.0f} s planning; {fr.workers_started} replay worker(s) started")
    for w in fr.warnings:
        Console().print(f"  warning: {w}")
    for seq, msg, up in fr.faults:
        Console().print(f"  launch {seq} faulted ({msg})" + (f"; it was given buffers of launches left out: "
                                                              f"{', '.join(map(str, up[:5]))}" if up else ""))
    return fr.results


def _table(results, forwards, ceil=None) -> None:
    from rich.console import Console
    from rich.table import Table

    which = f" of forward{'s' if len(forwards) > 1 else ''} {', '.join(map(str, forwards))}" if forwards else ""
    t = Table(title=f"replayed launches{which}")
    cols = ["seq", "kernel", "status", "µs alone", "µs graph", "det.", "pointer params", "note"]
    if ceil is not None:
        cols.insert(5, "x write floor")
    for col in cols:
        t.add_column(col)
    for r in results:
        dirs = " ".join(f"{w.i}{'' if w.at == 0 else '+' + str(w.at)}:{w.direction}" for w in r.words)
        row = [str(r.seq), r.symbol[:48], r.status, "" if r.time_us is None else f"{r.time_us:.2f}",
               "" if r.time_us_graph is None else f"{r.time_us_graph:.2f}",
               "" if r.deterministic is None else ("yes" if r.deterministic else "NO"), dirs, r.message[:80]]
        if ceil is not None:
            fl = ceil.floor_us(r.bytes_written)
            row.insert(5, "" if r.time_us_graph is None or fl <= 0 else f"{r.time_us_graph / fl:,.0f}")
        t.add_row(*row)
    c = Console()
    c.print(t)
    ok = [r for r in results if r.status == "ok"]
    graph = sum(r.time_us_graph or 0.0 for r in ok)
    c.print(f"{len(ok)} of {len(results)} replayed; kernel time sum {sum(r.time_us or 0.0 for r in ok):.1f} µs alone, "
            f"{graph:.1f} µs back to back in graphs; {sum(r.status == 'missing' for r in results)} without a "
            f"cubin or layout, {sum(r.status in ('fault', 'error') for r in results)} failed")
    if ceil is not None:
        floor = sum(ceil.floor_us(r.bytes_written) for r in ok)
        gemm = "not measured: " + ceil.note if ceil.gemm_flop_s is None else f"{ceil.gemm_flop_s / 1e12:.0f} TFLOP/s"
        c.print(f"ceilings: copy {ceil.copy_bytes_s / 1e9:,.0f} GB/s, bf16 GEMM ({ceil.gemm_n}^3) {gemm}; "
                f"the replayed kernels' write floor {floor:.2f} µs")


def _io_table(results) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="launches replayed on the original run's bytes")
    for col in ("seq", "kernel", "status", "buffers compared", "bytes differing", "note"):
        t.add_column(col)
    for r in results:
        t.add_row(str(r.seq), r.kernel, r.status, str(sum(b["in_plan"] for b in r.buffers)),
                  str(sum(max(b["differing"], 0) for b in r.buffers)), r.message[:80])
    c = Console()
    c.print(t)
    c.print(f"{sum(r.status == 'same' for r in results)} of {len(results)} wrote what the original run wrote")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
