"""The `mine` command: wires the stages together and nothing else.

Each stage registers its sub-commands from its own `mine.cmd_*` module, so the command modules
stay a few lines over importable functions. Errors that a user can cause (bad input, a rejected
manifest) surface from the stages as `vocab.errors.MineError` subclasses, and a file that cannot
be read or written as an `OSError`; here those two become one sentence on stderr and exit code 2.
Usage errors (a bad flag value, a missing option) are one sentence too, naming the flag.

Anything else that escapes a command (a `KeyError`, `IndexError`, plain `ValueError`, ...) is a
bug in mine, not a fault of the input, and is shown as one: its traceback, then the line
`mine: internal error: ...` on stderr, and exit code 70 (EX_SOFTWARE), which no bad input gives.
"""

from __future__ import annotations

import sys

_APP = None


def _build_app():
    """The typer app with every stage's commands registered (built once, on first use: a plain
    `mine verify PATH...` never needs it, `mine.verify_report`)."""
    global _APP
    if _APP is not None:
        return _APP
    import importlib

    import typer

    app = typer.Typer(
        name="mine",
        help="Lift kernels out of a running CUDA process and compile them into kern manifests.\n\n"
        "\b\nExamples (from a clone of the repository):\n"
        "  mine capture -o out/dump -- python3 -c pass                # dump every cubin and launch ABI\n"
        "  mine analyze tests/fixtures/vllm/vllm-offline.tar.xz       # passes, call sites, pointer roles, fits\n"
        "  mine gen qwen3 --dump tests/fixtures/vllm/vllm-offline.tar.xz"
        " --config examples/vllm_qwen3/reference/config.json -o out/qwen3\n"
        "  mine verify manifests/qwen3/qwen3.json",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


    def _version(value: bool) -> None:
        if value:
            from mine import __version__

            typer.echo(f"mine {__version__}")
            raise typer.Exit()


    @app.callback()
    def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
        """Lift kernels out of a running CUDA process and compile them into kern manifests."""

    # One module per stage; each exposes register(app). Listed in pipeline order.
    COMMAND_MODULES = (
        "mine.cmd_capture",
        "mine.cmd_analyze",
        "mine.cmd_gen",
        "mine.cmd_gen_qwen3",
        "mine.cmd_gen_k3",
        "mine.cmd_compile",
        "mine.cmd_k3",
        "mine.cmd_manifests",
        "mine.cmd_kernels",
        "mine.cmd_replay",
        "mine.cmd_compare",
    )

    for _name in COMMAND_MODULES:
        try:
            _mod = importlib.import_module(_name)
        except ModuleNotFoundError as exc:  # a stage not built yet must not break the others
            if exc.name != _name:
                raise
            continue
        _mod.register(app)

    def _flags_take_no_value() -> None:
        """Typer's rich help shows `<bool>` beside on/off flags (`--force`, `--decode`), which reads as
        if they took a value; show nothing there, as for click's plain help. Guarded: the hook is
        typer's, and a typer without it keeps its own rendering."""
        from typer import core

        show = getattr(core.TyperOption, "display_type_rich", None)
        if show is None:
            return

        def display(self, ctx):
            return None if self.is_flag else show(self, ctx)

        core.TyperOption.display_type_rich = display


    _flags_take_no_value()
    _APP = app
    return app


def __getattr__(name: str):
    if name == "app":            # `from mine.cli import app` builds it
        return _build_app()
    raise AttributeError(name)


def _user_errors() -> tuple:
    """What the CLI reports as one sentence: the error model's base and unreadable files."""
    from vocab.errors import MineError

    return (MineError, OSError)


INTERNAL_ERROR = 70  # sysexits EX_SOFTWARE: a bug in mine


def _usage_errors():
    """Click's usage-error classes, from typer's vendored click or from click itself."""
    try:
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:  # typers before click was vendored
        from click.exceptions import UsageError

        try:
            from click.exceptions import NoArgsIsHelpError
        except ImportError:
            NoArgsIsHelpError = ()
    return UsageError, NoArgsIsHelpError


def internal_error(exc: BaseException) -> None:
    """Show `exc` as the bug it is: the traceback, then one line saying so (stderr)."""
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    sys.stderr.write(f"mine: internal error: {type(exc).__name__}: {exc} (a bug in mine, not a fault of "
                     "the input; the traceback above shows where)\n")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; every error the user can cause ends as one line on stderr.

    Typer's own handling of a usage error (a bad flag value, a missing option) draws a box of
    several lines around it; here it is the same one sentence as every other user error, naming
    the flag, with the command to ask for help."""
    from mine import verify_report

    if verify_report.handles(sys.argv[1:] if argv is None else argv):
        sys.exit(verify_report.run(sys.argv[1:] if argv is None else argv))
    import typer
    from rich.console import Console
    from rich.markup import escape

    app = _build_app()
    err = Console(stderr=True)
    usage, no_args = _usage_errors()
    try:
        code = app(args=argv, prog_name="mine", standalone_mode=False)
    except no_args as exc:
        exc.show()
        sys.exit(2)
    except usage as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "mine"
        msg = exc.format_message().rstrip(".")
        err.print(f"[bold red]mine: error:[/] {escape(msg)} (see `{escape(where)} -h`)", highlight=False,
                  soft_wrap=True)
        sys.exit(exc.exit_code)
    except _user_errors() as exc:
        # escaped: messages quote user values and rule ids in brackets, which are not markup
        err.print(f"[bold red]mine: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("mine: interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - a bug: shown as one, never as a bad-input sentence
        internal_error(exc)
        sys.exit(INTERNAL_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
