"""Plant a copy log of known truth into a dump folder (tests of compiler.inputs / input_fills).

Requests are made from the analysis' serving forwards (a forward of more than one token starts a
request with that many prompt tokens, the one-token forwards after it are its decode steps), with
seeded token ids; each forward gets host-to-device copies, ahead of its first launch, of the values
that step makes -- token ids, positions, a slot mapping through pages the engine would choose
(here: each request's pages counted down from a base), sequence lengths, query start offsets, a
block table -- at destinations the caller names, plus one copy larger than the byte limit
(recorded without bytes). The format is docs/dump-format.md "Copy log".
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

PAGE = 16
LIMIT = 4096


def plan(doc, seed: int = 5) -> tuple[list[dict], list[tuple[int, int, int]]]:
    """(requests, [(forward, request, step within it)]) from the serving forwards."""
    rng = random.Random(seed)
    reqs, at = [], []
    for f in sorted(doc.passes.forwards, key=lambda f: f.first_seq):
        if f.phase != "serve" or not f.tokens:
            continue
        if f.tokens > 1 or not reqs:
            reqs.append({"prompt": [rng.randrange(1, 30000) for _ in range(f.tokens)], "output": []})
        r = reqs[-1]
        r["output"].append(rng.randrange(1, 30000))
        at.append((f.forward, len(reqs) - 1, len(r["output"]) - 1))
    return reqs, at


def values(reqs: list[dict], r: int, k: int) -> dict[str, np.ndarray]:
    """What step k of request r feeds (k = 0: the prompt; else one decode token)."""
    req = reqs[r]
    p = len(req["prompt"])
    if k == 0:
        toks, start = req["prompt"], 0
    else:
        toks, start = [req["output"][k - 1]], p + k - 1
    pos = np.arange(start, start + len(toks))
    pages = [1000 - 40 * r - j for j in range(64)]          # the engine's own page numbering
    slots = np.array([pages[q // PAGE] * PAGE + q % PAGE for q in pos])
    end = start + len(toks)
    blocks = np.zeros(16, np.int64)
    need = -(-end // PAGE)
    blocks[:need] = pages[:need]
    return {"token": np.array(toks), "position": pos, "slot": slots, "seq_len": np.array([end]),
            "cu_seqlens": np.array([0, len(toks)]), "blocks": blocks}


DTYPE = {"token": "<i4", "position": "<i8", "slot": "<i8", "seq_len": "<i4", "cu_seqlens": "<i4", "blocks": "<i4"}


def plant(folder: Path, doc, dst: dict[str, int], big: int | None = None, seed: int = 5) -> tuple[list[dict], list]:
    """Write folder/copies.jsonl; `dst`: fill -> device address. Returns (requests, plan)."""
    reqs, at = plan(doc, seed)
    fwd = {f.forward: f for f in doc.passes.forwards}
    lines, seq = [], 0
    for forward, r, k in at:
        f = fwd[forward]
        vals = values(reqs, r, k)
        for name, a in dst.items():
            data = vals[name].astype(DTYPE[name]).tobytes()
            lines.append(_rec(seq, f.first_seq, a, data))
            seq += 1
        if big is not None:
            lines.append(_rec(seq, f.first_seq, big, bytes(LIMIT * 2)))
            seq += 1
    (Path(folder) / "copies.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return reqs, at


def _rec(seq: int, before: int, dst: int, data: bytes) -> dict:
    r = {"seq": seq, "seq_before": before, "t_ns": 1000 + seq, "tid": 1, "dev": 0, "api": "cuMemcpyHtoDAsync_v2",
         "stream": "0x0", "async": 1, "dst": hex(dst), "src": hex(0x7F0000000000 + 4096 * seq), "size": len(data),
         "result": 0, "graph": None}
    if len(data) <= LIMIT:
        r["hex"] = data.hex()
    return r


def requests_file(path: Path, reqs: list[dict]) -> Path:
    path.write_text(json.dumps({"groups": [{"requests": [r]} for r in reqs]}))
    return path
