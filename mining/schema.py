"""Dump -> DataFrame columns, declared as data (one versioned table).

Why: `load.py` turns a dump (docs/dump-format.md, format_version 1) into three canonical frames,
and every analysis reads those frames only. Declaring the columns here, with their source key and
their in-memory dtype, keeps the contract in one place: a new capture field is one line below, and
the parquet cache is invalidated by bumping FRAME_VERSION.

Not checked here: the values themselves (that is `load.py`'s job, which drops what cannot parse).
"""

from __future__ import annotations

import pyarrow as pa

DUMP_FORMAT_VERSION = 1
FRAME_VERSION = 3  # bump when a column below or the params row order changes; keys the cache

_PTR = pa.struct(
    [("at", pa.int64()), ("base", pa.string()), ("size", pa.int64()), ("id", pa.int64()),
     ("off", pa.int64())]
)
_PARAM = pa.struct(
    [("i", pa.int64()), ("off", pa.int64()), ("size", pa.int64()), ("hex", pa.string()),
     ("ptrs", pa.list_(_PTR))]
)
_DIM3 = pa.list_(pa.int64())

# The part of a launches.jsonl record the loader reads; other keys are ignored (writers may add).
LAUNCH_RECORD = pa.schema(
    [
        ("seq", pa.int64()), ("t_ns", pa.int64()), ("tid", pa.int64()), ("dev", pa.int64()),
        ("ctx", pa.string()), ("stream", pa.string()), ("api", pa.string()),
        ("result", pa.int64()),
        ("graph", pa.struct([("graph", pa.string()), ("capture_id", pa.int64())])),
        ("handle", pa.string()), ("func", pa.string()), ("module", pa.int64()),
        ("sha256", pa.string()), ("symbol", pa.string()), ("name", pa.string()),
        ("grid", _DIM3), ("block", _DIM3), ("smem", pa.int64()),
        ("launch_attrs", pa.struct([("cluster", _DIM3), ("pdl", pa.int64())])),
        ("attrs", pa.struct([("regs", pa.int64()), ("static_smem", pa.int64()),
                             ("local", pa.int64()), ("max_threads", pa.int64())])),
        ("packing", pa.string()), ("layout", pa.string()),
        ("params", pa.list_(_PARAM)), ("extra_hex", pa.string()),
        ("fn", pa.int64()),  # compact form: the functions.jsonl id replacing handle..attrs, layout
    ]
)

# launches frame: column -> pandas dtype. "category" columns are interned strings.
LAUNCH_COLUMNS: dict[str, str] = {
    "seq": "int64",
    "t_ns": "int64",
    "tid": "int32",
    "dev": "int8",
    "stream": "category",
    "api": "category",
    "result": "int32",
    "capture_id": "int32",       # -1 when the launch was not inside a stream capture
    "handle": "category",
    "module": "int64",           # -1 when unresolvable
    "sha256": "category",
    "symbol": "category",
    "name": "category",
    "grid_x": "int32", "grid_y": "int32", "grid_z": "int32",
    "block_x": "int16", "block_y": "int16", "block_z": "int16",
    "smem": "int32",
    "regs": "int16",
    "layout": "category",
    "packing": "category",
    "n_params": "int16",
}

# params frame (long form): one row per parameter (at == 0, word == False) and one row per pointer
# word found inside a parameter past its first word (at > 0, word == True). Rows follow the launch
# file: each launch's parameters in index order, each followed by its word rows (by `at`); the
# launches frame is sorted by `seq` instead, so join on `seq`.
PARAM_COLUMNS: dict[str, str] = {
    "seq": "int64",       # the launch
    "i": "int16",         # parameter index
    "off": "int32",       # parameter offset in the parameter buffer
    "size": "int32",      # parameter bytes (8 for word rows)
    "at": "int32",        # byte offset of this word inside the parameter
    "word": "bool",
    "value": "uint64",    # little-endian value of the first min(size, 8) bytes at `at`
    "is_ptr": "bool",
    "alloc_base": "uint64",   # 0 when not a pointer
    "alloc_size": "int64",
    "buffer_id": "int64",     # -1 when not a pointer
    "ptr_off": "int64",       # value - alloc_base
    "hex": "string[pyarrow]",  # raw bytes only for parameters wider than 8 bytes, else null
}

MODULE_COLUMNS: dict[str, str] = {
    "event": "category",
    "module": "int64",
    "dev": "int8",
    "t_ns": "int64",
    "sha256": "category",
    "size": "int64",
    "n_entries": "int32",
    "cubin_present": "bool",
}

# allocs.jsonl (MINE_CAPTURE_ALLOC_LOG=1): the keys mining/allocs.py reads.
ALLOC_RECORD = pa.schema(
    [
        ("seq_before", pa.int64()), ("order", pa.int64()), ("t_ns", pa.int64()),
        ("event", pa.string()), ("api", pa.string()), ("base", pa.string()), ("size", pa.int64()),
        ("id", pa.int64()), ("result", pa.int64()),
    ]
)

# Dump.allocs frame: one row per allocs.jsonl event, in file order.
ALLOC_COLUMNS: dict[str, str] = {
    "seq_before": "int64",   # launches with seq >= this see the event
    "order": "int64",        # the capture's ticket (file position when the log has none)
    "t_ns": "int64",
    "event": "category",     # alloc, free, map, unmap, reserve, ... (docs/dump-format.md)
    "api": "category",
    "base": "uint64",        # 0 when the event has no address
    "has_base": "bool",
    "size": "int64",         # -1 when the API gives none
    "id": "int64",           # the driver's buffer id, -1 when unknown
    "result": "int64",       # the API's CUresult; only 0 counts
}
