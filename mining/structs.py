"""By-value struct parameters word by word: which words are pointers, sizes, constants.

Why: many kernels take their arguments as one aggregate passed by value -- an elementwise
kernel's 40-80 B struct with its tensors' pointers inside, a norm's 16 B {pointer, rows, stride}
tensor struct, cuBLASLt's 1720 B GEMM block whose M is the token count, an attention kernel's
1-1.3 KB struct. A generator or compiler has to know, for every 8-byte word of such a parameter,
whether to bind a buffer there, compute a size from the run-time variables, or copy a constant.
The capture classifies every aligned word of every parameter (`ptrs[].at`, or offline from the
allocation log) and `pointers.py` gives each pointer word (site, i, at) its role; this module
covers the whole struct, every word of every parameter wider than 8 bytes:

- `struct_words(params)`: the struct parameters of every launch, one row per (launch, i) with its
  bytes; `classify` reads them as little-endian 8-byte words (a short tail as one word of its
  size), each distinct byte string of a group once;
- `classify(...)`: one row per (scope, site, i, at). Scope `site`: call sites of the forwards,
  samples are forwards; scope `kernel`: kernels that never run in a kept forward (start-up work,
  a capture without forwards), grouped by symbol, samples are launches. Kinds:
    pointer        a pointer in every sample (`role` from the pointer table at site scope)
    maybe_pointer  a pointer in some samples only
    const          one value in every sample
    size           varies and fits a function of the run-time variables (tokens, ctx; fit.py)
    varies         varies and fits nothing (or the data cannot decide: `status` says which)
    lanes          varies and is two 4-byte fields: its high half is neither all 0 nor all
                   0xffffffff, so it is no 8-byte integer; each lane is const, size or varies
- `param_table(words)`: one row per struct parameter, its words counted by kind;
- `report_rows(words, short)`: the rows `mine analyze --section structs` prints, `summary` its
  one line otherwise; `document(words)`: the analysis JSON's `structs` section (vocab/structs.py).

A word is only what the bytes say: fields narrower than 4 bytes are read inside their word or
lane, a varying floating-point field reads as `varies`, and a host pointer inside a struct is a
constant or a varying word (the params frame does not carry host pointees). Nothing here knows an
engine: no kernel names, no struct layouts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STRUCT_MIN_BYTES = 9          # a parameter wider than one word is an aggregate passed by value
KINDS = ("pointer", "maybe_pointer", "const", "size", "varies", "lanes")
WORD_COLS = ["scope", "site", "symbol", "layer", "pos", "i", "psize", "at", "wsize", "kind", "role",
             "buffer_id", "offset", "addresses", "samples", "ptr_samples", "value", "distinct",
             "expr", "status", "points", "holdout", "note", "lanes"]


def _decode(h: str) -> tuple[np.ndarray, np.ndarray]:
    """(values u64, byte sizes) of the words of one parameter's hex (8-byte words, a short tail)."""
    try:
        raw = bytes.fromhex(h) if h else b""
    except ValueError:              # a damaged hex string: no words rather than wrong ones
        raw = b""
    full = len(raw) // 8
    vals = np.frombuffer(raw[:8 * full], "<u8").astype(np.uint64)
    sizes = np.full(full, 8, np.int64)
    if len(raw) % 8:
        vals = np.append(vals, np.uint64(int.from_bytes(raw[8 * full:], "little")))
        sizes = np.append(sizes, len(raw) % 8)
    return vals, sizes


def struct_words(params: pd.DataFrame) -> pd.DataFrame:
    """The struct parameters of every launch: seq, i, psize, hex (one row per parameter) -- the
    rows `classify` decodes, each distinct hex once."""
    m = ~params["word"].to_numpy() & (params["size"].to_numpy() >= STRUCT_MIN_BYTES)
    p = params.loc[m, ["seq", "i", "size", "hex"]]
    return pd.DataFrame({"seq": p["seq"].to_numpy(np.int64), "i": p["i"].to_numpy(np.int64),
                         "psize": p["size"].to_numpy(np.int64),
                         "hex": p["hex"].astype(object).where(p["hex"].notna(), "").to_numpy()})


def _pointer_rows(params: pd.DataFrame, seqs: np.ndarray) -> pd.DataFrame:
    """Pointer words of the struct parameters: seq, i, at, buffer_id, ptr_off."""
    ptr = params.loc[params["is_ptr"].to_numpy() & np.isin(params["seq"].to_numpy(), seqs),
                     ["seq", "i", "at", "buffer_id", "ptr_off"]]
    return ptr.astype({"seq": np.int64, "i": np.int64, "at": np.int64})


