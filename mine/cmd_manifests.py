"""`mine verify MANIFEST...`: report every violation of every manifest, with JSON paths.

Exit codes: 0 every manifest verified, 1 at least one rejected, 2 input that is not a readable
manifest (missing file, not JSON, garbage, too big) -- raised as OSError/ValueError so `mine.cli`
prints one sentence. The checks themselves live in `manifests.verify`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from manifests.verify import verify_file


def verify_cmd(
    manifests: list[Path] = typer.Argument(..., help="Manifest JSON files (schema_version 7)."),
) -> None:
    """Verify kern manifests the way kern does, listing every violation.

    \b
    Examples:
      mine verify manifests/qwen3/qwen3.json
      mine verify manifests/k3/224/d.json manifests/k3/224/p/stage0.json
    """
    out = Console(highlight=False, soft_wrap=True)
    # Read everything first: an unreadable file is a usage error (exit 2) even among good ones.
    results = [(p, verify_file(p)) for p in manifests]
    rejected = 0
    for path, diags in results:
        if not diags:
            out.print(f"[green]verified[/] {escape(str(path))}")
            continue
        rejected += 1
        out.print(f"[red]rejected[/] {escape(str(path))}: {len(diags)} violation(s)")
        for d in diags:
            out.print(f"  - {escape(d.path)}: {escape(d.message)} [dim]\\[{d.rule}][/]")
    if rejected:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_cmd)
