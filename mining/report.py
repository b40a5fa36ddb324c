"""Render an `Analysis` as a terminal report (rich), and the tables the notebook shows.

Why: the same summaries serve `mine analyze` and `notebooks/explore_dump.ipynb`, so the tabulating
lives here as pure functions Analysis -> DataFrame, and `render` only lays those frames out.

The terminal report must read at 80 columns as at 200: kernels are shown by a short name (the
function's own name without namespaces, template arguments and parameters; cuBLASLt's nvjet GEMM
variants as one `nvjet` family) with the full names in the `names` section's legend; table cells
never wrap (ellipsis); strides are integers or "varies"; counts carry thousands separators. The
default is one screen for the main job (summary, forwards grouped by shape, layer 0's call sites,
one line per remaining section); `sections=` picks sections, `full=True` prints them all.
"""

from __future__ import annotations

import math
import re

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mining import structs
from vocab.errors import UsageError

SECTIONS = ("forwards", "layers", "strides", "pointers", "structs", "fits", "failures", "partial", "layout",
            "names")
DEFAULT = ("forwards", "layers")
# kernel families whose many tile/variant kernels read as one name (GEMM libraries)
FAMILIES = ((re.compile(r"^nvjet_"), "nvjet"), (re.compile(r"^sm\d+_xmma_gemm"), "xmma_gemm"),
            (re.compile(r"^(void )?cutlass.*gemm", re.I), "cutlass_gemm"))


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


def _strip_groups(text: str) -> str:
    """Drop balanced <...> and (...) groups (template arguments, parameters)."""
    out, depth = [], 0
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def short_name(sym: str, name: str = "") -> str:
    """A kernel's short name: its GEMM family, else the function's own identifier."""
    for pat, family in FAMILIES:
        if pat.search(sym) or (name and pat.search(name)):
            return family
    text = name or sym
    if text.startswith("_Z"):  # mangled, no demangled name captured: the first source name in it
        words, i = [], 2 + (text[2:3] == "N")
        while i < len(text) and text[i].isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            n = int(text[i:j])
            words.append(text[j:j + n])
            i = j + n
        return words[-1] if words else short(text, 32)
    bare = _strip_groups(text).strip().split(" ")[-1]
    return short(bare.split("::")[-1] or text, 40)


def short_names(a) -> dict[str, str]:
    nm = names(a)
    return {s: short_name(s, n if n != s else "") for s, n in nm.items()}


def _int(v) -> str:
    return f"{int(v):,}"


def _stride(v) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "varies"
    return "varies" if math.isnan(f) else f"{int(f):,}"


def _runs(nums) -> str:
    """1,2,3,5 -> "1-3,5"."""
    nums = sorted(int(n) for n in nums)
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in d.items())


def forward_groups(a) -> pd.DataFrame:
    """Forwards of one shape (phase, tokens, pattern, launches) as one row, with their numbers."""
    f = a.forwards
    if f.empty:
        return pd.DataFrame(columns=["forwards", "phase", "tokens", "pattern", "launches", "cut_by"])
    keys = [c for c in ("phase", "tokens", "pattern", "n_launches") if c in f]
    rows = []
    for key, g in f.groupby(keys, sort=False, dropna=False):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        rows.append({"forwards": _runs(g["forward"]), "n": len(g), "phase": key.get("phase", ""),
                     "tokens": key.get("tokens"), "pattern": key.get("pattern", ""),
                     "launches": key.get("n_launches"),
                     "cut_by": ", ".join(sorted(set(map(str, g["cut_by"])))) if "cut_by" in g else ""})
    out = pd.DataFrame(rows)
    out["first"] = [int(str(r).split(",")[0].split("-")[0]) for r in out["forwards"]]
    return out.sort_values("first").drop(columns="first").reset_index(drop=True)


