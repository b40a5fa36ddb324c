"""`compile_dump`: a capture to a verified kern manifest, with no model-specific wiring.

The library function under `mine compile` (docs/compile.md is the contract). Steps: the dump is
read (`mining.load`), its analysis taken from `analysis` (`mine analyze --json`, or `mine replay
--flow-out`, whose measured data flow sharpens the directions) or computed; `programs` picks the
decode and prefill forwards and their calls; `buffers` decides what every address holds;
`exprs` fits what varies; `inputs` / `input_fills` name the inputs from the copy log and the
host-mapped reads (kern fills; `explain_dump` reports them without compiling); with a checkpoint,
`weight_binds` binds each weight buffer by the snapshot's bytes (`weights/extra.safetensors` for
bytes no tensor holds); `emit` writes the manifest, which must pass `manifests.verify` (else
`RejectedManifest`: a compiler bug, one sentence). Into the output folder: `manifest.json`,
`provenance.json` (what each decision rests on) and `kernels/` (the dump's cubins by sha256; a
module the dump holds by hash only is listed in the result's notes, and the offline ABI check
covers the others).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from compiler import buffers, emit, facts, graph_programs, input_fills, inputs, programs, restaged
from compiler.errors import CompileError, ProgramError
from vocab.dumps import dumps
from vocab.errors import RejectedManifest

VERSION = "0.1"


@dataclass
class CompileResult:
    manifest: dict
    provenance: dict
    notes: list[str] = field(default_factory=list)
    path: Optional[Path] = None
    extras: dict = field(default_factory=dict)  # weights/extra.safetensors tensors (compiler.weight_binds)

    def lines(self) -> list[str]:
        m = self.manifest
        calls = ", ".join(f"{len(p['calls'])} {n}" for n, p in sorted(m["programs"].items()))
        head = (f"{self.path or 'manifest'}: {calls} calls; {len(m['buffers'])} buffers, {len(m['states'])} states, "
                f"{len(m['modules'])} modules; verified")
        return [head] + [f"note: {n}" for n in self.notes]


def check_inputs(dump, analysis=None, config=None, weights=None, requests=None, contents=None) -> None:
    """Refuse inputs that cannot serve, before any work (one sentence each)."""
    from compiler.requests import read_requests

    for flag, given in (("DUMP", dump), ("--analysis", analysis), ("--config", config), ("--weights", weights),
                        ("--requests", requests), ("--contents", contents)):
        if given is not None and not Path(given).exists():
            raise FileNotFoundError(f"{flag} {given}: cannot be read (no such file or folder)")
    if weights is not None:
        from generators.safetensors import CheckpointError, checkpoint_files
        from vocab.errors import UsageError
        try:
            checkpoint_files(weights)
        except CheckpointError as exc:
            raise UsageError(f"--weights {weights}: binding weights by content needs a checkpoint folder of "
                             f"*.safetensors files ({exc})", value=weights) from None
    if requests is not None:
        read_requests(requests)
    if contents is not None:
        from vocab import contents as C
        C.read(contents)
    if config is not None:
        facts.read(config)


def _contents(path, dump):
    """The replay contents file read and tied to this capture (one sentence otherwise)."""
    if path is None:
        return None
    from vocab import contents as C

    c = C.read(path)
    if c.launches != len(dump.launches):
        raise CompileError(f"--contents {path}: the replay contents of another capture ({c.launches} launches; "
                           f"this dump has {len(dump.launches)})")
    return c


def _dtypes(layouts: dict, decls: dict, progs) -> None:
    """bf16 where every offset and the size are even (GEMM operands need it), else u8."""
    odd = {n for n, d in decls.items() if d.size % 2}
    for lay in layouts.values():
        for kind, name, off in lay.where.values():
            if kind == "buf" and off % 2:
                odd.add(name)
    for n, d in decls.items():
        d.dtype = "u8" if n in odd else "bf16"


def explain_inputs(dump, doc, requests=None, contents=None, progs=None) -> tuple[list, list]:
    """(per-forward inputs, per-kind entries): what the host gave each forward and what it is named
    (compiler.inputs, compiler.input_fills); needs no manifest, so it runs where compiling refuses.
    `contents` (vocab.contents.Contents): what an in-order replay found at the forwards' words."""
    fwds = inputs.collect(dump, doc)
    if contents is not None:
        inputs.add_replayed(dump, fwds, contents, None if progs is None else _kept(progs))
    inputs.name(fwds, requests)
    return fwds, input_fills.by_kind(fwds)


