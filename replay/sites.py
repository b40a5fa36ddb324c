"""Replay results as the analysis' `flow` section: measured directions per call site.

Why here: a replay measures launch records (seqs); generators and the compiler think in call
sites (`vocab.analysis.site_name`: symbol and occurrence in a forward). The analysis' forwards
list their launch records in order, so the k-th launch of a symbol in a forward is that symbol's
site k -- the rule `mining.sites.align` names sites by. A record that several forwards share (one
captured into a graph and replayed) keeps the site of the first of them.
"""

from __future__ import annotations

from vocab.analysis import AnalysisDoc, FlowWord, site_name


def site_of(doc: AnalysisDoc, symbols: dict[int, str]) -> dict[int, str]:
    """launch seq -> call site, over the analysis' forwards (`symbols`: seq -> symbol)."""
    out: dict[int, str] = {}
    for f in doc.passes.forwards:
        occ: dict[str, int] = {}
        for first, n in f.seqs:
            for seq in range(first, first + n):
                sym = symbols.get(seq)
                if sym is None:
                    continue
                k = occ.get(sym, 0)
                occ[sym] = k + 1
                out.setdefault(seq, site_name(sym, k))
    return out


def flow_words(results, doc: AnalysisDoc, symbols: dict[int, str]) -> tuple[list[FlowWord], int]:
    """(FlowWords of every replayed launch that falls in a forward of the analysis, launches
    left out because no forward holds them). One launch per site is enough: the first replayed
    one is kept."""
    sites = site_of(doc, symbols)
    out, seen, outside = [], set(), 0
    for r in results:
        if r.status != "ok":
            continue
        site = sites.get(r.seq)
        if site is None:
            outside += 1
            continue
        if site in seen:
            continue
        seen.add(site)
        ctx = "in-order" if r.fill == "forward" else "alone"
        out += [FlowWord(site, w.i, w.at, w.direction, w.written_bytes, w.read_by, w.shared, r.seq, w.span_bytes, ctx)
                for w in r.words]
    return out, outside


def with_flow(dump, results, analysis=None) -> AnalysisDoc:
    """The dump's analysis (read from the file `analysis`, or computed) with its flow section
    filled from the replay `results`; an analysis of another capture is a UsageError."""
    from vocab.errors import UsageError

    if analysis is not None:
        from vocab.analysis import read_analysis

        doc = read_analysis(analysis)
        if doc.source.launches != len(dump.launches):
            raise UsageError(f"{analysis} is the analysis of another capture ({doc.source.launches} launches; "
                             f"this dump has {len(dump.launches)})", value=doc.source.launches,
                             limit=len(dump.launches))
    else:
        from mining.analyze import analyze, document

        doc = document(analyze(dump))
    symbols = dict(zip(dump.launches["seq"].tolist(), dump.launches["symbol"].astype(str).tolist()))
    doc.flow, _ = flow_words(results, doc, symbols)
    return doc
