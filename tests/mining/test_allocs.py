"""Offline pointer classification from allocs.jsonl (mining/allocs.py, mining/load.py).

Synthetic dumps are generated from one truth (a timeline of allocations, frees, VMM reservations
and mappings, and launches whose parameter words point at, into, past or near them), in two forms:
launches with the `ptrs` the capture would have recorded (classify on), and launches without
`ptrs` plus the allocation log (MINE_CAPTURE_CLASSIFY=0 MINE_CAPTURE_ALLOC_LOG=1). Both must load
into the same frames. The interval lookup is also checked against brute force on random logs.

`python tests/mining/test_allocs.py bench [N]` measures the load of an N-launch (default 1,000,000)
alloc-log dump built from benchmarks/bench_load.py's records (see docs/benchmarks.md).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mining import allocs as A
from mining.load import load_dump

ROOT = Path(__file__).resolve().parents[2]   # also run as a script (bench), without conftest
B = 0x7F0000000000


class Truth:
    """Replays a timeline; keeps the live device allocations and writes both dump forms."""

    def __init__(self, log_ids: bool = True):
        self.live: dict[int, tuple[int, int]] = {}  # base -> (size, id)
        self.events: list[dict] = []
        self.launches: list[list[bytes]] = []        # per launch: raw bytes of each parameter
        self.next_id = 1
        self.log_ids = log_ids

    def _ev(self, event, api, base=None, size=None, id=None, result=0):
        self.events.append({"seq_before": len(self.launches), "order": len(self.events), "t_ns": 1,
                            "tid": 1, "dev": 0, "event": event, "api": api,
                            "base": None if base is None else hex(base), "size": size,
                            "id": id if self.log_ids else None, "result": result})

    def alloc(self, base, size, api="cuMemAlloc_v2", event="alloc"):
        assert not any(b < base + size and base < b + s for b, (s, _) in self.live.items())
        self.live[base] = (size, self.next_id)
        self._ev(event, api, base, size, self.next_id)
        self.next_id += 1

    def free(self, base, api="cuMemFree_v2", event="free"):
        del self.live[base]
        self._ev(event, api, base)

    def failed_alloc(self, base, size):
        self._ev("alloc", "cuMemAlloc_v2", base, size, None, result=2)

    def reserve(self, base, size):
        self._ev("reserve", "cuMemAddressReserve", base, size)

    def map(self, base, size):
        self._ev("create", "cuMemCreate", None, size)
        self.alloc(base, size, "cuMemMap", "map")
        self._ev("access", "cuMemSetAccess", base, size)

    def unmap(self, base, size):
        for b in [b for b in self.live if base <= b < base + size]:
            del self.live[b]
        self._ev("unmap", "cuMemUnmap", base, size)

    def host(self, base, size):
        self._ev("host_alloc", "cuMemHostAlloc", base, size)

    def launch(self, *params: bytes):
        self.launches.append(list(params))
        self.ptrs_now = getattr(self, "ptrs_now", [])
        self.ptrs_now.append([self._ptrs(p) for p in params])

    def _ptrs(self, raw: bytes) -> list[dict]:
        out = []
        for w in range(len(raw) // 8):
            v = int.from_bytes(raw[8 * w:8 * w + 8], "little")
            if not 0x10000 <= v < 0x800000000000:
                continue
            for b, (s, i) in self.live.items():
                if b <= v < b + s:
                    out.append({"at": 8 * w, "base": hex(b), "size": s, "id": i, "off": v - b})
        return out

    def write(self, folder: Path, form: str, tamper=None) -> Path:
        """form: "ptrs" (classify on), "log" (classify off + allocs.jsonl), "both"."""
        pid = folder / "pid1"
        pid.mkdir(parents=True)
        lines = []
        for seq, (params, ptrs) in enumerate(zip(self.launches, self.ptrs_now)):
            ps, off = [], 0
            for i, (raw, pt) in enumerate(zip(params, ptrs)):
                p = {"i": i, "off": off, "size": len(raw), "hex": raw.hex()}
                if form != "log" and pt:
                    p["ptrs"] = pt
                ps.append(p)
                off += len(raw)
            lines.append(json.dumps({
                "seq": seq, "t_ns": 1000 + seq, "tid": 1, "dev": 0, "ctx": "0x1", "stream": "0x0",
                "api": "cuLaunchKernel", "result": 0, "graph": None, "handle": "function",
                "module": 1, "sha256": "ab" * 32, "symbol": f"k{len(params)}", "name": f"k{len(params)}",
                "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0, "attrs": {"regs": 8},
                "packing": "params", "layout": "kernel", "params": ps}))
        (pid / "launches.jsonl").write_text("\n".join(lines) + "\n")
        opts = {"classify": 0 if form == "log" else 1, "alloc_log": int(form != "ptrs")}
        (pid / "meta.json").write_text(json.dumps({"format_version": 1, "pid": 1, "options": opts}))
        if form != "ptrs":
            ev = [dict(e) for e in self.events]
            if tamper:
                tamper(ev)
            (pid / "allocs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
        return pid


def u64(*vals: int) -> bytes:
    return b"".join(v.to_bytes(8, "little") for v in vals)


def scenario(log_ids: bool = True) -> Truth:
    t = Truth(log_ids)
    t.launch(u64(B), b"\x01\x00\x00\x00")                  # before any allocation: nothing
    t.alloc(B, 4096)
    t.alloc(B + 0x10000, 256)
    t.host(0x5555_0000_0000, 4096)                           # host memory: never a device pointer
    t.failed_alloc(B + 0x20000, 1 << 40)                     # failed: never live
    t.launch(u64(B), u64(B + 100), u64(B + 4096),            # base, inside, one past the end
             u64(B + 0x10000 + 255), u64(0x5555_0000_0010), u64(B + 0x20000),
             u64(7, B + 0x10000 + 8, B + 4095))              # a struct with two inner pointers
    t.free(B)
    t.launch(u64(B), u64(B + 100), u64(B + 0x10000))         # freed range: nothing; the other lives
    t.alloc(B, 8192)                                         # the address reused: a new id
    t.launch(u64(B + 5000), b"\0" * 4, u64(0, 0, B + 8191))
    r = B + 0x100000000
    t.reserve(r, 64 << 20)                                   # VMM: reserve, then map 2 chunks
    t.map(r, 2 << 20)
    t.map(r + (2 << 20), 2 << 20)
    t.launch(u64(r), u64(r + (2 << 20) + 5), u64(r + (4 << 20)), u64(r + (8 << 20)))
    t.unmap(r, 4 << 20)                                      # one unmap of both mappings
    t.launch(u64(r), u64(r + (2 << 20) + 5))
    t.map(r + (2 << 20), 1 << 20)                            # mapped again, smaller
    t.free(B + 0x10000, "cuMemFreeAsync")
    t.alloc(B + 0x10000, 128, "cuMemAllocAsync")
    t.launch(u64(r + (2 << 20) + 5), u64(r + (3 << 20)), u64(B + 0x10000 + 127), u64(B + 0x10000 + 128))
    t.free(B + 0x10000)
    t.alloc(B + 0x10000, 64)                                 # freed and reused with no launch between
    t.launch(u64(B + 0x10000 + 100), u64(B + 0x10000 + 63))
    return t


def _frames(pid: Path):
    d = load_dump(pid, cache=False)
    return d.launches, d.params, d


def test_scenario_offline_equals_recorded(tmp_path):
    t = scenario()
    L1, P1, d1 = _frames(t.write(tmp_path / "a", "ptrs"))
    L2, P2, d2 = _frames(t.write(tmp_path / "b", "log"))
    pd.testing.assert_frame_equal(L1, L2)
    pd.testing.assert_frame_equal(P1, P2)
    assert d1.warnings == d2.warnings == [] and d1.allocs is None and len(d2.allocs) == len(t.events)
    # the truth, spelled out for a few words
    ptr = P2[P2.is_ptr]
    got = {(int(r.seq), int(r.i), int(r.at)): (int(r.alloc_base) - B, int(r.alloc_size), int(r.buffer_id),
                                               int(r.ptr_off)) for r in ptr.itertuples()}
    assert got[(1, 0, 0)] == (0, 4096, 1, 0) and got[(1, 1, 0)] == (0, 4096, 1, 100)
    assert (1, 2, 0) not in got and (1, 4, 0) not in got and (1, 5, 0) not in got  # past end, host, failed
    assert got[(1, 3, 0)] == (0x10000, 256, 2, 255)
    assert got[(1, 6, 8)] == (0x10000, 256, 2, 8) and got[(1, 6, 16)] == (0, 4096, 1, 4095)
    assert (2, 0, 0) not in got and (2, 1, 0) not in got and got[(2, 2, 0)][2] == 2  # freed range
    assert got[(3, 0, 0)] == (0, 8192, 3, 5000) and got[(3, 2, 16)][2] == 3  # reuse: new id
    assert got[(4, 0, 0)][1] == 2 << 20 and got[(4, 1, 0)][3] == 5
    assert (4, 2, 0) not in got and (4, 3, 0) not in got                    # reserved, not mapped
    assert not any(k[0] == 5 for k in got)                                  # unmapped
    assert got[(6, 0, 0)][1] == 1 << 20 and (6, 1, 0) not in got
    assert got[(6, 2, 0)] == (0x10000, 128, 7, 127) and (6, 3, 0) not in got
    assert got[(7, 1, 0)] == (0x10000, 64, 8, 63) and (7, 0, 0) not in got


def test_without_logged_ids_each_allocation_gets_its_own(tmp_path):
    t = scenario(log_ids=False)
    _, P1, _ = _frames(t.write(tmp_path / "a", "ptrs"))
    _, P2, _ = _frames(t.write(tmp_path / "b", "log"))
    cols = [c for c in P1.columns if c != "buffer_id"]
    pd.testing.assert_frame_equal(P1[cols], P2[cols])
    a, b = P1[P1.is_ptr].buffer_id.to_numpy(), P2[P2.is_ptr].buffer_id.to_numpy()
    assert (b >= A.SYNTHETIC_ID).all()
    # the same partition of words into allocations: truth id <-> synthetic id is one to one
    pairs = set(zip(a.tolist(), b.tolist()))
    assert len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_both_forms_consistent_no_warning_and_ptrs_kept(tmp_path):
    t = scenario()
    _, P1, _ = _frames(t.write(tmp_path / "a", "ptrs"))
    _, P3, d3 = _frames(t.write(tmp_path / "c", "both"))
    pd.testing.assert_frame_equal(P1, P3)
    assert d3.warnings == []


def test_disagreement_warns_and_keeps_recorded_ptrs(tmp_path):
    t = scenario()

    def tamper(ev):  # the log "forgets" the first free: the freed range stays live offline
        ev.remove(next(e for e in ev if e["event"] == "free"))

    _, P1, _ = _frames(t.write(tmp_path / "a", "ptrs"))
    _, P4, d4 = _frames(t.write(tmp_path / "d", "both", tamper))
    pd.testing.assert_frame_equal(P1, P4)   # recorded ptrs kept
    (w,) = d4.warnings
    assert "disagrees with the recorded ptrs on 2 word(s)" in w   # launch 2: B and B+100


def test_cache_is_keyed_on_the_log(tmp_path):
    t = scenario()
    pid = t.write(tmp_path / "b", "log")
    first = load_dump(pid).params
    pd.testing.assert_frame_equal(first, load_dump(pid).params)       # from the cache
    (pid / "allocs.jsonl").write_text("")                             # no allocations at all
    assert not load_dump(pid).params.is_ptr.any()


def test_alloc_log_damage_is_tolerated(tmp_path):
    t = scenario()
    pid = t.write(tmp_path / "b", "log")
    good = (pid / "allocs.jsonl").read_bytes()
    (pid / "allocs.jsonl").write_bytes(good + b"\0\0\0not json\n" + b'{"seq_before": 3, "ev')
    d = load_dump(pid, cache=False)
    assert len(d.allocs) == len(t.events) + 0 and any("truncated" in w for w in d.warnings)
    _, P1, _ = _frames(t.write(tmp_path / "a", "ptrs"))
    pd.testing.assert_frame_equal(P1, d.params)


@pytest.mark.parametrize("seed", range(4))
def test_lookup_matches_brute_force(seed):
    """Random churn on a small address grid (reuse, nesting across time, VMM-like multi unmaps)."""
    rng = random.Random(seed)
    ev, live, nseq = [], {}, 0
    for k in range(3000):
        if rng.random() < 0.3:
            nseq += rng.randrange(1, 4)
        if live and rng.random() < 0.45:
            b = rng.choice(sorted(live))
            del live[b]
            ev.append(("free", b, None, nseq))
            continue
        b = B + rng.randrange(64) * 0x1000
        s = rng.choice([0x100, 0x1000, 0x3000, 0x8000])
        if any(x < b + s and b < x + y for x, y in live.items()):
            continue
        live[b] = s
        ev.append(("alloc", b, s, nseq))
    events = pd.DataFrame({
        "seq_before": [e[3] for e in ev], "order": np.arange(len(ev)), "t_ns": 0,
        "event": pd.Categorical([e[0] for e in ev]), "api": pd.Categorical(["x"] * len(ev)),
        "base": np.array([e[1] for e in ev], np.uint64), "has_base": True,
        "size": [e[2] if e[2] else -1 for e in ev], "id": np.arange(len(ev)), "result": 0})
    iv = A.intervals(events)
    n = 4000
    s = np.array([rng.randrange(nseq + 2) for _ in range(n)], np.int64)
    v = np.array([B + rng.randrange(0x48000) for _ in range(n)], np.uint64)
    got = A.lookup(iv, s, v)
    # brute force from the events themselves
    hold: dict[int, list] = {}
    for i, (kind, b, sz, q) in enumerate(ev):
        if kind == "alloc":
            hold.setdefault(b, []).append([q, None, b + sz, i])
        else:
            hold[b][-1][1] = q
    want = np.full(n, -1)
    for j in range(n):
        for b, lst in hold.items():
            for q0, q1, end, i in lst:
                if q0 <= s[j] and (q1 is None or s[j] < q1) and b <= v[j] < end:
                    want[j] = i
    assert (np.where(got >= 0, iv.id[got], -1) == want).all()


# ---------------------------------------------------------------- benchmark (run by hand)
def make_bench_dump(folder: Path, n: int) -> Path:
    """bench_load's n-launch dump, as a MINE_CAPTURE_CLASSIFY=0 capture with an alloc log."""
    import re
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_load

    pid = bench_load.write_dump(folder, n)
    tmp = pid / "launches.tmp"
    drop = re.compile(r',"ptrs":\[[^\]]*\]')
    with open(pid / "launches.jsonl") as fi, open(tmp, "w") as fo:
        for line in fi:
            fo.write(drop.sub("", line))
    tmp.replace(pid / "launches.jsonl")
    (pid / "meta.json").write_text(json.dumps({"format_version": 1, "pid": 1,
                                               "options": {"classify": 0, "alloc_log": 1}}))
    rng = random.Random(2)
    lines = [{"seq_before": 0, "order": 0, "event": "alloc", "api": "cuMemAlloc_v2",
              "base": hex(0x7F0000000000), "size": 1 << 30, "id": 10, "result": 0}]
    churn = 0x7E0000000000   # 100,000 alloc/free pairs elsewhere (a stream-ordered pool's churn)
    for k in range(100_000):
        q = k * n // 100_000
        b = churn + rng.randrange(4096) * 0x10000
        lines.append({"seq_before": q, "order": 2 * k + 1, "event": "alloc", "api": "cuMemAllocAsync",
                      "base": hex(b), "size": 0x8000, "id": 100 + k, "result": 0})
        lines.append({"seq_before": q + rng.randrange(2), "order": 2 * k + 2, "event": "free",
                      "api": "cuMemFreeAsync", "base": hex(b), "size": None, "id": None, "result": 0})
    (pid / "allocs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return pid


def bench(n: int = 1_000_000) -> None:
    """Loads it cold and warm in fresh processes (bench_load.measure), twice. The dump is made in a
    child process so that this one stays small (a child's ru_maxrss counts its parent's pages)."""
    import os
    import shutil
    import subprocess
    import tempfile
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_load

    folder = Path(tempfile.mkdtemp(prefix="mine-bench-allocs-"))
    subprocess.run([sys.executable, __file__, "make", str(folder), str(n)], check=True, cwd=ROOT)
    pid = folder / "pid1"
    n_ev = len((pid / "allocs.jsonl").read_bytes().splitlines())
    print(f"dump: {(pid / 'launches.jsonl').stat().st_size / 1e6:.0f} MB launches.jsonl (no ptrs), "
          f"{n_ev} alloc events")
    os.environ["MINE_CACHE_DIR"] = str(folder / "cache")   # the children's cache (mining/cache.py)
    for run in (1, 2):
        shutil.rmtree(folder / "cache", ignore_errors=True)
        for label in ("cold (JSON + offline classification, writes cache)", "warm (parquet cache)"):
            sec, rss, nl, npar = bench_load.measure(pid)
            print(f"run {run} {label}: {sec:.2f} s, peak RSS {rss:.0f} MiB, {nl} launches, {npar} param rows")
    shutil.rmtree(folder)


if __name__ == "__main__" and sys.argv[1:2] == ["bench"]:
    bench(int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)
elif __name__ == "__main__" and sys.argv[1:2] == ["make"]:
    make_bench_dump(Path(sys.argv[2]), int(sys.argv[3]))