def _kept(progs) -> dict[int, set[int]]:
    """forward -> the launch seqs its program kept (each call's launch and split-K reduction)."""
    return {s.forward: {x.seq for st in s.steps for x in (st.launch, st.aux) if x is not None}
            for p in progs for s in p.samples}


def compile_capture(dump, doc, label: str = "", requests=None, weights: Optional[list] = None,
                    contents=None, model: Optional[facts.Facts] = None) -> CompileResult:
    """The manifest and provenance of a loaded dump and its AnalysisDoc (`requests`: the
    compiler.requests.Requests the capture served, for naming inputs by content; `weights`: the
    checkpoint's safetensors files, to bind weight buffers by the snapshot's bytes; `model`: the
    checkpoint config's facts, so each program ends at its logits and the inputs get domains)."""
    from manifests.verify import verify

    if weights is not None and getattr(dump, "snapshot", None) is None:
        raise CompileError("--weights: the capture holds no snapshot of its device memory, so its weight bytes are "
                           "unknown; capture again with MINE_CAPTURE_SNAPSHOT_AT=N (docs/dump-format.md \"Snapshot\")")

    progs, notes = programs.programs(dump, doc, model.vocab if model else None)
    if not progs:
        raise CompileError("no decode or prefill program could be built: " + "; ".join(notes))
    dropped: dict[str, str] = {}
    while True:
        try:
            return _compile_programs(dump, doc, progs, notes, dropped, label, requests, weights, contents, model)
        except ProgramError as exc:
            prog = next(p for p in progs if p.name == exc.program)
            startup = [s for s in prog.samples if s.phase != "serve"]
            if startup and len(startup) < len(prog.samples):
                # start-up passes (vLLM's dummy batch of max_num_seqs sequences) widen the program past
                # the steps it serves; where that leaves a field unpinned, the serving steps alone decide
                for s in startup:
                    prog.left_out[s.forward] = f"a start-up pass: with it in the program, {exc}"
                prog.samples = [s for s in prog.samples if s.phase == "serve"]
                notes = notes + [f"{prog.name}: compiled over its serving steps only; its start-up forward(s) "
                                 f"{[s.forward for s in startup][:8]} left it unpinned ({exc})"]
                continue
            # a batched program the capture does not pin: left out, the others compile (errors.ProgramError)
            dropped[exc.program] = str(exc)
            progs = [p for p in progs if p.name != exc.program]
            notes = notes + [f"{exc.program}: left out of the manifest: {exc}"]


