"""`mine replay DUMP`: re-run captured launches alone on this machine's GPU (replay/).

A thin command: selection (by seq, by kernel name, by forward and call site of the analysis),
then `replay.run.replay_seqs`, then a table or JSON. No GPU, no cuda-python, or a dump the plan
cannot use: one sentence, exit 2 (mine.cli).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import List, Optional

import typer

from vocab.errors import UsageError


def _forward_seqs(dump, forward: int) -> list[int]:
    from mining.analyze import analyze, document

    doc = document(analyze(dump))
    for f in doc.passes.forwards:
        if f.forward == forward:
            return [s for first, n in f.seqs for s in range(first, first + n)]
    raise UsageError(f"{dump.source}: the analysis finds no forward {forward} "
                     f"(it has {len(doc.passes.forwards)}, numbered from 0)")


def select(dump, seq: list[int], kernel: str | None, forward: int | None, limit: int) -> list[int]:
    """The launches to replay, in order (see `replay_cmd`'s options)."""
    L = dump.launches
    pool = _forward_seqs(dump, forward) if forward is not None else L["seq"].tolist()
    if seq:
        known = set(L["seq"].tolist())
        bad = [s for s in seq if s not in known]
        if bad:
            raise UsageError(f"{dump.source}: no launch record with seq {bad[0]}")
        return list(seq)
    if kernel:
        try:
            rx = re.compile(kernel)
        except re.error as exc:
            raise UsageError(f"--kernel {kernel!r} is not a regular expression ({exc})") from None
        names = dict(zip(L["seq"].tolist(), (L["symbol"].astype(str) + " " + L["name"].astype(str)).tolist()))
        pool = [s for s in pool if rx.search(names.get(s, ""))]
        if not pool:
            raise UsageError(f"{dump.source}: no launch{' of that forward' if forward is not None else ''} "
                             f"matches --kernel {kernel!r}")
        return pool[:limit]
    if forward is None:
        raise UsageError("say which launches: --seq N, --kernel REGEX or --forward F")
    return pool


def replay_cmd(
    dump_path: Path = typer.Argument(..., help="dump folder, pid<N>/ folder or its .tar.xz"),
    seq: List[int] = typer.Option([], "--seq", help="replay this launch record (repeatable)"),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="replay launches whose symbol or name matches this regex"),
    forward: Optional[int] = typer.Option(None, "--forward", help="replay every launch of this forward of the analysis"),
    limit: int = typer.Option(20, "--limit", min=1, help="at most this many launches for --kernel"),
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
) -> None:
    """Run captured launches again, alone, on this GPU: read/write set per pointer parameter,
    determinism, time.

    Examples:

      mine replay tests/fixtures/capture/probe.tar.xz --seq 0 --seq 3

      mine replay dumped-kernels --forward 5 --json replay.json
    """
    from mining.load import load_dump
    from replay.gpu import Gpu
    from replay.run import replay_seqs

    for out in (json_out, flow_out):
        if out is not None and (out.resolve() == dump_path.resolve() or
                                (analysis is not None and out.resolve() == analysis.resolve())):
            raise UsageError(f"{out}: an output may not be one of the inputs")
    if analysis is not None and flow_out is None:
        raise UsageError("--analysis is read for --flow-out; give --flow-out OUT.json too")
    Gpu().close()    # no GPU: say so before any work (the replays run in worker processes)
    dump = load_dump(dump_path, pid=pid, cache=not no_cache, cache_dir=cache_dir)
    seqs = select(dump, seq, kernel, forward, limit)
    results = replay_seqs(dump, seqs, reps=reps, judge_reads=not no_flow, max_region=max_region_mib << 20)
    _table(results, forward)
    if json_out:
        json_out.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
        typer.echo(f"wrote {json_out}")
    if flow_out:
        doc = with_flow(dump, results, analysis)
        flow_out.write_text(json.dumps(doc.to_json(), indent=1))
        typer.echo(f"wrote {flow_out} ({len(doc.flow)} measured pointer words)")


def with_flow(dump, results, analysis: Path | None):
    """The analysis (read from `analysis`, or computed) with its flow section from `results`."""
    from mining.contract import read_analysis
    from replay.sites import flow_words

    if analysis is not None:
        doc = read_analysis(analysis)
        if doc.source.launches != len(dump.launches):
            raise UsageError(f"{analysis} is the analysis of another capture ({doc.source.launches} launches; "
                             f"this dump has {len(dump.launches)})")
    else:
        from mining.analyze import analyze, document
        doc = document(analyze(dump))
    symbols = dict(zip(dump.launches["seq"].tolist(), dump.launches["symbol"].astype(str).tolist()))
    doc.flow, _ = flow_words(results, doc, symbols)
    return doc


def _table(results, forward) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"replayed launches{'' if forward is None else f' of forward {forward}'}")
    for col in ("seq", "kernel", "status", "µs (median)", "det.", "pointer params", "note"):
        t.add_column(col)
    for r in results:
        dirs = " ".join(f"{w.i}{'' if w.at == 0 else '+' + str(w.at)}:{w.direction}" for w in r.words)
        t.add_row(str(r.seq), r.symbol[:48], r.status, "" if r.time_us is None else f"{r.time_us:.2f}",
                  "" if r.deterministic is None else ("yes" if r.deterministic else "NO"), dirs, r.message[:80])
    c = Console()
    c.print(t)
    ok = [r for r in results if r.status == "ok"]
    c.print(f"{len(ok)} of {len(results)} replayed; kernel time sum {sum(r.time_us for r in ok):.1f} µs; "
            f"{sum(r.status == 'missing' for r in results)} without a cubin or layout, "
            f"{sum(r.status in ('fault', 'error') for r in results)} failed")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
