"""The chunked, column-wise loader against a plain per-record reference (same frames, any chunking).

The reference below reads each line with json.loads and builds the frames row by row, following
docs/dump-format.md and the column contract in mining/schema.py; it is slow and obviously right.
Frames must match it exactly (values, dtypes, category order, row order) however the file is cut
into chunks, compressed or cached. Timing is measured in benchmarks/bench_load.py, not here.
"""

from __future__ import annotations

import gzip
import json
import lzma
import shutil

import pandas as pd
import pyarrow as pa
import pytest

from dumpsim import SimConfig, simulate
from mining import load, schema
from mining.load import load_dump


def _le(h: str | None) -> int:
    return int.from_bytes(bytes.fromhex((h or "")[:16].ljust(16, "0")), "little")


def reference(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    launches, params = [], []
    for line in open(path, "rb").read().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict) or not isinstance(r.get("seq"), int) \
                or not isinstance(r.get("symbol"), str):
            continue   # what the loader drops as unparsable
        grid, block = r.get("grid") or [1, 1, 1], r.get("block") or [1, 1, 1]
        row = {k: r.get(k) if r.get(k) is not None else 0
               for k in ("seq", "t_ns", "tid", "dev", "result", "smem")}
        row["module"] = -1 if r.get("module") is None else r["module"]
        row["capture_id"] = ((r.get("graph") or {}).get("capture_id"))
        row["capture_id"] = -1 if row["capture_id"] is None else row["capture_id"]
        row["regs"] = (r.get("attrs") or {}).get("regs") or 0
        for k, ax in enumerate("xyz"):
            row[f"grid_{ax}"], row[f"block_{ax}"] = grid[k], block[k]
        row["n_params"] = len(r.get("params") or [])
        for k in ("stream", "api", "handle", "sha256", "symbol", "name", "layout", "packing"):
            row[k] = r.get(k) or ""
        launches.append(row)
        for p in r.get("params") or []:
            ptrs = p.get("ptrs") or []
            first = [q for q in ptrs if q.get("at", 0) == 0]
            size = p.get("size") or 0
            i = -1 if p.get("i") is None else p["i"]
            base = dict(seq=row["seq"], i=i, off=p.get("off") or 0)
            q = first[-1] if first else None
            params.append({**base, "size": size, "at": 0, "word": False, "value": _le(p.get("hex")),
                           "is_ptr": q is not None,
                           "alloc_base": int(q["base"], 16) if q else 0,
                           "alloc_size": q.get("size", 0) if q else 0,
                           "buffer_id": q.get("id", -1) if q else -1,
                           "ptr_off": q.get("off", 0) if q else 0,
                           "hex": p.get("hex") if size > 8 else None})
            for w in ptrs:
                if w.get("at", 0) == 0:
                    continue
                params.append({**base, "size": 8, "at": w["at"], "word": True,
                               "value": int(w["base"], 16) + w["off"], "is_ptr": True,
                               "alloc_base": int(w["base"], 16), "alloc_size": w["size"],
                               "buffer_id": w["id"], "ptr_off": w["off"], "hex": None})
    L = pd.DataFrame(launches, columns=list(schema.LAUNCH_COLUMNS))
    for c, d in schema.LAUNCH_COLUMNS.items():
        L[c] = pd.Categorical(L[c], categories=list(dict.fromkeys(L[c]))) if d == "category" \
            else L[c].astype(d)
    L = L.sort_values("seq", kind="stable").reset_index(drop=True)
    P = pd.DataFrame(params, columns=list(schema.PARAM_COLUMNS)).astype(schema.PARAM_COLUMNS)
    return L, P


def same(d, ref):
    L, P = ref
    pd.testing.assert_frame_equal(d.launches, L, check_exact=True)
    pd.testing.assert_frame_equal(d.params, P, check_exact=True)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    main, _ = simulate(tmp_path_factory.mktemp("sim"), SimConfig(prompts=(34, 5), decode_steps=3))
    return main


