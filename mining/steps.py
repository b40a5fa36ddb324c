"""Forwards as the repeating step of the program, found from the kernel sequence it executed.

Why: the first forward detector assumed the most frequent kernel runs in one burst per forward; on
a 4-layer or a 36-layer model it took layers for forwards, and it saw nothing of CUDA-graph
replays. What every decoder-style program shares is nesting: a forward runs a *stack* of layers
(a block of kernels repeated back to back, possibly several kinds of block one after another),
with a head before it and a tail after it. So, over the executed stream (`mining/graphs.py`:
eager launches plus graph replays expanded), with kernels identified by (symbol, module sha256):

1. layer periods: for every period p (3 ≤ p ≤ MAX_PERIOD) the maximal runs where the kernel at i
   equals the kernel at i + p for at least p positions (two or more whole blocks of p kernels,
   at least three distinct ones). A layer period is one whose runs recur: the period with the
   most runs (ties to the shorter) is the main block; other periods whose runs are as numerous
   (at least half) and do not overlap the main runs are further block kinds (a dense block
   before MoE blocks, say). Forward-sized repeats (consecutive identical decode steps) recur
   once per request and contain the main runs, so they never qualify. It is a layer structure
   when some stretch between request gaps holds two or more runs, or when three or more runs
   mostly hold the same number of blocks (a layer count is constant; the decode stretches of a
   one-layer model vary with the requests), or when there is a single run (one forward); a
   period whose blocks each wait on the host at one place is a whole step, never a layer
   (`_holds_step`: a one-layer model's decode steps; `step_anchors` then anchors its forwards);
   else no repeating step was found, and the analysis says so;
2. stacks: runs of any block kind that touch (gap ≤ half the shortest period) merge into one
   stack; every stack is one forward's layer section;
3. cuts: between two consecutive stacks lie the tail of the first forward and the head of the
   next (`mining/cuts.py`);
4. jitter repair as before (`passes._repair`): a kernel one short in forward f and one over in
   f+1 within EDGE launches of their boundary moves back.

Not handled: forwards whose layer sections interleave (two streams running two forwards at once),
models with a single layer (no block repeats inside a forward: reported as "no layer structure",
and `passes.split_passes` is used instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mining.cuts import Cuts

MAX_PERIOD = 160      # longest layer block considered, in kernels
MIN_DISTINCT = 3      # distinct kernels a layer block needs (rules out fill/copy bursts)


@dataclass
class Blocks:
    """Layer block kinds found in the stream: period, run count, and every run (start, end) in
    executed-stream positions, end exclusive, whole blocks only."""
    kinds: list[dict]                 # period, runs, reps (modal), example (codes of one block)
    stacks: np.ndarray                # [n, 2] start, end of each merged layer stack
    runs: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))  # start, end, stretch end, period
    steps: dict = field(default_factory=dict)   # period -> runs, of blocks that are whole steps
    notes: list[str] = field(default_factory=list)


def _runs(codes: np.ndarray, p: int) -> np.ndarray:
    """[n, 3] (start, end of the whole blocks, end of the periodic stretch) of maximal periodic
    stretches at period p holding >= 2 whole blocks."""
    if len(codes) <= p:
        return np.zeros((0, 2), np.int64)
    eq = codes[:-p] == codes[p:]
    d = np.diff(np.concatenate([[0], eq.view(np.int8), [0]]))
    s, e = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = (e - s) >= p
    s, e = s[keep], e[keep]
    reps = (e - s + p) // p
    return np.stack([s, s + reps * p, e + p], axis=1).astype(np.int64)


def _distinct_ok(codes: np.ndarray, runs: np.ndarray, p: int) -> np.ndarray:
    return np.array([len(np.unique(codes[a:a + p])) >= MIN_DISTINCT for a in runs[:, 0]], bool)


def _coverage(r: np.ndarray) -> int:
    return int((r[:, 1] - r[:, 0]).sum())


def _mask(n: int, runs: np.ndarray) -> np.ndarray:
    d = np.zeros(n + 1, np.int32)
    np.add.at(d, runs[:, 0], 1)
    np.add.at(d, runs[:, 1], -1)
    return np.cumsum(d[:-1]) > 0


def _inside(runs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per run, the fraction of its positions already in `mask`."""
    c = np.concatenate([[0], np.cumsum(mask)])
    return (c[runs[:, 1]] - c[runs[:, 0]]) / np.maximum(runs[:, 1] - runs[:, 0], 1)


