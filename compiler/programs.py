"""Programs from forwards: which launches of which forwards become a manifest program's calls.

The analysis (vocab.analysis) lists the forwards with their token count and their launch records
in execution order (a graph replay's kernels name the records captured into the graph). A forward
of one token is a decode step, of more a prefill; a program per kind (`decode`, `prefill`) is
built from the forwards of that kind whose *call sequence* is the one most serving forwards of
the kind share:

- a launch that reads host memory (`compiler.launches`: an engine's input staging) is left out:
  a manifest passes device buffers only; what it writes becomes an input (compiler.buffers);
- a cuBLASLt launch and its split-K reduction are one GEMM call (`compiler.externs`);
- the sequence is the (symbol, module sha256) of every call, GEMMs by their operand sizes' shape
  class only (cuBLASLt picks another kernel by m, kern's own call picks again).

Start-up forwards (profile and warm-up passes) join a program when their sequence is the same:
they add sample points for the expressions (compiler.exprs) and the largest one sets the rows
the prefill is sized for. A forward whose calls differ only by kernel builds -- another module or
entry at a call, with the same parameter sizes and pointer places, that the program's forwards
and it launch on either side of one row threshold (compiler.builds) -- joins too: those calls
launch by row range. Forwards of another sequence are listed as left out, with their count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from compiler import builds, device_ops, externs
from compiler.errors import CompileError
from compiler.inputs import allocations
from compiler.launches import Launch, read_launches
from mining.graphs import of_dump
from vocab.analysis import AnalysisDoc, site_name


@dataclass
class Step:
    """One call of a program in one forward: a kernel launch, or a GEMM (main + split-K aux)."""
    launch: Launch
    aux: Launch | None = None
    gemm: externs.Gemm | None = None

    @property
    def key(self) -> tuple:
        if self.gemm is not None:
            return ("gemm",)
        return (self.launch.symbol, self.launch.sha256)


@dataclass
class Sample:
    forward: int
    phase: str
    tokens: int
    steps: list[Step]
    staging: list[Launch]       # host-reading launches left out of the program
    tail: list[Launch] = field(default_factory=list)   # launches after the logits (`cut_at_logits`)
    seqs: int = 1               # sequences the step serves (the analysis' `forward_vars`; 1 without)


@dataclass
class Program:
    name: str                   # decode | prefill
    samples: list[Sample]       # forwards with the program's sequence, in capture order
    left_out: dict = field(default_factory=dict)   # forward -> why
    batched: bool = False       # the capture serves several sequences per step: a `seqs` var exists
    kind: str = ""              # decode | prefill (`name` is the kind, or the kind and its range of sequences)
    seen: tuple = (1, 1)        # the sequences the program's serving steps were seen at (lowest, highest)

    def __post_init__(self):
        self.kind = self.kind or self.name

    @property
    def var(self) -> str:
        """The var this program's sizes follow: a batched decode's rows are its sequences (one token
        each), so it is sized by `seqs`; every other program by `rows` (the tokens)."""
        return "seqs" if self.batched and self.kind == "decode" else "rows"

    def size(self, s: "Sample") -> int:
        """A sample's value of the program's var (`var`)."""
        return s.seqs if self.var == "seqs" else s.tokens

    @property
    def rep(self) -> Sample:
        """The sample the buffers are laid out from: the most tokens (ties: the first serving one)."""
        return max(self.samples, key=lambda s: (s.tokens, s.phase == "serve", -s.forward))


def _seqs(f) -> list[int]:
    return [s for first, n in f.seqs for s in range(first, first + n)]


def device_staging(dump, doc: AnalysisDoc, fwds, launches: dict[int, Launch]) -> set[int]:
    """Launches that stage inputs on the device, by measured data flow (`doc.flow`): no host memory
    of their own, every word measured, and every word they read host data -- an address a
    host-reading launch or another staging launch passed, or inside a host copy made once the
    forwards began (weights are copied in before the first), and not written by a model launch
    since. vLLM 0.26's model runner turns the per-request tables its host staging writes into
    positions, sequence lengths and slots this way (`_prepare_pos_seq_lens_kernel`,
    `_compute_slot_mappings_kernel`): left in a program, its inputs would be the engine's own
    tables, which no kern fill names; left out, their outputs are the program's inputs. The
    embedding reads its table, which is no host data, so it stays. Without flow: none (the words
    alone cannot tell a table being read from one being written)."""
    if not doc.flow:
        return set()
    flow = {(w.site, w.i, w.at): w.direction for w in doc.flow}
    walk = sorted(fwds, key=lambda f: f.first_seq)
    begin = walk[0].first_seq if walk else 0
    C = getattr(dump, "copies", None)
    copies = []
    ranges: list[tuple[int, int, int]] = []   # (dst, end, seq) of the copies applied so far
    if C is not None and len(C):
        ok = ((C["result"] == 0) & ~C["in_graph"].astype(bool) & (C["size"] > 0)).to_numpy()
        late = ok & (C["seq_before"] >= begin).to_numpy()
        copies = sorted(zip(C["seq_before"].to_numpy("int64")[late].tolist(), C["dst"].to_numpy("uint64")[late].tolist(),
                            C["size"].to_numpy("int64")[late].tolist()))
        ranges = start_tables(C[ok & ~late], allocations(dump))
    since: dict[int, int] = {}        # address -> seq from which it holds host data
    killed: dict[int, int] = {}       # address -> the last seq a model launch wrote it
    at = 0
    out: set[int] = set()

    def hostdata(v: int) -> bool:
        k = killed.get(v, -1)
        return since.get(v, -1) > k or any(a <= v < e and t > k for a, e, t in ranges)

    for f in walk:
        occ: dict[str, int] = {}
        for seq in _seqs(f):
            while at < len(copies) and copies[at][0] <= seq:
                t, dst, n = copies[at]
                ranges.append((int(dst), int(dst) + int(n), int(t)))
                at += 1
            x = launches.get(seq)
            if x is None:
                continue
            k = occ.get(x.symbol, 0)
            occ[x.symbol] = k + 1
            if x.host_words and not externs.is_library(x.symbol):
                since.update((w.value, seq) for w in x.words)
                continue
            dirs = [flow.get((site_name(x.symbol, k), w.i, w.at)) for w in x.words]
            reads = [w.value for w, d in zip(x.words, dirs) if d in ("in", "inout")]
            if (not externs.is_library(x.symbol) and x.words and None not in dirs and reads
                    and all(hostdata(v) for v in reads)):
                out.add(seq)
                since.update((w.value, seq) for w in x.words)
                continue
            for w, d in zip(x.words, dirs):
                if d in ("out", "inout") or (d is None and externs.is_library(x.symbol)):
                    killed[w.value] = seq
    return out


SMALL = 1 << 23    # below the bits of any normal fp32 or bf16 value (their exponent's lowest bit)


def is_table(data: bytes | None, allocs: list[tuple[int, int]]) -> bool:
    """Whether copied bytes are a table the engine's host wrote for its own kernels: whole 4-byte
    words, not all zero, each 4-byte word below SMALL (i32 strides, sizes, counts) or each 8-byte
    word an address inside a captured allocation or an integer below SMALL (buffer addresses). Model data never reads so: a word of fp32 or of bf16 values holds
    an exponent, and any normal value sets a bit at or above SMALL."""
    if data is None or len(data) == 0 or len(data) % 4:
        return False
    raw = bytes(data)
    if not any(raw):
        return False
    if (np.frombuffer(raw, "<u4") < np.uint32(SMALL)).all():
        return True                     # i32 counts, sizes, strides
    if len(raw) % 8:
        return False
    v = np.frombuffer(raw, "<u8")
    small = v < np.uint64(SMALL)
    if small.all():
        return True
    if not allocs:
        return False
    b = np.array([a for a, _ in allocs], np.uint64)
    e = b + np.array([n for _, n in allocs], np.uint64)
    j = np.searchsorted(b, v[~small], side="right") - 1
    return bool(((j >= 0) & (v[~small] < e[np.maximum(j, 0)])).all())


def start_tables(copies, allocs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(dst, end, seq) of the copies made before the forwards began that still hold a host table
    (`is_table`) when they begin: a later copy of other bytes over one ends it. Why: vLLM 0.26's
    model runner copies the addresses and strides of its block tables in once at start-up
    (`_compute_slot_mappings_kernel` reads them every step); those are host data as much as the
    per-step copies, while the weights copied in before the forwards are not tables."""
    out: list[tuple[int, int, int]] = []
    if copies is None or not len(copies):
        return out
    rows = sorted(zip(copies["seq_before"].to_numpy("int64").tolist(), copies["dst"].to_numpy("uint64").tolist(),
                      copies["size"].to_numpy("int64").tolist(), copies["has_bytes"].astype(bool).tolist(),
                      copies["data"].tolist()), key=lambda r: r[0])
    for seq, dst, n, has, data in rows:
        lo, hi = int(dst), int(dst) + int(n)
        out = [r for r in out if r[1] <= lo or hi <= r[0]]
        if has and is_table(data, allocs):
            out.append((lo, hi, int(seq)))
    return out


