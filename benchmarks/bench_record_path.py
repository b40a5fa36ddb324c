"""The capture library's own cost per launch, on CPU: mc_callback() down to the bytes in the dump.

    python benchmarks/bench_record_path.py [--launches 50000] [--repeats 5] [--cpus 0,1] [--json out.json]

Runs tests/helpers/harness_dispatch.c (the library's launch path with CUPTI and the driver played by hand,
see tests/capture/test_capture_dispatch.py) for: noop (our callback returns at once), filtered (the
include regex matches nothing), bin (the default record form) and json (the default-form JSON
record), each with warm caches and with 4 MiB written between two launches (as the driver's
own launch work evicts our data on a real GPU). Launches are 3 us apart, as in a launch-bound
loop; ns per launch are medians over the repeats, clock calls included (the noop line is that
floor). Pin to two CPUs at least: the mmap writer's helper thread must not share the launching
core (it did in the first measurements: docs/benchmarks.md). A benchmark, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "tests" / "capture"))
sys.path.insert(0, str(ROOT))

from test_capture_dispatch import build_dispatch_harness  # noqa: E402

FORMS = ("noop", "filtered", "bin", "json")
THRASH_KB = (0, 4096)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpus", default="0,1", help="taskset -c CPUS for every run ('' for none)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    pin = ["taskset", "-c", a.cpus] if a.cpus else []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_dispatch_harness(Path(tmp))
        runs: dict[str, list[float]] = {}
        for rep in range(a.repeats):
            for kb in THRASH_KB:
                for form in FORMS:
                    out = Path(tmp) / f"d{rep}_{kb}_{form}"
                    r = subprocess.run([*pin, str(exe), "bench", str(out), form, str(a.launches), str(kb)],
                                       capture_output=True, text=True, check=True)
                    runs.setdefault(f"{form}_thrash{kb}", []).append(json.loads(r.stdout)["ns_per_launch"])
    med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    added = {k: round(v - med[f"noop_thrash{k.rsplit('thrash', 1)[1]}"], 1) for k, v in med.items()
             if not k.startswith("noop")}
    res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.node(),
           "cpu": _cpu(), "launches": a.launches, "repeats": a.repeats, "cpus": a.cpus,
           "ns_per_launch": med, "ns_above_noop": added, "all": runs}
    print(json.dumps({"ns_per_launch": med, "ns_above_noop": added}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
