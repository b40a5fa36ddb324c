"""compare.batch: the inputs of one batched call (issue 17), checked as a kernel would read them.

No GPU: `step_inputs` is the arithmetic the batched host writes into kern's regions. What is
checked, for random mixes of sequences (slots, starts, token counts, call orders): the rows of a
sequence are its tokens at consecutive positions; each slot is the cell the block table names
(table[row][pos // block] * block + pos % block), so a paged-attention kernel reading the table
finds every token where the cache write put it; no two rows of one step, and no two sequences of
the layout, share a cell; query start offsets add the rows up; lengths are the context after the
step; and a context past the table, a repeated sequence or an empty step is refused.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from compare.batch import Layout, Row, packed_calls, step_inputs
from compare.serving import ManifestError


def _random_step(rng, layout, n_seqs):
    seqs = rng.sample(range(n_seqs), rng.randrange(1, n_seqs + 1))
    rows = []
    cap = layout.per_seq * layout.block
    for s in seqs:
        n = rng.choice([1, 1, rng.randrange(1, 40)])
        start = rng.randrange(0, cap - n + 1)
        rows.append(Row(s, start, tuple(rng.randrange(1000) for _ in range(n))))
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_slots_are_the_cells_the_table_names(seed):
    rng = random.Random(seed)
    block = rng.choice([1, 16, 32, 64])
    ctx = rng.randrange(1, 3000)
    width = -(-ctx // block) + rng.randrange(0, 4)
    layout = Layout.for_context(ctx, block, width)
    rows = _random_step(rng, layout, rng.randrange(1, 64))
    a = step_inputs(layout, rows)
    assert a["cu_seqlens"][0] == 0 and list(np.diff(a["cu_seqlens"])) == [len(r.tokens) for r in rows]
    assert list(a["seq_len"]) == [r.start + len(r.tokens) for r in rows]
    assert a["blocks"].shape == (len(rows), width)
    for j, r in enumerate(rows):
        lo, hi = a["cu_seqlens"][j], a["cu_seqlens"][j + 1]
        assert list(a["token"][lo:hi]) == list(r.tokens)
        pos = a["position"][lo:hi]
        assert list(pos) == list(range(r.start, r.start + len(r.tokens)))
        table = a["blocks"][j]
        assert list(a["slot"][lo:hi]) == list(table[pos // block] * block + pos % block)
        assert (table[layout.per_seq:] == 0).all()
    assert len(set(a["slot"].tolist())) == len(a["slot"])


def test_sequences_never_share_a_page():
    layout = Layout.for_context(300, 16, 32)
    pages = [set(layout.pages(s).tolist()) for s in range(64)]
    assert all(not (pages[i] & pages[k]) for i in range(64) for k in range(i + 1, 64))
    # one more position in a sequence is one more slot (what the on-device loop relies on)
    p = np.arange(0, layout.per_seq * 16 - 1)
    assert (np.diff(layout.slots(5, p)) == 1).all()


def test_refusals():
    with pytest.raises(ManifestError, match="needs 3 pages of 16, more than the block table's 2"):
        Layout.for_context(40, 16, 2)
    layout = Layout.for_context(32, 16, 4)
    with pytest.raises(ValueError, match="reaches position 32"):
        step_inputs(layout, [Row(0, 30, (1, 2, 3))])
    with pytest.raises(ValueError, match="appears twice"):
        step_inputs(layout, [Row(0, 0, (1,)), Row(0, 1, (2,))])
    with pytest.raises(ValueError, match="at least one"):
        step_inputs(layout, [])
    with pytest.raises(ValueError, match="feeds no token"):
        step_inputs(layout, [Row(1, 0, ())])


@pytest.mark.parametrize("seed", range(8))
def test_packed_calls_land_every_prompt_once_in_order(seed):
    rng = random.Random(100 + seed)
    rows, groups = rng.choice([1, 7, 64, 512]), rng.choice([1, 3, 16])
    prompts = [(s, [rng.randrange(1000) for _ in range(rng.randrange(0, 300))]) for s in rng.sample(range(64), 9)]
    calls = packed_calls(prompts, rows, groups)
    for call in calls:
        assert 1 <= len(call) <= groups and sum(len(r.tokens) for r in call) <= rows
        assert len({r.seq for r in call}) == len(call)
    # every call but the last is full in rows or in sequences
    for call in calls[:-1]:
        assert sum(len(r.tokens) for r in call) == rows or len(call) == groups
    for s, ids in prompts:
        parts = [r for call in calls for r in call if r.seq == s]
        assert [t for r in parts for t in r.tokens] == ids
        starts = [r.start for r in parts]
        assert starts == [sum(len(r.tokens) for r in parts[:k]) for k in range(len(parts))]
