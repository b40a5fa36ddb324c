"""Check every weight bind of a manifest against a checkpoint's safetensors headers (`mine k3 binds`).

Only headers are read (8-byte little-endian length, then JSON): for each `weight`/`source` buffer
and each rank of the bind's group, every segment's tensor must exist with the buffer's dtype, its
row/column ranges must lie inside the tensor viewed as [dim0, prod(rest)], and the segments' bytes
must add up to the buffer's bytes. No weight byte is read; data offsets are not checked.
"""

from __future__ import annotations

from math import prod
from pathlib import Path

from generators.safetensors import CheckpointError, checkpoint_files, read_header  # noqa: F401  (re-exported)

from .memory import DTYPE_BYTES, buffer_bytes

ST_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F8_E4M3": "fp8e4m3", "F8_E8M0": "fp8e8m0",
             "I8": "i8", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64", "U8": "u8"}


def read_checkpoint(directory: str | Path) -> dict:
    files = checkpoint_files(Path(directory))
    tensors = {}
    for f in files:
        for name, info in read_header(f).items():
            tensors[name] = (ST_DTYPES.get(info.get("dtype"), info.get("dtype")), list(info.get("shape", [])))
    return tensors


def _pick(value, rank):
    """A fixed value, or this rank's entry of a {group, tensors|ranges} table."""
    if isinstance(value, dict):
        return (value.get("tensors") or value.get("ranges"))[rank]
    return value


def _span(rng, extent):
    return (0, extent) if rng is None else tuple(rng)


def check_binds(m: dict, tensors: dict) -> dict:
    groups = m.get("topology", {}).get("groups", {})
    problems, by_kind, checked = [], {}, 0
    for bname, buf in sorted(m["buffers"].items()):
        if not buf.get("bind"):
            continue
        group = next((v["group"] for s in buf["bind"] for v in (s["tensor"], s.get("rows"), s.get("cols"))
                      if isinstance(v, dict)), None)
        ranks = groups.get(group, 1) if group else 1
        want = buffer_bytes(m, buf)
        for r in range(ranks):
            total = 0
            for seg in buf["bind"]:
                name = _pick(seg["tensor"], r)
                checked += 1
                if name not in tensors:
                    problems.append(f"{bname} (rank {r}): tensor `{name}` is not in the checkpoint")
                    continue
                dtype, shape = tensors[name]
                if dtype != buf["dtype"]:
                    problems.append(f"{bname} (rank {r}): `{name}` is {dtype}, the buffer is {buf['dtype']}")
                    continue
                dim0, rest = (shape[0], prod(shape[1:])) if shape else (1, 1)
                rows, cols = _span(_pick(seg.get("rows"), r), dim0), _span(_pick(seg.get("cols"), r), rest)
                if not (0 <= rows[0] < rows[1] <= dim0 and 0 <= cols[0] < cols[1] <= rest):
                    problems.append(f"{bname} (rank {r}): rows {list(rows)} cols {list(cols)} outside `{name}` "
                                    f"viewed as [{dim0}, {rest}]")
                    continue
                total += (rows[1] - rows[0]) * (cols[1] - cols[0]) * DTYPE_BYTES[dtype]
            if total != want and not any(p.startswith(f"{bname} (rank {r})") for p in problems):
                problems.append(f"{bname} (rank {r}): segments hold {total} bytes, the buffer {want}")
            if r == 0:
                by_kind[buf["kind"]] = by_kind.get(buf["kind"], 0) + total
    return {"problems": problems, "segments_checked": checked, "bytes_rank0": by_kind}
