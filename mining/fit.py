"""Fit integer samples to a closed expression set, and say honestly when the data cannot decide.

Why: a launch's grid axes and integer parameters are functions of a few run-time variables
(tokens first; the sequences of a batched step, the context length, where they vary). Generators
need those functions, not the sampled values. The closed set is

    const c | var | mul(e, c) | ceil_div(e, c) | add(e, e)

(the manifest's own, `vocab.expr`: its text form, its evaluator; fits are tuples over it) and this
module searches the shapes a kernel launcher actually produces: in one variable c, x, x*c,
ceil(x/c), ceil(x/c)*m, ceil(x*m/c), x + c, x*a + b; in the two peer variables (`PEERS`: tokens and
seqs) a*F(x) + b*G(y) + k with F, G each x, ceil(x/c) or ceil((x+1)/c) (a floor division plus
one: vLLM's attention grid is floor(tokens/16) + seqs) and a*ceil((x+y)/c) + k; and x1 + x2 for
tokens and another variable (ctx), tried only when no peer form fits.

Verdicts (`Fit.status`):
- "fit": every candidate that matches the samples computes the same function on the probe domain
  (all integers from 1 to 4x the largest sample, and the samples themselves; with two peers also
  their diagonal and a dense block of pairs, `_probe2`);
- "underdetermined": two candidates match the samples but disagree somewhere on that domain (both
  are listed) -- this is how one sample point, or 1-and-2 only, is caught, and how tokens and
  seqs are when they are equal in every sample (decode steps); no count rule needed;
- "piecewise": no single form fits, but the decode samples (x == 1) and the prefill samples (x > 1)
  each do (the decode side is only allowed a constant: at x == 1 nothing else is observable);
- "no_fit": outside the closed set.
A divisor c of ceil_div is only known to an interval; the canonical c is the one power of two
inside it (the interval is reported). Not attempted: products of two variables, negative values,
forms of three variables, piecewise forms over seqs (vLLM's split-KV attention switches its grid
by the batch), a two-variable form with more than two terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vocab import expr as V

Expr = tuple  # ("const", c) | ("var", name) | ("mul", e, c) | ("ceil_div", e, c) | ("add", e, e)
POW2 = [1 << k for k in range(1, 17)]


def _tree(e: Expr):
    """The shared expression tree (`vocab.expr`) of a fit tuple; piecewise has none."""
    kind = e[0]
    if kind in ("const", "var"):
        return e[1]
    if kind in ("mul", "ceil_div"):
        return V.Expr(kind, _tree(e[1]), e[2])
    if kind == "add":
        return V.Expr(kind, _tree(e[1]), _tree(e[2]))
    raise ValueError(f"unknown expression kind {kind!r}")


def _tuple(t) -> Expr:
    """The fit tuple of a shared expression tree (the inverse of `_tree`)."""
    if isinstance(t, V.Expr):
        return (t.op, _tuple(t.a), t.b if t.op != "add" else _tuple(t.b))
    return ("var", t) if isinstance(t, str) else ("const", t)


def render(e: Expr) -> str:
    """The text form `ceil_div(tokens, 16)` (`vocab.expr.render`); piecewise is a fit verdict,
    not an expression, and is written here."""
    if e[0] == "piecewise":
        return f"piecewise({e[1]}==1: {render(e[2])}; {e[1]}>1: {render(e[3])})"
    return V.render(_tree(e))


def parse(text: str) -> Expr:
    """The expression `render` wrote (the closed set; piecewise is not read back): a reader of
    the analysis contract evaluates fitted expressions with `evaluate(parse(expr), env)`."""
    return _tuple(V.parse(text))  # a malformed text raises vocab's ExprError, a ValueError


def evaluate(e: Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    """Value of `e` for every row of `env` (int64 arrays of equal length): the shared evaluator
    without its u64 checks, over arrays; a piecewise verdict picks its branch per row."""
    n = len(next(iter(env.values())))
    if e[0] == "piecewise":
        x = np.asarray(env[e[1]])
        return np.where(x == 1, evaluate(e[2], env), evaluate(e[3], env))
    arrays = {k: np.asarray(a, np.int64) for k, a in env.items()}
    v = V.evaluate(_tree(e), arrays, checked=False)
    return np.asarray(v, np.int64) if np.ndim(v) else np.full(n, v, np.int64)


@dataclass
class Fit:
    status: str                      # fit | underdetermined | piecewise | no_fit
    expr: Expr | None = None
    points: int = 0                  # distinct sample points (x values) behind the verdict
    alternatives: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def text(self) -> str:
        if self.status in ("fit", "piecewise"):
            return render(self.expr)
        if self.status == "underdetermined":
            return "underdetermined (" + " | ".join(self.alternatives) + ")"
        return "no fit"

    def to_json(self) -> dict:
        return {"status": self.status, "expr": render(self.expr) if self.expr else None,
                "points": self.points, "alternatives": self.alternatives, "note": self.note}


def _interval_ceil_div(x: np.ndarray, v: np.ndarray) -> tuple[int, float] | None:
    """Integers c >= 1 with ceil(x / c) == v for all samples, as [lo, hi] (hi may be inf)."""
    if (v < 1).any() or (x < 1).any():
        return None
    lo = int(np.max(-(-x // v)))
    big = v > 1
    hi = float(np.min((x[big] - 1) // (v[big] - 1))) if big.any() else float("inf")
    return (lo, hi) if lo <= hi else None


def _pick(lo: int, hi: float) -> int:
    for p in [1] + POW2:
        if lo <= p <= hi:
            return p
    return lo


def _single_var(name: str, x: np.ndarray, v: np.ndarray) -> list[tuple[Expr, str]]:
    """Every candidate shape in one variable that reproduces v exactly; (expr, note)."""
    var = ("var", name)
    out: list[tuple[Expr, str]] = []
    if (v == v[0]).all():
        out.append((("const", int(v[0])), ""))
        if len(np.unique(x)) >= 2:
            return out  # constant over several points: a varying form would be degenerate
    if (v == x).all():
        out.append((var, ""))
    pos = x > 0
    if pos.all():
        if (v % x == 0).all() and len(set((v // x).tolist())) == 1 and v[0] // x[0] > 1:
            out.append((("mul", var, int(v[0] // x[0])), ""))
        iv = _interval_ceil_div(x, v)
        if iv is not None and iv[1] >= 2:
            lo, hi = iv
            c = _pick(max(lo, 2), hi)
            note = "" if lo == hi else f"divisor in [{lo}, {'inf' if hi == float('inf') else int(hi)}]"
            if c & (c - 1) and lo != hi:
                note += "; no power of two inside, smallest taken"
            out.append((("ceil_div", var, c), note))
        for c in POW2:
            q = -(-x // c)
            if (v % q == 0).all() and len(set((v // q).tolist())) == 1 and v[0] // q[0] > 1:
                out.append((("mul", ("ceil_div", var, c), int(v[0] // q[0])), ""))
                break
        for c in POW2:
            lo_m = np.floor((v - 1) * c / x) + 1
            hi_m = np.floor(v * c / x)
            lo, hi = int(lo_m.max()), int(hi_m.min())
            if lo <= hi and hi >= 2:
                m = max(lo, 2)
                if m % c:  # m a multiple of c is mul(), found above
                    out.append((("ceil_div", ("mul", var, m), c), ""))
                break
    d = v - x
    if (d == d[0]).all() and d[0] != 0:
        out.append((("add", var, ("const", int(d[0]))), ""))
    xs = np.unique(x)
    if len(xs) >= 2:
        i, j = np.flatnonzero(x == xs[0])[0], np.flatnonzero(x == xs[-1])[0]
        num, den = int(v[j] - v[i]), int(x[j] - x[i])
        if num % den == 0 and num // den > 1:
            a = num // den
            b = int(v[i] - a * x[i])
            if b != 0 and (v == a * x + b).all():
                out.append((("add", ("mul", var, a), ("const", b)), ""))
    return out


def _probe(samples: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Integers 1..4*max (at least 256, capped at 2**17) for the first variable, then the samples.

    Probing past the largest sample is what exposes forms that agree on few points only."""
    first = samples[names[0]]
    top = int(min(max(4 * int(first.max()), 256), 1 << 17))
    grid = np.arange(1, top + 1, dtype=np.int64)
    env = {}
    for k, n in enumerate(names):
        s = samples[n].astype(np.int64)
        env[n] = np.concatenate([grid if k == 0 else np.ones_like(grid), s])
    return env


