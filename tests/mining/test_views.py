"""`mining.pointers.views` on hand-built pointer words with known relations: what moves together
over the forwards two words share is one view, anything else is not."""

from __future__ import annotations

import pandas as pd

from vocab.analysis import Relations, View, ViewMember
from mining.pointers import views


def words(rows):
    """rows: (site, i, forward, buffer_id, offset) -> the frame `pointer_words` gives."""
    df = pd.DataFrame(rows, columns=["site", "i", "forward", "buffer_id", "ptr_off"])
    df["at"] = 0
    df["is_ptr"] = df["buffer_id"] >= 0
    df["seq"] = df["forward"] * 100 + df.groupby("forward").cumcount()
    return df


def relations(df) -> Relations:
    v = views(df)
    return Relations([View(int(k), int(g["forwards"].iat[0]),
                           [ViewMember(r.site, int(r.i), int(r.at), int(r.delta), bool(r.anchor))
                            for r in g.itertuples()]) for k, g in v.groupby("view")])


def test_slices_residual_and_moving_buffers():
    rows = []
    for f, (bid, base) in enumerate([(1, 0), (1, 4096), (2, 512), (1, 8192)]):
        rows += [("qkv_out#0", 0, f, bid, base),              # a fused qkv output...
                 ("qnorm#0", 1, f, bid, base),                # ...its q slice,
                 ("knorm#0", 1, f, bid, base + 2048),         # k slice at +2048
                 ("res#0", 0, f, 9, 64), ("res#1", 2, f, 9, 64),   # one residual, in place
                 ("other#0", 0, f, bid, base + 100 * f)]      # same allocation, moving distance
    rel = relations(words(rows))
    assert rel.distance(("qkv_out#0", 0, 0), ("qnorm#0", 1, 0)) == 0
    assert rel.distance(("qnorm#0", 1, 0), ("knorm#0", 1, 0)) == 2048
    assert rel.distance(("knorm#0", 1, 0), ("qnorm#0", 1, 0)) == -2048
    assert rel.distance(("res#0", 0, 0), ("res#1", 2, 0)) == 0
    assert rel.distance(("qnorm#0", 1, 0), ("other#0", 0, 0)) is None
    assert rel.distance(("qnorm#0", 1, 0), ("res#0", 0, 0)) is None


def test_a_site_skipped_by_a_pass_relates_over_its_own_forwards():
    """Forward 0 is a profile pass without attention: attention's words relate to the rest over
    the forwards it ran in, and a relation broken only in forward 0 still holds for it."""
    rows = []
    for f in range(4):
        base = 1000 * f
        rows += [("norm#0", 2, f, 5, base), ("mlp#0", 0, f, 5, base + (7 if f == 0 else 0))]
        if f:
            rows += [("attn#0", 1, f, 5, base)]
    rel = relations(words(rows))
    assert rel.distance(("attn#0", 1, 0), ("norm#0", 2, 0)) == 0
    assert rel.distance(("attn#0", 1, 0), ("mlp#0", 0, 0)) == 0
    # over the forwards norm and mlp both ran in (all four) their distance changed
    assert rel.distance(("norm#0", 2, 0), ("mlp#0", 0, 0)) is None


def test_disjoint_forwards_and_single_samples_make_no_view():
    rows = []
    for f in range(4):
        site = "prefill_attn#0" if f % 2 else "decode_attn#0"
        rows += [(site, 0, f, 3, 0)]
    rows += [("once_a#0", 0, 0, 4, 16), ("once_b#0", 0, 0, 4, 16)]    # one forward: no constant
    rows += [("null_sometimes#0", 3, f, 3 if f else -1, 0) for f in range(4)]
    v = views(words(rows))
    assert not ({"once_a#0", "once_b#0"} & set(v["site"]))
    rel = relations(words(rows))
    assert rel.distance(("prefill_attn#0", 0, 0), ("decode_attn#0", 0, 0)) is None
    # a word that is NULL in forward 0 takes part over the forwards it pointed in
    assert rel.distance(("null_sometimes#0", 3, 0), ("prefill_attn#0", 0, 0)) == 0


def test_no_pointers_no_views():
    df = words([("a#0", 0, 0, -1, 0), ("a#0", 0, 1, -1, 0)])
    assert views(df).empty
