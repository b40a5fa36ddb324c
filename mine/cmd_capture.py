"""`mine capture [OPTIONS] -- CMD ARGS...`: run CMD with the capture library injected.

A thin layer over `capture.launcher.run_capture`; the exit code is CMD's. Defaults: binary launch
records through the mmap writer, the cheapest capture measured on the H200 (docs/benchmarks.md,
"Capture overhead"); the library's own defaults (a bare CUDA_INJECTION64_PATH) stay json + write.
Bad input (no `--`, no command, command not found, output folder that is a file) is one sentence
and exit code 2. Whether CMD came after `--` is read from the command's own arguments as click
parses them (`AfterDashDash`), never from `sys.argv`, so `mine.cli.main(argv)` behaves as the
installed `mine` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer
from typer.core import TyperCommand

DASHDASH = "mine.capture.dashdash"  # ctx.meta key: the command line holds `--`


class AfterDashDash(TyperCommand):
    """The capture command: records whether its arguments hold `--` before click drops it (the
    command to run must follow it; without it `mine capture python x.py` would read as options)."""

    def parse_args(self, ctx, args):
        ctx.meta[DASHDASH] = "--" in args
        return super().parse_args(ctx, args)


def capture(
    ctx: typer.Context,
    out: Path = typer.Option(Path("dumped-kernels"), "--out", "-o", help="dump folder (MINE_CAPTURE_DIR)"),
    include: str = typer.Option(None, help="only record symbols matching this extended regex"),
    exclude: str = typer.Option(None, help="do not record symbols matching this extended regex"),
    max_launches: int = typer.Option(None, min=0, help="per process; past it launches are only counted"),
    max_bytes: int = typer.Option(None, min=0, help="per process, all dump files together"),
    skip: int = typer.Option(None, min=0, help="do not record the first N launches"),
    modules_only: bool = typer.Option(False, "--modules-only", help="record modules and cubins, no launches"),
    host_bytes: int = typer.Option(None, min=0, max=4096, help="bytes copied from a host pointee (64)"),
    fmt: Literal["bin", "json"] = typer.Option(
        "bin", "--format", help="launch records: bin (launches.bin: fixed binary records, pointers classified "
        "offline from the allocation log; lowest overhead) or json (launches.jsonl; docs/dump-format.md)"),
    writer: Literal["mmap", "write"] = typer.Option(
        "mmap", help="mmap (no system call per launch) or write (one write(2) per record)"),
) -> None:
    """Run CMD with every cubin and kernel launch recorded.

    \b
    Examples:
      mine capture -o out/dump -- python3 -c pass   # no CUDA here: an empty dump
    \b
    Examples (need a GPU and the model):
      mine capture -- python serve.py --model Qwen/Qwen3-4B
      mine capture -o dumps/qwen --include 'gemm|attn' --max-launches 100000 -- python bench.py
    """
    from capture import launcher

    if not ctx.meta.get(DASHDASH):
        raise launcher.CaptureInputError(
            "put the command after `--`: mine capture [OPTIONS] -- CMD [ARGS...].")
    code, summaries = launcher.run_capture(
        list(ctx.args), out, include=include, exclude=exclude, max_launches=max_launches, max_bytes=max_bytes,
        skip=skip, modules_only=1 if modules_only else None, host_bytes=host_bytes,
        format=fmt, writer=writer)
    launcher.render(summaries)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command(
        "capture",
        cls=AfterDashDash,
        options_metavar="[OPTIONS] -- CMD [ARGS]...",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(capture)
