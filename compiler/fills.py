"""Naming an input by its bytes: which serving value (kern `fill`) a host-copied array holds.

The bytes of a copy (or the known prefix of them) are read as little-endian int32 and int64
arrays, and each is compared with what a step of the requests (compiler.requests) makes, with no
engine names:

| fill | the array equals (per sequence of the step, concatenated in some order of the sequences) | sure |
|---|---|---|
| `token` | the tokens the step feeds (a prompt or chunk; the previous step's output) | exact |
| `position` | arange(start, start + n) | exact |
| `seq_len` | one value per sequence: start + n | exact |
| `cu_seqlens` | 0, then the running sum of n (query start offsets) | exact |
| `slot` | one value per token, v = page * P + position % P for a power of two P >= 8: v % P equals the position % P, and consecutive positions inside a page have consecutive slots | structure |
| `blocks` | [sequences, w] page indices: row i's entry position // P is the slot's page (with a slot array of the step), else distinct non-negative entries per row, ceil(len / P) of them | structure |

`exact` matches values the request determines (a prefix of one-token sequences' offsets, an
arange, is `weak`: every decode step of that many sequences has it); `structure` matches an engine's own numbering
(page ids, slot numbers), which no request holds, by its shape -- believed over several tokens,
`weak` when the array has too few elements to tell (a one-token step's slot is any v with
v % P == position % P). Known bytes that are only a prefix (a host pointee's first bytes) are
matched as a prefix and say so. Without a step (no requests), only `cu_seqlens` (a running sum
from 0 ending at the forward's token count) can be named, from structure.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from compiler.requests import Step

DTYPES = {"i32": np.dtype("<i4"), "i64": np.dtype("<i8")}
PAGES = (8, 16, 32, 64, 128, 256, 512, 1024)
SURE = {"exact": 0, "structure": 1, "weak": 2}     # surest first


@dataclass(frozen=True)
class Match:
    fill: str                  # token | position | seq_len | cu_seqlens | slot | blocks
    dtype: str                 # i32 | i64
    sure: str                  # exact | structure | weak
    because: str
    elements: int              # compared elements
    prefix: bool = False       # only the first `elements` of the array were known
    page: int | None = None    # the page size P of a slot / blocks match


def arrays(data: bytes) -> dict[str, np.ndarray]:
    """The bytes as int32 and int64 (each where the length divides)."""
    return {k: np.frombuffer(data[:len(data) - len(data) % d.itemsize], d).astype(np.int64)
            for k, d in DTYPES.items() if len(data) >= d.itemsize}


def _segment(v: np.ndarray, parts: list[np.ndarray], prefix: bool) -> bool:
    """v is the concatenation of `parts` in some order (greedy; equal parts are interchangeable),
    or its prefix when `prefix`."""
    left, o = list(range(len(parts))), 0
    while left and o < len(v):
        hit = next((k for k in left if np.array_equal(v[o:o + len(parts[k])], parts[k][:len(v) - o])), None)
        if hit is None:
            return False
        o += len(parts[hit])
        left.remove(hit)
    return (o >= len(v) or not left) if prefix else (o == len(v) and not left)


def _positions(step: Step) -> list[np.ndarray]:
    return [np.arange(r.start, r.end, dtype=np.int64) for r in step.runs]


def _slot_page(v: np.ndarray, step: Step, prefix: bool) -> int | None:
    """The page size P under which v is a slot mapping of the step (in the step's order or in any
    order whose position runs fit), or None."""
    pos = np.concatenate(_positions(step))
    if prefix and len(v) > len(pos):
        v = v[:len(pos)]         # a known head: the step's slots, then whatever the buffer held past them
    if (not prefix and len(v) != len(pos)) or len(v) == 0 or (v < 0).any():
        return None
    pos = pos[:len(v)]
    for P in PAGES[::-1]:        # the largest page size the slots agree with (a 16-token page is also 8-consistent)
        if not (v % P == pos % P).all():
            continue
        same = (pos[1:] == pos[:-1] + 1) & (pos[1:] // P == pos[:-1] // P)
        if (v[1:][same] == v[:-1][same] + 1).all():
            return P
    # sequences in another order: each run of the array must be some sequence's positions mod P
    # (only where some sequence feeds several tokens: one-token runs would let any values pass)
    if max(len(r.tokens) for r in step.runs) < 2:
        return None
    for P in PAGES:
        runs = [p % P for p in _positions(step)]
        if _segment(v % P, runs, prefix):
            return P
    return None


BOUNDED = 4           # pages a bounded block table must show (summed over its rows) to be structure


def _blocks(v: np.ndarray, step: Step, page: int | None) -> tuple[int, int, bool, int] | None:
    """(P, w, bounded, pages compared) when v reads as a [sequences, w] table of each sequence's pages: each row's
    ceil(len / P) leading entries distinct. `bounded`: moreover each row's pages are non-zero page
    numbers below 2^31 (an i32 table read as i64 packs two pages a word, far above) and every entry
    after them is zero (an engine's table, its unused entries the null page), over
    BOUNDED pages or more -- for one P only, since the zeros start at exactly ceil(len / P).
    Why it counts as structure: a one-sequence decode's table keeps its pages from step to step, so
    no agreement over changing values ever names it, while a run of distinct pages that ends where
    the context's page count says is no chance reading."""
    n = len(step.runs)
    if n == 0 or len(v) % n or (v < 0).any():
        return None
    w = len(v) // n
    rows = v.reshape(n, w)
    loose = None
    for P in ([page] if page else PAGES):
        need = [-(-r.end // P) for r in step.runs]
        if max(need) <= w and all(len(set(rows[i, :k].tolist())) == k for i, k in enumerate(need)):
            if sum(need) >= BOUNDED and all((rows[i, :k] != 0).all() and (rows[i, :k] < 1 << 31).all()
                                            and not rows[i, k:].any() for i, k in enumerate(need)):
                return P, w, True, sum(need)
            loose = loose or (P, w, False, sum(need))
    return loose


def match(data: bytes, step: Step | None, tokens: int | None = None, prefix: bool = False) -> list[Match]:
    """Every fill the bytes match for the step (module docstring), surest first."""
    out: list[Match] = []
    for dt, v in arrays(data).items():
        n = len(v)
        if step is None:
            if (tokens and not prefix and n >= 2 and v[0] == 0 and v[-1] == tokens
                    and (np.diff(v) >= 0).all()):
                out.append(Match("cu_seqlens", dt, "structure", f"a running sum from 0 to the forward's {tokens} "
                                 f"tokens ({n - 1} sequences); no requests given to check the lengths", n, prefix))
            continue
        toks = [np.asarray(r.tokens, np.int64) for r in step.runs]
        lens = [np.asarray([r.end], np.int64) for r in step.runs]
        how = f"step {step.index} ({len(step.runs)} sequence(s), {step.tokens} token(s))"
        part = " (prefix)" if prefix else ""
        if _segment(v, toks, prefix):
            out.append(Match("token", dt, "exact", f"the token ids {how} feeds{part}", n, prefix))
        if _segment(v, _positions(step), prefix):
            out.append(Match("position", dt, "exact", f"each sequence's positions from its context length, {how}{part}",
                             n, prefix))
        if _segment(v, lens, prefix):
            out.append(Match("seq_len", dt, "exact", f"each sequence's length after {how}{part}", n, prefix))
        cu = np.concatenate(([0], np.cumsum([len(r.tokens) for r in step.runs])))
        sorted_cu = [cu[:n]] if prefix and n <= len(cu) else [cu]
        full = v
        if prefix and n > len(cu):
            v = v[:len(cu)]      # a host buffer longer than the step's offsets: its head is compared
        ones = all(len(r.tokens) == 1 for r in step.runs)   # offsets then are an arange any such step has
        padded = (not prefix and len(v) > len(cu) >= 2 and np.array_equal(v[:len(cu)], cu)
                  and (v[len(cu):] == cu[-1]).all())
        if len(v) >= 2 and any(np.array_equal(v, c) for c in sorted_cu) and not _dup(out, dt, n):
            out.append(Match("cu_seqlens", dt, "weak" if ones and prefix else "exact", f"0 and the running sum of the sequences' token counts, "
                             f"{how}{part}", n, prefix))
        elif padded and not _dup(out, dt, n):
            # an engine's fixed-capacity offsets array: the running sum, then its last value repeated
            # (vLLM pads query_start_loc to its largest batch); kern's cu_seqlens is the head
            out.append(Match("cu_seqlens", dt, "weak" if ones else "exact", f"0 and the running sum of the sequences' "
                             f"token counts, then its last value repeated to {n} entries (a padded capacity), {how}",
                             len(cu), prefix))
        elif len(step.runs) >= 2 and not _dup(out, dt, n) and _ends(v, step, prefix):
            out.append(Match("cu_seqlens", dt, "weak" if ones else "exact", f"the running sum of the sequences' token counts without "
                             f"its leading 0 (query end offsets: kern's cu_seqlens is 0 followed by these), {how}{part}",
                             n, prefix))
        v = full                 # the offsets' head was for the offsets only
        P = None if any(m.dtype == dt for m in out) else _slot_page(v, step, prefix)
        if P is not None:
            k = min(n, step.tokens) if prefix else n      # a known head compares the step's tokens only
            sure = "structure" if k >= 4 and not ones else "weak"
            out.append(Match("slot", dt, sure, f"v % {P} equals each token's position % {P} and runs are consecutive "
                             f"inside {P}-token pages over {k} token(s), {how}{part}", k, prefix, P))
        if not any(m.dtype == dt and m.sure != "weak" for m in out):
            # a known head of one sequence is its row; of several, the row width is unknown
            b = _blocks(v, step, None) if not prefix or len(step.runs) == 1 else None
            if b is not None:
                out.append(Match("blocks", dt, "structure" if b[2] else "weak",
                                 f"reads as [{len(step.runs)}, {b[1]}] with each sequence's ceil(len / {b[0]}) leading "
                                 f"entries distinct" + (", non-zero, and zeros after them" if b[2] else "") + f", {how}",
                                 b[3] if b[2] else n, prefix, b[0]))
    out = [_weak_prefix(m, step) for m in out]
    # surest first; a blocks reading (the loosest test) after any other of the same sureness
    return sorted(out, key=lambda m: (SURE[m.sure], m.fill == "blocks",
                                      m.dtype != "i32"))


def _weak_prefix(m: Match, step: Step | None) -> Match:
    """A prefix match that compared fewer than 3 elements is weak (a one-token step's token id
    is any host buffer's first word that happens to equal it); a block table's elements are the
    pages it showed."""
    if not m.prefix or step is None:
        return m
    want = (step.tokens if m.fill in ("token", "position", "slot") else m.elements if m.fill == "blocks"
            else len(step.runs) + (m.fill == "cu_seqlens"))
    k = min(m.elements, want)
    if k >= 3 or m.sure == "weak":
        return Match(m.fill, m.dtype, m.sure, m.because, k, True, m.page)
    return Match(m.fill, m.dtype, "weak", m.because + f"; only {k} element(s) compared", k, True, m.page)


def _ends(v: np.ndarray, step: Step, prefix: bool) -> bool:
    """v is the running sum of the token counts without the leading 0, in some order of the
    sequences (its first len(v) values when `prefix`)."""
    n = len(step.runs)
    if len(v) < 2 or (not prefix and len(v) != n):
        return False
    k = min(len(v), n)
    counts = sorted(len(r.tokens) for r in step.runs)
    d = np.diff(np.concatenate(([0], v[:k])))
    return bool((d > 0).all()) and sorted(d.tolist()) == counts[:k] if k == n else _sub(d.tolist(), counts)


def _sub(d: list[int], counts: list[int]) -> bool:
    left = list(counts)
    for x in d:
        if x not in left:
            return False
        left.remove(x)
    return True


def _dup(out: list[Match], dt: str, n: int) -> bool:
    """A seq_len or token match of the same array already explains it (a one-sequence cu_seqlens
    [0, n] is also anything's tail)."""
    return any(m.dtype == dt and m.fill in ("token", "position") for m in out)


def check_blocks(v: np.ndarray, step: Step, slots: np.ndarray, page: int) -> bool:
    """With the step's slot mapping known, a [sequences, w] block table must give each token's
    page: row i's entry position // P equals slot // P for the tokens of sequence i (the slot
    array in the step's order)."""
    n = len(step.runs)
    if n == 0 or len(v) % n:
        return False
    rows = v.reshape(n, len(v) // n)
    pos = list(chain.from_iterable(range(r.start, r.end) for r in step.runs))
    owner = list(chain.from_iterable([i] * len(r.tokens) for i, r in enumerate(step.runs)))
    if len(pos) != len(slots):
        return False
    return all(p // page < rows.shape[1] and rows[o, p // page] == s // page for p, o, s in zip(pos, owner, slots))
