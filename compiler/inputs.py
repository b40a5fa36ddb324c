"""What the host gave each forward: its host-to-device copies, who reads them, and what they hold.

Why: a manifest's inputs are what the host writes before a forward; a serving loop must know which
is the token ids, which the positions... (kern's `fill`). The copy log (copies.jsonl,
`mining.copies`) records every host-to-device copy with the launch seq it precedes and the bytes of
small ones; this module ties those copies to the analysis' forwards and names them
(`compiler.fills`) against the step of the requests they served (`compiler.requests`).

Per forward (the seq range of its live launches: a CUDA graph's nodes keep their capture's seqs):
- **copies**: those whose `seq_before` is the forward's first launch, or falls after the previous
  forward and up to this one's first (`before`), or between its launches (`inside`), of the reader
  rule's kind (succeeded, not a graph node); their bytes where the log kept them.
- **readers**: the forward's launches with a pointer word inside the copy's [dst, dst + size).
- **host reads**: launch words into pinned host memory (allocs.jsonl host ranges,
  `compiler.launches`): the engine reads those through a mapping, with no copy the log could see;
  the launch record's host pointee (MINE_CAPTURE_HOST_BYTES, 64 B by default) gives their first
  bytes, matched as a prefix.
- **step**: the step of the requests whose values the forward's arrays equal (most exact
  matches; the forward's token count where the analysis has one must agree), and per array its
  matches.

Not checked: that an async copy on another stream landed before its readers ran (the engine's
events order it), and device-side writes over a copied range (a kernel that rewrites positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler import fills
from compiler.launches import host_ranges
from compiler.requests import Requests, Step
from mining.pointees import host_pointees


@dataclass
class Reader:
    seq: int
    symbol: str
    i: int
    at: int
    offset: int                # the word's offset into the copied range


@dataclass
class Array:
    """One piece of host data a forward received: a copy, or a host pointee a launch read."""
    source: str                # copy | host | replay (bytes an in-order replay found at a word)
    seq: int                   # the copy's seq, or the reading launch's
    dst: int                   # device destination (copy) or host address (pointee)
    size: int                  # bytes written (copy) or kept (pointee)
    where: str                 # before | inside (copies); param i@at of the launch (host)
    data: bytes | None         # None: the log did not keep them (larger than MINE_CAPTURE_COPY_BYTES)
    readers: list[Reader] = field(default_factory=list)
    alloc: tuple[int, int] | None = None    # (base, offset) of the destination's allocation
    matches: list[fills.Match] = field(default_factory=list)
    note: str = ""

    @property
    def named(self) -> fills.Match | None:
        return self.matches[0] if self.matches else None


@dataclass
class ForwardInputs:
    forward: int
    phase: str
    tokens: int | None
    first: int
    last: int
    arrays: list[Array] = field(default_factory=list)
    step: Step | None = None
    step_because: str = ""
    order: tuple = ()          # its launch seqs in the order they ran, graph nodes where they ran


def allocations(dump) -> list[tuple[int, int]]:
    """(base, size) of every device allocation the capture's allocation log saw, by base."""
    a = getattr(dump, "allocs", None)
    if a is None or len(a) == 0:
        return []
    d = a[(a["event"].astype(str) == "alloc") & (a["result"] == 0)]
    return sorted((int(b), int(s)) for b, s in zip(d["base"], d["size"]))


def _alloc_of(allocs, v: int, params=None) -> tuple[int, int] | None:
    for b, s in allocs:
        if b <= v < b + s:
            return b, v - b
    return None


def _executed(f) -> np.ndarray:
    """The forward's launch seqs in the order they ran (the analysis' runs; its seq range where
    it has none)."""
    if f.seqs:
        return np.array(f.executed(), np.int64)
    return np.arange(f.first_seq, f.last_seq + 1, dtype=np.int64)


def _live(order: np.ndarray, graph_seqs: np.ndarray) -> np.ndarray:
    """Mask of `order`'s launches the host made when they ran: not a node of a CUDA graph. Why:
    a replayed graph's kernels carry the seqs of its capture, made long before (vLLM captures its
    decode graph at start-up), so only live launches place a forward among the host's copies;
    by its first seq every decode replay would begin at the capture and span all the others."""
    return ~np.isin(order, graph_seqs)


