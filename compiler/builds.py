"""A call site's launch builds by row range: where one call launches differently as the rows grow.

Engines pick some launch shapes by the token count (vLLM's `fused_add_rms_norm` runs 1024 or 512
threads a block below a row count and 256 above it; a launcher may pick another tile, and so
another grid, for large batches). kern's launch has one block and one expression per field, but
an op may hold several launches, each guarded by `when: {var, min, max}` (inclusive): kern runs
the one whose range holds the var. This module splits one call of a program (compiler.programs:
the same call in every forward of the program) into such builds, from the capture alone:

- **launch builds**: the forwards' launches of the call grouped by (entry, module sha256, block);
  a block has no expression in kern, so a call whose block differs needs one launch per block;
- **field pieces**: a grid axis, the dynamic shared memory or a whole scalar parameter that no
  single expression of the rows fits (`mining.fit`: no fit over all the program's forwards) but
  that splits at exactly one row count into two pieces, each a constant or a fitted expression
  (struct lanes and one-byte params are not split: they may be padding, compiler.exprs).

A split needs the builds to follow the rows: ordered by the lowest row count each was seen at,
every build's highest row count lies below the next build's lowest. Builds that interleave (one
row count seen with two builds, or a build seen on both sides of another) cannot be told apart by
a threshold; the compiler refuses with one sentence naming the call site and the row counts.

**The boundary.** Between the largest row count seen with one build (`hi`) and the smallest seen
with the next (`lo`) the capture pins nothing: the true threshold is some row count in
(hi, lo]. Where lo = hi + 1 it is pinned; otherwise the rule here is the *lowest row count the
next build was seen at*: the earlier build serves up to lo - 1 (it is the build the capture saw
below lo), the next from lo. Never tuned to a capture; the gap is recorded (`Build.open`) so the
provenance and a `note:` line say which row counts the choice covers without evidence. The first
build serves from 1, the last has no upper bound.

Not done here: more than two pieces of one field inside one launch build; ranges over any var
but the program's `rows` (a decode program has one row count, so it never splits).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mining import fit as F

SCALAR_SIZES = (4, 8)


@dataclass
class Build:
    """One launch of a split call: the samples it was seen in and the rows it serves."""
    samples: list[int]                  # indices into the program's samples
    seen: list[int]                     # distinct row counts of those samples, ascending
    when: tuple = (1, None)             # (min, max | None): the rows this launch serves
    open: tuple | None = None           # (a, b): its threshold lies in [a, b], not pinned by the capture
    because: list[str] = field(default_factory=list)   # what tells it from its neighbours

    def to_json(self) -> dict:
        return {"when": {"min": self.when[0], "max": self.when[1]}, "seen_rows": self.seen,
                "open": None if self.open is None else list(self.open), "because": self.because}


class Interleaved(ValueError):
    """Builds a threshold of the rows cannot separate; the message names the row counts."""


def launch_key(launch) -> tuple:
    """What makes two launches of one call different builds: entry, module and block."""
    return (launch.symbol, launch.sha256, tuple(launch.block))


def describe(launch, others: list) -> str:
    """What tells this build from the others: its block, module or entry where they differ."""
    keys = {launch_key(x) for x in others}
    out = []
    if len({k[2] for k in keys}) > 1:
        out.append(f"block {list(launch.block)}")
    if len({k[1] for k in keys}) > 1:
        out.append(f"module {launch.sha256[:12] or '?'}")
    if len({k[0] for k in keys}) > 1:
        out.append(f"entry {launch.symbol[:40]}")
    return ", ".join(out)


def order(tokens: list[int], keys: list) -> list[list[int]]:
    """Sample indices grouped by key, groups ordered by their lowest row count; `Interleaved`
    when the groups do not follow the rows (one threshold between every two neighbours)."""
    groups: dict = {}
    for n, key in enumerate(keys):
        groups.setdefault(key, []).append(n)
    out = sorted(groups.values(), key=lambda g: min(tokens[n] for n in g))
    for a, b in zip(out, out[1:]):
        hi, lo = max(tokens[n] for n in a), min(tokens[n] for n in b)
        if lo <= hi:
            ra = sorted({tokens[n] for n in a})
            rb = sorted({tokens[n] for n in b})
            raise Interleaved(f"one build is seen at rows {_short(ra)} and another at rows {_short(rb)}, "
                              f"which no threshold of the rows separates")
    return out


def separable(tokens: list[int], keys: list) -> bool:
    try:
        order(tokens, keys)
    except Interleaved:
        return False
    return True


def ranges(tokens: list[int], groups: list[list[int]], why: list[list[str]]) -> list[Build]:
    """The `when` range of each ordered group by the module's boundary rule."""
    out = []
    for n, g in enumerate(groups):
        seen = sorted({tokens[s] for s in g})
        b = Build(sorted(g), seen, because=why[n])
        if n:
            prev = out[-1]
            hi = prev.seen[-1]
            lo = seen[0]
            prev.when = (prev.when[0], lo - 1)
            b.when = (lo, None)
            b.open = (hi + 1, lo) if lo > hi + 1 else None
        out.append(b)
    return out