def layer_sites(a) -> pd.DataFrame:
    """Layer 0's call sites by position, kernels shortened and a family's variants at one position
    counted as one row (`nvjet ×6`); `forwards` is the most forwards one of its sites is in."""
    t = layer_table(a)
    if t.empty:
        return pd.DataFrame(columns=["pos", "kernel", "sites", "forwards"])
    sn = short_names(a)
    idx = a.sites.index
    lay = idx[idx["layer"] == 0].sort_values("pos")
    t = pd.DataFrame({"pos": lay["pos"].to_numpy(), "kernel": [sn.get(s, s) for s in lay["symbol"]],
                      "forwards": lay["n_forwards"].to_numpy()})
    rows = []
    for pos, g in t.groupby("pos", sort=True):
        parts = []
        for k, kg in g.groupby("kernel", sort=False):
            parts.append(f"{k} ×{len(kg)}" if len(kg) > 1 else k)
        rows.append({"pos": int(pos), "kernel": " + ".join(parts), "sites": len(g),
                     "forwards": int(g["forwards"].max())})
    return pd.DataFrame(rows)


def stride_groups(a) -> pd.DataFrame:
    """Per-layer address strides, the words of one kernel, role and stride at a position counted
    as one row; a stride that is not constant over the layers reads "varies"."""
    s = a.strides
    if s.empty:
        return pd.DataFrame(columns=["pos", "kernel", "role", "stride", "words", "layers"])
    sn = short_names(a)
    s = s.assign(kernel=[sn.get(x, x) for x in s["symbol"]], stride_s=[_stride(v) for v in s["stride"]])
    g = s.groupby(["pos", "kernel", "role", "stride_s"], sort=True, observed=True)
    out = g.agg(words=("i", "size"), layers=("layers", "max")).reset_index().rename(columns={"stride_s": "stride"})
    return out[["pos", "kernel", "role", "stride", "words", "layers"]]


def failure_groups(a) -> pd.DataFrame:
    """`failures` with kernels shortened: a family's variants of one field and status are one row."""
    f = a.fits
    if f.empty:
        return pd.DataFrame(columns=["kernel", "field", "status", "sites", "kernels", "why"])
    bad = f[~f["status"].isin(["fit", "piecewise"])]
    sn = short_names(a)
    bad = bad.assign(kernel=[sn.get(x, x) for x in bad["symbol"]])
    g = bad.groupby(["kernel", "field", "status"], observed=True, sort=True)
    out = g.agg(sites=("site", "nunique"), kernels=("symbol", "nunique"), why=("note", "first")).reset_index()
    return out


def fit_rows(a) -> pd.DataFrame:
    """`layer_fits` of layer 0, kernels shortened, a family's variants with one field, status and
    expression as one row (`kernels` counts them); the alternatives are in --json."""
    f = layer_fits(a)
    if f.empty:
        return f
    sn = {n: short_name(s, n) for s, n in names(a).items()}
    f = f.assign(kernel=[sn.get(k, k) for k in f["kernel"]], expr=f["expr"].fillna(""))
    keys = ["pos", "kernel", "field", "status", "expr"]
    g = f.groupby(keys, sort=False, dropna=False)
    out = g.agg(kernels=("points", "size"), points=("points", "max"),
                holdout=("holdout", lambda h: ", ".join(sorted(set(map(str, h)))))).reset_index()
    return out[["pos", "kernel", "field", "status", "expr", "kernels", "points", "holdout"]]


def legend(a) -> pd.DataFrame:
    """Short name -> the kernels it stands for (how many, and the first full name)."""
    nm = names(a)
    L = a.dump.launches
    launches = L["symbol"].astype(str).value_counts()
    rows: dict[str, dict] = {}
    for s, n in nm.items():
        k = short_name(s, n if n != s else "")
        r = rows.setdefault(k, {"short": k, "kernels": 0, "launches": 0, "full name": n})
        r["kernels"] += 1
        r["launches"] += int(launches.get(s, 0))
    return pd.DataFrame(sorted(rows.values(), key=lambda r: -r["launches"]))