def collect(dump, doc) -> list[ForwardInputs]:
    """Per forward of the analysis (with launches): its copies, their readers, its host reads.
    A forward's extent is that of its live launches (`_live`); a copy's readers are the launches
    the forward ran after the live launch the copy precedes, graph nodes among them."""
    L = dump.launches
    cap = L["capture_id"] if "capture_id" in L else None      # -1 (or missing): launched live
    graph_seqs = (L.loc[cap.notna() & (cap >= 0), "seq"].to_numpy(np.int64) if cap is not None
                  else np.zeros(0, np.int64))
    ext = []
    for f in doc.passes.forwards:
        if not f.n_launches:
            continue
        order = _executed(f)
        live = _live(order, graph_seqs)
        lo, hi = (int(order[live].min()), int(order[live].max())) if live.any() else (f.first_seq, f.last_seq)
        ext.append((lo, f, order, live, hi))
    ext.sort(key=lambda e: e[0])
    C = getattr(dump, "copies", None)
    P = dump.params
    ptr = P[P["is_ptr"]]
    pseq, pval = ptr["seq"].to_numpy(np.int64), ptr["value"].to_numpy(np.uint64)
    pi, pat = ptr["i"].to_numpy(), ptr["at"].to_numpy()
    sym = dict(zip(L["seq"].to_numpy(np.int64).tolist(), L["symbol"].astype(str)))
    allocs = allocations(dump)
    hosts = host_ranges(dump) or []
    out = [ForwardInputs(f.forward, f.phase, f.tokens, lo, hi, order=tuple(o.tolist())) for lo, f, o, _l, hi in ext]
    owner = _owners(C, out) if C is not None and len(C) else {}
    for fi, (_lo, f, order, live, _hi) in zip(out, ext):
        if not owner:
            continue
        sel = C[C["seq"].map(owner).eq(f.forward)].sort_values("seq")
        for r in sel.itertuples(index=False):
            dst, size = int(r.dst), int(r.size)
            a = Array("copy", int(r.seq), dst, size, "before" if r.seq_before <= fi.first else "inside",
                      r.data if r.has_bytes else None, alloc=_alloc_of(allocs, dst))
            after = np.flatnonzero(live & (order >= int(r.seq_before)))
            ran = order[after[0]:] if len(after) else order[:0]
            hit = (np.isin(pseq, ran) & (pval >= np.uint64(dst)) & (pval < np.uint64(dst + size)))
            for k in np.flatnonzero(hit):
                a.readers.append(Reader(int(pseq[k]), sym.get(int(pseq[k]), ""), int(pi[k]), int(pat[k]),
                                        int(pval[k]) - dst))
            fi.arrays.append(a)
    if hosts:
        _host_reads(dump, out, hosts, sym)
    return out


