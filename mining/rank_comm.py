"""How ranks talk: which launches are collectives, and which pointer words land in a peer's memory.

Why: a tensor-parallel forward interleaves the model's kernels with collectives -- NCCL's kernels,
or an engine's own all-reduce over memory mapped from the other ranks -- and a manifest must
express each one as kern does (an extern NCCL op, or peer buffers). The capture records them like
any launch; this module tells them apart, by two independent signs:
- the name: `COLLECTIVES` is the table of kernel-name patterns of the libraries that ship
  collectives (NCCL's `ncclDevKernel_<Op>_...` / `ncclKernel_<Op>_...`, vLLM's custom all-reduce,
  PyTorch's symmetric-memory kernels, FlashInfer's and TensorRT-LLM's all-reduce fusions), each
  with the op it runs (for NCCL, read from the name's op token);
- the memory: a pointer word inside an interval another process exported -- an `ipc_open`
  (cuIpcOpenMemHandle) or a `map` (cuMemMap) of a handle that cuMemImportFromShareableHandle
  returned (`vmm_import`) -- is `peer` memory (docs/dump-format.md "Allocation log"). A launch
  reading peer memory whose name no pattern knows is still a collective (`peer_memory`, op
  `unknown`).
Not done: NCCL's host API calls (ncclAllReduce and its count, datatype and communicator) are not
driver calls, so the capture never sees them; a dump without an allocation log has no peer
classification (a note says so).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

NCCL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
            "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "Send": "send_recv",
            "Recv": "send_recv", "AllToAll": "all_to_all", "AlltoAll": "all_to_all"}
# (library, pattern searched in the mangled symbol and the demangled name, op; None: NCCL's token)
COLLECTIVES: tuple[tuple[str, re.Pattern, str | None], ...] = (
    ("nccl", re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\b|\d|$)"), None),
    ("vllm_custom", re.compile(r"cross_device_reduce_(?:1|2)stage"), "all_reduce"),
    ("torch_symm_mem", re.compile(r"(?:one_shot|two_shot|multimem(?:_one_shot)?)_all_reduce"), "all_reduce"),
    ("torch_symm_mem", re.compile(r"multimem_all_gather"), "all_gather"),
    ("flashinfer", re.compile(r"allreduce_fusion|trtllm_allreduce|(?:one|two)shot_allreduce|lamport.*allreduce",
                              re.IGNORECASE), "all_reduce"),
)
PEER_EVENTS = ("ipc_open",)   # and `map` of an imported handle


def classify_name(symbol: str, name: str = "") -> tuple[str, str] | None:
    """(library, op) of a collective kernel by its mangled symbol or demangled name; None when it
    is not one the table knows. NCCL's generic kernel (any op) reads op `unknown`."""
    for text in (symbol, name):
        if not text:
            continue
        for lib, pat, op in COLLECTIVES:
            m = pat.search(text)
            if m:
                return lib, op if op is not None else NCCL_OPS.get(m.group(1), "unknown")
    return None


def collective_symbols(launches: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """symbol -> (library, op) for every collective symbol the launches name (per distinct symbol)."""
    names = launches.drop_duplicates("symbol")[["symbol", "name"]] if "name" in launches else \
        launches.drop_duplicates("symbol")[["symbol"]].assign(name="")
    out = {}
    for sym, nm in zip(names["symbol"].astype(str), names["name"].astype(str)):
        hit = classify_name(sym, nm)
        if hit:
            out[sym] = hit
    return out


def _hex(v) -> int | None:
    if isinstance(v, str) and v.startswith("0x"):
        try:
            return int(v, 16)
        except ValueError:
            return None
    return None


def peer_intervals(pid_dir: Path) -> pd.DataFrame | None:
    """Another process's memory mapped into this one, from allocs.jsonl: columns base, end, seq_from,
    seq_to (launches with seq_from <= seq < seq_to see it), how (`ipc_open` | `vmm_import`). None
    when the folder has no allocation log. Lines that do not parse are skipped (the loader reports
    the file's damage); events apply in (seq_before, order) order."""
    f = pid_dir / "allocs.jsonl"
    if not f.is_file():
        return None
    evs = []
    for k, line in enumerate(f.read_bytes().split(b"\n")):
        line = line[line.rfind(b"\0") + 1:].strip()
        if not line:
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("result", 0) == 0 and isinstance(e.get("seq_before"), int):
            evs.append((e["seq_before"], e.get("order", k) if isinstance(e.get("order"), int) else k, e))
    evs.sort(key=lambda x: (x[0], x[1]))
    imported = {_hex(e.get("handle")) for _, _, e in evs if e.get("event") == "vmm_import"} - {None}
    live: dict[int, tuple[int, int, str]] = {}
    rows = []
    for seq, _, e in evs:
        base, size, ev = _hex(e.get("base")), e.get("size"), e.get("event")
        if base is None:
            continue
        if base in live and ev in ("free", "ipc_close", "unmap", "alloc", "map", "ipc_open", "import"):
            b0, end, how, s0 = live.pop(base)
            rows.append((b0, end, s0, seq, how))
        peer = ev in PEER_EVENTS or (ev == "map" and _hex(e.get("handle")) in imported)
        if peer and isinstance(size, int) and size > 0:
            live[base] = (base, base + size, "vmm_import" if ev == "map" else ev, seq)
    never = np.iinfo(np.int64).max
    rows += [(b0, end, s0, never, how) for b0, end, how, s0 in live.values()]
    return pd.DataFrame(rows, columns=["base", "end", "seq_from", "seq_to", "how"])


def peer_words(params: pd.DataFrame, peers: pd.DataFrame | None) -> pd.DataFrame:
    """The pointer words (params rows with is_ptr) whose value lies in a peer interval live at
    their launch: columns seq, i, at, how."""
    cols = ["seq", "i", "at", "how"]
    if peers is None or not len(peers):
        return pd.DataFrame(columns=cols)
    p = params[params["is_ptr"]]
    if not len(p):
        return pd.DataFrame(columns=cols)
    v, s = p["value"].to_numpy().astype(np.uint64), p["seq"].to_numpy()
    hit = np.full(len(p), -1)
    for k, r in enumerate(peers.itertuples()):
        m = (v >= np.uint64(r.base)) & (v < np.uint64(r.end)) & (s >= r.seq_from) & (s < r.seq_to) & (hit < 0)
        hit[m] = k
    sel = hit >= 0
    out = p.loc[sel, ["seq", "i", "at"]].copy()
    out["how"] = peers["how"].to_numpy()[hit[sel]]
    return out.reset_index(drop=True)
