"""Which launch records `mine replay` runs: by seq, by kernel name, by forward of the analysis.

The library half of `mine replay`'s selection options; bad input (a seq the dump lacks, a forward
the analysis does not find, a regex that does not compile or matches nothing, no selection at
all) is a `UsageError` naming the option.
"""

from __future__ import annotations

import re

from vocab.errors import UsageError


def forward_seqs(dump, forward: int) -> list[int]:
    """The launch records of forward `forward` (from 0) of the dump's analysis, in order."""
    from mining.analyze import analyze, document

    doc = document(analyze(dump))
    for f in doc.passes.forwards:
        if f.forward == forward:
            return f.executed()
    raise UsageError(f"{dump.source}: the analysis finds no forward {forward} "
                     f"(it has {len(doc.passes.forwards)}, numbered from 0)",
                     value=forward, limit=len(doc.passes.forwards))


def site_seqs(dump, site: str) -> list[int]:
    """The launch records of call site `site` (the analysis' name: symbol#occurrence in a
    forward, `vocab.analysis.site_name`), one per forward that runs it, in order."""
    from mining.analyze import analyze, document
    from replay.sites import site_of

    doc = document(analyze(dump))
    symbols = dict(zip(dump.launches["seq"].tolist(), dump.launches["symbol"].astype(str).tolist()))
    hit = sorted(s for s, name in site_of(doc, symbols).items() if name == site)
    if not hit:
        known = sorted({x.site for x in doc.sites})
        near = [k for k in known if site.split("#")[0] and site.split("#")[0][:20] in k][:3]
        raise UsageError(f"{dump.source}: the analysis has no call site {site!r}"
                         + (f" (like it: {', '.join(near)})" if near else f" ({len(known)} sites; `mine analyze` lists them)"),
                         value=site)
    return hit


def select(dump, seq: list[int], kernel: str | None, forward: int | None, limit: int,
           site: str | None = None) -> list[int]:
    """The launches to replay, in order: the `seq`s given; else those of call site `site` (of
    `forward`, when given), at most `limit`; else those (of `forward`, when given) whose symbol or
    name matches `kernel`, at most `limit`; else every launch of `forward`."""
    L = dump.launches
    pool = forward_seqs(dump, forward) if forward is not None else L["seq"].tolist()
    if site and not seq:
        got = site_seqs(dump, site)
        if forward is not None:
            got = [s for s in got if s in set(pool)]
            if not got:
                raise UsageError(f"{dump.source}: call site {site!r} does not run in forward {forward}", value=site)
        return got[:limit]
    if seq:
        known = set(L["seq"].tolist())
        bad = [s for s in seq if s not in known]
        if bad:
            raise UsageError(f"{dump.source}: no launch record with seq {bad[0]}", value=bad[0])
        return list(seq)
    if kernel:
        try:
            rx = re.compile(kernel)
        except re.error as exc:
            raise UsageError(f"--kernel {kernel!r} is not a regular expression ({exc})", value=kernel) from None
        names = dict(zip(L["seq"].tolist(), (L["symbol"].astype(str) + " " + L["name"].astype(str)).tolist()))
        pool = [s for s in pool if rx.search(names.get(s, ""))]
        if not pool:
            raise UsageError(f"{dump.source}: no launch{' of that forward' if forward is not None else ''} "
                             f"matches --kernel {kernel!r}", value=kernel)
        return pool[:limit]
    if forward is None:
        raise UsageError("say which launches: --seq N, --site S, --kernel REGEX or --forward F")
    return pool


def warm_forward(dump, forward: int, doc=None) -> int:
    """The forward an in-order replay of `forward` begins with (`warm_start` says why): the one
    before the latest prefill (more than one token) at or before it; with no prefill before it,
    the forward before it. Forwards are taken in the order they ran (their start times: a CUDA
    graph's kernels keep the seqs of its capture, so a replayed forward's first seq says nothing
    of when it ran)."""
    from mining.analyze import analyze, document

    doc = doc if doc is not None else document(analyze(dump))
    fw = sorted((f for f in doc.passes.forwards if f.n_launches), key=lambda f: (f.start_ns, f.first_seq))
    k = next((n for n, f in enumerate(fw) if f.forward == forward), None)
    if k is None:
        raise UsageError(f"{dump.source}: the analysis finds no forward {forward}", value=forward)
    pre = [n for n in range(k + 1) if (fw[n].tokens or 0) > 1]
    start = pre[-1] if pre else k
    return int(fw[max(start - 1, 0)].forward)


def warm_start(dump, forward: int, doc=None) -> int:
    """Where an in-order replay of `forward` begins (`replay.forward`): the first launch of the
    forward before the latest prefill (more than one token) at or before it. Why there: a request's
    device-side metadata (its block table rows, its sequence state) is written when its prompt is
    scheduled, and an engine stages a forward's inputs at the end of the forward before it (vLLM's
    staging kernels run there); from that point on, every byte the target reads was either put there
    by the host (the copy log, the pointees) or by a launch the replay runs. With no prefill before
    it: the forward before it."""
    from mining.analyze import analyze, document

    doc = doc if doc is not None else document(analyze(dump))
    w = warm_forward(dump, forward, doc)
    return int(next(f.first_seq for f in doc.passes.forwards if f.forward == w))
