"""`mine gen k3`: Kimi-K3 prefill pipeline stages (P) or the TP8/EP8 decode manifest (D), with or
without decode-context parallelism (`--dcp`).

P: the whole 93-layer prefill manifest is generated, verified, then cut with the project's cut at
the first call of every stage's first layer (`l12.res_in`, `l24.res_in`, ...); each stage is
re-verified by the cut. D: generated and verified. Kernels come from kernels.toml; a kernel it
lacks stops generation with its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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


def write_prefill(cfg, table, out: Path, stages: int, experts: int, chunk: int, pack: int, max_ctx: int) -> list[Path]:
    from generators.k3 import layout, prefill
    from generators.k3.build import dumps
    from manifests.cut import cut, resolve_labels

    whole = prefill.generate(cfg, table, experts, chunk, pack, max_ctx)  # cut() verifies it first
    at = resolve_labels(whole, [f"l{a}.res_in" for a, _ in layout.stage_bounds(cfg, stages)[1:]])
    parts = cut(whole, at)
    (out / "p").mkdir(parents=True, exist_ok=True)
    paths = []
    for s, stage in enumerate(parts):
        p = out / "p" / f"stage{s}.json"
        p.write_text(dumps(stage))
        paths.append(p)
    return paths


def write_decode(cfg, table, out: Path, experts: int, tp: int, max_ctx: int, dcp: bool = True) -> Path:
    from generators.k3 import decode
    from generators.k3.build import dumps

    m = _verified(decode.generate(cfg, table, experts, tp, max_ctx, dcp=dcp), "decode manifest")
    out.mkdir(parents=True, exist_ok=True)
    p = out / "d.json"
    p.write_text(dumps(m))
    return p


def k3(
    out: Path = typer.Option(..., "--out", help="Output directory (P: OUT/p/stage*.json, D: OUT/d.json)."),
    stages: int = typer.Option(8, help="Prefill pipeline stages (one GPU each)."),
    experts: int = typer.Option(896, help="Routed experts: 896 (kimi-k3) or 224 (kimi-k3-pruned-75pct)."),
    chunk: int = typer.Option(8192, help="Prefill rows per call."),
    pack: int = typer.Option(16, help="Sequences packed into one prefill call."),
    max_ctx: int = typer.Option(262144, "--max-ctx", help="Longest context (pages, expansion buffers)."),
    decode: bool = typer.Option(False, "--decode", help="Write the decode manifest instead of the prefill stages."),
    tp: int = typer.Option(8, help="Decode tensor/expert/context-parallel group size."),
    dcp: bool = typer.Option(False, "--dcp", help="Decode-context parallel: deal MLA KV positions over the group "
                             "(without it every member holds every token's KV; that form needs the "
                             "k3_mla_vup_gate pin, which kernels.toml lacks)."),
    config: Optional[Path] = typer.Option(None, help="A K3 config.json (default: the bundled one)."),
    kernels: Path = typer.Option(ROOT / "kernels.toml", show_default="kernels.toml of this repository",
                                 help="kernels.toml with the K3 pins."),
) -> None:
    """Generate Kimi-K3 kern manifests.

    Examples:
      mine gen k3 --stages 8 --experts 896 --out manifests/k3/896
      mine gen k3 --decode --tp 8 --dcp --out manifests/k3/896
      mine gen k3 --decode --tp 8 --out DIR   (plain TP8/EP8; stops naming the unpinned kernel)
    """
    from generators.k3 import config as k3config
    from manifests.kernels import load_kernels

    cfg = k3config.load(config)
    cfg.checkpoint(experts)
    table = load_kernels(kernels)
    if decode:
        typer.echo(write_decode(cfg, table, out, experts, tp, max_ctx, dcp))
    else:
        for p in write_prefill(cfg, table, out, stages, experts, chunk, pack, max_ctx):
            typer.echo(p)


def register(app: typer.Typer) -> None:
    gen_app.command("k3")(k3)
