"""The `structs` section of the analysis contract: by-value struct parameters word by word.

Why apart from vocab/analysis.py: the section has a version of its own, `STRUCTS_VERSION`, so its
records can grow without touching the rest of the contract; `AnalysisDoc.structs` holds it and
the JSON leaves the key out when a dump has no parameter wider than 8 bytes (such an analysis
stays byte for byte what it was before the section existed). Constant words are most of a struct
(a GEMM's 1720 B block is ~200 constant words and ~20 others), so they are carried as runs of
offsets (their values are the dump's parameter bytes), and only the other words as records. mining/structs.py builds it;
docs/analysis-json.md ("structs") documents every field. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

STRUCTS_VERSION = 1        # of the `structs` section (docs/analysis-json.md)


@dataclass
class StructLane:
    lane: int              # 0: the word's bytes 0-3, 1: bytes 4-7 (little-endian int32 each)
    kind: str              # const | size | varies
    value: int             # its first sample
    expr: str | None       # a size's fitted expression
    status: str            # the fit's status ("" for a constant)


@dataclass
class StructWord:
    at: int                # byte offset in the parameter (a multiple of 8)
    size: int              # 8, or the bytes of the parameter's short tail
    kind: str              # pointer | maybe_pointer | const | size | varies | lanes
    role: str              # a site-scope pointer's role (as pointers[]); "" otherwise
    buffer_id: int         # a pointer's allocation (its first sample); -1 for scalars
    offset: int            # that pointer's offset in its allocation
    addresses: int         # distinct pointer values (0 for scalars)
    samples: int           # forwards (site scope) or launches (kernel scope) holding the word
    ptr_samples: int       # of those, where it was a pointer
    value: int             # its first sample, signed (8 bytes: int64; a 4-byte tail: int32)
    distinct: int          # distinct values over the samples
    expr: str | None       # a size's fitted expression (fits[] text form)
    status: str            # the fit's status (fit | piecewise | underdetermined | no_fit; "" unfitted)
    points: int            # distinct tokens values behind the fit
    holdout: str           # as fits[].holdout ("" unfitted)
    note: str              # how a constant also reads (a double, two 4-byte fields); a fit's note
    lanes: list[StructLane]  # kind lanes: its two 4-byte halves


@dataclass
class StructParam:
    scope: str             # site (a call site of the forwards) | kernel (a kernel run outside them)
    site: str              # the call site ("" at kernel scope)
    symbol: str
    layer: int             # -1 outside the layer stack and at kernel scope
    pos: int
    i: int                 # parameter index
    size: int              # parameter bytes
    samples: int           # forwards (site scope) or launches (kernel scope)
    const_words: int       # words with one value in every sample: those not in `words`
    const_runs: list[list[int]]  # where they are: [at, words] runs of consecutive constant words
    words: list[StructWord]  # every word that is not constant, by offset


@dataclass
class Structs:
    version: int           # STRUCTS_VERSION
    params: list[StructParam]
