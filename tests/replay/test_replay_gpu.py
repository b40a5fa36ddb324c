"""GPU tests of `mine replay` (marked gpu: skipped where no NVIDIA driver exists).

The probe capture's launches have known data flow (examples/capture_probe/probe.cu): axpy reads x
and updates y, the struct kernel reads x and z through the struct and writes y, the host-pointer
kernel writes out, the TMA kernel writes out from its re-encoded map, the driver kernels scale or
bump y in place (one through a cluster launch). Each must replay, deterministically, with exactly
those directions. The vLLM Qwen3 capture's decode and prefill forwards must replay launch by launch
wherever the dump holds the cubin. MINE_GPU_OUT, when set, receives the results as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from mining.load import load_dump
from paths import FIXTURES

pytestmark = pytest.mark.gpu
FIX = FIXTURES

PROBE = {   # symbol substring -> {(param, byte in param): direction}
    "k_axpy": {(0, 0): "inout", (1, 0): "in"},
    "k_struct": {(0, 0): "in", (0, 8): "out", (0, 32): "in"},
    "k_hostptr": {(0, 0): "out"},
    "k_tma": {(1, 0): "out"},
    "drv_scale": {(0, 0): "inout"},
    "drv_cluster": {(0, 0): "inout"},
}


def _save(name: str, results) -> None:
    out = os.environ.get("MINE_GPU_OUT")
    if out:
        Path(out, name).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))


def test_device_diff_finds_exactly_the_changed_chunks():
    """`Gpu.diff` (replay/kernels/diff.ptx, JIT-loaded) against the host's compare of the same bytes:
    changes at a chunk's first and last byte, in the middle, in the ragged tail past the last
    8-byte word, and none at all (the ragged tail is not compared on the device: it always comes
    back as a changed chunk, and the caller downloads it)."""
    import numpy as np

    from replay.gpu import Gpu
    from replay.runs import CHUNK, host_chunks

    gpu = Gpu(0)
    try:
        n = (1 << 20) + 5
        rng = np.random.default_rng(11)
        a = rng.integers(0, 256, n, dtype=np.uint8)
        da, db = gpu.alloc(n), gpu.alloc(n)
        gpu.upload(da, a)
        gpu.copy(db, da, n)
        assert gpu.diff(da, db, n, CHUNK).tolist() == [(n - 1) // CHUNK]   # the tail only
        assert len(gpu.diff(da, db, n - 5, CHUNK)) == 0                     # whole words: nothing
        b = a.copy()
        for pos in (0, CHUNK - 1, 5 * CHUNK + 17, n - 3):
            b[pos] ^= 0x5A
        gpu.upload(db, b)
        got = gpu.diff(da, db, n, CHUNK)
        assert got.tolist() == host_chunks(a, b, CHUNK).tolist() == [0, 5, (n - 1) // CHUNK]
    finally:
        gpu.close()


def test_probe_launches_replay_with_their_data_flow():
    from replay.run import replay_seqs

    d = load_dump(FIX / "capture" / "probe.tar.xz", cache=False)
    L = d.launches
    seqs = [int(L.loc[L["symbol"].astype(str).str.contains(k), "seq"].iloc[0]) for k in PROBE]
    res = replay_seqs(d, seqs, reps=5)
    _save("probe.json", res)
    for key, r in zip(PROBE, res):
        assert r.status == "ok", (key, r.message)
        assert r.deterministic, key
        got = {(w.i, w.at): w.direction for w in r.words}
        assert got == PROBE[key], (key, got)
        assert r.time_us and r.time_us > 0


def _forward(d, phase_tokens):
    from mining.analyze import analyze, document

    doc = document(analyze(d))
    serve = [f for f in doc.serve_forwards() if (f.tokens == 1) == (phase_tokens == 1)]
    f = serve[0]
    return f, [s for first, n in f.seqs for s in range(first, first + n)]


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_vllm_forward_replays(which):
    from replay.run import replay_seqs

    d = load_dump(FIX / "vllm" / "vllm-offline.tar.xz", cache=False)
    f, seqs = _forward(d, 1 if which == "decode" else 2)
    res = replay_seqs(d, seqs, reps=10)
    _save(f"vllm_{which}.json", res)
    ran = [r for r in res if r.status != "missing"]
    assert len(ran) > len(res) // 2
    # vLLM's input staging and sampling kernels read pinned host buffers through mapped
    # addresses the capture has no allocation for: they fault, and say so; nothing else may
    host = "outside every captured device allocation"
    bad = [(r.seq, r.symbol[:60], r.status, r.message) for r in ran if r.status != "ok" and host not in r.message]
    assert bad == []
    assert all(r.deterministic for r in ran if r.status == "ok")
    diffs = directions_against_the_generator(res)
    out = os.environ.get("MINE_GPU_OUT")
    if out:
        Path(out, f"vllm_{which}_directions.json").write_text(json.dumps(diffs, indent=1))
    # the layer kernels whose work does not depend on metadata in memory: measured = hand-written
    for fam in ("rms", "fadd", "rope", "silu"):
        assert diffs[fam]["launches"] > 0 and diffs[fam]["differences"] == [], (fam, diffs[fam])


def directions_against_the_generator(results) -> dict:
    """Per Qwen3 kernel family (generators/qwen3/kernels.py), the measured direction of each
    pointer parameter the generator declares by hand, and every launch where they differ."""
    from generators.qwen3.kernels import FAMILIES, tag

    out = {f: {"launches": 0, "differences": []} for f in FAMILIES}
    for r in results:
        fam = tag(r.symbol) if r.status == "ok" else None
        if fam is None:
            continue
        out[fam]["launches"] += 1
        got = {w.i: w for w in r.words if w.at == 0}
        for i, (role, want, _) in FAMILIES[fam].ptrs.items():
            w = got.get(i)
            measured = w.direction if w else "not a pointer here"
            if measured != want:
                out[fam]["differences"].append({"seq": r.seq, "param": i, "role": role, "hand": want,
                                                "measured": measured, "shared_region": bool(w and w.shared),
                                                "region_written": bool(w and w.region_written)})
    return out


def test_probe_launches_write_what_the_original_run_wrote(tmp_path):
    """The probe run with PROBE_IO (tests/fixtures/capture/probe_io.tar.xz: the dump and the side
    file of the bytes around each of its single launches): every one, replayed on the original
    bytes, writes exactly what the original run wrote."""
    import tarfile

    from replay.contents import check_dump

    fix = FIX / "capture" / "probe_io.tar.xz"
    with tarfile.open(fix) as t:
        t.extract("probe_io.json", tmp_path, filter="data")
    d = load_dump(fix, cache=False)
    res = check_dump(d, tmp_path / "probe_io.json")
    _save("probe_io.json", res)
    assert len(res) == 7
    assert {r.kernel for r in res} == set(PROBE)
    for r in res:
        assert r.status == "same", (r.kernel, r.status, r.message)
        assert any(b["changed_by_launch"] for b in r.buffers), r.kernel   # the launch wrote something


# captures whose copy log keeps every copy's bytes (MINE_CAPTURE_COPY_BYTES=65536) and whose
# launch records keep 4 KiB of host pointees: q2b (the default 4096 B) lost vLLM's 4,100-byte
# query-offset copies, so its attention replays on no queries
IN_ORDER = [("replay/q2r.tar.xz", 1), ("replay/q2r.tar.xz", 2)]


@pytest.mark.parametrize("fixture,tokens", IN_ORDER, ids=["q2r-decode", "q2r-prefill"])
def test_vllm_forward_in_order_has_the_generators_directions(fixture, tokens):
    """A decode and a prefill forward of a vLLM capture with a copy log and pinned-host staging,
    replayed in order on rebuilt memory (`replay.forward`): every launch that has a cubin runs
    (no fault), deterministically, and the measured direction of every pointer parameter the
    Qwen3 generator declares by hand, in kern's vocabulary (`vocab.analysis.kern_directions`, with
    persistence from the analysis' roles), is the hand-written one -- for every family, attention
    and the KV-cache write included. The differences are listed."""
    from mining.analyze import analyze, document
    from replay.forward import replay_forward
    from replay.select import warm_start

    d = load_dump(FIX / fixture, cache=False)
    doc = document(analyze(d))
    f = [f for f in doc.serve_forwards() if (f.tokens == 1) == (tokens == 1)][0]
    seqs = [s for first, n in f.seqs for s in range(first, first + n)]
    fr = replay_forward(d, seqs, warm_start(d, f.forward))
    name = Path(fixture).name.split(".")[0]
    _save(f"{name}_in_order_{'decode' if tokens == 1 else 'prefill'}.json", fr.results)
    # a fault is only allowed where the launch was given a buffer that a launch left out (no cubin:
    # cuBLAS, ATen's large fatbins) wrote earlier in the window: its bytes were never computed
    out = os.environ.get("MINE_GPU_OUT")
    if out:
        Path(out, f"{name}_in_order_{tokens}_faults.json").write_text(json.dumps(fr.faults, indent=1))
    assert [f for f in fr.faults if not f[2]] == []
    faulted = {f[0] for f in fr.faults}
    bad = [(r.seq, r.symbol[:60], r.status, r.message) for r in fr.results
           if r.status not in ("ok", "missing") and r.seq not in faulted]
    assert bad == []
    assert not any(tag_of(r.symbol) for r in fr.results if r.seq in faulted)   # never a layer kernel
    ok = [r for r in fr.results if r.status == "ok"]
    assert len(ok) > len(fr.results) // 3
    assert all(r.deterministic for r in ok), [r.symbol[:50] for r in ok if not r.deterministic]
    diffs = kern_directions_against_the_generator(ok, doc, d)
    if out:
        Path(out, f"{name}_in_order_{tokens}_directions.json").write_text(json.dumps(diffs, indent=1))
    ran = {tag_of(r.symbol) for r in fr.results} - {None}     # prefill's 2D attention needs no reduce_segments
    assert {"attn", "cache", "rms", "fadd", "rope", "silu"} <= ran
    for fam, got in diffs.items():
        assert (got["launches"] > 0) == (fam in ran) and got["differences"] == [], (fam, got)


def tag_of(symbol: str):
    from generators.qwen3.kernels import tag

    return tag(symbol)


def kern_directions_against_the_generator(results, doc, dump) -> dict:
    """Per Qwen3 family, every launch where the measured direction (kern's vocabulary) of a
    pointer parameter differs from generators/qwen3/kernels.py's hand-written one."""
    from generators.qwen3.kernels import ATTN3D, FAMILIES, tag
    from vocab.analysis import kern_directions
    from replay.sites import site_of

    syms = dict(zip(dump.launches["seq"].tolist(), dump.launches["symbol"].astype(str).tolist()))
    nparams = dict(zip(dump.launches["seq"].tolist(), dump.launches["n_params"].tolist()))
    sites = site_of(doc, syms)
    role = {(p.site, p.i, p.at): p.role for p in doc.pointers}
    out = {f: {"launches": 0, "differences": []} for f in FAMILIES}
    for r in results:
        fam = tag(r.symbol)
        if fam is None:
            continue
        spec = ATTN3D if fam == "attn" and nparams[r.seq] == ATTN3D.n_params else FAMILIES[fam]
        out[fam]["launches"] += 1
        got = {w.i: w for w in r.words if w.at == 0}
        for i, (name, want, _) in spec.ptrs.items():
            w = got.get(i)
            if w is None:
                measured = "not a pointer here"
            else:
                persistent = role.get((sites.get(r.seq), i, 0)) in ("kv_pool", "persistent")
                measured = kern_directions(w.direction, w.written_bytes, w.span_bytes, persistent)
                measured = sorted(measured) if measured is not None else None
            if measured is None or isinstance(measured, str) or want not in measured:
                out[fam]["differences"].append({"seq": r.seq, "param": i, "role": name, "hand": want,
                                                "measured": measured, "raw": w.direction if w else None,
                                                "written": w.written_bytes if w else 0, "shared": bool(w and w.shared)})
    return out