def _steps(f, launches: dict[int, Launch], staged: frozenset = frozenset()) -> tuple[list[Step], list[Launch]]:
    steps, staging, occ = [], [], {}
    for seq in _seqs(f):
        x = launches[seq]
        k = occ.get(x.symbol, 0)
        occ[x.symbol] = k + 1
        x.site = site_name(x.symbol, k)
        if externs.is_aux(x.symbol):
            if not steps or steps[-1].gemm is None or steps[-1].aux is not None:
                raise CompileError(f"forward {f.forward}: cuBLASLt's split-K reduction (launch seq {seq}) follows no "
                                   f"GEMM launch, so its GEMM cannot be read")
            st = steps[-1]
            st.aux = x
            st.gemm = _gemm(f, st.launch, x)
            continue
        if (x.host_words or x.seq in staged) and not externs.is_library(x.symbol):
            x.pos = len(steps)
            staging.append(x)
            continue
        if externs.is_main(x.symbol):
            steps.append(Step(x, None, _gemm(f, x, None)))
        else:
            steps.append(Step(x))
    return steps, staging


def _gemm(f, main: Launch, aux: Launch | None) -> externs.Gemm:
    try:
        return externs.read_gemm(main, aux)
    except externs.GemmError as exc:
        raise CompileError(f"forward {f.forward}: the cuBLASLt launch {main.symbol} (seq {main.seq}, call site "
                           f"{main.site}) {exc}") from None


