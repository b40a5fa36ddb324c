"""`mine kernels check|build`, `mine abi`, `mine cut`: thin commands over manifests.kernels/abi/cut.

Findings are printed one per line and give exit 1; input the user got wrong raises (exit 2 via
mine.cli).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

# The manifests modules (pyelftools, the toml reader) are imported inside each command: the CLI
# registers every command at start-up, and `mine capture` on a bare GPU host must not need them.

kernels_app = typer.Typer(help="Check and build the kernel pins of kernels.toml.", no_args_is_help=True)
TOML = typer.Option(Path("kernels.toml"), "--toml", help="The kernels.toml to read.")


def _report(findings, ok_line: str) -> None:
    for f in findings:
        typer.echo(str(f))
    if findings:
        raise typer.Exit(1)
    typer.echo(ok_line)


@kernels_app.command("check")
def kernels_check(build_dir: Optional[Path] = typer.Argument(None, help="Folder of built cubins named <variant>.cubin."),
                  toml: Path = TOML) -> None:
    """Pins well-formed, files present, cubins hash to their pins and fit their entries' ABI,
    every module of manifests/**/*.json pinned.

      mine kernels check                       # without built cubins: sources and prebuilt only
      mine kernels check build/kernels         # also the cubins `mine kernels build` wrote
    """
    if build_dir is not None and not build_dir.is_dir():
        raise NotADirectoryError(f"build dir {build_dir} is not a folder")
    from manifests.kernels import check_table, load_kernels

    table = load_kernels(toml)
    _report(check_table(table, build_dir), f"{len(table.modules)} modules pinned, all checks pass")


@kernels_app.command("build")
def kernels_build(out: Path = typer.Option(Path("build/kernels"), "--out", help="Where cubins go."),
                  toml: Path = TOML) -> None:
    """Compile every `source` module with the nvcc on PATH and compare with its pin.

      mine kernels build --out build/kernels && mine kernels check build/kernels
    """
    from manifests.kernels import build_table, load_kernels

    built = build_table(load_kernels(toml), out)
    bad = [f"{b.module}: built {b.sha256}, pinned otherwise ({b.path})" for b in built if not b.matches]
    _report(bad, f"{len(built)} modules built into {out}, every hash matches its pin")


def abi(manifest: Path = typer.Argument(..., help="Manifest JSON."),
        kernels: Path = typer.Option(..., "--kernels", help="Folder holding the modules' cubins.")) -> None:
    """Check every kernel launch of MANIFEST against its cubin, offline.

      mine abi manifests/qwen3/qwen3.json --kernels build/kernels
    """
    if not kernels.is_dir():
        raise NotADirectoryError(f"kernels dir {kernels} is not a folder")
    from manifests import jsonload
    from manifests.abi import check_abi

    _report(check_abi(jsonload.load_path(manifest), kernels), "every kernel launch fits its cubin")


def cut_cmd(manifest: Path = typer.Argument(..., help="Manifest JSON (verified)."),
            at: List[str] = typer.Option(..., "--at", help="Call label or index where a stage starts; repeat."),
            out: Path = typer.Option(..., "--out", help="Folder for stage0.json, stage1.json, ...")) -> None:
    """Split MANIFEST into pipeline stages at the given calls of its batch programs.

      mine cut qwen3.json --at l18.qkv_proj --out stages/      # two stages
      mine cut qwen3.json --at 146 --at 290 --out stages/      # three, by call index
    """
    from manifests import jsonload
    from manifests.cut import cut, resolve_labels

    doc = jsonload.load_path(manifest)
    stages = cut(doc, resolve_labels(doc, at))
    out.mkdir(parents=True, exist_ok=True)
    for s, stage in enumerate(stages):
        (out / f"stage{s}.json").write_text(json.dumps(stage, indent=1) + "\n")
    typer.echo(f"{len(stages)} stages written to {out} (cut id {stages[0]['cut']['id']})")


def register(app: typer.Typer) -> None:
    app.add_typer(kernels_app, name="kernels")
    app.command("abi")(abi)
    app.command("cut")(cut_cmd)
