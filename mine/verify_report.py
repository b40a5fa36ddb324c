"""The text `mine verify` prints, without the CLI framework.

Why apart from the typer command: the verifier's time is a contract (at most 2x kern's, fresh
process each, docs/benchmarks.md), and a third of a small manifest's `mine verify` went to
importing typer, pydantic and rich. `mine.cli.main` answers a plain `mine verify PATH...` through
`run` before it builds the typer app; the typer command prints the same text through `report`.
"""

from __future__ import annotations

import sys


def _paint(color: bool, code: str, text: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def report(paths, color: bool = False) -> tuple[str, int]:
    """(text, exit code) for these manifest files: 0 all verified, 1 one rejected. Every file is
    read first: an unreadable one raises OSError / a MineError (exit 2 in the CLI) even among
    good ones."""
    from manifests.verify import verify_file

    results = [(p, verify_file(p)) for p in paths]
    out, rejected = [], 0
    for path, diags in results:
        if not diags:
            out.append(f"{_paint(color, '32', 'verified')} {path}")
            continue
        rejected += 1
        out.append(f"{_paint(color, '31', 'rejected')} {path}: {len(diags)} violation(s)")
        out += [f"  - {d.path}: {d.message} {_paint(color, '2', '[' + d.rule + ']')}" for d in diags]
    return "".join(line + "\n" for line in out), (1 if rejected else 0)


def handles(argv: list[str]) -> bool:
    """A plain `verify PATH...` (no option, no `--` and no path that looks like one)."""
    return len(argv) >= 2 and argv[0] == "verify" and not any(a.startswith("-") for a in argv[1:])


def run(argv: list[str]) -> int:
    """`mine verify PATH...` as `mine.cli.main` would answer it: bad input (a MineError, an
    unreadable file) is one sentence and 2; anything else is a bug, shown as one (exit 70)."""
    from vocab.errors import MineError

    try:
        text, code = report(argv[1:], color=sys.stdout.isatty())
    except (MineError, OSError) as exc:
        sys.stderr.write(f"mine: error: {exc}\n")
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: its traceback, never a bad-input sentence
        from mine.cli import INTERNAL_ERROR, internal_error

        internal_error(exc)
        return INTERNAL_ERROR
    sys.stdout.write(text)
    return code