def add_replayed(dump, fwds: list[ForwardInputs], contents, kept: dict | None = None) -> None:
    """The bytes an in-order replay found at each forward's pointer words (vocab.contents), as
    arrays of source `replay` on the forward whose launches hold the reading one: the inputs an
    engine builds on the device (staging kernels), which no copy holds. Matched as a prefix: a
    word's recorded span may run past the array into whatever the engine placed next. `kept`
    (forward -> the seqs of its program's launches): of an address's records in a forward, the
    one current at the first kept launch passing it is taken (the staging kernels left out of
    the program ran before it and wrote the forward's values), and an address no kept launch
    passes is left out (only staging reads it); without `kept`, the first record. A window of
    several forwards opens with the replay's warm-up forward (replay.select.warm_start), whose
    words are left out: its staging kernels read the engine's device-side request state, which
    launches before the window wrote and the replay never ran, so they stage values of no step
    (a decode's sequence length 1, its position 0)."""
    sym = dict(zip(dump.launches["seq"].to_numpy(np.int64).tolist(), dump.launches["symbol"].astype(str)))
    allocs = allocations(dump)
    by: dict[tuple[int, int], list] = {}
    # a record's span id is its forward's first live launch (`replay.forward.executed_window`;
    # a seq window's spans start there too); a file whose ids name no forward so falls back on
    # the launch's seq inside a forward's live extent
    by_first = {f.first: f for f in fwds}
    for w in contents.words:
        fi = by_first.get(w.forward) or next((f for f in fwds if f.first <= w.seq <= f.last), None)
        if fi is not None:
            by.setdefault((fi.forward, w.addr), []).append((fi, w))
    warm = next((f.forward for f in fwds if f.first <= contents.window[0] <= f.last), None)
    if {fw for fw, _ in by} - {warm}:
        by = {k: v for k, v in by.items() if k[0] != warm}
    users: dict[int, list[int]] = {}
    if kept:
        P = dump.params
        vals = P["value"].to_numpy(np.uint64)
        hit = P["is_ptr"].to_numpy() & np.isin(vals, np.fromiter((a for _, a in by), np.uint64))
        for sq, v in zip(P["seq"].to_numpy(np.int64)[hit].tolist(), vals[hit].tolist()):
            users.setdefault(int(v), []).append(sq)
    for (forward, addr), recs in by.items():
        fi, w = recs[0]
        mine = (kept or {}).get(forward)
        if any(not fi.first <= r.seq <= fi.last for _, r in recs):
            # records of a graph replay's kernels (their seqs are the capture's): in the order they
            # were made, which is the order the window ran; the first at a kept launch holds what
            # it read (the staging before it changed the bytes, so it was recorded again)
            at_kept = [r for r in recs if mine and r[1].seq in mine]
            first = None if not at_kept else at_kept[0][1].seq
            if at_kept:
                fi, w = at_kept[0]
        else:
            recs.sort(key=lambda r: r[1].seq)
            fi, w = recs[0]
            first = min((sq for sq in users.get(addr, ()) if mine and sq in mine and sq >= w.seq), default=None)
            if first is not None:
                fi, w = [r for r in recs if r[1].seq <= first][-1]
            elif mine and fi.order:
                # only a graph replay's kernels read it (their seqs are the capture's, below the
                # forward's): they find what the last record made before the replay ran holds,
                # the forward's staging having written it and nothing since
                at = {sq: k for k, sq in enumerate(fi.order)}
                runs = [at[sq] for sq in users.get(addr, ()) if sq in mine and sq in at and not fi.first <= sq <= fi.last]
                before = [r for r in recs if at.get(r[1].seq, len(at)) < min(runs)] if runs else []
                if before:
                    fi, w = before[-1]
                    first = w.seq
        if first is None and mine:
            # only launches the program leaves out (staging) pass it: no input of the program, and
            # its first record is the previous step's bytes, which would name the wrong step
            continue
        fi.arrays.append(Array("replay", w.seq, w.addr, len(w.data), f"{sym.get(w.seq, '')} param {w.i}@{w.at}",
                               w.data, [Reader(w.seq, sym.get(w.seq, ""), w.i, w.at, 0)],
                               alloc=_alloc_of(allocs, w.addr)))


def _owners(C, fwds: list[ForwardInputs]) -> dict[int, int]:
    """copy seq -> the forward it feeds: the forward whose first live launch is the copy's
    `seq_before`; else one whose live launches the copy falls between (`inside`); else the next
    forward to start. (Forwards may overlap: an engine launches a forward's sampling after the
    next one's first.)"""
    firsts = np.array([f.first for f in fwds], np.int64)
    out = {}
    ok = C[(C["result"] == 0) & ~C["in_graph"] & (C["size"] > 0)]
    for seq, before in zip(ok["seq"].astype(int), ok["seq_before"].astype(int)):
        k = int(np.searchsorted(firsts, before, side="left"))
        if k < len(fwds) and fwds[k].first == before:
            out[seq] = fwds[k].forward
            continue
        inside = [f for f in fwds if f.first < before <= f.last]
        if inside:
            out[seq] = inside[-1].forward
        elif k < len(fwds):
            out[seq] = fwds[k].forward
    return out