def _signed(v: np.ndarray, size: int) -> np.ndarray:
    if size == 8:
        return v.astype(np.uint64).view(np.int64)
    if size == 4:
        return v.astype(np.uint32).view(np.int32).astype(np.int64)
    return v.astype(np.int64)


def _const_note(v: int, size: int) -> str:
    """How a constant word also reads: as a double, or as two 4-byte fields."""
    if size != 8:
        return ""
    u = np.uint64(v & (2 ** 64 - 1))
    f = float(np.array([u]).view(np.float64)[0])
    if np.isfinite(f) and 1e-12 < abs(f) < 1e12 and int(u) >= 1 << 52:
        return f"reads as double {f:g}"
    hi = int(u) >> 32
    if hi not in (0, 0xFFFFFFFF):
        lo = int(_signed(np.array([int(u) & 0xFFFFFFFF], np.uint64), 4)[0])
        return f"as two 4-byte fields: {lo}, {int(_signed(np.array([hi], np.uint64), 4)[0])}"
    return ""


def _fit_kind(fit: dict) -> str:
    ok = fit["status"] in ("fit", "piecewise") and any(k in (fit.get("expr") or "") for k in ("tokens", "ctx"))
    return "size" if ok else "varies"


def _scalar(vals: np.ndarray, size: int, samples: np.ndarray, fitter) -> dict:
    """One varying scalar word (or lane): its kind and fit."""
    sv = _signed(vals, size)
    if fitter is None:
        return {"kind": "varies", "expr": None, "status": "", "points": 0, "holdout": "", "note": ""}
    f = fitter(samples, sv)
    alts = " | ".join(f.get("alternatives") or [])
    note = f.get("note") or ""
    if f["status"] == "underdetermined" and alts:
        note = f"{note}: {alts}" if note else alts
    return {"kind": _fit_kind(f), "expr": f.get("expr"), "status": f["status"], "points": int(f["points"]),
            "holdout": f.get("holdout", ""), "note": note}


def _lanes(vals: np.ndarray, samples: np.ndarray, fitter) -> list[dict]:
    out = []
    for lane, part in enumerate((vals & np.uint64(0xFFFFFFFF), vals >> np.uint64(32))):
        first = int(_signed(part[:1], 4)[0])
        if (part == part[0]).all():
            out.append({"lane": lane, "kind": "const", "value": first, "expr": None, "status": ""})
            continue
        s = _scalar(part, 4, samples, fitter)
        out.append({"lane": lane, "kind": s["kind"], "value": first, "expr": s["expr"], "status": s["status"]})
    return out


