"""The snapshot knob (capture/src/snapshot.c) from mc_callback() down, on CPU.

tests/helpers/harness_dispatch.c (mode `snapshot`) plays the driver: device memory is a host array
holding a pattern of its offset, cuMemcpyDtoH reads it, and cuCtxSynchronize "completes" the
launches made so far by writing their count into the first allocation's first 8 bytes (so bytes
read before the synchronization would show an older count). The host makes device allocations
(two freed or unmapped again, a failed one, a host one), then launches; the tests check what the
snapshot holds against that: exactly the live device allocations, each file byte for byte, the
budget's largest-first skips, when it is taken (the seq trigger, SIGUSR2, never inside a stream
capture -- the library's own or one only the driver knows of), and that every failure leaves the
host's launches recorded and capture on, with one line on stderr.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import dispatch_harness as H
from capture import knobs
from mining.load import load_dump
from mining.snapshot import read_snapshot
from paths import ROOT

DEV_LO = 0x7D0000000000


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return H.build_dispatch_harness(tmp_path_factory.mktemp("snapshot"))


def _run(harness: Path, out: Path, *knobs_: str, form: str = "json", n: int = 30):
    r = subprocess.run([str(harness), "snapshot", str(out), form, str(n), *knobs_], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    allocs = [x["alloc"] for x in lines if "alloc" in x]
    (done,) = [x["done"] for x in lines if "done" in x]
    (pid_dir,) = out.glob("pid*")
    return r, allocs, done, pid_dir


def _records(pid_dir: Path) -> tuple[list[dict], dict]:
    recs = H.read_jsonl(pid_dir / "snapshot.jsonl")
    ends = [r for r in recs if r["event"] == "end"]
    assert len(ends) == 1 and recs[-1] is ends[0]
    return [r for r in recs if r["event"] == "region"], ends[0]


def _want(base: int, size: int, synced: int) -> bytes:
    o = np.arange(base - DEV_LO, base - DEV_LO + size, dtype=np.uint64)
    data = bytearray(((o * 7) ^ (o >> 8) ^ (o >> 16)).astype(np.uint8).tobytes())
    if base == DEV_LO:
        data[:8] = synced.to_bytes(8, "little")
    return bytes(data)


def _live(allocs: list[dict]) -> dict[int, int]:
    return {int(a["base"], 16): a["size"] for a in allocs if a["live"]}


def _check_complete(allocs, done, pid_dir, skipped=()):
    regions, end = _records(pid_dir)
    live = _live(allocs)
    assert [int(r["base"], 16) for r in regions] == sorted(live)          # every live one, no other
    for r in regions:
        base = int(r["base"], 16)
        assert r["size"] == live[base] and r["seq_before"] == done["synced_at"] == end["seq_before"]
        if base in skipped:
            assert r["status"] == "skipped" and r["file"] is None and "SNAPSHOT_BYTES" in r["reason"]
        else:
            assert r["status"] == "ok" and r["file"] == f"snapshot/{base:x}.bin"
            assert (pid_dir / r["file"]).read_bytes() == _want(base, r["size"], done["synced_at"]), hex(base)
    assert end["status"] == "ok" and end["regions"] == len(live) and end["skipped"] == len(skipped)
    assert end["bytes"] == sum(s for b, s in live.items() if b not in skipped)
    assert not list((pid_dir / "snapshot").glob("*.tmp"))
    return regions, end


@pytest.mark.parametrize("form", ["json", "bin"])
def test_the_seq_trigger_copies_every_live_allocation_after_synchronizing(harness, tmp_path, form):
    r, allocs, done, pid_dir = _run(harness, tmp_path, "snapshot_at=7", form=form)
    assert r.stderr == "" and done["off"] == 0
    assert done["synced_at"] == 7 and done["sync_calls"] == 1 and done["sync_capturing"] == 0
    _check_complete(allocs, done, pid_dir)
    # the launch records the snapshot follows are in the dump: seq_before 7 = launches 0..6 done
    d = load_dump(pid_dir, cache=False)
    assert len(d.launches) == done["launches_made"] == 30
    meta = json.loads((pid_dir / "meta.json").read_text())
    assert meta["options"]["snapshot_at"] == 7 and meta["options"]["alloc_log"] == 1
    assert "disabled" not in meta


def test_sigusr2_triggers_it_at_the_next_launch(harness, tmp_path):
    r, allocs, done, pid_dir = _run(harness, tmp_path, "snapshot_signal", "signal_at=11")
    assert r.stderr == "" and done["synced_at"] == 12 and done["sync_calls"] == 1
    _check_complete(allocs, done, pid_dir)
    # armed by the signal knob alone: no signal, no snapshot (and the host's signal is caught, not fatal)
    r, _, done, pid_dir = _run(harness, tmp_path / "none", "snapshot_signal")
    assert r.stderr == "" and done["sync_calls"] == 0 and not (pid_dir / "snapshot.jsonl").exists()


def test_never_inside_a_stream_capture(harness, tmp_path):
    """A capture the library saw begin (launches on its stream and on another one: neither may
    synchronize), and one only the driver reports for the launch's stream: the snapshot waits for
    the first launch after each."""
    r, allocs, done, pid_dir = _run(harness, tmp_path / "seen", "snapshot_at=5", "capture=3:6")
    assert r.stderr == "" and done["sync_capturing"] == 0 and done["synced_at"] == 10
    _, end = _check_complete(allocs, done, pid_dir)
    assert end["deferred"] == 5
    r, allocs, done, pid_dir = _run(harness, tmp_path / "hidden", "snapshot_at=5", "hidden=2:8")
    assert r.stderr == "" and done["sync_capturing"] == 0 and done["synced_at"] == 11
    _check_complete(allocs, done, pid_dir)


def test_the_budget_skips_the_largest_first(harness, tmp_path):
    r, allocs, done, pid_dir = _run(harness, tmp_path / "a", "snapshot_at=2", "snapshot_bytes=11000000")
    live = _live(allocs)
    order = sorted(live, key=lambda b: -live[b])
    total, skipped = sum(live.values()), set()
    for b in order:
        if total > 11_000_000:
            skipped.add(b)
            total -= live[b]
    assert DEV_LO + 0x1000000 in skipped and len(skipped) == 2       # the "KV pool", then the 9 MB one
    assert r.stderr == ""
    _check_complete(allocs, done, pid_dir, skipped)
    r, allocs, done, pid_dir = _run(harness, tmp_path / "b", "snapshot_at=2", "snapshot_bytes=0")
    _check_complete(allocs, done, pid_dir, set(_live(allocs)))


def test_the_reader_gives_the_bytes_of_a_covered_range(harness, tmp_path):
    _, allocs, done, pid_dir = _run(harness, tmp_path, "snapshot_at=3", "snapshot_bytes=11000000")
    warnings: list[str] = []
    snap = read_snapshot(pid_dir, warnings)
    assert warnings == [] and snap.status == "ok" and snap.seq_before == 3
    assert load_dump(pid_dir, cache=False).snapshot.regions == snap.regions
    base = DEV_LO + 0xD00000
    assert snap.read(base + 100, 5000) == _want(base, 2 << 20, 3)[100:5100]
    assert snap.read(DEV_LO + 6, 4) == _want(DEV_LO, 64 << 10, 3)[6:10]
    assert snap.covers(DEV_LO, 64 << 10) and not snap.covers(DEV_LO, (64 << 10) + 1)
    assert snap.read(DEV_LO + 0x1000000, 16) is None                     # skipped (the budget)
    assert snap.read(DEV_LO + 0xB00000, 16) is None                      # freed before it
    assert [r.status for r in snap.regions].count("skipped") == 2
    # a region file that went missing or was cut is no longer a source of bytes, said once
    (pid_dir / f"snapshot/{base:x}.bin").write_bytes(b"\0" * 10)
    warnings = []
    snap = read_snapshot(pid_dir, warnings)
    assert snap.read(base, 16) is None and len(warnings) == 1 and f"{base:x}.bin" in warnings[0]


@pytest.mark.parametrize("knob,status,say", [
    ("dtoh_fail=3", "partial", "1 of 4 allocations could not be copied"),
    ("sync_fail", "failed", "cuCtxSynchronize failed with code"),
    ("block_dir", "failed", "snapshot/ is not a folder"),
])
def test_a_failure_turns_only_the_snapshot_off(harness, tmp_path, knob, status, say):
    r, allocs, done, pid_dir = _run(harness, tmp_path, "snapshot_at=4", knob)
    err = r.stderr.splitlines()
    assert len(err) == 1 and say in err[0] and "[mine-capture] snapshot" in err[0], err
    assert done["off"] == 0
    meta = json.loads((pid_dir / "meta.json").read_text())
    assert "disabled" not in meta and meta["counters"]["launches_recorded"] == 30
    assert len(load_dump(pid_dir, cache=False).launches) == 30
    if knob == "block_dir":
        assert not (pid_dir / "snapshot").is_dir()
        return
    regions, end = _records(pid_dir)
    assert end["status"] == status
    if status == "failed":
        assert regions == [] and say in end["reason"]
        return
    (bad,) = [x for x in regions if x["status"] == "failed"]
    assert bad["file"] is None and "cuMemcpyDtoH failed with code 1" in bad["reason"]
    assert not list((pid_dir / "snapshot").glob("*.tmp")) and not (pid_dir / f"snapshot/{bad['base'][2:]}.bin").exists()
    for x in regions:
        if x["status"] == "ok":
            assert (pid_dir / x["file"]).read_bytes() == _want(int(x["base"], 16), x["size"], done["synced_at"])
    snap = read_snapshot(pid_dir, [])
    assert snap.status == "partial" and snap.read(int(bad["base"], 16), 8) is None


def test_off_by_default(harness, tmp_path):
    r, _, done, pid_dir = _run(harness, tmp_path)
    assert r.stderr == "" and done["sync_calls"] == 0 and done["dtoh_calls"] == 0
    assert not (pid_dir / "snapshot.jsonl").exists() and not (pid_dir / "snapshot").exists()
    meta = json.loads((pid_dir / "meta.json").read_text())
    assert "snapshot_at" not in meta["options"] and load_dump(pid_dir, cache=False).snapshot is None


def test_knobs_and_docs_name_every_key(harness, tmp_path):
    """The knobs are declared in capture/knobs.py (as init.c reads them), and every key of
    snapshot.jsonl and of meta.json's options the snapshot adds is in docs/dump-format.md."""
    for env in ("MINE_CAPTURE_SNAPSHOT_AT", "MINE_CAPTURE_SNAPSHOT_SIGNAL", "MINE_CAPTURE_SNAPSHOT_BYTES"):
        assert env in knobs.BY_ENV
    assert knobs.BY_ENV["MINE_CAPTURE_SNAPSHOT_BYTES"].default == str(8 << 30)
    doc = (ROOT / "docs" / "dump-format.md").read_text()
    section = re.search(r"^## Snapshot\b.*?(?=^## )", doc, re.S | re.M).group(0)
    words = {w for span in re.findall(r"`([^`]+)`", section) for w in re.findall(r"\w+", span)}
    _, _, _, pid_dir = _run(harness, tmp_path / "a", "snapshot_at=2", "snapshot_bytes=11000000", "dtoh_fail=2")
    keys = {k for r in H.read_jsonl(pid_dir / "snapshot.jsonl") for k in r}
    assert keys - words == set()
    meta_section = re.search(r"^## meta.json\b.*?(?=^## )", doc, re.S | re.M).group(0)
    assert all(k in meta_section for k in ("snapshot_at", "snapshot_signal", "snapshot_bytes"))
    assert "cuCtxSynchronize_v2" in doc and "cuMemcpyDtoH_v2" in doc and "`unlink`" in doc


