"""The replayed kernels of a decode forward against the same manifest's decode step on kern, one GPU,
one run (issue 12's timing half).

    python3 benchmarks/bench_replay_vs_kern.py DUMP MANIFEST_DIR CHECKPOINT_DIR OUT_JSON [--context 240] [--combine]

1. `mine replay`'s machinery on DUMP's first serving decode forward: every launch with a cubin run
   alone (L2 flushed, CUDA events) and 20 times back to back in one CUDA graph (L2 warm), next to the
   machine's ceilings (a device-to-device copy, an 8192^3 bf16 cuBLAS GEMM: replay.ceilings).
2. kern on MANIFEST_DIR (the manifest `mine gen qwen3` makes from DUMP; weights from
   CHECKPOINT_DIR): the decode step time by graph replay at CONTEXT, then torch.profiler's CUDA
   activity over 50 graph-replayed steps: each kernel's time per step, by name.
Both in child processes in turn, so neither sees the other's allocations. Writes OUT_JSON and
prints a per-kernel table: replayed alone, replayed in a graph, inside kern's step.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def part_replay(dump: str, out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from replay.ceilings import measure
    from replay.gpu import Gpu
    from replay.run import replay_seqs

    gpu = Gpu()
    ceil = measure(gpu)
    gpu.close()
    d = load_dump(dump, cache=False)
    doc = document(analyze(d))
    f = next(f for f in doc.serve_forwards() if f.tokens == 1)
    seqs = [s for first, n in f.seqs for s in range(first, first + n)]
    res = replay_seqs(d, seqs, reps=10)
    out.write_text(json.dumps({"forward": f.forward, "ceilings": dataclasses.asdict(ceil),
                               "results": [dataclasses.asdict(r) for r in res]}))


def part_kern(mdir: str, ckpt: str, context: int, out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples" / "vllm_qwen3"))
    import torch
    from run_kern import KernQwen3

    eng = KernQwen3(Path(mdir), Path(ckpt), context + 2)
    step = eng.step_us(1, context - 1)
    steps = 50
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.rt.run("decode", {"rows": 1, "seqs": 1})
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    busy = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            per[e.name].append(e.device_time_total)
            busy += e.device_time_total
    out.write_text(json.dumps({"context": context, "decode_step_us": step, "steps_profiled": steps,
                               "busy_us_per_step": busy / steps,
                               "kernels": {k: {"launches_per_step": len(v) / steps, "us_per_step": sum(v) / steps}
                                           for k, v in per.items()}}))


def family(name: str) -> str:
    """A kernel's name as both sides print it (a mangled symbol, a demangled signature), shortened
    to what identifies it."""
    for key in ("fused_add_rms_norm", "rms_norm", "act_and_mul", "rotary_embedding", "reshape_and_cache",
                "kernel_unified_attention", "reduce_segments", "splitKreduce", "nvjet", "argmax", "embed"):
        if key in name:
            return key
    return name.split("(")[0][:40]


def weight_bytes(mdir: Path) -> int:
    """Bytes of the manifest's weight buffers (static shapes): what one decode step streams at least."""
    import math

    m = json.loads(next(Path(mdir).glob("*.json")).read_text())
    size = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i64": 8, "u8": 1, "f8e4m3": 1}
    return sum(math.prod(b["shape"]) * size.get(b["dtype"], 2) for b in m["buffers"].values()
               if b.get("kind") == "weight" and all(isinstance(x, int) for x in b["shape"]))


