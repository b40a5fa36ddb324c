"""`mine compile`: a capture to a verified kern manifest, wiring inferred from the capture alone.

A thin command over `compiler.compile.compile_dump` (docs/compile.md: what it writes and what each
inference rests on). The output folder is checked first (`mine.checks.OutFolder`: refused when it
holds files, unless `--force`), so a wrong `--out` costs no analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def compile_cmd(
    dump: Path = typer.Argument(..., help="The capture: a dump folder (or its .tar.xz), a pid<N>/ folder or a launches file."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (manifest.json, provenance.json, kernels/)."),
    force: bool = typer.Option(False, "--force", help="Write into an existing --out folder (files of an earlier "
                               "run there are replaced, other files kept)."),
    analysis: Optional[Path] = typer.Option(None, "--analysis", help="The capture's analysis (`mine analyze --json`, "
                                            "or `mine replay --flow-out` with measured data flow); computed when omitted."),
    config: Optional[Path] = typer.Option(None, "--config", help="The checkpoint's config.json (default: the one in "
                                          "--weights): only vocab_size and max_position_embeddings are read: each "
                                          "program ends at its logits (the engine's sampling is left out) and the "
                                          "inputs get kern domains."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Checkpoint folder (*.safetensors) to bind the "
                                           "weight buffers to by the capture's snapshot bytes (MINE_CAPTURE_SNAPSHOT_AT; "
                                           "bytes no tensor holds go to weights/extra.safetensors)."),
    requests: Optional[Path] = typer.Option(None, "--requests", help="The requests the capture served (a truth file: "
                                            "prompts and outputs), to name inputs by content (docs/compile.md)."),
    contents: Optional[Path] = typer.Option(None, "--contents", help="What an in-order replay found at the forwards' "
                                            "pointer words (`mine replay --in-order --contents-out`): inputs the "
                                            "engine builds on the device are named from it."),
    explain_inputs: bool = typer.Option(False, "--explain-inputs", help="Only report each forward kind's host inputs "
                                        "(copies, host-mapped reads), their fill kinds and evidence; write inputs.json."),
    pid: Optional[int] = typer.Option(None, help="Which process of a multi-process dump (default: most launches)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Read and write no cache."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="The cache folder (default: $MINE_CACHE_DIR, "
                                             "else $XDG_CACHE_HOME/mine or ~/.cache/mine)."),
) -> None:
    """Compile a capture into a kern manifest (decode and prefill programs) with no model-specific wiring.

    \b
    Examples:
      mine compile tests/fixtures/vllm/vllm-offline.tar.xz -o out/compiled
      mine compile tests/fixtures/suite/tri_dense.tar.xz -o out/tri --force
      mine compile tests/fixtures/batched/q2b.tar.xz -o out/q2b --explain-inputs --requests tests/fixtures/batched/q2b.truth.json
    """
    from compiler.compile import check_inputs, compile_dump, explain_dump
    from mine.checks import OutFolder, archive_named, progress

    check_inputs(dump, analysis, config, weights, requests, contents)
    folder = OutFolder(out, force, inputs=[dump, analysis, config, weights, requests, contents])
    if explain_inputs:
        with archive_named(dump), progress(f"reading {dump} and naming its inputs"):
            lines = explain_dump(dump, folder, analysis=analysis, pid=pid, cache=not no_cache, cache_dir=cache_dir,
                                 requests=requests, contents=contents)
        for line in lines:
            typer.echo(line)
        return
    with archive_named(dump), progress(f"reading and compiling {dump}"):
        result = compile_dump(dump, folder, analysis=analysis, pid=pid, cache=not no_cache, cache_dir=cache_dir,
                              requests=requests, weights=weights, contents=contents, config=config)
    for line in result.lines():
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("compile")(compile_cmd)
