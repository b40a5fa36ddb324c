"""Every example in the README's "Use" block and in every command's `--help` runs as written in a
fresh clone, and none writes into the repository's committed files (issue 20).

Why a clone: an example that only works because of something lying around in a developer's
checkout (a built folder, a cache, an earlier run's output) must fail here. The examples run with
the clone as the working folder, through the `mine` of this interpreter; each source (the README,
each command's help) starts without an `out/` folder, and its examples run in order (a later one
may read what an earlier one wrote). Examples under a heading that says what they need
("Example (needs nvcc):", "Examples (need a GPU and the model):") are not run here; the test
asserts that the rest is most of them, so a heading cannot quietly hide them all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

# commands whose examples cannot run on a machine without a GPU, with why
NOT_HERE = {"replay": "re-runs launches on an NVIDIA GPU through cuda-python"}


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    use = text[text.index("## Use\n"):]
    block = use[use.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    return [ln.strip() for ln in block.splitlines() if ln.strip().startswith("mine ")]


def help_examples() -> dict[str, list[str]]:
    """Command path -> the example lines of its help, from the help texts themselves."""
    from typer.main import get_command

    from mine.cli import app

    found: dict[str, list[str]] = {}

    def walk(cmd, path):
        lines, runnable = [], True
        for raw in (cmd.help or "").splitlines():
            ln = raw.strip().lstrip("\b").strip()
            if ln.lower().startswith("example"):
                head, _, inline = ln.partition(":")
                runnable = "need" not in head.lower()
                if not inline.strip().startswith("mine "):
                    continue
                ln = inline.strip()
            if ln.startswith("mine ") and runnable:
                lines.append(ln)
        if lines and " ".join(path) not in NOT_HERE:
            found[" ".join(path) or "mine"] = lines
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(get_command(app), ())
    return found


def all_help_lines() -> int:
    from typer.main import get_command

    from mine.cli import app

    n = 0

    def walk(cmd):
        nonlocal n  # every example line of a command's help, runnable or not
        n += sum(1 for ln in (cmd.help or "").splitlines() if re.match(r"\s*(Example\S*:\s*)?mine ", ln))
        for sub in (getattr(cmd, "commands", None) or {}).values():
            walk(sub)

    for name, sub in get_command(app).commands.items():
        if name not in NOT_HERE:
            walk(sub)
    n += sum(1 for ln in (get_command(app).help or "").splitlines() if ln.strip().startswith("mine "))
    return n


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    dest = tmp_path_factory.mktemp("clone") / "mine"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    return dest


def _shell(line: str, cwd: Path) -> subprocess.CompletedProcess:
    # `mine` is this interpreter's installed entry point (the code under test, with its built
    # capture library), first on PATH so the examples' own spelling runs; `python -m mine.cli`
    # would import the clone's copy from the working folder instead
    shim = Path(sys.executable).parent
    assert (shim / "mine").is_file(), "the package is not installed in this interpreter (pip install -e .)"
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="80")
    return subprocess.run(["bash", "-c", f"set -eo pipefail; {line}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _tracked_changes(clone: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout


def test_examples_are_found():
    assert len(readme_examples()) >= 10
    run = sum(len(v) for v in help_examples().values())
    # examples under a "need ..." heading are not run here; they stay the few (a GPU, an engine)
    assert run >= 15 and run >= 2 * (all_help_lines() - run), (run, all_help_lines())
    placeholder = re.compile(r"\b(DIR|DUMP|OUT)\b|pid1234")
    assert not [ln for v in help_examples().values() for ln in v if placeholder.search(ln)], \
        "an example uses a placeholder instead of a shipped path"


def _run_group(clone: Path, lines: list[str]) -> None:
    shutil.rmtree(clone / "out", ignore_errors=True)
    for line in lines:
        r = _shell(line, clone)
        assert r.returncode == 0, f"`{line}` failed ({r.returncode}):\n{r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_readme_examples_run_in_a_fresh_clone(clone):
    _run_group(clone, readme_examples())
    changed = [ln for ln in _tracked_changes(clone).splitlines() if not ln[3:].startswith("out/")]
    assert not changed, f"README examples wrote outside out/: {changed}"


@pytest.mark.slow
def test_help_examples_run_in_a_fresh_clone(clone):
    for where, lines in help_examples().items():
        _run_group(clone, lines)
        changed = [ln for ln in _tracked_changes(clone).splitlines() if not ln[3:].startswith("out/")]
        assert not changed, f"`{where}` help examples wrote outside out/: {changed}"


@pytest.mark.slow
def test_main_job_runs_twice_in_a_fresh_clone(clone):
    """The README's set-up command ends in examples/main-job.sh; a second run (over its own
    earlier output) must work too, and its report fits one 80-column screen."""
    shutil.rmtree(clone / "out", ignore_errors=True)
    for _ in range(2):
        r = _shell("examples/main-job.sh", clone)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.rstrip().endswith("equals the committed manifests/qwen3/qwen3.json byte for byte")
    report = r.stdout[:r.stdout.index("wrote out/analysis.json")].splitlines()
    assert len(report) <= 50 and max(map(len, report)) <= 80
    changed = [ln for ln in _tracked_changes(clone).splitlines() if not ln[3:].startswith("out/")]
    assert not changed, changed
