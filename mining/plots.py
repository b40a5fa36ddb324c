"""Pictures and traces of an analysis, only when asked: timeline PNG, fit plot, Chrome trace.

Why: the passes and their boundaries are easiest to check by eye, and a Perfetto/Chrome trace lets
one scroll through the launches. matplotlib is imported lazily with the Agg backend, so importing
`mining` never opens a display. Host launch times only (no GPU durations): a launch is drawn as a
slice up to the next launch, capped at 50 us.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from mining import fit as F


def _plt():
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")  # a caller that already chose a backend (a notebook) keeps it
    import matplotlib.pyplot as plt

    return plt


def timeline(a, ax=None):
    """Launch index against host time, forwards shaded, request windows as vertical lines."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 4))
    L = a.dump.launches
    t = (L["t_ns"].to_numpy() - L["t_ns"].iloc[0]) / 1e6
    ax.plot(t, np.arange(len(t)), ",", color="0.3")
    for k, r in a.passes.forwards.iterrows():
        s = (r["start_ns"] - L["t_ns"].iloc[0]) / 1e6
        e = (r["end_ns"] - L["t_ns"].iloc[0]) / 1e6
        ax.axvspan(s, max(e, s + 1e-3), color="C0" if k % 2 else "C1", alpha=0.25, lw=0)
    w = a.passes.window
    for i in np.flatnonzero(np.diff(w)) + 1:
        ax.axvline(t[i], color="C3", lw=0.8)
    ax.set_xlabel("host time since first launch (ms)")
    ax.set_ylabel("launch index")
    ax.set_title("launches; shaded: forward passes; red: request windows")
    return ax


def save_timeline(a, path: str | Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 4))
    timeline(a, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def fit_plot(a, site: str, field: str, ax=None):
    """Sample points of one site field against tokens, with the fitted expression drawn."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3))
    t = a.sites.table
    rows = t[(t["site"].astype(str) == site) & t["kept"]]
    if field.startswith("param"):
        p = a.dump.params
        p = p[(p["i"] == int(field[5:])) & ~p["word"]].merge(rows[["seq", "forward"]], on="seq")
        fw, v = p["forward"].to_numpy(), p["value"].to_numpy().astype(np.int64)
    else:
        fw = rows["forward"].to_numpy()
        v = a.dump.launches[field].to_numpy()[rows["row"].to_numpy()]
    tok = a.reference.tokens
    have = np.isin(fw, tok.index)
    x = tok.reindex(fw[have]).to_numpy()
    ax.scatter(x, v[have], s=14, zorder=3, label="samples")
    match = a.fits[(a.fits["site"] == site) & (a.fits["field"] == field)]
    title = f"{site.split('#')[0][-28:]}#{site.split('#')[-1]} {field}"
    if len(match) and match["status"].iloc[0] in ("fit", "piecewise") and len(x):
        xs = np.unique(np.geomspace(1, max(2, x.max()), 200).astype(np.int64))
        expr = _parse(match["expr"].iloc[0])
        if expr is not None:
            ax.plot(xs, F.evaluate(expr, {"tokens": xs}), color="C1", lw=1, label=match["expr"].iloc[0])
    ax.set_xscale("symlog")
    ax.set_xlabel("tokens")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return ax


def _parse(text: str):
    """A fitted expression as `fit.evaluate` takes it: `fit.parse` for the closed set, and the
    piecewise verdict (`piecewise(tokens==1: a; tokens>1: b)`) read as its two branches; None if
    the text is neither."""
    text = text.strip()
    try:
        if text.startswith("piecewise(") and text.endswith(")"):
            a, b = text[len("piecewise("):-1].split(";")
            return ("piecewise", "tokens", F.parse(a.split(":", 1)[1]), F.parse(b.split(":", 1)[1]))
        return F.parse(text)
    except ValueError:
        return None


def chrome_trace(a) -> dict:
    """Chrome/Perfetto trace events: one slice per launch, one per forward, one per window."""
    L = a.dump.launches
    t0 = int(L["t_ns"].iloc[0])
    ts = (L["t_ns"].to_numpy() - t0) / 1e3
    dur = np.minimum(np.diff(ts, append=ts[-1] + 1.0), 50.0)
    name = L["name"].astype(str).to_numpy()
    grid = L[["grid_x", "grid_y", "grid_z"]].to_numpy()
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"pid {a.dump.pid}"}}]
    for i in range(len(L)):
        ev.append({"name": name[i][:80], "ph": "X", "pid": 1, "tid": 1, "ts": float(ts[i]),
                   "dur": float(max(dur[i], 0.1)),
                   "args": {"seq": int(L["seq"].iat[i]), "grid": grid[i].tolist(),
                            "forward": int(a.passes.forward[i])}})
    tok = a.reference.tokens
    for _, r in a.passes.forwards.iterrows():
        s, e = (r["start_ns"] - t0) / 1e3, (r["end_ns"] - t0) / 1e3
        f = int(r["forward"])
        ev.append({"name": f"forward {f} (tokens {tok.get(f, '?')})", "ph": "X", "pid": 1, "tid": 2,
                   "ts": float(s), "dur": float(max(e - s, 1.0)), "args": {"window": int(r["window"])}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def save_trace(a, path: str | Path) -> Path:
    Path(path).write_text(json.dumps(chrome_trace(a)))
    return Path(path)
