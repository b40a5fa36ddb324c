"""Checks one stress run (benchmarks/stress/run.sh): every dump readable, meta.json's counters
matching the launches the program made, one line on stderr for each capture that turned off.

    python benchmarks/stress/check.py RUN_DUMP_DIR TRUTH_DIR STDERR_FILE RC [--label L] [--json OUT]
    python benchmarks/stress/check.py --summary RESULTS_JSONL

Why a script of its own: the run happens on a GPU machine under a full filesystem and an address
space limit; this part reads only files, so it is the same code on any machine (and tested on CPU
by tests/capture/test_stress_check.py). The truth is what the stress program wrote about itself
(TRUTH_DIR/<pid>.json: launches made, children); the dump is what the injected library wrote.

Rules, per process the program reports:
- capture stayed on (meta.json has no `disabled`): `counters.launches` equals the launches made,
  `launches_recorded` equals `launches` (no filter is set), the launch file reads exactly
  `launches_recorded` records, and no dump file has damage;
- capture turned off: exactly one `capture off in pid <pid>` line on stderr, `launches` at most
  the launches made, the launch file reads exactly `launches_recorded` records (a record the full
  filesystem cut short is cut back off the file and not counted), at most `launches`; damage may
  only be in the launch file (a record lost in its place, never counted);
- either way meta.json carries its counters (the exit handler wrote them), and the dump loads
  (`mining.load.load_dump`), or is refused in one sentence when no launch was recorded.
Run level: the program exited 0 (124: it hung and was killed), the exec'd child reported and
exited 0, the fork that left at once exited 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# run.sh calls this script by path, possibly under sudo or in a user namespace where the
# project's editable install is not on the path: the repository root is
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def check_process(dump_dir: Path, truth: dict, stderr: str) -> tuple[dict, list[str]]:
    """(what the dump of one process says, the problems found)."""
    from mining.load import DumpError, load_dump, read_meta

    pid = truth["pid"]
    problems: list[str] = []
    offs = len(re.findall(rf"capture off in pid {pid}:", stderr))
    folder = dump_dir / f"pid{pid}"
    info = {"pid": pid, "role": truth["role"], "launches_made": truth["launches"], "capture_off_lines": offs}
    if not folder.is_dir():
        if offs != 1:
            problems.append(f"pid {pid}: no dump folder and {offs} 'capture off' line(s)")
        return info, problems
    try:
        meta = read_meta(folder)
    except DumpError as exc:
        return info, problems + [f"pid {pid}: meta.json refused: {exc}"]
    counters = meta.get("counters")
    disabled = meta.get("disabled")
    info["disabled"] = disabled
    if disabled and offs != 1:
        problems.append(f"pid {pid}: capture off ({disabled}) but {offs} 'capture off' line(s) on stderr")
    if not disabled and offs:
        problems.append(f"pid {pid}: {offs} 'capture off' line(s) but meta.json says capture stayed on")
    if not isinstance(counters, dict):
        return info, problems + [f"pid {pid}: meta.json has no counters (the exit handler did not write them)"]
    n, rec = counters.get("launches"), counters.get("launches_recorded")
    info.update(launches=n, launches_recorded=rec)
    try:
        dump = load_dump(folder, cache=False)
        reports = {r.file: r for r in dump.damage}
        launch_rep = reports[dump.source.name]
        read, damaged = launch_rep.read, [r.file for r in dump.damage if r.damaged]
    except DumpError as exc:
        if rec:
            problems.append(f"pid {pid}: {rec} launch(es) recorded but the dump is refused: {exc}")
        read, damaged = 0, []
    info.update(read=read, damaged_files=damaged)
    if not disabled:
        if n != truth["launches"]:
            problems.append(f"pid {pid}: counters.launches {n} != {truth['launches']} launches made")
        if rec != n:
            problems.append(f"pid {pid}: launches_recorded {rec} != launches {n} (no filter is set)")
        if read != rec:
            problems.append(f"pid {pid}: {read} record(s) read != launches_recorded {rec}")
        if damaged:
            problems.append(f"pid {pid}: damage in {damaged} although capture stayed on")
    else:
        if not (isinstance(n, int) and isinstance(rec, int) and read == rec <= n <= truth["launches"]):
            problems.append(f"pid {pid}: read {read}, recorded {rec}, launches {n}, made {truth['launches']}: "
                            f"not read == recorded <= launches <= made")
        if [f for f in damaged if not f.startswith("launches")]:
            problems.append(f"pid {pid}: damage outside the launch file: {damaged}")
    return info, problems


def check_run(dump_dir: Path, truth_dir: Path, stderr: str, rc: int) -> dict:
    """The verdict on one run: {"ok", "problems", "processes"}."""
    problems: list[str] = []
    if rc != 0:
        problems.append("the program hung and was killed" if rc in (124, 137) else f"the program exited {rc}")
    truths = {}
    for f in sorted(truth_dir.glob("*.json")):
        try:
            t = json.loads(f.read_text())
            truths[t["pid"]] = t
        except (ValueError, KeyError, TypeError):
            problems.append(f"{f.name}: the program's own report is not readable")
    main = [t for t in truths.values() if t.get("role") == "main"]
    if len(main) != 1:
        problems.append(f"{len(main)} main report(s)")
    else:
        m = main[0]
        kids, status = m.get("children", []), m.get("child_status", [])
        if len(kids) != 2 or kids[0] not in truths:
            problems.append("the exec'd child did not report")
        if status != [0, 0]:
            problems.append(f"child exit statuses {status} (wait statuses; 0 is a clean exit)")
    processes = []
    for t in truths.values():
        info, more = check_process(dump_dir, t, stderr)
        processes.append(info)
        problems += more
    return {"ok": not problems, "problems": problems, "processes": processes}


def summary(results: Path) -> int:
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    bad = [r for r in rows if not r["ok"]]
    for r in rows:
        procs = ", ".join(f"{p['role']} {p.get('read', 0)}/{p['launches_made']}"
                          + (" off" if p.get("disabled") else "") for p in r["processes"])
        print(f"{r.get('label', '?'):<40} {'ok' if r['ok'] else 'FAIL'}  {procs}")
        for p in r["problems"]:
            print(f"    {p}")
    print(f"{len(rows) - len(bad)} of {len(rows)} run(s) passed")
    return 0 if rows and not bad else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", type=Path)
    ap.add_argument("dump_dir", type=Path, nargs="?")
    ap.add_argument("truth_dir", type=Path, nargs="?")
    ap.add_argument("stderr", type=Path, nargs="?")
    ap.add_argument("rc", type=int, nargs="?")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.summary:
        return summary(a.summary)
    res = check_run(a.dump_dir, a.truth_dir, a.stderr.read_text(errors="replace"), a.rc)
    res["label"] = a.label
    line = json.dumps(res)
    if a.json:
        with open(a.json, "a") as fh:
            fh.write(line + "\n")
    print(line)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
