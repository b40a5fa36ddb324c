"""The analysis facade: dump -> passes -> sites -> reference -> layers -> pointers -> fits.

Why: `mine analyze`, the notebook and the generators all want the same result, so it is computed
here by one pure function, `analyze(dump)`, which returns an `Analysis` of frames, and serialised
by `to_json` (schema in docs/analysis-json.md, ANALYSIS_SCHEMA_VERSION below).

Fitted per call site: the three grid axes, the three block axes, dynamic smem, and every integer
parameter (<= 8 bytes, never a pointer in any forward; 4- and 8-byte values read as signed), as
functions of the variables the data offers (mining/fwdvars.py) -- `tokens` (the chosen
reference), `seqs` (a batched step's sequences, where the capture shows a per-sequence count),
then `ctx` (tokens accumulated inside a request window of one sequence) where it differs from
tokens. A fit is then checked on one held-out forward group (all forwards at the median distinct
tokens value): refit without it and predict it. Nothing about a model is input.
Not done here: rendering (report.py), plots and traces (plots.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import dataclasses

from vocab import analysis as C
from mining import fit as F
from mining import fwdvars as FV
from vocab.analysis import ANALYSIS_SCHEMA_VERSION  # noqa: F401  (re-exported)
from mining import pointers as P
from mining import sites as S
from mining import structs as ST
from mining.load import Dump
from mining.forwards import find_forwards, tag_phases
from mining.passes import Passes, split_passes

SHAPE_COLS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "smem")


@dataclass
class Analysis:
    dump: Dump
    passes: Passes
    sites: S.Sites
    reference: S.Reference
    layers: list[dict]
    pointers: pd.DataFrame
    strides: pd.DataFrame
    buffers: pd.DataFrame
    fits: pd.DataFrame
    no_layout: pd.DataFrame
    holdout_tokens: int | None
    variables: list[str]
    notes: list[str] = field(default_factory=list)
    views: pd.DataFrame = field(default_factory=pd.DataFrame)
    structs: pd.DataFrame = field(default_factory=pd.DataFrame)   # struct parameters' words (structs.py)
    fvars: FV.ForwardVars | None = None                           # every forward's variables (fwdvars.py)

    @property
    def forwards(self) -> pd.DataFrame:
        f = self.passes.forwards.copy()
        f["tokens"] = f["forward"].map(self.reference.tokens).astype("Int64")
        src = S.token_sources(self.sites, self.passes.executed, self.reference)
        f["tokens_from"] = f["forward"].map(src[~src.index.duplicated()]).astype(object).fillna("none")
        return f


_signed = FV.signed


class _Fitter:
    """Fits with memoisation: sites of different layers usually share identical samples."""

    def __init__(self, env: dict[str, pd.Series], holdout: int | None):
        self.env = {k: v.to_dict() for k, v in env.items()}
        self.holdout = holdout
        self.memo: dict = {}

    def __call__(self, fwds: np.ndarray, values: np.ndarray) -> dict:
        tok = self.env["tokens"]
        have = np.array([f in tok for f in fwds], bool)
        if not have.any():
            return {"status": "no_fit", "expr": None, "points": 0, "alternatives": [],
                    "note": "no forward with a tokens value", "holdout": "n/a", "values": []}
        fw, v = fwds[have], values[have]
        env = {k: np.array([d.get(f, -1) for f in fw], np.int64) for k, d in self.env.items()}
        # a variable unknown at one of the site's forwards is not offered to it, nor `seqs` where
        # it is the same in all of them (a form in it would be a constant)
        env = {k: a for k, a in env.items() if k == "tokens" or ((a >= 0).all() and
                                                                 (k != "seqs" or len(np.unique(a)) > 1))}
        key = (tuple(sorted(env)), *(a.tobytes() for a in env.values()), v.tobytes())
        if key not in self.memo:
            self.memo[key] = self._fit(env, v)
        return self.memo[key]

    def _fit(self, env: dict[str, np.ndarray], v: np.ndarray) -> dict:
        res = F.fit(env, v)
        out = res.to_json()
        out["values"] = sorted(set(v.tolist()))[:8]
        out["holdout"] = "n/a"
        h = self.holdout
        if res.status in ("fit", "piecewise") and h is not None:
            held = env["tokens"] == h
            if held.any() and (~held).any():
                rest = F.fit({k: a[~held] for k, a in env.items()}, v[~held])
                if rest.status in ("fit", "piecewise"):
                    pred = F.evaluate(rest.expr, {k: a[held] for k, a in env.items()})
                    out["holdout"] = "ok" if (pred == v[held]).all() else "mismatch"
                else:
                    out["holdout"] = "n/a (underdetermined without it)"
        return out


def _fit_table(dump: Dump, sites: S.Sites, fitter: _Fitter) -> pd.DataFrame:
    rows = []
    L = dump.launches
    kept = sites.table[sites.table["kept"]]
    shape = L[list(SHAPE_COLS)].to_numpy().astype(np.int64)[kept["row"].to_numpy()]
    info = sites.index.set_index("site")
    groups = kept.groupby("site", observed=True).indices
    for site, pos in groups.items():
        fw = kept["forward"].to_numpy()[pos]
        for k, col in enumerate(SHAPE_COLS):
            rows.append({"site": site, "field": col, **fitter(fw, shape[pos, k])})
    prm = dump.params.loc[~dump.params["word"], ["seq", "i", "size", "value", "is_ptr"]]
    scal = prm.merge(kept[["seq", "forward", "site"]], on="seq", how="inner")
    anyptr = scal.groupby(["site", "i"], observed=True)["is_ptr"].transform("any")
    scal = scal[~anyptr & (scal["size"] <= 8)]
    for (site, i), grp in scal.groupby(["site", "i"], observed=True):
        size = int(grp["size"].iloc[0])
        vals = _signed(grp["value"].to_numpy(), size)
        row = {"site": site, "field": f"param{int(i)}", **fitter(grp["forward"].to_numpy(), vals)}
        if size == 4 and len(set(vals.tolist())) == 1:
            f32 = float(np.array([vals[0]], np.int64).astype(np.int32).view(np.float32)[0])
            if np.isfinite(f32) and 1e-12 < abs(f32) < 1e12 and abs(int(vals[0])) > 1 << 20:
                row["as_f32"] = f32
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["site"] = df["site"].astype(str)
    df = df.join(info[["symbol", "occ", "layer", "pos"]], on="site")
    return df


def _no_layout(dump: Dump) -> pd.DataFrame:
    L = dump.launches
    nl = L[L["layout"].astype(str) == "none"]
    g = nl.groupby("symbol", observed=True)
    return pd.DataFrame({"launches": g.size(), "packing": g["packing"].first()}).reset_index()


def _stack_shapes(passes: Passes) -> list[dict]:
    """The layer summary per distinct stack pattern (the shape `layers.shapes` reports)."""
    f = passes.forwards
    period = {k["kind"]: k["period"] for k in passes.blocks}
    out = []
    for pat, grp in f.groupby("pattern", sort=False):
        if not pat:
            continue
        first = int(grp["forward"].iloc[0])
        seq = [(tok.split("×")[0], int(tok.split("×")[1])) for tok in pat.split()]
        out.append({"forwards": int(len(grp)), "example_forward": first, "pattern": pat,
                    "layers": int(grp["layers"].iloc[0]),
                    "sites_per_layer": int(period[seq[0][0]]),
                    "kinds": [{"kind": k, "count": c, "sites_per_layer": int(period[k])} for k, c in seq],
                    "launches": int(grp["n_launches"].iloc[0])})
    out.sort(key=lambda d: -d["forwards"])
    return out


def _by_serving(layers: list[dict], forwards: pd.DataFrame) -> list[dict]:
    """The layer shapes, the model's first: the stack pattern of the most serving forwards, then
    of the most forwards. Why serving first: an engine's start-up passes (vLLM's graph captures,
    its dummy runs of the compiled model) can outnumber the requests' forwards and run another
    stack (the compiled warm-up's A×3 with a sampler's C×2); the requests are what the analysis
    is of."""
    serve = {}
    if "pattern" in forwards and "phase" in forwards:
        serve = forwards.loc[forwards["phase"] == "serve"].groupby("pattern").size().to_dict()
    return sorted(layers, key=lambda d: (-serve.get(d.get("pattern"), 0), -d["forwards"]))


def analyze(dump: Dump, gap_ms: float | None = None, per_forward: int | None = None) -> Analysis:
    """Run every stage on `dump`; never raises on thin data, says so in `notes` instead."""
    notes = list(dump.warnings)
    if per_forward is not None:   # the core-kernel rule, forced
        passes = split_passes(dump.launches, gap_ms=gap_ms, per_forward=per_forward)
        notes += passes.notes
        sites = S.align(dump.launches, passes.forward)
        layers = S.layer_blocks(sites)
    else:
        passes = find_forwards(dump.launches, dump.source.parent, gap_ms=gap_ms, notes=notes)
        names = passes.kernel_names
        if passes.method == "layer_stacks":
            sites = S.align(dump.launches, passes.forward, passes.executed, names)
            S.stack_layers(sites)
            layers = _stack_shapes(passes)
        else:
            sites = S.align(dump.launches, passes.forward)
            layers = S.layer_blocks(sites)
    n_fwd = len(passes.forwards)
    ref = S.choose_reference(dump.launches, sites, n_fwd)
    phase_notes: list[str] = []
    passes.forwards = tag_phases(passes.forwards, ref.tokens, phase_notes, passes.startup_until_ns)
    serve = set(passes.forwards.loc[passes.forwards["phase"] == "serve", "forward"].tolist())
    if ref.symbol is not None and len(serve) < n_fwd:
        # judged again on the serving forwards alone; phases follow the final choice
        ref = S.choose_reference(dump.launches, sites, n_fwd, among=serve)
        phase_notes = []
        passes.forwards = tag_phases(passes.forwards, ref.tokens, phase_notes, passes.startup_until_ns)
    notes += phase_notes
    layers = _by_serving(layers, passes.forwards)
    if n_fwd < 2:
        notes.append(f"only {n_fwd} forward pass(es) found: every non-constant fit is underdetermined")
    if ref.symbol is None:
        notes.append("no kernel runs once per forward with a varying grid: no tokens reference, "
                     "nothing can be fitted")
    fvars = FV.forward_vars(dump.launches, dump.params, sites, passes.forwards, ref.tokens)
    notes += fvars.notes
    env, variables = dict(fvars.values), fvars.names
    distinct = sorted(set(ref.tokens.tolist()))
    holdout = distinct[len(distinct) // 2] if len(distinct) >= 3 else None
    words = P.pointer_words(dump.params, sites.table)
    model = layers[0] if layers else {}
    kinds = [k["kind"] for k in model.get("kinds", []) for _ in range(int(k["count"]))]
    ptrs, strides = P.classify(words, sites.index, kinds or None)
    views = P.views(words)
    fitter = _Fitter(env, holdout) if ref.symbol else None
    fits = _fit_table(dump, sites, fitter) if fitter else pd.DataFrame()
    structs = ST.classify(ST.struct_words(dump.params), dump.params, dump.launches, sites.table, sites.index,
                          ptrs, fitter)
    return Analysis(dump, passes, sites, ref, layers, ptrs, strides, P.logical_buffers(ptrs), fits,
                    _no_layout(dump), holdout, variables, notes, views, structs, fvars)


def _plain(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if not np.isfinite(v) else float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if v is pd.NA or v is None:
        return None
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    return v


def _typed(cls, name: str, v):
    """v as the contract field wants it: an integral float into an int field becomes an int."""
    hint = C.field_types(cls)[name]
    if isinstance(v, float) and (hint is int or hint == (int | None)) and v.is_integer():
        return int(v)
    return v


def _rows(df: pd.DataFrame, cls, **fixed) -> list:
    """Records of `cls` from a frame: its columns that are fields of cls, plus `fixed`."""
    names = [f.name for f in dataclasses.fields(cls)]
    out = []
    for r in df.to_dict("records"):
        d = {k: _typed(cls, k, _plain(r.get(k))) for k in names if k not in fixed}
        out.append(cls(**d, **fixed))
    return out


def _seq_runs(seqs: np.ndarray) -> list[list[int]]:
    if len(seqs) == 0:
        return []
    brk = np.flatnonzero(np.diff(seqs) != 1) + 1
    starts = np.concatenate([[0], brk])
    lens = np.diff(np.concatenate([starts, [len(seqs)]]))
    return [[int(seqs[s]), int(n)] for s, n in zip(starts, lens)]


def _forward_seqs(a: Analysis) -> dict[int, list[list[int]]]:
    E = a.passes.executed
    if E is None:
        fw = a.passes.forward
        seq = a.dump.launches["seq"].to_numpy()
    else:
        fw = E["forward"].to_numpy()
        seq = E["seq"].to_numpy()
    m = fw >= 0
    order = np.argsort(fw[m], kind="stable")
    f_sorted, s_sorted = fw[m][order], seq[m][order]
    cuts = np.flatnonzero(np.diff(f_sorted)) + 1
    out = {}
    for part_f, part_s in zip(np.split(f_sorted, cuts), np.split(s_sorted, cuts)):
        if len(part_f):
            out[int(part_f[0])] = _seq_runs(part_s)
    return out


def _shape(d: dict) -> C.Shape:
    kinds = d.get("kinds") or [{"kind": "A", "count": d["layers"], "sites_per_layer": d["sites_per_layer"]}]
    pattern = d.get("pattern") or (f"A×{d['layers']}" if d["layers"] > 1 else "")
    return C.Shape(int(d["forwards"]), int(d["example_forward"]), pattern, int(d["layers"]),
                   int(d["sites_per_layer"]), [C.KindCount(k["kind"], int(k["count"]), int(k["sites_per_layer"]))
                                               for k in kinds], int(d["launches"]))


def _forward_vars(a: Analysis) -> C.ForwardVars | None:
    """The `forward_vars` section: absent when tokens is the only variable."""
    fv = a.fvars
    if fv is None or len(fv.names) < 2:
        return None
    val = {k: v.to_dict() for k, v in fv.values.items()}
    def one(k: str, f: int) -> int | None:
        x = val.get(k, {}).get(f)
        return None if x is None or pd.isna(x) else int(x)

    rows = [C.StepVars(int(f), *(one(k, int(f)) for k in ("tokens", "seqs", "ctx")))
            for f in a.passes.forwards["forward"].tolist()]
    srcs = [C.VarSource(s.var, s.rule, [C.FieldRef(site, fld) for site, fld in s.fields], s.kernels, s.note)
            for s in fv.sources]
    return C.ForwardVars(list(fv.names), srcs, rows)


def document(a: Analysis) -> C.AnalysisDoc:
    """The analysis as the typed contract (vocab/analysis.py; docs/analysis-json.md)."""
    P = a.passes
    f = a.forwards.copy()
    seqs = _forward_seqs(a)
    for col, v in (("replayed", 0), ("graph_execs", 0), ("layers", 0), ("pattern", ""),
                   ("cut_by", "core_kernel"), ("confidence", np.nan), ("phase", "serve")):
        if col not in f:
            f[col] = v
    forwards = [C.Forward(**{k: _typed(C.Forward, k, _plain(r[k])) for k in
                             [x.name for x in dataclasses.fields(C.Forward) if x.name != "seqs"]},
                          seqs=seqs.get(int(r["forward"]), []))
                for r in f.to_dict("records")]
    caps = _rows(P.captures, C.Capture) if P.captures is not None and len(P.captures) else []
    blocks = [C.BlockKind(b["kind"], int(b["period"]), int(b["runs"]), int(b["reps"]), list(b["kernels"]))
              for b in P.blocks]
    E = P.executed
    replays = int(E.loc[E["replay"] >= 0, "replay"].nunique()) if E is not None else 0
    shapes = [_shape(d) for d in a.layers]
    main = shapes[0] if shapes else None    # the model's layer shape (`_by_serving`)
    ptrs = a.pointers.copy()
    for c in ("alloc_base", "value"):
        if c in ptrs:
            ptrs[c] = [hex(int(x)) for x in ptrs[c]]
    bufs = a.buffers.copy()
    if "alloc_base" in bufs:
        bufs["alloc_base"] = [hex(int(x)) for x in bufs["alloc_base"]]
    fits = a.fits.copy()
    if len(fits):
        if "as_f32" not in fits:
            fits["as_f32"] = np.nan
        fits["alternatives"] = [[str(x) for x in v] if isinstance(v, list) else [] for v in fits["alternatives"]]
    return C.AnalysisDoc(
        schema_version=C.ANALYSIS_SCHEMA_VERSION,
        source=C.Source(a.dump.source.name, a.dump.pid, int(len(a.dump.launches)),
                        int(len(E)) if E is not None else int(len(a.dump.launches)), replays),
        notes=list(a.notes),
        passes=C.Passes(P.method, int(P.gap_ns), str(P.core), int(P.per_forward),
                        int(f["window"].nunique()), forwards, caps, blocks),
        reference=C.Reference(a.reference.symbol, a.reference.axis,
                              [C.Candidate(**{k: _plain(c[k]) for k in
                                              ("symbol", "axis", "failures", "distinct", "dropped", "max")})
                               for c in a.reference.candidates],
                              list(a.variables), _plain(a.holdout_tokens)),
        layers=C.Layers(main.layers if main else 0, main.sites_per_layer if main else 0,
                        main.pattern if main else "", shapes, _rows(a.strides, C.Stride)),
        sites=_rows(a.sites.index, C.Site) if "builds" in a.sites.index else
        _rows(a.sites.index.assign(builds=1), C.Site),
        partial=_rows(a.sites.partial, C.Partial),
        pointers=_rows(ptrs, C.Pointer),
        buffers=_rows(bufs, C.Buffer),
        views=[C.View(int(v), int(g["forwards"].iat[0]),
                      [C.ViewMember(str(r.site), int(r.i), int(r.at), int(r.delta), bool(r.anchor))
                       for r in g.itertuples()])
               for v, g in a.views.groupby("view", sort=True)] if len(a.views) else [],
        fits=_rows(fits, C.Fit) if len(fits) else [],
        no_layout=_rows(a.no_layout, C.NoLayout),
        damage=[C.FileDamage(r.file, r.read, r.skipped,
                             [C.SkippedRange(x.start, x.end, x.reason, x.records) for x in r.ranges],
                             r.ranges_left_out) for r in a.dump.damage],
        structs=ST.document(a.structs),
        forward_vars=_forward_vars(a),
    )


def to_json(a: Analysis) -> dict:
    """The whole result as plain JSON types (docs/analysis-json.md)."""
    return document(a).to_json()
