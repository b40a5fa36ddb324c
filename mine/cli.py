"""The `mine` command: wires the stages together and nothing else.

Each stage registers its sub-commands from its own `mine.cmd_*` module, so the command modules
stay a few dozen lines over importable functions. Errors that a user can cause (bad paths, bad
input, a rejected manifest) surface from the stages as `OSError`, `ValueError` or `LookupError`
subclasses; here they become one sentence on stderr and exit code 2. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

app = typer.Typer(
    name="mine",
    help="Lift kernels out of a running CUDA process and compile them into kern manifests.\n\n"
    "  mine capture -- python serve.py      # dump every cubin and launch ABI\n\n"
    "  mine analyze dumped-kernels/pid123   # passes, call sites, pointer roles, fits\n\n"
    "  mine gen qwen3 --dump DUMP --config config.json --out manifests/qwen3/\n\n"
    "  mine verify manifests/qwen3/qwen3.json",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per stage; each exposes register(app). Listed in pipeline order.
COMMAND_MODULES = (
    "mine.cmd_capture",
    "mine.cmd_analyze",
    "mine.cmd_gen",
    "mine.cmd_gen_qwen3",
    "mine.cmd_gen_k3",
    "mine.cmd_k3",
    "mine.cmd_manifests",
    "mine.cmd_kernels",
)

for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # a stage not built yet must not break the others
        if exc.name != _name:
            raise
        continue
    _mod.register(app)

USER_ERRORS = (OSError, ValueError, LookupError)


def main() -> None:
    err = Console(stderr=True)
    try:
        app()
    except USER_ERRORS as exc:
        err.print(f"[bold red]mine: error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("mine: interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
