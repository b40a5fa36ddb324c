"""Device-to-device copies and memsets inside a forward, put among its launches.

Why: a forward is not only kernels. vLLM's default mode ends its decode CUDA graph with a copy of
the last hidden states into a static output buffer, and the eager gather after the replay reads
that buffer; a program built from the kernels alone reads a buffer nothing wrote (an input full
of zeros on kern: zero logits). kern has no copy or memset call, so a copy is compiled away:

- **placed**: a copy recorded inside a stream capture (copies.jsonl `graph`) runs at each replay
  of that graph, before the captured launch whose seq is its `seq_before` (after the graph's last
  kernel when none follows); an eager copy runs before the forward's launch `seq_before`;
- **aliased**: the launches after a device-to-device copy that pass an address inside its
  destination are given the same offset inside its source instead (the bytes are equal), as
  long as nothing wrote the source since the copy (measured flow, `doc.flow`); a launch that
  writes the destination ends the alias. Refused, in one sentence, when the source was
  overwritten before a read through the alias;
- **memsets**: dropped when the first later access to the range is a measured full write (`out`),
  a cuBLASLt launch (its own workspace counters: kern's extern GEMM keeps its own), or there is
  none; refused when a launch reads the cleared bytes (kern would read what the
  buffer held, not the value).

`graph_gaps` checks the other way round: every node of a replayed graph must be a recorded
launch or copy record (graphs.jsonl `capture_end` `nodes` / `node_types`); a capture made before
device copies were logged lacks them, and the compile says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from compiler import externs
from compiler.errors import CompileError
from compiler.launches import Launch, Param, Word
from vocab.analysis import site_name


@dataclass(frozen=True)
class Op:
    op: str            # dtod | memset
    dst: int
    src: int
    size: int
    value: int
    elem: int
    seq_before: int
    capture_id: int    # -1: eager


@dataclass
class Placed:
    """The dump's device-side operations, by where they run."""
    eager: dict[int, list[Op]] = field(default_factory=dict)      # seq_before -> ops (in file order)
    graph: dict[int, list[Op]] = field(default_factory=dict)      # capture_id -> ops (in file order)

    def __bool__(self) -> bool:
        return bool(self.eager or self.graph)


def placed(dump) -> Placed:
    """The successful device-to-device copies and memsets of a dump (`Dump.device_ops`)."""
    D = getattr(dump, "device_ops", None)
    out = Placed()
    if D is None or not len(D):
        return out
    D = D[(D["result"] == 0) & (D["size"] > 0) & (D["node"] == 0)].sort_values("seq", kind="stable")
    for r in D.itertuples(index=False):
        op = Op(str(r.op), int(r.dst), int(r.src), int(r.size), int(r.value), int(r.elem), int(r.seq_before),
                int(r.capture_id) if r.in_graph else -1)
        if op.capture_id >= 0:
            out.graph.setdefault(op.capture_id, []).append(op)
        else:
            out.eager.setdefault(op.seq_before, []).append(op)
    return out


def capture_ids(dump, seqs) -> dict[int, int]:
    """seq -> the capture it was recorded in (-1: eager), for the given launch seqs."""
    L = dump.launches
    m = L["seq"].isin(np.asarray(list(seqs), np.int64))
    return dict(zip(L.loc[m, "seq"].astype("int64").tolist(), L.loc[m, "capture_id"].astype("int64").tolist()))


