"""What every pointer word is: roles from allocation identity and stability across forwards.

Why: a generator must know which parameters are weights (bind once), KV pools (state that grows),
inputs the caller refills, and per-pass workspace (plan it). The capture only says that a word
pointed into a live allocation (base, size, buffer id, offset). An allocation range is not a
logical buffer (a caching allocator carves many tensors out of one range; one range can hold both
the K and the V pool), so a logical buffer here is (buffer id, offset), and roles come from how
the address behaves across forwards and layers:

- maybe_pointer: the word pointed into an allocation in some forwards only (an optional pointer
  that is sometimes NULL, or an integer that happened to land in a range);
- workspace: a pointer in every forward, at an address that moves;
- kv_pool: stable, different per layer, the same address used by two different kernels of a
  layer (written by one, read by another), and a large region per layer (its own allocation, or
  layers at least KV_REGION apart in one): small per-layer tensors two kernels share (KV scales)
  are weights;
- weight: stable and different per layer otherwise;
- input: stable, shared (not per layer), in a small allocation (<= 16 MiB) that the forward's head
  kernels (those before the first layer) also point into;
- persistent: any other stable pointer (weights outside the layers, tables, state).
These are heuristics over what the dump shows; nothing here reads memory contents.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SMALL_ALLOC = 16 << 20
KV_REGION = 1 << 20


def pointer_words(params: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Params of kept launches with at least one pointer sample, joined with site and forward."""
    kept = table.loc[table["kept"], ["seq", "forward", "site", "symbol"]]
    # only the columns classified: the merge is as long as params (several rows per launch)
    cols = ["seq", "i", "at", "is_ptr", "value", "buffer_id", "alloc_base", "alloc_size", "ptr_off"]
    p = params[cols].merge(kept, on="seq", how="inner")
    anyptr = p.groupby(["site", "i", "at"], observed=True)["is_ptr"].transform("any")
    return p[anyptr]


def classify(params: pd.DataFrame, table: pd.DataFrame, index: pd.DataFrame
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pointer table: one row per site parameter word, per-layer stride table)."""
    p = pointer_words(params, table)
    if p.empty:
        cols = ["site", "symbol", "layer", "pos", "i", "at", "role", "forwards", "ptr_forwards",
                "addresses", "buffer_id", "alloc_base", "alloc_size", "offset", "value"]
        return pd.DataFrame(columns=cols), pd.DataFrame()
    ptr_rows = p[p["is_ptr"]]
    g = p.groupby(["site", "i", "at"], observed=True)
    gp = ptr_rows.groupby(["site", "i", "at"], observed=True)
    out = pd.DataFrame({
        "symbol": g["symbol"].first(), "forwards": g["forward"].nunique(),
        "ptr_forwards": gp["forward"].nunique(), "addresses": gp["value"].nunique(),
        "buffer_id": gp["buffer_id"].first(), "buffers": gp["buffer_id"].nunique(),
        "alloc_base": gp["alloc_base"].first(), "alloc_size": gp["alloc_size"].first(),
        "offset": gp["ptr_off"].first(), "value": gp["value"].first(),
    }).reset_index()
    out["site"] = out["site"].astype(str)
    out = out.merge(index[["site", "layer", "pos", "first_seq"]], on="site", how="left")
    out["role"] = "persistent"
    out.loc[out["addresses"] > 1, "role"] = "workspace"
    out.loc[out["ptr_forwards"] < out["forwards"], "role"] = "maybe_pointer"
    stable = out["role"] == "persistent"

    # per-layer behaviour of stable words, keyed by (position in the layer block, param, word)
    inlayer = stable & (out["layer"] >= 0)
    key = ["pos", "i", "at"]
    per = out[inlayer].groupby(key)["value"].nunique().rename("layer_addrs")
    out = out.join(per, on=key)
    per_layer = inlayer & (out["layer_addrs"] > 1)
    users = out[inlayer].groupby(["layer", "value"])["symbol"].nunique().rename("users")
    out = out.join(users, on=["layer", "value"])
    if per_layer.any():
        region = out[per_layer].groupby(key).apply(_layer_region)
        out = out.join(pd.Series(region, name="region"), on=key)
    else:
        out["region"] = np.nan
    shared_big = (out["users"] >= 2) & (out["region"] >= KV_REGION)
    out.loc[per_layer, "role"] = np.where(shared_big[per_layer], "kv_pool", "weight")

    layer_sites = index[index["layer"] >= 0]
    first_layer_seq = layer_sites["first_seq"].min() if len(layer_sites) else np.inf
    head = out[stable & (out["first_seq"] < first_layer_seq) & (out["alloc_size"] <= SMALL_ALLOC)]
    head_ids = set(head["buffer_id"].tolist())
    shared = stable & ~per_layer
    is_input = shared & out["buffer_id"].isin(head_ids) & (out["alloc_size"] <= SMALL_ALLOC)
    out.loc[is_input, "role"] = "input"
    out = out.drop(columns=["layer_addrs", "users", "first_seq", "region"])
    return out, _strides(out)


def _layer_region(grp: pd.DataFrame) -> float:
    """Bytes one layer's target can span: its allocation when every layer has its own, else the
    smallest distance between two layers' addresses in one allocation."""
    if grp["buffer_id"].nunique() == grp["value"].nunique():
        return float(grp["alloc_size"].min())
    gaps = [np.diff(np.sort(g["value"].astype("int64").unique())) for _, g in grp.groupby("buffer_id")]
    gaps = np.concatenate([d for d in gaps if len(d)]) if any(len(d) for d in gaps) else np.array([])
    return float(gaps.min()) if len(gaps) else float(grp["alloc_size"].min())


def _strides(ptrs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    per = ptrs[ptrs["role"].isin(["weight", "kv_pool"])]
    for (sym, pos, i, at), grp in per.groupby(["symbol", "pos", "i", "at"]):
        grp = grp.sort_values("layer")
        addr = grp["value"].astype("int64").to_numpy()
        d = np.diff(addr)
        rows.append({"pos": int(pos), "i": int(i), "at": int(at), "role": grp["role"].iloc[0],
                     "symbol": sym, "layers": len(grp),
                     "stride": int(d[0]) if len(d) and (d == d[0]).all() else None})
    return pd.DataFrame(rows, columns=["pos", "i", "at", "role", "symbol", "layers", "stride"]
                        ).astype({"stride": "object"})


def logical_buffers(ptrs: pd.DataFrame) -> pd.DataFrame:
    """Stable pointer targets as (buffer id, offset), with their role and how many sites use them."""
    st = ptrs[~ptrs["role"].isin(["workspace", "maybe_pointer"])]
    if st.empty:
        return pd.DataFrame(columns=["buffer_id", "offset", "alloc_base", "alloc_size", "role",
                                     "sites", "offsets_in_alloc"])
    g = st.groupby(["buffer_id", "offset"])
    out = pd.DataFrame({"alloc_base": g["alloc_base"].first(), "alloc_size": g["alloc_size"].first(),
                        "role": g["role"].agg(lambda s: s.mode().iloc[0]),
                        "sites": g["site"].nunique()}).reset_index()
    out["offsets_in_alloc"] = out.groupby("buffer_id")["offset"].transform("nunique")
    return out
