"""`mine compare` and `mine reference`: a manifest on kern judged against an engine's recorded run.

Thin commands over `compare/` (docs/compare.md): `reference` starts the vLLM recorder in a child
process (vLLM is imported only there), `compare` checks everything on the CPU first
(`compare.run.prepare`), then runs kern. Exit codes: 0 when every step is allowed, 1 when a step
is not (the first one is named), 2 for bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer



def compare_cmd(
    manifest: Path = typer.Argument(..., help="the manifest's folder (its JSON, kernels/, bindings) or its JSON"),
    weights: Path = typer.Option(..., "--weights", help="the checkpoint folder the reference was recorded on"),
    ref: Path = typer.Option(..., "--reference", help="the reference JSON (mine reference)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report (every step) as JSON"),
    tol_ulps: float = typer.Option(8.0, "--tol-ulps", min=0.0,
                                   help="the error bound in bf16 steps at the logits' magnitude"),
    tol: float = typer.Option(0.0, "--tol", min=0.0, help="an absolute floor on the error bound (logit units)"),
    logits: Optional[str] = typer.Option(None, "--logits", help="the logits buffer, where the manifest has several"),
    gpu: int = typer.Option(0, "--gpu", min=0, help="the GPU to run kern on"),
    no_free: bool = typer.Option(False, "--no-free-running", help="skip the free-running greedy runs"),
    prefill_rows: Optional[int] = typer.Option(None, "--prefill-rows", min=0,
                                               help="at most this many rows per prefill call (0: the prompt "
                                                    "through the decode program, a token a call); to tell a "
                                                    "prefill fault from a decode one"),
    batch: int = typer.Option(1, "--batch", min=1, help="run the teacher-forced loop this many requests at a "
                              "time through a batched manifest (its decode runs them in one call, each row "
                              "judged against its own request); free-running is then skipped"),
) -> None:
    """Run MANIFEST on kern teacher-forced on a reference's tokens and judge every step: kern's top-1
    against the reference's, the reference's own margin where they differ, kern's logit-difference
    error over the reference's top-k ids; plus free-running greedy agreement per request.

    Examples (need a GPU, kern-llm, the checkpoint and its reference):

      mine compare manifests/qwen3 --weights CKPT --reference ref.json --json compare.json
      mine compare out/q3t --weights CKPT --reference ref.json --prefill-rows 1   # prefill 1 row a call
      mine compare out/gen64 --weights CKPT --reference ref.json --batch 16      # 16 sequences a decode call
    """
    from mine.checks import check_outputs
    from compare import run, show, verdict

    check_outputs([manifest, weights, ref], {"--json": json_out})
    setup = run.prepare(manifest, weights, ref, logits)
    if prefill_rows is not None:
        setup = run.with_prefill_rows(setup, prefill_rows)
    bounds = verdict.Bounds(tol_ulps=tol_ulps, tol=tol)
    if batch > 1:
        run.check_batch(setup, batch)
    doc = run.compare(setup, bounds, gpu=gpu, free=not no_free, batch=batch)
    show.report(doc)
    if json_out is not None:
        run.write_report(doc, json_out)
        typer.echo(f"wrote {json_out}")
    raise typer.Exit(0 if doc["passed"] else 1)


def reference_cmd(
    checkpoint: Path = typer.Argument(..., help="the checkpoint folder (config.json, *.safetensors)"),
    out: Path = typer.Option(..., "--out", "-o", help="the reference JSON to write"),
    engine: Literal["vllm", "transformers"] = typer.Option("vllm", "--engine", help="the engine to record: vLLM, or "
                                                            "the checkpoint's Hugging Face transformers model (eager only)"),
    mode: Literal["eager", "default"] = typer.Option("eager", "--mode",
                                                     help="eager, or default (torch.compile + CUDA graphs)"),
    lengths: str = typer.Option("1,37,300,2500", "--lengths", help="prompt lengths, comma-separated"),
    new: int = typer.Option(64, "--new", min=1, help="new tokens per request"),
    seed: int = typer.Option(7, "--seed", help="seed of the prompts' token ids"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="a JSON list of token-id lists instead"),
    top_k: int = typer.Option(20, "--top-k", min=2, help="log-probabilities kept per step"),
    max_model_len: int = typer.Option(4096, "--max-model-len", min=2, help="the engine's context limit"),
) -> None:
    """Record a reference: the engine's greedy run of each prompt with every step's top-k
    log-probabilities (GPU host with the engine installed).

    Examples (need a GPU and vLLM):

      mine reference CKPT -o ref.json --lengths 1,37,300,2500 --new 64
      mine reference CKPT -o ref.json --engine transformers --lengths 1,37,300 --new 12
    """
    from mine.checks import check_outputs
    from compare import record

    check_outputs([checkpoint, prompts], {"--out": out})
    plan = record.check(checkpoint, engine=engine, mode=mode, lengths=lengths, new=new, max_model_len=max_model_len)
    rc = record.run(plan, out, seed=seed, prompts=prompts, top_k=top_k)
    if rc != 0:
        raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
    app.command("reference")(reference_cmd)