def positions(order: list[int], cap: dict[int, int], ops: Placed) -> dict[int, list[Op]]:
    """index k in the forward's launch order -> the ops that run just before launch order[k]
    (k == len(order): after the last). A graph's ops go into each replay of it (a run of its
    captured seqs, in capture order), an eager op before the eager launch it precedes (not the
    forward's first: what runs before the first launch is the host's staging, not the forward)."""
    at: dict[int, list[Op]] = {}
    runs: list[tuple[int, int, int]] = []     # (capture, first k, last k)
    for k, s in enumerate(order):
        c = cap.get(s, -1)
        if c >= 0 and runs and runs[-1][0] == c and order[runs[-1][2]] < s and runs[-1][2] == k - 1:
            runs[-1] = (c, runs[-1][1], k)
        elif c >= 0:
            runs.append((c, k, k))
    for c, lo, hi in runs:
        for op in ops.graph.get(c, []):
            k = next((j for j in range(lo, hi + 1) if order[j] >= op.seq_before), hi + 1)
            at.setdefault(k, []).append(op)
    for k, s in enumerate(order):
        if k and cap.get(s, -1) < 0 and s in ops.eager:
            at.setdefault(k, []).extend(ops.eager[s])
    return at


def _alloc_of(v: int, own: dict[int, Launch], allocs) -> tuple[int, int]:
    for x in own.values():
        for w in x.words:
            if w.base and w.base <= v < w.base + w.alloc_size:
                return w.base, w.alloc_size
    for b, n in allocs:
        if b <= v < b + n:
            return b, n
    return 0, 0


def apply(f, order: list[int], own: dict[int, Launch], at: dict[int, list[Op]], flow: dict,
          allocs=()) -> tuple[dict[int, Launch], list[str], dict[int, str]]:
    """The forward's launches with its device-to-device copies aliased away and its memsets
    checked (module docstring); a note per op; and the refusals by launch seq: a launch that reads
    bytes a memset cleared, or a copy's destination after its source changed. Why by seq and not
    raised here: the program may end before that launch (a sampler's top-k after the logits, cut
    by `programs.cut_at_logits`); the caller refuses only for launches its program keeps.
    `flow`: (site, i, at) -> measured direction."""
    if not at:
        return own, [], {}
    alias: list[list] = []       # [dst, end, src, stale (the source was written since), op]
    cleared: list[list] = []     # [dst, end, op, k]
    notes: list[str] = []
    refused: dict[int, str] = {}
    occ: dict[str, int] = {}
    out = dict(own)
    n_alias = n_memset = n_lib = 0
    for k, s in enumerate(order + [None]):
        for op in at.get(k, []):
            if op.op == "dtod":
                src = op.src
                for a in alias:     # a copy of an aliased range copies the range's source
                    if a[0] <= src and src + op.size <= a[1]:
                        src = a[2] + (src - a[0])
                alias = [a for a in alias if a[1] <= op.dst or op.dst + op.size <= a[0]]
                alias.append([op.dst, op.dst + op.size, src, False, op])
            elif op.op == "memset":
                cleared.append([op.dst, op.dst + op.size, op, k])
        if s is None:
            break
        x = own[s]
        site = site_name(x.symbol, occ.get(x.symbol, 0))
        occ[x.symbol] = occ.get(x.symbol, 0) + 1
        words, changed = [], False
        lib = externs.is_library(x.symbol)
        for w in x.words:
            d = flow.get((site, w.i, w.at))
            writes = d in ("out", "inout")
            for c in list(cleared):
                if c[0] <= w.value < c[1]:
                    if d == "out" or lib:   # cuBLASLt clears its own workspace counters: kern's extern call does its own
                        if lib:
                            n_lib += 1
                        cleared.remove(c)
                        n_memset += 1
                        continue
                    refused.setdefault(s, (
                        f"forward {f.forward}: {x.symbol[:60]} (launch seq {s}, param {w.i}) reads bytes a memset "
                        f"cleared just before (value {c[2].value}, {c[2].size} bytes at {hex(c[0])}); kern has no "
                        f"memset call, so the program would read what the buffer held instead"))
            hit = next((a for a in alias if a[0] <= w.value < a[1]), None)
            if hit is not None and writes:
                alias.remove(hit)
            elif hit is not None:
                if hit[3]:
                    refused.setdefault(s, (
                        f"forward {f.forward}: {x.symbol[:60]} (launch seq {s}, param {w.i}) reads what a "
                        f"device-to-device copy ({hit[4].size} bytes, {hex(hit[4].src)} -> {hex(hit[0])}) left, but "
                        f"a launch overwrote the copy's source in between; kern has no copy call to keep it"))
                v = hit[2] + (w.value - hit[0])
                base, size = _alloc_of(v, own, allocs)
                words.append(Word(w.i, w.at, v, base, size))
                changed = True
                n_alias += 1
                continue
            if writes:
                for a in alias:
                    if a[2] <= w.value < a[2] + (a[1] - a[0]):
                        a[3] = True
            words.append(w)
        if changed:
            moved = {(w.i, w.at): w.value for w in words}
            params = [replace(p, value=moved[(p.i, 0)]) if p.pointer and (p.i, 0) in moved else p for p in x.params]
            out[s] = Launch(x.seq, x.symbol, x.sha256, x.grid, x.block, x.smem, params, words, x.host_words)
    ops = [op for k in sorted(at) for op in at[k]]
    copies = sum(op.op == "dtod" for op in ops)
    if copies:
        notes.append(f"{copies} device-to-device copies: {n_alias} later pointer word(s) read the copies' "
                     f"sources instead (kern has no copy call)")
    if len(ops) > copies:
        notes.append(f"{len(ops) - copies} memset(s): {n_memset} overwritten before any read ({n_lib} of them "
                     f"cuBLASLt's own workspace, which kern's extern GEMM clears itself), the rest never read again "
                     f"in the forward; left out")
    return out, notes, refused


