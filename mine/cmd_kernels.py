"""`mine kernels check|build`, `mine abi`, `mine cut`: thin commands over manifests.kernels/abi/cut.

Findings are printed one per line and give exit 1; input the user got wrong raises (exit 2 via
mine.cli). A manifest is verified before `abi` or `cut` reads it (`mine.checks.read_manifest`):
both walk fields the verifier vouches for. Options: `--kernels-toml FILE` names a kernels.toml
(default: this repository's), `--cubins DIR` a folder of cubins, `-o/--out DIR` the output folder
(refused when it exists unless `--force`; see `mine.checks.OutFolder`); the older spellings
`--toml` and `abi --kernels` still work, hidden from the help.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from vocab.errors import UsageError

# The manifests modules (pyelftools, the toml reader) are imported inside each command: the CLI
# registers every command at start-up, and `mine capture` on a bare GPU host must not need them.

ROOT = Path(__file__).resolve().parent.parent
kernels_app = typer.Typer(help="Check and build the kernel pins of kernels.toml.", no_args_is_help=True)


def kernels_toml_option():
    """`--kernels-toml FILE`, one spelling and one default for every command that reads pins: this
    repository's kernels.toml, found from the package, so the commands work from any folder."""
    return typer.Option(ROOT / "kernels.toml", "--kernels-toml", show_default="kernels.toml of this repository",
                        help="The kernels.toml with the module pins.", dir_okay=False)


def old_spelling(name: str):
    """A hidden alias for an option's earlier name, so scripts written against it keep working."""
    return typer.Option(None, name, hidden=True)


def pick(new, old):
    return old if old is not None else new


def _report(findings, ok_line: str) -> None:
    for f in findings:
        typer.echo(str(f))
    if findings:
        raise typer.Exit(1)
    typer.echo(ok_line)


@kernels_app.command("check")
def kernels_check(build_dir: Optional[Path] = typer.Argument(None, help="Folder of built cubins named <variant>.cubin."),
                  kernels_toml: Path = kernels_toml_option(),
                  toml: Optional[Path] = old_spelling("--toml")) -> None:
    """Pins well-formed, files present, cubins hash to their pins and fit their entries' ABI,
    every module of manifests/**/*.json pinned.

    \b
    Example:
      mine kernels check                       # without built cubins: sources and prebuilt only
    \b
    Example (needs the cubins `mine kernels build -o out/kernels` wrote, so nvcc):
      mine kernels check out/kernels           # also those cubins, hashed and ABI-checked
    """
    if build_dir is not None and not build_dir.is_dir():
        raise NotADirectoryError(f"build dir {build_dir} is not a folder")
    from manifests.kernels import check_table, load_kernels

    table = load_kernels(pick(kernels_toml, toml))
    _report(check_table(table, build_dir), f"{len(table.modules)} modules pinned, all checks pass")


@kernels_app.command("build")
def kernels_build(out: Path = typer.Option(Path("build/kernels"), "--out", "-o", help="Where cubins go."),
                  force: bool = typer.Option(False, "--force", help="Write into an existing --out folder."),
                  kernels_toml: Path = kernels_toml_option(),
                  toml: Optional[Path] = old_spelling("--toml")) -> None:
    """Compile every `source` module with the nvcc on PATH and compare with its pin.

    \b
    Example (needs nvcc):
      mine kernels build -o out/kernels && mine kernels check out/kernels
    """
    from manifests.kernels import build_table, load_kernels
    from mine.checks import OutFolder

    path = pick(kernels_toml, toml)
    table = load_kernels(path)
    folder = OutFolder(out, force, inputs=[path])
    built = build_table(table, out)
    for b in built:
        folder.path(b.path.name)
    folder.finish()
    bad = [f"{b.module}: built {b.sha256}, pinned otherwise ({b.path})" for b in built if not b.matches]
    _report(bad, f"{len(built)} modules built into {out}, every hash matches its pin")


def abi(manifest: Path = typer.Argument(..., help="Manifest JSON (verified first)."),
        cubins: Optional[Path] = typer.Option(None, "--cubins", help="Folder holding the modules' cubins.",
                                              show_default=False),
        kernels: Optional[Path] = old_spelling("--kernels")) -> None:
    """Check every kernel launch of MANIFEST against its cubin, offline.

    \b
    Example:
      mine abi manifests/qwen3/qwen3.json --cubins manifests/qwen3/kernels
    """
    folder = pick(cubins, kernels)
    if folder is None:
        raise UsageError("missing option --cubins: the folder holding the manifest's cubins")
    if not folder.is_dir():
        raise NotADirectoryError(f"--cubins {folder} is not a folder")
    from manifests.abi import check_abi
    from mine.checks import read_manifest

    doc = read_manifest(manifest)
    if not doc.get("modules"):
        raise UsageError(f"{manifest}: declares no modules, so there is no launch to check")
    _report(check_abi(doc, folder), "every kernel launch fits its cubin")


def cut_cmd(manifest: Path = typer.Argument(..., help="Manifest JSON (verified first)."),
            at: List[str] = typer.Option(..., "--at", help="Call label or index where a stage starts; repeat."),
            out: Path = typer.Option(..., "--out", "-o", help="Folder for stage0.json, stage1.json, ..."),
            force: bool = typer.Option(False, "--force", help="Write into an existing --out folder (stages of "
                                       "an earlier cut there are replaced, other files kept).")) -> None:
    """Split MANIFEST into pipeline stages at the given calls of its batch programs.

    \b
    Examples:
      mine cut manifests/qwen3/qwen3.json --at l14.in_norm -o out/stages      # two stages
      mine cut manifests/qwen3/qwen3.json --at 100 --at 200 -o out/stages3   # three, by call index
    """
    from manifests.cut import cut, resolve_labels
    from mine.checks import OutFolder, read_manifest

    folder = OutFolder(out, force, inputs=[manifest])
    doc = read_manifest(manifest)
    stages = cut(doc, resolve_labels(doc, at))
    for s, stage in enumerate(stages):
        folder.path(f"stage{s}.json").write_text(json.dumps(stage, indent=1) + "\n")
    folder.finish()
    typer.echo(f"{len(stages)} stages written to {out} (cut id {stages[0]['cut']['id']})")


def register(app: typer.Typer) -> None:
    app.add_typer(kernels_app, name="kernels")
    app.command("abi")(abi)
    app.command("cut")(cut_cmd)