def _host_reads(dump, fwds: list[ForwardInputs], hosts, sym) -> None:
    """The launches of each forward with a word into pinned host memory, with their pointees."""
    P = dump.params
    cand = P[(P["size"] >= 8) & ~P["is_ptr"]]
    lo = np.array([h[0] for h in hosts], np.uint64)
    hi = np.array([h[1] for h in hosts], np.uint64)
    v = cand["value"].to_numpy(np.uint64)
    k = np.searchsorted(lo, v, side="right") - 1
    inside = (k >= 0) & (v < hi[np.clip(k, 0, None)]) & (cand["at"].to_numpy() % 8 == 0)
    rows = cand[inside]
    pointees = host_pointees(dump, set(rows["seq"].astype(int).tolist()))
    by = {}
    for s, i, at, val in zip(rows["seq"].astype(int), rows["i"].astype(int), rows["at"].astype(int),
                             rows["value"].astype(np.uint64)):
        by.setdefault(s, []).append((i, at, int(val)))
    for fi in fwds:
        for s in sorted(x for x in by if fi.first <= x <= fi.last):
            for i, at, val in by[s]:
                got = pointees.get((s, i, at))
                a = Array("host", s, val, len(got[1]) if got else 0, f"{sym.get(s, '')} param {i}@{at}",
                          got[1] if got else None, [Reader(s, sym.get(s, ""), i, at, 0)])
                if got is None:
                    a.note = "the launch record keeps no pointee bytes for this word"
                fi.arrays.append(a)


def name(fwds: list[ForwardInputs], reqs: Requests | None) -> None:
    """Each forward's step (the one its arrays match best, in the order the engine ran them) and
    each array's matches."""
    if reqs is not None:
        tie(fwds, reqs.steps)
    for fi in fwds:
        for a in fi.arrays:
            if a.data is None:
                a.note = a.note or (f"the copy log did not keep its {a.size} bytes (over MINE_CAPTURE_COPY_BYTES)"
                                    if a.source == "copy" else "no bytes recorded")
                continue
            a.matches = fills.match(a.data, fi.step, fi.tokens, prefix=a.source in ("host", "replay"))
            _blocks_with_slots(fi, a)
            if not a.matches:
                a.note = ("matches no input of step %d" % fi.step.index if fi.step is not None
                          else "matches nothing by structure, and no step is known")


def tie(fwds: list[ForwardInputs], steps) -> None:
    """Each serving forward's step, strongest evidence first, each kind of evidence only inside
    the stretches the stronger ones left (the free steps between two tied forwards' steps):
    arrays of two or more elements equal to one step's values exactly (a prompt's token ids, its
    offsets), then the stretches that pair by order (`_by_order`), then one-element arrays equal
    to one step's value exactly, then two or more one-value fills agreeing at once (`_joint`),
    order again after each. Why this order: one value (a decode's length, a position) equals
    values of many steps by chance, or belongs to another forward than the copy log's order
    says (q3x: a decode's 4-byte copy held the length of the step two later); let it decide only
    where nothing stronger did, and never across a step a neighbour already took (q3v: five
    one-token requests share their positions). Start-up passes serve no step: a warm-up's stale
    staging bytes equal a step's values by chance (q3w's dummy runs held a prompt's length)."""
    for fi in fwds:
        fi.step_because = ("a start-up pass: it serves no step of the requests" if fi.phase != "serve"
                           else "no step of the requests explains any of the forward's arrays exactly")
    tells = {id(a): _telling(a, steps) for fi in fwds if fi.phase == "serve" for a in fi.arrays}
    for evidence in (_exact(tells, 2), None, _exact(tells, 1), _jointly, None):
        if evidence is None:
            _by_order(fwds, steps)
        else:
            _tie_in_stretches(fwds, steps, evidence)


def _stretches(fwds: list[ForwardInputs], steps):
    """(serving forwards without a step, the steps nobody took) between each two consecutive
    serving forwards that have one (or the ends of the run)."""
    serve = [k for k, fi in enumerate(fwds) if fi.phase == "serve"]
    taken = {fwds[k].step.index for k in serve if fwds[k].step is not None}
    anchors = [None] + [k for k in serve if fwds[k].step is not None] + [None]
    out = []
    for a, b in zip(anchors, anchors[1:]):
        lo = fwds[a].step.index if a is not None else -1
        hi = fwds[b].step.index if b is not None else len(steps)
        gap = [k for k in serve if (a is None or k > a) and (b is None or k < b) and fwds[k].step is None]
        free = [s for s in steps if lo < s.index < hi and s.index not in taken]
        if gap and free:
            out.append((gap, free))
    return out


