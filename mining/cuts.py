"""Forward boundaries between layer stacks (step 3 of the forward detector, `mining/steps.py`).

Why a module of its own: the layer detector answers which launches form a forward's layer
section; this answers where, between two consecutive stacks, one forward ends and the next begins,
from the kernel sequence and host time alone.

Between two consecutive stacks lie the tail of the first forward and the head of the next. The most
frequent such gap sequence (a decode step's) is cut where its host-time gap is largest (median over
its occurrences: the engine's scheduling and sampling sync sit between steps, not inside them); its
part before the cut is the tail pattern, after it the head pattern. The edges of request windows are
the first evidence (`_cycle_cut`): a stretch the pattern explains entirely outweighs one that only
starts like it, and an edge inside a gap aligned with the common one (`_aligned`: a batched step's
gap, kernels of other builds picked by the batch size, with a host stall inside) is no request's
end. Every gap is cut after its longest prefix matching the tail pattern; an aligned gap where its
tail ends. Where a request gap (host gap above the window threshold) lies inside, the launches
between the matched tail and the matched head suffix belong to no forward.

Each boundary records what decided it (`cut_by`: `tail_pattern`, `time_gap`, `request_gap`,
`capture_edge`) and a confidence: 1.0 when the gap matched both patterns entirely, else the
fraction of it the patterns explain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

REQUEST_FLOOR_NS = 2_000_000
ALIGNED = 0.75        # share of positions a step's gap shares with the commonest one (_aligned)


def _prefix_len(g: tuple, pat: tuple) -> int:
    n = 0
    for x, y in zip(g, pat):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Cuts:
    forward: np.ndarray      # per executed-stream position, -1 outside any forward
    boundaries: pd.DataFrame  # forward, start, stack_start, stack_end, end, cut_by, confidence
    tail: tuple = ()          # the learnt tail pattern (codes after a stack)
    head: tuple = ()          # the learnt head pattern (codes before a stack)


def _cycle_cut(codes: np.ndarray, t_ns: np.ndarray, window: np.ndarray, stacks: np.ndarray,
               gaps: list[tuple], common: tuple) -> int:
    """Where the common between-stacks sequence splits into tail and head.

    The edges of request windows show it: after a window's last stack come the tail's launches
    and then the idle gap, so the tail is as long as the prefix of `common` such stretches
    start with (the most common length over the windows; the longest on a tie). Windows' first
    stacks are the fallback evidence (a head ends like common's suffix; prefill heads often
    differ from decode heads, so they come second), then the offset with the largest median
    host gap over common's occurrences (the engine's scheduling and sampling sync sit between
    steps)."""
    m = len(common)
    occ = [i for i, g in enumerate(gaps) if g == common]
    dt = np.array([np.diff(t_ns[stacks[i, 1] - 1:stacks[i + 1, 0] + 1]) for i in occ], float)
    med = np.median(dt, axis=0)
    sw = window[stacks[:, 0]]
    bounds = np.flatnonzero(np.diff(window)) + 1
    w_start = np.concatenate([[0], bounds])
    w_end = np.concatenate([bounds, [len(codes)]])
    pres, sufs = [], []           # (matched length, whether the whole stretch matched)
    for w in np.unique(sw):
        idx = np.flatnonzero(sw == w)
        first, last = stacks[idx[0]], stacks[idx[-1]]
        # a window edge inside a gap aligned with `common` is a host stall inside one step (a
        # kernel compiled on first use, a large batch's sync), not a request's end: no evidence
        if last[1] < w_end[w] and not (idx[-1] < len(gaps) and _aligned(gaps[idx[-1]], common)):
            g = tuple(codes[last[1]:w_end[w]].tolist())
            x = _prefix_len(g, common)
            pres.append((x, x == len(g)))
        if first[0] > w_start[w] and not (idx[0] > 0 and _aligned(gaps[idx[0] - 1], common)):
            g = tuple(codes[w_start[w]:first[0]].tolist())
            x = _prefix_len(g[::-1], common[::-1])
            sufs.append((m - x, x == len(g)))
    for ev in (pres, sufs):
        ev = [e for e in ev if 0 < e[0] < m]
        # a stretch the pattern explains entirely (the tail, then idle) outweighs one that only
        # starts like it (a start-up pass whose tail runs other kernels after the first few)
        ev = [x for x, full in ev if full] or [x for x, _ in ev]
        if ev:
            vc = pd.Series(ev).value_counts()
            return int(max(vc.index[vc == vc.max()]))
    return int(np.argmax(med))


def _aligned(g: tuple, pat: tuple) -> bool:
    """`g` is one step's tail and head with some kernels of other builds: as long as `pat` and equal
    to it at ALIGNED of its positions (a batched engine picks its GEMM, gather and sort kernels by
    the batch size, so one step's gap can differ from the commonest step's at its first launch,
    where a prefix match stops at once)."""
    return len(g) == len(pat) > 0 and sum(x == y for x, y in zip(g, pat)) >= ALIGNED * len(pat)


def cut_forwards(codes: np.ndarray, t_ns: np.ndarray, stacks: np.ndarray, learn_from: int = 0) -> Cuts:
    """One forward per stack; the launches between stacks split into tail and head (step 3). The
    steady cycle is learnt from the gaps after stack `learn_from` when there are any (the stacks
    after an engine's graph-capture phase: its warm-ups at every capture size repeat a gap of their
    own more often than the requests repeat theirs)."""
    n, k = len(codes), len(stacks)
    forward = np.full(n, -1, np.int32)
    cols = ["forward", "start", "stack_start", "stack_end", "end", "cut_by", "confidence"]
    if k == 0:
        return Cuts(forward, pd.DataFrame(columns=cols))
    gaps = [tuple(codes[stacks[i, 1]:stacks[i + 1, 0]].tolist()) for i in range(k - 1)]
    tail_pat: tuple = ()
    head_pat: tuple = ()
    common: tuple = ()
    if gaps:
        learnt = gaps[learn_from:] if 0 < learn_from < len(gaps) else gaps
        common = pd.Series(learnt).value_counts().index[0]
        # a host gap well above the longest gap of the steady cycle between two steps is a
        # request boundary; windows at that threshold show where the cycle is cut
        occ = [i for i, g in enumerate(gaps) if g == common]
        step_max = np.median([np.diff(t_ns[stacks[i, 1] - 1:stacks[i + 1, 0] + 1]).max() for i in occ])
        request_ns = max(REQUEST_FLOOR_NS, 4 * step_max)
        window = np.concatenate([[0], np.cumsum(np.diff(t_ns) > request_ns)]).astype(np.int32)
        cut = _cycle_cut(codes, t_ns, window, stacks, gaps, common)
        tail_pat, head_pat = common[:cut], common[cut:]
    starts, ends = np.zeros(k, np.int64), np.zeros(k, np.int64)
    cut_by, conf = ["capture_edge"] * k, np.ones(k)
    lead = tuple(codes[:stacks[0, 0]].tolist())
    starts[0] = stacks[0, 0] - _prefix_len(lead[::-1], head_pat[::-1])
    for i, g in enumerate(gaps):
        a, b = int(stacks[i, 1]), int(stacks[i + 1, 0])
        tl = _prefix_len(g, tail_pat)
        hd = min(_prefix_len(g[::-1], head_pat[::-1]), len(g) - tl)
        if tl + hd == len(g):
            ends[i], starts[i + 1] = a + tl, a + tl
            cut_by[i + 1], conf[i + 1] = "tail_pattern", 1.0
        elif _aligned(g, common):
            # the steady cycle with other builds of some kernels: cut where its tail ends, whatever
            # host stall lies inside (a Triton kernel compiled on its first call, a large batch's sync)
            c = len(tail_pat)
            ends[i], starts[i + 1] = a + c, a + c
            cut_by[i + 1] = "tail_pattern"
            conf[i + 1] = round(sum(x == y for x, y in zip(g, common)) / len(g), 3)
        elif window[a + tl - 1] != window[b - hd]:
            # a request gap among launches neither pattern explains. A short stretch is the
            # steps' own work around the idle gap (the finished request's bookkeeping before
            # it, the next request's input staging after it): split at the gap. A long one
            # (start-up work, thousands of launches between a warm-up and the first request)
            # belongs to no forward
            lo, hi = a + tl, b - hd
            dt = np.diff(t_ns[lo - 1:hi + 1])          # dt[j]: the gap before position lo + j
            big = np.flatnonzero(dt > request_ns)
            if len(big) == 0:
                big = np.array([int(np.argmax(dt))])
            first, last = lo + int(big[0]), lo + int(big[-1])
            short = max(len(common), 1)
            ends[i] = first if first - lo <= short else lo
            starts[i + 1] = last if hi - last <= short else hi
            cut_by[i + 1], conf[i + 1] = "request_gap", round((tl + hd) / len(g), 3)
        else:
            # a jittered launch (one of the next forward's launched before this one's last):
            # cut where the tail pattern would end; the jitter repair moves the strays back
            c = max(tl, min(len(tail_pat), len(g) - hd))
            ends[i], starts[i + 1] = a + c, a + c
            cut_by[i + 1], conf[i + 1] = "unmatched", round((tl + hd) / len(g), 3)
    trail = tuple(codes[stacks[-1, 1]:].tolist())
    ends[-1] = stacks[-1, 1] + _prefix_len(trail, tail_pat)
    rows = []
    for i in range(k):
        forward[starts[i]:ends[i]] = i
        rows.append((i, int(starts[i]), int(stacks[i, 0]), int(stacks[i, 1]), int(ends[i]), cut_by[i],
                     float(conf[i])))
    return Cuts(forward, pd.DataFrame(rows, columns=cols), tail_pat, head_pat)
