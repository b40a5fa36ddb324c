"""`mine verify MANIFEST...`: report every violation of every manifest, with JSON paths.

Exit codes: 0 every manifest verified, 1 at least one rejected, 2 input that is not a readable
manifest (missing file, not JSON, garbage, too big) -- raised as OSError/ValueError so `mine.cli`
prints one sentence. The checks themselves live in `manifests.verify`.
"""

from __future__ import annotations

from pathlib import Path

import typer


def verify_cmd(
    manifests: list[Path] = typer.Argument(..., help="Manifest JSON files (schema_version 7)."),
) -> None:
    """Verify kern manifests the way kern does, listing every violation.

    \b
    Examples:
      mine verify manifests/qwen3/qwen3.json
      mine verify manifests/k3/224/d.json manifests/k3/224/p/stage0.json
    """
    import sys

    from mine.verify_report import report

    text, code = report(manifests, color=sys.stdout.isatty())
    typer.echo(text, nl=False)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_cmd)
