"""`mine compile --weights`: each weight buffer's kern `bind`, from the capture's snapshot bytes and a
checkpoint's tensors (docs/compile.md "Weights by content").

Why: a compiled manifest's weights are address ranges of the capture (compiler/buffers.py); kern
loads a weight buffer by laying checkpoint tensor segments end to end (kern-manifest.md 2.3). The
snapshot (mining/snapshot.py) holds the range's bytes; `compiler.weights.bind` explains them as
pieces of tensors and gaps. Here each piece becomes segments in kern's view of a tensor as a
matrix [dim0, product(rest)] (a 1-D tensor: one row): the whole tensor, a `rows` range, or a partial row (`rows` [r, r+1]
and `cols`), in elements; a piece that cannot be said so (not whole elements, or its tensor's dtype
is not the buffer's: the engine converted it, or the bytes agree by chance) and every gap are
bytes of the buffer's own dtype in `weights/extra.safetensors` (tensors `mine.extra.<buffer>.<k>`),
bound from there. A buffer whose bytes the snapshot does not hold keeps `capture.<name>` (its
provenance says why: the allocation was skipped, failed or not copied).

Equal-content tensors (a random-init norm of ones in every layer; a tied embedding listed under two
names): the bytes are the same whichever is bound, so the manifest loads the same values; which
name is meant is decided by the address neighbours: engines allocate a model's weights in module
order, so the candidate sharing the most leading dot-separated name components (`model`,
`layers`, `3`, ...) with an unambiguous tensor bound nearby (the same buffer's other pieces, the
nearest weight buffer below and the nearest above) is bound when it is the only one with that
score; otherwise (a tie) the first by name, said as undetermined. Every such choice is in
provenance (`weights.ambiguous`: the candidates, the one bound and the rule that chose it).
Nothing in the checkpoint folder is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from compiler import weights as W

# safetensors dtype -> (kern dtype, bytes per element)
DTYPES = {"BF16": ("bf16", 2), "F16": ("f16", 2), "F32": ("f32", 4), "I8": ("i8", 1), "U8": ("u8", 1),
          "I32": ("i32", 4), "U32": ("u32", 4), "I64": ("i64", 8), "U64": ("u64", 8),
          "F8_E4M3": ("fp8e4m3", 1), "F8_E8M0": ("fp8e8m0", 1)}
KERN_TO_ST = {k: st for st, (k, _) in DTYPES.items()}
EXTRA_FILE = "weights/extra.safetensors"


@dataclass
class WeightBinds:
    binds: dict[str, list[dict]] = field(default_factory=dict)      # buffer -> kern bind segments
    extras: dict[str, tuple[str, list[int], bytes]] = field(default_factory=dict)  # for extra.safetensors
    provenance: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def segments(t, start: int, length: int) -> Optional[list[dict]]:
    """kern segments for bytes [start, start + length) of tensor `t` (generators.safetensors.Tensor),
    or None when they are not whole elements of a dtype kern knows."""
    if t.dtype not in DTYPES:
        return None
    el = DTYPES[t.dtype][1]
    total = t.end - t.begin
    if start % el or length % el or length <= 0 or start + length > total:
        return None
    if start == 0 and length == total:
        return [{"tensor": t.name}]
    # kern views a 1-D (or 0-D) tensor as one row of all its elements (kern-llm: "rows [0, 64)
    # outside the tensor's 1" for a [256] norm weight bound by rows, seen on the H200)
    cols = math.prod(t.shape[1:]) if len(t.shape) > 1 else max(1, math.prod(t.shape))
    a, b = start // el, (start + length) // el
    r0, c0 = divmod(a, cols)
    r1, c1 = divmod(b, cols)
    if r0 == r1:
        return [{"tensor": t.name, "rows": [r0, r0 + 1], "cols": [c0, c1]}]
    out = []
    if c0:
        out.append({"tensor": t.name, "rows": [r0, r0 + 1], "cols": [c0, cols]})
        r0 += 1
    if r1 > r0:
        out.append({"tensor": t.name, "rows": [r0, r1]})
    if c1:
        out.append({"tensor": t.name, "rows": [r1, r1 + 1], "cols": [0, c1]})
    return out


def _shared(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        n += 1
    return n


def _choose(cands: list[tuple[str, int]], near: list[str]) -> tuple[tuple[str, int], str]:
    """The candidate (name, offset) to bind and the rule that chose it (module docstring)."""
    best, ref_of = -1, {}
    for c in cands:
        score, ref = max(((_shared(c[0], r), r) for r in near), default=(0, ""))
        ref_of[c] = (score, ref)
        best = max(best, score)
    top = [c for c in cands if ref_of[c][0] == best]
    if best > 0 and len(top) == 1:
        return top[0], f"shares {best} leading name component(s) with {ref_of[top[0]][1]}, bound nearest in address"
    return min(cands), "equal bytes and the address neighbours do not tell the candidates apart: the first by name"


def bind_weights(decls: dict, snapshot, files: list[Path]) -> WeightBinds:
    """The binds of every weight declaration of `decls` (compiler.buffers.Decl by name)."""
    out = WeightBinds()
    ws = sorted((d for d in decls.values() if d.kind == "weight"), key=lambda d: d.base + d.lo)
    ix = W.index(files)
    try:
        found: dict[str, tuple] = {}
        missing = []
        for d in ws:
            data = snapshot.read(d.base + d.lo, d.size)
            if data is None:
                missing.append(d.name)
                out.provenance[d.name] = {"address": hex(d.base + d.lo), "bytes": d.size, "kind": "not in the snapshot",
                                          "because": _why_absent(snapshot, d.base + d.lo, d.size)}
                continue
            found[d.name] = (d, data, W.bind(data, ix))
        ambiguous = _resolve(found, ws)
        for name, (d, data, b) in found.items():
            out.binds[name], out.provenance[name] = _buffer_binds(d, data, b, ix, ambiguous.get(name, {}), out.extras)
        out.provenance = {"buffers": out.provenance, "ambiguous": [a for n in sorted(ambiguous)
                                                                    for a in ambiguous[n].values()],
                          "checkpoint": [p.name for p in files],
                          "extra": EXTRA_FILE if out.extras else None}
    finally:
        ix.close()
    kinds = [out.provenance["buffers"][n]["kind"] for n in out.binds]
    out.notes.append(f"weights by content: {len(out.binds)} of {len(ws)} weight buffers bound from the snapshot "
                     f"({', '.join(f'{kinds.count(k)} {k}' for k in sorted(set(kinds)))})"
                     + (f"; {len(missing)} not in the snapshot keep `capture.*` binds" if missing else ""))
    if out.extras:
        out.notes.append(f"{len(out.extras)} range(s) no checkpoint tensor holds are bound from {EXTRA_FILE} "
                         f"({sum(len(v[2]) for v in out.extras.values())} bytes)")
    if out.provenance["ambiguous"]:
        out.notes.append(f"{len(out.provenance['ambiguous'])} piece(s) had equal-content alternatives; the name "
                         "bound is chosen by address neighbours (provenance.json weights.ambiguous)")
    return out


def _why_absent(snapshot, address: int, n: int) -> str:
    for r in snapshot.regions:
        if r.base <= address < r.base + r.size:
            return f"its allocation {hex(r.base)} is `{r.status}` in the snapshot" + (f" ({r.reason})" if r.reason else "")
    return "no allocation of the snapshot holds it"


def _resolve(found: dict, ws: list) -> dict[str, dict[int, dict]]:
    """buffer -> piece index -> the choice among equal-content candidates (module docstring)."""
    clear = {name: [p.tensor for p in b.pieces if isinstance(p, W.Piece) and not p.alternatives]
             for name, (_, _, b) in found.items()}
    order = [d.name for d in ws if d.name in found]
    out: dict[str, dict[int, dict]] = {}
    for k, name in enumerate(order):
        b = found[name][2]
        for i, p in enumerate(b.pieces):
            if not isinstance(p, W.Piece) or not p.alternatives:
                continue
            near = list(clear[name])   # the buffer's own, then the nearest clear name below and above
            below = [clear[order[m]][-1] for m in range(k - 1, -1, -1) if clear[order[m]]][:1]
            above = [clear[order[m]][0] for m in range(k + 1, len(order)) if clear[order[m]]][:1]
            near += below + above
            cands = [(p.tensor, p.start), *zip(p.alternatives, p.alt_starts)]
            pick, rule = _choose(cands, near)
            out.setdefault(name, {})[i] = {"buffer": name, "piece": i, "candidates": sorted(c for c, _ in cands),
                                           "bound": pick[0], "start": pick[1], "rule": rule}
    return out


def _buffer_binds(d, data: bytes, b, ix, choices: dict, extras: dict) -> tuple[list[dict], dict]:
    """One buffer's segments and provenance; its unexplained bytes are added to `extras`."""
    el = DTYPES[KERN_TO_ST[d.dtype]][1] if d.dtype in KERN_TO_ST else 1
    plan: list = []        # [segments, provenance] of a bound piece, or (lo, hi) bytes for the extra file
    pieces: list[dict] = []
    at = 0
    for i, p in enumerate(b.pieces):
        n = p.length
        if isinstance(p, W.Piece):
            name, start = (choices[i]["bound"], choices[i]["start"]) if i in choices else (p.tensor, p.start)
            t = ix.tensors[name]
            same = DTYPES.get(t.dtype, ("", 0))[0] == d.dtype
            s = segments(t, start, n) if same else None
            if s is not None:
                plan.append(s)
                pieces.append({"at": at, "bytes": n, "tensor": name, "start": start,
                               **({"alternatives": choices[i]["candidates"]} if i in choices else {})})
                at += n
                continue
            why = "its dtype differs from the buffer's" if not same else "not whole elements of the tensor"
            pieces.append({"at": at, "bytes": n, "equal_to": name, "start": start, "not_bound": why})
        if plan and isinstance(plan[-1], tuple):
            plan[-1] = (plan[-1][0], at + n)
        else:
            plan.append((at, at + n))
        at += n
    if any(isinstance(x, tuple) and (x[1] - x[0]) % el for x in plan):
        # bytes of no tensor that are not whole elements of the buffer's dtype: the whole buffer from the file
        pieces.append({"at": 0, "bytes": len(data), "note": f"bound whole from the extra file: a gap is not whole "
                                                            f"{d.dtype} elements"})
        plan = [(0, len(data))]
    segs: list[dict] = []
    for x in plan:
        if not isinstance(x, tuple):
            segs += x
            continue
        name = f"mine.extra.{d.name}.{sum(1 for k in extras if k.startswith(f'mine.extra.{d.name}.'))}"
        extras[name] = (KERN_TO_ST.get(d.dtype, "U8"), [(x[1] - x[0]) // el], data[x[0]:x[1]])
        segs.append({"tensor": name})
        pieces.append({"at": x[0], "bytes": x[1] - x[0], "extra": name})
    pieces.sort(key=lambda x: (x["at"], "extra" in x))
    unexplained = any(isinstance(x, tuple) for x in plan)
    kind = "none" if b.kind == "none" else ("partial" if unexplained else b.kind)
    return segs, {"address": hex(d.base + d.lo), "bytes": d.size, "kind": kind, "pieces": pieces}
