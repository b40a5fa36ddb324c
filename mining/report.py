"""Render an `Analysis` as a terminal report (rich), and the tables the notebook shows.

Why: the same summaries serve `mine analyze` and `notebooks/explore_dump.ipynb`, so the tabulating
lives here as pure functions Analysis -> DataFrame, and `render` only lays those frames out.
Symbols are shown demangled-short (the `name` column when the capture gave one).
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table


def short(sym: str, width: int = 48) -> str:
    return sym if len(sym) <= width else sym[: width - 1] + "…"


def names(a) -> dict[str, str]:
    L = a.dump.launches
    pairs = L[["symbol", "name"]].drop_duplicates("symbol")
    return {str(s): (str(n) or str(s)) for s, n in zip(pairs["symbol"], pairs["name"])}


def forwards_table(a) -> pd.DataFrame:
    """Per forward: window, phase, launches (replayed ones), distinct kernels, tokens, its layer
    stack's pattern and what decided its start."""
    f = a.forwards
    cols = ["forward", "window", "phase", "n_launches", "replayed", "n_kernels", "tokens", "tokens_from", "pattern",
            "cut_by", "confidence", "first_seq", "last_seq"]
    return f[[c for c in cols if c in f]]


def top_kernels(a, n: int = 15) -> pd.DataFrame:
    L = a.dump.launches
    c = L["name"].astype(str).value_counts().head(n)
    return c.rename_axis("kernel").reset_index(name="launches")


def layer_table(a) -> pd.DataFrame:
    """The call sites of one layer (layer 0), in block order, with the symbol's name."""
    idx = a.sites.index
    nm = names(a)
    lay = idx[idx["layer"] == 0].sort_values("pos")
    return pd.DataFrame({"pos": lay["pos"], "site": lay["site"],
                         "kernel": [nm.get(s, s) for s in lay["symbol"]],
                         "forwards": lay["n_forwards"]}).reset_index(drop=True)


def site_params(a, site: str) -> pd.DataFrame:
    """One call site's parameter words across forwards: value, allocation, offset and role."""
    t = a.sites.table
    rows = t[(t["site"].astype(str) == site) & t["kept"]][["seq", "forward"]]
    p = a.dump.params.merge(rows, on="seq")
    roles = a.pointers[a.pointers["site"] == site].set_index(["i", "at"])["role"]
    p["role"] = [roles.get((i, at), "scalar") for i, at in zip(p["i"], p["at"])]
    p["tokens"] = p["forward"].map(a.reference.tokens)
    p["value_hex"] = [hex(int(v)) for v in p["value"]]
    p["alloc_base_hex"] = [hex(int(v)) if ip else "" for v, ip in zip(p["alloc_base"], p["is_ptr"])]
    return p[["forward", "tokens", "i", "at", "size", "value_hex", "is_ptr", "alloc_base_hex",
              "alloc_size", "buffer_id", "ptr_off", "role"]].sort_values(["i", "at", "forward"])


def layer_fits(a, layer: int = 0, varying_only: bool = True) -> pd.DataFrame:
    f = a.fits
    if f.empty:
        return f
    f = f[f["layer"] == layer]
    if varying_only:
        f = f[f["expr"].fillna("").str.contains("tokens|ctx") | (f["status"] != "fit")]
    f = f.assign(kernel=f["symbol"].map(names(a)),
                 alternatives=[" | ".join(x) for x in f["alternatives"]])
    return f[["pos", "kernel", "field", "status", "expr", "points", "holdout", "alternatives"]
             ].sort_values(["pos", "kernel", "field"]).reset_index(drop=True)


def failures(a) -> pd.DataFrame:
    """Fits that are not `fit`, grouped: same kernel and field across layers count once."""
    f = a.fits
    if f.empty:
        return f
    bad = f[~f["status"].isin(["fit", "piecewise"])].copy()
    bad["kernel"] = bad["symbol"].map(names(a))
    bad["why"] = bad["note"]
    g = bad.groupby(["kernel", "field", "status"], observed=True)
    out = g.agg(sites=("site", "nunique"), why=("why", "first"),
                alternatives=("alternatives", "first")).reset_index()
    out["alternatives"] = [" | ".join(x) for x in out["alternatives"]]
    return out


