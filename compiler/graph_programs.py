"""Which CUDA graphs of the capture the programs hold: provenance.json `graphs`.

Why: an engine that runs its forwards from CUDA graphs captures one graph per size (SGLang: a
decode graph per batch size 1, 2, 4, ...; a prefill graph, in segments, per token count), and a
reader of the manifest must see which of them the programs hold and what became of the others.
The program rule (compiler.programs) builds programs from forwards -- what the GPU ran -- so a
graph reaches a program only through the forwards that replayed it:

- `program`: replayed by forwards the program was built from (a `decode` program built from the
  replays of one graph is `graph: true` with every value constant: compiler.emit);
- `left out`: replayed only by forwards the program rule left out (their reasons are in
  `programs.<name>.left_out`);
- `not replayed`: captured (at start-up) and never launched in the capture: no forward ran it, so
  no program can hold it -- nothing samples its values. Its record count and capture ids are
  listed; its size is the engine's choice, which the capture-time records alone do not name.

One entry per graph exec (a graph instantiated once), from the analysis' captures
(`passes.captures`) and the forwards' launch records (a replay's kernels name the records
captured into the graph).
"""

from __future__ import annotations

from collections import Counter

from vocab.analysis import AnalysisDoc


def _seqs(f) -> set[int]:
    return {s for first, n in f.seqs for s in range(first, first + n)}


def graphs(doc: AnalysisDoc, progs) -> tuple[list[dict], list[str]]:
    """(one entry per graph exec, note lines) for the programs `progs` built from `doc`."""
    member = {s.forward: p.name for p in progs for s in p.samples}
    left = {f: (p.name, why) for p in progs for f, why in p.left_out.items()}
    by_exec: dict[str, dict] = {}
    for c in doc.passes.captures:
        key = c.exec or f"capture {c.capture_id}"
        e = by_exec.setdefault(key, {"exec": c.exec, "graph": c.graph, "captures": [], "launches": 0, "seqs": set()})
        e["captures"].append(c.capture_id)
        e["launches"] += c.launches
        e["seqs"].update(range(c.first_seq, c.last_seq + 1))
    fwd_seqs = [(f, _seqs(f)) for f in doc.passes.forwards]
    out = []
    for e in by_exec.values():
        runs = [f for f, s in fwd_seqs if s & e["seqs"]]
        ran = [{"forward": f.forward, "tokens": f.tokens, "phase": f.phase,
                "program": member.get(f.forward, ""),
                "left_out": left[f.forward][0] if f.forward in left else ""} for f in runs]
        held = sorted({r["program"] for r in ran if r["program"]})
        status = "program" if held else ("left out" if ran else "not replayed")
        out.append({"exec": e["exec"], "graph": e["graph"], "captures": e["captures"], "launches": e["launches"],
                    "status": status, "programs": held, "tokens": sorted({r["tokens"] for r in ran if r["tokens"]}),
                    "forwards": ran})
    return out, _notes(out)


def _notes(entries: list[dict]) -> list[str]:
    if not entries:
        return []
    n = Counter(e["status"] for e in entries)
    held = [e for e in entries if e["status"] == "program"]
    parts = []
    for name in sorted({p for e in held for p in e["programs"]}):
        es = [e for e in held if name in e["programs"]]
        toks = sorted({t for e in es for t in e["tokens"]})
        parts.append(f"{name} holds {len(es)} (replayed at {', '.join(map(str, toks))} tokens)")
    line = (f"CUDA graphs: {len(entries)} graph execs captured; " + ("; ".join(parts) or "no program holds one")
            + (f"; {n['left out']} replayed only by left-out forwards" if n["left out"] else "")
            + (f"; {n['not replayed']} never replayed in the capture, so no forward ran them and no program "
               f"holds them (provenance.json `graphs`)" if n["not replayed"] else ""))
    return [line]