def _cell(v) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") in "iu"):
        return _int(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return _int(v) if v.is_integer() and abs(v) >= 1000 else (str(int(v)) if v.is_integer() else f"{v:.3g}")
    if isinstance(v, dict):
        return _counts(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def _table(console: Console, title: str, df: pd.DataFrame, limit: int = 40, wide: tuple = ()) -> None:
    """One table, a row a line: cells never wrap. When the table is wider than the console, the
    `wide` columns (names, expressions; else the widest) are cut to what is left, with an
    ellipsis: rich itself would drop whole columns of cells that may not wrap."""
    cells = [[escape(_cell(v)) for v in row] for row in df.head(limit).itertuples(index=False)]
    cols = [str(c) for c in df.columns]
    natural = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    room = console.width - 2 * (len(cols) - 1)
    caps = [None] * len(cols)
    if sum(natural) > room and cols:
        # water-fill: one cap for the widest columns, so that the table fits; `wide` ones first
        give = [i for i, c in enumerate(cols) if c in wide]
        for pool in ([give] if give else []) + [list(range(len(cols)))]:
            fixed = sum(w for i, w in enumerate(natural) if i not in pool)
            cap = _water(sorted(natural[i] for i in pool), room - fixed)
            if cap is not None:
                caps = [min(natural[i], cap) if i in pool else None for i in range(len(cols))]
                break
        else:
            caps = [max(6, room // len(cols))] * len(cols)
    t = Table(title=title, title_justify="left", show_lines=False, box=None, header_style="bold",
              pad_edge=False, padding=(0, 1))
    for i, c in enumerate(df.columns):
        t.add_column(str(c), no_wrap=True, overflow="ellipsis", max_width=caps[i], min_width=min(natural[i], caps[i] or natural[i]),
                     justify="right" if pd.api.types.is_numeric_dtype(df[c]) else "left")
    for row in cells:
        t.add_row(*row)
    console.print(t)
    if len(df) > limit:
        console.print(f"  … {len(df) - limit:,} more rows (see --json)")


def _water(widths: list[int], room: int, least: int = 8) -> int | None:
    """The largest cap c >= least with sum(min(w, c)) <= room, or None when even `least` is too wide."""
    if sum(min(w, least) for w in widths) > room:
        return None
    c = max(widths)
    while c > least and sum(min(w, c) for w in widths) > room:
        c -= 1
    return c


def parse_sections(text: str | None) -> tuple[str, ...]:
    """`forwards,layers` -> the sections; an unknown name is one sentence naming the choices."""
    if not text:
        return DEFAULT
    got = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in got if x not in SECTIONS]
    if bad or not got:
        raise UsageError(f"--section {text!r}: unknown section {bad[0] if bad else '(none)'}; "
                         f"choose from {', '.join(SECTIONS)}", value=text, limit=SECTIONS)
    return got


def render(a, console: Console | None = None, sections=None, full: bool = False, label: str | None = None) -> None:
    """The report; `label` names the input as the user gave it (an archive is read from the folder
    it is unpacked into, whose name the user never typed)."""
    c = console or Console()
    show = set(SECTIONS if full else (sections or DEFAULT))
    limit = 40 if not full else 10 ** 9
    d = a.dump
    pid = f", pid {d.pid}" if d.pid is not None else ""
    read = f"{d.source.parent.name}/{d.source.name}"
    what = f"{label} ({read})" if label and not str(label).endswith(read) else (label or read)
    c.print(f"[bold]mine analyze[/] {escape(what)}: "
            f"{len(d.launches):,} launches, {d.launches['symbol'].nunique():,} kernels{pid}")
    for n in a.notes:
        c.print(f"[yellow]note:[/] {escape(str(n))}")
    p = a.passes
    f = a.forwards
    sn = short_names(a)
    serve = int((f["phase"] == "serve").sum()) if "phase" in f else len(f)
    replays = int(p.executed["replay"].max() + 1) if p.executed is not None and len(p.executed) else 0
    if p.method == "layer_stacks":
        kinds = ", ".join(f"{b['kind']} = {b['period']} kernels" for b in p.blocks)
        c.print(f"forwards: {len(f):,} ({serve:,} serving, {len(f) - serve:,} start-up) in "
                f"{f['window'].nunique():,} request windows, found as layer stacks ({kinds}); "
                f"{replays:,} graph replays expanded, {len(p.captures):,} stream captures left out")
    elif p.method == "none":
        c.print("forwards: none (no repeating step in the capture; see the notes)")
    else:
        c.print(f"windows: {len(set(p.window.tolist())):,} (gap threshold {p.gap_ns / 1e6:.2f} ms); "
                f"forwards: {len(f):,}; core kernel {sn.get(p.core, short(str(p.core)))} "
                f"x{p.per_forward} per forward")
    if "forwards" in show:
        if full:
            _table(c, "Forward passes", forwards_table(a), limit)
        else:
            _table(c, "Forward passes, grouped by shape", forward_groups(a), limit, wide=("forwards", "cut_by"))
    r = a.reference
    if r.symbol:
        hold = a.holdout_tokens
        c.print(f"tokens reference: [bold]{escape(sn.get(r.symbol, short(r.symbol)))}[/] {r.axis} "
                f"({len(r.candidates)} candidates tried); variables: {', '.join(a.variables)}; "
                f"hold-out tokens: {_cell(hold) if hold is not None else 'none'}")
    if a.layers:
        m = a.layers[0]     # the model's layer shape (mining.analyze._by_serving)
        c.print(f"layers: {m['layers']} x {m['sites_per_layer']} call sites"
                + (f", pattern {m['pattern']}" if m.get("pattern") else "")
                + f" (shapes: {', '.join(str(b.get('pattern') or b['sites_per_layer']) for b in a.layers)})")
        if "layers" in show:
            _table(c, "Call sites of layer 0 (kernels by short name; --section names for the legend)",
                   layer_sites(a), limit, wide=("kernel",))
    if not a.strides.empty:
        sg = stride_groups(a)
        if "strides" in show:
            _table(c, "Per-layer address strides", sg, limit, wide=("kernel",))
        else:
            const = int((sg["stride"] != "varies").sum())
            c.print(f"strides: {len(a.strides):,} pointer words in {len(sg):,} groups, {const:,} groups at a "
                    "constant per-layer stride")
    pr = pointer_roles(a)
    if "pointers" in show:
        _table(c, "Pointer roles", pr, limit)
    elif not pr.empty:
        c.print("pointer roles (words): " + ", ".join(f"{r} {w:,}" for r, w in zip(pr["role"], pr["words"])))
    if len(a.structs):
        if "structs" in show:
            _table(c, "Struct parameters word by word (layer 0 and outside the layers; all in --json)",
                   structs.report_rows(a.structs, sn), limit, wide=("kernel", "words"))
        else:
            c.print(structs.summary(a.structs))
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
        c.print("fits: " + _counts(st) + "; hold-out: " + _counts(a.fits["holdout"].value_counts().to_dict()))
        if "fits" in show:
            _table(c, "Fitted expressions of layer 0 (varying or unresolved)", fit_rows(a), limit, wide=("expr",))
        if "failures" in show:
            _table(c, "Not fitted (a family's variants grouped)", failure_groups(a), limit, wide=("why",))
    if not a.sites.partial.empty:
        if "partial" in show:
            part = a.sites.partial.assign(symbol=[sn.get(x, x) for x in a.sites.partial["symbol"]])
            _table(c, "Kernels with partial coverage (occurrence count differs)", part, limit)
        else:
            c.print(f"partial coverage: {len(a.sites.partial):,} kernel(s) whose count differs between forwards")
    if not a.no_layout.empty:
        if "layout" in show:
            _table(c, "Kernels whose params have no layout", a.no_layout, limit)
        else:
            c.print(f"no layout: {len(a.no_layout):,} kernel(s) whose params have no layout")
    if "names" in show:
        _table(c, "Names (short name: kernels, launches, the first full name)", legend(a), limit, wide=("full name",))
    if not full:
        rest = [s for s in SECTIONS if s not in show]
        if rest:
            c.print(f"[dim]more: --section {','.join(rest)} (or --full)[/]")