def _primitive(cands: dict, cov: dict, n: int, pool: list[int]) -> int:
    """The period covering the most launches, descended into while a shorter period nested in
    its runs covers at least a quarter as much (whole forwards repeat at the forward's period in
    a decode stretch; the layers inside them repeat at a shorter one)."""
    best = max(pool, key=lambda p: (cov[p], -p))
    while True:
        m = _mask(n, cands[best])
        inner = [q for q in pool if q < best and cov[q] >= 0.25 * cov[best]
                 and ((_inside(cands[q], m) > 0.5).mean() >= 0.5 or _holding(cands[best], cands[q]) >= 0.5)]
        if not inner:
            return best
        best = max(inner, key=lambda q: (cov[q], -q))


def _holding(outer: np.ndarray, inner: np.ndarray) -> float:
    """The share of `outer`'s runs that hold a whole run of `inner`. Why beside `_inside`: the
    layers repeat elsewhere too (a prefill's, a warm-up's), so most of the inner runs can lie
    outside the outer ones while every outer block (a forward) is still built of them."""
    if not len(outer) or not len(inner):
        return 0.0
    s, e = inner[:, 0], inner[:, 1]
    return float(np.mean([bool(((s >= a) & (e <= b)).any()) for a, b in outer[:, :2]]))


STEP_GAP_NS = 200_000     # a host gap in a block at least this long and
STEP_RATIO = 8            # this many times the block's median gap, at one place in most blocks: a step
MIN_STACK_SHARE = 0.25    # share of the launches a layer stack covers between the first and last
SHARED = 0.3     # share of a block's kernel names another shape of the same layers has in common
SEAM = 2         # launches two kinds of layer may have between them and still be one stack
SIMILAR = 0.6    # share of positions a block at a stack's edge must match to count as a layer


