"""`mine gen qwen3`: a vLLM Qwen3 capture to a verified kern manifest, its kernels and bindings.

A thin command over `generators.qwen3.generate.generate_qwen3` (what it writes and checks is
documented there). The inputs are checked, then the output folder (`mine.checks.OutFolder`:
refused when it holds files, unless `--force`; a `--force` run replaces what an earlier run wrote
and keeps the user's other files), all before the capture is read, so a wrong `--out` costs no
analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mine.cmd_gen import gen_app

ROOT = Path(__file__).resolve().parent.parent


def qwen3(
    dump: Path = typer.Option(..., "--dump", help="The capture: a dump folder (or its .tar.xz), a pid<N>/ folder "
                              "or a launches file."),
    config: Path = typer.Option(..., "--config", help="The model's config.json."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (qwen3.json, qwen3-bindings.safetensors, kernels/)."),
    force: bool = typer.Option(False, "--force", help="Write into an existing --out folder (files of an earlier "
                               "run there are replaced, other files kept)."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Checkpoint folder: check every bound tensor is there."),
    chunk: int = typer.Option(2048, help="Most rows one prefill call takes."),
    max_seqs: int = typer.Option(1, "--max-seqs", help="Most sequences one call serves: decode runs up to this "
                                 "many sequences a step (one token each), prefill packs up to this many prompts "
                                 "(1: one sequence a call)."),
    pid: Optional[int] = typer.Option(None, help="Which process of a multi-process dump (default: most launches)."),
    kernels_toml: Path = typer.Option(ROOT / "kernels.toml", "--kernels-toml", show_default="kernels.toml of this "
                                      "repository", help="kernels.toml with the own kernels' pins."),
    kernels: Optional[Path] = typer.Option(None, "--kernels", hidden=True),
    analysis: Optional[Path] = typer.Option(None, "--analysis",
                                            help="The capture's analysis (`mine analyze --json`); computed when omitted."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Read and write no cache (an archive is unpacked "
                                  "into a temporary folder, removed at exit)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="The cache folder (default: "
                                             "$MINE_CACHE_DIR, else $XDG_CACHE_HOME/mine or ~/.cache/mine)."),
    tp: bool = typer.Option(False, "--tp", help="The dump holds a tensor-parallel run's rank processes: one "
                            "manifest for all ranks (qwen3-tp.json; docs/ranks.md)."),
) -> None:
    """Generate the Qwen3 kern manifest from a vLLM capture.

    \b
    Examples:
      mine gen qwen3 --dump tests/fixtures/vllm/vllm-offline.tar.xz --config examples/vllm_qwen3/reference/config.json -o out/qwen3
      mine analyze tests/fixtures/vllm/vllm-offline.tar.xz --json out/a.json && mine gen qwen3 --dump tests/fixtures/vllm/vllm-offline.tar.xz --analysis out/a.json --config examples/vllm_qwen3/reference/config.json -o out/qwen3b
    """
    from generators.qwen3.generate import check_inputs, generate_qwen3
    from mine.checks import OutFolder, archive_named, progress
    from vocab.errors import UsageError

    toml = kernels if kernels is not None else kernels_toml
    check_inputs(dump, config, analysis, weights, chunk, max_seqs)
    folder = OutFolder(out, force, inputs=[dump, config, analysis, toml, weights])
    with archive_named(dump):
        if tp:
            from generators.qwen3.tp import generate_tp

            if pid is not None or analysis is not None or weights is not None or max_seqs != 1:
                raise UsageError("--tp reads every rank of the dump: it takes no --pid, --analysis, --weights "
                                 "or --max-seqs")
            with progress(f"reading and lining up the ranks of {dump}"):
                result = generate_tp(dump, config, folder, chunk=chunk, kernels_toml=toml, cache=not no_cache,
                                     cache_dir=cache_dir)
            for line in result.lines():
                typer.echo(line)
            return
        result = generate_qwen3(dump, config, folder, weights=weights, chunk=chunk, pid=pid, kernels_toml=toml,
                                analysis=analysis, progress=progress, cache=not no_cache, cache_dir=cache_dir,
                                max_seqs=max_seqs)
    for line in result.lines():
        typer.echo(line)


def register(app: typer.Typer) -> None:
    gen_app.command("qwen3")(qwen3)
