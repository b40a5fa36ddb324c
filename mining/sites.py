"""Call sites across forwards, the tokens reference, and the layer structure.

Why: in an eager engine the launch order inside a forward is deterministic, so a *call site* --
(symbol, occurrence index within the forward) -- is the same piece of model code in every forward.
Lining sites up across forwards turns each forward into one sample point per site.

- `align`: per symbol, the modal occurrence count over the forwards that launch it; a forward with
  another count is left out for that symbol only (reported as partial coverage). Forwards come
  from `passes.py`, whose jitter repair already put stray boundary launches back.
- `choose_reference`: the token count is not recorded, so a proxy is chosen by the data: every
  grid axis of a kernel that runs exactly once per forward and varies is tried, and the one under
  which the layer sites that fail to fit (or stay underdetermined) cover the fewest forwards wins,
  then the one under which the fewest sites fail at all (the layers run every token of a step; a
  batch's sampling and input staging run per sequence, so a sequence counter fits the tail and
  must lose to the token counter the layers follow); ties go to more distinct values, then fewer
  forwards dropped, then the smaller scale.
- `layer_blocks`: the longest run of a repeating block of symbols inside a forward gives the
  number of layers N and the sites per layer P (per distinct forward shape; prefill and decode can
  differ by a kernel). Every site inside the run gets (layer, position).
Not attempted: nested repetition (e.g. experts inside layers), sites whose order changes between
forwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vocab.analysis import SITE_SEP, site_name
from mining.fit import fit

GRID = ("grid_x", "grid_y", "grid_z")


@dataclass
class Sites:
    table: pd.DataFrame      # one row per launch inside a forward: row, seq, forward, symbol, occ, kept, site
    index: pd.DataFrame      # one row per site: site, symbol, occ, n_forwards, layer, pos
    partial: pd.DataFrame    # symbol, modal_count, forwards_present, forwards_kept, counts


def align(launches: pd.DataFrame, forward: np.ndarray, executed: pd.DataFrame | None = None,
          names: pd.Index | None = None) -> Sites:
    """Call sites over the forwards. With `executed` (mining/forwards.py), the rows are kernel
    executions (graph replays included) in executed order, named by kernel identity (`names`,
    indexed by the `kernel` code); without it, dump launches (the core-kernel split). A site is
    (symbol, occurrence) either way -- one piece of code at one place of the forward, whichever
    build of it ran (Triton specialises a kernel for a size of 1, so decode runs another build of
    the same site) -- and `kernel` keeps the identity each execution ran."""
    if executed is not None:
        pos = np.flatnonzero(executed["forward"].to_numpy() >= 0)
        rows = executed["row"].to_numpy()[pos]
        t = pd.DataFrame({"row": rows, "seq": executed["seq"].to_numpy()[pos],
                          "forward": executed["forward"].to_numpy()[pos],
                          "symbol": launches["symbol"].astype(str).to_numpy()[rows],
                          "kernel": np.asarray(names)[executed["kernel"].to_numpy()[pos]],
                          "xpos": pos, "layer_e": executed["layer"].to_numpy()[pos],
                          "pos_e": executed["pos"].to_numpy()[pos]})
        t = t.sort_values(["forward", "xpos"], kind="stable", ignore_index=True)
    else:
        rows = np.flatnonzero(forward >= 0)
        t = pd.DataFrame({"row": rows, "seq": launches["seq"].to_numpy()[rows],
                          "forward": forward[rows],
                          "symbol": launches["symbol"].to_numpy()[rows]})
        t["symbol"] = t["symbol"].astype(str)
        t = t.sort_values(["forward", "seq"], kind="stable", ignore_index=True)
        t["layer_e"], t["pos_e"] = -1, -1
        t["kernel"] = t["symbol"].astype(str)
    t["symbol"] = t["symbol"].astype(str)
    sha = launches["sha256"]
    t["sha256"] = pd.Categorical.from_codes(sha.cat.codes.to_numpy()[t["row"].to_numpy()], sha.cat.categories)
    t["occ"] = t.groupby(["forward", "symbol"]).cumcount().astype("int32")
    counts = t.groupby(["symbol", "forward"]).size().rename("n").reset_index()
    modal = counts.groupby("symbol")["n"].agg(lambda s: int(s.mode().max())).rename("modal")
    counts = counts.join(modal, on="symbol")
    counts["ok"] = counts["n"] == counts["modal"]
    t = t.merge(counts[["symbol", "forward", "ok"]], on=["symbol", "forward"], how="left")
    t = t.rename(columns={"ok": "kept"})
    t["site"] = t["symbol"] + SITE_SEP + t["occ"].astype(str)
    kept = t[t["kept"]]
    idx = kept.groupby("site").agg(symbol=("symbol", "first"), occ=("occ", "first"),
                                   n_forwards=("forward", "nunique"), first_seq=("seq", "min"),
                                   builds=("kernel", "nunique"))
    # sites in the order they first run: by their first forward, then position in it
    first_row = pd.Series(kept.index.to_numpy(), index=kept["site"].to_numpy()).groupby(level=0).min()
    order = pd.DataFrame({"f0": kept.groupby("site")["forward"].min(), "r0": first_row})
    idx = idx.join(order).sort_values(["f0", "r0"]).drop(columns=["f0", "r0"])
    # as plain strings: an aggregate of a categorical column is cast back to it by some pandas
    builds = pd.Series(kept["sha256"].astype(str).to_numpy(), index=kept["site"].to_numpy())
    idx["sha256"] = builds.groupby(level=0).agg(lambda v: sorted(set(v))).reindex(idx.index)
    idx = idx.reset_index()
    idx["layer"], idx["pos"] = -1, -1
    g = counts.groupby("symbol")
    partial = pd.DataFrame({
        "modal_count": g["modal"].first(), "forwards_present": g.size(),
        "forwards_kept": g["ok"].sum(),
        "counts": g["n"].agg(lambda s: sorted(set(s.tolist()))),
    }).reset_index()
    partial = partial[partial["forwards_kept"] < partial["forwards_present"]].reset_index(drop=True)
    t["site"] = t["site"].astype("category")
    # a million launches of a few hundred kernels: interned, not a string per row
    t["symbol"] = t["symbol"].astype("category")
    t["kernel"] = t["kernel"].astype("category")
    return Sites(t, idx, partial)


def stack_layers(sites: Sites) -> None:
    """Fill sites.index layer/pos from the step detector's per-execution layer map: the most
    common (layer, pos) of each site over the forwards that keep it."""
    kept = sites.table[sites.table["kept"]]
    lp = kept.groupby("site", observed=True)[["layer_e", "pos_e"]].agg(lambda s: int(s.mode().iloc[0]))
    idx = sites.index
    idx["layer"] = idx["site"].map(lp["layer_e"]).fillna(-1).astype(int)
    idx["pos"] = idx["site"].map(lp["pos_e"]).fillna(-1).astype(int)
    idx.loc[idx["layer"] < 0, "pos"] = -1


def site_samples(launches: pd.DataFrame, sites: Sites, cols=GRID) -> dict[str, tuple]:
    """site -> (forwards, values[n, len(cols)]) over the kept launches."""
    kept = sites.table[sites.table["kept"]]
    vals = launches[list(cols)].to_numpy()[kept["row"].to_numpy()]
    out = {}
    for site, pos in kept.groupby("site", observed=True).indices.items():
        out[site] = (kept["forward"].to_numpy()[pos], vals[pos])
    return out


def _score(samples: dict, tokens: pd.Series, layered: set | None = None) -> tuple[int, int]:
    """(sites that fail to fit under `tokens`, the forwards those inside the layer stack cover):
    a layer site seen in one or two forwards (a GEMM build picked for one size) fails under any
    variable and says little; one seen in every forward that fails is strong evidence."""
    fails = in_layers = 0
    tok = tokens.to_dict()
    for site, (fwds, vals) in samples.items():
        have = np.array([f in tok for f in fwds])
        if have.sum() == 0:
            continue
        x = np.array([tok[f] for f in fwds[have]])
        for ax in range(vals.shape[1]):
            if fit(x, vals[have, ax]).status not in ("fit", "piecewise"):
                fails += 1
                in_layers += int(have.sum()) if layered is not None and site in layered else 0
                break
    return fails, in_layers


@dataclass
class Reference:
    symbol: str | None
    axis: str | None
    tokens: pd.Series                  # forward -> tokens (only forwards where the reference ran)
    candidates: list[dict] = field(default_factory=list)


def token_sources(sites: Sites, executed: pd.DataFrame | None, ref: Reference) -> pd.Series:
    """forward -> where its tokens value comes from: `launch` (the reference kernel was launched
    at that size) or `graph` (it ran from a CUDA-graph replay, so the value is the size the graph
    was captured at: an engine pads a batch up to its nearest captured size, and the real count
    then lives only in device memory, which a capture does not read)."""
    if ref.symbol is None:
        return pd.Series(dtype=object)
    t = sites.table
    m = (t["site"] == site_name(ref.symbol, 0)).to_numpy()
    if executed is None or "xpos" not in t:
        return pd.Series("launch", index=t["forward"].to_numpy()[m], dtype=object)
    replayed = executed["replay"].to_numpy()[t["xpos"].to_numpy()[m]] >= 0
    return pd.Series(np.where(replayed, "graph", "launch"), index=t["forward"].to_numpy()[m], dtype=object)


def _same_per_forward(samples: dict, symbol: str, k: int) -> bool:
    """Do the k sites of `symbol` (occurrences 0..k-1 in a forward) launch at one grid in every
    forward: a per-layer kernel sized by the step, not by its layer."""
    base = samples.get(site_name(symbol, 0))
    if base is None:
        return False
    ref = {int(f): tuple(v) for f, v in zip(base[0], base[1])}
    for occ in range(1, k):
        got = samples.get(site_name(symbol, occ))
        if got is None or any(int(f) in ref and ref[int(f)] != tuple(v) for f, v in zip(got[0], got[1])):
            return False
    return True


def _finer(best: dict, layer_cands: list, samples: dict, among: set | None = None) -> dict | None:
    """A per-layer kernel's grid axis that counts the tokens more finely than the once-per-forward
    reference: 1 at its smallest, as the reference is (a one-token step), at least the reference in every
    forward both ran in and above it in some, with the reference a fitted function of it (a
    ceil_div of it). Why: a compiled model's one-per-forward kernels can all count blocks of rows
    (Inductor's fused embedding and norm at hidden 256 takes 4 rows a block: ceil(tokens / 4)),
    while a per-layer KV writer launches a block per token; a grid of tokens times heads is no
    finer (it is not 1 at a one-token step)."""
    ref = best["tokens"]
    out, out_cov = None, -1
    for r in layer_cands:
        fwds, vals = samples[r["site"]]
        for k, ax in enumerate(GRID):
            t = pd.Series(vals[:, k], index=fwds).sort_index()
            t = t[~t.index.duplicated()]
            common = ref.index.intersection(t.index)
            want = ref.index if among is None else ref.index[ref.index.isin(among)]
            if len(common) < 3 or t.nunique() < 2 or len(want.intersection(t.index)) < 0.9 * len(want):
                continue          # it must run where the reference runs (the serving forwards, once known)
            a, b = t.loc[common].to_numpy(), ref.loc[common].to_numpy()
            if not ((a >= b).all() and (a > b).any() and a.min() == 1 and b.min() == 1):
                continue
            if fit(a, b).status != "fit":
                continue
            # the one running in more of the forwards wins, then the finer: a decode-only kernel
            # (a split-KV reduction) equals the KV writer wherever it runs, and is blind to the
            # prefills it skips
            cov = len(want.intersection(t.index))
            if out is None or cov > out_cov or (
                    cov == out_cov and (t.loc[common] >= out["tokens"].reindex(common).fillna(0)).all()):
                out_cov = cov
                out = {"symbol": r["symbol"], "axis": ax, "failures": best["failures"], "layer_failures": 0,
                       "distinct": int(t.nunique()), "dropped": best["dropped"], "max": int(t.max()),
                       "tokens": t, "flat": False, "finer_than": best["symbol"]}
    return out


def choose_reference(launches: pd.DataFrame, sites: Sites, n_forwards: int,
                     among: set | None = None) -> Reference:
    """The tokens reference (module docstring). `among`: the forwards whose coverage counts
    (the serving ones, once phases are known: a warm-up pass that skips a kernel says nothing
    about the requests)."""
    samples = site_samples(launches, sites)
    once = sites.index[(sites.index["occ"] == 0)]
    modal1 = set(sites.partial.loc[sites.partial["modal_count"] != 1, "symbol"])
    per_fwd = (sites.table.groupby(["symbol", "forward"]).size().groupby(level=0)
               .agg(lambda c: int(c.mode().max())).to_dict())
    layered = set(sites.index.loc[sites.index["layer"] >= 0, "site"]) if "layer" in sites.index else set()
    layer_cands: list = []
    cands = []
    for _, r in once.iterrows():
        # runs once per forward: its modal count is 1 (a forward that launched it twice, a
        # merged or a split one, only leaves that forward out of its samples); a kernel run k
        # times, once per layer at one grid within each forward, is a finer candidate only
        # (`_finer`)
        multi = per_fwd.get(r["symbol"], 0) > 1
        if multi:
            if _same_per_forward(samples, r["symbol"], per_fwd[r["symbol"]]):
                layer_cands.append(r)
            continue
        if r["symbol"] in modal1 or per_fwd.get(r["symbol"], 0) != 1:
            continue
        fwds, vals = samples[r["site"]]
        for k, ax in enumerate(GRID):
            if len(np.unique(vals[:, k])) < 2 or (vals[:, k] < 1).any():
                continue
            tokens = pd.Series(vals[:, k], index=fwds).sort_index()
            # constant over the requests: it counts something else (ranked last, still listed)
            flat = among is not None and tokens[tokens.index.isin(among)].nunique() < 2
            fails, layer_fails = _score(samples, tokens, layered)
            cands.append({"symbol": r["symbol"], "axis": ax, "failures": fails, "layer_failures": layer_fails,
                          "distinct": int(tokens.nunique()),
                          "dropped": int(n_forwards - len(tokens)) if among is None else
                          int(len(among - set(tokens.index.tolist()))), "max": int(tokens.max()),
                          "tokens": tokens, "flat": flat})
    if not cands:
        return Reference(None, None, pd.Series(dtype="int64"), [])
    # "runs exactly once per forward": a kernel missing from more than a tenth of the forwards
    # (one that only runs when a request starts, say) scores few failures only because the
    # forwards it misses are left out of the fits; it loses to any kernel that covers them
    n_cov = n_forwards if among is None else len(among)
    # the layers run every token of the step (a batch's sequences packed together); the head and
    # tail also run per-sequence work (sampling, input staging), so the sites inside the layer
    # stack judge first: a kernel counting sequences fits the sampler and loses to one counting
    # the tokens the layers see
    cands.sort(key=lambda c: (c["flat"], c["dropped"] > n_cov // 10, c["layer_failures"], c["failures"],
                              -c["distinct"],
                              c["dropped"], c["max"]))
    best = cands[0]
    finer = _finer(best, layer_cands, samples, among)
    if finer is not None:
        best = finer
        cands.insert(0, finer)
    public = [{k: v for k, v in c.items() if k not in ("tokens", "flat", "layer_failures")} for c in cands]
    return Reference(best["symbol"], best["axis"], best["tokens"], public)


def find_block(seq: np.ndarray) -> tuple[int, int, int]:
    """(start, period, repeats) of the longest periodic run in `seq`; repeats 1 if none."""
    n = len(seq)
    best = (0, n, 1)
    best_cov = 0
    for p in range(1, n // 2 + 1):
        eq = seq[:-p] == seq[p:]
        if not eq.any():
            continue
        padded = np.concatenate([[False], eq, [False]])
        d = np.diff(padded.astype(np.int8))
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        lens = ends - starts
        k = int(np.argmax(lens))
        reps = (int(lens[k]) + p) // p
        if reps >= 2 and reps * p > best_cov:
            best_cov = reps * p
            best = (int(starts[k]), p, reps)
    return best


def layer_blocks(sites: Sites) -> list[dict]:
    """Detect the layer block per distinct forward shape; fills sites.index layer/pos in place."""
    t = sites.table
    shapes: dict[tuple, list[int]] = {}
    for f, grp in t.groupby("forward"):
        shapes.setdefault(tuple(grp["symbol"]), []).append(int(f))
    found, where = [], {}
    for shape, fwds in sorted(shapes.items(), key=lambda kv: -len(kv[1])):
        codes = pd.factorize(pd.Series(shape))[0]
        start, period, reps = find_block(codes)
        found.append({"forwards": len(fwds), "example_forward": fwds[0], "start": start,
                      "sites_per_layer": period, "layers": reps, "launches": len(shape)})
        if reps < 2:
            continue
        grp = t[t["forward"] == fwds[0]].reset_index(drop=True)
        for p in range(start, start + period * reps):
            where.setdefault(str(grp.loc[p, "site"]), ((p - start) // period, (p - start) % period))
    idx = sites.index
    idx["layer"] = [where.get(s, (-1, -1))[0] for s in idx["site"]]
    idx["pos"] = [where.get(s, (-1, -1))[1] for s in idx["site"]]
    return found
