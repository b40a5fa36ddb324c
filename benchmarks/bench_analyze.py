"""Benchmark: `mine analyze` end to end on a 1,000,000-launch capture (not a test; run by hand).

    python benchmarks/bench_analyze.py [--layers 28] [--requests 27] [--decode 100] [--keep DIR]
                                       [--runs 2] [--cpus 0,1]

Writes a simulated capture with known truth (tests/dumpsim.py: a profiling pass, warm-ups and
`--requests` requests of one prefill and `--decode` decode steps each, a `--layers`-layer
decoder; the defaults give ~1,000,000 launches), then runs `mine analyze DUMP --json OUT` in a
fresh process pinned to `--cpus` (load with the parquet cache removed, passes, sites, layers,
pointers, fits, JSON), `--runs` times, and prints wall seconds and the child's peak RSS
(getrusage ru_maxrss), with ratios to the issue's bound (20 s, 2 GB on a 2-core machine), and
checks the analysis found every planted forward and the layer count. Results go to
docs/benchmarks.md, section "Analysis end to end".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--requests", type=int, default=27)
    ap.add_argument("--decode", type=int, default=100)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cpus", default="0,1")
    ap.add_argument("--keep", type=Path, help="reuse (or write) the dump here")
    args = ap.parse_args()
    from dumpsim import SimConfig, simulate

    tmp = Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    folder = args.keep or tmp / "dump"
    prompts = tuple(1 + (37 * k) % 300 for k in range(args.requests))
    cfg = SimConfig(layers=args.layers, prompts=prompts, decode_steps=args.decode, extra_pid=False)
    t0 = time.perf_counter()
    if not any(folder.glob("pid*")):
        folder.mkdir(parents=True, exist_ok=True)
        _, truth = simulate(folder, cfg)
        (folder / "truth.json").write_text(json.dumps(truth.forwards))
    want = json.loads((folder / "truth.json").read_text())
    n = sum(1 for _ in open(next(folder.glob("pid*/launches.jsonl")), "rb"))
    print(f"dump: {n:,} launches, {len(want):,} forwards, {args.layers} layers "
          f"(written in {time.perf_counter() - t0:.0f} s)")
    results = []
    for k in range(args.runs):
        for cache in folder.glob("pid*/.mine-cache"):
            shutil.rmtree(cache)
        out = tmp / f"a{k}.json"
        cmd = ["taskset", "-c", args.cpus, sys.executable, "-m", "mine.cli", "analyze", str(folder),
               "--json", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              env=dict(os.environ, COLUMNS="200"))
        wall = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if proc.returncode != 0:
            sys.exit(f"mine analyze failed: {proc.stderr.strip()[-400:]}")
        doc = json.loads(out.read_text())
        got = [f["tokens"] for f in doc["passes"]["forwards"]]
        ok = got == want and doc["layers"]["layers"] == args.layers
        results.append({"wall_s": round(wall, 2), "peak_rss_mib": round(max(rss, before) / 1024),
                        "forwards_equal_truth": ok})
        print(f"run {k}: {wall:.1f} s (x{wall / 20:.2f} of 20 s), peak RSS {max(rss, before) / 1024:.0f} MiB "
              f"(x{max(rss, before) / 1024 / 2048:.2f} of 2 GiB), forwards and layers equal the truth: {ok}")
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
                      "cpus": os.cpu_count(), "pinned": args.cpus, "launches": n, "runs": results}))
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
