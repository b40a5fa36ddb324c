"""Buffers, states and inputs from the pointer words of a program's calls, and each word's direction.

Every pointer word of a call is an address in a device allocation. What the address holds is
decided per address, from evidence in this order (each decision records what it rests on in the
provenance, `Decision.because`):

1. **state** -- the analysis calls the word `kv_pool` (same address in every forward, one per
   layer, shared by two kernels of the layer, a large region), or the address is one in every
   forward, only one layer's calls use it, the same kernel word of another layer holds another,
   and a call writes it: memory that persists across forwards
   and is written at positions (KV pages; a small cache shares its allocation with activations, so
   the region rule misses it). One fixed-size state per allocation, the allocation's size; calls
   pass it at the word's offset.
2. **input** -- a host-staging launch (compiler.launches) touches the address: the host's data
   arrives there before the forward; or the address's first use in the program is a measured read
   (replay flow) that nothing earlier in the program wrote. Written later by a call: kind `inout`.
3. **weight** -- the address is the same in every forward (analysis pointer records), no evidence
   shows a write to it (measured `out`/`inout`, a GEMM's output), no GEMM reads it as its
   activation operand x, and the analysis calls it a
   `weight` (different per layer) or a measured read / GEMM operand only touches it.
4. **workspace** -- everything else: the forward's activations. One buffer per allocation, laid
   out exactly as the engine laid it out (its offsets are the engine's liveness-based reuse), from
   the lowest word to the highest word's extent.
5. **output** -- the last range the program writes (direction `out`) that no later call reads
   (the writing call's own other words at the address do not count): the last buffer written, a
   buffer of its own.

Directions: measured (`flow`, replay/flow.py) when `in`/`out`/`inout`; a GEMM's operands `in` and
its output `out`; otherwise from the class -- weights and inputs `in`, states `inout`, and a
workspace word `out` when no earlier call of the program wrote its bytes, `inout` after. A
measured `unused` of a launch replayed alone (data-dependent kernels such as attention, on
small-integer fills) is not trusted: the class decides, and the provenance says so. Measured in
order on rebuilt memory (`mine replay --in-order`, flow context `in-order`), `unused` is the real
data's answer; kern has no such direction, so the word is `in` where the program already holds
its bytes (written before, or a weight, input or state) and `out` otherwise (kern refuses a read
of a buffer nothing wrote). A state measured `out` over part of its span is `inout` (the rest of
the state carries over; `vocab.analysis.kern_directions`).

Extents: a GEMM's operands and output by m, n, k; any other word reaches to the next used address
in its allocation (or the allocation's end): an upper bound, which is what a buffer needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.programs import Program
from vocab.analysis import AnalysisDoc, kern_directions
from vocab.wire import DIRECTIONS


@dataclass
class Use:
    step: int
    i: int
    at: int
    value: int
    base: int
    alloc_size: int
    direction: str = ""
    evidence: str = ""
    extent: int | None = None
    operand: str = ""        # x | w | c for a GEMM's words
    flow: object = None      # the analysis' FlowWord measured for this word, if any


@dataclass
class Decision:
    kind: str            # state | input | weight | workspace | output
    because: str


@dataclass
class Layout:
    """Where one program's words point in the manifest."""
    uses: dict = field(default_factory=dict)        # (step, i, at) -> Use
    where: dict = field(default_factory=dict)       # (step, i, at) -> (kind "buf"|"state", name, offset)
    decisions: dict = field(default_factory=dict)   # address -> Decision
    short: list = field(default_factory=list)       # workspace words whose extent may be cut short (`_grown_spans`)


@dataclass
class Decl:
    name: str
    kind: str            # weight | input | inout | workspace | output | state
    size: int            # bytes
    base: int
    lo: int              # allocation offset of the declaration's byte 0
    because: str
    dtype: str = "bf16"
    fill: str = ""           # kern's serving role of an input (compiler.input_fills), "" when unnamed
    shape: tuple = ()        # elements per dimension where known (a GEMM's output: (m, n)); else flat
    page: int | None = None  # tokens per KV page, read from a slot / blocks input's contents


def _flow(doc: AnalysisDoc) -> dict:
    return {(w.site, w.i, w.at): w for w in doc.flow}


def _stable(doc: AnalysisDoc) -> dict:
    return {(p.site, p.i, p.at): p for p in doc.pointers}


