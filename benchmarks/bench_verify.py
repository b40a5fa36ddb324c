"""Time `manifests.verify` against kern-llm's own verification on one ~15 MB manifest.

Builds a many-layer manifest (every layer its own weights, workspace and ops, every call
unrolled, as generators write them), writes it to a temp dir, then times: our strict read +
parse + verify, and `kern.Runtime(...)` up to the point where verification has passed (on a
GPU-less machine it then panics loading libcuda; that panic ends the timing). Prints one line
per measurement and the ratio. Requirement: ours under 2 s on the 2-core CI machine.

    python benchmarks/bench_verify.py [--layers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

from manifests.kern_oracle import quiet_stderr, verdict
from manifests.verify import verify_file

SHA = "ab" * 32


def build(layers: int) -> dict:
    bufs = {"tokens_in": {"dtype": "i32", "shape": ["tokens"], "kind": "input",
                          "domain": {"min": 0, "max": 151935}},
            "hidden": {"dtype": "bf16", "shape": ["tokens", 4096], "kind": "workspace"},
            "out": {"dtype": "f32", "shape": ["tokens", 4096], "kind": "output"}}
    ops, calls = {}, []
    for i in range(layers):
        w, h = f"l{i}.w", f"l{i}.h"
        bufs[w] = {"dtype": "bf16", "shape": [4096, 4096], "kind": "weight",
                   "bind": [{"tensor": f"model.layers.{i}.mlp.weight"}]}
        bufs[h] = {"dtype": "bf16", "shape": ["tokens", 4096], "kind": "workspace"}
        ops[f"l{i}.mix"] = {
            "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32"],
            "impl": {"scratch": {"acc": {"dtype": "f32", "shape": ["tokens", 64]}},
                     "launches": [
                {"module": "mix", "entry": f"mix_partial_{i}", "block": [256, 1, 1],
                 "grid": [{"ceil_div": ["tokens", 64]}, 64, 1], "shared_mem": 49152,
                 "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<f32>", "i32"],
                 "args": [{"param": 0}, {"param": 1}, {"scratch": "acc"}, {"param": 3}]},
                {"module": "mix", "entry": f"mix_reduce_{i}", "block": [128, 1, 1],
                 "grid": ["tokens", 1, 1],
                 "params": ["in buffer<f32>", "out buffer<bf16>", "i32", "i32"],
                 "args": [{"scratch": "acc"}, {"param": 2}, {"param": 3}, {"param": 4}]}]}}
        src = "hidden" if i == 0 else f"l{i - 1}.h"
        calls.append({"label": f"l{i}.mix", "op": f"l{i}.mix",
                      "args": [{"buf": src}, {"buf": w}, {"buf": h}, {"var": "tokens"},
                               {"i32": 4096}]})
    ops["embed"] = {"params": ["in buffer<i32>", "out buffer<bf16>", "i32"],
                    "impl": {"launches": [{"module": "mix", "entry": "embed",
                                           "block": [128, 1, 1], "grid": ["tokens", 1, 1]}]}}
    ops["head"] = {"params": ["in buffer<bf16>", "out buffer<f32>", "i32"],
                   "impl": {"launches": [{"module": "mix", "entry": "head",
                                          "block": [128, 1, 1], "grid": ["tokens", 1, 1]}]}}
    calls.insert(0, {"op": "embed", "args": [{"buf": "tokens_in"}, {"buf": "hidden"},
                                             {"var": "tokens"}]})
    calls.append({"op": "head", "args": [{"buf": f"l{layers - 1}.h"}, {"buf": "out"},
                                         {"var": "tokens"}]})
    return {"schema_version": 7, "model": "bench", "vars": {"tokens": {"max": 8192}},
            "buffers": bufs, "modules": {"mix": {"source": "mix.cubin", "sha256": SHA}},
            "ops": ops, "programs": {"forward": {"calls": calls}}}


def time_kern(path: str, kernels: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    with quiet_stderr():
        v = verdict(path, kernels)
    seconds = time.perf_counter() - t0
    if not v.accepted:
        return seconds, "rejected: " + str(v.exc).splitlines()[-1]
    return seconds, "loaded" if v.exc is None else "accepted (then no GPU)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=7800)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("RUST_BACKTRACE", "0")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        with open(path, "w") as fh:
            json.dump(build(args.layers), fh, indent=1)
        size = os.path.getsize(path)
        print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python "
              f"{platform.python_version()}; manifest {size / 1e6:.1f} MB, {args.layers} layers")
        ours, theirs = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            diags = verify_file(path)
            ours.append(time.perf_counter() - t0)
            t, verdict = time_kern(path, tmp)
            theirs.append(t)
        print(f"ours: best {min(ours):.3f} s ({len(diags)} diagnostics)")
        print(f"kern: best {min(theirs):.3f} s ({verdict})")
        print(f"ratio ours/kern: {min(ours) / min(theirs):.1f}x")


if __name__ == "__main__":
    main()