def _tie_in_stretches(fwds: list[ForwardInputs], steps, evidence) -> None:
    """Inside each stretch, the heaviest chain of (forward, step) candidates `evidence` gives, in
    which later forwards take later steps. A forward whose candidates all break the chain keeps
    none, and says why."""
    for gap, free in _stretches(fwds, steps):
        cands, why = [], {}
        for k in gap:
            for s, weight, because in evidence(fwds[k], free):
                why[k, s.index] = because
                cands.append((k, s, weight, int(s.tokens == fwds[k].tokens)))
        chosen = _chain(cands)
        for k in gap:
            fi = fwds[k]
            if k in chosen:
                s = chosen[k][1]
                fi.step, fi.step_because = s, why[k, s.index] + _agreement(fi, s)
            elif mine := [c for c in cands if c[0] == k]:
                top = max(mine, key=lambda c: c[2])
                after = any(c[0] < k and c[1].index > top[1].index for c in chosen.values())
                fi.step_because = (f"{why[k, top[1].index]}, but the forwards around it took steps that the engine "
                                   f"ran {'after' if after else 'before'} it (steps run in order): no step")


def _chain(cands: list[tuple]) -> dict[int, tuple]:
    """The heaviest chain of candidates (forward's place, step, *weights) in which later forwards
    take later steps; weights add element-wise and compare in order."""
    best: list[tuple[tuple, int | None]] = []
    for i, (k, s, *w) in enumerate(cands):
        prev = max((j for j in range(i) if cands[j][0] < k and cands[j][1].index < s.index),
                   key=lambda j: best[j][0], default=None)
        base = best[prev][0] if prev is not None else (0,) * len(w)
        best.append((tuple(x + y for x, y in zip(base, w)), prev))
    end = max(range(len(cands)), key=lambda i: best[i][0], default=None)
    chosen = {}
    while end is not None:
        chosen[cands[end][0]] = cands[end]
        end = best[end][1]
    return chosen


def _agreement(fi: ForwardInputs, s) -> str:
    return ("" if fi.tokens is None else f"; its {s.tokens} tokens agree with the analysis'" if s.tokens == fi.tokens
            else f"; the analysis counts {fi.tokens} tokens, the step {s.tokens} (sequences {len(s.runs)})")


def _telling(a: Array, steps) -> tuple | None:
    """(the one step an array equals exactly and tells apart from every other, the elements
    compared), or None. An array equal to several steps' values counts for the one where it
    equals the most elements (a 163-token arange holds a 5-token prompt's positions as its
    prefix: stale bytes of a longer step); where two steps tie at the most, it tells neither: a
    one-sequence decode's length is the next step's position, so a 4-byte copy of 5 is step 8's
    length and step 9's position alike (q3zd: such copies tied three forwards to the wrong
    steps and broke the stretches `_by_order` pairs)."""
    if not a.data:
        return None
    best, most, tied = None, 0, False
    for s in steps:
        n = max((m.elements for m in fills.match(a.data, s, prefix=a.source in ("host", "replay"))
                 if m.sure == "exact"), default=0)
        if n > most:
            best, most, tied = s, n, False
        elif n and n == most:
            tied = True
    return None if tied or best is None else (best, most)


def _exact(tells: dict, elements: int):
    """Evidence: a free step is a candidate where arrays of the forward tell it (`_telling`) by
    `elements` or more compared elements (1: exactly one), weighed by how many do. Why the
    analysis' token count only ranks, never filters: a batched forward's count may be its
    sequences (issue 17)."""
    def evidence(fi: ForwardInputs, free):
        n: dict[int, int] = {}
        for a in fi.arrays:
            t = tells.get(id(a))
            if t is not None and (t[1] >= elements if elements > 1 else t[1] == 1):
                n[t[0].index] = n.get(t[0].index, 0) + 1
        return [(s, n[s.index], f"{n[s.index]} of the forward's {'one-element ' if elements == 1 else ''}arrays "
                 f"equal step {s.index}'s values exactly") for s in free if s.index in n]
    return evidence


