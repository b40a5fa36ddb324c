"""The error model (vocab/errors.py, mine/cli.py): only a MineError or an OSError is bad input.

A bad input is one sentence and exit 2 (tests/cli/test_cli_bad_input.py walks every command); here
the other half: a bug inside a command (a KeyError, an IndexError, a plain ValueError) is never
dressed up as a bad-input sentence, but shows its traceback and `mine: internal error`, exit 70,
through the typer app and through `mine verify`'s fast path alike. Also: every exception class a
stage raises for input derives from MineError, which carries the offending value and its limit,
and `mine capture` finds its `--` in its own arguments, not in `sys.argv`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

import pytest

from mine.cli import INTERNAL_ERROR, main
from paths import FIXTURES, ROOT
from vocab.errors import MineError, UsageError

DUMP = FIXTURES / "vllm" / "vllm-offline.tar.xz"
QWEN3 = ROOT / "manifests" / "qwen3" / "qwen3.json"


def run_main(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _raiser(exc: BaseException):
    def boom(*_a, **_k):
        raise exc
    return boom


@pytest.mark.parametrize("bug", [KeyError("layer"), IndexError("list index out of range"),
                                 ValueError("a bug's message"), LookupError("no such thing")],
                         ids=lambda e: type(e).__name__)
def test_a_bug_inside_a_command_is_shown_as_a_bug(bug, monkeypatch, capsys):
    """A non-MineError raised deep in `mine analyze` (in the section parser it calls first) keeps
    its traceback and is named an internal error; it is not a one-sentence `mine: error:`."""
    from mining import report

    monkeypatch.setattr(report, "parse_sections", _raiser(bug))
    code, _, err = run_main(["analyze", str(DUMP)], capsys)
    assert code == INTERNAL_ERROR != 2
    assert "Traceback (most recent call last)" in err
    assert "in boom" in err  # the frame that raised is in the trace
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"mine: internal error: {type(bug).__name__}: "), last
    assert "mine: error:" not in err


def test_a_bug_in_verify_fast_path_is_shown_as_a_bug(monkeypatch, capsys):
    """`mine verify PATH` is answered without the typer app (mine/verify_report.py); a bug there
    is a bug too."""
    import manifests.verify

    monkeypatch.setattr(manifests.verify, "verify_file", _raiser(KeyError("modules")))
    code, out, err = run_main(["verify", str(QWEN3)], capsys)
    assert code == INTERNAL_ERROR
    assert "Traceback (most recent call last)" in err and "KeyError: 'modules'" in err
    assert err.strip().splitlines()[-1].startswith("mine: internal error: KeyError: ")
    assert out == ""


def test_a_mine_error_inside_a_command_is_one_sentence(monkeypatch, capsys):
    """The same place raising a MineError: one line, exit 2, no traceback."""
    from mining import report

    monkeypatch.setattr(report, "parse_sections", _raiser(UsageError("--section x: no such section")))
    code, _, err = run_main(["analyze", str(DUMP)], capsys)
    assert code == 2
    assert err.strip().splitlines() == ["mine: error: --section x: no such section"]


def test_capture_reads_its_own_arguments_not_sys_argv(monkeypatch, capsys, tmp_path):
    """`mine capture` without `--` is refused even when the process's sys.argv holds one (the
    command looks at what it was given, so `main(argv)` behaves as the installed `mine`)."""
    monkeypatch.setattr(sys, "argv", ["mine", "capture", "--", "true"])
    code, _, err = run_main(["capture", "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and "put the command after `--`" in err
    monkeypatch.setattr(sys, "argv", ["mine"])
    code, _, err = run_main(["capture", "-o", str(tmp_path / "out"), "--"], capsys)
    assert code == 2 and "no command given" in err  # `--` seen in the arguments: past that check


def test_a_mine_error_carries_its_value_and_limit():
    from capture import knobs
    from generators.k3 import config, layout

    with pytest.raises(UsageError) as exc:
        knobs.check_value("MINE_CAPTURE_HOST_BYTES", "5000")
    assert (exc.value.value, exc.value.limit) == (5000, 4096)
    cfg = config.load()
    with pytest.raises(MineError) as exc:
        layout.stage_bounds(cfg, 200)
    assert exc.value.value == 200 and exc.value.limit == cfg.num_hidden_layers
    assert isinstance(exc.value, ValueError)  # the builtin kind stays, for callers written against it


INTERNAL = {"replay.run.Faulted",               # control flow between a replay worker and its parent
            "capture.build_support.CudaNotFound"}  # raised while building, before any package imports


def test_every_error_class_of_the_stages_is_a_mine_error():
    """Each exception class defined in a stage package is a MineError (or one of the internal
    ones above): nothing the CLI must report can fall outside the model."""
    found, outside = [], []
    for pkg in ("vocab", "capture", "mining", "manifests", "generators", "replay", "mine"):
        base = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(base.__path__, pkg + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                mod = importlib.import_module(info.name)
            except ImportError:  # an optional stage dependency absent here (cuda-python)
                continue
            for name, obj in vars(mod).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found.append(f"{info.name}.{name}")
                    if not issubclass(obj, MineError) and f"{info.name}.{name}" not in INTERNAL:
                        outside.append(f"{info.name}.{name}")
    assert len(found) >= 20, found
    assert not outside, f"exception classes outside the error model: {outside}"
