"""Deliberately broken copies of a manifest, for showing that `mine compare` catches them.

Each break is one mistake a generator could make and the verifier cannot see (the manifest still
verifies, every launch still fits its cubin):
- `wrong_weight`: one layer's GEMM weight bound to the next layer's tensor(s) of the same shape;
- `swapped_stride`: two distinct stride literals of the prefill's rotary-embedding launch
  swapped (the query and key row strides), so prompt tokens land wrong keys in the KV cache;
- `swapped_dims`: one decode GEMM's N and K exchanged (same element count, wrong product).
Runnable: `python breaks.py MANIFEST_DIR OUT_DIR` writes OUT_DIR/<break>/ beside copies of the
manifest's kernels and bindings, and prints what each changed.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def wrong_weight(m: dict) -> tuple[dict, str]:
    bufs = m["buffers"]
    groups: dict = {}
    for n, b in bufs.items():
        if b.get("kind") == "weight" and len(b.get("shape", [])) == 2 and b.get("bind"):
            groups.setdefault((b["dtype"], tuple(b["shape"]), len(b["bind"])), []).append(n)
    names = sorted(max(groups.values(), key=len), key=_natural)
    if len(names) < 2:
        raise ValueError("no two same-shaped 2-D weights to confuse")
    a, b = names[len(names) // 2 - 1], names[len(names) // 2]
    out = copy.deepcopy(m)
    out["buffers"][a]["bind"] = copy.deepcopy(bufs[b]["bind"])
    return out, f"weight {a} bound to {[x['tensor'] for x in bufs[b]['bind']]}"


def swapped_stride(m: dict) -> tuple[dict, str]:
    prefill = m["programs"]["prefill"]["calls"]
    op = next(c["op"] for c in prefill if "rope" in c["op"])
    out = copy.deepcopy(m)
    args = out["ops"][op]["impl"]["launches"][0]["args"]
    i64 = [k for k, a in enumerate(args) if "i64" in a]
    j, k = next((p, q) for p, q in zip(i64, i64[1:]) if args[p]["i64"] != args[q]["i64"] and q == p + 1)
    args[j], args[k] = args[k], args[j]
    return out, f"op {op}: i64 args {j} and {k} ({args[k]['i64']}, {args[j]['i64']}) swapped"


def swapped_dims(m: dict) -> tuple[dict, str]:
    out = copy.deepcopy(m)
    calls = out["programs"]["decode"]["calls"]
    gemms = [c for c in calls if c["op"] == "gemm" and "down" in c.get("label", "")]
    c = gemms[len(gemms) // 2]
    a = c["args"]
    a[4], a[5] = a[5], a[4]
    return out, f"call {c['label']}: N and K swapped ({a[5]['i32']} -> {a[4]['i32']})"


BREAKS = {"wrong_weight": wrong_weight, "swapped_stride": swapped_stride, "swapped_dims": swapped_dims}


def write_all(mdir: Path, out: Path) -> dict[str, str]:
    src = next(p for p in sorted(mdir.glob("*.json")) if b'"schema_version"' in p.read_bytes())
    m = json.loads(src.read_text())
    said = {}
    for name, fn in BREAKS.items():
        d = out / name
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(mdir, d)
        broken, what = fn(m)
        (d / src.name).write_text(json.dumps(broken, sort_keys=True))
        said[name] = what
    return said


if __name__ == "__main__":
    for k, v in write_all(Path(sys.argv[1]), Path(sys.argv[2])).items():
        print(f"{k}: {v}")
