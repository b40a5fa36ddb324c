"""Expressions for every grid axis and integer the program's launches take, fitted over its forwards.

A program's samples (compiler.programs: forwards of one call sequence) give, per call and field,
one value per forward and the forward's token count. A field the same in every sample is a
constant; one that differs is fitted by `mining.fit.fit` (the manifest's closed set) in the
token count, which is the program's `rows` var. Where several forms fit the samples, the analysis'
fit of the same call site over all of the capture's forwards decides when it is one of them
(`vocab.analysis` fits), else the bare `rows` when it is one of them (the simplest form; noted);
otherwise the compiler refuses with one sentence naming the call site and the field -- the
capture does not pin the function.

Indeterminate bytes: by-value structs carry padding, and an empty C++ struct passes one byte of
whatever the stack held, so a struct lane (or a one-byte param) that follows nothing, and any
field the analysis also finds no function for over every forward of its site, is taken from the
representative forward and listed in the notes -- never silently. A field that varies between
forwards of one token count and that the analysis fits with the context (`ctx`) is refused.

Sequences: a batched capture's analysis has a `seqs` variable (its `forward_vars`), and its programs
are batched (compiler.programs). A batched decode has tokens == seqs in every sample, so its fields
are fitted in `seqs` alone (a form in the tokens is the same function there); a prefill's over the
tokens (`rows`) and the sequences (`seqs`) together (`mining.fit`'s two-variable forms). Forms the
samples leave open that compute the same value at every (rows, seqs) the program serves (rows up
to its representative's tokens, seqs up to min(rows, its `batch.groups`); decode: seqs up to its
groups) are one function for kern: the analysis' fit over every forward of the site is written when
it is one of them (evidenced wider), else the simplest, and the note says so. Where they differ
there, the analysis' fit decides when it is among them; else the program is refused with one
sentence naming the field and the candidate forms (compiler.compile leaves a batched program out on
it, errors.ProgramError). A capture without `seqs` takes the one-variable
path below, unchanged.

Fields: `grid_x|y|z`, the dynamic shared memory, and the integers a launch passes by value: a
whole scalar parameter (1, 4 or 8 bytes), or a 4-byte lane of a by-value struct (lanes that hold
pointer words are the buffers', not fitted). A decode program has one token in every sample, so
a field that still varies there depends on something else (the context) and is refused.
"""

from __future__ import annotations

import re

import numpy as np

from compiler.errors import CompileError, ProgramError
from compiler.programs import Program
from mining import fit as F
from vocab import expr as V
from vocab.analysis import AnalysisDoc

ROWS = "rows"
SEQS = "seqs"


def _wire(e, names=None) -> object:
    return V.to_wire(_rename(F._tree(e), names))


def _rename(t, names=None):
    """The fit's variable names as the manifest's vars: `tokens` (any one-variable fit's) -> `rows`
    without `names`; with it, each name mapped (a batched program: tokens -> rows, seqs -> seqs;
    a batched decode: both -> seqs)."""
    if isinstance(t, str):
        return ROWS if names is None else names[t]
    if isinstance(t, V.Expr):
        return V.Expr(t.op, _rename(t.a, names), t.b if t.op != "add" else _rename(t.b, names))
    return t


def _size(e) -> int:
    """Nodes of an expression tuple: the simpler of two equal functions is the one written."""
    t = F._tree(e)
    return sum(1 for _ in V.walk(t)) + len(V.render(t)) / 1000.0