def _probe2(samples: dict[str, np.ndarray], pair: list[str], names: list[str]) -> dict[str, np.ndarray]:
    """The probe of two peer variables x, y: x over 1..top with y = 1 (`_probe`'s line), the
    diagonal x = y, and every pair of a dense block (x up to 1024, y up to 64), then the samples.
    Where every sample has y <= x (sequences never outnumber the tokens they feed), so do the
    probe points. Other variables are 1 there, as in `_probe`."""
    xs, ys = samples[pair[0]].astype(np.int64), samples[pair[1]].astype(np.int64)
    top = int(min(max(4 * int(xs.max()), 256), 1 << 17))
    ytop = int(min(max(4 * int(ys.max()), 64), top))
    line = np.arange(1, top + 1, dtype=np.int64)
    diag = np.arange(1, ytop + 1, dtype=np.int64)
    bx, by = np.meshgrid(np.arange(1, min(top, 1024) + 1), np.arange(1, min(ytop, 64) + 1), indexing="ij")
    x = np.concatenate([line, diag, bx.ravel()])
    y = np.concatenate([np.ones_like(line), diag, by.ravel()])
    if (ys <= xs).all():
        keep = y <= x
        x, y = x[keep], y[keep]
    env = {}
    for n in names:
        grid = x if n == pair[0] else y if n == pair[1] else np.ones_like(x)
        env[n] = np.concatenate([grid, samples[n].astype(np.int64)])
    return env