def _compile_programs(dump, doc, progs, notes, dropped, label, requests, weights, contents, model) -> CompileResult:
    """compile_capture's work over a fixed set of programs (`dropped`: program -> why left out)."""
    from manifests.verify import verify

    changing = contents.changing() if contents is not None else frozenset()
    # prefill programs end at their last state access before the layout is made: the launches
    # cut off must not size, type or classify a buffer
    notes = notes + programs.end_at_state(progs, *buffers.classify(progs, doc, changing))
    layouts, decls = buffers.layout(progs, doc, changing, model.vocab if model is not None else None)
    _dtypes(layouts, decls, progs)
    for name, lay in layouts.items():
        if lay.short and not doc.flow:
            notes.append(f"{name}: {len(lay.short)} pointer word(s) take their extent from the span to an address the "
                         f"forward uses at another time (an allocator's reused block), with no measured bytes: an "
                         f"in-order replay's flow (`mine replay --in-order --flow-out`) sizes them from what the "
                         f"calls write")
    fwds, entries = explain_inputs(dump, doc, requests, contents, progs)
    floats = frozenset(lay.where[key][1] for lay in layouts.values() for key, u in lay.uses.items() if u.operand)
    assigned = input_fills.assign(decls, progs, fwds, floats)
    if model is not None:
        notes += input_fills.by_vocabulary(decls, layouts, progs, fwds, model.vocab, assigned, floats)
    notes += input_fills.merge(decls, layouts, assigned)
    rewritten = restaged.find(progs, layouts, decls, doc)
    notes += restaged.notes(rewritten) + restaged.across(progs, layouts, decls)
    label_ = f"compiled (mine compile {VERSION}; capture {label})" if label else f"compiled (mine compile {VERSION})"
    m, em = emit.manifest(progs, layouts, decls, doc, label_, model)
    wb = None
    if weights is not None:
        from compiler.weight_binds import bind_weights
        wb = bind_weights(decls, dump.snapshot, weights)
        for name, segs in wb.binds.items():
            m["buffers"][name]["bind"] = segs
        notes += wb.notes
    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the compiled manifest fails verification ({len(bad)} violations, first: {bad[0]})")
    if not doc.flow:
        notes.append("the analysis has no measured data flow (`mine replay --flow-out`): every kernel word's "
                     "direction is inferred from its class and the order of the calls")
    if getattr(dump, "copies", None) is None or len(dump.copies) == 0:
        notes.append("the capture has no copy log (MINE_CAPTURE_COPY_LOG=1): inputs are named by address, "
                     "without kern `fill` kinds")
    else:
        named = [a for a in assigned if a.fill]
        notes.append(f"{len(named)} of {len(assigned)} inputs carry a kern fill from the copy log"
                     + ("" if requests is not None else " (no --requests: only structure names them)")
                     + ("; the others are unnamed (provenance.json `inputs` says why)" if len(named) < len(assigned)
                        else ""))
    graph_entries, graph_notes = graph_programs.graphs(doc, progs)
    notes += graph_notes
    prov = provenance(progs, layouts, decls, doc, notes + em.notes)
    prov["graphs"] = graph_entries  # each CUDA graph exec: the program holding it, or why none (graph_programs)
    prov["splits"] = em.splits      # calls launched by row range (compiler.builds): builds, ranges, open gaps
    if rewritten:
        prov["restaged"] = [r.to_json() for r in rewritten]   # reads a left-out launch's rewrite feeds (compiler.restaged)
    prov["inputs"] = {"manifest": {a.name: {"fill": a.fill, "dtype": a.dtype, "because": a.because} for a in assigned},
                      "by_kind": [e.to_json() for e in entries],
                      "requests": None if requests is None else requests.source,
                      "steps": {str(fi.forward): {"step": None if fi.step is None else fi.step.index,
                                                  "because": fi.step_because} for fi in fwds if fi.arrays}}
    if wb is not None:
        prov["weights"] = wb.provenance
    if any(p.batched for p in progs):
        # batched: each program's sequences and the fitted fields' forms (compiler.exprs)
        prov["batched"] = {"programs": {p.name: {"kind": p.kind, "var": p.var, "seen_seqs": list(p.seen),
                                                 "groups": p.rep.seqs} for p in progs},
                           "left_out": dropped, "fits": em.fits}
    return CompileResult(m, prov, notes + em.notes, extras={} if wb is None else wb.extras)


def provenance(progs, layouts, decls, doc, notes) -> dict:
    """What each decision rests on: per declaration, per program's forwards and per call word."""
    out = {"notes": notes, "declarations": {}, "programs": {}}
    for d in decls.values():
        out["declarations"][d.name] = {"kind": d.kind, "bytes": d.size, "alloc_base": hex(d.base),
                                       "alloc_offset": d.lo, "because": d.because}
    for p in progs:
        lay = layouts[p.name]
        calls = []
        for k, st in enumerate(p.rep.steps):
            words = [{"param": i, "at": at, "direction": u.direction, "evidence": u.evidence,
                      "to": list(lay.where[(k, i, at)])} for (kk, i, at), u in sorted(lay.uses.items()) if kk == k]
            calls.append({"call": k, "site": st.launch.site, "seq": st.launch.seq,
                          "gemm": None if st.gemm is None else {"m": st.gemm.m, "n": st.gemm.n, "k": st.gemm.k,
                                                                 "split_k": st.gemm.split_k},
                          "words": words})
        out["programs"][p.name] = {"forwards": [[s.forward, s.tokens] for s in p.samples],
                                   "laid_out_from": p.rep.forward,
                                   "left_out": {str(f): why for f, why in sorted(p.left_out.items())},
                                   "staging": [[x.seq, x.symbol] for x in p.rep.staging], "calls": calls}
    return out