class Fitter:
    """Per (call, field) constant or expression over one program's samples."""

    def __init__(self, prog: Program, doc: AnalysisDoc, limits: tuple[int, int] | None = None):
        """`limits`: (rows max, seqs max) of the manifest, the domain on which a batched program's
        open forms are compared (default: the program's own largest sample)."""
        self.prog = prog
        self.tokens = np.array([s.tokens for s in prog.samples], np.int64)
        self.seqs = np.array([s.seqs for s in prog.samples], np.int64)
        self.analysis = {(f.site, f.field): f for f in doc.fits}
        self.notes: list[str] = []
        self.batched = prog.batched
        self.limits = limits or (int(self.tokens.max()), int(self.seqs.max()))
        self.provenance: list[dict] = []   # per fitted field of a batched program: forms and choice
        self._numels: dict[int, list | None] = {}   # call -> its element-count scalars (`_numel_grid`)

    def value(self, step: int, field: str, values: list[int], site: str, lane: bool = False):
        """An int (constant) or a wire expression in `rows`. A value that varies where the tokens do
        not is refused when the analysis fits it with the context (`ctx`), else taken from the
        representative forward and noted (by-value structs carry indeterminate padding bytes)."""
        v = np.asarray(values, np.int64)
        if (v == v[0]).all():
            return int(v[0])
        where = f"{self.prog.name} call {step} (call site {site}), {field}"
        if self.batched:
            return self._batched(where, v, site, field, lane)
        same = [v[self.tokens == t] for t in np.unique(self.tokens)]
        a = self.analysis.get((site, field))
        ctx = a is not None and a.status == "fit" and "ctx" in (a.expr or "")
        if (lane or not ctx) and any(len(np.unique(s)) > 1 for s in same):
            rep = int(v[self.prog.samples.index(self.prog.rep)])
            self.notes.append(f"{where}: differs between forwards of one token count ({len(np.unique(v))} values) "
                              f"and no analysis fit ties it to the context (padding bytes?); forward "
                              f"{self.prog.rep.forward}'s {rep} is taken")
            return rep
        if self.prog.kind == "decode" or len(np.unique(self.tokens)) < 2:
            raise CompileError(f"{where}: takes {sorted(set(v.tolist()))[:4]} in forwards of the same token count, "
                               f"so it follows something the capture does not name as a var (the context?)")
        f = F.fit({"tokens": self.tokens}, v, piecewise=False)
        if f.status == "fit" and not _plausible(f, lane):
            f = F.Fit("no_fit", note="a fit with a negative constant, or an offset from two points in a struct")
        if f.status == "fit":
            return _wire(f.expr)
        if f.status == "underdetermined":
            a = self.analysis.get((site, field))
            if a is not None and a.status in ("fit", "piecewise") and a.expr:
                text = a.expr if a.status == "fit" else a.expr.split("tokens>1: ", 1)[-1].rstrip(")")
                if text in f.alternatives:
                    self.notes.append(f"{where}: {text}, the analysis' fit over every forward of the site, among "
                                      f"{len(f.alternatives)} forms the program's {len(v)} forwards allow")
                    return _wire(F.parse(text))
            lin = [e for e in f.alternatives if "ceil_div" not in e]
            if re.fullmatch(r"param\d+", field) and len(lin) == 1:
                # a kernel's own int scalar is an element count or a stride: the tokens times a row's
                # elements; a ceil_div form agrees with it only at the row counts the engine padded to
                self.notes.append(f"{where}: {lin[0]}, the one of {' | '.join(f.alternatives)} without a ceil_div "
                                  f"(a scalar param: an element count of whole rows)")
                return _wire(F.parse(lin[0]))
            pick = self._numel_grid(step, field, v)
            if pick is not None:
                text, why = pick
                self.notes.append(f"{where}: {text}, the launch's own element counts in blocks ({why}, its scalar "
                                  f"params), where the program's forwards allow {' | '.join(f.alternatives)}")
                return _wire(F.parse(text))
            if "tokens" in f.alternatives:
                self.notes.append(f"{where}: `rows` itself, the simplest of {' | '.join(f.alternatives)} that the "
                                  f"program's forwards at {sorted(set(self.tokens.tolist()))} tokens allow")
                return ROWS
            raise CompileError(f"{where}: the program's forwards at {sorted(set(self.tokens.tolist()))} tokens allow "
                               f"{' or '.join(f.alternatives)}; the capture does not pin which")
        if lane or (a is not None and a.status == "no_fit" and not field.startswith("grid")):
            # a grid that follows no form of the tokens is never taken from one forward: kern would
            # launch that forward's blocks at every row count (vLLM's compiled prefill attention
            # counts the unpadded tokens, its Inductor kernels the padded ones)
            rep = int(v[self.prog.samples.index(self.prog.rep)])
            self.notes.append(f"{where}: a by-value lane that follows no expression of the token count (padding "
                              f"bytes?); forward {self.prog.rep.forward}'s {rep} is taken")
            return rep
        msg = (f"{where}: values {sorted(set(v.tolist()))[:6]} at tokens {sorted(set(self.tokens.tolist()))} are no "
               f"expression of the manifest's closed set")
        if field.startswith("grid") and self.prog.kind == "prefill":
            # the other programs still serve: a host feeds the prompt through decode
            raise ProgramError(self.prog.name, msg)
        raise CompileError(msg)


    def _numel_grid(self, step: int, field: str, values: np.ndarray):
        """(form, why) for a grid axis equal, in every sample, to the sum of ceil_div(N_i, B) over
        one or all of the same launch's varying scalar params N_i (each an exact linear fit in the
        tokens), for one block size B. Why: a Triton launcher's grid is ceil_div(xnumel, XBLOCK)
        with xnumel passed to the kernel too, and an Inductor combo kernel's is the sum of its
        sub-kernels' (a fused q-norm and k-norm over 4 and 2 rows a token: 3 * tokens / 4 at any
        multiple of 8 tokens, 5 blocks at 5 tokens where ceil_div(3 * tokens, 4) says 4). Samples
        of padded steps (vLLM pads a compiled step to a captured size) cannot tell these forms
        apart; the kernel's own element counts can."""
        if not field.startswith("grid"):
            return None
        if step not in self._numels:
            self._numels[step] = self._element_counts(step)
        numels = self._numels[step]
        if not numels:
            return None
        for group in [[n] for n in numels] + ([numels] if len(numels) > 1 else []):
            for B in (2 ** e for e in range(13)):
                if all((sum(-(-v[j] // B) for _, v in group) == values[j]) for j in range(len(values))):
                    terms = [f"ceil_div({e}, {B})" if B > 1 else e for e, _ in group]
                    text = terms[0]
                    for t in terms[1:]:
                        text = f"add({text}, {t})"
                    return text, " + ".join(f"ceil_div({e}, {B})" for e, _ in group)
        return None

    def _element_counts(self, step: int) -> list | None:
        """[(linear form in tokens, values)] of the call's varying int scalar params, each an exact
        ceil-free fit in the tokens (an element count); None where the samples' launches differ in
        shape. Computed once per call: every grid field of the call asks for the same fits."""
        launches = [s.steps[step].launch for s in self.prog.samples]
        if any(x is None for x in launches) or len({len(x.params) for x in launches}) != 1:
            return None
        numels = []
        for k, par in enumerate(launches[0].params):
            if par.pointer or par.raw is not None or par.size not in (4, 8):
                continue
            v = np.array([x.params[k].value for x in launches], np.int64)
            if len(np.unique(v)) < 2 or (v <= 0).any():
                continue
            g = F.fit({"tokens": self.tokens}, v, piecewise=False)
            # an element count is the tokens times a row's elements: its form without ceil_div
            lin = ([g.expr] if g.status == "fit" and g.expr else
                   list(g.alternatives) if g.status == "underdetermined" else [])
            lin = [e for e in lin if "ceil_div" not in e]
            if len(lin) == 1:
                numels.append((lin[0], v))
        return numels

    # ---- batched programs (a `seqs` var) -------------------------------------------------------
    def _env(self) -> dict[str, np.ndarray]:
        if self.prog.var == SEQS:            # decode: one token per sequence, tokens == seqs
            return {"seqs": self.seqs}
        return {"tokens": self.tokens, "seqs": self.seqs}

    def _names(self) -> dict[str, str]:
        return {"tokens": SEQS, "seqs": SEQS} if self.prog.var == SEQS else {"tokens": ROWS, "seqs": SEQS}

    def _points(self) -> str:
        pairs = sorted(set(zip(self.tokens.tolist(), self.seqs.tolist())))
        if self.prog.var == SEQS:
            return f"sequences {[s for _, s in pairs][:8]} (one token each)"
        return "(tokens, sequences) " + ", ".join(f"({t}, {q})" for t, q in pairs[:6])

    def _domain_values(self, e) -> bytes:
        """The form's values at every (rows, seqs) the manifest admits, as bytes (equal bytes: one
        function for kern). Decode: seqs 1..max with tokens = seqs; prefill: every rows 1..max and
        seqs 1..min(rows, seqs max), walked one seqs value at a time."""
        rmax, smax = self.limits
        if self.prog.var == SEQS:
            s = np.arange(1, smax + 1, dtype=np.int64)
            return F.evaluate(e, {"tokens": s, "seqs": s}).tobytes()
        out = []
        for q in range(1, smax + 1):
            t = np.arange(q, max(rmax, q) + 1, dtype=np.int64)
            out.append(F.evaluate(e, {"tokens": t, "seqs": np.full_like(t, q)}).tobytes())
        return b"".join(out)

    def _reproduces(self, e, v: np.ndarray) -> bool:
        env = {"tokens": self.tokens, "seqs": self.seqs}
        try:
            return bool((F.evaluate(e, env) == v).all())
        except (KeyError, ValueError):
            return False

    def _batched(self, where: str, v: np.ndarray, site: str, field: str, lane: bool):
        """A field of a batched program: an int or a wire expression in `seqs` (decode) or in `rows`
        and `seqs` (prefill); see the module docstring for the rule."""
        a = self.analysis.get((site, field))
        rep = int(v[self.prog.samples.index(self.prog.rep)])
        keys = list(zip(self.tokens.tolist(), self.seqs.tolist()))
        by_key: dict = {}
        for k, x in zip(keys, v.tolist()):
            by_key.setdefault(k, set()).add(x)
        ctx = a is not None and a.status == "fit" and "ctx" in (a.expr or "")
        if any(len(x) > 1 for x in by_key.values()):
            if ctx and not lane:
                raise CompileError(f"{where}: takes several values at one step size ({self._points()}) and the "
                                   f"analysis fits it with the context ({a.expr}), which the manifest has no var for")
            self.notes.append(f"{where}: differs between forwards of one step size and no analysis fit ties it "
                              f"to the context (padding bytes?); forward {self.prog.rep.forward}'s {rep} is taken")
            return rep
        if len(by_key) < 2:
            raise CompileError(f"{where}: varies while the step size does not ({self._points()})")
        f = F.fit(self._env(), v, piecewise=False)
        forms = []
        if f.status == "fit":
            forms = [f.expr]
        elif f.status == "underdetermined":
            forms = [F.parse(x) for x in f.alternatives]
        if a is not None and a.status in ("fit", "underdetermined"):
            theirs = [a.expr] if a.status == "fit" and a.expr else list(a.alternatives)
            for x in theirs:
                try:
                    e = F.parse(x)
                except ValueError:
                    continue
                if self._reproduces(e, v) and e not in forms:
                    forms.append(e)
        kern_ok = [e for e in forms if _plausible(F.Fit("fit", expr=e, points=len(by_key)), lane)]
        if not kern_ok:
            if forms and not lane:
                raise CompileError(f"{where}: over {self._points()} it is "
                                   f"{' or '.join(F.render(e) for e in forms)}, each with a negative constant "
                                   f"(or an offset a struct lane's few points cannot pin), which kern's "
                                   f"expressions cannot hold")
            if lane or (a is not None and a.status == "no_fit"):
                self.notes.append(f"{where}: a by-value lane that follows no expression of the step size (padding "
                                  f"bytes?); forward {self.prog.rep.forward}'s {rep} is taken")
                return rep
            raise CompileError(f"{where}: values {sorted(set(v.tolist()))[:6]} at {self._points()} are no "
                               f"expression of the manifest's closed set")
        groups: dict[bytes, list] = {}
        for e in kern_ok:
            groups.setdefault(self._domain_values(e), []).append(e)
        rmax, smax = self.limits
        span = (f"seqs 1..{smax}" if self.prog.var == SEQS else f"rows 1..{rmax} with seqs 1..min(rows, {smax})")
        texts = [F.render(e) for e in kern_ok]
        mine = F.parse(a.expr) if a is not None and a.status == "fit" and a.expr else None
        if len(groups) == 1:
            if mine is not None and mine in kern_ok and len(kern_ok) > 1:
                # equal here; the analysis' fit over every forward of the site is the one evidenced wider
                pick = mine
                why = (f"the analysis' fit over every forward of the site, among {' | '.join(texts)}, which agree "
                       f"on every {span}")
            else:
                pick = min(kern_ok, key=_size)
                why = ("the one form the samples allow" if len(kern_ok) == 1 else
                       f"the simplest of {' | '.join(texts)}, which agree on every {span}")
        else:
            hit = [g for g in groups.values() if mine is not None and mine in g]
            if not hit:
                raise CompileError(f"{where}: the program's forwards at {self._points()} allow "
                                   f"{' or '.join(texts)}, which differ within {span}; the capture does not "
                                   f"pin which")
            pick = mine
            why = f"the analysis' fit over every forward of the site ({a.expr}), among {' | '.join(texts)}"
        out = _wire(pick, self._names())
        if len(kern_ok) > 1 or self.prog.var == SEQS and "tokens" in F.render(pick):
            self.notes.append(f"{where}: {V.render(V.from_wire(out))}, {why}")
        self.provenance.append({"program": self.prog.name, "field": where, "forms": texts,
                                "written": V.render(V.from_wire(out)), "because": why})
        return out


def _plausible(f, lane: bool) -> bool:
    """kern's expressions hold no negative constant; in a struct lane, where padding bytes may
    hold anything, an offset (`add`) is believed only from three or more token counts."""
    t = F._tree(f.expr)
    if not V.constants_positive(t) or any(isinstance(n, int) and n < 0 for n in V.walk(t)):
        return False
    return not lane or f.points >= 3 or "add" not in F.render(f.expr).replace("ceil_div", "")


def lanes(raw: bytes | None, skip: set[int]) -> list[int]:
    """4-byte lane offsets of a struct's bytes, less those inside pointer words (`skip`: their offsets)."""
    if raw is None:
        return []
    taken = {a + d for a in skip for d in range(8)}
    return [a for a in range(0, len(raw) - len(raw) % 4, 4) if a not in taken]
