"""Forward passes of any capture: the step detector over the executed stream, phases, captures.

Why: this is the one place that decides what a forward is. It runs `mining/steps.py` (layer
stacks, cuts) over `mining/graphs.py`'s executed stream, so CUDA-graph replays count as the
forwards they are and graph-capture launches as none; where neither a layer structure nor a one-layer step
exists it finds no forward and says so (the core-kernel split of `passes.split_passes` runs only
when asked for, `mine analyze --per-forward N`). Output is a `Passes`
(mining/passes.py) whose per-launch arrays keep their old meaning (index = the dump's launches
frame; a captured launch is in no forward, a replayed one is found in `executed`), plus:

- `executed`: one row per kernel execution (row, seq, t_ns, replay, exec, kernel, window,
  forward, layer, pos), where `kernel` is the identity code (symbol + module sha256: Inductor
  and Triton reuse names across different builds, so a name alone is not a kernel);
- `forwards`: forward, window (request), n_launches, n_kernels, first_seq, last_seq, start_ns,
  end_ns, replayed (kernels run from graph replays), graph_execs, layers, pattern, cut_by,
  confidence, phase (filled by `tag_phases` once tokens are known);
- `captures`: one row per stream capture: capture_id, graph, exec, launches, first_seq, last_seq.

Request windows: host gaps *between* forwards only (a Triton JIT stall inside a forward is no
request boundary), split by `passes._idle_threshold`.
Phases (`tag_phases`): an engine captures its CUDA graphs before it serves (vLLM, SGLang: at
start-up, per batch size, each capture after eager warm-up runs at that size, which repeat the
size like decode steps repeat theirs), so every forward that starts before the end of the last
stream capture preceding the first graph replay (`capture_phase_end`) is `startup`; captures
after the first replay (an engine capturing lazily while it serves) do not extend it. After that
point serving starts at the first request window holding a decode run (two or more consecutive
forwards of equal tokens, not above the forward before them); forwards before it are `startup`
(profile and warm-up passes), the rest `serve`. Without any decode run every forward after the
capture phase is `serve` and a note says start-up cannot be told apart. A warm-up *request* an
engine sends itself over its own API after start-up (SGLang's server does) is a request like any
other in the dump: it is `serve`; only the client's record of when it sent its requests (a truth
file's `window`) tells them apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mining import cuts as cutting, steps
from mining.graphs import Executed, executed as executed_stream, read_graphs
from mining.passes import GAP_FLOOR_NS, Passes, _repair, gap_threshold, split_windows
from vocab.errors import UsageError


def kernel_identity(launches: pd.DataFrame) -> tuple[np.ndarray, pd.Index]:
    """Per launch an identity code over (symbol, module sha256), and the names: the bare symbol
    where it has one build in the capture, else `symbol@<sha256[:8]>`."""
    sym = launches["symbol"].astype(str)
    sha = launches["sha256"].astype(str)
    codes, uniq = pd.factorize(pd.MultiIndex.from_arrays([sym, sha]))
    pairs = pd.DataFrame(list(uniq), columns=["symbol", "sha"])
    builds = pairs.groupby("symbol")["sha"].transform("size")
    names = np.where(builds > 1, pairs["symbol"] + "@" + pairs["sha"].str[:8], pairs["symbol"])
    return codes.astype(np.int64), pd.Index(names)


def _captures(launches: pd.DataFrame, graphs: pd.DataFrame) -> pd.DataFrame:
    cap = launches["capture_id"].to_numpy()
    m = cap >= 0
    cols = ["capture_id", "graph", "exec", "launches", "first_seq", "last_seq"]
    if not m.any():
        return pd.DataFrame(columns=cols)
    g = pd.DataFrame({"capture_id": cap[m], "seq": launches["seq"].to_numpy()[m]}).groupby("capture_id")["seq"]
    out = pd.DataFrame({"launches": g.size(), "first_seq": g.min(), "last_seq": g.max()}).reset_index()
    ends = graphs[graphs["event"] == "capture_end"][["capture_id", "graph"]].dropna()
    ends = ends.astype({"capture_id": "int64"}).drop_duplicates("capture_id")
    inst = graphs[graphs["event"] == "instantiate"][["graph", "exec"]].dropna().drop_duplicates("graph")
    out = out.merge(ends, on="capture_id", how="left").merge(inst, on="graph", how="left")
    return out[cols].fillna({"graph": "", "exec": ""})


def capture_phase_end(graphs: pd.DataFrame) -> int | None:
    """Host time (ns) the last stream capture made before the first graph replay ended; None when
    the dump holds no such capture (no graph replayed, or only hand-built graphs)."""
    if graphs is None or not len(graphs):
        return None
    t = graphs["t_ns"]
    ends = t[(graphs["event"] == "capture_end") & t.notna()].astype("int64")
    replays = t[(graphs["event"] == "launch") & t.notna()].astype("int64")
    if not len(replays):
        return None
    ends = ends[ends < int(replays.min())]
    return int(ends.max()) if len(ends) else None


def _trim_at_capture_phase(forward: np.ndarray, b: pd.DataFrame, t: np.ndarray, phase_end: int | None) -> int:
    """Leave out of a forward the head launches that ran before the graph-capture phase ended
    when its layer stack ran after it (in place; the count left out). Why: the capture's own
    launches are no forward, so what ran just before it (torch's graph set-up fills) and the next
    request's prefill meet with no gap between them and are cut as one forward, which then
    starts inside the start-up phase and is tagged start-up (tri_serve's first prefill)."""
    if phase_end is None:
        return 0
    out = 0
    for i, r in b.iterrows():
        s, ss = int(r["start"]), int(r["stack_start"])
        if t[s] <= phase_end < t[ss]:
            new = min(max(int(np.searchsorted(t, phase_end, side="right")), s), ss)
            head = forward[s:new]
            head[head == i] = -1
            b.at[i, "start"] = new
            out += new - s
    return out


REQUEST_JUMP = 4.0   # how much longer than every shorter one the first between-request gap is


def _requests(t_ns: np.ndarray, starts: np.ndarray, ends: np.ndarray, stack_starts: np.ndarray,
              floor_ns: int = GAP_FLOOR_NS, learn_from: int = 0) -> np.ndarray:
    """Request window of each forward, from the longest host gap between the end of one forward
    and the first launch of the next (a stall *inside* a forward, a Triton JIT compile say, never splits
    a request). Gaps between steps of one request (scheduling, sampling, a prefill's first decode)
    and gaps between requests form two ranges; the threshold sits in the first jump of at least
    REQUEST_JUMP between consecutive distinct gaps that ends above floor_ns (later, larger jumps
    separate start-up from serving, not requests). With a graph-capture phase the threshold is
    chosen among the gaps after forward `learn_from` (where there are any): the capture phase's
    warm-ups leave gaps of every length between the two ranges."""
    k = len(starts)
    if k == 0:
        return np.zeros(0, np.int32)
    between = np.zeros(k, np.int64)
    for i in range(k - 1):
        a, b = max(int(ends[i]) - 1, int(starts[i])), int(stack_starts[i + 1])
        between[i + 1] = np.diff(t_ns[a:b + 1]).max() if b > a else 0
    g = np.unique(between[max(1, learn_from):] if learn_from < k - 1 else between[1:]).astype(float)
    thr = np.inf
    for lo, hi in zip(g[:-1], g[1:]):
        if hi >= floor_ns and hi >= REQUEST_JUMP * max(lo, 1.0):
            thr = float(np.sqrt(max(lo, 1.0) * hi))
            break
    return np.cumsum(between > thr).astype(np.int32)


def _best_anchor(cands: list):
    """Of the one-layer anchors, the kernel launched most often in the whole stream: it runs in
    prefill and start-up passes too, where a decode-only kernel (a sampler's) would leave those
    forwards out. Measured on the suite's one-layer capture: the serving forwards and their
    tokens are right with it; the kernels that score best on exact cuts are decode-only ones,
    which lose the prefills."""
    if not cands:
        return None
    return max(cands, key=lambda c: (len(c[0]), c[1]))


def find_forwards(launches: pd.DataFrame, folder=None, graphs: pd.DataFrame | None = None,
                  gap_ms: float | None = None, notes: list[str] | None = None) -> Passes:
    """The forwards of `launches` (a load_dump frame sorted by seq); graphs.jsonl read from `folder`."""
    notes = [] if notes is None else notes
    if graphs is None:
        graphs = read_graphs(folder, notes) if folder is not None else read_graphs(".", None).iloc[0:0]
    if gap_ms is not None and gap_ms <= 0:
        raise UsageError(f"gap_ms must be positive, got {gap_ms}", value=gap_ms, limit=0)
    ex: Executed = executed_stream(launches, graphs)
    notes += ex.notes
    E = ex.frame
    codes_all, names = kernel_identity(launches)
    codes = codes_all[E["row"].to_numpy()]
    t = E["t_ns"].to_numpy()
    gap_ns = int(gap_ms * 1e6) if gap_ms is not None else gap_threshold(t)
    window = split_windows(t, gap_ns)
    sym_of_code = launches["symbol"].astype(str).to_numpy()[np.unique(codes_all, return_index=True)[1]]
    blocks = steps.find_blocks(codes, window, sym_of_code, t)
    captures = _captures(launches, graphs)
    n = len(E)
    anchored = None
    if len(blocks.stacks) == 0:
        anchored = _best_anchor(steps.step_anchors(codes, sym_of_code, blocks))
    if anchored is not None:
        notes += blocks.notes
        stacks, anchor = anchored
        notes.append(f"one layer: every forward anchored on `{anchor}`, which runs once per step")
        blocks = steps.Blocks([{"period": 1, "runs": int(len(stacks)), "reps": 1,
                                "example": [int(codes[stacks[0, 0]])]}], stacks,
                              np.column_stack([stacks, stacks[:, 1], np.ones(len(stacks), np.int64)]))
    if len(blocks.stacks) == 0:
        # no repeating step: say so, invent nothing (`mine analyze --per-forward N` still splits by
        # the core-kernel rule when the user knows the step)
        notes += blocks.notes
        notes.append("no repeating step found: no forwards (--per-forward N splits by the core-kernel rule)")
        E = E.assign(kernel=codes, window=window, forward=-1, layer=-1, pos=-1)
        f = pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
            ("forward", "int32"), ("window", "int32"), ("n_launches", "int32"), ("n_kernels", "int32"),
            ("first_seq", "int64"), ("last_seq", "int64"), ("start_ns", "int64"), ("end_ns", "int64"),
            ("replayed", "int64"), ("graph_execs", "int64"), ("layers", "int64"), ("pattern", "object"),
            ("cut_by", "object"), ("confidence", "float64"), ("phase", "object"))})
        n_rows = len(launches)
        return Passes(np.zeros(n_rows, np.int32), np.full(n_rows, -1, np.int32), gap_ns, "", 0, f, notes, E,
                      "none", [], captures, names)
    # cuts match head and tail by kernel *name*: the first forwards of a window run other builds
    # of the same kernels (Triton specialises on sizes) than the steady decode cycle
    sym_codes = launches["symbol"].cat.codes.to_numpy().astype(np.int64)[E["row"].to_numpy()]
    phase_end = capture_phase_end(graphs)
    learn_from = 0 if phase_end is None else int(np.searchsorted(t[blocks.stacks[:, 0]], phase_end, side="right"))
    cuts = cutting.cut_forwards(sym_codes, t, blocks.stacks, learn_from)
    forward = cuts.forward
    moved = _repair(codes, forward, np.zeros(n, np.int32))
    if moved:
        notes.append(f"{moved} launch(es) moved across a forward boundary (jitter)")
    trimmed = _trim_at_capture_phase(forward, cuts.boundaries, t, phase_end)
    if trimmed:
        notes.append(f"{trimmed} launch(es) before the end of the graph-capture phase left out of the forward "
                     f"whose layers ran after it")
    layer, pos, patterns = steps.layer_map(n, blocks, cuts)
    b = cuts.boundaries
    req = _requests(t, b["start"].to_numpy(), b["end"].to_numpy(), b["start"].to_numpy(), learn_from=learn_from)
    win_e = np.full(n, -1, np.int32)
    inside = forward >= 0
    win_e[inside] = req[forward[inside]]
    # launches outside forwards take the window of the next forward (or the last one)
    nxt = np.searchsorted(b["start"].to_numpy(), np.arange(n), side="right")
    fill = np.clip(nxt, 0, len(req) - 1)
    win_e[~inside] = req[fill[~inside]]
    E = E.assign(kernel=codes, window=win_e, forward=forward, layer=layer, pos=pos)
    letters = steps.kind_names(blocks.kinds)
    seq = E["seq"].to_numpy()
    rep = E["replay"].to_numpy()
    m = forward >= 0
    G = pd.DataFrame({"forward": forward[m], "seq": seq[m], "t": t[m], "k": codes[m],
                      "rep": rep[m]}).groupby("forward")
    agg = pd.DataFrame({"n_launches": G.size(), "n_kernels": G["k"].nunique(),
                        "first_seq": G["seq"].min(), "last_seq": G["seq"].max(),
                        "start_ns": G["t"].min(), "end_ns": G["t"].max(),
                        "replayed": G["rep"].agg(lambda r: int((r >= 0).sum())),
                        "graph_execs": G["rep"].agg(lambda r: int(len(np.unique(r[r >= 0]))))})
    rows = []
    for i, r in b.iterrows():
        pat = patterns[i]
        a = agg.loc[i] if i in agg.index else None
        rows.append({"forward": i, "window": int(req[i]),
                     **({k: int(a[k]) for k in agg.columns} if a is not None else
                        {k: 0 for k in agg.columns}),
                     "layers": len(pat), "pattern": _pattern(pat, letters),
                     "cut_by": r["cut_by"], "confidence": r["confidence"], "phase": "serve"})
    f = pd.DataFrame(rows).astype({"forward": "int32", "window": "int32", "n_launches": "int32",
                                   "n_kernels": "int32"})
    # per dump launch: its forward when it ran eagerly (replayed kernels live in `executed`)
    fwd_row = np.full(len(launches), -1, np.int32)
    win_row = np.zeros(len(launches), np.int32)
    eager = rep < 0
    fwd_row[E["row"].to_numpy()[eager]] = forward[eager]
    win_row[E["row"].to_numpy()[eager]] = win_e[eager]
    main = blocks.kinds[0]
    info = [dict(k, kind=letters[k["period"]], kernels=[str(names[c]) for c in k.pop("example")])
            for k in [dict(x) for x in blocks.kinds]]
    return Passes(win_row, fwd_row, gap_ns, str(names[main["example"][0]]), int(main["period"]), f, notes,
                  E, "layer_stacks", info, captures, names, phase_end)