def uses(prog: Program, doc: AnalysisDoc) -> list[Use]:
    """Every pointer word of the representative forward's calls, with measured/ABI directions."""
    flow, out = _flow(doc), []
    for k, st in enumerate(prog.rep.steps):
        x = st.launch
        if st.gemm is not None:
            g = st.gemm
            for op, (i, at), d, ext in (("x", g.x, "in", g.m * g.k * 2), ("w", g.w, "in", g.n * g.k * 2),
                                        ("c", g.c, "out", g.m * g.n * 2)):
                w = x.word(i, at)
                out.append(Use(k, i, at, w.value, w.base, w.alloc_size, d, "cuBLASLt ABI", ext, op))
            continue
        for w in x.words:
            u = Use(k, w.i, w.at, w.value, w.base, w.alloc_size)
            f = flow.get((x.site, w.i, w.at))
            u.flow = f
            in_order = f is not None and f.context == "in-order"
            if f is not None and f.direction in DIRECTIONS:
                u.direction, u.evidence = f.direction, "measured in order" if in_order else "measured"
            elif in_order and f.direction == "unused":
                u.evidence = "measured unused in order (kern has no unused: the dataflow rule picks in or out)"
            elif f is not None:
                u.evidence = f"measured {f.direction}, not trusted"
            out.append(u)
    return out