def _load(dump_path: Path, analysis, pid, cache, cache_dir):
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from vocab.analysis import read_analysis

    doc = read_analysis(analysis) if analysis is not None else None
    dump = load_dump(dump_path, pid=pid, cache=cache, cache_dir=cache_dir)
    if doc is None:
        doc = document(analyze(dump))
    elif doc.source.launches != len(dump.launches):
        raise CompileError(f"{analysis} is the analysis of another capture ({doc.source.launches} launches; "
                           f"{dump_path} holds {len(dump.launches)})")
    return dump, doc


def compile_dump(dump_path: Path, out=None, *, analysis: Optional[Path] = None, pid: Optional[int] = None,
                 cache: bool = True, cache_dir: Optional[Path] = None, requests: Optional[Path] = None,
                 weights: Optional[Path] = None, contents: Optional[Path] = None,
                 config: Optional[Path] = None) -> CompileResult:
    """Compile the capture at `dump_path`; with `out` (a folder object or path) write manifest.json,
    provenance.json and kernels/ there. `requests`: a requests file (compiler.requests); `weights`: a
    checkpoint folder (its *.safetensors), to bind weights by content; `config`: the checkpoint's
    config.json (default: the one in `weights`), for the vocabulary."""
    from compiler.requests import read_requests
    from generators.safetensors import checkpoint_files

    reqs = read_requests(requests) if requests is not None else None
    files = checkpoint_files(weights) if weights is not None else None
    model = facts.read(config if config is not None else weights)
    dump, doc = _load(dump_path, analysis, pid, cache, cache_dir)
    res = compile_capture(dump, doc, label=Path(str(dump.source.parent)).name, requests=reqs, weights=files,
                          contents=_contents(contents, dump), model=model)
    if out is not None:
        write(res, out, dump)
    return res


def explain_dump(dump_path: Path, out=None, *, analysis: Optional[Path] = None, pid: Optional[int] = None,
                 cache: bool = True, cache_dir: Optional[Path] = None, requests: Optional[Path] = None,
                 contents: Optional[Path] = None) -> list[str]:
    """`mine compile --explain-inputs`: the input report's lines; with `out`, inputs.json there."""
    from compiler.requests import read_requests
    from generators.folder import folder as as_folder

    reqs = read_requests(requests) if requests is not None else None
    dump, doc = _load(dump_path, analysis, pid, cache, cache_dir)
    fwds, entries = explain_inputs(dump, doc, reqs, _contents(contents, dump))
    head = [f"{dump_path}: {sum(len(f.arrays) for f in fwds)} host arrays over {len(fwds)} forwards "
            f"({'a copy log' if getattr(dump, 'copies', None) is not None else 'no copy log'}; "
            f"{'requests ' + str(requests) if reqs else 'no requests: structure only'})"]
    if out is not None:
        folder = as_folder(out)
        folder.path("inputs.json").write_text(json.dumps(
            {"by_kind": [e.to_json() for e in entries],
             "steps": {str(fi.forward): {"step": None if fi.step is None else fi.step.index, "because": fi.step_because}
                       for fi in fwds if fi.arrays}}, indent=1, sort_keys=True) + "\n")
        folder.finish()
    return head + input_fills.lines(entries)


def write(res: CompileResult, out, dump) -> None:
    from generators.folder import folder as as_folder
    from manifests.abi import check_abi

    folder = as_folder(out)
    path = folder.path("manifest.json")
    path.write_text(dumps(res.manifest))
    folder.path("provenance.json").write_text(json.dumps(res.provenance, indent=1, sort_keys=True) + "\n")
    if res.extras:
        from compiler.weight_binds import EXTRA_FILE
        from generators.safetensors import write as write_safetensors
        write_safetensors(folder.path(EXTRA_FILE), res.extras)
    cubins = Path(str(dump.source.parent)) / "cubins"
    absent = []
    for name, ref in sorted(res.manifest["modules"].items()):
        src = cubins / ref["source"]
        if src.is_file():
            shutil.copyfile(src, folder.path(f"kernels/{ref['source']}"))
        else:
            absent.append(name)
    folder.finish()
    res.path = path
    if absent:
        res.notes.append(f"{len(absent)} of {len(res.manifest['modules'])} modules have no cubin in the dump "
                         f"(held by hash only): kern needs them in kernels/ to run the manifest")
    problems = [d for d in check_abi(res.manifest, folder.root / "kernels") if d.rule != "abi.module-file"]
    if problems:
        raise RejectedManifest(f"the ABI check fails: {problems[0]} ({len(problems)} finding(s))")