def cut_at_logits(steps: list[Step], vocab: int | None) -> tuple[list[Step], list[Step]]:
    """(the steps through the forward's last GEMM of `vocab` output columns, the steps after it).

    Why: a language model's forward ends at its logits, the [rows, vocab] product of the last
    hidden states and the LM head; what an engine launches after it (sampling, log-probabilities,
    top-k, penalties) turns the logits into its own choice of the next token, which is the
    serving loop's business, not the model's (kern's host reads the logits). The vocabulary size
    is the checkpoint's (`--config`); without it, or with no such GEMM, nothing is cut."""
    if not vocab:
        return steps, []
    last = max((k for k, st in enumerate(steps) if st.gemm is not None and st.gemm.n == vocab), default=None)
    if last is None:
        return steps, []
    return steps[:last + 1], steps[last + 1:]


def end_at_state(progs: list[Program], all_uses: dict, decisions: dict) -> list[str]:
    """Cut each multi-row (prefill) program after its last call that touches a state, in place;
    returns a note per cut. Why: a serving loop on kern prefills a prompt but its last token and
    takes that token's logits from the decode program (compare.host, the examples), so what a
    prefill forward computes after its last KV access only feeds the engine's own sampling of
    the prompt's last row -- and it reads what no kern fill holds (vLLM's logits_indices, the
    last row of each sequence). `all_uses`, `decisions`: compiler.buffers.classify's (program ->
    [Use], address -> Decision), to see which calls touch a state before any layout is made."""
    notes = []
    for p in progs:
        if getattr(p, "kind", p.name) != "prefill":
            continue
        touched = [u.step for u in all_uses[p.name]
                   if u.value in decisions and decisions[u.value].kind == "state"]
        if not touched or max(touched) >= len(p.rep.steps) - 1:
            continue
        keep = max(touched) + 1
        for s in p.samples:
            s.tail = [x for st in s.steps[keep:] for x in (st.launch, st.aux) if x is not None] + s.tail
            s.steps = s.steps[:keep]
        notes.append(f"{p.name}: each forward ends at its last state access (call {keep - 1}); the "
                     f"{len(p.rep.tail)} launches after it feed only the prompt's own logits, which the serving "
                     f"loop takes from decode")
    return notes


