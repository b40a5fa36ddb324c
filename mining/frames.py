"""Turn one parsed chunk of launch records (an arrow table) into launches/params frame columns.

Why: the frames (columns and dtypes declared in `schema.py`) are built chunk by chunk on the
reader's worker threads (`mining/jsonl.py`), straight into their final dtypes, so a load never holds
the arrow tables and the frames at once. This module owns what the frames are built from
(`READ_SCHEMA`: the record keys parsed at all), the per-chunk conversion (`launch_part`,
`param_part`), the vectorised hex decoding (`hex_le_u64`, `hex_num_u64`; also used by
`mining/allocs.py`) and the gathering of parts into frames (`Columns`).

Params frame, long form: one row per parameter, each followed by a row per inner pointer word
(a pointer found at a nonzero offset inside it; rows in launch, i, at order, independent of how
the file was chunked). Pointer columns come from the recorded
`ptrs` or, with an allocation log, from `mining/allocs.py` (`Offline`: "fill" when the capture did
not classify, "check" counts disagreements otherwise). Compact launches arrive already expanded
(`functions.expand`), with their parameters' (off, size) as `lay`. Missing keys take the defaults below (ints 0 or -1, strings "", dims [1, 1, 1]).
Checked before use (`valid_rows`, called by the JSON reader on every parsed chunk): every field the
frames are built from lies in its documented range (docs/dump-format.md "Reading damaged dumps").
Not checked: hex strings' characters (decoded as found; a non-hex character reads as nibble 0).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from mining import schema
from mining.allocs import Offline, classify_words, disagreements


def _read_schema() -> pa.Schema:
    """schema.LAUNCH_RECORD cut down to the keys the frames are built from.

    Keys outside it (ctx, func, launch_attrs, extra_hex, most of attrs) are skipped by the reader
    without being converted or type-checked: ~10 % less parse time, and a launch is no longer
    dropped for a malformed key that no frame column comes from.
    """
    sub = {"graph": {"capture_id"}, "attrs": {"regs"}}
    keep = set(_LAUNCH_INTS) | set(_LAUNCH_STRS) | {"grid", "block", "params", "fn"} | set(sub)
    fields = []
    for f in schema.LAUNCH_RECORD:
        if f.name in sub:
            f = pa.field(f.name, pa.struct([s for s in f.type if s.name in sub[f.name]]))
        if f.name in keep:
            fields.append(f)
    return pa.schema(fields)


# ------------------------------------------------------------------ documented ranges
# What a launch record's fields may hold (docs/dump-format.md "Reading damaged dumps"): the bounds
# the capture cannot exceed, which are also what the frames' dtypes (schema.py) hold. The binary
# reader checks the same bounds on its headers (vocab/binfmt.py `_valid`).
MAX_SEQ = 1 << 62
MAX_PARAMS = 4096          # a parameter buffer is at most 32,764 bytes
MAX_PARAM_BYTES = 32768


def _ints(col, default) -> np.ndarray:
    return np.asarray(_one_chunk(pc.fill_null(col, default)).to_numpy(zero_copy_only=False), np.int64)


def valid_rows(t: pa.Table) -> np.ndarray:
    """Which records of a parsed chunk have every field the frames are built from inside its
    documented range (a record outside one is damage, never a value to wrap into a dtype).
    Vectorised over the chunk; nested params checked through their flattened arrays."""
    n = t.num_rows
    if n == 0:
        return np.zeros(0, bool)
    seq = t.column("seq")
    ok = _one_chunk(seq.is_valid()).to_numpy(zero_copy_only=False).copy()
    sq = _ints(seq, 0)
    ok &= (sq >= 0) & (sq < MAX_SEQ)
    named = pc.or_(pc.is_valid(t.column("symbol")), pc.is_valid(t.column("fn")))
    ok &= _one_chunk(named).to_numpy(zero_copy_only=False)   # a launch names its kernel or its fn
    ok &= _ints(t.column("t_ns"), 0) >= 0
    tid = _ints(t.column("tid"), 0)
    ok &= (tid >= 0) & (tid < 1 << 31)
    dev = _ints(t.column("dev"), 0)
    ok &= (dev >= -1) & (dev < 128)
    res = _ints(t.column("result"), 0)
    ok &= (res >= -(1 << 31)) & (res < 1 << 31)
    mod = _ints(t.column("module"), -1)
    ok &= mod >= -1
    fn = _ints(t.column("fn"), 0)
    ok &= (fn >= 0) & (fn < 1 << 31)
    regs = _ints(pc.struct_field(t.column("attrs"), "regs"), 0)
    ok &= (regs >= 0) & (regs < 1 << 15)
    cap = _ints(pc.struct_field(t.column("graph"), "capture_id"), 0)
    ok &= (cap >= -1) & (cap < 1 << 31)
    smem = _ints(t.column("smem"), 0)
    shape = (smem >= 0) & (smem < 1 << 24)
    lim = {"grid": ((1 << 31) - 1, 65535, 65535), "block": (1024, 1024, 64)}
    threads = np.ones(n, np.int64)
    for name in ("grid", "block"):
        col = _one_chunk(t.column(name))
        ln = _ints(pc.list_value_length(col), 3)
        ok &= ln == 3                                    # [x, y, z] or absent
        for k in range(3):
            v = _ints(pc.list_element(pc.if_else(pc.equal(pc.list_value_length(col), 3), col,
                                                 pa.scalar([1, 1, 1], col.type)), k), 1)
            # failed launches keep what the caller passed, but it must still fit the frame's dtype
            ok &= (v >= 0) & (v <= (lim["grid"][0] if name == "grid" else 32767))
            shape &= (v >= 1) & (v <= lim[name][k])
            if name == "block":
                threads *= np.clip(v, 0, 1 << 20)
    shape &= threads <= 1024
    ok &= (res != 0) | shape
    params = _one_chunk(t.column("params"))
    npar = _ints(pc.list_value_length(params), 0)
    ok &= npar <= MAX_PARAMS
    flat = pc.list_flatten(params)
    if len(flat):
        parent = pc.list_parent_indices(params).to_numpy()
        i = _ints(pc.struct_field(flat, "i"), 0)
        off = _ints(pc.struct_field(flat, "off"), 0)
        size = _ints(pc.struct_field(flat, "size"), 0)
        hexlen = _ints(pc.utf8_length(pc.struct_field(flat, "hex")), 0)
        good = (i >= 0) & (i < MAX_PARAMS) & (off >= 0) & (off <= MAX_PARAM_BYTES)
        good &= (size >= 0) & (size <= MAX_PARAM_BYTES) & (hexlen <= 2 * MAX_PARAM_BYTES)
        ptrs = pc.struct_field(flat, "ptrs")
        pflat = pc.list_flatten(ptrs)
        if len(pflat):
            owner = pc.list_parent_indices(ptrs).to_numpy()
            at = _ints(pc.struct_field(pflat, "at"), 0)
            psz = _ints(pc.struct_field(pflat, "size"), 0)
            poff = _ints(pc.struct_field(pflat, "off"), 0)
            pid = _ints(pc.struct_field(pflat, "id"), -1)
            pgood = (at >= 0) & (at < MAX_PARAM_BYTES) & (at % 8 == 0) & (psz >= 0) & (pid >= -1)
            pgood &= (poff > -(1 << 62)) & (poff < 1 << 62)
            good &= np.bincount(owner[~pgood], minlength=len(flat)) == 0
        ok &= np.bincount(parent[~good], minlength=n) == 0
    return ok


# ------------------------------------------------------------------ hex decoding, vectorised
_LUT = np.zeros(256, np.uint8)
for _c in b"0123456789":
    _LUT[_c] = _c - 48
for _c in b"abcdef":
    _LUT[_c] = _c - 87
    _LUT[_c - 32] = _c - 87


def _fixed16_bytes(arr: pa.Array) -> np.ndarray:
    """(N, 8) bytes from N strings of exactly 16 hex characters."""
    arr = pa.array(arr) if not isinstance(arr, pa.Array) else arr
    n = len(arr)
    if n == 0:
        return np.zeros((0, 8), np.uint8)
    start = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset]
    chars = np.frombuffer(arr.buffers()[2], np.uint8)[start:start + 16 * n].reshape(n, 16)
    nib = _LUT[chars]
    return (nib[:, 0::2] << 4) | nib[:, 1::2]


def hex_le_u64(hexes) -> np.ndarray:
    """Little-endian value of the first 8 bytes of each memory-order hex string (null -> 0)."""
    s = pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(hexes, ""), 0, 16), 16, "0")
    return _fixed16_bytes(_one_chunk(pc.cast(s, pa.string()))).copy().view("<u8").ravel()


def hex_num_u64(nums) -> np.ndarray:
    """Value of each '0x...' string (null -> 0)."""
    s = pc.utf8_ltrim(pc.fill_null(nums, "0x0"), "0x")
    s = pc.utf8_lpad(pc.utf8_slice_codeunits(s, 0, 16), 16, "0")
    raw = _fixed16_bytes(_one_chunk(pc.cast(s, pa.string())))
    return raw.copy().view(">u8").ravel().astype("<u8")


def _one_chunk(arr):
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


# ------------------------------------------------------------------ arrow -> column parts
# A part is a dict column -> numpy array (already in the frame's dtype) or, for string columns,
# an arrow array (dictionary-encoded for the launch frame's categories). Parts are built on the
# workers; `Columns` gathers them, in file order, into the frames.
_LAUNCH_INTS = {"seq": 0, "t_ns": 0, "tid": 0, "dev": 0, "result": 0, "smem": 0, "module": -1}
_LAUNCH_STRS = ("stream", "api", "handle", "sha256", "symbol", "name", "layout", "packing")
_DIM_DEFAULT = pa.scalar([1, 1, 1], pa.list_(pa.int64()))
READ_SCHEMA = _read_schema()


def _np(arr, dtype: str) -> np.ndarray:
    """A null-free int/bool arrow array -> numpy in `dtype` (one copy at most)."""
    return np.asarray(_one_chunk(arr).to_numpy(zero_copy_only=False), dtype=dtype)


def launch_part(t: pa.Table) -> dict:
    L = schema.LAUNCH_COLUMNS
    cols: dict[str, object] = {}
    for name, default in _LAUNCH_INTS.items():
        cols[name] = _np(pc.fill_null(t.column(name), default), L[name])
    cols["capture_id"] = _np(pc.fill_null(pc.struct_field(t.column("graph"), "capture_id"), -1),
                             L["capture_id"])
    cols["regs"] = _np(pc.fill_null(pc.struct_field(t.column("attrs"), "regs"), 0), L["regs"])
    for name in ("grid", "block"):
        dims = pc.fill_null(t.column(name), _DIM_DEFAULT)
        for k, ax in enumerate("xyz"):
            cols[f"{name}_{ax}"] = _np(pc.fill_null(pc.list_element(dims, k), 1), L[f"{name}_{ax}"])
    cols["n_params"] = _np(pc.fill_null(pc.list_value_length(t.column("params")), 0), L["n_params"])
    for name in _LAUNCH_STRS:
        cols[name] = _one_chunk(pc.dictionary_encode(pc.fill_null(t.column(name), "")))
    return cols


def param_part(t: pa.Table, offline: Offline | None = None, lay=None) -> dict:
    seqs = pc.fill_null(t.column("seq"), 0).to_numpy()
    params = _one_chunk(t.column("params"))
    return _param_chunk(params, seqs, offline, lay)


def _hex_words(hexes, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every whole 8-byte word of every parameter (as the capture classifies them: at 0, 8, ...
    below `size`, where the hex has the bytes): owner row, byte offset, little-endian value."""
    arr = _one_chunk(pc.fill_null(hexes, ""))
    n = len(arr)
    offs = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None \
        else np.zeros(0, np.uint8)
    nw = np.minimum(np.asarray(size, np.int64) // 8, np.diff(offs) // 16).clip(0)
    total = int(nw.sum())
    owner = np.repeat(np.arange(n, dtype=np.int64), nw)
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(nw) - nw, nw)
    chars = data[(offs[owner] + 16 * j)[:, None] + np.arange(16)]
    nib = _LUT[chars]
    raw = (nib[:, 0::2] << 4) | nib[:, 1::2]
    return owner, 8 * j, raw.copy().view("<u8").ravel()


