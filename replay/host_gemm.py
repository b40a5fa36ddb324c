"""cuBLASLt GEMMs of an in-order replay, computed on the host.

Why: the replay runs launches from their cubins, and NVIDIA's closed libraries' cubins are never
kept in a fixture (nor always loadable from a dump). Skipping a GEMM leaves its output stale, and
in an engine's forward everything downstream of the projections -- the logits, the sampler, the
next step's device-side staging of positions and sequence lengths -- then reads wrong bytes (on
q3s the replayed decodes' positions stopped advancing). The launch's struct names the GEMM
(`compiler.externs.read_gemm`: the two TMA descriptors give x [m, k] and W [n, k], the output
C [m, n], split-K joined), so the replay computes C = x·Wᵀ itself, in float32 over the bf16
operands, rounded to bf16 (nearest even): what cuBLASLt's bf16 GEMM returns up to the order of
its sums, not bit for bit. Values downstream are realistic, not the engine's own (a flat model's
argmax may flip); what the replay measures from them -- directions, which bytes a launch reads,
which staging values advance -- does not depend on those last bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import externs
from compiler.launches import read_launches
from replay.memory import Memory


@dataclass(frozen=True)
class HostGemm:
    seq: int
    aux: int | None        # the split-K reduction launch it stands for too
    x: int
    w: int
    c: int
    m: int
    n: int
    k: int


def to_f32(raw: np.ndarray) -> np.ndarray:
    """bf16 bytes (uint8) as float32."""
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_bf16(v: np.ndarray) -> np.ndarray:
    """float32 as bf16 bytes (uint8), rounded to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(v, np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(v)
    if nan.any():
        r[nan] = 0x7FC0
    return r.view(np.uint8)


def find(dump, window: list[int]) -> dict[int, HostGemm]:
    """seq -> HostGemm for the window's cuBLASLt launches whose struct reads as a GEMM; a split-K
    reduction launched right after one maps to it too (`aux`: computed once, at the main launch)."""
    syms = dict(zip(dump.launches["seq"].tolist(), dump.launches["symbol"].astype(str).tolist()))
    pos = [j for j, s in enumerate(window) if externs.is_main(syms.get(s, ""))]
    if not pos:
        return {}
    nxt = {window[j]: window[j + 1] for j in pos if j + 1 < len(window) and externs.is_aux(syms.get(window[j + 1], ""))}
    launches = read_launches(dump, [window[j] for j in pos] + list(nxt.values()))
    out: dict[int, HostGemm] = {}
    for j in pos:
        s = window[j]
        x, aux = launches.get(s), launches.get(nxt.get(s, -1))
        if x is None:
            continue
        try:
            g = externs.read_gemm(x, aux)
        except externs.GemmError:
            continue
        at = {(w.i, w.at): w.value for w in x.words}
        hg = HostGemm(s, aux.seq if aux is not None else None, at[g.x], at[g.w], at[g.c], g.m, g.n, g.k)
        out[s] = hg
        if aux is not None:
            out[aux.seq] = hg
    return out


def run(g: HostGemm, mem: Memory) -> None:
    """C = x·Wᵀ on the replay's memory (x [m, k], W [n, k], C [m, n], bf16, rows packed)."""
    x = to_f32(mem.read(g.x, g.m * g.k * 2)).reshape(g.m, g.k)
    w = to_f32(mem.read(g.w, g.n * g.k * 2)).reshape(g.n, g.k)
    with np.errstate(all="ignore"):
        c = x @ w.T
    mem.write(g.c, to_bf16(c.astype(np.float32)).tobytes())
