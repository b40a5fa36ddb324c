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
  layer in one forward (written by one, read by another; two builds of one GEMM that read a weight
  in different forwards are one user), and a large region per layer (its own allocation, or
  layers at least KV_REGION apart in one): small per-layer tensors two kernels share (KV scales)
  are weights;
- weight: stable and different per layer otherwise;
  "different per layer" is judged among the layers of one block kind (a stack of dense layers
  before gated ones holds two), since position k of two kinds is two different kernels; in a
  kind of one layer, a word is the layer's own when no other layer's word holds its address;
- input: stable, shared (not per layer), in a small allocation (<= 16 MiB) that the forward's head
  kernels (those before the first layer) also point into;
- persistent: any other stable pointer (weights outside the layers, tables, state).
These are heuristics over what the dump shows; nothing here reads memory contents.

`views` is not a heuristic: it groups pointer words that, in every forward they run in, point
into one allocation at the same byte distances from each other -- one tensor and its views (a
fused qkv output and the q, k and v slices kernels read), or one buffer used in place by several
kernels (a residual stream through every layer). That is what a generator asserts its wiring on
and what a compiler binds one buffer for, measured without reading memory.
"""

from __future__ import annotations

from collections import Counter

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


def classify(p: pd.DataFrame, index: pd.DataFrame, layer_kinds: list[str] | None = None
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pointer table: one row per site parameter word, per-layer stride table) from the pointer
    words of `pointer_words`. `layer_kinds`: the block kind of each layer in order (a stack of
    dense layers before gated ones: B, A, A, A); the same position in two kinds of layer is two
    different kernels, so per-layer behaviour is judged within a kind. None: one kind."""
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

    # per-layer behaviour of stable words, keyed by (layer kind, position in the layer block,
    # param, word)
    inlayer = stable & (out["layer"] >= 0)
    kinds = dict(enumerate(layer_kinds or []))
    out["kind"] = [kinds.get(int(x), "") if x >= 0 else "" for x in out["layer"].fillna(-1)]
    key = ["kind", "pos", "i", "at"]
    per = out[inlayer].groupby(key)["value"].nunique().rename("layer_addrs")
    out = out.join(per, on=key)
    per_layer = inlayer & (out["layer_addrs"] > 1)
    # a kind with one layer has no other layer to differ from: there a word is the layer's own
    # when no other layer's word holds its address (activations pass through every layer)
    alone = {k for k, n in Counter(kinds.values()).items() if n == 1}
    if alone:
        owners = out[inlayer].groupby("value")["layer"].nunique()
        own = out["value"].map(owners).fillna(0) == 1
        per_layer = per_layer | (inlayer & out["kind"].isin(alone) & own)
    users = _users(ptr_rows, out[inlayer])
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
    out = out.drop(columns=["layer_addrs", "users", "first_seq", "region", "kind"])
    return out, _strides(out)


def _users(ptr_rows: pd.DataFrame, words: pd.DataFrame) -> pd.Series:
    """Per (layer, address) of the stable in-layer `words`: the most different kernels that use the
    address in one forward. A KV pool is written by one kernel and read by another in the same
    forward; two builds of one GEMM reading one weight in different forwards (a library picks one
    per token count, a CUDA graph captured per batch size runs its own) are one user."""
    key = words[["site", "i", "at", "layer"]].astype({"site": str})
    rows = ptr_rows[["site", "i", "at", "forward", "value", "symbol"]].astype({"site": str})
    rows = rows.merge(key, on=["site", "i", "at"], how="inner")
    per = rows.groupby(["forward", "layer", "value"])["symbol"].nunique()
    return per.groupby(level=["layer", "value"]).max().rename("users")


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


WORD = ["site", "i", "at"]
VIEW_FORWARDS = 2
VIEW_COLS = ["view", "forwards", "site", "i", "at", "delta", "anchor"]


def _set_hash(keys: np.ndarray, values: pd.DataFrame) -> np.ndarray:
    """Per group of `keys` (integer codes), a 64-bit hash of the set of its rows of `values`:
    row hashes summed, so order does not matter and two different sets collide with odds 2^-64."""
    h = pd.util.hash_pandas_object(values, index=False).to_numpy()
    out = np.zeros(keys.max() + 1 if len(keys) else 0, dtype=np.uint64)
    np.add.at(out, keys, h)
    return out