def _pattern(kinds: list[int], letters: dict[int, str]) -> str:
    """`A×2 B×3` for a stack of two A blocks then three B blocks."""
    out: list[list] = []
    for k in kinds:
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return " ".join(f"{letters[k]}×{c}" for k, c in out)


def tag_phases(forwards: pd.DataFrame, tokens: pd.Series, notes: list[str],
               startup_until_ns: int | None = None) -> pd.DataFrame:
    """`phase` per forward: `startup` when it starts before `startup_until_ns` (the end of the
    graph-capture phase) or before the first later request window with a decode run, else `serve`."""
    f = forwards.copy()
    tok = f["forward"].map(tokens)
    start = None
    after = f if startup_until_ns is None else f[f["start_ns"] > startup_until_ns]
    for w, grp in after.groupby("window", sort=True):
        v = tok[grp.index].to_numpy()
        for j in range(1, len(v) - 1):
            if pd.notna(v[j]) and v[j] == v[j + 1] and pd.notna(v[j - 1]) and v[j - 1] >= v[j]:
                start = int(grp["forward"].iloc[0])
                break
        if start is not None:
            break
    if start is None:
        if len(after):
            notes.append("no decode run (two forwards of equal tokens in a row) found: start-up passes "
                         "cannot be told from requests, every forward counts as serving")
        elif len(f):
            notes.append("every forward starts before the graph-capture phase ends: all are start-up")
        start = int(after["forward"].min()) if len(after) else (int(f["forward"].max()) + 1 if len(f) else 0)
    f["phase"] = np.where(f["forward"] < start, "startup", "serve")
    return f