def _group_words(hexes: np.ndarray, samples: np.ndarray, seqs: np.ndarray, ptr: tuple | None,
                 fitter) -> dict | None:
    """Every word of one struct parameter over its samples (one launch each): column arrays. Each
    distinct hex is decoded once; nothing decoded outlives the group (a capture's hexes of one
    site differ per forward wherever a workspace pointer moves)."""
    uniq, inv = np.unique(hexes, return_inverse=True)
    dec = [_decode(h) for h in uniq]
    nw = max((len(v) for v, _ in dec), default=0)
    if nw == 0:
        return None
    V = np.zeros((len(uniq), nw), np.uint64)
    H = np.zeros((len(uniq), nw), bool)
    W = np.zeros(nw, np.int64)
    for k, (v, sz) in enumerate(dec):
        V[k, :len(v)] = v
        H[k, :len(v)] = True
        W[:len(sz)] = np.maximum(W[:len(sz)], sz)
    V, H = V[inv], H[inv]
    n = len(seqs)
    P = np.zeros((n, nw), bool)
    B = np.full((n, nw), -1, np.int64)
    O = np.zeros((n, nw), np.int64)
    if ptr is not None and len(ptr[0]):
        pseq, pat, pbid, poff = ptr
        order = np.argsort(seqs, kind="stable")
        k = np.searchsorted(seqs[order], pseq).clip(0, n - 1)
        ok = (seqs[order][k] == pseq) & (pat // 8 < nw) & (pat % 8 == 0)
        r, col = order[k[ok]], pat[ok] // 8
        P[r, col] = True
        B[r, col] = pbid[ok]
        O[r, col] = poff[ok]
    P &= H
    first = np.argmax(H, axis=0)                       # the first sample holding each word
    cols = np.arange(nw)
    filled = np.where(H, V, V[first, cols])            # a missing word counts as its first value
    srt = np.sort(filled, axis=0)
    distinct = (np.diff(srt, axis=0) != 0).sum(axis=0) + 1 if n > 1 else np.ones(nw, np.int64)
    have, nptr = H.sum(axis=0), P.sum(axis=0)
    pfirst = np.argmax(P, axis=0)
    value = V[first, cols]
    signed = np.where(W == 8, value.view(np.int64),
                      np.where(W == 4, (value & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32),
                               value.astype(np.int64)))
    kind = np.where(nptr == have, "pointer", np.where(nptr > 0, "maybe_pointer",
                                                        np.where(distinct == 1, "const", ""))).astype(object)
    addresses = np.where(nptr == have, distinct, 0)
    note = _const_notes(value, W, kind == "const")
    expr = np.full(nw, None, object)
    status, holdout = np.full(nw, "", object), np.full(nw, "", object)
    points = np.zeros(nw, np.int64)
    lanes = np.empty(nw, object)
    lanes[:] = [[] for _ in range(nw)]
    for j in np.flatnonzero((kind == "maybe_pointer") & (have > 0)):
        addresses[j] = len(np.unique(V[P[:, j], j]))
    for j in np.flatnonzero((kind == "") & (have > 0)):
        v, s = V[H[:, j], j], samples[H[:, j]]
        hi = v >> np.uint64(32)
        if W[j] == 8 and not ((hi == 0).all() or (hi == 0xFFFFFFFF).all()):
            kind[j], lanes[j] = "lanes", _lanes(v, s, fitter)
            continue
        r = _scalar(v, int(W[j]), s, fitter)
        kind[j], expr[j], status[j], points[j], holdout[j], note[j] = (
            r["kind"], r["expr"], r["status"], r["points"], r["holdout"], r["note"])
    out = {"at": 8 * cols, "wsize": W, "samples": have, "ptr_samples": nptr,
           "value": signed.astype(np.int64), "distinct": distinct, "kind": kind,
           "buffer_id": np.where(nptr > 0, B[pfirst, cols], -1),
           "offset": np.where(nptr > 0, O[pfirst, cols], 0), "addresses": addresses,
           "expr": expr, "status": status, "points": points, "holdout": holdout,
           "note": note, "lanes": lanes}
    keep = have > 0
    return {k: v[keep] for k, v in out.items()}


def _const_notes(value: np.ndarray, size: np.ndarray, const: np.ndarray) -> np.ndarray:
    """`_const_note` of every constant word, computed only where there is something to say."""
    note = np.full(len(value), "", object)
    f = value.view(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        dbl = const & (size == 8) & np.isfinite(f) & (np.abs(f) > 1e-12) & (np.abs(f) < 1e12) & (value >= 1 << 52)
    hi = value >> np.uint64(32)
    two = const & (size == 8) & ~dbl & (hi != 0) & (hi != 0xFFFFFFFF)
    for j in np.flatnonzero(dbl | two):
        note[j] = _const_note(int(value[j]), 8)
    return note


def classify(sw: pd.DataFrame, params: pd.DataFrame, launches: pd.DataFrame, table: pd.DataFrame,
             index: pd.DataFrame, pointers: pd.DataFrame, fitter=None) -> pd.DataFrame:
    """One row per word of every struct parameter (columns WORD_COLS; module docstring).

    `sw` is `struct_words(params)`; `table`/`index` the call sites (sites.py), `pointers` the
    pointer table (pointers.py) whose role a site-scope pointer word takes; `fitter(samples,
    values) -> fit dict` fits a varying word over the forwards (analyze.py's), None: not fitted."""
    if sw.empty:
        return pd.DataFrame(columns=WORD_COLS)
    sym = pd.Series(launches["symbol"].astype(str).to_numpy(), index=launches["seq"].to_numpy())
    sw = sw.assign(symbol=sym.reindex(sw["seq"].to_numpy()).to_numpy())
    kept = table.loc[table["kept"], ["seq", "forward", "site"]].astype({"site": str})
    sw = sw.merge(kept, on="seq", how="left")
    in_site = sw["site"].notna().to_numpy()
    sited = set(table.loc[table["kept"], "symbol"].astype(str))
    outside = ~in_site & ~sw["symbol"].isin(sited).to_numpy()
    seq_a, hex_a, fwd_a = sw["seq"].to_numpy(), sw["hex"].to_numpy(), sw["forward"].to_numpy()
    sym_a, i_a, size_a = sw["symbol"].to_numpy(), sw["i"].to_numpy(), sw["psize"].to_numpy()
    groups = []                                     # (scope, name, i, rows of sw)
    for scope, mask, key in (("site", in_site, "site"), ("kernel", outside, "symbol")):
        rows = np.flatnonzero(mask)
        g = pd.DataFrame({"k": sw[key].to_numpy()[rows], "i": i_a[rows]}).groupby(["k", "i"], sort=False).indices
        groups += [(scope, name, i, rows[pos]) for (name, i), pos in g.items()]
    gid = np.full(len(sw), -1, np.int64)
    for k, (_, _, _, r) in enumerate(groups):
        gid[r] = k
    # the struct parameters' pointer words, each tagged with its group, sorted by it: one pass
    ptr = _pointer_rows(params, seq_a).merge(pd.DataFrame({"seq": seq_a, "i": i_a, "g": gid}), on=["seq", "i"])
    ptr = ptr[ptr["g"] >= 0].sort_values("g", kind="stable")
    pg_all = [ptr[c].to_numpy(np.int64) for c in ("seq", "at", "buffer_id", "ptr_off")]
    bounds = np.searchsorted(ptr["g"].to_numpy(), np.arange(len(groups) + 1))
    parts: dict[str, list] = {}
    for k, (scope, name, i, r) in enumerate(groups):
        seqs = seq_a[r]
        samples = fwd_a[r].astype(np.int64) if scope == "site" else seqs
        pg = tuple(a[bounds[k]:bounds[k + 1]] for a in pg_all)
        cols = _group_words(hex_a[r], samples, seqs, pg, fitter if scope == "site" else None)
        if cols is None:
            continue
        n = len(cols["at"])
        cols.update(scope=np.full(n, scope, object), site=np.full(n, str(name) if scope == "site" else "", object),
                    symbol=np.full(n, str(sym_a[r[0]]), object), i=np.full(n, int(i), np.int64),
                    psize=np.full(n, int(size_a[r].max()), np.int64))
        for c, v in cols.items():
            parts.setdefault(c, []).append(v)
    if not parts:
        return pd.DataFrame(columns=WORD_COLS)
    out = pd.DataFrame({c: np.concatenate(v) for c, v in parts.items()})
    lp = index[["site", "layer", "pos"]].astype({"site": str}) if len(index) else None
    if lp is not None:
        out = out.merge(lp, on="site", how="left")
    for c in ("layer", "pos"):
        out[c] = out[c].fillna(-1).astype(np.int64) if c in out else -1
    out["role"] = ""
    if len(pointers):
        r = pointers[["site", "i", "at", "role"]].astype({"site": str, "i": np.int64, "at": np.int64})
        r = r.rename(columns={"role": "prole"})
        out = out.merge(r, on=["site", "i", "at"], how="left")
        isptr = out["kind"].isin(["pointer", "maybe_pointer"]) & (out["scope"] == "site")
        out.loc[isptr, "role"] = out.loc[isptr, "prole"].fillna("")
        out = out.drop(columns="prole")
    out = out[WORD_COLS].reset_index(drop=True)
    out["expr"] = [e if isinstance(e, str) else None for e in out["expr"]]
    return out


def param_table(words: pd.DataFrame) -> pd.DataFrame:
    """One row per struct parameter: scope, site, symbol, layer, pos, i, psize, samples and its
    words counted by kind."""
    cols = ["scope", "site", "symbol", "layer", "pos", "i", "psize", "samples", "words", *KINDS]
    if words.empty:
        return pd.DataFrame(columns=cols)
    key = ["scope", "site", "symbol", "i"]
    g = words.groupby(key, sort=False)
    out = g.agg(layer=("layer", "first"), pos=("pos", "first"), psize=("psize", "first"),
                samples=("samples", "max"), words=("at", "size")).reset_index()
    counts = words.groupby(key + ["kind"], sort=False).size().unstack("kind", fill_value=0)
    out = out.join(counts.reindex(columns=list(KINDS), fill_value=0), on=key)
    return out[cols]


def _word_text(w) -> str:
    at = f"@{int(w.at)}"
    if w.kind == "pointer":
        return f"{at} ptr {w.role}".rstrip() if w.role else f"{at} ptr"
    if w.kind == "maybe_pointer":
        return f"{at} ptr?"
    if w.kind == "size":
        return f"{at}={w.expr}"
    if w.kind == "lanes":
        parts = [(str(ln["value"]) if ln["kind"] == "const" else
                  (ln["expr"] if ln["kind"] == "size" else "varies")) for ln in w.lanes]
        return f"{at}=[{' | '.join(parts)}]"
    return f"{at} varies"


def report_rows(words: pd.DataFrame, short: dict[str, str] | None = None, layer0: bool = True,
                named: int = 8) -> pd.DataFrame:
    """Per struct parameter, its words counted by kind and the first `named` non-constant words in
    one line (`@8 ptr weight, @16=tokens, @24=[tokens | 1024]`). `layer0`: site-scope parameters of
    layer 0 and outside the layers only (the other layers repeat layer 0), then the kernel-scope
    ones (their kernel named `#*`)."""
    cols = ["kernel", "param", "bytes", "layer", "ptr", "size", "const", "other", "words"]
    if words.empty:
        return pd.DataFrame(columns=cols)
    w = words
    if layer0:
        w = w[(w["scope"] == "kernel") | (w["layer"] <= 0)]
    short = short or {}
    rows = []
    for (scope, site, sym, i), g in w.groupby(["scope", "site", "symbol", "i"], sort=False):
        k = g["kind"]
        texts = [_word_text(x) for x in g.itertuples() if x.kind != "const"]
        more = f", … {len(texts) - named} more" if len(texts) > named else ""
        occ = site.rsplit("#", 1)[-1] if scope == "site" else "*"
        lanes_size = [any(ln["kind"] == "size" for ln in x) for x in g["lanes"]]
        rows.append({"kernel": f"{short.get(sym, sym)}#{occ}", "param": int(i),
                     "bytes": int(g["psize"].iloc[0]), "layer": int(g["layer"].iloc[0]),
                     "ptr": int(k.isin(["pointer", "maybe_pointer"]).sum()),
                     "size": int((k == "size").sum() + sum(lanes_size)), "const": int((k == "const").sum()),
                     "other": int(k.isin(["varies", "lanes"]).sum() - sum(lanes_size)),
                     "words": ", ".join(texts[:named]) + more})
    return pd.DataFrame(rows, columns=cols)


def summary(words: pd.DataFrame) -> str:
    """One line: struct parameters, call sites, words by kind."""
    if words.empty:
        return ""
    t = param_table(words)
    sites = t.loc[t["scope"] == "site", "site"].nunique()
    kinds = words["kind"].value_counts()
    by = ", ".join(f"{k} {int(kinds[k]):,}" for k in KINDS if k in kinds)
    return (f"struct parameters: {len(t):,} ({sites:,} call sites, {int((t['scope'] == 'kernel').sum()):,} "
            f"outside the forwards); words: {by}")


def _runs(at: np.ndarray) -> list[list[int]]:
    """Offsets of words 8 bytes apart as [first at, words] runs."""
    if len(at) == 0:
        return []
    brk = np.flatnonzero(np.diff(at) != 8) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [len(at)]])
    return [[int(at[a]), int(b - a)] for a, b in zip(starts, ends)]


