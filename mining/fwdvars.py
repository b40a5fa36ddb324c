"""A forward's variables beyond its token count, read from the capture: sequences and context.

Why: a batched engine's launches depend on more than the tokens of a step. Its attention grid
and its per-sequence staging and sampling kernels follow the number of sequences the step
serves, and a split-KV decode can follow the longest context. A fit over the token count alone
finds no function for those values (or a wrong one). The variables come from the capture
itself, never from a truth or requests file, so that a capture of an unknown engine gets them
too.

- `tokens`: the reference kernel's axis (mining/sites.py `choose_reference`), unchanged.
- `seqs` (`sequences`): an engine launches its per-sequence work (sampling, input staging,
  attention's sequence count) with a grid axis or an integer scalar equal to the number of
  sequences in the step. A field (grid axis, or integer scalar of at most 8 bytes that is never a
  pointer) of a call site is a candidate when, over the serving forwards, the site runs in every
  one of them and the field's value v
    (a) lies in 1 <= v <= tokens in every serving forward (each sequence feeds at least one
        token),
    (b) varies, and is below tokens in at least one of them (a batched prefill),
    (c) is no function of the token count: `mining.fit.fit(tokens, v)` returns no_fit (a value
        the tokens give is no evidence of another variable; the capture could not tell them
        apart).
  Candidates are grouped by their values over the serving forwards. The group held by the most
  distinct kernels (symbols) wins. It needs two kernels or more, and no other group as many, so a
  single kernel's count of something else is never taken. A forward's value (start-up forwards
  included) is the one the winning fields agree on where one or more of them ran; a forward
  where they disagree, or where none ran, has none. A capture that serves one sequence at a time
  has no candidate (every candidate is constant, or a function of the tokens), so it has no
  `seqs` variable and its fits are what they were.
- `ctx` (context): tokens accumulated inside a request window, i.e. one sequence's context. This
  holds only while the window serves one sequence. With a `seqs` variable, only the windows
  whose every forward is known to serve one sequence get a `ctx`. The longest context of a batch
  is not measured: no launch field of the captures we have carries it (vLLM's attention reads the
  sequence lengths from device memory, and its decode copies are scalars).

Not done: sequences from the copy log (a prefill's query-offset array has sequences + 1 entries,
but a decode step's arrays are built on the device from host-mapped tables and never copied, so
that count would cover prefill steps only); a per-sequence count that only one kernel shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mining import fit as F

GRID = ("grid_x", "grid_y", "grid_z")
MIN_KERNELS = 2          # distinct kernels that must show the same per-sequence count


@dataclass
class Source:
    """Where a variable was read: the rule and the (site, field) pairs that hold it."""
    var: str
    rule: str
    fields: list[tuple[str, str]] = field(default_factory=list)
    kernels: int = 0
    note: str = ""


@dataclass
class ForwardVars:
    """Per-forward values of every variable (forward -> int; a forward without a value is absent)."""
    values: dict[str, pd.Series]
    sources: list[Source] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.values)


def signed(values: np.ndarray, size) -> np.ndarray:
    """Integer parameter bytes as signed values (4 and 8 bytes read as int32 / int64)."""
    v = np.asarray(values).astype(np.uint64)
    size = np.broadcast_to(np.asarray(size), v.shape)
    out = v.astype(np.int64)
    four, eight = size == 4, size == 8
    out[four] = v[four].astype(np.uint32).view(np.int32).astype(np.int64)
    out[eight] = v[eight].view(np.int64)
    return out


def field_values(launches: pd.DataFrame, params: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """One row per (site, field, forward) of the kept launches: the grid axes and the integer
    scalars (<= 8 bytes, never a pointer at that site) the fits see. Columns site, field, forward, value."""
    kept = table[table["kept"]]
    rows = kept["row"].to_numpy()
    site = kept["site"].astype(str).to_numpy()
    fwd = kept["forward"].to_numpy().astype(np.int64)
    parts = [pd.DataFrame({"site": site, "field": col, "forward": fwd,
                           "value": launches[col].to_numpy()[rows].astype(np.int64)}) for col in GRID]
    prm = params.loc[~params["word"], ["seq", "i", "size", "value", "is_ptr"]]
    scal = prm.merge(kept[["seq", "forward", "site"]], on="seq", how="inner")
    anyptr = scal.groupby(["site", "i"], observed=True)["is_ptr"].transform("any")
    scal = scal[~anyptr.astype(bool) & (scal["size"] <= 8)]
    if len(scal):
        parts.append(pd.DataFrame({"site": scal["site"].astype(str).to_numpy(),
                                   "field": "param" + scal["i"].astype(int).astype(str).to_numpy(),
                                   "forward": scal["forward"].to_numpy().astype(np.int64),
                                   "value": signed(scal["value"].to_numpy(), scal["size"].to_numpy())}))
    return pd.concat(parts, ignore_index=True)


def sequences(fields: pd.DataFrame, tokens: pd.Series, serve: set, symbol_of: dict[str, str]) -> tuple[pd.Series, Source | None, str]:
    """The `seqs` variable (module docstring): forward -> sequences, its source, and a note
    (why there is none, or how it was chosen)."""
    empty = pd.Series(dtype="int64")
    tok = tokens[tokens.index.isin(serve)].sort_index()
    if len(tok) < 2:
        return empty, None, ""
    srv = fields[fields["forward"].isin(tok.index)].copy()
    srv["t"] = tok.reindex(srv["forward"].to_numpy()).to_numpy()
    srv["bad"] = (srv["value"] < 1) | (srv["value"] > srv["t"])
    srv["below"] = srv["value"] < srv["t"]
    key = ["site", "field"]
    g = srv.groupby(key, sort=False, observed=True)
    stats = pd.DataFrame({"n": g["forward"].nunique(), "rows": g.size(), "bad": g["bad"].any(),
                          "below": g["below"].any(), "distinct": g["value"].nunique()})
    ok = stats[(stats["n"] == len(tok)) & (stats["rows"] == len(tok)) & ~stats["bad"] & stats["below"]
               & (stats["distinct"] >= 2)]
    if not len(ok):
        return empty, None, ""
    cand = srv.set_index(key).loc[ok.index].reset_index().sort_values(key + ["forward"])
    groups: dict[bytes, list[tuple[str, str]]] = {}
    for (site, fld), d in cand.groupby(key, sort=False, observed=True):
        groups.setdefault(d["value"].to_numpy().tobytes(), []).append((site, fld))
    t = tok.to_numpy()
    scored = []
    for k, members in groups.items():
        v = np.frombuffer(k, np.int64)
        if F.fit({"tokens": t}, v).status != "no_fit":
            continue
        scored.append((len({symbol_of.get(s, s) for s, _ in members}), members))
    scored.sort(key=lambda x: -x[0])
    if not scored or scored[0][0] < MIN_KERNELS:
        return empty, None, ("" if not scored else
                             f"sequences: only {scored[0][0]} kernel shows a per-sequence count; no seqs variable")
    if len(scored) > 1 and scored[1][0] == scored[0][0]:
        return empty, None, (f"sequences: two per-sequence counts are shown by {scored[0][0]} kernels each; "
                             f"no seqs variable")
    n_k, members = scored[0]
    win = fields.set_index(key).loc[members].reset_index()
    per = win.groupby("forward")["value"].agg(["min", "max"])
    seqs = per.loc[per["min"] == per["max"], "min"].astype("int64")
    seqs.index.name = None
    src = Source("seqs", "per-sequence count", sorted(members), n_k,
                 f"{len(members)} field(s) of {n_k} kernels; {len(seqs)} forwards have a value")
    return seqs, src, ""


def context(forwards: pd.DataFrame, tokens: pd.Series, seqs: pd.Series) -> pd.Series:
    """The `ctx` variable: tokens accumulated inside a request window, for the windows that serve
    one sequence (every window when there is no `seqs` variable)."""
    f = forwards.set_index("forward")
    tok = tokens.reindex(f.index)
    ctx = tok.groupby(f["window"]).cumsum()
    if len(seqs):
        one = (seqs.reindex(f.index) == 1).groupby(f["window"]).transform("all")
        ctx = ctx[one.to_numpy()]
    return ctx.dropna().astype("int64")


def forward_vars(launches: pd.DataFrame, params: pd.DataFrame, sites, forwards: pd.DataFrame,
                 tokens: pd.Series) -> ForwardVars:
    """Every variable of every forward (module docstring). A variable that adds nothing is left
    out: `ctx` where it equals tokens in every forward (as before `seqs` existed), `seqs` where
    no per-sequence count was found."""
    serve = set(forwards.loc[forwards["phase"] == "serve", "forward"].tolist()) if "phase" in forwards \
        else set(forwards["forward"].tolist())
    symbol_of = dict(zip(sites.index["site"].astype(str), sites.index["symbol"].astype(str)))
    seqs, src, note = sequences(field_values(launches, params, sites.table), tokens, serve, symbol_of)
    values = {"tokens": tokens}
    sources, notes = [], [note] if note else []
    if src is not None:
        values["seqs"] = seqs
        sources.append(src)
    ctx = context(forwards, tokens, seqs)
    tok = tokens.reindex(ctx.index)
    if (ctx != tok).any():
        values["ctx"] = ctx
        sources.append(Source("ctx", "tokens accumulated in a request window",
                              note="windows serving one sequence" if len(seqs) else "every window"))
    return ForwardVars(values, sources, notes)
