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

Sequences: a batched capture's analysis has a `seqs` variable (its `forward_vars`). A field the
analysis fits with `seqs`, or that has `seqs` among its alternatives, is refused with one sentence
naming both variables (and the program's own fit over them): the manifest this compiler writes
declares `rows` (the tokens) only; emitting a var for the sequences is not done here.

Fields: `grid_x|y|z`, the dynamic shared memory, and the integers a launch passes by value: a
whole scalar parameter (1, 4 or 8 bytes), or a 4-byte lane of a by-value struct (lanes that hold
pointer words are the buffers', not fitted). A decode program has one token in every sample, so
a field that still varies there depends on something else (the context) and is refused.
"""

from __future__ import annotations

import numpy as np

from compiler.errors import CompileError
from compiler.programs import Program
from mining import fit as F
from vocab import expr as V
from vocab.analysis import AnalysisDoc

ROWS = "rows"


def _wire(e) -> object:
    return V.to_wire(_rename(F._tree(e)))


def _rename(t):
    if isinstance(t, str):
        return ROWS
    if isinstance(t, V.Expr):
        return V.Expr(t.op, _rename(t.a), t.b if t.op != "add" else _rename(t.b))
    return t


class Fitter:
    """Per (call, field) constant or expression over one program's samples."""

    def __init__(self, prog: Program, doc: AnalysisDoc):
        self.prog = prog
        self.tokens = np.array([s.tokens for s in prog.samples], np.int64)
        self.analysis = {(f.site, f.field): f for f in doc.fits}
        self.notes: list[str] = []
        fv = doc.forward_vars
        per = {r.forward: r.seqs for r in fv.forwards} if fv is not None and "seqs" in fv.names else {}
        seqs = [per.get(s.forward) for s in prog.samples]
        self.seqs = np.array(seqs, np.int64) if per and None not in seqs else None

    def _sequences(self, where: str, v: np.ndarray, site: str, field: str) -> None:
        """Refuse a field that follows the step's sequences: the analysis fits it (or one of its
        alternatives) with `seqs`, a var the manifest this compiler writes does not declare."""
        a = self.analysis.get((site, field))
        forms = ([a.expr] if a is not None and a.expr else []) + (list(a.alternatives) if a is not None else [])
        if not any("seqs" in x for x in forms):
            return
        said = a.expr if a.status == "fit" else " or ".join(a.alternatives)
        mine = ""
        if self.seqs is not None:
            f = F.fit({"tokens": self.tokens, "seqs": self.seqs}, v, piecewise=False)
            mine = f"; over the program's forwards (tokens {sorted(set(self.tokens.tolist()))[:6]}, " \
                   f"sequences {sorted(set(self.seqs.tolist()))[:6]}) {f.text}"
        raise CompileError(f"{where}: follows the sequences of the step as well as or instead of its tokens "
                           f"(the analysis over every forward of the site: {said}{mine}); the manifest "
                           f"declares the tokens as `rows` and no var for the sequences")

    def value(self, step: int, field: str, values: list[int], site: str, lane: bool = False):
        """An int (constant) or a wire expression in `rows`. A value that varies where the tokens do
        not is refused when the analysis fits it with the context (`ctx`), else taken from the
        representative forward and noted (by-value structs carry indeterminate padding bytes)."""
        v = np.asarray(values, np.int64)
        if (v == v[0]).all():
            return int(v[0])
        where = f"{self.prog.name} call {step} (call site {site}), {field}"
        self._sequences(where, v, site, field)
        same = [v[self.tokens == t] for t in np.unique(self.tokens)]
        a = self.analysis.get((site, field))
        ctx = a is not None and a.status == "fit" and "ctx" in (a.expr or "")
        if (lane or not ctx) and any(len(np.unique(s)) > 1 for s in same):
            rep = int(v[self.prog.samples.index(self.prog.rep)])
            self.notes.append(f"{where}: differs between forwards of one token count ({len(np.unique(v))} values) "
                              f"and no analysis fit ties it to the context (padding bytes?); forward "
                              f"{self.prog.rep.forward}'s {rep} is taken")
            return rep
        if self.prog.name == "decode" or len(np.unique(self.tokens)) < 2:
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
            if "tokens" in f.alternatives:
                self.notes.append(f"{where}: `rows` itself, the simplest of {' | '.join(f.alternatives)} that the "
                                  f"program's forwards at {sorted(set(self.tokens.tolist()))} tokens allow")
                return ROWS
            raise CompileError(f"{where}: the program's forwards at {sorted(set(self.tokens.tolist()))} tokens allow "
                               f"{' or '.join(f.alternatives)}; the capture does not pin which")
        if lane or (a is not None and a.status == "no_fit"):
            rep = int(v[self.prog.samples.index(self.prog.rep)])
            self.notes.append(f"{where}: a by-value lane that follows no expression of the token count (padding "
                              f"bytes?); forward {self.prog.rep.forward}'s {rep} is taken")
            return rep
        raise CompileError(f"{where}: values {sorted(set(v.tolist()))[:6]} at tokens "
                           f"{sorted(set(self.tokens.tolist()))} are no expression of the manifest's closed set")


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
