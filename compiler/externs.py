"""cuBLASLt GEMM launches read as kern's built-in `extern:cublaslt_bf16_tn` (C = A·Wᵀ).

Why: cuBLAS and cuBLASLt cubins are never copied into a dump (NVIDIA's closed libraries), so their
launches cannot be kernel calls of a manifest; kern runs the same GEMM through its own cuBLASLt
call, given the operands and m, n, k. What the capture pins is the launch's one by-value
parameter (cuBLASLt's nvjet kernels take a ~1.7 KB struct): it embeds a TMA descriptor per input
operand, whose bytes hold the operand's address, its row pitch (bytes / 16, at +12) and its two
extents minus one (+32: the contracted size k, +36: the rows), followed by the output pointer.
These are facts of the library's launch ABI, read the same for every model:

- the first two descriptors (distinct addresses, in struct order) are cuBLAS's A and B; vLLM and
  torch call `linear(x, W)` as a "TN" GEMM, so A is the weight W [n, k] and B the activation
  x [m, k]; kern's operand order is (x, W, C, m, n, k);
- both must agree on k, and their pitch must be k 2-byte elements (dense bf16 rows);
- the output C is the first embedded pointer after them that is neither operand;
- a split-K GEMM is two launches: the nvjet kernel writes partial sums to a workspace and
  cuBLASLt's `splitKreduce_kernel` right after it writes C; both are one extern call.

Not checked (kern checks it at load or not at all): that the element type is bf16 rather than
f16 (the pitch only shows 2-byte elements), that C is dense with row pitch n, beta = 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compiler.launches import Launch, Param, struct_u32

GEMM_ENTRY = "extern:cublaslt_bf16_tn"
MAIN = re.compile(r"^nvjet_")                       # cuBLASLt's Hopper GEMM kernels
AUX = re.compile(r"cublasLt.*splitKreduce_kernel|splitKreduce_kernel.*cublasLt")


class GemmError(ValueError):
    """A cuBLASLt launch whose struct does not read as the descriptors above (the caller turns
    it into a CompileError naming the call site)."""


def is_main(symbol: str) -> bool:
    return bool(MAIN.search(symbol))


def is_aux(symbol: str) -> bool:
    return bool(AUX.search(symbol)) or ("8cublasLt" in symbol and "splitKreduce" in symbol)


def is_library(symbol: str) -> bool:
    """A cuBLASLt launch (main GEMM or its split-K reduction)."""
    return is_main(symbol) or is_aux(symbol)


@dataclass(frozen=True)
class Gemm:
    """One GEMM: the pointer words (param, at) of x, W and C in its main launch, and m, n, k."""
    x: tuple
    w: tuple
    c: tuple
    m: int
    n: int
    k: int
    split_k: bool


def _descriptor(p: Param, at: int) -> tuple[int, int, int] | None:
    """(pitch bytes, inner extent, outer extent) of a TMA descriptor whose address is at `at`."""
    flags, pitch, d0, d1 = (struct_u32(p, at + o) for o in (8, 12, 32, 36))
    if None in (flags, pitch, d0, d1) or flags == 0 or pitch == 0:
        return None
    return pitch * 16, d0 + 1, d1 + 1


def read_gemm(main: Launch, aux: Launch | None = None) -> Gemm:
    """The GEMM of one nvjet launch (and its split-K reduction); GemmError says what does not read."""
    structs = [p for p in main.params if p.raw is not None and p.size > 64]
    if len(structs) != 1:
        raise GemmError(f"takes {len(main.params)} parameter(s), not the one by-value struct of cuBLASLt's nvjet ABI"
                        " (or the dump did not keep its bytes)")
    p = structs[0]
    words = [w for w in main.words if w.i == p.i]
    order: list = []
    for w in words:
        if w.value not in [o.value for o in order]:
            order.append(w)
    desc = [(w, _descriptor(p, w.at)) for w in order]
    ops = [(w, d) for w, d in desc if d is not None][:2]
    if len(ops) < 2:
        raise GemmError(f"holds {len(ops)} operand descriptor(s) where an A and a B are needed")
    (wa, (pa, ka, n)), (wb, (pb, kb, m)) = ops
    if ka != kb:
        raise GemmError(f"its operands disagree on the contracted size ({ka} and {kb})")
    if pa != 2 * ka or pb != 2 * kb:
        raise GemmError(f"an operand's row pitch ({pa} or {pb} bytes) is not {ka} two-byte elements")
    later = [w for w in order if w.at > wb.at and w.value not in (wa.value, wb.value)]
    if not later:
        raise GemmError("names no output pointer after its two operands")
    c = later[0]
    if aux is not None and not any(w.value == c.value for w in aux.words):
        raise GemmError("its split-K reduction does not write the output the GEMM names")
    return Gemm((wb.i, wb.at), (wa.i, wa.at), (c.i, c.at), m, n, ka, aux is not None)