@pytest.mark.parametrize("chunk", [None, 100, 5000, 1 << 16])
def test_matches_reference_for_any_chunking(sim, monkeypatch, chunk):
    if chunk:
        monkeypatch.setattr(load, "CHUNK", chunk)   # 100 B: every line spans chunks
    same(load_dump(sim, cache=False), reference(sim / "launches.jsonl"))


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst"])
def test_compressed_streams_match(sim, tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(load, "CHUNK", 7000)
    raw = (sim / "launches.jsonl").read_bytes()
    f = tmp_path / f"launches.jsonl{suffix}"
    if suffix == ".zst":
        with pa.CompressedOutputStream(str(f), "zstd") as fh:
            fh.write(raw)
    else:
        with (gzip.open if suffix == ".gz" else lzma.open)(f, "wb") as fh:
            fh.write(raw)
    same(load_dump(f, cache=False), reference(sim / "launches.jsonl"))


def test_cache_round_trip_is_exact(sim, tmp_path):
    shutil.copytree(sim, tmp_path / "d")
    cold = load_dump(tmp_path / "d")
    warm = load_dump(tmp_path / "d")
    for part in ("launches", "params", "modules"):
        pd.testing.assert_frame_equal(getattr(warm, part), getattr(cold, part), check_exact=True)
    same(warm, reference(sim / "launches.jsonl"))


def test_odd_records_and_damage(tmp_path, monkeypatch):
    """Nulls, missing keys, several inner words, out-of-order seqs, garbage, a truncated tail."""
    recs = [
        {"seq": 2, "t_ns": 5, "symbol": "b", "graph": {"graph": "0x1", "capture_id": 9},
         "module": None, "sha256": None, "grid": [4, 2, 1], "attrs": {"regs": 40},
         "params": [{"i": 0, "off": 0, "size": 32, "hex": "11" * 32,
                     "ptrs": [{"at": 0, "base": "0x7f00", "size": 64, "id": 3, "off": 4},
                              {"at": 8, "base": "0x7f00", "size": 64, "id": 3, "off": 8},
                              {"at": 24, "base": "0x9000", "size": 16, "id": 4, "off": 0}]},
                    {"i": 1, "off": 32, "size": 2, "hex": "0100"}]},
        {"seq": 1, "t_ns": 3, "symbol": "a", "graph": None, "layout": "none", "params": [],
         "ctx": 12, "launch_attrs": "ignored keys are not type-checked"},
        {"seq": 3, "symbol": "a", "params": [{"i": 0, "off": 0, "size": 8}], "extra": [1]},
    ]
    lines = [json.dumps(r).encode() for r in recs]
    body = [lines[0], b"not json", lines[1], b'{"seq": "x", "symbol": 1}', lines[2], lines[2][:30]]
    f = tmp_path / "launches.jsonl"
    f.write_bytes(b"\n".join(body))
    for chunk in (load.CHUNK, 64):
        monkeypatch.setattr(load, "CHUNK", chunk)
        d = load_dump(f, cache=False)
        same(d, reference(f))
        assert list(d.launches["seq"]) == [1, 2, 3]
        bad = [int(w.split()[1]) for w in d.warnings if "unparsable" in w]  # one note per chunk
        assert sum(bad) == 2 and "dropped a truncated last line (30 bytes)" in d.warnings
    words = d.params[d.params["word"]]
    assert list(words["at"]) == [8, 24] and list(d.params["i"]) == [0, 0, 0, 1, 0]


def test_nul_bytes_follow_the_reader_rule(sim, tmp_path, monkeypatch):
    """What the mmap writer leaves after a kill (docs/dump-format.md "Writers"): NUL padding after
    the last record, a reserved record never written (NULs + newline), a record cut short by NULs,
    and a NUL run glued in front of a whole record. Every whole record is kept, the three in-flight
    ones are counted, the padding is not a record, and a file without NULs reads as before."""
    lines = (sim / "launches.jsonl").read_bytes().splitlines(keepends=True)
    n = len(lines)
    damaged = (b"".join(lines[:5])
               + b"\0" * 300 + b"\n"                          # reserved, never written
               + lines[5][:40] + b"\0" * 50 + b"\n"          # cut short: record 5 is lost
               + b"\0" * 17 + lines[6]                        # NULs glued in front of record 6
               + b"".join(lines[7:]) + b"\0" * 200_000)      # preallocated tail
    f = tmp_path / "launches.jsonl"
    f.write_bytes(damaged)
    clean = tmp_path / "clean" / "launches.jsonl"
    clean.parent.mkdir()
    clean.write_bytes(b"".join(lines[:5] + lines[6:]))      # what survives: all but record 5
    for chunk in (load.CHUNK, 4096, 100):    # 100 B: the NUL runs and records span chunks
        monkeypatch.setattr(load, "CHUNK", chunk)
        d = load_dump(f, cache=False)
        same(d, reference(clean))
        assert len(d.launches) == n - 1
        lost = [int(w.split()[1]) for w in d.warnings if "lost to NUL bytes" in w]
        assert sum(lost) == 3, d.warnings
        assert not [w for w in d.warnings if "truncated" in w or "unparsable" in w], d.warnings
    # a record cut short by the padding (no newline of its own) is lost and counted too
    f.write_bytes(b"".join(lines[:-1]) + lines[-1][:25] + b"\0" * 1000)
    d = load_dump(f, cache=False)
    assert len(d.launches) == n - 1
    assert d.warnings == ["dropped 1 record(s) lost to NUL bytes (a writer died mid-record)"]
    # the fast path is untouched: no NUL, no NUL warning
    assert not [w for w in load_dump(sim, cache=False).warnings if "NUL" in w]