def document(words: pd.DataFrame):
    """The `structs` section (vocab/structs.py) of the words; None when there are none."""
    from vocab import structs as V

    if words.empty:
        return None
    params = []
    for (scope, site, sym, i), g in words.groupby(["scope", "site", "symbol", "i"], sort=False):
        const = g["kind"].to_numpy() == "const"
        ws = [V.StructWord(int(w.at), int(w.wsize), str(w.kind), str(w.role), int(w.buffer_id), int(w.offset),
                           int(w.addresses), int(w.samples), int(w.ptr_samples), int(w.value), int(w.distinct),
                           w.expr if isinstance(w.expr, str) else None, str(w.status), int(w.points), str(w.holdout),
                           str(w.note), [V.StructLane(int(x["lane"]), str(x["kind"]), int(x["value"]),
                                                      x["expr"], str(x["status"])) for x in w.lanes])
              for w in g[~const].itertuples()]
        params.append(V.StructParam(str(scope), str(site), str(sym), int(g["layer"].iloc[0]), int(g["pos"].iloc[0]),
                                    int(i), int(g["psize"].iloc[0]), int(g["samples"].max()), int(const.sum()),
                                    _runs(g["at"].to_numpy()[const]), ws))
    return V.Structs(V.STRUCTS_VERSION, params)
