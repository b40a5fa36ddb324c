"""`mine gen k3`: Kimi-K3 prefill pipeline stages (P) or the TP8/EP8 decode manifest (D), with or
without decode-context parallelism (`--dcp`).

A thin command over `generators.k3.generate.generate_k3` (what it writes and checks is documented
there). The options are checked first, then `-o/--out` (an `OutFolder`: refused when it holds
files, unless `--force`), both before any work; each path written is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from mine.cmd_gen import gen_app

ROOT = Path(__file__).resolve().parent.parent


def k3(
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (P: OUT/p/stage*.json, D: OUT/d.json)."),
    force: bool = typer.Option(False, "--force", help="Write into an existing --out folder (files of an "
                               "earlier run there are replaced, other files kept)."),
    stages: Optional[int] = typer.Option(None, min=1, show_default="8",
                                         help="Prefill pipeline stages (one GPU each)."),
    experts: Literal[896, 224] = typer.Option(896, help="Routed experts: 896 (kimi-k3) or 224 (kimi-k3-pruned-75pct)."),
    chunk: int = typer.Option(8192, min=1, help="Prefill rows per call."),
    pack: int = typer.Option(16, min=1, help="Sequences packed into one prefill call."),
    max_ctx: int = typer.Option(262144, "--max-ctx", min=1, help="Longest context (pages, expansion buffers)."),
    decode: bool = typer.Option(False, "--decode", help="Write the decode manifest instead of the prefill stages."),
    tp: Optional[int] = typer.Option(None, show_default="8", help="Decode tensor/expert/context-parallel group "
                                     "size (with --decode)."),
    dcp: bool = typer.Option(False, "--dcp", help="Decode-context parallel (with --decode): deal MLA KV positions "
                             "over the group (without it every member holds every token's KV; that form needs "
                             "the k3_mla_vup_gate pin, which kernels.toml lacks)."),
    config: Optional[Path] = typer.Option(None, help="A K3 config.json (default: the bundled one)."),
    kernels_toml: Path = typer.Option(ROOT / "kernels.toml", "--kernels-toml", show_default="kernels.toml of this "
                                      "repository", help="kernels.toml with the K3 pins."),
    kernels: Optional[Path] = typer.Option(None, "--kernels", hidden=True),
) -> None:
    """Generate Kimi-K3 kern manifests.

    \b
    Examples:
      mine gen k3 --stages 8 --experts 224 -o out/k3-224            # eight prefill stages
      mine gen k3 --decode --tp 8 --dcp --experts 224 -o out/k3-224-d   # TP8/EP8/DCP8 decode
    """
    from generators.k3.generate import check_options, generate_k3
    from mine.checks import OutFolder

    toml = kernels if kernels is not None else kernels_toml
    check_options(decode, stages, tp, dcp)
    folder = OutFolder(out, force, inputs=[config, toml])
    for p in generate_k3(folder, decode=decode, stages=stages, experts=experts, chunk=chunk, pack=pack,
                         max_ctx=max_ctx, tp=tp, dcp=dcp, config=config, kernels_toml=toml):
        typer.echo(p)


def register(app: typer.Typer) -> None:
    gen_app.command("k3")(k3)