def _repeats(codes: np.ndarray, a: int, p: int, k: int) -> bool:
    """Is the p-kernel block at `a` one k-kernel block repeated p // k times?"""
    return bool((codes[a:a + p] == np.tile(codes[a:a + k], p // k)).all())


def _extend(codes: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """Whole blocks added at a run's edges where the block there matches the run's neighbouring
    block in at least SIMILAR of its positions: the first layer of a compiled model is fused
    with the embedding, the last with the final norm, yet they are layers."""
    out = runs.copy()
    n = len(codes)
    for k, (a, b, e, p) in enumerate(runs):
        # one block at each edge at most: the irregular layers are the first and the last
        if a - p >= 0 and (codes[a - p:a] == codes[a:a + p]).mean() >= SIMILAR:
            a -= p
        if b + p <= n and (codes[b:b + p] == codes[b - p:b]).mean() >= SIMILAR:
            b += p
            e = max(e, b)
        out[k] = (a, b, e, p)
    return out


def _seams(runs: np.ndarray) -> np.ndarray:
    """Runs of two kinds meeting at a seam overlap when the first kind's last kernel equals the
    second kind's last kernel (the second's periodic stretch then starts one kernel early, out of
    phase with its layers). Start such a run where the previous one's blocks end, keeping the
    whole blocks its stretch still holds."""
    out = runs.copy()
    end = -1
    for k, (a, b, e, p) in enumerate(out):
        if end > a and end - a < p:
            a = end
            b = a + ((max(e, b) - a) // p) * p
            out[k] = (a, b, e, p)
        end = max(end, int(out[k, 1]))
    return out[out[:, 1] - out[:, 0] >= out[:, 3]]


def _holds_step(t_ns: np.ndarray | None, runs: np.ndarray, p: int) -> bool:
    """Do the blocks of period p hold a host step boundary: in most blocks one host gap well
    above the block's others (STEP_RATIO times its median, at least STEP_GAP_NS), at the same
    offset within each run. Layers run back to back inside a step; a block that waits on the
    host at a fixed place is a whole step (a one-layer model's decode steps, repeating)."""
    if t_ns is None:
        return False
    hits, blocks = 0, 0
    for a, b in runs[:, :2]:
        offs = []
        for lo in range(int(a), int(b) - p + 1, p):
            blocks += 1
            dt = np.diff(t_ns[lo:lo + p + 1])      # p gaps: the one after the block's last too
            top = dt.max() if len(dt) else 0
            if top > STEP_GAP_NS and top > STEP_RATIO * max(np.median(dt), 1.0):
                offs.append(int(np.argmax(dt)))
        if offs:
            hits += int(pd.Series(offs).value_counts().iloc[0])
    return bool(blocks and hits >= 0.75 * blocks)


def _front_layers(codes: np.ndarray, names: np.ndarray, stacks: np.ndarray, kinds: dict,
                  known: set) -> list:
    """A single layer of another kind before the stacks (one dense layer before MoE layers): the
    launches right before a stack that are all kernels the layer kinds use (by name), back to the
    first one that is not (the head: embedding, input staging), when they are MIN_DISTINCT kernels
    or more and the same sequence stands before at least half the stacks. Returns (start, end) per stack (None where none), or [] when no such
    layer exists."""
    out, seqs = [], []
    longest = max(kinds)
    for a, _ in stacks:
        j = int(a)
        while j > 0 and int(a) - j < longest and names[codes[j - 1]] in known:
            j -= 1
        seg = tuple(names[codes[j:a]].tolist())
        ok = len(set(seg)) >= MIN_DISTINCT and int(a) - j < longest
        out.append((j, int(a)) if ok else None)
        seqs.append(seg if ok else None)
    common = pd.Series([x for x in seqs if x is not None], dtype=object).value_counts()
    if common.empty or common.iloc[0] < 0.5 * len(stacks):
        return []
    want = common.index[0]
    return [x if x is not None and seqs[k] == want else None for k, x in enumerate(out)]


def _align_front(codes: np.ndarray, names: np.ndarray, front: list, runs: np.ndarray) -> tuple[list, np.ndarray]:
    """Every layer of a stack starts with the same kernel where a phase allows it (the input
    norm, dense layer or not). A run right after a front layer may start a kernel early, when its
    blocks' last kernel equals the front layer's last (`_seams`' case, at the front): shift it
    right, within its periodic stretch, until its blocks start with the front layer's first
    kernel, and let the front layer end there."""
    runs = runs.copy()
    out = list(front)
    for k, x in enumerate(front):
        if x is None:
            continue
        j, a = x
        hit = np.flatnonzero(runs[:, 0] == a)
        if len(hit) == 0:
            continue
        r = int(hit[0])
        s0, e, stretch, p = (int(v) for v in runs[r])
        reps = (e - s0) // p
        first = names[codes[j]]
        for d in range(0, max(stretch, e) - e + 1):
            if names[codes[s0 + d]] == first:
                if d:
                    runs[r] = (s0 + d, s0 + d + reps * p, stretch, p)
                    out[k] = (j, s0 + d)
                break
    return out, runs


def find_blocks(codes: np.ndarray, window: np.ndarray, names: np.ndarray | None = None,
                t_ns: np.ndarray | None = None) -> Blocks:
    """Layer block kinds and stacks of the executed stream `codes` (kernel identity codes;
    `names[code]` the kernel's name, which other builds of it share).

    Kinds are taken one at a time: the primitive period covering the most launches not yet
    taken (`_primitive`); the first is the main block. A further kind must either touch taken
    runs (another kind of layer in the same stack: dense layers before MoE layers) or have runs
    about as long as the main's (the same layers in forwards of another shape, e.g. prefill
    attention in place of decode attention's two kernels); short repeats elsewhere (a sampler's
    a-b-c-a-b-c) are neither."""
    n = len(codes)
    cands = {}
    for p in range(3, min(MAX_PERIOD, max(n // 2, 3)) + 1):
        r = _runs(codes, p)
        if len(r):
            r = r[_distinct_ok(codes, r, p)]
        if len(r):
            cands[p] = r
    if not cands:
        return Blocks([], np.zeros((0, 2), np.int64), notes=["no block of kernels repeats back to back"])
    cov = {p: _coverage(r) for p, r in cands.items()}
    stepped: list[int] = []
    step_runs: dict = {}
    while True:
        main = _primitive(cands, cov, n, list(cands))
        if not _holds_step(t_ns, cands[main], main):
            break
        stepped.append(main)
        step_runs[main] = cands[main]
        for q in [q for q in cands if q % main == 0]:   # several steps repeat as well
            del cands[q]
            cov.pop(q, None)
        if not cands:
            return Blocks([], np.zeros((0, 2), np.int64), steps=step_runs,
                          notes=[f"no layer structure: the blocks that repeat ({', '.join(map(str, stepped))} "
                                 f"kernels) each wait on the host at one place: whole steps repeating, "
                                 f"not layers"])
    per_win = pd.Series(window[cands[main][:, 0]]).value_counts()
    reps = (cands[main][:, 1] - cands[main][:, 0]) // main
    steady = len(reps) >= 3 and (reps == pd.Series(reps).mode().iloc[0]).mean() >= 0.75
    if per_win.max() < 2 and not steady and len(reps) > 1:
        return Blocks([], np.zeros((0, 2), np.int64),
                      notes=[f"no layer structure: the repeated block that covers the most launches "
                       f"({main} kernels) occurs at most once between request gaps, with a varying "
                       f"number of repeats"])
    chosen = {main: cands[main]}
    taken = _mask(n, cands[main])
    mean_main = cov[main] / len(cands[main])
    names = np.arange(codes.max() + 1) if names is None else np.asarray(names)
    main_names = set(names[codes[cands[main][0, 0]:cands[main][0, 0] + main]].tolist())
    while True:
        slack = max(min(chosen) // 2, 2)
        grown = np.concatenate([[0], np.cumsum(taken)])
        left = {}
        for p, r in cands.items():
            if p in chosen:
                continue
            # a run whose block is a chosen block repeated is that kind again (two layers read as
            # one block); a block of a multiple length that is no such repeat is a layer of its own
            # (a 12-kernel layer beside a 6-kernel block of other launches)
            r = r[[not any(p % k == 0 and _repeats(codes, int(a), p, k) for k in chosen) for a in r[:, 0]]]
            if len(r) == 0:
                continue
            # a run holding taken launches beyond its edges is a super-structure (whole forwards
            # repeating around their layers), not another kind of layer
            c = np.concatenate([[0], np.cumsum(taken)])
            r = r[(c[r[:, 1]] - c[r[:, 0]]) <= slack]
            if len(r) == 0:
                continue
            lo = np.clip(r[:, 0] - slack, 0, n)
            hi = np.clip(r[:, 1] + slack, 0, n)
            touch = (grown[hi] - grown[lo]) > 0
            # the same layers in forwards of another shape share kernels (by name) with the
            # kinds found so far (norms, cache writes, fused elementwise; GEMM kernels differ
            # with the shape); a sampler's repeated block shares none
            shared = len(set(names[codes[r[0, 0]:r[0, 0] + p]].tolist()) & main_names) \
                / len(set(names[codes[r[0, 0]:r[0, 0] + p]].tolist()))
            similar = ((r[:, 1] - r[:, 0]) >= 0.5 * mean_main) & (shared >= SHARED)
            # a stack as long as the main ones counts even alone (the one forward of its shape);
            # short runs touching a stack only when they recur
            r = r[similar | (touch & (touch.sum() >= 0.1 * len(cands[main])))]
            if len(r):
                left[p] = r
        if not left:
            break
        lcov = {p: _coverage(r) for p, r in left.items()}
        p = _primitive(left, lcov, n, list(left))
        chosen[p] = left[p]
        taken |= _mask(n, left[p])
        main_names |= set(names[codes[left[p][0, 0]:left[p][0, 0] + p]].tolist())
    runs = np.concatenate([np.column_stack([r, np.full(len(r), p)]) for p, r in chosen.items()])
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    runs = _seams(_extend(codes, runs))
    # runs merge into one stack where they overlap or touch (two kinds meeting at a seam, which
    # their periodic stretches can share a kernel or two of); two runs of one kind with launches
    # between them are two forwards, however few those launches are
    stacks: list[list[int]] = []
    last_kind = -1
    for a, b, _, p in runs:
        if stacks and (a <= stacks[-1][1] or (a <= stacks[-1][1] + SEAM and p != last_kind)):
            stacks[-1][1] = max(stacks[-1][1], int(b))
        else:
            stacks.append([int(a), int(b)])
        last_kind = p
    stacks_a = np.array(stacks, np.int64).reshape(-1, 2)
    # a layer stack is most of a step: short repeats (a sampler's) that recur once per step
    # but cover little of it are no layers
    span = int(stacks_a[-1, 1] - stacks_a[0, 0]) if len(stacks_a) else 0
    if len(stacks_a) and (stacks_a[:, 1] - stacks_a[:, 0]).sum() < MIN_STACK_SHARE * span:
        return Blocks([], np.zeros((0, 2), np.int64), steps=step_runs,
                      notes=[f"no layer structure: the repeated blocks ({', '.join(map(str, chosen))} kernels) "
                             f"cover under {MIN_STACK_SHARE:.0%} of the launches between the first and the last"])
    front = _front_layers(codes, names, stacks_a, chosen, main_names)
    if front:
        front, runs = _align_front(codes, names, front, runs)
        extra = [(j, a, a, a - j) for x in front if x is not None for j, a in [x]]
        for j, a, _, q in extra:
            chosen.setdefault(q, np.zeros((0, 3), np.int64))
            chosen[q] = np.concatenate([chosen[q], [[j, a, a]]])
        runs = np.concatenate([runs, np.array(extra, np.int64).reshape(-1, 4)])
        runs = runs[np.argsort(runs[:, 0], kind="stable")]
        for k, x in enumerate(front):
            if x is not None:
                stacks_a[k, 0] = x[0]
                # a run shifted by _align_front may now end past the stack's old end
                inside = runs[(runs[:, 0] >= stacks_a[k, 0]) & (runs[:, 0] < stacks_a[k, 1])]
                stacks_a[k, 1] = max(int(stacks_a[k, 1]), int(inside[:, 1].max()))
        stacks = stacks_a.tolist()
    info = []
    for p, r in chosen.items():
        reps = pd.Series((r[:, 1] - r[:, 0]) // p).mode()
        info.append({"period": int(p), "runs": int(len(r)), "reps": int(reps.iloc[0]),
                     "example": codes[r[0, 0]:r[0, 0] + p].tolist()})
    return Blocks(info, np.array(stacks, np.int64).reshape(-1, 2), np.asarray(runs, np.int64).reshape(-1, 4))


def layer_map(n: int, blocks: Blocks, cuts: Cuts) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """Per executed position, its layer (-1 outside the stack) and position in the layer block;
    per forward, the sequence of block kinds (the period of each layer, in order).

    A run of period p contributes as many layers of p kernels as fit in its periodic stretch from
    where the previous run's layers end (two kinds' runs can overlap by a kernel or two at their
    seam: the second kind's stretch then starts early); launches inside a stack but between runs
    join the layer before them."""
    layer = np.full(n, -1, np.int32)
    pos = np.full(n, -1, np.int32)
    pattern: list[list[int]] = []
    runs = blocks.runs
    for f, (a, b) in enumerate(zip(cuts.boundaries["stack_start"], cuts.boundaries["stack_end"])):
        inside = runs[(runs[:, 0] >= a) & (runs[:, 1] <= b)]
        kinds: list[int] = []
        cursor = int(a)
        for s, e, stretch, p in inside:
            s, p = max(int(s), cursor), int(p)
            if s > cursor and kinds:
                layer[cursor:s] = len(kinds) - 1
                pos[cursor:s] = np.arange(cursor, s) - cursor + kinds[-1]
            reps = (max(int(stretch), int(e)) - s) // p
            reps = min(reps, (int(b) - s) // p) if reps * p + s > b else reps
            for j in range(reps):
                lo = s + j * p
                layer[lo:lo + p] = len(kinds)
                pos[lo:lo + p] = np.arange(p)
                kinds.append(p)
            cursor = max(cursor, s + reps * p)
        pattern.append(kinds)
    return layer, pos, pattern


def kind_names(kinds: list[dict]) -> dict[int, str]:
    """Block kinds named A, B, ... in order of the main block first."""
    return {k["period"]: chr(ord("A") + i) for i, k in enumerate(kinds)}


def step_anchors(codes: np.ndarray, names: np.ndarray, blocks: Blocks) -> list[tuple[np.ndarray, str]]:
    """One-layer models: candidate stacks of one launch each, at a kernel that runs once per step.

    When the only repeats are whole steps (`Blocks.steps`), the step's own kernels show which run
    once per step; each such kernel (by name) gives one candidate: its launches as one-launch
    stacks (`forwards._best_anchor` keeps one). Empty without one."""
    if not blocks.steps:
        return []
    p = min(blocks.steps)
    a = int(blocks.steps[p][0, 0])
    block = names[codes[a:a + p]]
    uniq, cnt = np.unique(block, return_counts=True)
    stream = names[codes]
    out = []
    for k in sorted(uniq[cnt == 1].tolist()):
        pos = np.flatnonzero(stream == k)
        out.append((np.column_stack([pos, pos + 1]).astype(np.int64), str(k)))
    return out
