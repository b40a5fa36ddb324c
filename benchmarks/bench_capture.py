"""Capture overhead: added µs per launch on a launch-bound loop, and a model forward.

    python benchmarks/bench_capture.py [--launches 100000] [--repeats 2] [--forwards 100] [--json out.json]

Configurations (same binary, environment only):
  baseline      no injection
  modules_only  injected, MINE_CAPTURE_MODULES_ONLY=1 (no launch callbacks at all)
  noop          injected, MINE_CAPTURE_NOOP=1: CUPTI calls our callback, which returns at once
                (CUPTI's own cost per launch: the floor no capture through CUPTI callbacks can beat)
  filtered      injected, MINE_CAPTURE_INCLUDE matches nothing: CUPTI callback + layout-cache hit
  full <writer> pf<0|1> cls<0|1>
                every launch recorded: MINE_CAPTURE_WRITER=write|mmap, MINE_CAPTURE_PREFAULT=0|1 (mmap
                only), MINE_CAPTURE_CLASSIFY=0|1 (0: no pointer classification; diagnostic)
  <writer>_alloclog_cls0[_compact]   allocation log + offline classification (+ compact records)
  bin_<writer>[_pf<0|1>]              MINE_CAPTURE_FORMAT=bin (binary records, launches.bin)
  <name>_self                         that configuration with MINE_CAPTURE_SELFTIME=1: also reports the ns
                                      per launch spent inside the recording code (meta.json counters)
  bin_mmap_pf1_toggle, noop_toggle    MINE_CAPTURE_TOGGLE_MS=20: the library switches its launch callbacks
                                      off and on every 20 ms; bench_launch marks every 200 launches, and
                                      in_process_toggle_us is "on" minus "off" phases of one process: the
                                      whole capture's cost per launch (CUPTI's included)
  bin_mmap_pf1_alt, json_write_alt    MINE_CAPTURE_ALTERNATE=1000: the library records alternate blocks
                                      of 1000 launches; bench_launch times every block, and
                                      in_process_added_us is recorded minus unrecorded blocks of one
                                      process (recording's cost above CUPTI's, free of the drift
                                      between processes)
`--configs a,b,...` runs only those (and baseline); `--before-lib LIB` runs each of them also with
another build of the library (name@before), to compare two commits in one session.
The launch loop runs every configuration `--repeats` times, interleaved; the model forward
(examples/torch_forward.py --bench) runs baseline, filtered and every full configuration
`--forward-repeats` times (baseline once more at the end, to see drift). Reports medians; the JSON
is rewritten after every stage, so a run cut short keeps what it measured. A benchmark, not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capture.launcher import find_library  # noqa: E402


def nvcc() -> str:
    return str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")


PIN: list[str] = []


def run_json(cmd, env) -> dict:
    out = subprocess.run([*PIN, *cmd], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def full_configs(inj: dict) -> dict:
    out = {}
    for writer in ("write", "mmap"):
        for pf in (("1", "0") if writer == "mmap" else ("1",)):
            for cls in ("1", "0"):
                name = f"{writer}" + (f"_pf{pf}" if writer == "mmap" else "") + f"_cls{cls}"
                out[name] = dict(inj, MINE_CAPTURE_WRITER=writer, MINE_CAPTURE_PREFAULT=pf,
                                 MINE_CAPTURE_CLASSIFY=cls)
    # the offline-classification configuration: allocations logged, no per-launch pointer queries
    # ... and with each function's symbol, name and attributes written once (compact records)
    for writer in ("write", "mmap"):
        off = dict(inj, MINE_CAPTURE_WRITER=writer, MINE_CAPTURE_PREFAULT="1",
                   MINE_CAPTURE_CLASSIFY="0", MINE_CAPTURE_ALLOC_LOG="1")
        out[f"{writer}_alloclog_cls0"] = off
        out[f"{writer}_alloclog_cls0_compact"] = dict(off, MINE_CAPTURE_COMPACT="1")
    out["mmap_pf1_cls1_compact"] = dict(inj, MINE_CAPTURE_WRITER="mmap", MINE_CAPTURE_PREFAULT="1",
                                        MINE_CAPTURE_CLASSIFY="1", MINE_CAPTURE_COMPACT="1")
    # binary launch records (implies compact, allocation log, no per-launch classification)
    for writer, pf in (("write", "1"), ("mmap", "1"), ("mmap", "0")):
        name = f"bin_{writer}" + (f"_pf{pf}" if writer == "mmap" else "")
        out[name] = dict(inj, MINE_CAPTURE_FORMAT="bin", MINE_CAPTURE_WRITER=writer, MINE_CAPTURE_PREFAULT=pf)
    # the whole capture's cost inside one process: launch callbacks switched off/on every 20 ms
    out["bin_mmap_pf1_toggle"] = dict(out["bin_mmap_pf1"], MINE_CAPTURE_TOGGLE_MS="20", MINE_BENCH_MARKS="200")
    out["noop_toggle"] = dict(inj, MINE_CAPTURE_NOOP="1", MINE_CAPTURE_TOGGLE_MS="20", MINE_BENCH_MARKS="200")
    # recording's cost inside one process: alternate blocks of 1000 launches recorded / passed
    out["bin_mmap_pf1_alt"] = dict(out["bin_mmap_pf1"], MINE_CAPTURE_ALTERNATE="1000")
    out["json_write_alt"] = dict(inj, MINE_CAPTURE_ALTERNATE="1000")
    for name in ("filtered", "write_cls1", "bin_mmap_pf1"):   # + time spent inside on_launch
        base = out.get(name) or dict(inj, MINE_CAPTURE_INCLUDE="^no_such_kernel$")
        out[f"{name}_self"] = dict(base, MINE_CAPTURE_SELFTIME="1")
    return out


def self_ns(d: Path) -> float | None:
    """ns per launch spent inside the recording code (MINE_CAPTURE_SELFTIME=1 configurations)."""
    for meta in d.glob("pid*/meta.json") if d.exists() else []:
        c = json.loads(meta.read_text()).get("counters") or {}
        if c.get("self_launches"):
            return round(c["self_ns"] / c["self_launches"], 1)
    return None


def _paired_ratio(f_res: dict) -> dict:
    """Per repeat: eager time / the mean of that repeat's two baseline runs (first and last of the
    repeat); the median over repeats. Process-to-process drift cancels as far as it is slow."""
    base = [x["eager_us_per_forward"] for x in f_res["baseline"]]
    pairs = [(base[2 * r] + base[2 * r + 1]) / 2 for r in range(len(base) // 2)]
    out = {}
    for c, runs in f_res.items():
        if c == "baseline":
            continue
        rs = [x["eager_us_per_forward"] / pairs[r] for r, x in enumerate(runs) if r < len(pairs)]
        if rs:
            out[c] = {"median": round(statistics.median(rs), 3), "all": [round(x, 3) for x in rs]}
    return out


def toggle_split(marks: list[int], block: int, dump: Path) -> dict | None:
    """Blocks of one process sorted by the library's switch times (meta.json "toggles"): launch
    callbacks on or off for the whole block (blocks within 50 us of a switch are left out). added_us:
    the median over "on" phases of (phase mean - the mean of the two "off" phases around it)."""
    metas = list(dump.glob("pid*/meta.json")) if dump.exists() else []
    if not metas or len(marks) < 3:
        return None
    toggles = json.loads(metas[0].read_text()).get("toggles") or []
    if not toggles:
        return None
    edges = [t for t, _ in toggles]
    phases: list[tuple[int, list[float], int]] = []   # (on, per-launch us of its blocks, switches before)
    for a, b in zip(marks, marks[1:]):
        i = bisect.bisect_right(edges, a - 50_000)
        if i < len(edges) and edges[i] <= b + 50_000:
            continue                                  # a switch near or inside this block
        on = 1 if i == 0 else toggles[i - 1][1]
        if not phases or phases[-1][0] != on or phases[-1][2] != i:
            phases.append((on, [], i))
        phases[-1][1].append((b - a) / 1000 / block)
    means = [(on, statistics.mean(v)) for on, v, _ in phases if v]
    diffs = [m - (means[k - 1][1] + means[k + 1][1]) / 2 for k, (on, m) in enumerate(means)
             if on and 0 < k < len(means) - 1 and not means[k - 1][0] and not means[k + 1][0]]
    on_all = [m for on, m in means if on]
    off_all = [m for on, m in means if not on]
    if not diffs:
        return None
    return {"added_us": round(statistics.median(diffs), 4), "phases": len(means),
            "on_us": round(statistics.mean(on_all), 4), "off_us": round(statistics.mean(off_all), 4)}


def dump_bytes(d: Path) -> int:
    if not d.exists():
        return 0
    return sum(f.stat().st_size for f in [*d.rglob("launches.jsonl"), *d.rglob("launches.bin")])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--forwards", type=int, default=100)
    ap.add_argument("--forward-repeats", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--configs", help="comma-separated configuration names to run (baseline always runs)")
    ap.add_argument("--pin", help="run every process under `taskset -c PIN` (less scheduler noise)")
    ap.add_argument("--before-lib", type=Path, help="another build of the library (an earlier commit): every "
                    "injected configuration also runs with it, as <name>@before, interleaved with the rest")
    args = ap.parse_args()
    if args.pin:
        PIN[:] = ["taskset", "-c", args.pin]
    lib = str(find_library())
    tmp = Path(tempfile.mkdtemp(prefix="mine-bench-"))
    exe = tmp / "bench_launch"
    subprocess.run([nvcc(), "-O2", "-arch=sm_90", "-o", str(exe), str(ROOT / "benchmarks" / "bench_launch.cu")],
                   check=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MINE_CAPTURE_")}
    base_env.pop("CUDA_INJECTION64_PATH", None)
    dump = tmp / "dump"
    inj = dict(base_env, CUDA_INJECTION64_PATH=lib, MINE_CAPTURE_DIR=str(dump))
    configs = {
        "baseline": base_env,
        "modules_only": dict(inj, MINE_CAPTURE_MODULES_ONLY="1"),
        "noop": dict(inj, MINE_CAPTURE_NOOP="1"),
        "filtered": dict(inj, MINE_CAPTURE_INCLUDE="^no_such_kernel$"),
        **full_configs(inj),
    }
    if args.configs:
        want = {"baseline", *args.configs.split(",")}
        unknown = want - set(configs)
        if unknown:
            sys.exit(f"unknown configuration(s) {sorted(unknown)}; known: {', '.join(configs)}")
        configs = {k: v for k, v in configs.items() if k in want}
    if args.before_lib:
        if not args.before_lib.is_file():
            sys.exit(f"--before-lib {args.before_lib} is not a file")
        for name, env in list(configs.items()):
            if "CUDA_INJECTION64_PATH" in env:
                configs[f"{name}@before"] = dict(env, CUDA_INJECTION64_PATH=str(args.before_lib.resolve()))
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.node(),
        "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip(),
        "launches": args.launches, "repeats": args.repeats, "forwards": args.forwards,
        "forward_repeats": args.forward_repeats,
    }

    def save() -> str:
        text = json.dumps(report, indent=1)
        if args.json:
            args.json.write_text(text + "\n")
        return text

    t0 = time.monotonic()
    res = {name: [] for name in configs}
    rec_bytes = {}
    self_time: dict[str, list] = {}
    blocks: dict[str, list] = {}
    toggled: dict[str, list] = {}
    for _ in range(args.repeats):  # interleaved, so drift hits every configuration alike
        for name, env in configs.items():
            r = run_json([str(exe), str(args.launches)], env)
            res[name].append(r["us_per_launch"])
            if "marks_ns" in r and (sp := toggle_split(r["marks_ns"], r["block"], dump)):
                toggled.setdefault(name, []).append(sp)
            if "block_diff_us" in r:
                blocks.setdefault(name, []).append({k: r[k] for k in ("recorded_us", "passed_us", "block_diff_us")})
            rec_bytes[name] = dump_bytes(dump)
            if (ns := self_ns(dump)) is not None:
                self_time.setdefault(name, []).append(ns)
            subprocess.run(["rm", "-rf", str(dump)])
    med = {k: statistics.median(v) for k, v in res.items()}
    # paired: each repeat ran every configuration once, so drift between repeats cancels in
    # config - baseline of the same repeat; the median of those is the number to read
    paired = {k: sorted(round(a - b, 3) for a, b in zip(v, res["baseline"])) for k, v in res.items() if k != "baseline"}
    report["loop"] = {"us_per_launch": med, "all": res,
                      "paired_added_us": {k: statistics.median(v) for k, v in paired.items()},
                      "paired_all": paired,
                      "spread_us": {k: round(max(v) - min(v), 3) for k, v in res.items()},
                      "added_us_per_launch": {k: round(med[k] - med["baseline"], 3) for k in med if k != "baseline"},
                      "launches_jsonl_bytes": rec_bytes, "seconds": round(time.monotonic() - t0, 1),
                      "self_ns_per_launch": {k: statistics.median(v) for k, v in self_time.items()},
                      # *_alt: recorded minus unrecorded blocks of the same process (no process-to-process drift)
                      "in_process_added_us": {k: {"median": round(statistics.median(b["block_diff_us"] for b in v), 4),
                                                  "all": [b["block_diff_us"] for b in v],
                                                  "recorded_us": [b["recorded_us"] for b in v],
                                                  "passed_us": [b["passed_us"] for b in v]}
                                              for k, v in blocks.items()},
                      # *_toggle: launch callbacks on minus off, phases of one process
                      "in_process_toggle_us": {k: {"median": round(statistics.median(x["added_us"] for x in v), 4),
                                                   "all": [x["added_us"] for x in v],
                                                   "on_us": [x["on_us"] for x in v], "off_us": [x["off_us"] for x in v],
                                                   "phases": [x["phases"] for x in v]}
                                               for k, v in toggled.items()}}
    save()

    if args.forwards <= 0:   # loop only
        print(save())
        return
    fwd = ROOT / "examples" / "torch_forward.py"
    t0 = time.monotonic()
    order = [k for k in configs if k != "modules_only"]
    f_res = {k: [] for k in order}
    f_bytes = {}
    f_sec = {}
    f_toggled: dict[str, list] = {}
    try:
        for _ in range(args.forward_repeats):
            for cfg in order + ["baseline"]:
                t1 = time.monotonic()
                r = run_json([sys.executable, str(fwd), "--bench", str(args.forwards)], configs[cfg])
                f_res[cfg].append(r)
                if "marks_ns" in r and (sp := toggle_split(r["marks_ns"], r["block"], dump)):
                    f_toggled.setdefault(cfg, []).append(sp)
                f_sec[cfg] = round(time.monotonic() - t1, 1)
                f_bytes[cfg] = dump_bytes(dump)
                subprocess.run(["rm", "-rf", str(dump)])
                fw = {c: {k: statistics.median(r[k] for r in runs)
                          for k in ("eager_us_per_forward", "graph_us_per_forward")}
                      for c, runs in f_res.items() if runs}
                b = fw["baseline"]
                report["forward"] = {
                    "us": fw, "all_eager": {c: [r["eager_us_per_forward"] for r in runs] for c, runs in f_res.items()},
                    "ratio_eager": {c: round(v["eager_us_per_forward"] / b["eager_us_per_forward"], 3) for c, v in fw.items()},
                    "paired_ratio_eager": _paired_ratio(f_res),
                    "ratio_graph": {c: round(v["graph_us_per_forward"] / b["graph_us_per_forward"], 3) for c, v in fw.items()},
                    "launches_jsonl_bytes": f_bytes, "seconds_per_process": f_sec,
                    # *_toggle: us per eager forward, launch callbacks on minus off inside one process
                    "in_process_toggle": {c: {"added_us": [x["added_us"] for x in v],
                                              "ratio": [round(x["on_us"] / x["off_us"], 4) for x in v],
                                              "median_ratio": round(statistics.median(x["on_us"] / x["off_us"] for x in v), 4)}
                                          for c, v in f_toggled.items()},
                    "seconds": round(time.monotonic() - t0, 1)}
                save()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        report["forward_error"] = str(exc)
    print(save())


if __name__ == "__main__":
    main()