def _grown_spans(p: Program, us: list, spans: dict, short: list | None = None) -> dict[int, int]:
    """address -> a workspace word's extent: its span (`_spans`), grown to what the in-order
    replay measured the launch writing there, scaled from the measured forward's rows to the
    rows of the forward the program is laid out from, and never into an address its calls use
    while it is live (`_live_spans`). Why: the span to the next address the engine used at any
    time can be a later tensor the allocator put into a freed block (vLLM's 190-row prefill: a
    k-norm output of 48,640 bytes cut to 512), and kern would then run the program's largest
    rows past the buffer's end; the measured bytes say what the call writes."""
    rows = {x.seq: s.tokens for q in [p] for s in q.samples for st in s.steps
            for x in (st.launch, st.aux) if x is not None}
    live = _live_spans(us)
    out = {}
    for u in us:
        ext = spans[u.value]
        f = u.flow
        if f is not None and f.context == "in-order" and f.written_bytes > 0 and rows.get(f.seq):
            grown = -(-f.written_bytes * p.rep.tokens // rows[f.seq])
            ext = max(ext, min(grown, live[u.value]))
        elif short is not None and u.extent is None and live[u.value] > ext:
            # cut at an address the forward uses at another time, with no measured bytes to say more
            short.append((u.step, u.value, ext))
        out[u.value] = max(out.get(u.value, 0), ext)
    return out


def _live_spans(us: list) -> dict[int, int]:
    """address -> bytes to the next address of its allocation that one program's calls use while
    it is live (between its first and last use), or to the allocation's end. Why not `_spans`: an
    engine's caching allocator hands a freed block to a later tensor at another offset (a later
    layer's small tensor 16 KB into this one's activations; another program's forwards anywhere),
    and a span to that address would cut a workspace below what its own calls write; two
    addresses live at once cannot overlap."""
    live: dict[int, list] = {}
    for u in us:
        iv = live.setdefault(u.value, [u.base, u.alloc_size, u.step, u.step])
        iv[2], iv[3] = min(iv[2], u.step), max(iv[3], u.step)
    return _to_next(live)


def _spans(all_words: list[tuple[int, int, int]]) -> dict[int, int]:
    """address -> bytes to the next used address of its allocation (or the allocation's end),
    whenever that address is used: every address counts as live all the time."""
    return _to_next({v: (base, asize, 0, 0) for v, base, asize in all_words})


def _to_next(live: dict[int, tuple]) -> dict[int, int]:
    """address -> bytes to the next higher address of its allocation whose live interval meets
    its own, or to the allocation's end. `live`: address -> (allocation base, allocation size,
    first use, last use)."""
    by: dict[int, list] = {}
    for v, (base, size, a, b) in live.items():
        by.setdefault(base, []).append((v, a, b, size))
    out = {}
    for base, vs in by.items():
        vs.sort()
        for k, (v, a, b, size) in enumerate(vs):
            nxt = next((w for w, c, d, _ in vs[k + 1:] if c <= b and a <= d), base + size)
            out[v] = nxt - v
    return out


def classify(progs: list[Program], doc: AnalysisDoc, changing: frozenset = frozenset()) -> tuple[dict, dict]:
    """(program name -> [Use], address -> Decision) over every program (weights and states are
    shared by address; inputs and workspaces are decided per program, then merged). `changing`:
    addresses whose bytes an in-order replay saw change (`vocab.contents.Contents.changing`):
    something writes them, so they are no weight, whatever no launch of the programs shows (vLLM's
    block table is written through a pointer its staging kernel loads from memory)."""
    stable = _stable(doc)
    all_uses = {p.name: uses(p, doc) for p in progs}
    # addresses a staging launch touches before the program's first use of them (input staging;
    # trailing host-reading launches -- sampling -- only read what the program wrote)
    staged = {}
    for p in progs:
        for x in p.rep.staging:
            for w in x.words:
                staged[(p.name, w.value)] = min(staged.get((p.name, w.value), 1 << 62), x.pos)
    written = {u.value for us in all_uses.values() for u in us if u.direction in ("out", "inout")}
    gemm_words = {u.value for us in all_uses.values() for u in us if u.operand}
    # a GEMM's x is its activation operand (m rows: compiler.externs): never a weight, whatever
    # role the analysis gave an address an earlier call of the layer passed it at
    not_weight = written | {u.value for us in all_uses.values() for u in us if u.operand == "x"} | set(changing)
    layer_owned = _layer_owned(progs, all_uses, stable)
    dec: dict[int, Decision] = {}
    for p in progs:
        sites = {k: st.launch.site for k, st in enumerate(p.rep.steps)}
        first: dict[int, Use] = {}
        for u in all_uses[p.name]:
            first.setdefault(u.value, u)
            rec = stable.get((sites[u.step], u.i, u.at))
            role = rec.role if rec is not None else ""
            if u.value in dec and dec[u.value].kind in ("state", "weight"):
                continue
            if u.operand == "w" and (fixed_(rec) or _same_in_samples(p, u)) and u.value not in written:
                dec[u.value] = Decision("weight", "a GEMM's weight operand (cuBLASLt ABI), one address in every "
                                                  "forward, no write seen")
                continue
            if role == "kv_pool" and u.value not in gemm_words:
                dec[u.value] = Decision("state", f"analysis role kv_pool at {sites[u.step]} param {u.i}")
                continue
            fixed = fixed_(rec)
            if fixed and u.value in layer_owned and u.value in written and u.value not in gemm_words:
                dec[u.value] = Decision("state", f"one address in every forward, used by layer "
                                                 f"{layer_owned[u.value]}'s calls only, where the same kernel "
                                                 f"of another layer passes another, and written "
                                                 f"({sites[u.step]} param {u.i}): per-layer memory a forward "
                                                 f"writes, which persists (a KV cache too small for the "
                                                 f"analysis' kv_pool region)")
                continue
            if staged.get((p.name, u.value), 1 << 62) <= first[u.value].step:
                dec.setdefault(u.value, Decision("input", "a host-staging launch of the forward touches it"))
                continue
            if fixed and u.value not in not_weight and (role == "weight" or u.direction == "in"):
                why = ("analysis role weight, one address in every forward, no write seen" if role == "weight"
                       else f"one address in every forward, only read ({u.evidence})")
                dec[u.value] = Decision("weight", why)
    return all_uses, dec


def _logits_rows(u: Use, p: Program, rows_of: dict, vocab: int | None, bound: int) -> tuple | None:
    """(rows, vocab) where the in-order replay measured the output's call writing exactly `vocab`
    bf16 values a row in a forward of any program (a decode's logits from the prefill's write:
    graph-replayed decodes are not measured one by one), and the program's rows of them fit the
    word's extent; else None. Why: a logits projection that is no cuBLASLt GEMM (a Triton kernel)
    has no m and n to read, and a host reads the output as rows over the vocabulary
    (compare.serving); a write of exactly the vocabulary per row is that, and never less than
    what the call writes at the program's rows."""
    f = u.flow
    if not vocab or f is None or f.context != "in-order" or f.written_bytes <= 0 or not rows_of.get(f.seq):
        return None
    if f.written_bytes != rows_of[f.seq] * vocab * 2 or p.rep.tokens * vocab * 2 > bound:
        return None
    return (p.rep.tokens, vocab)


def _layer_owned(progs: list[Program], all_uses: dict, stable: dict) -> dict[int, int]:
    """address -> layer, for addresses every use of which is a call of one layer, where the same
    kernel's same word in another layer holds another address that layer alone uses. Why: that is
    per-layer memory (a layer's weights, its KV cache); the activations an engine passes through
    every layer are used by several. Keyed by kernel symbol and word, not by the analysis' position
    in the layer block, so a stack of layers of two kinds cannot mix them."""
    layers: dict[int, set] = {}
    by_word: dict[tuple, set] = {}
    for p in progs:
        for u in all_uses[p.name]:
            st = p.rep.steps[u.step]
            rec = stable.get((st.launch.site, u.i, u.at))
            layer = rec.layer if rec is not None and rec.layer is not None and rec.layer >= 0 else -1
            layers.setdefault(u.value, set()).add(layer)
            by_word.setdefault((st.launch.symbol, u.i, u.at), set()).add(u.value)
    one = {a: next(iter(ls)) for a, ls in layers.items() if len(ls) == 1 and -1 not in ls}
    out = {}
    for addrs in by_word.values():
        mine = [a for a in addrs if a in one]
        if len({one[a] for a in mine}) >= 2:
            out.update({a: one[a] for a in mine})
    return out


def layout(progs: list[Program], doc: AnalysisDoc, changing: frozenset = frozenset(), vocab: int | None = None
           ) -> tuple[dict[str, Layout], dict[str, Decl]]:
    """Each program's Layout and the declarations (buffers and states) they share (`changing`:
    see `classify`; `vocab`: the checkpoint's vocabulary, to shape logits no GEMM wrote)."""
    all_uses, dec = classify(progs, doc, changing)
    spans = _spans([(u.value, u.base, u.alloc_size) for us in all_uses.values() for u in us]
                   + [(w.value, w.base, w.alloc_size) for p in progs for x in p.rep.staging for w in x.words])
    decls: dict[str, Decl] = {}
    named: dict[tuple, str] = {}
    layouts = {}
    # seq -> rows of its forward, over every launch a program's forwards ran (a prefill's cut
    # tail too: its logits were measured before the cut)
    rows_of = {x.seq: s.tokens for q in progs for s in q.samples
               for x in [y for st in s.steps for y in (st.launch, st.aux)] + list(s.tail) if x is not None}
    for p in progs:
        lay = Layout()
        us = all_uses[p.name]
        own = _grown_spans(p, us, spans, lay.short)
        wrote: list[tuple[int, int]] = []         # [lo, hi) addresses written so far
        ws: dict[int, list[Use]] = {}
        read_in: dict[int, int] = {}              # input address -> the widest extent read as the input
        ended: dict[int, int] = {}                # input address -> the call whose write ended the input's life
        for u in us:
            ext = u.extent if u.extent is not None else spans[u.value]
            d = dec.get(u.value)
            if d is not None and d.kind == "input":
                # an engine's allocator reuses a freed input's bytes: once a call overwrites the whole
                # input (or writes it before any read), later words there hold another value, a
                # workspace's; only an in-place update (inout) keeps it the input's
                if u.value not in ended and u.direction == "out" and ext >= read_in.get(u.value, 0):
                    ended[u.value] = u.step
                if u.value in ended:
                    d = Decision("workspace", f"the bytes of an input the program no longer needs: call "
                                              f"{ended[u.value]} overwrote them")
                else:
                    read_in[u.value] = max(read_in.get(u.value, 0), ext)
            covered = any(lo <= u.value < hi for lo, hi in wrote)
            if d is None and not covered and u.direction == "in":
                d = dec[u.value] = Decision("input", f"first used by a measured read that no earlier call wrote "
                                                     f"(call {u.step})")
            if d is None:
                d = Decision("workspace", "written in the forward before it is read" if not covered else
                             "inside a range an earlier call wrote")
            f = u.flow
            if not u.direction and f is not None and f.context == "in-order" and f.direction == "unused":
                # neither read nor written, measured on the real data: `in` where the program
                # holds the bytes already (kern refuses a read of a buffer nothing wrote), else `out`
                u.direction = "in" if covered or d.kind in ("weight", "input", "state") else "out"
                u.evidence += f"; {u.direction} ({'written before' if covered else d.kind})"
            elif not u.direction:
                u.direction = {"weight": "in", "input": "in", "state": "inout"}.get(
                    d.kind, "inout" if covered else "out")
                u.evidence = (u.evidence + "; " if u.evidence else "") + f"from the class ({d.kind})"
            elif (d.kind == "state" and u.direction == "out" and f is not None
                  and "inout" in (kern_directions(f.direction, f.written_bytes, f.span_bytes, True) or ())):
                u.direction = "inout"
                u.evidence += "; a partial write of a persistent state (the rest carries over): inout"
            if u.direction in ("out", "inout"):
                wrote.append((u.value, u.value + ext))
            lay.uses[(u.step, u.i, u.at)] = u
            lay.decisions[u.value] = d
            if d.kind == "state":
                name = named.setdefault(("state", u.base), f"state.{len([k for k in named if k[0] == 'state'])}")
                decls.setdefault(name, Decl(name, "state", u.alloc_size, u.base, 0, d.because))
                lay.where[(u.step, u.i, u.at)] = ("state", name, u.value - u.base)
            elif d.kind in ("weight", "input"):
                key = (d.kind, u.value)
                name = named.setdefault(key, f"{'w' if d.kind == 'weight' else 'in'}.{len([k for k in named if k[0] == d.kind])}")
                old = decls.get(name)
                size = max(ext, old.size if old else 0)
                kind = "inout" if (d.kind == "input" and (u.direction != "in" or (old and old.kind == "inout"))) else d.kind
                decls[name] = Decl(name, kind, size, u.base, u.value - u.base, d.because)
                lay.where[(u.step, u.i, u.at)] = ("buf", name, 0)
            else:
                ws.setdefault(u.base, []).append(u)
        # the output: what the last writing call wrote, when nothing after it reads it
        # (a read by the writing call itself -- a pointer it is passed twice, once to write --
        # is no later read: only calls after it count)
        outs = []
        read_later: set = set()
        read_here: set = set()
        for k, u in enumerate(reversed(us)):
            if k and u.step != us[len(us) - k].step:
                read_later |= read_here
                read_here = set()
            if u.direction == "out" and lay.decisions[u.value].kind == "workspace" and u.value not in read_later:
                outs = [u]
                break
            if u.direction in ("in", "inout"):
                read_here.add(u.value)
        # an allocation whose only words are the output's is no workspace (kern refuses an unused buffer)
        ws = {b: g for b, g in ws.items()
              if not (outs and all(u.value == outs[0].value and u.step >= outs[0].step for u in g))}
        for k, (base, group) in enumerate(sorted(ws.items())):
            lo = min(u.value for u in group)
            hi = max(u.value + (u.extent if u.extent is not None else own[u.value]) for u in group)
            name = f"{p.name}.ws.{k}"
            decls[name] = Decl(name, "workspace", _round(hi - lo), base, lo - base,
                               "activations of the forward, at the engine's own offsets")
            for u in group:
                lay.where[(u.step, u.i, u.at)] = ("buf", name, u.value - lo)
        for j, u in enumerate(outs[:1]):
            name = f"{p.name}.out"
            ext = u.extent if u.extent is not None else spans[u.value]
            g = p.rep.steps[u.step].gemm if u.operand == "c" else None
            shape = (g.m, g.n) if g is not None and g.m * g.n * 2 == _round(ext) else ()
            why = f"the last range the program writes (call {u.step}) that no later call reads"
            lg = _logits_rows(u, p, rows_of, vocab, ext) if g is None else None
            if lg is not None:
                shape, ext = lg, lg[0] * lg[1] * 2
                why += (f"; measured writing {lg[1]} bf16 values a row (the vocabulary): the logits, "
                        f"[{lg[0]}, {lg[1]}]")
            decls[name] = Decl(name, "output", _round(ext), u.base, u.value - u.base, why, shape=shape)
            for v in us:
                if v.value == u.value and v.step >= u.step:
                    lay.where[(v.step, v.i, v.at)] = ("buf", name, 0)
        layouts[p.name] = lay
    return layouts, decls


def _same_in_samples(p: Program, u: Use) -> bool:
    """The word holds one address in every forward of the program. Why beside `fixed_`: the
    analysis keys a word by call site, and a site whose kernel another GEMM shape also picks
    (cuBLASLt's choice per shape) collects that GEMM's addresses too; the program's own call at
    this position does not."""
    try:
        return all(s.steps[u.step].launch.word(u.i, u.at).value == u.value for s in p.samples)
    except (IndexError, KeyError, AttributeError):
        return False


def fixed_(rec) -> bool:
    """The analysis saw the word at one address in every forward it ran in."""
    return rec is not None and rec.addresses == 1 and rec.ptr_forwards == rec.forwards


def _ws(u: Use, dec: dict) -> bool:
    d = dec.get(u.value)
    return (d is None or d.kind == "workspace") and not u.direction


def _round(n: int) -> int:
    return max(16, (n + 15) // 16 * 16)
