"""`mine analyze PATH`: passes, call sites, pointer roles and fitted expressions of a dump.

A thin command over `mining.load.load_dump`, `mining.analyze.analyze` and the renderers; bad input
surfaces as `mining.load.DumpError` (a ValueError), which `mine.cli` turns into one sentence. A
damaged dump that still holds a readable launch record is analysed (exit 0), and what the readers
skipped is printed per file after the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from vocab.errors import UsageError


def analyze_cmd(
    path: Path = typer.Argument(..., help="pid<N>/ folder, dump folder (or its .tar.xz), launches.jsonl or launches.bin [.gz|.xz|.zst]"),
    pid: Optional[int] = typer.Option(None, help="pick this pid in a dump folder (default: most launches; "
                                      "a dump of rank processes: rank 0, with every rank lined up)"),
    gap_ms: Optional[float] = typer.Option(None, "--gap-ms", help="request gap threshold (default: from the data)"),
    per_forward: Optional[int] = typer.Option(None, "--per-forward", min=1, help="core kernel launches per forward (default: from the data)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the full result (docs/analysis-json.md)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the launch timeline as PNG"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace JSON"),
    no_cache: bool = typer.Option(False, "--no-cache", help="read and write no cache (an archive is unpacked "
                                  "into a temporary folder, removed at exit)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="the cache folder (default: "
                                             "$MINE_CACHE_DIR, else $XDG_CACHE_HOME/mine or ~/.cache/mine)"),
    section: Optional[str] = typer.Option(None, "--section", help="report sections, comma-separated: forwards, "
                                          "layers, strides, pointers, structs, fits, failures, partial, layout, names "
                                          "(default: forwards,layers, one screen)"),
    full: bool = typer.Option(False, "--full", help="the whole report: every section, every row"),
) -> None:
    """Find the passes in a dump, line up call sites, classify pointers and fit expressions.

    \b
    Examples:
      mine analyze tests/fixtures/vllm/vllm-offline.tar.xz      # the pid with the most launches
      mine analyze tests/fixtures/vllm/vllm-offline.tar.xz --section fits,failures,names
      mine analyze tests/fixtures/vllm/vllm-offline.tar.xz --json out/analysis.json --plot out/timeline.png
      mine analyze tests/fixtures/vllm/vllm-serve.tar.xz --gap-ms 5 --trace out/trace.json
    """
    from mine.checks import archive_named, check_outputs, progress
    from mining import plots, report
    from mining.analyze import analyze, to_json
    from mining.archive import unpack
    from mining.load import load_dump
    from mining.ranks import analyze_ranks, document_with_ranks
    from mining.ranks import lines as rank_lines

    sections = report.parse_sections(section)
    if gap_ms is not None and not gap_ms > 0:
        raise UsageError(f"--gap-ms must be more than 0 ms, got {gap_ms:g}", value=gap_ms, limit=0)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    # before the analysis: a wrong output path must not cost one, nor overwrite the capture
    check_outputs([path], {"--json": json_out, "--plot": plot, "--trace": trace})
    ranks = None
    with archive_named(path):
        where = path
        if pid is None:   # a dump of several rank processes: each analysed, lined up (docs/ranks.md)
            where = unpack(path, cache=not no_cache, cache_dir=cache_dir)
            with progress(f"looking for ranks in {path}"):
                ranks = analyze_ranks(where, cache=not no_cache, cache_dir=cache_dir, gap_ms=gap_ms,
                                      per_forward=per_forward)
        if ranks is not None:
            result, dump = ranks.main, ranks.main.dump
        else:
            with progress(f"reading {path}"):
                dump = load_dump(where, pid=pid, cache=not no_cache, cache_dir=cache_dir)
            with progress(f"analysing {len(dump.launches):,} launches"):
                result = analyze(dump, gap_ms=gap_ms, per_forward=per_forward)
    report.render(result, sections=sections, full=full, label=str(path))
    if ranks is not None:
        for line in rank_lines(ranks.doc):
            typer.echo(line)
    _print_damage(dump)
    for out in (json_out, plot, trace):
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
    if json_out:
        doc = to_json(result) if ranks is None else document_with_ranks(ranks).to_json()
        json_out.write_text(json.dumps(doc, indent=1))
        typer.echo(f"wrote {json_out}")
    if plot:
        plots.save_timeline(result, plot)
        typer.echo(f"wrote {plot}")
    if trace:
        plots.save_trace(result, trace)
        typer.echo(f"wrote {trace}")


def _print_damage(dump) -> None:
    """What the readers skipped, per file (mining/damage.py; docs/dump-format.md "Reading damaged
    dumps"): one line per damaged file, or one line saying nothing was skipped."""
    hurt = [r for r in dump.damage if r.damaged]
    if not hurt:
        typer.echo(f"damage: none ({sum(r.read for r in dump.damage)} record(s) read from "
                   f"{len(dump.damage)} file(s), nothing skipped)")
        return
    typer.echo(f"damage: {len(hurt)} of {len(dump.damage)} file(s) damaged")
    for r in hurt:
        typer.echo(f"  {r.sentence()}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_cmd)