_NULL_STR = pa.scalar(None, pa.string())


def _param_chunk(chunk: pa.ListArray, seqs: np.ndarray, offline: Offline | None = None,
                 lay=None) -> dict:
    """Long-form rows of one chunk: one per parameter, each followed by its inner pointer words.
    `lay`: (off, size) per parameter when they come from functions.jsonl (compact form)."""
    P = schema.PARAM_COLUMNS
    flat = pc.list_flatten(chunk)
    parent = pc.list_parent_indices(chunk).to_numpy()
    n = len(flat)
    size = pc.fill_null(pc.struct_field(flat, "size"), 0).to_numpy() if lay is None else lay[1]
    hexes = pc.struct_field(flat, "hex")
    cols = {
        "seq": seqs[parent].astype(P["seq"], copy=False),
        "i": _np(pc.fill_null(pc.struct_field(flat, "i"), -1), P["i"]),
        "off": (_np(pc.fill_null(pc.struct_field(flat, "off"), 0), P["off"]) if lay is None
                else lay[0].astype(P["off"])),
        "size": size.astype(P["size"]),
        "at": np.zeros(n, P["at"]), "word": np.zeros(n, bool), "value": hex_le_u64(hexes),
        "is_ptr": np.zeros(n, bool), "alloc_base": np.zeros(n, np.uint64),
        "alloc_size": np.zeros(n, np.int64), "buffer_id": np.full(n, -1, np.int64),
        "ptr_off": np.zeros(n, np.int64),
        "hex": _one_chunk(pc.if_else(pa.array(size > 8), hexes, _NULL_STR)),
    }
    del parent
    ptrs = pc.struct_field(flat, "ptrs")
    pflat = pc.list_flatten(ptrs)
    rec = None
    if len(pflat):
        rec = {"owner": pc.list_parent_indices(ptrs).to_numpy(),
               "at": pc.fill_null(pc.struct_field(pflat, "at"), 0).to_numpy(),
               "base": hex_num_u64(pc.struct_field(pflat, "base")),
               "size": pc.fill_null(pc.struct_field(pflat, "size"), 0).to_numpy(),
               "id": pc.fill_null(pc.struct_field(pflat, "id"), -1).to_numpy(),
               "off": pc.fill_null(pc.struct_field(pflat, "off"), 0).to_numpy()}
    if offline is not None and (rec is None or offline.mode == "check"):
        w_owner, w_at, w_val = _hex_words(hexes, size)
        off = classify_words(offline.iv, cols["seq"][w_owner], w_val, w_at, w_owner)
        del w_owner, w_at, w_val
        if offline.mode == "check":
            empty = {k: np.zeros(0, np.uint64 if k == "base" else np.int64) for k in off}
            offline.disagree.append(disagreements(rec if rec is not None else empty, off))
        else:
            rec = off
    del size
    if rec is None or len(rec["owner"]) == 0:
        return cols
    owner, at, base, asz, bid, poff = (rec[k] for k in ("owner", "at", "base", "size", "id", "off"))
    del rec
    first = at == 0
    o = owner[first]
    cols["is_ptr"][o] = True
    cols["alloc_base"][o] = base[first]
    cols["alloc_size"][o] = asz[first]
    cols["buffer_id"][o] = bid[first]
    cols["ptr_off"][o] = poff[first]
    rest = ~first
    if not rest.any():
        return cols
    o = owner[rest]
    m = len(o)
    words = {
        "seq": cols["seq"][o], "i": cols["i"][o], "off": cols["off"][o],
        "size": np.full(m, 8, P["size"]), "at": at[rest].astype(P["at"]), "word": np.ones(m, bool),
        "value": base[rest] + poff[rest].astype(np.uint64), "is_ptr": np.ones(m, bool),
        "alloc_base": base[rest], "alloc_size": asz[rest], "buffer_id": bid[rest],
        "ptr_off": poff[rest],
    }
    # Each parameter's word rows go right after it (rows in launch, i, at order), so the row order
    # depends on the file only, not on how it was cut into chunks. `o` is non-decreasing: parameter
    # j moves down by the words owned by parameters before it; word r lands after its owner and
    # the r words before it.
    ppos = np.arange(n) + np.searchsorted(o, np.arange(n), side="left")
    wpos = o + 1 + np.arange(m)
    for c, w in words.items():
        out = np.empty(n + m, P[c])
        out[ppos] = cols[c]
        out[wpos] = w
        cols[c] = out
    take = np.empty(n + m, np.int64)
    take[ppos] = np.arange(n)
    take[wpos] = -1
    cols["hex"] = cols["hex"].take(pa.array(take, mask=take < 0))
    return cols