def _jointly(fi: ForwardInputs, free):
    """Evidence: a free step is a candidate where two or more different one-value fills (token,
    position, length) equal its values in two or more different arrays, weighed by how many
    fills. Why: a one-sequence decode's position and length are one value each, never `exact`
    alone, and `_by_order` pairs nothing where the analysis' token counts disagree with the
    steps' (default mode's padded graph batches); two of them agreeing at once in different
    arrays is the step's, one alone is chance (any buffer's first word)."""
    out = []
    for s in free:
        few, arrays = _joint(fi, s)
        if len(few) >= 2 and arrays >= 2:
            out.append((s, len(few), f"{len(few)} one-value arrays of the forward ({', '.join(sorted(few))}) "
                        f"equal step {s.index}'s values, the only evidence between its neighbours' steps"))
    return out


_VALUED = ("token", "position", "seq_len")     # fills the requests determine value by value


def _joint(fi: ForwardInputs, s) -> tuple[set[str], int]:
    """The one-value fills (`_VALUED`) the forward's arrays weakly show for step `s`, and how many
    arrays show one."""
    few, arrays = set(), 0
    for a in fi.arrays:
        if a.data:
            f = {m.fill for m in fills.match(a.data, s, prefix=a.source in ("host", "replay"))
                 if m.sure == "weak" and m.fill in _VALUED}
            few |= f
            arrays += bool(f)
    return few, arrays


def _by_order(fwds: list[ForwardInputs], steps) -> None:
    """Serving forwards no array ties to a step take one by order: between two forwards that have
    steps (or the ends of the run), the forwards without one and the steps nobody took pair up in
    order when there are as many of each and every pair's token counts agree. Why enough: the
    engine ran the steps in that order, and a count that agrees pair by pair over a stretch is the
    stretch's own evidence; a stretch whose counts disagree anywhere pairs nothing."""
    serve = [fi for fi in fwds if fi.phase == "serve"]
    taken = {fi.step.index for fi in serve if fi.step is not None}
    anchors = [-1] + [k for k, fi in enumerate(serve) if fi.step is not None] + [len(serve)]
    for a, b in zip(anchors, anchors[1:]):
        lo = serve[a].step.index if a >= 0 else -1
        hi = serve[b].step.index if b < len(serve) else len(steps)
        free = [s for s in steps if lo < s.index < hi and s.index not in taken]
        gap = serve[a + 1:b]
        if not gap or len(gap) != len(free) or any(fi.tokens != s.tokens for fi, s in zip(gap, free)):
            continue
        for fi, s in zip(gap, free):
            fi.step = s
            fi.step_because = (f"by order: the {len(gap)} serving forward(s) between "
                               f"{'the start' if a < 0 else 'forward %d' % serve[a].forward} and "
                               f"{'the end' if b >= len(serve) else 'forward %d' % serve[b].forward} pair with "
                               f"steps {free[0].index}..{free[-1].index}, token counts equal")


def _blocks_with_slots(fi: ForwardInputs, a: Array) -> None:
    """A weak blocks match becomes `structure` when the forward's slot array agrees with it."""
    m = a.named
    if m is None or m.fill != "blocks" or fi.step is None or fi.step.tokens < 2:
        return          # one token's slot fits several page sizes: it pins none
    for b in fi.arrays:
        s = b.named
        if s is not None and s.fill == "slot" and b.data and (not s.prefix or s.elements == fi.step.tokens):
            v = fills.arrays(a.data)[m.dtype]
            slots = fills.arrays(b.data)[s.dtype][:fi.step.tokens]
            for page in fills.PAGES[::-1]:
                if fills.check_blocks(v, fi.step, slots, page):
                    a.matches[0] = fills.Match("blocks", m.dtype, "structure", m.because + f"; every token's slot // "
                                               f"{page} is its row's page entry (copy {b.seq})", m.elements, False, page)
                    return