def step_seqs(doc: AnalysisDoc) -> dict[int, int | None] | None:
    """forward -> the sequences its step serves, from the analysis' `forward_vars` (None where a
    forward has no measured value); None for a capture without a `seqs` variable (one sequence
    per step: every forward serves 1)."""
    fv = doc.forward_vars
    if fv is None or "seqs" not in fv.names:
        return None
    return {r.forward: r.seqs for r in fv.forwards}


def kind_of(tokens: int, seqs: int) -> str:
    """A step's kind: `decode` when every sequence feeds one token (tokens == seqs), else
    `prefill` (a prompt, packed prompts, or prompts mixed with decodes). Why by kind and not by
    token count: a batched decode of 7 sequences is 7 tokens, and runs decode's kernels (vLLM's
    and SGLang's attention switch to their decode paths), not a 7-token prompt's."""
    return "decode" if tokens == seqs else "prefill"


def programs(dump, doc: AnalysisDoc, vocab: int | None = None) -> tuple[list[Program], list[str]]:
    """The decode and prefill programs of the capture, and notes on what was left out (`vocab`:
    the checkpoint's vocabulary size: each forward ends at its logits, `cut_at_logits`). A step
    is decode or prefill by `kind_of` over its tokens and sequences (`step_seqs`); in a capture
    without a `seqs` variable every step serves one sequence, so decode is the one-token step."""
    fwds = [f for f in doc.passes.forwards if f.tokens is not None and f.tokens >= 1]
    per = step_seqs(doc)
    unknown = []
    if per is not None:
        unknown = [f.forward for f in fwds if per.get(f.forward) is None]
        fwds = [f for f in fwds if per.get(f.forward) is not None]
    seqs_of = (lambda f: 1) if per is None else (lambda f: int(per[f.forward]))
    if not [f for f in fwds if f.phase == "serve"]:
        raise CompileError("the analysis finds no serving forward with a token count, so there is no step to "
                           "compile (run `mine analyze` on the capture to see its forwards)")
    launches = read_launches(dump, [s for f in fwds for s in _seqs(f)])
    missing = [s for f in fwds for s in _seqs(f) if s not in launches]
    if missing:
        raise CompileError(f"the analysis names launch seq {missing[0]}, which the dump does not hold "
                           f"(an analysis of another capture?)")
    out, notes = [], []
    staged = frozenset(device_staging(dump, doc, fwds, launches))
    if staged:
        notes.append(f"{len(staged)} launches stage inputs on the device (measured flow: they read only host data) "
                     "and are left out like host staging")
    if unknown:
        notes.append(f"{len(unknown)} forward(s) show no sequence count (forwards {unknown[:8]}), so their step "
                     f"kind is unknown: left out of every program")
    ops = device_ops.placed(dump)
    cap = device_ops.capture_ids(dump, [s for f in fwds for s in _seqs(f)])
    notes += device_ops.graph_gaps(dump, of_dump(dump), {c for c in cap.values() if c >= 0})
    flowd = {(w.site, w.i, w.at): w.direction for w in (doc.flow or [])}
    allocs = allocations(dump) if ops else []
    for name in ("decode", "prefill"):
        kind = [f for f in fwds if kind_of(int(f.tokens), seqs_of(f)) == name]
        if not kind:
            continue
        samples = {}
        op_notes: list[str] = []
        for f in kind:
            # fresh Launch objects per forward: a record replayed in several forwards is a
            # different call site in each
            own = {s: _copy(launches[s]) for s in _seqs(f)}
            refused: dict[int, str] = {}
            if ops:
                order = _seqs(f)
                own, dn, refused = device_ops.apply(f, order, own, device_ops.positions(order, cap, ops), flowd, allocs)
                op_notes += [n for n in dn if n not in op_notes]
            steps, staging = _steps(f, own, staged)
            steps, tail = cut_at_logits(steps, vocab)
            kept = [x.seq for st in steps for x in (st.launch, st.aux) if x is not None]
            bad = next((refused[q] for q in kept if q in refused), None)
            if bad is not None:
                raise CompileError(bad)
            if refused:
                n = ("launches after the logits read bytes a memset cleared or a copy left behind its changed "
                     "source (a sampler's own scratch); the program ends before them")
                op_notes += [n] if n not in op_notes else []
            samples[f.forward] = Sample(f.forward, f.phase, int(f.tokens), steps, staging, [st.launch for st in tail],
                                        seqs_of(f))
        notes += [f"{name} forwards: {n}" for n in op_notes]
        serve = Counter(tuple(st.key for st in samples[f.forward].steps) for f in kind if f.phase == "serve")
        if not serve:
            notes.append(f"no {name} program: the {name} forwards are all start-up passes")
            continue
        key = lambda s: tuple(st.key for st in s.steps)
        sigs = _buckets(serve, [samples[f.forward] for f in kind if f.phase == "serve"], key, per is not None)
        progs_k = []
        for sig, lo, hi in sigs:
            pname = name if len(sigs) == 1 else f"{name}_s{lo}" + (f"_{hi}" if hi != lo else "")
            progs_k.append(Program(pname, [], batched=per is not None, kind=name, seen=(lo, hi)))
        others = []
        for f in kind:
            s = samples[f.forward]
            hit = [p for p, (sig, _, _) in zip(progs_k, sigs) if key(s) == sig]
            if hit:
                hit[0].samples.append(s)
            else:
                others.append(s)
        joined = {p.name: 0 for p in progs_k}
        for s in others:
            whys = []
            for prog in progs_k:
                why = _join(prog, s)
                if why is None:
                    joined[prog.name] += 1
                    break
                whys.append(why)
            else:
                sig, n = sigs[0][0], serve[sigs[0][0]]
                progs_k[0].left_out[s.forward] = next((w for w in whys if w), "") or (
                    f"its {len(s.steps)} calls are not the {len(sig)}-call sequence {n} serving {name} forward(s) "
                    f"share" + (f" (nor that of any of the {len(sigs)} {name} programs, one per range of sequences)"
                                if len(sigs) > 1 else ""))
        if len(sigs) > 1:
            notes.append(f"{name}: {len(sigs)} programs, one per call sequence the serving {name} steps take over "
                         f"disjoint ranges of sequences ("
                         + ", ".join(f"{p.name}: sequences {p.seen[0]}..{p.seen[1]}" for p in progs_k)
                         + "); a step of n sequences runs the program of the smallest range whose top is >= n "
                           "(the engine switched kernels between the ranges; where exactly the capture does not show)")
        for prog in progs_k:
            prog.samples.sort(key=lambda s: s.forward)
            pn = prog.name
            if joined[pn]:
                notes.append(f"{pn}: {joined[pn]} forward(s) of another module or entry at some calls (the same "
                             f"parameters) joined the program; those calls launch by row range (compiler.builds)")
            cut = {len(s.tail) for s in prog.samples}
            if vocab and cut != {0}:
                notes.append(f"{pn}: each forward ends at its logits (the last GEMM of {vocab} columns, the "
                             f"vocabulary); the {'/'.join(map(str, sorted(cut)))} launches after it (the engine's "
                             f"sampling) are left out")
            elif vocab:
                notes.append(f"{pn}: no GEMM of {vocab} output columns (the vocabulary): the program keeps every "
                             f"launch to the forward's end")
            if not prog.rep.steps:
                raise CompileError(f"every launch of the {pn} forwards reads host memory; nothing is left to compile")
            out.append(prog)
            if prog.left_out:
                notes.append(f"{pn}: {len(prog.left_out)} forward(s) left out for another call sequence "
                             f"(forwards {sorted(prog.left_out)[:8]})")
    return out, notes


