"""`mine gen k3`: Kimi-K3 prefill pipeline stages (P) or the TP8/EP8 decode manifest (D), with or
without decode-context parallelism (`--dcp`).

P: the whole 93-layer prefill manifest is generated, verified, then cut with the project's cut at
the first call of every stage's first layer (`l12.res_in`, `l24.res_in`, ...); each stage is
re-verified by the cut. D: generated and verified. Kernels come from kernels.toml; a kernel it
lacks stops generation with its name. Options are checked before any work: `--stages` must split
the layers, and the decode-only options (`--tp`, `--dcp`) are refused without `--decode` rather
than ignored. `-o/--out` is an `OutFolder` (refused when it holds files, unless `--force`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from mine.cmd_gen import gen_app

ROOT = Path(__file__).resolve().parent.parent


class RejectedManifest(ValueError):
    """A generated manifest failed verification (a generator bug, reported as one sentence)."""


def _verified(m: dict, what: str) -> dict:
    from manifests.verify import verify

    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the generated {what} fails verification ({len(bad)} violations, first: {bad[0]})")
    return m


def _folder(out):
    """`out` as an OutFolder; a bare path (the library callers' form) is written into as before,
    unchecked and unrecorded (the command checks its `--out` before it calls these)."""
    from mine.checks import OutFolder

    return out if isinstance(out, OutFolder) else OutFolder(out, checked=False)


def write_prefill(cfg, table, out, stages: int, experts: int, chunk: int, pack: int, max_ctx: int) -> list[Path]:
    from generators.k3 import layout, prefill
    from generators.k3.build import dumps
    from manifests.cut import cut, resolve_labels

    folder = _folder(out)
    whole = prefill.generate(cfg, table, experts, chunk, pack, max_ctx)  # cut() verifies it first
    at = resolve_labels(whole, [f"l{a}.res_in" for a, _ in layout.stage_bounds(cfg, stages)[1:]])
    parts = cut(whole, at)
    paths = []
    for s, stage in enumerate(parts):
        p = folder.path(f"p/stage{s}.json")
        p.write_text(dumps(stage))
        paths.append(p)
    folder.finish()
    return paths


def write_decode(cfg, table, out, experts: int, tp: int, max_ctx: int, dcp: bool = True) -> Path:
    from generators.k3 import decode
    from generators.k3.build import dumps

    folder = _folder(out)
    m = _verified(decode.generate(cfg, table, experts, tp, max_ctx, dcp=dcp), "decode manifest")
    p = folder.path("d.json")
    p.write_text(dumps(m))
    folder.finish()
    return p


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
    from generators.k3 import config as k3config
    from generators.k3 import layout
    from manifests.kernels import load_kernels
    from mine.checks import OutFolder

    if decode and stages is not None:
        raise ValueError("--stages is for the prefill stages; the decode manifest (--decode) is one rank group")
    if not decode and (tp is not None or dcp):
        raise ValueError(f"{'--tp' if tp is not None else '--dcp'} applies to the decode manifest; add --decode")
    stages = 8 if stages is None else stages
    tp = 8 if tp is None else tp
    toml = kernels if kernels is not None else kernels_toml
    folder = OutFolder(out, force, inputs=[config, toml])
    cfg = k3config.load(config)
    cfg.checkpoint(experts)
    if not decode:
        layout.stage_bounds(cfg, stages)  # refuses a count that does not split the layers, before work
    table = load_kernels(toml)
    if decode:
        typer.echo(write_decode(cfg, table, folder, experts, tp, max_ctx, dcp))
    else:
        for p in write_prefill(cfg, table, folder, stages, experts, chunk, pack, max_ctx):
            typer.echo(p)


def register(app: typer.Typer) -> None:
    gen_app.command("k3")(k3)