def _short(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:6])) + (", ..." if len(xs) > 6 else "")


def _pinned(x: np.ndarray, v: np.ndarray) -> bool:
    """A piece of a field: one value throughout, or one fitted expression (mining.fit `fit`), or
    forms among which the bare rows are (compiler.exprs takes the simplest: `rows`)."""
    if (v == v[0]).all():
        return True
    if len(np.unique(x)) < 2:
        return False
    f = F.fit({"tokens": x}, v, piecewise=False)
    if f.status == "underdetermined":
        return "tokens" in f.alternatives
    return f.status == "fit" and _positive(f)


def _positive(f) -> bool:
    from vocab import expr as V
    t = F._tree(f.expr)
    return V.constants_positive(t) and not any(isinstance(n, int) and n < 0 for n in V.walk(t))


def needs_pieces(x: np.ndarray, v: np.ndarray) -> bool:
    """True where no single expression (nor a constant) serves the field over the samples and the
    field is a function of the rows (equal row counts, equal values)."""
    if (v == v[0]).all():
        return False
    for t in np.unique(x):
        if len(np.unique(v[x == t])) > 1:
            return False          # not a function of the rows: compiler.exprs decides (padding, ctx)
    f = F.fit({"tokens": x}, v, piecewise=False)
    if f.status == "underdetermined":
        return False
    return f.status != "fit" or not _positive(f)


def cut(x: np.ndarray, v: np.ndarray) -> int | None:
    """The one row count where a field splits into two pinned pieces (the first row count of the
    upper piece), None when no cut or more than one does."""
    rows = np.unique(x)
    good = [int(rows[j]) for j in range(1, len(rows))
            if _pinned(x[x < rows[j]], v[x < rows[j]]) and _pinned(x[x >= rows[j]], v[x >= rows[j]])]
    return good[0] if len(good) == 1 else None


def fields(launch) -> list[tuple[str, callable]]:
    """(field name, value getter) of the fields a split may follow: grid axes, dynamic shared
    memory and whole 4/8-byte scalar params (compiler.exprs names them the same way)."""
    out = [(f"grid_{a}", (lambda x, j=j: x.grid[j])) for j, a in enumerate("xyz")]
    out.append(("smem", lambda x: x.smem))
    ptr_params = {w.i for w in launch.words}
    for p in launch.params:
        if not p.pointer and p.size in SCALAR_SIZES and p.i not in ptr_params:
            out.append((f"param{p.i}", (lambda x, i=p.i: x.params[i].value)))
    return out


def partition(launches: list, tokens: list[int]) -> list[Build]:
    """The builds of one call: `launches[n]` is its launch in sample n, at `tokens[n]` rows.
    One Build (rows 1..) when nothing splits; `Interleaved` when builds do not follow the rows."""
    keys = [launch_key(x) for x in launches]
    groups = order(tokens, keys)
    why = [[describe(launches[g[0]], [launches[h[0]] for h in groups])] if len(groups) > 1 else [] for g in groups]
    x_all = np.asarray(tokens, np.int64)
    for name, get in fields(launches[0]):
        v_all = np.asarray([get(x) for x in launches], np.int64)
        if not needs_pieces(x_all, v_all):
            continue
        refined, rwhy = [], []
        for g, w in zip(groups, why):
            x, v = x_all[g], v_all[g]
            c = None if _pinned(x, v) else cut(x, v)
            if c is None:
                refined.append(g)
                rwhy.append(w)
                continue
            lo_g = [n for n in g if tokens[n] < c]
            hi_g = [n for n in g if tokens[n] >= c]
            refined += [lo_g, hi_g]
            rwhy += [w + [f"{name} piece below {c} rows"], w + [f"{name} piece from {c} rows"]]
        groups, why = refined, rwhy
    return ranges(tokens, groups, why)


def notes(splits: dict[str, list]) -> list[str]:
    """One `note:` line per program and kind of split (calls with the same entry and ranges)."""
    out = []
    for prog, calls in splits.items():
        groups: dict = {}
        for c in calls:
            key = (c["entry"], json_key(c["builds"]))
            groups.setdefault(key, []).append(c)
        for (entry, _), cs in groups.items():
            parts = []
            for b in cs[0]["builds"]:
                w = b["when"]
                span = f"rows {w['min']}..{w['max']}" if w["max"] is not None else f"rows {w['min']}.."
                parts.append(f"{'; '.join(b['because'])} (seen at rows {_short(b['seen_rows'])}) for {span}")
            gaps = [b["open"] for b in cs[0]["builds"] if b["open"]]
            tail = ("; the capture leaves the threshold open over " +
                    ", ".join(f"rows {a}..{z}" for a, z in gaps) +
                    " (the rule: the next build from the lowest row count it was seen at)") if gaps else \
                "; every threshold is pinned by neighbouring row counts"
            out.append(f"{prog}: {len(cs)} call(s) of {entry[:60]} (first call {cs[0]['call']}) launch by row "
                       f"range: " + " / ".join(parts) + tail)
    return out


def json_key(x) -> str:
    import json
    return json.dumps(x, sort_keys=True)
