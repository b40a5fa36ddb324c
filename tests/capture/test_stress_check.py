"""The GPU stress run's parts that run anywhere: stress.c compiles, and check.py's verdicts.

Why: the stress run itself (benchmarks/stress/run.sh) needs a GPU; what can be checked here is
that its program builds against the CUDA headers with warnings as errors, and that the checker
passes a clean run, passes a run whose capture turned off with its one line, and fails each way a
run can be wrong (counters that disagree with the launches made, a missing stderr line, a hung
program, an unreadable dump). The dumps are written with tests/helpers/binenc.py from the documented
format, not by the library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from binenc import record, write_functions
from capture import build_support
from paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "stress"))
import check  # noqa: E402


def test_stress_program_compiles(tmp_path):
    paths = build_support.find_cuda()
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread",
                    f"-I{paths.cuda_include}", "-c", str(ROOT / "benchmarks" / "stress" / "stress.c"),
                    "-o", str(tmp_path / "stress.o")], check=True)
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "stress" / "run.sh")], check=True)


def _process(dump: Path, pid: int, n: int, recorded: int | None = None, disabled: str | None = None,
             launches: int | None = None):
    d = dump / f"pid{pid}"
    d.mkdir(parents=True)
    rec = n if recorded is None else recorded
    (d / "launches.bin").write_bytes(b"".join(record(s, blob=bytes(8)) for s in range(rec)))
    write_functions(d, [{"layout": "kernel", "params_layout": [[0, 0, 8]]}])
    (d / "allocs.jsonl").write_text("")
    (d / "modules.jsonl").write_text("")
    meta = {"format_version": 1, "pid": pid, "options": {"format": "bin", "compact": 1, "alloc_log": 1,
                                                         "classify": 0},
            "counters": {"launches": n if launches is None else launches, "launches_recorded": rec}}
    if disabled:
        meta["disabled"] = disabled
    (d / "meta.json").write_text(json.dumps(meta))


def _truth(truth: Path, main: int, child: int, n: int, m: int, status=(0, 0)):
    truth.mkdir(parents=True)
    (truth / f"{main}.json").write_text(json.dumps({"pid": main, "role": "main", "launches": n,
                                                    "children": [child, 5], "child_status": list(status)}))
    (truth / f"{child}.json").write_text(json.dumps({"pid": child, "role": "child", "launches": m,
                                                     "children": []}))


def test_a_clean_run_passes(tmp_path):
    _process(tmp_path / "dump", 100, 40)
    _process(tmp_path / "dump", 101, 4)
    _truth(tmp_path / "truth", 100, 101, 40, 4)
    res = check.check_run(tmp_path / "dump", tmp_path / "truth", "", 0)
    assert res["ok"], res["problems"]
    assert sorted(p["read"] for p in res["processes"]) == [4, 40]


def test_capture_off_with_its_line_passes_and_without_it_fails(tmp_path):
    _process(tmp_path / "dump", 100, 40, recorded=25, launches=30, disabled="cannot write launches.bin")
    _process(tmp_path / "dump", 101, 4)
    _truth(tmp_path / "truth", 100, 101, 40, 4)
    line = "[mine-capture] capture off in pid 100: cannot write launches.bin (No space left on device)\n"
    assert check.check_run(tmp_path / "dump", tmp_path / "truth", line, 0)["ok"]
    res = check.check_run(tmp_path / "dump", tmp_path / "truth", "", 0)
    assert not res["ok"] and any("'capture off' line" in p for p in res["problems"])


@pytest.mark.parametrize("case", ["counters", "hung", "child", "records"])
def test_each_wrong_run_fails(tmp_path, case):
    n = 40
    _process(tmp_path / "dump", 100, n, launches=n - 1 if case == "counters" else None,
             recorded=n - 3 if case == "records" else None)
    if case == "records":   # the meta counts 40 recorded, the file holds 37
        meta = json.loads((tmp_path / "dump" / "pid100" / "meta.json").read_text())
        meta["counters"]["launches_recorded"] = n
        (tmp_path / "dump" / "pid100" / "meta.json").write_text(json.dumps(meta))
    _process(tmp_path / "dump", 101, 4)
    _truth(tmp_path / "truth", 100, 101, n, 4, status=(256, 0) if case == "child" else (0, 0))
    res = check.check_run(tmp_path / "dump", tmp_path / "truth", "", 124 if case == "hung" else 0)
    assert not res["ok"], case
    want = {"counters": "counters.launches 39 != 40", "hung": "hung", "child": "child exit statuses",
            "records": "37 record(s) read != launches_recorded 40"}[case]
    assert any(want in p for p in res["problems"]), res["problems"]
