"""A block table whose pages end where the context's page count says (`compiler.fills._blocks`,
bounded): non-zero distinct pages for ceil(len / P) entries of each row, zeros after, 4 pages or
more. A one-sequence decode's table keeps its pages from step to step, so agreement over changing
values never names it; q3z's second GPU capture (tests/gpu_results/session14) showed
[8, 9, ..., 18, 0, ...] at a 171-token context, the attention's gathered table, left unnamed."""
from __future__ import annotations

import numpy as np
import pytest

from compiler import fills
from compiler.requests import Run, Step


def _step(*ends_and_new) -> Step:
    return Step(3, tuple(Run(k, end - n, tuple(range(1, n + 1))) for k, (end, n) in enumerate(ends_and_new)))


def _table(rows: list[list[int]], width: int, dt=np.int32) -> bytes:
    t = np.zeros((len(rows), width), dt)
    for i, r in enumerate(rows):
        t[i, :len(r)] = r
    return t.tobytes()


def _blocks(data: bytes, step: Step, prefix: bool):
    return [(m.dtype, m.sure, m.page) for m in fills.match(data, step, prefix=prefix) if m.fill == "blocks"]


@pytest.mark.parametrize("page,ctx", [(16, 171), (16, 64), (32, 300), (8, 40), (64, 1000)])
def test_a_bounded_table_of_one_sequence_is_structure_with_its_page(page, ctx):
    rng = np.random.default_rng(page + ctx)
    need = -(-ctx // page)
    pages = rng.choice(np.arange(1, 5000), need, replace=False).tolist()
    got = _blocks(_table([pages], 1024), _step((ctx, 1)), prefix=True)
    assert ("i32", "structure", page) in got
    assert got[0] == ("i32", "structure", page)      # the surest reading comes first


def test_two_sequences_each_bounded():
    data = _table([[5, 6, 7], [9, 10, 11, 12]], 64)
    got = _blocks(data, _step((40, 1), (60, 1)), prefix=False)
    assert ("i32", "structure", 16) in got


@pytest.mark.parametrize("rows,ctx,why", [
    ([[8, 9, 10]], 40, "three pages: too few to tell"),
    ([[8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 77]], 171, "a non-zero entry past the context's pages"),
    ([[8, 0, 10, 11, 12, 13, 14, 15, 16, 17, 18]], 171, "a zero page inside the context"),
    ([[8, 9, 9, 11, 12, 13, 14, 15, 16, 17, 18]], 171, "a repeated page"),
])
def test_what_is_not_bounded_stays_weak_or_unmatched(rows, ctx, why):
    got = _blocks(_table(rows, 1024), _step((ctx, 1)), prefix=True)
    assert all(s == "weak" for _, s, _ in got), why


def test_float_data_is_no_table():
    rng = np.random.default_rng(1)
    data = rng.normal(0, 1, 1024).astype(np.float32).tobytes()
    assert not [g for g in _blocks(data, _step((171, 1)), prefix=True) if g[1] != "weak"]
