"""The manifest's wire vocabulary: schema version, dtypes and their sizes, enumerations, and the
parameter-type grammar (parse and format).

Why here: the verifier reads these names, the generators write them, the kernel table checks
them, and the ABI check sizes them; each used to keep its own copy. The values are kern-llm
0.3.1's (schema_version 7). Standard library only.
"""

from __future__ import annotations

import functools

SCHEMA_VERSION = 7
# The integer wire types: every integer position of the format is one of these (lo, hi).
INT_RANGES = {"u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1),
              "u64": (0, 2**64 - 1), "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1)}
U64_MAX = INT_RANGES["u64"][1]
# Every buffer dtype kern knows, with its element size in bytes (the order is kern's listing).
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8e4m3": 1, "fp8e8m0": 1, "i8": 1,
               "i32": 4, "u32": 4, "i64": 8, "u64": 8, "u8": 1}
DTYPES = tuple(DTYPE_BYTES)
# Scalar parameter types: a subset of the dtypes, passed by value at their dtype's size.
SCALARS = ("i32", "i64", "f32", "u8")
DIRECTIONS = ("in", "out", "inout")
POINTER_BYTES = 8  # a buffer or state parameter is a device pointer
KINDS = ("input", "output", "inout", "weight", "source", "workspace", "carry", "peer")
FILLS = ("token", "position", "valid", "slot", "seq_len", "cu_seqlens", "blocks",
         "tokens", "count", "error")
AXES = ("rows", "groups", "ranks")
PLACEMENTS = ("device", "host")
# The dtypes a TMA descriptor (tensormap) may hold, with their element width in bits.
TMA_DTYPE_BITS = {"u8": 8, "u16": 16, "u32": 32, "i32": 32, "u64": 64, "i64": 64, "f16": 16,
                  "bf16": 16, "f32": 32, "tf32": 32, "u4": 4, "u4packed": 4}
TMA_DTYPES = tuple(TMA_DTYPE_BITS)
# kern's runtime built-ins the project launches (`{"entry": "extern:..."}`), with the param
# types each takes: a GEMM's A, B, C then M, N, K; a collective's buffer(s) then its counts.
EXTERN_PARAMS = {
    "extern:cublaslt_bf16_tn": ("in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"),
    "extern:cublaslt_bf16_tn_acc": ("in buffer<bf16>", "in buffer<bf16>", "inout buffer<bf16>", "i32", "i32",
                                    "i32"),
    "extern:cublas_bf16_tn_f32": ("in buffer<bf16>", "in buffer<bf16>", "out buffer<f32>", "i32", "i32", "i32"),
    "extern:nccl_allreduce_bf16": ("in buffer<bf16>", "out buffer<bf16>", "i32", "i32"),
    "extern:nccl_allgather_f32": ("in buffer<f32>", "out buffer<f32>", "i32", "i32"),
}
# kern's NCCL built-ins as its loader takes them, [send, recv, count, rank] (kern-llm 0.3.1's own
# message: "an nccl collective takes [send, recv, count, rank]"; the rank arg names the group; its CPU
# verification also accepts a three-argument in-place form, which the loader then refuses). The K3
# generator's in-place all-reduces pass one buffer as both send and recv (NCCL's in-place call); the
# TP Qwen3 manifest (generators/qwen3/tp.py) writes these.
NCCL_PARAMS = {f"extern:nccl_{op}_{t}": (f"in buffer<{t}>", f"out buffer<{t}>", "i32", "i32")
               for op in ("allreduce", "allgather", "reducescatter") for t in ("f32", "bf16")}
# Rust's `char::is_whitespace` (Unicode White_Space): what kern trims off a param type. Python's
# own `str.strip()` would also drop U+001C..U+001F, which kern keeps (and then rejects).
RUST_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                   "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@functools.lru_cache(maxsize=4096)  # a manifest repeats a handful of type strings many times
def param_type(text: str) -> tuple | None:
    """`"in buffer<bf16>"` -> ("buffer", "in", "bf16"); scalars ("scalar", t); None if invalid.

    Other forms: ("state", dir), ("bytes", n). kern's grammar, probed: the whole string is
    trimmed of Unicode whitespace, the direction ends at the first plain space (a tab there is
    part of the direction, so `in\\tbuffer<f32>` is invalid), and the rest is trimmed again.
    """
    text = text.strip(RUST_WHITESPACE)
    direction, space, rest = text.partition(" ")
    if not space:
        if text in SCALARS:
            return ("scalar", text)
        if text.startswith("bytes<") and text.endswith(">"):
            n = text[6:-1]
            # Rust's u64 parser: ASCII digits with an optional leading `+`
            digits = n[1:] if n.startswith("+") else n
            if digits.isascii() and digits.isdigit() and 1 <= int(digits) <= U64_MAX:
                return ("bytes", int(digits))
        return None
    if direction not in DIRECTIONS:
        return None
    rest = rest.strip(RUST_WHITESPACE)
    if rest == "state":
        return ("state", direction)
    if rest.startswith("buffer<") and rest.endswith(">") and rest[7:-1] in DTYPES:
        return ("buffer", direction, rest[7:-1])
    return None


def format_param_type(t: tuple) -> str:
    """The canonical text of a parsed param type: `param_type(format_param_type(t)) == t`.

    Canonical means no surrounding whitespace, one space after the direction, and a byte count
    without sign or leading zeros -- the only spelling the project itself writes."""
    form = t[0]
    if form == "scalar":
        return t[1]
    if form == "bytes":
        return f"bytes<{t[1]}>"
    if form == "state":
        return f"{t[1]} state"
    if form == "buffer":
        return f"{t[1]} buffer<{t[2]}>"
    raise ValueError(f"not a param type: {t!r}")


def pointer_type(direction: str, dtype: str) -> str:
    """A pointer parameter's text: `dtype` is a buffer dtype, or "state" for a state pointer."""
    return format_param_type(("state", direction) if dtype == "state"
                             else ("buffer", direction, dtype))


def is_canonical_param_type(text: str) -> bool:
    """Whether `text` is a valid param type spelled exactly as `format_param_type` writes it."""
    t = param_type(text)
    return t is not None and format_param_type(t) == text


def param_direction(text: str) -> str | None:
    """The direction of a buffer or state param type; None for scalars, bytes and invalid text."""
    t = param_type(text)
    return t[1] if t is not None and t[0] in ("buffer", "state") else None


def param_type_bytes(t: tuple) -> int:
    """The ABI slot size of a parsed param type: a scalar's dtype size, a pointer's 8 bytes, a
    `bytes<N>` pack's N."""
    if t[0] == "scalar":
        return DTYPE_BYTES[t[1]]
    if t[0] == "bytes":
        return t[1]
    return POINTER_BYTES


def param_bytes(text: str) -> int | None:
    """The ABI slot size of a param type's text; None when the text is not a param type."""
    t = param_type(text)
    return None if t is None else param_type_bytes(t)
