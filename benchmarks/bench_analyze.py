"""Benchmark: `mine analyze` end to end on a 1,000,000-launch capture (not a test; run by hand).

    python benchmarks/bench_analyze.py [--layers 28] [--requests 27] [--decode 100] [--keep DIR]
                                       [--runs 2] [--cpus 0,1]

Writes a simulated capture with known truth (tests/helpers/dumpsim.py: a profiling pass, warm-ups and
`--requests` requests of one prefill and `--decode` decode steps each, a `--layers`-layer
decoder; the defaults give ~1,000,000 launches), then runs `mine analyze DUMP --json OUT` in a
fresh process pinned to `--cpus` (load with the parquet cache removed, passes, sites, layers,
pointers, fits, JSON), `--runs` times, and prints wall seconds and the child's peak RSS
(its own wait4 rusage), with ratios to the issue's bound (20 s, 2 GB on a 2-core machine), and
checks the analysis found every planted forward and the layer count. Results go to
docs/benchmarks.md, section "Analysis end to end".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--requests", type=int, default=27)
    ap.add_argument("--decode", type=int, default=100)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cpus", default="0,1")
    ap.add_argument("--keep", type=Path, help="reuse (or write) the dump here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    folder = args.keep or tmp / "dump"
    prompts = tuple(1 + (37 * k) % 300 for k in range(args.requests))
    t0 = time.perf_counter()
    if not any(folder.glob("pid*")):
        # written by a child: the simulator holds ~2.8 GB, and a child forked from a process
        # that large reports the parent's pages in its own peak RSS (the first measurements of
        # this benchmark counted them); this process stays small
        folder.mkdir(parents=True, exist_ok=True)
        code = ("import json, sys; sys.path.insert(0, 'tests/helpers'); from dumpsim import SimConfig, simulate; "
                f"from pathlib import Path; f = Path({str(folder)!r}); "
                f"_, t = simulate(f, SimConfig(layers={args.layers}, prompts={prompts!r}, "
                f"decode_steps={args.decode}, extra_pid=False)); "
                "(f / 'truth.json').write_text(json.dumps(t.forwards))")
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    want = json.loads((folder / "truth.json").read_text())
    n = sum(1 for _ in open(next(folder.glob("pid*/launches.jsonl")), "rb"))
    print(f"dump: {n:,} launches, {len(want):,} forwards, {args.layers} layers "
          f"(written in {time.perf_counter() - t0:.0f} s)")
    results = []
    for k in range(args.runs):
        shutil.rmtree(tmp / "cache", ignore_errors=True)   # every run cold (mining/cache.py)
        out = tmp / f"a{k}.json"
        cmd = ["taskset", "-c", args.cpus, sys.executable, "-m", "mine.cli", "analyze", str(folder),
               "--json", str(out)]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env=dict(os.environ, COLUMNS="200", MINE_CACHE_DIR=str(tmp / "cache")))
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)     # this child's own peak, not every child's
        wall = time.perf_counter() - t
        rss = usage.ru_maxrss
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"mine analyze failed: {err.strip()[-400:]}")
        doc = json.loads(out.read_text())
        got = [f["tokens"] for f in doc["passes"]["forwards"]]
        ok = got == want and doc["layers"]["layers"] == args.layers
        results.append({"wall_s": round(wall, 2), "peak_rss_mib": round(rss / 1024),
                        "forwards_equal_truth": ok})
        print(f"run {k}: {wall:.1f} s (x{wall / 20:.2f} of 20 s), peak RSS {rss / 1024:.0f} MiB "
              f"(x{rss / 1024 / 2048:.2f} of 2 GiB), forwards and layers equal the truth: {ok}")
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
                      "cpus": os.cpu_count(), "pinned": args.cpus, "launches": n, "runs": results}))
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
