"""Split a launch stream into request windows and forward passes.

Why: a serving engine's capture is mostly not the requests -- a profiling pass at the full token
budget and warm-up passes come first -- and each forward is one sample point of how launches depend
on the token count. Host time separates requests (gaps of many ms) but not forwards (the gap
between a prefill and its decode steps is ~1 ms, and a sampling kernel can land one launch across a
boundary), so:

1. windows: cut where `t_ns` jumps by more than a threshold chosen from the gap distribution (the
   largest ratio between consecutive sorted gaps, looking only at jumps that end above 2 ms);
   overridable with `gap_ms`;
2. forwards: the most frequent kernel (the *core*) runs a fixed number K of times per forward. K is
   chosen among the divisors of the gcd of the per-window core counts as the smallest one whose
   forwards keep (nearly) as many per-forward-invariant kernel counts as any other K. A forward
   starts at the last launch of the *opener* (the kernel that most windows start with) between two
   groups of K core launches, or at the core launch itself when there is none;
3. jitter repair: a kernel whose count is one short in forward f and one over in f+1 (or the
   reverse), with the stray launch within the first/last 3 launches of its forward, is moved back;
4. requests: a time window can hold several requests when the engine pauses *inside* forwards
   (Triton compiling a kernel at its first use stalls a forward for ~1 s, longer than the ~50 ms
   between two requests), so only gaps outside forwards' model sections (first to last core launch)
   separate requests: such a gap in the idle range (see `_idle_threshold`) starts a new request
   window. `window` is that request window; a forward's launches all take the window its model
   section starts in.

Windows holding no core launch are noise (`forward == -1`). Not handled: interleaved concurrent
requests (bs > 1 windows still split, but by the same rule), graph replays.

This is the fallback split: `mining/forwards.py` runs the step detector (`mining/steps.py`: layer
stacks over the executed stream, graph replays included) and comes here only for captures
without a layer structure, or when `per_forward` is forced (`mine analyze --per-forward`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

import numpy as np
import pandas as pd

from vocab.errors import UsageError

GAP_FLOOR_NS = 2_000_000
EDGE = 3  # how far from a boundary a jittered launch may sit


@dataclass
class Passes:
    window: np.ndarray          # per launch (dump.launches order), -1 never
    forward: np.ndarray         # per launch, -1 outside any forward
    gap_ns: int
    core: str
    per_forward: int            # core launches per forward (K)
    forwards: pd.DataFrame      # forward, window, n_launches, first_seq, last_seq, start_ns, end_ns
    notes: list[str] = field(default_factory=list)
    # set by mining/forwards.py (the step detector); None for this module's core-kernel split
    executed: pd.DataFrame | None = None   # the executed stream (graphs.py) + window, forward, layer, pos
    method: str = "core_kernel"
    blocks: list[dict] = field(default_factory=list)
    captures: pd.DataFrame | None = None
    kernel_names: pd.Index | None = None   # executed["kernel"] code -> identity name (forwards.py)
    startup_until_ns: int | None = None    # end of the graph-capture phase (forwards.capture_phase_end)


def gap_threshold(t_ns: np.ndarray, floor_ns: int = GAP_FLOOR_NS) -> int:
    """A gap threshold (ns) separating requests, from the distribution of host-time gaps."""
    gaps = np.diff(np.asarray(t_ns, np.int64))
    gaps = np.unique(gaps[gaps > 0])
    if len(gaps) == 0 or gaps[-1] < floor_ns:
        return int(max(floor_ns, gaps[-1] + 1 if len(gaps) else floor_ns))
    lo, hi = gaps[:-1].astype(float), gaps[1:].astype(float)
    ratio = np.where(hi >= floor_ns, hi / np.maximum(lo, 1.0), 0.0)
    k = int(np.argmax(ratio))
    return int(max(math.sqrt(lo[k] * hi[k]), lo[k] + 1))


def split_windows(t_ns: np.ndarray, gap_ns: int) -> np.ndarray:
    cut = np.diff(np.asarray(t_ns, np.int64)) > gap_ns
    return np.concatenate([[0], np.cumsum(cut)]).astype(np.int32)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _assign(codes: np.ndarray, window: np.ndarray, core_code: int, k: int,
            opener: int) -> np.ndarray:
    forward = np.full(len(codes), -1, np.int32)
    fid = 0
    for w in np.unique(window):
        idx = np.flatnonzero(window == w)
        pos = idx[codes[idx] == core_code]
        if len(pos) == 0:
            continue
        starts = []
        for j in range(0, len(pos), k):
            lo = pos[j - 1] + 1 if j else idx[0]
            region = np.arange(lo, pos[j])
            hits = region[codes[region] == opener]
            starts.append(hits[-1] if len(hits) else pos[j])
        ends = starts[1:] + [idx[-1] + 1]
        for s, e in zip(starts, ends):
            forward[s:e] = fid
            fid += 1
    return forward


def _repair(codes: np.ndarray, forward: np.ndarray, window: np.ndarray) -> int:
    """Move launches that jittered one forward across a boundary back; returns how many moved."""
    inside = forward >= 0
    if not inside.any():
        return 0
    nf = int(forward.max()) + 1
    counts = pd.crosstab(forward[inside], codes[inside]).reindex(range(nf), fill_value=0)
    fwin = pd.Series(window[inside]).groupby(forward[inside]).first().reindex(range(nf)).to_numpy()
    moved = 0
    for code in counts.columns:
        c = counts[code].to_numpy().copy()
        present = c[c > 0]
        modal = int(pd.Series(present).mode().iloc[0])
        for f in range(nf - 1):
            if fwin[f] != fwin[f + 1]:
                continue
            if c[f] == modal - 1 and c[f + 1] == modal + 1:
                members = np.flatnonzero(forward == f + 1)
                first = members[codes[members] == code][0]
                if first - members[0] < EDGE:
                    forward[first] = f
                    c[f] += 1
                    c[f + 1] -= 1
                    moved += 1
            elif c[f] == modal + 1 and c[f + 1] == modal - 1:
                members = np.flatnonzero(forward == f)
                last = members[codes[members] == code][-1]
                if members[-1] - last < EDGE:
                    forward[last] = f + 1
                    c[f] -= 1
                    c[f + 1] += 1
                    moved += 1
    return moved


def _invariant_kernels(codes: np.ndarray, forward: np.ndarray) -> int:
    inside = forward >= 0
    if not inside.any():
        return 0
    ct = pd.crosstab(forward[inside], codes[inside])
    return int(((ct.nunique() == 1) & (ct.iloc[0] > 0)).sum())


def split_passes(launches: pd.DataFrame, gap_ms: float | None = None,
                 per_forward: int | None = None) -> Passes:
    """Windows and forwards of `launches` (a `load_dump` launches frame, sorted by seq)."""
    t_ns = launches["t_ns"].to_numpy()
    notes: list[str] = []
    gap_ns = int(gap_ms * 1e6) if gap_ms is not None else gap_threshold(t_ns)
    if gap_ms is not None and gap_ms <= 0:
        raise UsageError(f"gap_ms must be positive, got {gap_ms}", value=gap_ms, limit=0)
    window = split_windows(t_ns, gap_ns)
    sym = launches["symbol"]
    codes = sym.cat.codes.to_numpy().astype(np.int64)
    core_code = int(np.bincount(codes).argmax())
    core = str(sym.cat.categories[core_code])
    per_win = pd.Series(codes == core_code).groupby(window).sum()
    counts = [int(c) for c in per_win if c > 0]
    g = reduce(math.gcd, counts, 0)
    starts = np.flatnonzero(np.diff(window, prepend=-1))
    opener = int(pd.Series(codes[starts][per_win.reindex(window[starts]).to_numpy() > 0]).mode()[0])
    if per_forward is not None:
        if per_forward < 1 or any(c % per_forward for c in counts):
            raise UsageError(f"per_forward={per_forward} does not divide the core kernel's "
                             f"per-window counts {counts}", value=per_forward, limit=counts)
        choices = [per_forward]
    else:
        choices = _divisors(g) if g else [1]
    scored = []
    for k in choices:
        fwd = _assign(codes, window, core_code, k, opener)
        moved = _repair(codes, fwd, window)
        scored.append((k, _invariant_kernels(codes, fwd), fwd, moved))
    best = max(s for _, s, _, _ in scored)
    k, _, forward, moved = next(x for x in scored if x[1] >= 0.8 * best)
    if moved:
        notes.append(f"{moved} launch(es) moved across a forward boundary (jitter)")
    if len(counts) and len(set(counts)) == 1 and len(counts) > 1 and per_forward is None and k == g:
        notes.append("every window has the same core count; a window might hold several forwards")
    if gap_ms is None:
        window, gap_ns = _request_windows(window, forward, t_ns, codes == core_code, gap_ns)
    frame = _forward_frame(launches, window, forward)
    return Passes(window, forward, gap_ns, core, k, frame, notes)


JUMP = 1.6  # how much longer than the one before a gap must be to start the idle range


def _idle_threshold(free: np.ndarray, floor_ns: int = GAP_FLOOR_NS) -> int:
    """Gaps outside model sections come in a busy range (sampling, the step from a prefill to its
    first decode: up to ~6 ms on vLLM 0.26) and an idle range (between requests, start-up work).
    Walking the distinct gaps above the floor upwards, the idle range starts at the first one at
    least JUMP times its predecessor; the threshold is their geometric mean (the floor if none)."""
    g = np.unique(free[free > floor_ns]).astype(float)
    jumps = np.flatnonzero(g[1:] >= JUMP * g[:-1])
    if len(jumps) == 0:
        return int(floor_ns)
    i = int(jumps[0])
    return int(math.sqrt(g[i] * g[i + 1]))


def _request_windows(window: np.ndarray, forward: np.ndarray, t_ns: np.ndarray, core: np.ndarray,
                     gap_ns: int) -> tuple[np.ndarray, int]:
    """Per launch, its request window: time windows refined by the gaps outside forwards' model
    sections (step 4). A forward's model section runs from its first to its last core launch;
    stalls there are compilation, not idleness between requests."""
    gaps = np.diff(np.asarray(t_ns, np.int64))
    if len(gaps) == 0 or not (forward >= 0).any():
        return window, gap_ns
    idx = np.flatnonzero(core & (forward >= 0))
    spans = pd.Series(idx).groupby(forward[idx]).agg(["min", "max"])
    inside = np.zeros(len(gaps), bool)
    for lo, hi in spans.itertuples(index=False):
        inside[lo:hi] = True
    thr = _idle_threshold(gaps[~inside])
    cut = (~inside & (gaps > thr)) | (np.diff(window) != 0)
    request = np.concatenate([[0], np.cumsum(cut)]).astype(np.int32)
    # a forward belongs to the request its model section runs in: the staging launches before it
    # can sit on the far side of a first-use compilation stall
    member = forward >= 0
    request[member] = request[spans["min"].reindex(forward[member]).to_numpy()]
    return request, min(thr, gap_ns)


def _forward_frame(launches: pd.DataFrame, window: np.ndarray, forward: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame({"forward": forward, "window": window, "seq": launches["seq"].to_numpy(),
                       "t_ns": launches["t_ns"].to_numpy(),
                       "symbol": launches["symbol"].cat.codes.to_numpy()})
    df = df[df["forward"] >= 0]
    g = df.groupby("forward")
    out = pd.DataFrame({
        "window": g["window"].first(), "n_launches": g.size(),
        "n_kernels": g["symbol"].nunique(), "first_seq": g["seq"].min(),
        "last_seq": g["seq"].max(), "start_ns": g["t_ns"].min(), "end_ns": g["t_ns"].max(),
    }).reset_index()
    return out.astype({"forward": "int32", "window": "int32", "n_launches": "int32",
                       "n_kernels": "int32"})
