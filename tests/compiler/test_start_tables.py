"""Host tables copied in before the forwards (`compiler.programs.is_table`, `start_tables`): the
addresses, strides and page sizes an engine's host writes once at start-up for its own staging
kernels count as host data; weights copied in before the forwards never do. On q3z (vLLM 0.26's
V2 model runner, default mode) this is what leaves `_compute_slot_mappings_kernel` out of the
decode program, so the slot mapping it computes becomes the program's `slot` input."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from compiler.programs import SMALL, is_table, start_tables

ALLOCS = [(0x7F3C8B000000, 32 << 20), (0x7F3CA4200000, 2 << 20)]
rng = np.random.default_rng(5)


def _words(*v) -> bytes:
    return np.array(v, "<u8").tobytes()


@pytest.mark.parametrize("data", [
    _words(0x7F3C8B000000 + 0xF80000),                  # one block-table address
    _words(0x7F3CA4200000, 0x7F3C8B000100, 128, 0),     # addresses, a stride, a zero
    _words(16),                                         # a page size as i64
    np.array([16], "<u4").tobytes(),                    # ... as i32 (4 bytes)
    np.array([16, 32, 0], "<u4").tobytes(),             # an odd count of i32
    np.arange(1, 65, dtype="<i4").tobytes(),            # counts
])
def test_engine_tables_are_host_data(data):
    assert is_table(data, ALLOCS)


def _bf16(x: np.ndarray) -> bytes:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


@pytest.mark.parametrize("data", [
    _bf16(np.ones(256)),                                  # a norm weight
    _bf16(rng.normal(0, 0.02, 512)),                      # a projection's slice
    np.ones(4, np.float32).tobytes(),                     # fp32
    rng.normal(0, 1, 8).astype(np.float32).tobytes(),
    np.array([1.0], np.float32).tobytes(),                # one fp32 value (4 bytes)
    _words(0x7F3D12345678),                               # an address in no captured allocation
    bytes(64),                                            # zeros: nothing to tell
    b"\x01\x02\x03",                                      # not whole words
    b"",
])
def test_model_data_and_unknowns_are_not(data):
    assert not is_table(data, ALLOCS)


def test_every_normal_float_sets_a_bit_at_or_above_small():
    """Why SMALL: a word holding a normal fp32 value, or a bf16 value in its upper half, is never
    below it (the lowest exponent bit)."""
    f = np.array([np.finfo(np.float32).tiny, 1e-30, 0.5, 1.0, -2.0, 3e38], np.float32)
    assert (f.view(np.uint32) >= SMALL).all()
    bf_hi = (f.view(np.uint32) >> 16 << 16)
    assert (bf_hi >= SMALL).all()


def _copies(rows):
    return pd.DataFrame(rows, columns=["seq_before", "dst", "size", "has_bytes", "data"])


def test_a_later_copy_of_other_bytes_ends_a_table_and_a_later_table_replaces_floats():
    a = ALLOCS[0][0]
    got = start_tables(_copies([
        (10, a + 0x100, 4, True, np.array([1.0], np.float32).tobytes()),   # a float first...
        (20, a + 0x100, 8, True, _words(a + 0x4000)),                     # ...then the address
        (20, a + 0x200, 8, True, _words(128)),                            # a stride...
        (30, a + 0x200, 512, True, _bf16(np.ones(256))),                  # ...overwritten by a weight
        (40, a + 0x800, 8, False, None),                                  # no bytes kept
    ]), ALLOCS)
    assert got == [(a + 0x100, a + 0x108, 20)]


def test_no_copies_no_tables():
    assert start_tables(None, ALLOCS) == [] and start_tables(_copies([]), ALLOCS) == []
