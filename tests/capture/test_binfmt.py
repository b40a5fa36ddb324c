"""Binary launch records (launches.bin, docs/dump-format.md "Binary launch records"): the reader.

Records are made by an independent encoder written from the contract (tests/helpers/binenc.py). Checked:
the scanner and header decoding; parameter hex from a params image and from an `extra` buffer
(out-of-range parameters "", flags bit 2 all ""); host sections attached to the parameter holding
them; launch attributes as capture/src/record.c names them; damage (a zeroed header in the middle,
a NUL tail, a truncated last record); `load_dump` on a binary folder giving exactly the frames of
its compact JSON twin (written from `decode_records`, which is itself checked against the truth);
the `python -m vocab.binfmt` CLI's refusals.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from binenc import image, pad8, record, write_functions, write_meta
from vocab import binfmt
from mining import load
from mining.load import load_dump
from paths import ROOT

LAY = [[0, 0, 8], [1, 8, 4], [2, 16, 24]]


def _folder(tmp: Path, fns: list[dict], recs: list[bytes], tail: bytes = b"") -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "launches.bin").write_bytes(b"".join(recs) + tail)
    write_functions(tmp, fns)
    write_meta(tmp)
    (tmp / "allocs.jsonl").write_text("")
    (tmp / "modules.jsonl").write_text("")
    return tmp


def _vals():
    return [(0x7F0012345678).to_bytes(8, "little"), b"\x01\x02\x03\x04", bytes(range(24))]


def test_scan_and_headers():
    recs = [record(0, t_ns=5, tid=9, dev=-1, ctx=0xABC, stream=0x2, fn=1, result=-3, grid=(4, 5, 6),
                   block=(32, 2, 1), smem=4096, api="cuLaunchKernelEx_ptsz", graph=0x77, capture_id=12,
                   attrs=[(8, struct.pack("<i", 1))], blob=b"\x01" * 13),
            record(1, t_ns=2**63 + 1, fn=0, extra=True, nobytes=True),
            record(2, api="cuLaunchCooperativeKernel_ptsz", host=[(0, 0x1000, b"xyz")], blob=bytes(8))]
    data = b"".join(recs)
    offs, damaged = binfmt.scan(data)
    assert damaged == 0
    assert offs.dtype == np.int64 and offs.tolist() == [0, len(recs[0]), len(recs[0]) + len(recs[1])]
    h = binfmt.headers(data, offs)
    assert h["seq"].tolist() == [0, 1, 2] and h["t_ns"].tolist() == [5, 2**63 + 1, 0]
    assert h["tid"].tolist() == [9, 7, 7] and h["dev"].tolist() == [-1, 0, 0]
    assert h["ctx"][0] == 0xABC and h["stream"][0] == 2 and h["fn"].tolist() == [1, 0, 0]
    assert h["graph"].tolist() == [0x77, 0, 0] and h["capture_id"].tolist() == [12, 0, 0]
    assert h["result"].tolist() == [-3, 0, 0] and h["smem"].tolist() == [4096, 0, 0]
    assert h["grid"][0].tolist() == [4, 5, 6] and h["block"][0].tolist() == [32, 2, 1]
    assert h["grid"].shape == h["block"].shape == (3, 3)
    assert [binfmt.API_NAMES[a] for a in h["api"]] == ["cuLaunchKernelEx_ptsz", "cuLaunchKernel",
                                                        "cuLaunchCooperativeKernel_ptsz"]
    assert h["flags"].tolist() == [1, 6, 0] and h["nattrs"].tolist() == [1, 0, 0]
    assert h["nhost"].tolist() == [0, 0, 1] and h["blob_len"].tolist() == [13, 0, 8]
    assert (h["blob"] - offs).tolist() == [112 + 72, 112, 112]
    assert binfmt.scan(b"")[0].tolist() == [] and binfmt.scan(bytes(4096))[1] == 0
    s = binfmt.scan(data)
    assert s.offsets.tolist() == offs.tolist() and s.damaged == 0 and s.seq.tolist() == [0, 1, 2]


def test_params_packing_extra_and_no_bytes(tmp_path):
    v = _vals()
    img = image(LAY, v)
    assert len(img) == 40
    fns = [{"layout": "kernel", "params_layout": LAY}, {"layout": "none", "params_layout": []}]
    recs = [record(0, blob=img),                                       # params: the image
            record(1, extra=True, blob=img[:20]),                      # extra cut short: param 2 out
            record(2, nobytes=True),                                   # no bytes: every hex ""
            record(3, extra=True, nobytes=True),                       # extra without a buffer
            record(4, fn=1, extra=True, blob=b"\xaa\xbb\xcc"),         # layout none: extra_hex
            record(5, fn=1, blob=b""),                                 # layout none, params: nothing
            record(6, fn=1, extra=True, nobytes=True)]                 # none + no buffer: no extra_hex
    out = binfmt.decode_records(_folder(tmp_path, fns, recs))
    hexes = [x.hex() for x in v]
    assert [p["hex"] for p in out[0]["params"]] == hexes and out[0]["packing"] == "params"
    assert [p["hex"] for p in out[1]["params"]] == hexes[:2] + [""] and out[1]["packing"] == "extra"
    assert [p["hex"] for p in out[2]["params"]] == ["", "", ""] and out[2]["packing"] == "params"
    assert [p["hex"] for p in out[3]["params"]] == ["", "", ""] and out[3]["packing"] == "extra"
    assert out[4]["params"] == [] and out[4]["extra_hex"] == "aabbcc"
    assert out[5]["params"] == [] and "extra_hex" not in out[5]
    assert "extra_hex" not in out[6]
    assert all(list(p) == ["i", "hex"] for r in out for p in r["params"])


def test_host_sections_map_to_their_parameter(tmp_path):
    v = _vals()
    recs = [record(0, blob=image(LAY, v), host=[(0, 0x7FFF0000, b"\x01\x02\x03"),
                                                (24, 0x7FFF1000, bytes(range(64))),
                                                (16, 0x7FFF2000, b"")])]
    out = binfmt.decode_records(_folder(tmp_path, [{"layout": "kernel", "params_layout": LAY}], recs))
    p = out[0]["params"]
    assert p[0]["host"] == [{"at": 0, "addr": "0x7fff0000", "hex": "010203"}]
    assert "host" not in p[1]
    assert p[2]["host"] == [{"at": 8, "addr": "0x7fff1000", "hex": bytes(range(64)).hex()},
                            {"at": 0, "addr": "0x7fff2000", "hex": ""}]
    assert list(p[2]) == ["i", "hex", "host"]


def test_launch_attrs(tmp_path):
    attrs = [(4, struct.pack("<3I", 2, 1, 1)), (8, struct.pack("<i", -2)), (99, b"\x01\xff"),
             (11, struct.pack("<3I", 4, 2, 1)), (6, struct.pack("<i", 1)),
             (7, struct.pack("<Qii", 0xE0, 3, 1)), (9, bytes([1, 2])), (10, struct.pack("<i", 1)),
             (12, struct.pack("<Qi", 0xE1, 2)), (14, struct.pack("<I", 50)), (2, struct.pack("<i", 1)),
             (5, struct.pack("<i", 2))]
    recs = [record(0, api="cuLaunchKernelEx", attrs=attrs, blob=image(LAY, _vals())), record(1)]
    out = binfmt.decode_records(_folder(tmp_path, [{"layout": "kernel", "params_layout": LAY}], recs))
    assert out[0]["launch_attrs"] == {
        "cluster": [2, 1, 1], "priority": -2, "attr_99": (b"\x01\xff" + bytes(62)).hex(),
        "preferred_cluster": [4, 2, 1], "pdl": 1,
        "pdl_event": {"event": "0xe0", "flags": 3, "trigger_at_block_start": 1},
        "mem_sync_domain_map": [1, 2], "mem_sync_domain": 1,
        "completion_event": {"event": "0xe1", "flags": 2}, "smem_carveout": 50, "cooperative": 1,
        "cluster_scheduling": 2}
    assert list(out[0]["launch_attrs"])[:3] == ["cluster", "priority", "attr_99"]  # record order
    assert out[1]["launch_attrs"] == {}
    assert [p["hex"] for p in out[0]["params"]] == [x.hex() for x in _vals()]  # blob after attrs


def test_record_keys_and_formatting(tmp_path):
    recs = [record(0, t_ns=1, ctx=0x7F00000000AB, stream=0, graph=0x1234, capture_id=3, fn=0,
                   grid=(2, 1, 1), block=(128, 1, 1), blob=image(LAY, _vals()))]
    r = binfmt.decode_records(_folder(tmp_path, [{"layout": "kernel", "params_layout": LAY}], recs))[0]
    assert list(r) == ["seq", "t_ns", "tid", "dev", "ctx", "stream", "api", "result", "graph", "fn",
                       "grid", "block", "smem", "launch_attrs", "packing", "params"]
    assert r["ctx"] == "0x7f00000000ab" and r["stream"] == "0x0"
    assert r["graph"] == {"graph": "0x1234", "capture_id": 3} and r["api"] == "cuLaunchKernel"


# ---------------------------------------------------------------- damage
def _three(n=6, fn=0):
    return [record(s, t_ns=s, fn=fn, blob=image(LAY, _vals())) for s in range(n)]


def test_zeroed_header_in_the_middle_resyncs():
    recs = _three()
    bad = bytearray(recs[2])
    bad[:8] = bytes(8)
    data = b"".join(recs[:2]) + bytes(bad) + b"".join(recs[3:])
    offs, damaged = binfmt.scan(data)
    h = binfmt.headers(data, offs)
    assert h["seq"].tolist() == [0, 1, 3, 4, 5] and damaged == 1
    assert (offs % 8 == 0).all() and h["blob_len"].tolist() == [40] * 5


def test_headers_inside_blobs_and_stale_headers(tmp_path):
    # a blob holding a well-formed header (8-aligned): the walk steps over it by len; a record
    # whose seq does not continue the sequence (a stale 1 after 3) is skipped, and a resync does
    # not stop at one whose seq is not above the last good record's
    def fake(seq):
        return struct.pack("<IIQ", 112, 0x314C434D, seq) + bytes(104)
    lay = [[0, 0, 8]]
    recs = [record(0, blob=fake(100) + bytes(8)), record(1, blob=bytes(8)),
            record(2, blob=fake(0) + bytes(8)), record(3, blob=bytes(8)), record(1, blob=bytes(8)),
            record(4, blob=bytes(8))]
    data = b"".join(recs)
    offs, damaged = binfmt.scan(data)
    sc = binfmt.scan(data)
    assert binfmt.headers(data, offs)["seq"].tolist() == [0, 1, 2, 3, 4] and damaged == 0
    stale = sum(map(len, recs[:4]))                    # its bytes are skipped, no seq is missing
    assert [s[:2] + (s[3],) for s in sc.skips] == [(stale, stale + len(recs[4]), 0)]
    bad = bytearray(recs[2])
    bad[:8] = bytes(8)                                 # record 2 lost: its blob's fake (seq 0) and the
    data = b"".join(recs[:2]) + bytes(bad) + recs[4] + recs[3] + recs[5]  # stale seq 1 are skipped
    offs, damaged = binfmt.scan(data)
    assert binfmt.headers(data, offs)["seq"].tolist() == [0, 1, 3, 4] and damaged == 1
    folder = _folder(tmp_path, [{"layout": "kernel", "params_layout": lay}], [data])
    assert [r["seq"] for r in binfmt.decode_records(folder)] == [0, 1, 3, 4]


def test_nul_tail_and_truncated_last_record():
    recs = _three()
    data = b"".join(recs) + bytes(8 << 20)          # the mmap writer's preallocated tail
    offs, damaged = binfmt.scan(data)
    assert len(offs) == 6 and damaged == 0
    cut = b"".join(recs)[:-30]                      # the last record cut short
    offs, damaged = binfmt.scan(cut)
    assert len(offs) == 5 and damaged == 1
    inflight = bytearray(recs[-1])                  # header never stored, body copied, then NULs
    inflight[:8] = bytes(8)
    offs, damaged = binfmt.scan(b"".join(recs[:-1]) + bytes(inflight) + bytes(4096))
    assert len(offs) == 5 and damaged == 1


def test_bad_len_and_overrunning_record():
    recs = _three()
    odd = bytearray(recs[1])
    odd[:4] = struct.pack("<I", 150)                # len not a multiple of 8: damaged, resync
    over = bytearray(recs[3])
    over[104:108] = struct.pack("<I", 4000)          # blob_len past the record's len: not a record
    data = recs[0] + bytes(odd) + recs[2] + bytes(over) + recs[4] + recs[5]
    offs, damaged = binfmt.scan(data)
    assert binfmt.headers(data, offs)["seq"].tolist() == [0, 2, 4, 5] and damaged == 2
    big = bytearray(recs[5])
    big[:4] = struct.pack("<I", 1 << 20)             # len past the end of the file
    offs, damaged = binfmt.scan(b"".join(recs[:5]) + bytes(big))
    assert len(offs) == 5 and damaged == 1


def test_damaged_bin_loads_with_one_warning(tmp_path):
    recs = _three(8)
    bad = bytearray(recs[3])
    bad[:8] = bytes(8)
    folder = _folder(tmp_path / "b", [{"layout": "kernel", "params_layout": LAY}],
                     recs[:3] + [bytes(bad)] + recs[4:], tail=bytes(1 << 16))
    d = load_dump(folder, cache=False)
    assert d.launches["seq"].tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert len([w for w in d.warnings if "damaged" in w]) == 1 and len(d.warnings) == 1, d.warnings


# ---------------------------------------------------------------- the loader vs the JSON twin
BASE = 0x7E0000000000


def make_truth(n: int, seed: int = 3):
    """Functions, allocation events, binary records and the compact JSON records they stand for."""
    rng = random.Random(seed)
    fns = []
    for k in range(10):
        sizes = [rng.choice([8, 8, 8, 4, 16, 24, 32]) for _ in range(rng.randint(0, 6))]
        lay, o = [], 0
        for i, s in enumerate(sizes):
            a = min(s, 8)
            o = (o + a - 1) // a * a
            lay.append([i, o, s])
            o += s
        fns.append({"layout": "none" if k == 4 else "kernel", "params_layout": [] if k == 4 else lay,
                    "symbol": f"_Z{k}k", "name": f"k{k}", "module": k, "sha256": f"{k:064x}",
                    "attrs": {"regs": 16 + k}})
    allocs = [{"seq_before": 0, "order": j, "t_ns": 0, "tid": 7, "dev": 0, "event": "alloc",
               "api": "cuMemAlloc_v2", "base": hex(BASE + (j << 24)), "size": 1 << 24, "id": j + 1,
               "result": 0} for j in range(4)]
    allocs.append({"seq_before": n // 2, "order": 4, "t_ns": 0, "tid": 7, "dev": 0, "event": "free",
                   "api": "cuMemFree_v2", "base": hex(BASE), "size": None, "id": None, "result": 0})
    recs, want = [], []
    for seq in range(n):
        k = len(fns) if seq % 50 == 7 else rng.randrange(len(fns))  # now and then a function the file lacks
        lay = fns[k]["params_layout"] if k < len(fns) else []
        words = lambda size: b"".join(  # noqa: E731
            (BASE + rng.randrange(4 << 24) if rng.random() < 0.5 else rng.getrandbits(64)).to_bytes(8, "little")
            for _ in range((size + 7) // 8))[:size]
        vals = [words(s) for _, _, s in lay]
        extra, nobytes = rng.random() < 0.2, rng.random() < 0.05
        blob = image(lay, vals) if lay else bytes(rng.randrange(0, 40))
        if extra and lay and rng.random() < 0.5:
            blob = blob[:rng.randrange(len(blob) + 1)]
        if nobytes:
            blob = b""
        graph = 0x500 + seq % 3 if seq % 4 == 0 else None
        hexes = ["" if nobytes or off + s > len(blob) else blob[off:off + s].hex() for _, off, s in lay]
        host = []
        if rng.random() < 0.3:
            for i, off, s in lay:
                if s >= 8 and hexes[i]:
                    pointee = bytes(rng.randrange(256) for _ in range(rng.randrange(65)))
                    host.append((off + 8 * ((s // 8) - 1), 0x7FFC0000 + seq, pointee))
        attrs = [(4, struct.pack("<3I", 2, 1, 1))] if seq % 9 == 0 else []
        rec = {"seq": seq, "t_ns": 1000 + 3 * seq, "tid": 7 + seq % 2, "dev": seq % 2, "ctx": "0xc0",
               "stream": hex(rng.choice([0, 2, 0x55AA00])),
               "api": rng.choice(["cuLaunchKernel", "cuLaunchKernelEx"]),
               "result": 0 if seq % 11 else 700,
               "graph": {"graph": hex(graph), "capture_id": 9} if graph else None, "fn": k,
               "grid": [rng.randint(1, 99), 1, 2], "block": [128, 1, 1], "smem": 16 * (seq % 3),
               "launch_attrs": {"cluster": [2, 1, 1]} if attrs else {},
               "packing": "extra" if extra else "params",
               "params": [{"i": i, "hex": h} for i, h in enumerate(hexes)]}
        for at, addr, p in host:
            i = next(i for i, off, s in lay if off <= at < off + s)
            rec["params"][i]["host"] = [{"at": at - lay[i][1], "addr": hex(addr), "hex": p.hex()}]
        if k < len(fns) and fns[k]["layout"] == "none" and extra and not nobytes:
            rec["extra_hex"] = blob.hex()
        want.append(rec)
        recs.append(record(seq, t_ns=rec["t_ns"], tid=rec["tid"], dev=rec["dev"], ctx=0xC0,
                           stream=int(rec["stream"], 16), graph=graph, capture_id=9, fn=k,
                           result=rec["result"], grid=rec["grid"], block=rec["block"], smem=rec["smem"],
                           api=rec["api"], extra=extra, nobytes=nobytes, attrs=attrs, blob=blob,
                           host=host))
    return fns, allocs, recs, want


def _twins(tmp_path: Path, n: int):
    fns, allocs, recs, want = make_truth(n)
    b = _folder(tmp_path / "bin", fns, recs)
    (b / "allocs.jsonl").write_text("".join(json.dumps(a) + "\n" for a in allocs))
    got = binfmt.decode_records(b)
    j = tmp_path / "json"
    j.mkdir()
    for name in ("functions.jsonl", "meta.json", "allocs.jsonl", "modules.jsonl"):
        (j / name).write_bytes((b / name).read_bytes())
    (j / "launches.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in got))
    return b, j, got, want


# 500 records are already several tasks of both readers at this CHUNK (binary: chunk / 4 bytes each)
@pytest.mark.parametrize("n", [500, pytest.param(20000, marks=pytest.mark.slow)])
def test_bin_loads_to_the_frames_of_its_json_twin(tmp_path, monkeypatch, n):
    monkeypatch.setattr(load, "CHUNK", 64 << 10)  # many tasks: categories unified across them
    b, j, got, want = _twins(tmp_path, n)
    assert got == want                             # decode_records against the truth
    a = load_dump(j, cache=False)
    c = load_dump(b, cache=False)
    assert c.source.name == "launches.bin" and a.source.name == "launches.jsonl"
    assert a.warnings == c.warnings and len(a.warnings) == 1 and "missing from functions" in a.warnings[0]
    assert a.params["is_ptr"].any() and a.params["word"].any() and (a.params["buffer_id"] == 2).any()
    pd.testing.assert_frame_equal(a.launches, c.launches)
    pd.testing.assert_frame_equal(a.params, c.params)
    c1 = load_dump(b, cache_dir=tmp_path / "cache")  # writes the parquet cache, keyed on launches.bin
    c2 = load_dump(b, cache_dir=tmp_path / "cache")
    assert any(p.name.startswith("launches.bin-") for p in (tmp_path / "cache" / "frames").glob("*/*"))
    for d in (c1, c2):
        pd.testing.assert_frame_equal(a.launches, d.launches)
        pd.testing.assert_frame_equal(a.params, d.params)
        assert d.warnings == a.warnings


def test_compressed_bin_loads_alike(tmp_path):
    import gzip
    b, j, _, _ = _twins(tmp_path, 300)
    z = tmp_path / "gz"
    z.mkdir()
    for f in b.iterdir():
        (z / f.name).write_bytes(f.read_bytes())
    (z / "launches.bin.gz").write_bytes(gzip.compress((z / "launches.bin").read_bytes()))
    (z / "launches.bin").unlink()
    a, c = load_dump(j, cache=False), load_dump(z, cache=False)
    assert c.source.name == "launches.bin.gz"
    pd.testing.assert_frame_equal(a.launches, c.launches)
    pd.testing.assert_frame_equal(a.params, c.params)


def test_bin_without_functions_file_is_refused(tmp_path):
    b, _, _, _ = _twins(tmp_path, 50)
    (b / "functions.jsonl").unlink()
    with pytest.raises(ValueError, match="functions.jsonl"):
        load_dump(b, cache=False)


# ---------------------------------------------------------------- the CLI
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vocab.binfmt", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_rewrites_and_refuses(tmp_path):
    b, j, got, _ = _twins(tmp_path, 300)
    r = _cli(b)
    assert r.returncode == 0, r.stderr
    assert (b / "launches.jsonl").read_bytes() == (j / "launches.jsonl").read_bytes()
    assert load.resolve(b).name == "launches.jsonl"  # both files: launches.jsonl wins
    again = _cli(b)
    assert again.returncode == 2 and again.stdout == "" and len(again.stderr.strip().splitlines()) == 1
    assert "exists" in again.stderr and "Traceback" not in again.stderr
    r = _cli(b, "--out", tmp_path / "other.jsonl")
    assert r.returncode == 0 and (tmp_path / "other.jsonl").read_bytes() == (j / "launches.jsonl").read_bytes()
    for bad in ([tmp_path / "nowhere"], [j], [b, "--bogus"], []):
        r = _cli(*bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
        assert "Traceback" not in r.stderr


def test_pad8_and_image_helpers():
    assert len(pad8(b"abc")) == 8 and image([[0, 4, 4]], [b"\x01\x02\x03\x04"]) == bytes(4) + b"\x01\x02\x03\x04"
