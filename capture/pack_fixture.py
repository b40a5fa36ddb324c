"""Pack a dump into a small committed test fixture (a .tar.xz).

    python -m capture.pack_fixture DUMP OUT.tar.xz [--max-launches 3000] [--max-cubin-bytes 2000000]

Keeps meta.json, modules.jsonl, graphs.jsonl, tensormaps.jsonl, allocs.jsonl, functions.jsonl, copies.jsonl and
the first launches of each process (launches.jsonl lines, or launches.bin records), and the cubins those launches use (most-launched first, each under --max-cubin, all under
--max-cubin-bytes). Drops the cubin files of NVIDIA's closed libraries (modules whose entries look
like cuBLAS/cuBLASLt/cuDNN/NCCL kernels), modules no kept launch uses, and any cubin past the
budgets; their records keep sha256 and symbols, so tests can still follow the links.
A fixture carries no machine's paths: meta.json's argv entries and output folder keep only their
last component (`scrub_meta`).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np

from vocab import binfmt

CLOSED = re.compile(r"nvjet|cublas|cublasLt|sm\d+_xmma|gemmk?SN|gemv2?T?_kernel|splitKreduce|cudnn|nccl|"
                    r"ampere_|sm80_|sm90_|Kernel_.*gemm|gemm_kernel|cutlass.*cublas", re.I)


def _base(v):
    return v.rsplit("/", 1)[-1] if isinstance(v, str) and v.startswith("/") else v


def scrub_meta(data: bytes) -> bytes:
    """meta.json with the absolute paths it records (argv, options.dir) cut to their last
    component; anything that is not the JSON object a capture writes passes unchanged."""
    try:
        meta = json.loads(data)
    except ValueError:
        return data
    if not isinstance(meta, dict):
        return data
    if isinstance(meta.get("argv"), list):
        meta["argv"] = [_base(a) for a in meta["argv"]]
    if isinstance(meta.get("options"), dict) and "dir" in meta["options"]:
        meta["options"]["dir"] = _base(meta["options"]["dir"])
    return json.dumps(meta, separators=(",", ":")).encode()


def _snapshot(proc: Path, budget: int, add_bytes) -> int:
    """The pid folder's snapshot (snapshot.jsonl + snapshot/*.bin) within `budget` bytes, in address
    order: a region past the budget is recorded `skipped` ("not packed"), so the reader neither
    looks for its file nor mistakes it for a lost one. Returns the bytes packed."""
    path = proc / "snapshot.jsonl"
    if budget <= 0 or not path.is_file():
        return 0
    packed, lines = 0, []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "region" and rec.get("status") == "ok" and rec.get("file"):
            f = proc / rec["file"]
            if f.is_file() and packed + f.stat().st_size <= budget:
                packed += f.stat().st_size
                add_bytes(f"{proc.name}/{rec['file']}", f.read_bytes())
            else:
                rec = dict(rec, status="skipped", file=None, reason="not packed into the fixture")
        lines.append(json.dumps(rec, separators=(",", ":")))
    add_bytes(f"{proc.name}/snapshot.jsonl", ("\n".join(lines) + "\n").encode())
    return packed


def pack(dump: Path, out: Path, max_launches: int, max_cubin_bytes: int, max_cubin: int = 4_000_000,
         snapshot_bytes: int = 0) -> dict:
    kept, dropped, snap = 0, 0, 0
    budget = max_cubin_bytes
    with tarfile.open(out, "w:xz") as tar:
        def add_bytes(name: str, data: bytes):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))

        for proc in sorted(dump.glob("pid*")):
            rel = proc.name
            for name in ("meta.json", "modules.jsonl", "graphs.jsonl", "tensormaps.jsonl", "allocs.jsonl",
                         "functions.jsonl", "copies.jsonl"):
                if (proc / name).is_file():
                    data = (proc / name).read_bytes()
                    add_bytes(f"{rel}/{name}", scrub_meta(data) if name == "meta.json" else data)
            snap += _snapshot(proc, snapshot_bytes - snap, add_bytes)
            fn_sha = {fn: r.get("sha256") for fn, r in binfmt.read_functions(proc / binfmt.FUNCTIONS).items()}
            uses: dict[str, int] = {}
            if (proc / binfmt.LAUNCHES_BIN).is_file():
                data = (proc / binfmt.LAUNCHES_BIN).read_bytes()
                offs = binfmt.scan(data).offsets
                ends = offs + np.frombuffer(data, np.uint8)[:len(data) - len(data) % 8].view("<u4")[offs // 4]
                cut = int(ends[min(max_launches, len(offs)) - 1]) if len(offs) else 0
                add_bytes(f"{rel}/{binfmt.LAUNCHES_BIN}", data[:cut])
                for fn in binfmt.headers(data, offs[:max_launches])["fn"].tolist():
                    if fn_sha.get(fn):
                        uses[fn_sha[fn]] = uses.get(fn_sha[fn], 0) + 1
                lines = []
            else:
                lines = (proc / "launches.jsonl").read_bytes().splitlines(keepends=True) \
                    if (proc / "launches.jsonl").is_file() else []
                # a killed process's mmap-written file: NUL runs before a record, NUL tail (dump-format.md)
                lines = [x.rpartition(b"\0")[2] for x in lines]
                lines = [x for x in lines if x.endswith(b"\n") and x.strip()]
                lines = lines[:max_launches]
                add_bytes(f"{rel}/launches.jsonl", b"".join(lines))
            closed, no_entries = set(), set()
            for line in (proc / "modules.jsonl").read_text().splitlines() if (proc / "modules.jsonl").is_file() else []:
                rec = json.loads(line)
                if rec.get("event") == "load" and not rec.get("entries"):
                    no_entries.add(rec["sha256"])  # origin unknown: keep records, not bytes
                if rec.get("event") == "load" and any(CLOSED.search(e) for e in rec.get("entries", [])):
                    closed.add(rec["sha256"])
            # Cubins the launches use come first, smallest first: a fixture is for the kernels that
            # ran, not for every module the process happened to load, and within the byte budget
            # it keeps as many of them as fit (most-launched first let two framework cubins of
            # 2-4 MB crowd out a model's 41 KB attention kernel launched once per forward).
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # the torn last record of a killed process: readers drop it too
                sha = rec.get("sha256") or fn_sha.get(rec.get("fn"))  # compact records name a function
                if sha:
                    uses[sha] = uses.get(sha, 0) + 1
            cubins = sorted((proc / "cubins").glob("*.cubin")) if (proc / "cubins").is_dir() else []
            cubins.sort(key=lambda c: (c.stem not in uses, c.stat().st_size, c.name))
            for cubin in cubins:
                size = cubin.stat().st_size
                if (cubin.stem in closed or cubin.stem in no_entries or cubin.stem not in uses
                        or size > max_cubin or size > budget):
                    dropped += 1
                    continue
                budget -= size
                kept += 1
                add_bytes(f"{rel}/cubins/{cubin.name}", cubin.read_bytes())
    return {"cubins_kept": kept, "cubins_dropped": dropped, "snapshot_bytes": snap, "bytes": out.stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dump", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-launches", type=int, default=3000)
    ap.add_argument("--max-cubin-bytes", type=int, default=2_000_000, help="all kept cubins together")
    ap.add_argument("--max-cubin", type=int, default=4_000_000, help="one cubin")
    ap.add_argument("--snapshot-bytes", type=int, default=0,
                    help="keep the device snapshot's allocations up to this many bytes (default: none)")
    a = ap.parse_args()
    print(json.dumps(pack(a.dump, a.out, a.max_launches, a.max_cubin_bytes, a.max_cubin, a.snapshot_bytes)))


if __name__ == "__main__":
    main()
