"""`mine gen MODEL`: the group that per-model generator commands hang off.

Each model's command lives in its own module (`mine.cmd_gen_<model>`) and adds itself to
`gen_app` in its `register`.
"""

from __future__ import annotations

import typer

gen_app = typer.Typer(
    help="Generate kern manifests for a model (qwen3, k3).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(gen_app, name="gen")