def graph_gaps(dump, graphs, captures: set[int]) -> list[str]:
    """One sentence per replayed graph (capture id in `captures`) holding nodes the dump does not
    record: kernels without a launch record, copies or memsets without a copies.jsonl record."""
    if graphs is None or not len(graphs) or not captures:
        return []
    ends = graphs[(graphs["event"] == "capture_end") & graphs["capture_id"].notna() & graphs["nodes"].notna()]
    L = dump.launches
    kern = L.loc[L["capture_id"] >= 0, "capture_id"].astype("int64").value_counts().to_dict()
    rec: dict[tuple[int, str], int] = {}
    for frame, kind in ((getattr(dump, "copies", None), "htod"), (getattr(dump, "device_ops", None), None)):
        if frame is None or not len(frame):
            continue
        g = frame[frame["in_graph"].astype(bool) & (frame["result"] == 0)]
        for c, op in zip(g["capture_id"].astype("int64"), g["op"].astype(str)):
            t = "memset" if op == "memset" else "memcpy"
            rec[(int(c), t)] = rec.get((int(c), t), 0) + 1
    out = []
    for r in ends.itertuples(index=False):
        c = int(r.capture_id)
        if c not in captures:
            continue
        have = {"kernel": kern.get(c, 0), "memcpy": rec.get((c, "memcpy"), 0), "memset": rec.get((c, "memset"), 0)}
        if pd.notna(r.kernel_nodes):
            want = {"kernel": int(r.kernel_nodes), "memcpy": int(r.memcpy_nodes), "memset": int(r.memset_nodes)}
            miss = {t: want[t] - have[t] for t in want if want[t] > have[t]}
            other = int(r.other_nodes)
            if miss or other:
                out.append(f"graph capture {c} holds " + ", ".join(f"{n} {t} node(s)" for t, n in miss.items())
                           + (", " if miss and other else "") + (f"{other} node(s) of other types" if other else "")
                           + " that the dump does not record; the program runs without them")
        elif int(r.nodes) > sum(have.values()):
            out.append(f"graph capture {c} holds {int(r.nodes)} nodes, the dump records {sum(have.values())} "
                       f"({have['kernel']} launches, {have['memcpy'] + have['memset']} copies and memsets); the program "
                       f"runs without the other {int(r.nodes) - sum(have.values())} (a capture made before "
                       f"device-to-device copies and memsets were logged?)")
    return out

