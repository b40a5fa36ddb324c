"""`mine analyze PATH`: passes, call sites, pointer roles and fitted expressions of a dump.

A thin command over `mining.load.load_dump`, `mining.analyze.analyze` and the renderers; bad input
surfaces as `mining.load.DumpError` (a ValueError), which `mine.cli` turns into one sentence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def analyze_cmd(
    path: Path = typer.Argument(..., help="pid<N>/ folder, dump folder (or its .tar.xz), launches.jsonl or launches.bin [.gz|.xz|.zst]"),
    pid: Optional[int] = typer.Option(None, help="pick this pid in a dump folder (default: most launches)"),
    gap_ms: Optional[float] = typer.Option(None, "--gap-ms", help="request gap threshold (default: from the data)"),
    per_forward: Optional[int] = typer.Option(None, "--per-forward", help="core kernel launches per forward (default: from the data)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the full result (docs/analysis-json.md)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the launch timeline as PNG"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace JSON"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not read or write .mine-cache/"),
) -> None:
    """Find the passes in a dump, line up call sites, classify pointers and fit expressions.

    Examples:

      mine analyze dumped-kernels                  # the pid with the most launches

      mine analyze dumped-kernels/pid123 --json analysis.json --plot timeline.png

      mine analyze launches.jsonl.zst --gap-ms 5 --trace trace.json
    """
    from mining import plots, report
    from mining.analyze import analyze, to_json
    from mining.load import load_dump

    dump = load_dump(path, pid=pid, cache=not no_cache)
    result = analyze(dump, gap_ms=gap_ms, per_forward=per_forward)
    report.render(result)
    if json_out:
        json_out.write_text(json.dumps(to_json(result), indent=1))
        typer.echo(f"wrote {json_out}")
    if plot:
        plots.save_timeline(result, plot)
        typer.echo(f"wrote {plot}")
    if trace:
        plots.save_trace(result, trace)
        typer.echo(f"wrote {trace}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_cmd)
