"""Loading dumps: every accepted path form, compression, cache, and damaged input."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil

import pytest

from dumpsim import SimConfig, simulate
from mining.load import DumpError, hex_le_u64, hex_num_u64, load_dump
import pyarrow as pa


@pytest.fixture(scope="module")
def dump_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("dump")
    simulate(root, SimConfig(prompts=(34,), decode_steps=2))
    return root


def fresh(dump_root, tmp_path):
    shutil.copytree(dump_root, tmp_path / "d")
    return tmp_path / "d" / "pid4242"


def test_folder_picks_the_pid_with_most_launches(dump_root):
    d = load_dump(dump_root, cache=False)
    assert d.pid == 4242 and d.launches["seq"].is_monotonic_increasing
    small = load_dump(dump_root, pid=4300, cache=False)
    assert len(small.launches) == 3
    with pytest.raises(DumpError, match="no launches for pid 1"):
        load_dump(dump_root, pid=1)


def test_frames_and_dtypes(dump_root):
    d = load_dump(dump_root / "pid4242", cache=False)
    L, P = d.launches, d.params
    assert str(L["symbol"].dtype) == "category" and str(L["grid_x"].dtype) == "int32"
    assert (L["n_params"].sum() == (~P["word"]).sum())
    words = P[P["word"]]
    assert len(words) and (words["at"] == 8).all() and words["is_ptr"].all()
    ptr = P[P["is_ptr"] & ~P["word"]].iloc[0]
    assert int(ptr["value"]) == int(ptr["alloc_base"]) + int(ptr["ptr_off"])
    assert d.modules["cubin_present"].all()


def test_hex_decoding():
    assert hex_le_u64(pa.array(["0100000000000000", "ff", None, "0001"])).tolist() == [1, 255, 0, 256]
    assert hex_num_u64(pa.array(["0x7f0000000010", "0x0"])).tolist() == [0x7F0000000010, 0]


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".xz", lzma.open)])
def test_compressed_and_bare_file(dump_root, tmp_path, suffix, opener):
    pid = fresh(dump_root, tmp_path)
    raw = (pid / "launches.jsonl").read_bytes()
    (pid / "launches.jsonl").unlink()
    with opener(pid / f"launches.jsonl{suffix}", "wb") as fh:
        fh.write(raw)
    d = load_dump(pid / f"launches.jsonl{suffix}")
    assert len(d.launches) == raw.count(b"\n")


def test_cache_is_used_and_invalidated(dump_root, tmp_path, monkeypatch):
    pid = fresh(dump_root, tmp_path)
    monkeypatch.setenv("MINE_CACHE_DIR", str(tmp_path / "cache"))
    listing = sorted(pid.iterdir())
    first = load_dump(pid)
    assert list((tmp_path / "cache" / "frames").glob("pid*/*.parquet"))
    assert sorted(pid.iterdir()) == listing   # nothing beside the dump
    again = load_dump(pid)
    assert again.launches.equals(first.launches)
    with open(pid / "launches.jsonl", "ab") as fh:
        fh.write(b"{garbage\n")
    third = load_dump(pid)
    assert any("unparsable" in w for w in third.warnings) and len(third.launches) == len(first.launches)


def test_truncated_last_line_and_garbage(dump_root, tmp_path):
    pid = fresh(dump_root, tmp_path)
    lines = (pid / "launches.jsonl").read_bytes().splitlines(keepends=True)
    body = lines[:10] + [b"not json at all\n", b'{"seq": "x"}\n'] + lines[10:-1] + [lines[-1][:40]]
    (pid / "launches.jsonl").write_bytes(b"".join(body))
    d = load_dump(pid, cache=False)
    assert len(d.launches) == len(lines) - 1
    assert any("truncated" in w for w in d.warnings) and any("2 unparsable" in w for w in d.warnings)


def test_empty_and_missing(tmp_path):
    (tmp_path / "launches.jsonl").write_bytes(b"")
    with pytest.raises(DumpError, match="no launch records"):
        load_dump(tmp_path / "launches.jsonl")
    with pytest.raises(DumpError, match="no such file"):
        load_dump(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    with pytest.raises(DumpError, match="neither a launches.jsonl"):
        load_dump(tmp_path / "x")


def test_meta_is_checked_strictly(dump_root, tmp_path):
    pid = fresh(dump_root, tmp_path)
    meta = json.loads((pid / "meta.json").read_text())
    (pid / "meta.json").write_text(json.dumps({**meta, "format_version": 2}))
    with pytest.raises(DumpError, match="format_version 2"):
        load_dump(pid)
    (pid / "meta.json").write_text(json.dumps({**meta, "surprise": 1}))
    with pytest.raises(DumpError, match="unknown top-level keys"):
        load_dump(pid)


def test_missing_cubins_are_reported(dump_root, tmp_path):
    pid = fresh(dump_root, tmp_path)
    for c in list((pid / "cubins").iterdir())[:2]:
        c.unlink()
    d = load_dump(pid, cache=False)
    assert (~d.modules["cubin_present"]).sum() == 2
    assert any("2 module(s) have no cubin" in w for w in d.warnings)
