"""Benchmark: load a synthetic 1,000,000-launch dump (not a test; run by hand).

    python benchmarks/bench_load.py [--launches 1000000] [--runs 2] [--keep DIR] [--compact | --bin]

Writes a dump in the documented format (docs/dump-format.md) with realistic records (6 params,
3 of them pointers, one 24-byte struct with an inner pointer), then, `--runs` times, loads it in a
fresh process cold (the parquet cache removed first: JSON, then writes the cache) and warm (from
the cache), and prints seconds and peak RSS (getrusage ru_maxrss of the child) of each, with the
ratio to the requirement (issue 4: cold under 10 s and 2 GB). With --keep DIR an existing dump
there is reused. --compact writes the same launches in the compact form (MINE_CAPTURE_COMPACT=1:
functions.jsonl + launches carrying "fn", params without off/size). --bin writes them as binary
records (MINE_CAPTURE_FORMAT=bin: launches.bin, functions.jsonl, and allocs.jsonl, from which the
pointers are classified offline; encoder: tests/helpers/binenc.py). Results go to docs/benchmarks.md,
section "Dump loading".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYMS = [f"_Z{len(n)}{n}v" for n in ("rms_norm_kernel", "gemm_bf16_kernel", "rope_kernel",
                                    "reshape_and_cache_kernel", "silu_and_mul_kernel",
                                    "attn_kernel", "embed_kernel", "argmax_kernel")]


LAYOUT = [[0, 0, 8], [1, 8, 8], [2, 16, 8], [3, 24, 4], [4, 28, 4], [5, 32, 24]]


def write_bin_dump(folder: Path, n: int) -> Path:
    """The same launches as binary records; pointers come from an allocation log."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
    from binenc import image, record, write_functions, write_meta

    pid = folder / "pid1"
    pid.mkdir(parents=True, exist_ok=True)
    write_functions(pid, [{"func": hex(0x6000 + k), "module": k + 1, "sha256": "ab" * 32, "symbol": sym,
                           "name": sym[4:-1], "layout": "kernel", "params_layout": LAYOUT}
                          for k, sym in enumerate(SYMS)])
    write_meta(pid)
    base = 0x7F0000000000
    (pid / "allocs.jsonl").write_text(json.dumps(
        {"seq_before": 0, "order": 0, "t_ns": 0, "tid": 7, "dev": 0, "event": "alloc",
         "api": "cuMemAlloc_v2", "base": hex(base), "size": 1 << 30, "id": 10, "result": 0}) + "\n")
    rng = random.Random(1)
    t = 10**9
    with open(pid / "launches.bin", "wb") as fh:
        for seq in range(n):
            t += 3000 + rng.randrange(4000)
            tok = 1 + (seq // 1000) % 512
            vals = [(base + (seq % 97) * 4096 + i * 0x100000).to_bytes(8, "little") for i in range(3)]
            vals += [tok.to_bytes(4, "little"), bytes.fromhex("0000803f"),
                     tok.to_bytes(8, "little") + (base + 0x200000).to_bytes(8, "little") + bytes(8)]
            fh.write(record(seq, t_ns=t, ctx=0x55AA, fn=seq % len(SYMS), grid=(tok, 1, 1), block=(256, 1, 1),
                            blob=image(LAYOUT, vals)))
    return pid


def write_dump(folder: Path, n: int, compact: bool = False) -> Path:
    pid = folder / "pid1"
    pid.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    base = 0x7F0000000000
    head = ('{"seq":%d,"t_ns":%d,"tid":7,"dev":0,"ctx":"0x55aa","stream":"0x0",'
            '"api":"cuLaunchKernel","result":0,"graph":null,"handle":"function","func":"0x%x",'
            '"module":%d,"sha256":"%s","symbol":"%s","name":"%s","grid":[%d,1,1],'
            '"block":[256,1,1],"smem":0,"launch_attrs":{},"attrs":{"regs":32,"static_smem":0,'
            '"local":0,"const":0,"max_threads":1024,"ptx":90,"binary":90},"packing":"params",'
            '"layout":"kernel","params":[')
    ptr = '{"i":%d,"off":%d,"size":8,"hex":"%s","ptrs":[{"at":0,"base":"0x%x","size":1073741824,"id":%d,"off":%d}]}'
    if compact:  # the per-function keys go to functions.jsonl once; params lose off/size
        with open(pid / "functions.jsonl", "w") as fh:
            for k, sym in enumerate(SYMS):
                fh.write(json.dumps({"fn": k, "ctx": "0x55aa", "handle": "function", "func": hex(0x6000 + k),
                                     "module": k + 1, "sha256": "ab" * 32, "symbol": sym, "name": sym[4:-1],
                                     "attrs": {"regs": 32, "static_smem": 0, "local": 0, "const": 0,
                                               "max_threads": 1024, "ptx": 90, "binary": 90},
                                     "layout": "kernel", "params_layout": LAYOUT}, separators=(",", ":")) + "\n")
        head = ('{"seq":%d,"t_ns":%d,"tid":7,"dev":0,"ctx":"0x55aa","stream":"0x0",'
                '"api":"cuLaunchKernel","result":0,"graph":null,"fn":%d,"grid":[%d,1,1],'
                '"block":[256,1,1],"smem":0,"launch_attrs":{},"packing":"params","params":[')
        ptr = ptr.replace(',"off":%d,"size":8,"hex"', ',"hex"', 1)
    t = 10**9
    with open(pid / "launches.jsonl", "w") as fh:
        for seq in range(n):
            k = seq % len(SYMS)
            t += 3000 + rng.randrange(4000)
            tok = 1 + (seq // 1000) % 512
            parts = []
            for i in range(3):
                addr = base + (seq % 97) * 4096 + i * 0x100000
                h = addr.to_bytes(8, "little").hex()
                parts.append(ptr % ((i, h, base, 10 + i, addr - base) if compact
                                    else (i, 8 * i, h, base, 10 + i, addr - base)))
            lay = "" if compact else '"off":24,"size":4,'
            parts.append('{"i":3,%s"hex":"%s"}' % (lay, tok.to_bytes(4, "little").hex()))
            parts.append('{"i":4,%s"hex":"0000803f"}' % ("" if compact else '"off":28,"size":4,'))
            inner = base + 0x200000
            parts.append('{"i":5,%s"hex":"%s","ptrs":[{"at":8,"base":"0x%x",'
                         '"size":2097152,"id":5,"off":%d}]}'
                         % ("" if compact else '"off":32,"size":24,',
                            (tok.to_bytes(8, "little") + inner.to_bytes(8, "little") + bytes(8)).hex(),
                            base, inner - base))
            args = (seq, t, k, tok) if compact else (seq, t, 0x6000 + k, k + 1, "ab" * 32, SYMS[k], SYMS[k][4:-1], tok)
            fh.write(head % args + ",".join(parts) + "]}\n")
    (pid / "meta.json").write_text(json.dumps({"format_version": 1, "pid": 1}))
    return pid


CHILD = """
import resource, sys, time
t = time.perf_counter()
from mining.load import load_dump
d = load_dump(sys.argv[1])
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{dt:.2f} {rss:.0f} {len(d.launches)} {len(d.params)}")
"""


def measure(pid: Path) -> tuple[float, float, int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(pid)], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3])


