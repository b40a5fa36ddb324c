"""`mine replay DUMP`: re-run captured launches alone on this machine's GPU (replay/).

A thin command: selection (`replay.select`: by seq, by kernel name, by forward of the analysis),
then `replay.run.replay_seqs`, then a table or JSON (`replay.sites.with_flow` for `--flow-out`).
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
    from replay.select import select
    from replay.sites import with_flow

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