def views(p: pd.DataFrame) -> pd.DataFrame:
    """Pointer words that are views of one buffer, one row per member (columns VIEW_COLS).

    A view is a set of forwards F and the words that ran in every forward of F and, in each of
    them, pointed into one allocation at the same byte distances from each other: one tensor and
    its views (a fused qkv output and the q, k and v slices kernels read), or one buffer used in
    place by several kernels (a residual through every layer). `delta` is a member's distance from
    the lowest member (equal deltas: the same address); tensors an allocator placed side by side
    for good (an engine's static buffers) are one view too, which is what they are to a binder. F is always exactly the forwards of some
    member, its `anchor`: a relation between two words holds over the forwards both ran in when a
    view holds them both and one of them is its anchor (a kernel skipped by a profile pass relates
    to the ones that ran there over the forwards it ran in). Words whose forwards do not nest (one
    in prefill only, one in decode only) share no view.

    A word's forwards are those in which it was a pointer (attention's split-KV outputs are NULL
    in prefill); only words with at least VIEW_FORWARDS of them take part (a distance seen once is
    no constant: cuBLAS picks another kernel per shape, and its descriptor words would fill the
    list), and a view has two members or more.

    How, without comparing pairs: per distinct forward set F, every word running in all of F is
    keyed by the set of (forward, allocation, offset minus its offset in F's first forward) over
    F, hashed (`_set_hash`); equal keys are exactly the words that move together over F."""
    w = p.loc[p["is_ptr"] & (p["buffer_id"] >= 0), WORD + ["forward", "buffer_id", "ptr_off", "seq"]]
    w = w[w.groupby(WORD, observed=True)["forward"].transform("size").to_numpy() >= VIEW_FORWARDS]
    if w.empty:
        return pd.DataFrame(columns=VIEW_COLS)
    w = w.sort_values(["forward"], kind="stable")
    word = w.groupby(WORD, observed=True, sort=False).ngroup().to_numpy()
    words = w.groupby(WORD, observed=True, sort=False).agg(first=("seq", "min"), n=("forward", "size")).reset_index()
    fset = _set_hash(word, w[["forward"]])
    fwd = w["forward"].to_numpy()
    found = []
    for key in np.unique(fset):
        own = np.flatnonzero(fset == key)                  # the words whose forwards are F
        F = np.unique(fwd[word == own[0]])
        rows = np.flatnonzero(np.isin(fwd, F))
        # the words present in all of F (their own sets contain it)
        cnt = np.bincount(word[rows], minlength=len(words))
        full = cnt == len(F)
        rows = rows[full[word[rows]]]
        wr = word[rows]
        off = w["ptr_off"].to_numpy()[rows]
        first_off = np.zeros(len(words), dtype=np.int64)
        uniq, at_first = np.unique(wr, return_index=True)  # rows are by forward: F's first forward
        first_off[uniq] = off[at_first]
        moved = pd.DataFrame({"f": fwd[rows], "b": w["buffer_id"].to_numpy()[rows],
                              "r": off - first_off[wr]})
        k = _set_hash(wr, moved)
        members = np.flatnonzero(full)
        g = pd.DataFrame({"word": members, "key": k[members], "anchor": fset[members] == key})
        g = g[g.groupby("key")["word"].transform("size") >= 2]
        g = g[g.groupby("key")["anchor"].transform("any")]
        if len(g):
            g["delta"] = first_off[g["word"].to_numpy()]
            g["delta"] -= g.groupby("key")["delta"].transform("min")
            g["forwards"] = len(F)
            found.append(g)
    if not found:
        return pd.DataFrame(columns=VIEW_COLS)
    out = pd.concat(found, ignore_index=True)
    out = out.join(words[WORD + ["first"]], on="word")
    out["gkey"] = out["key"].astype(str) + ":" + out["forwards"].astype(str)
    order = out.groupby("gkey")["first"].min().sort_values(kind="stable")
    out["view"] = out["gkey"].map(pd.Series(np.arange(len(order)), index=order.index))
    out["site"] = out["site"].astype(str)
    out = out.sort_values(["view", "delta", "first", "i", "at"], kind="stable")
    return out[VIEW_COLS].astype({"view": "int64", "forwards": "int64", "i": "int64", "at": "int64",
                                  "delta": "int64", "anchor": bool}).reset_index(drop=True)