def _features(name: str, x: np.ndarray) -> list[tuple[Expr, np.ndarray]]:
    """The one-variable terms two-variable forms are built of: x, ceil(x / c) and
    ceil((x + 1) / c) (floor(x / c) + 1: a floor division is this term less one), c a power of two.
    A term of fewer than three distinct values over the samples is dropped: its coefficient would
    rest on one contrast and absorb any one-off value (a constant is the constant's anyway). Of
    terms equal over the samples the first is kept (the smaller divisor: `_pick`'s rule)."""
    var = ("var", name)
    out = [(var, x)]
    out += [(("ceil_div", var, c), -(-x // c)) for c in POW2]
    out += [(("ceil_div", ("add", var, ("const", 1)), c), x // c + 1) for c in POW2]
    seen, kept = set(), []
    for e, f in out:
        key = f.tobytes()
        if len(np.unique(f)) < MIN_LEVELS or key in seen:
            continue
        seen.add(key)
        kept.append((e, f))
    return kept


def _term(e: Expr, a: int) -> Expr:
    return e if a == 1 else ("mul", e, int(a))


def _offset(e: Expr, k: int) -> Expr:
    return e if k == 0 else ("add", e, ("const", int(k)))


MIN_LEVELS = 3         # distinct values a term of a two-variable form needs over the samples
BIG = 1 << 40          # coefficients past this are numerical noise, not a launcher's constants


def _two_var(nx: str, x: np.ndarray, ny: str, y: np.ndarray, v: np.ndarray) -> list[tuple[Expr, str]]:
    """Every form a*F(x) + b*G(y) + k (F, G from `_features`, a, b >= 1, k any integer) and
    a*ceil((x + y) / c) + k (the ceiling of MIN_LEVELS values or more) that reproduces v exactly. The coefficients of each pair of terms are
    the least-squares solution over the samples, rounded and then checked exactly; a pair whose
    terms are collinear over the samples (x equals y there, say) has no unique solution and is
    skipped: the one-variable forms speak for it."""
    fx, gy = _features(nx, x), _features(ny, y)
    out: list[tuple[Expr, str]] = []
    if fx and gy:
        A = np.stack([f for _, f in fx], 1).astype(np.float64)
        B = np.stack([g for _, g in gy], 1).astype(np.float64)
        vf = v.astype(np.float64)
        p, q, n = A.shape[1], B.shape[1], len(v)
        M = np.empty((p, q, 3, 3))
        M[..., 0, 0] = (A * A).sum(0)[:, None]
        M[..., 1, 1] = (B * B).sum(0)[None, :]
        M[..., 0, 1] = M[..., 1, 0] = A.T @ B
        M[..., 0, 2] = M[..., 2, 0] = A.sum(0)[:, None]
        M[..., 1, 2] = M[..., 2, 1] = B.sum(0)[None, :]
        M[..., 2, 2] = n
        r = np.empty((p, q, 3))
        r[..., 0] = (A.T @ vf)[:, None]
        r[..., 1] = (B.T @ vf)[None, :]
        r[..., 2] = vf.sum()
        # A small determinant relative to the diagonal means nearly collinear terms.
        diag = M[..., 0, 0] * M[..., 1, 1] * M[..., 2, 2]
        with np.errstate(all="ignore"):
            det = np.linalg.det(M)
            ok = np.abs(det) > 1e-9 * diag
        if ok.any():
            ii, jj = np.nonzero(ok)
            sol = np.linalg.solve(M[ok], r[ok][..., None])[..., 0]
            with np.errstate(all="ignore"):
                w = np.rint(sol)
            good = np.isfinite(w).all(1) & (np.abs(w) < BIG).all(1) & (w[:, 0] >= 1) & (w[:, 1] >= 1)
            ii, jj, w = ii[good], jj[good], w[good].astype(np.int64)
            Ai, Bj = A.astype(np.int64), B.astype(np.int64)
            pred = w[:, :1] * Ai[:, ii].T + w[:, 1:2] * Bj[:, jj].T + w[:, 2:]
            for m in np.flatnonzero((pred == v[None, :]).all(1)):
                a, b, k = (int(t) for t in w[m])
                e = ("add", _term(fx[ii[m]][0], a), _term(gy[jj[m]][0], b))
                out.append((_offset(e, k), ""))
    s = x + y
    for c in POW2:
        h = -(-s // c)
        if len(np.unique(h)) < MIN_LEVELS:
            break
        i, j = int(np.argmin(h)), int(np.argmax(h))
        a, rem = divmod(int(v[j] - v[i]), int(h[j] - h[i]))
        k = int(v[i]) - a * int(h[i])
        if rem == 0 and a >= 1 and (a * h + k == v).all():
            out.append((_offset(_term(("ceil_div", ("add", ("var", nx), ("var", ny)), c), a), k), ""))
    return out


PEERS = ("tokens", "seqs")   # step sizes: a value may follow either, so both are tried alike


def fit(samples: dict[str, np.ndarray] | np.ndarray, values: np.ndarray,
        var: str = "tokens", piecewise: bool = True) -> Fit:
    """Fit `values` as a function of the sample variables (dict name -> array; first is primary).

    The peers (`tokens` and `seqs`, those present; else the first variable) are tried alike, in
    one variable and, with two of them, in both; another variable (`ctx`) only when no peer form
    fits, as one variable, or as its sum with the first."""
    if not isinstance(samples, dict):
        samples = {var: np.asarray(samples)}
    names = list(samples)
    env = {n: np.asarray(a, np.int64) for n, a in samples.items()}
    v = np.asarray(values, np.int64)
    if len(v) == 0:
        return Fit("no_fit", note="no samples")
    peers = [n for n in names if n in PEERS] or names[:1]
    rest = [n for n in names if n not in peers]
    points = len(np.unique(np.stack([env[n] for n in peers]), axis=1)[0]) if len(peers) > 1 \
        else len(np.unique(env[peers[0]]))
    cands: list[tuple[Expr, str]] = []
    for n in peers:
        cands += _single_var(n, env[n], v)
    if len(peers) >= 2 and not (v == v[0]).all():
        cands += _two_var(peers[0], env[peers[0]], peers[1], env[peers[1]], v)
    if not cands:
        for n in rest:
            cands += _single_var(n, env[n], v)
            if cands:
                break  # the primary variable explains it; others only when it does not
    if not cands and len(names) >= 2:
        for n2 in rest:
            if (v == env[names[0]] + env[n2]).all():
                cands.append((("add", ("var", names[0]), ("var", n2)), ""))
    if not cands:
        if piecewise and names[0] in samples:
            pw = _piecewise(names[0], env[names[0]], v)
            if pw is not None:
                return pw
        return Fit("no_fit", points=points, note=f"values {sorted(set(v.tolist()))[:6]}")
    probe = _probe2(env, peers[:2], names) if len(peers) >= 2 else _probe(env, names)
    groups: dict[bytes, tuple[Expr, str]] = {}
    for e, note in cands:
        key = evaluate(e, probe).tobytes()
        groups.setdefault(key, (e, note))
    if len(groups) > 1:
        alts = [render(e) for e, _ in groups.values()][:4]
        return Fit("underdetermined", points=points, alternatives=alts,
                   note=f"{len(alts)} forms fit {points} distinct point(s)")
    e, note = next(iter(groups.values()))
    return Fit("fit", expr=e, points=points, note=note)


def _piecewise(name: str, x: np.ndarray, v: np.ndarray) -> Fit | None:
    dec, pre = x == 1, x > 1
    if not dec.any() or not pre.any() or not (v[dec] == v[dec][0]).all():
        return None
    rest = fit({name: x[pre]}, v[pre], piecewise=False)
    if rest.status != "fit":
        return None
    expr = ("piecewise", name, ("const", int(v[dec][0])), rest.expr)
    return Fit("piecewise", expr=expr, points=len(np.unique(x)),
               note="decode (x == 1) and prefill (x > 1) differ")
