"""Capture overhead: added µs per launch on a launch-bound loop, and a model forward.

    python benchmarks/bench_capture.py [--launches 200000] [--repeats 5] [--json out.json]

Configurations (same binary, environment only):
  baseline      no injection
  filtered      injected, MINE_CAPTURE_INCLUDE matches nothing: CUPTI callback + layout-cache hit
  full          injected, every launch recorded (JSON line, pointer classification), MINE_CAPTURE_WRITER=mmap
  full_write    the same with MINE_CAPTURE_WRITER=write (one write(2) per record: the old writer)
  modules_only  injected, MINE_CAPTURE_MODULES_ONLY=1 (no launch callbacks at all)
The model forward (examples/torch_forward.py --bench) runs without and with full capture.
Reports medians over repeats. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capture.launcher import find_library  # noqa: E402


def nvcc() -> str:
    return str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")


def run_json(cmd, env) -> dict:
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--forwards", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    lib = str(find_library())
    tmp = Path(tempfile.mkdtemp(prefix="mine-bench-"))
    exe = tmp / "bench_launch"
    subprocess.run([nvcc(), "-O2", "-arch=sm_90", "-o", str(exe), str(ROOT / "benchmarks" / "bench_launch.cu")],
                   check=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MINE_CAPTURE_")}
    base_env.pop("CUDA_INJECTION64_PATH", None)
    inj = dict(base_env, CUDA_INJECTION64_PATH=lib, MINE_CAPTURE_DIR=str(tmp / "dump"))
    configs = {
        "baseline": base_env,
        "modules_only": dict(inj, MINE_CAPTURE_MODULES_ONLY="1"),
        "filtered": dict(inj, MINE_CAPTURE_INCLUDE="^no_such_kernel$"),
        "full": dict(inj, MINE_CAPTURE_WRITER="mmap"),
        "full_write": dict(inj, MINE_CAPTURE_WRITER="write"),
    }
    res = {name: [] for name in configs}
    for _ in range(args.repeats):  # interleaved, so drift hits every configuration alike
        for name, env in configs.items():
            res[name].append(run_json([str(exe), str(args.launches)], env)["us_per_launch"])
            subprocess.run(["rm", "-rf", str(tmp / "dump")])
    med = {k: statistics.median(v) for k, v in res.items()}
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.node(),
        "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip(),
        "launches": args.launches, "repeats": args.repeats,
        "us_per_launch": med, "all": res,
        "added_us_per_launch": {k: med[k] - med["baseline"] for k in med if k != "baseline"},
    }
    fwd = ROOT / "examples" / "torch_forward.py"
    try:
        f_res = {"baseline": [], "full": [], "full_write": []}
        for _ in range(3):
            for cfg in f_res:
                f_res[cfg].append(run_json([sys.executable, str(fwd), "--bench", str(args.forwards)], configs[cfg]))
            subprocess.run(["rm", "-rf", str(tmp / "dump")])
        report["forward"] = {
            cfg: {k: statistics.median(r[k] for r in runs) for k in ("eager_us_per_forward", "graph_us_per_forward")}
            for cfg, runs in f_res.items()}
        report["forward"]["ratio_eager"] = (report["forward"]["full"]["eager_us_per_forward"]
                                            / report["forward"]["baseline"]["eager_us_per_forward"])
        report["forward"]["ratio_eager_write"] = (report["forward"]["full_write"]["eager_us_per_forward"]
                                                  / report["forward"]["baseline"]["eager_us_per_forward"])
        report["forward"]["ratio_graph"] = (report["forward"]["full"]["graph_us_per_forward"]
                                            / report["forward"]["baseline"]["graph_us_per_forward"])
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        report["forward"] = {"error": str(exc)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
