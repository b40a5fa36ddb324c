"""`mine k3 memory` and `mine k3 binds`: per-rank memory and checkpoint binds of a K3 manifest.

Both read fields the verifier vouches for (buffer shapes, dtypes, binds), so the manifest is
verified first and refused with the verifier's first finding (`mine.checks.read_manifest`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from vocab.errors import UsageError

k3_app = typer.Typer(help="Inspect Kimi-K3 manifests (no GPU).", no_args_is_help=True)


def _load(path: Path) -> dict:
    from mine.checks import read_manifest

    return read_manifest(path)


@k3_app.command("memory")
def memory(manifest: Path = typer.Argument(..., help="Manifest JSON (verified first)."),
           hbm: float = typer.Option(274.2, help="HBM per GPU, GiB."),
           reserve: float = typer.Option(8.0, help="Reserved for the runtime, GiB.")) -> None:
    """Per-rank bytes by buffer kind, per-sequence state slots, KV tokens that fit.

    \b
    Example:
      mine k3 memory manifests/k3/224/d.json --hbm 139
    """
    from generators.k3.memory import GIB, rank_memory

    if not hbm > 0:
        raise UsageError(f"--hbm must be more than 0 GiB, got {hbm}", value=hbm, limit=0)
    if not 0 <= reserve < hbm:
        raise UsageError(f"--reserve must be at least 0 and less than --hbm ({hbm} GiB), got {reserve}",
                         value=reserve, limit=hbm)

    r = rank_memory(_load(manifest), hbm, reserve)
    for kind, n in r["by_kind"].items():
        typer.echo(f"{kind:10s} {n / GIB:10.2f} GiB")
    typer.echo(f"per-seq    {r['seq_slots']} slots x {r['state_bytes_per_seq']} B")
    typer.echo(f"kv         {r['state_bytes_per_token']} B/token; {r['kv_tokens_per_rank']} tokens per rank, "
               f"{r['kv_tokens_per_group']} per group of {r['position_group']}")


@k3_app.command("binds")
def binds(manifest: Path = typer.Argument(..., help="Manifest JSON (verified first)."),
          checkpoint_dir: Path = typer.Argument(..., help="Checkpoint folder of *.safetensors files.")) -> None:
    """Check every weight bind against the checkpoint's safetensors headers (no weights read).

    \b
    Example (needs the checkpoint):
      mine k3 binds manifests/k3/224/d.json /models/kimi-k3-pruned-75pct
    """
    from generators.k3.binds import check_binds, read_checkpoint

    r = check_binds(_load(manifest), read_checkpoint(checkpoint_dir))
    for kind, n in sorted(r["bytes_rank0"].items()):
        typer.echo(f"{kind:8s} {n} bytes bound (rank 0)")
    for p in r["problems"]:
        typer.echo(f"mismatch: {p}")
    typer.echo(f"{r['segments_checked']} segments checked, {len(r['problems'])} mismatches")
    if r["problems"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(k3_app, name="k3")