def test_pack_fixture_leaves_the_snapshot_out(harness, tmp_path):
    """A committed fixture never carries a snapshot's bytes (they are a checkpoint's weights)."""
    import tarfile

    from capture.pack_fixture import pack

    _, _, _, pid_dir = _run(harness, tmp_path / "d", "snapshot_at=2")
    pack(pid_dir.parent, tmp_path / "f.tar.xz", 100, 1000)
    with tarfile.open(tmp_path / "f.tar.xz") as tar:
        names = tar.getnames()
    assert any(n.endswith("launches.jsonl") for n in names) and not [n for n in names if "snapshot" in n]


def test_pack_fixture_keeps_the_snapshot_within_its_budget(harness, tmp_path):
    """Asked for (a seeded checkpoint's weights are nobody's), the snapshot travels in address
    order up to the budget; a region past it reads as skipped, never as a lost file."""
    import tarfile

    from capture.pack_fixture import pack

    _, allocs, done, pid_dir = _run(harness, tmp_path / "d", "snapshot_at=3", "snapshot_bytes=11000000")
    ok = [r for r in read_snapshot(pid_dir, []).regions if r.status == "ok"]
    budget = sum(r.size for r in ok[:2])
    got = pack(pid_dir.parent, tmp_path / "f.tar.xz", 100, 1000, snapshot_bytes=budget)
    assert got["snapshot_bytes"] == budget
    with tarfile.open(tmp_path / "f.tar.xz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    warnings: list[str] = []
    snap = read_snapshot(tmp_path / "x" / pid_dir.name, warnings)
    assert warnings == []
    kept = [r for r in snap.regions if r.status == "ok"]
    assert [r.base for r in kept] == [r.base for r in ok[:2]]
    assert all(r.status == "skipped" and "not packed" in r.reason for r in snap.regions if r.base in
               {x.base for x in ok[2:]})
    assert snap.read(ok[0].base, 64) == read_snapshot(pid_dir, []).read(ok[0].base, 64)