def main() -> None:
    if sys.argv[1] == "--part-replay":
        return part_replay(sys.argv[2], Path(sys.argv[3]))
    if sys.argv[1] == "--part-kern":
        return part_kern(sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
    dump, mdir, ckpt, out_json = sys.argv[1:5]
    context = int(sys.argv[sys.argv.index("--context") + 1]) if "--context" in sys.argv else 240
    out = Path(out_json)
    rj, kj = out.with_suffix(".replay.json"), out.with_suffix(".kern.json")
    if "--combine" not in sys.argv:    # --combine: the two parts' JSON from an earlier run, again
        subprocess.run([sys.executable, __file__, "--part-replay", dump, str(rj)], check=True)
        subprocess.run([sys.executable, __file__, "--part-kern", mdir, ckpt, str(context), str(kj)], check=True)
    rep, kern = json.loads(rj.read_text()), json.loads(kj.read_text())
    wbytes = weight_bytes(Path(mdir))
    rows: dict[str, dict] = defaultdict(lambda: {"replayed": 0, "alone_us": 0.0, "graph_us": 0.0,
                                                 "written": 0, "kern_launches": 0.0, "kern_us": 0.0})
    for r in rep["results"]:
        if r["status"] == "ok":
            x = rows[family(r["symbol"])]
            x["replayed"] += 1
            x["alone_us"] += r["time_us"] or 0.0
            x["graph_us"] += r["time_us_graph"] or 0.0
            x["written"] += r["bytes_written"]
    for name, k in kern["kernels"].items():
        x = rows[family(name)]
        x["kern_launches"] += k["launches_per_step"]
        x["kern_us"] += k["us_per_step"]
    c = rep["ceilings"]
    report = {"ceilings": c, "replay_forward": rep["forward"], "kern": {k: v for k, v in kern.items() if k != "kernels"},
              "families": dict(rows),
              "sums": {"replayed": sum(x["replayed"] for x in rows.values()),
                       "alone_us": sum(x["alone_us"] for x in rows.values()),
                       "graph_us": sum(x["graph_us"] for x in rows.values()),
                       "kern_us_same_families": sum(x["kern_us"] for x in rows.values() if x["replayed"]),
                       "kern_busy_us": kern["busy_us_per_step"], "kern_step_us": kern["decode_step_us"],
                       "write_floor_us": sum(x["written"] for x in rows.values()) / c["copy_bytes_s"] * 1e6,
                       "weight_bytes": wbytes, "weights_floor_us": wbytes / c["copy_bytes_s"] * 1e6,
                       "kern_gemm_us": sum(x["kern_us"] for k, x in rows.items() if k in ("nvjet", "splitKreduce"))}}
    out.write_text(json.dumps(report, indent=1))
    print(f"ceilings: copy {c['copy_bytes_s'] / 1e9:,.0f} GB/s, bf16 GEMM "
          f"{(c['gemm_flop_s'] or 0) / 1e12:,.0f} TFLOP/s {c['note']}")
    print(f"{'kernel':42} {'replayed':>8} {'alone us':>9} {'graph us':>9} {'kern/step':>9} {'kern us':>8}")
    for k, x in sorted(rows.items(), key=lambda kv: -kv[1]["kern_us"] - kv[1]["alone_us"]):
        print(f"{k:42} {x['replayed']:8d} {x['alone_us']:9.1f} {x['graph_us']:9.1f} {x['kern_launches']:9.1f} "
              f"{x['kern_us']:8.1f}")
    s = report["sums"]
    print(f"sums: {s['replayed']} replayed, alone {s['alone_us']:.1f} us, in graphs {s['graph_us']:.1f} us; kern: the "
          f"same kernels {s['kern_us_same_families']:.1f} us a step, GPU busy {s['kern_busy_us']:.1f} us, "
          f"step {s['kern_step_us']:.1f} us (context {kern['context']})")
    print(f"floor: the manifest's {wbytes / 1e9:.3f} GB of weights streamed once at the copy ceiling: "
          f"{s['weights_floor_us']:.1f} us; kern's GEMMs take {s['kern_gemm_us']:.1f} us "
          f"({s['kern_gemm_us'] / s['weights_floor_us']:.2f}x), its step {s['kern_step_us'] / s['weights_floor_us']:.2f}x")


if __name__ == "__main__":
    main()