LIMIT_S, LIMIT_MIB = 10.0, 2000e6 / 2**20   # issue 4: under 10 s and under 2 GB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--compact", action="store_true", help="write the dump in the compact form")
    ap.add_argument("--bin", action="store_true", help="write the dump as binary launch records")
    args = ap.parse_args()
    import pandas
    import pyarrow

    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pyarrow.__version__}, pandas {pandas.__version__}")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="mine-bench-"))
    pid = folder / "pid1"
    name = "launches.bin" if args.bin else "launches.jsonl"
    if not (pid / name).is_file():
        t = time.perf_counter()
        if args.bin:
            write_bin_dump(folder, args.launches)
        else:
            write_dump(folder, args.launches, args.compact)
        print(f"wrote {args.launches} launches in {time.perf_counter() - t:.1f} s")
    size = (pid / name).stat().st_size
    print(f"dump: {size / 1e6:.0f} MB of {name}" + (" (compact)" if args.compact else ""))
    os.environ["MINE_CACHE_DIR"] = str(folder / "cache")   # the children's cache (mining/cache.py)
    for run in range(1, args.runs + 1):
        shutil.rmtree(folder / "cache", ignore_errors=True)
        for label in (f"cold ({'binary' if args.bin else 'JSON'}, writes cache)", "warm (parquet cache)"):
            sec, rss, n, p = measure(pid)
            print(f"run {run} {label}: {sec:.2f} s, peak RSS {rss:.0f} MiB, {n} launches, "
                  f"{p} param rows (x{sec / LIMIT_S:.2f} of 10 s, x{rss / LIMIT_MIB:.2f} of 2 GB)")


if __name__ == "__main__":
    main()
