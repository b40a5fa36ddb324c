"""`mine replay --in-order` says how far a window got while it runs: a GPU replay of a default-mode
window runs for minutes under a time limit, and a cut run must still show where it was."""
from __future__ import annotations

from mine.checks import every


def test_progress_prints_the_last_execution_and_throttles_the_rest(capsys):
    show = every(3600.0)
    for n in range(1, 6):
        show(n, 5, 100 + n)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: 5/5 executions (launch 105) after ")


def test_progress_with_no_throttle_prints_every_execution(capsys):
    show = every(0.0)
    for n in range(1, 4):
        show(n, 3, n)
    assert [ln.split(" (")[0] for ln in capsys.readouterr().err.strip().splitlines()] == [
        "replay: 1/3 executions", "replay: 2/3 executions", "replay: 3/3 executions"]