def _buckets(serve: Counter, samples: list, key, batched: bool) -> list[tuple]:
    """(call sequence, lowest, highest sequences) of each program of one step kind. One sequence per
    step (no `seqs` var): the sequence most serving forwards share, alone. Batched: a batched
    engine switches kernels by the batch (vLLM's attention splits its KV reduction below some
    batch size; Triton specialises an argument equal to 1; ATen gathers one row another way), so
    the call sequence most serving steps share keeps its place and every other sequence that two
    or more serving steps share becomes a program too when the sequences it was seen at form a
    range that overlaps no program's taken before it (most steps first). A sequence seen once, or
    inside another's range (a step the analysis cut apart wrongly), is no program: its forwards
    are left out. Ordered by range."""
    order = serve.most_common()
    if not batched:
        return [(order[0][0], 1, 1)]
    seen: dict = {}
    for s in samples:
        seen.setdefault(key(s), []).append(s.seqs)
    taken = []
    for sig, n in order:
        lo, hi = min(seen[sig]), max(seen[sig])
        if taken and (n < 2 or any(lo <= b and a <= hi for _, a, b in taken)):
            continue
        taken.append((sig, lo, hi))
    return sorted(taken, key=lambda t: t[1])


def _abi(x: Launch) -> tuple:
    return (tuple(p.size for p in x.params), tuple(sorted((w.i, w.at) for w in x.words)))