def pointer_roles(a) -> pd.DataFrame:
    p = a.pointers
    if p.empty:
        return pd.DataFrame(columns=["role", "words", "sites", "buffers"])
    g = p.groupby("role")
    return pd.DataFrame({"words": g.size(), "sites": g["site"].nunique(),
                         "allocations": g["buffer_id"].nunique()}).reset_index()


def _table(console: Console, title: str, df: pd.DataFrame, limit: int = 40) -> None:
    t = Table(title=title, title_justify="left", show_lines=False)
    for c in df.columns:
        t.add_column(str(c))
    for row in df.head(limit).itertuples(index=False):
        t.add_row(*[short(str(v), 60) for v in row])
    console.print(t)
    if len(df) > limit:
        console.print(f"  … {len(df) - limit} more rows (see --json)")


def render(a, console: Console | None = None) -> None:
    c = console or Console()
    d = a.dump
    c.print(f"[bold]mine analyze[/] {d.source.parent.name}/{d.source.name}: {len(d.launches)} launches,"
            f" {d.launches['symbol'].nunique()} kernels, pid {d.pid}")
    for n in a.notes:
        c.print(f"[yellow]note:[/] {n}")
    p = a.passes
    f = a.forwards
    serve = int((f["phase"] == "serve").sum()) if "phase" in f else len(f)
    replays = int(p.executed["replay"].max() + 1) if p.executed is not None and len(p.executed) else 0
    if p.method == "layer_stacks":
        kinds = ", ".join(f"{b['kind']} = {b['period']} kernels" for b in p.blocks)
        c.print(f"forwards: {len(f)} ({serve} serving, {len(f) - serve} start-up) in "
                f"{f['window'].nunique()} request windows, found as layer stacks ({kinds}); "
                f"{replays} graph replays expanded, {len(p.captures)} stream captures left out")
    elif p.method == "none":
        c.print("forwards: none (no repeating step in the capture; see the notes)")
    else:
        c.print(f"windows: {len(set(p.window.tolist()))} (gap threshold {p.gap_ns / 1e6:.2f} ms); "
                f"forwards: {len(f)}; core kernel {short(names(a).get(p.core, p.core))} "
                f"x{p.per_forward} per forward")
    _table(c, "Forward passes", forwards_table(a))
    r = a.reference
    if r.symbol:
        c.print(f"tokens reference: [bold]{short(names(a).get(r.symbol, r.symbol))}[/] {r.axis} "
                f"(candidates tried: {len(r.candidates)}); variables: {', '.join(a.variables)}; "
                f"hold-out tokens: {a.holdout_tokens}")
    if a.layers:
        m = max(a.layers, key=lambda b: b["forwards"])
        c.print(f"layers: {m['layers']} x {m['sites_per_layer']} call sites"
                + (f", pattern {m['pattern']}" if m.get("pattern") else "")
                + f" (shapes: {', '.join(str(b.get('pattern') or b['sites_per_layer']) for b in a.layers)})")
        _table(c, "Call sites of layer 0", layer_table(a))
    if not a.strides.empty:
        _table(c, "Per-layer address strides", a.strides)
    _table(c, "Pointer roles", pointer_roles(a))
    if len(a.views):
        many = a.views.groupby("view").size()
        c.print(f"buffer views: {len(many)} groups of pointer words in one allocation at constant "
                f"distances in every forward ({int(many.sum())} words; largest {int(many.max())})")
    f = a.forwards
    graph = int((f["tokens_from"] == "graph").sum()) if "tokens_from" in f else 0
    if graph:
        c.print(f"{graph} forward(s) take their tokens from a CUDA-graph replay: the size the graph was "
                "captured at (the real count is in device memory only)")
    if not a.fits.empty:
        st = a.fits["status"].value_counts().to_dict()
        c.print("fits: " + ", ".join(f"{k} {v}" for k, v in st.items())
                + f"; hold-out: {a.fits['holdout'].value_counts().to_dict()}")
        _table(c, "Fitted expressions of layer 0 (varying or unresolved)", layer_fits(a))
        _table(c, "Not fitted", failures(a))
    if not a.sites.partial.empty:
        _table(c, "Kernels with partial coverage (occurrence count differs)", a.sites.partial)
    if not a.no_layout.empty:
        _table(c, "Kernels whose params have no layout", a.no_layout)
