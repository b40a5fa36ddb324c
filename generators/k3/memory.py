"""Per-rank memory of a K3 manifest (`mine k3 memory`): what one rank holds at the vars' maxima.

Buffers are summed by kind (weight, carry, workspace; `source` is load-only and reported apart;
the workspace sum is an upper bound since the runtime plans by liveness). Per-sequence states take
`seqs.max + 2` slots (kern's provisioning); what HBM is left then holds KV tokens at the per-token
state bytes, times the group size for a state dealt `by: position` (each member holds 1/w).
Reads the manifest only; no GPU, no checkpoint.
"""

from __future__ import annotations

from math import prod

from vocab.wire import DTYPE_BYTES

GIB = 1 << 30


def buffer_bytes(m: dict, buf: dict) -> int:
    vars_ = m.get("vars", {})
    dims = [d if isinstance(d, int) else vars_[d]["max"] for d in buf["shape"]]
    return DTYPE_BYTES[buf["dtype"]] * prod(dims)


def seq_slots(m: dict) -> int:
    groups = [v["max"] for v in m.get("vars", {}).values() if v.get("axis") == "groups"]
    return (max(groups) if groups else 1) + 2


def rank_memory(m: dict, hbm_gib: float = 274.2, reserve_gib: float = 8.0) -> dict:
    kinds: dict[str, int] = {}
    for buf in m["buffers"].values():
        kinds[buf["kind"]] = kinds.get(buf["kind"], 0) + buffer_bytes(m, buf)
    states = m.get("states", {})
    per_seq = sum(s.get("bytes_per_seq", 0) for s in states.values())
    per_token = sum(s.get("bytes_per_token", 0) for s in states.values())
    fixed = sum(s.get("bytes", 0) for s in states.values())
    dealt = [s["shard"] for s in states.values() if s.get("bytes_per_token") and s.get("shard", {}).get("by") == "position"]
    group = m.get("topology", {}).get("groups", {}).get(dealt[0]["group"], 1) if dealt else 1
    slots = seq_slots(m)
    held = sum(kinds.get(k, 0) for k in ("weight", "carry", "workspace", "peer")) + slots * per_seq + fixed
    free = int(hbm_gib * GIB - reserve_gib * GIB - held)
    tokens = max(free, 0) // per_token if per_token else 0
    return {"by_kind": dict(sorted(kinds.items())), "seq_slots": slots, "state_bytes_per_seq": per_seq,
            "state_bytes_per_token": per_token, "state_bytes_fixed": fixed, "held": held,
            "hbm": int(hbm_gib * GIB), "reserve": int(reserve_gib * GIB), "free_for_kv": free,
            "kv_tokens_per_rank": tokens, "kv_tokens_per_group": tokens * group, "position_group": group}