# ------------------------------------------------------------------ column parts -> frames
class Columns:
    """Appends parts, in file order, into one preallocated numpy array per numeric column.

    The arrays are reserved for the whole file from the first chunk's rows per byte (+25 %); pages
    never written are never resident, so over-reserving costs address space, not memory, and each
    part is copied once and freed at once (no end-of-load concatenation holding everything twice).
    An underestimate (a file whose tail is denser) grows the arrays by half again.
    String columns stay arrow chunks: dictionary-encoded (categories) or plain (`hex`).
    """

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = dtypes
        self.num = {c: np.dtype(d) for c, d in dtypes.items()
                    if d not in ("category", "string[pyarrow]")}
        self.arrs: dict[str, np.ndarray] = {}
        self.strs: dict[str, list] = {c: [] for c in dtypes if c not in self.num}
        self.n = self.cap = 0

    def reserve(self, rows: float) -> None:
        cap = int(rows * 1.25) + 4096
        if cap <= self.cap:
            return
        for c, dt in self.num.items():
            new = np.empty(cap, dt)
            if self.n:
                new[:self.n] = self.arrs[c][:self.n]
            self.arrs[c] = new
        self.cap = cap

    def append(self, part: dict) -> None:
        m = len(part["seq"])
        if self.n + m > self.cap:
            self.reserve(max(self.n + m, self.cap * 1.5) / 1.25)
        for c, arr in self.arrs.items():
            arr[self.n:self.n + m] = part.pop(c)
        for c, chunks in self.strs.items():
            chunks.append(part.pop(c))
        self.n += m

    def frame(self) -> pd.DataFrame:
        cols: dict[str, object] = {}
        for c, dtype in self.dtypes.items():
            if c in self.num:
                cols[c] = self.arrs[c][:self.n]
            elif dtype == "category":   # dictionary chunks -> one pandas Categorical
                codes = pa.chunked_array(self.strs[c]).unify_dictionaries()
                cols[c] = pd.Categorical(codes.to_pandas())
            else:
                cols[c] = pd.array(pa.chunked_array(self.strs[c], pa.string()), dtype=dtype)
        self.arrs, self.strs = {}, {}
        return pd.DataFrame(cols, copy=False)
