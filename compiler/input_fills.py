"""From named arrays (compiler.inputs) to the manifest: fills on input buffers, and the report.

Why a module of its own: `compiler.inputs` says what each forward received; the manifest needs one
answer per input buffer over every forward of its program, and a person needs the evidence per
forward kind. Both are folds over the same per-forward records.

- `by_kind`: per forward kind (`decode`: every sequence of the forward's step feeds one token;
  `prefill`: some sequence feeds a prompt or chunk; without a step, the analysis' token count:
  1 decode, more prefill, none `unknown`), per destination (a copy's allocation and offset, or a
  host-reading launch's symbol and word), how many forwards named it which fill.
- `assign`: a manifest input declaration (compiler.buffers.Decl, kind `input`) takes fill F and
  dtype D when, in the program's forwards, the copies that wrote its first byte are named F as D
  by at least one `exact` or `structure` match and by no other fill; its size must hold whole D
  elements. A copy's matches describe the array at the copy's start: where the declaration's first
  byte lies k > 0 bytes into the copy, the bytes from there are matched anew (an engine's allocator
  puts a later tensor inside the block a staging copy filled; element 0 of the fill is not the
  declaration's). Otherwise it stays unnamed and the reason is recorded. A declaration of kind `inout`
  (a call writes it later) is never filled: kern puts fills on inputs only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from compiler import fills
from compiler.inputs import Array, ForwardInputs
from vocab.wire import DTYPE_BYTES

TRUSTED = ("exact", "structure")


def kind_of(fi: ForwardInputs) -> str:
    if fi.step is not None:
        return "prefill" if fi.step.prefill else "decode"
    return "unknown" if fi.tokens is None else ("decode" if fi.tokens == 1 else "prefill")


def key_of(a: Array) -> str:
    if a.source == "copy":
        return (f"copy to alloc {hex(a.alloc[0])}+{a.alloc[1]}" if a.alloc else f"copy to {hex(a.dst)}")
    if a.source == "replay":
        return (f"replayed bytes at alloc {hex(a.alloc[0])}+{a.alloc[1]}" if a.alloc else f"replayed bytes at {hex(a.dst)}")
    return f"host read by {a.where}"


@dataclass
class Entry:
    kind: str
    key: str
    forwards: int = 0
    named: Counter = field(default_factory=Counter)      # (fill, dtype, sure) -> forwards
    unnamed: Counter = field(default_factory=Counter)    # reason -> forwards
    sizes: set = field(default_factory=set)
    readers: set = field(default_factory=set)
    example: str = ""

    def to_json(self) -> dict:
        fill = self.fill()
        return {"kind": self.kind, "input": self.key, "forwards": self.forwards, "fill": fill[0] if fill else None,
                "dtype": fill[1] if fill else None, "bytes": sorted(self.sizes),
                "named": {f"{f} {d} ({s})": n for (f, d, s), n in sorted(self.named.items())},
                "unnamed": dict(sorted(self.unnamed.items())), "readers": sorted(self.readers)[:8],
                "evidence": self.example}

    def fill(self) -> tuple[str, str] | None:
        """The one trusted fill every naming forward agrees on, else None."""
        trusted = {(f, d) for (f, d, s) in self.named if s in TRUSTED}
        return trusted.pop() if len(trusted) == 1 else None


def by_kind(fwds: list[ForwardInputs]) -> list[Entry]:
    out: dict[tuple[str, str], Entry] = {}
    for fi in fwds:
        k = kind_of(fi)
        for a in fi.arrays:
            e = out.setdefault((k, key_of(a)), Entry(k, key_of(a)))
            e.forwards += 1
            e.sizes.add(a.size)
            e.readers.update(r.symbol[:60] for r in a.readers if r.seq != a.seq or a.source == "copy")
            m = a.named
            if m is None:
                e.unnamed[a.note or "no match"] += 1
            else:
                e.named[(m.fill, m.dtype, m.sure)] += 1
                if not e.example or m.sure == "exact":
                    e.example = f"forward {fi.forward}: {m.because}"
    return sorted(out.values(), key=lambda e: (e.kind, e.key))


@dataclass
class Assigned:
    name: str
    fill: str | None
    dtype: str | None
    because: str
    # how strong the evidence for the fill is, to rank two inputs of one fill in one program (merge):
    # (2,) the vocabulary's table reads it, (1, n) n arrays name it, (0, n) n forwards' weak matches agree
    strength: tuple = ()


def assign(decls: dict, progs, fwds: list[ForwardInputs], floats: frozenset = frozenset()) -> list[Assigned]:
    """Fill and dtype onto the input declarations (module docstring); returns one record per input.
    `floats`: declarations a GEMM reads or writes as a bf16 operand; an integer fill is never theirs
    (an engine's allocator put the staged integers and a float activation at one address)."""
    at = {fi.forward: fi for fi in fwds}
    out = []
    for d in decls.values():
        if d.kind not in ("input", "inout"):
            continue
        if d.name in floats:
            out.append(Assigned(d.name, None, None, "a GEMM reads it as a bf16 operand: an activation, not a "
                                                    "kern fill"))
            continue
        start = d.base + d.lo
        names: Counter = Counter()
        seen, no_bytes, unnamed = 0, 0, Counter()
        loose: list[set] = []          # per untrusted array of a known step: the fills it weakly fits
        weak: dict = {}                # (fill, dtype) -> {forward: the array's first bytes}
        pages: Counter = Counter()     # the page size P of its slot / blocks matches
        for p in progs:
            for s in p.samples:
                fi = at.get(s.forward)
                for a in (fi.arrays if fi else []):
                    if not _at(a, start):
                        continue
                    seen += 1
                    matches = _matches_at(a, start, fi)
                    m = matches[0] if matches else None
                    if m is not None and m.page and m.sure in TRUSTED:
                        pages[m.page] += 1       # a weak match's page is one of several that fit
                    if a.data is None:
                        no_bytes += 1
                    elif m is None or m.sure not in TRUSTED:
                        unnamed[_inside(a, start, matches) or a.note or f"only a {m.sure} {m.fill} match"] += 1
                        if fi.step is not None:      # without a step the bytes say nothing either way
                            loose.append({x.fill for x in matches})
                        if m is not None and m.sure == "weak" and len({x.fill for x in matches}) == 1:
                            wide = max(matches, key=lambda x: DTYPE_BYTES[x.dtype])
                            one = fi.step is not None and len(fi.step.runs) == 1
                            if len(matches) == 1 or one:
                                # several widths read one value (the bytes past it are zero): with
                                # one sequence the widest fill writes what any of those readers expects
                                off = start - a.dst
                                weak.setdefault((m.fill, wide.dtype), {})[s.forward] = a.data[off:off + DTYPE_BYTES[wide.dtype]]
                    else:
                        names[(m.fill, m.dtype)] += 1
        d.page = pages.most_common(1)[0][0] if pages else None
        agreed = _agreed(weak) if not names else None
        if agreed is not None:
            (fill, dtype), n, k = agreed
            d.fill, d.dtype = fill, dtype
            out.append(Assigned(d.name, fill, dtype, f"too few elements to tell in any one forward, but {n} of the "
                                                     f"program's forwards name it {fill} ({dtype}) and nothing else, "
                                                     f"over {k} different values", (0, n)))
            continue
        why = _why_not(d, seen, no_bytes, unnamed, names, loose)
        if why:
            out.append(Assigned(d.name, None, None, why))
            continue
        (fill, dtype), n = names.most_common(1)[0]
        d.fill, d.dtype = fill, dtype
        out.append(Assigned(d.name, fill, dtype, f"{n} array(s) at its first byte in the program's forwards "
                                                 f"are named {fill} ({dtype}); none names another fill", (1, n)))
    return out


def _matches_at(a: Array, start: int, fi: ForwardInputs) -> list:
    """The fills the array's bytes from device address `start` match: its own matches where it
    starts there; else its bytes from that offset matched anew for the forward's step (a copy's
    match names the array at its first byte, never a tensor the allocator placed further in)."""
    off = start - a.dst
    if off == 0:
        return a.matches
    if a.data is None or off >= len(a.data):
        return []
    return fills.match(a.data[off:], fi.step, fi.tokens, prefix=a.source in ("host", "replay"))


def _inside(a: Array, start: int, matches: list) -> str:
    """Why a copy's fill is not the declaration's, where it covers the declaration from inside."""
    if start == a.dst or a.named is None or a.named.sure not in TRUSTED or (matches and matches[0].sure in TRUSTED):
        return ""
    return (f"the copy covering it from {start - a.dst} bytes below its first byte holds {a.named.fill} "
            f"({a.named.dtype}) from the copy's start; its bytes from the declaration's first byte name no fill "
            f"surely")


def _at(a: Array, start: int) -> bool:
    """The array holds the bytes at device address `start`: a copy covering it, or a replayed
    word's bytes recorded at exactly that address (its span may run past the buffer)."""
    if a.source == "replay":
        return a.dst == start
    return a.source == "copy" and a.dst <= start < a.dst + a.size


AGREE = 3          # forwards whose weak matches must agree (one fill, one dtype, several values)


def _agreed(weak: dict):
    """((fill, dtype), forwards, distinct values) when the weak matches of one buffer name one fill
    in AGREE or more forwards over two or more different values, and no other; else None. Why
    enough: one token id or one position of a decode step may equal a small integer by chance; the
    same buffer following the steps' changing values forward after forward does not."""
    if len(weak) != 1:
        return None
    (key, per), = weak.items()
    k = len(set(per.values()))
    return (key, len(per), k) if len(per) >= AGREE and k >= 2 else None


def _why_not(d, seen: int, no_bytes: int, unnamed: Counter, names: Counter, loose: list[set]) -> str:
    if not seen:
        return "no host-to-device copy of the program's forwards writes it (staged on the device, or no copy log)"
    if len(names) > 1:
        return "its copies are named differently in different forwards: " + ", ".join(
            f"{f} {t} x{n}" for (f, t), n in names.most_common())
    if not names:
        parts = ([f"{no_bytes} copy(ies) without kept bytes (over MINE_CAPTURE_COPY_BYTES)"] if no_bytes else [])
        parts += [f"{why} (x{n})" for why, n in unnamed.most_common(2)]
        return "not named: " + "; ".join(parts)
    (fill, dtype), n = names.most_common(1)[0]
    other = sum(1 for fits in loose if fill not in fits)   # bytes of a known step the fill does not fit
    if other > n:
        # an engine's allocator reuses the address: what the named copy held is one tensor's, the
        # other forwards' bytes there are another's
        return (f"only {n} of {n + other} arrays at its first byte name {fill}; the others name nothing of it "
                f"(the engine puts other data at this address in other forwards)")
    if d.kind == "inout":
        return f"its copies hold {fill}, but a call writes it later (kind inout): kern puts a fill on an input only"
    if d.size % DTYPE_BYTES[dtype]:
        return f"its copies hold {fill} as {dtype}, but its {d.size} bytes are no whole number of {dtype} elements"
    return ""


def lines(entries: list[Entry], assigned: list[Assigned] | None = None) -> list[str]:
    """The report `mine compile --explain-inputs` prints."""
    out = []
    for kind in sorted({e.kind for e in entries}):
        out.append(f"{kind}:")
        for e in (x for x in entries if x.kind == kind):
            f = e.fill()
            named = ", ".join(f"{fl} {d} ({s}) x{n}" for (fl, d, s), n in e.named.most_common())
            head = f"  {e.key} [{'/'.join(str(s) for s in sorted(e.sizes))} B, {e.forwards} forward(s)]"
            out.append(f"{head}: {f[0] + ' ' + f[1] if f else 'unnamed'}" + (f"; matches {named}" if named else ""))
            if e.example:
                out.append(f"      evidence: {e.example}")
            for why, n in e.unnamed.most_common(2):
                out.append(f"      not named in {n} forward(s): {why}")
    if assigned is not None:
        out.append("manifest inputs:")
        out += [f"  {a.name}: {a.fill + ' ' + a.dtype if a.fill else 'no fill'} -- {a.because}" for a in assigned]
    return out


def merge(decls: dict, layouts: dict, assigned: list[Assigned]) -> list[str]:
    """One input per fill, named for it: the programs' inputs of one fill (decode's token ids and
    prefill's sit at different engine addresses) become one declaration, as large as the largest,
    which every program's calls address. Why: kern's host writes an input by its fill, whichever
    program runs next; two buffers of one fill would leave one of them stale. Where one program
    addresses several of them, the fill names different arrays of that program and a host writes a
    fill once: `_strongest` keeps one of them first."""
    notes = []
    by_fill: dict[str, list[str]] = {}
    for name, d in decls.items():
        if d.kind == "input" and d.fill:
            by_fill.setdefault(d.fill, []).append(name)
    rename: dict[str, str] = {}
    byname = {a.name: a for a in assigned}
    for fill, names in sorted(by_fill.items()):
        names = _strongest(fill, names, decls, layouts, byname, notes)
        if not names or (fill in decls and fill not in names):
            continue            # none kept, or the name is taken (never by the compiler's own names today)
        keep = max(names, key=lambda n: decls[n].size)
        d = decls[keep]
        d.size = max(decls[n].size for n in names)
        for n in names:
            rename[n] = fill
        decls[fill] = d
        for n in names:
            if n != fill:
                decls.pop(n, None)
        d.name = fill
        if len(names) > 1:
            notes.append(f"inputs {', '.join(names)} of the programs all read as {fill}: one buffer `{fill}`")
    for lay in layouts.values():
        for key, (kind, n, off) in list(lay.where.items()):
            if n in rename:
                lay.where[key] = (kind, rename[n], off)
    for a in assigned:
        a.name = rename.get(a.name, a.name)
    return notes


def _strongest(fill: str, names: list[str], decls: dict, layouts: dict, byname: dict, notes: list) -> list[str]:
    """The inputs of `fill` that keep it: where one program addresses several, the one with the
    strongest evidence (`Assigned.strength`: what the program does with it, then how many arrays
    name it); the others go back to unnamed, with a note and their reason. Evidence of equal
    strength decides nothing: all of them go. Why not keep them all: kern fills an input by its
    fill, so two of one fill are refused (compare.serving), and one of them holds something else
    (vLLM's logits_indices inside the block a copy of the prompt's ids filled)."""
    odd = {n for lay in layouts.values() for kind, n, off in lay.where.values() if kind == "buf" and off % 2}
    for p, lay in sorted(layouts.items()):
        used = sorted({n for kind, n, _ in lay.where.values() if n in names},
                      key=lambda n: byname[n].strength, reverse=True)
        if len(used) < 2:
            continue
        best = byname[used[0]]
        tie = byname[used[1]].strength == best.strength
        drop = used if tie else used[1:]
        for n in drop:
            # what an unnamed input is (compile._dtypes): bf16, or bytes where a size or offset is odd
            decls[n].fill, decls[n].dtype = "", ("u8" if decls[n].size % 2 or n in odd else "bf16")
            a = byname[n]
            a.fill = a.dtype = None
            a.because = (f"its bytes name it {fill}, but program {p} also addresses "
                         f"{', '.join(x for x in used if x != n)} as {fill}, "
                         + ("on evidence as strong: none keeps the fill" if tie else
                            f"on stronger evidence ({best.because})") + f"; was: {a.because}")
        notes.append(f"inputs {', '.join(sorted(used))} all read as {fill} in program {p}: "
                     + (f"their evidence is equally strong, so none is named {fill}" if tie else
                        f"{used[0]} keeps the fill (strongest evidence), {', '.join(used[1:])} left unnamed"))
        names = [n for n in names if n not in drop]
    return names


def by_vocabulary(decls: dict, layouts: dict, progs, fwds: list[ForwardInputs], vocab: int,
                  assigned: list[Assigned], floats: frozenset = frozenset()) -> list[str]:
    """The token input by what it indexes, with the config's vocabulary size V: the table of V
    rows (the LM head's weight W, or a weight of V x k elements for its k), gathered by the
    first call of a program that reads it, whose only input word is the rows' index: kern's
    `token`. Why: a decode's token ids are the previous step's sampled ids, which an engine
    stages on the device and an in-order replay cannot recompute (the sampler's choice among a
    flat model's near-equal logits), so no bytes name them; what they index does. The dtype is
    what the bytes at its first byte read as in every forward that has them: int64 where each
    8-byte element is below V (more than one token), else int32; none known: unnamed. A
    declaration some program passes a GEMM as an operand (`floats`) is an activation there, never
    token ids (an engine's allocator puts both at one address in different steps)."""
    notes = []
    heads = [(p, st.gemm) for p in progs for st in p.rep.steps[-1:] if st.gemm is not None and st.gemm.n == vocab]
    if not heads:
        return notes
    k = heads[0][1].k
    tables = {n for n, d in decls.items() if d.kind == "weight" and d.size == vocab * k * 2}
    for p, g in heads:
        lay = layouts[p.name]
        w = lay.where.get((len(p.rep.steps) - 1,) + g.w)
        if w is not None:
            tables.add(w[1])
    found: dict[str, str] = {}
    for p in progs:
        lay = layouts[p.name]
        for step, st in enumerate(p.rep.steps):
            if st.gemm is not None:
                continue
            names = {key[1:]: lay.where[key][1] for key in lay.where if key[0] == step}
            if not any(n in tables for n in names.values()):
                continue
            ins = {n for n in names.values() if n in decls and decls[n].kind == "input" and n not in floats}
            if len(ins) == 1:
                found[ins.pop()] = f"{p.name} call {step} ({st.launch.site})"
            break
    byname = {a.name: a for a in assigned}
    at = {fi.forward: fi for fi in fwds}
    for name, where in sorted(found.items()):
        d = decls[name]
        if d.fill and d.fill != "token":
            notes.append(f"input {name} indexes the vocabulary table at {where} but its bytes name it {d.fill}: "
                         f"left as the bytes say")
            continue
        dtype = _index_dtype(d, progs, at, vocab)
        if dtype is None:
            notes.append(f"input {name} indexes the vocabulary table at {where}; no bytes tell its integer width: "
                         f"unnamed")
            continue
        d.fill, d.dtype = "token", dtype
        why = (f"the only input of {where}, the first call reading the vocabulary's {vocab}-row table; its bytes "
               f"read as {dtype} ids below {vocab} in every forward that has them")
        if name in byname:
            a = byname[name]
            a.fill, a.dtype, a.because, a.strength = "token", dtype, why, (2,)
        else:
            assigned.append(Assigned(name, "token", dtype, why, (2,)))
    return notes


def _index_dtype(d, progs, at: dict, vocab: int) -> str | None:
    start = d.base + d.lo
    ok = {"i64": True, "i32": True}
    wide = False
    for p in progs:
        for s in p.samples:
            fi = at.get(s.forward)
            rows = s.tokens
            for a in (fi.arrays if fi else []):
                if a.data is None or not _at(a, start):
                    continue
                raw = a.data[start - a.dst:]
                for dt, size in (("i64", 8), ("i32", 4)):
                    n = min(rows, len(raw) // size)
                    v = np.frombuffer(raw[:n * size], "<i8" if size == 8 else "<i4")
                    if n == 0 or (v < 0).any() or (v >= vocab).any():
                        ok[dt] = False
                wide = wide or rows > 1
    if ok["i64"] and wide:
        return "i64"
    if ok["i32"] and not ok["i64"]:
        return "i32"
    return None