def _join(prog: Program, s: Sample) -> str | None:
    """Add `s` to the program where its calls differ from the program's only by kernel builds
    (another module or entry with the same parameters) that follow the rows (compiler.builds):
    None when joined, else why not ("" for a plainly other sequence)."""
    base = prog.samples[0].steps
    if len(s.steps) != len(base):
        return ""
    diff = [k for k, (a, b) in enumerate(zip(s.steps, base)) if a.key != b.key]
    if any(s.steps[k].gemm is not None or base[k].gemm is not None or _abi(s.steps[k].launch) != _abi(base[k].launch)
           for k in diff):
        return ""
    tokens = [prog.size(x) for x in prog.samples] + [prog.size(s)]
    for k in diff:
        keys = [x.steps[k].key for x in prog.samples] + [s.steps[k].key]
        if not builds.separable(tokens, keys):
            mine, theirs = s.steps[k].launch, base[k].launch
            return (f"its call {k} launches {mine.symbol[:60]} (module {mine.sha256[:12]}) at {prog.size(s)} "
                    f"{'sequences' if prog.var == 'seqs' else 'rows'}, where "
                    f"the program's forwards launch module {theirs.sha256[:12]}: no one row threshold separates the "
                    f"builds (compiler.builds)")
    prog.samples.append(s)
    return None


def _copy(x: Launch) -> Launch:
    return Launch(x.seq, x.symbol, x.sha256, x.grid, x.block, x.smem, x.params, x.words, x.host_words)
