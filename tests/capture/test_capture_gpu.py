"""GPU tests: run the probe and a PyTorch forward under `mine capture`, check the dumps.

The probe (examples/capture_probe) writes what it launched; every recorded launch must match a
launched one byte for byte (and the other way round), with pointer words, host pointees, TMA
maps, cluster dims, graph membership and the launch -> module link right. Set MINE_GPU_DUMPS to
keep the dumps there (they become the committed fixtures).

Every test runs twice: with the default JSON records and with `--format bin` (launches.bin,
docs/dump-format.md "Binary launch records"). In the binary form the records are decoded with
`vocab.binfmt`, joined with functions.jsonl, and their pointer words come from the offline
classification of allocs.jsonl (`mining.load_dump`), so the same assertions check the binary
capture end to end; tensor-map links are not made in that form (checked by content instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from compact_form import expand
from paths import ROOT

pytestmark = pytest.mark.gpu


def _jsonl(path: Path) -> list[dict]:
    """Tolerates what the mmap writer leaves after _exit/SIGKILL: a NUL tail, NULs before a record."""
    if not path.is_file():
        return []
    lines = (x.rpartition(b"\0")[2] for x in path.read_bytes().split(b"\n"))
    return [json.loads(x) for x in lines if x.strip()]


FORMATS = ["json", "bin"]


def _bin_launches(d: Path) -> list[dict]:
    from vocab import binfmt
    from mining.load import load_dump

    fns = {f["fn"]: f for f in _jsonl(d / "functions.jsonl")}
    recs = [expand(r, fns) for r in binfmt.decode_records(d)]
    params = load_dump(d, cache=False).params
    ptr = params[params["is_ptr"]]
    words: dict = {}
    for seq, i, at, base, off in zip(ptr["seq"], ptr["i"], ptr["at"], ptr["alloc_base"], ptr["ptr_off"]):
        words.setdefault((int(seq), int(i)), []).append({"at": int(at), "base": hex(int(base)), "off": int(off)})
    for r in recs:
        for p in r["params"]:
            if (r["seq"], p["i"]) in words:
                p["ptrs"] = words[(r["seq"], p["i"])]
    return recs


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    keep = os.environ.get("MINE_GPU_DUMPS")
    base = Path(keep) if keep else tmp_path_factory.mktemp("gpu")
    base.mkdir(parents=True, exist_ok=True)
    return base


@pytest.fixture(scope="module", params=FORMATS)
def probe(dumps, request):
    build = dumps / "probe_build"
    if not (build / "probe").is_file():
        subprocess.run([str(ROOT / "examples" / "capture_probe" / "build.sh"), str(build)], check=True)
    sfx = "" if request.param == "json" else "_bin"
    dump, gt = dumps / f"probe{sfx}", dumps / f"probe{sfx}_truth.json"
    r = subprocess.run([sys.executable, "-m", "mine.cli", "capture", "-o", str(dump), "--format", request.param, "--",
                        str(build / "probe"), str(build / "probe_mod.cubin"), str(gt)],
                       cwd=ROOT, capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr
    truth = json.loads(gt.read_text())
    child = json.loads(Path(str(gt) + ".child.json").read_text())
    return dump, truth, child, (build / "probe_mod.cubin").read_bytes()


def _proc(dump: Path, pid: int) -> dict:
    d = dump / f"pid{pid}"
    launches = _bin_launches(d) if (d / "launches.bin").is_file() else _jsonl(d / "launches.jsonl")
    return {"meta": json.loads((d / "meta.json").read_text()), "launches": launches,
            "modules": _jsonl(d / "modules.jsonl"), "graphs": _jsonl(d / "graphs.jsonl"),
            "tmaps": _jsonl(d / "tensormaps.jsonl"), "dir": d}


def _match(truth_launches, recorded, tmaps):
    """Pairs each ground-truth launch with one recorded launch, checking every byte."""
    pool = list(recorded)
    for t in truth_launches:
        hexes = [p["hex"] for p in t["params"]]
        hit = next((r for r in pool if r["symbol"] == t["symbol"] and [p["hex"] for p in r["params"]] == hexes), None)
        assert hit is not None, f"no recorded launch for {t['tag']} {t['symbol']} {hexes}"
        pool.remove(hit)
        assert hit["packing"] == t["packing"], t["tag"]
        assert hit["layout"] in ("kernel", "function"), t["tag"]
        assert hit["result"] == 0
        assert (hit["graph"] is not None) == t["graph"], t["tag"]
        if "cluster" in t:
            assert hit["launch_attrs"]["cluster"] == t["cluster"]
        for tp, rp in zip(t["params"], hit["params"]):
            for want in tp.get("ptrs", []):
                got = {p["at"]: p for p in rp.get("ptrs", [])}
                assert want["at"] in got, (t["tag"], want)
                assert got[want["at"]]["base"] == want["base"] and got[want["at"]]["off"] == want["off"], t["tag"]
            for want in tp.get("host", []):
                got = {h["at"]: h for h in rp.get("host", [])}
                assert got[want["at"]]["hex"] == want["hex"], t["tag"]
            for want in tp.get("tmap", []):
                if "tmap" not in rp:   # binary form: the map is found by its 128 bytes
                    enc = [m for m in tmaps if m["hex"] == rp["hex"][2 * want["at"]:2 * want["at"] + 256]]
                    assert enc and enc[-1]["global"] == want["global"], t["tag"]
                    continue
                got = {m["at"]: m for m in rp.get("tmap", [])}
                enc = tmaps[got[want["at"]]["encode"]]
                assert enc["global"] == want["global"] and enc["hex"] == tp["hex"][:256]
    return pool


def test_probe_every_launch_byte_for_byte(probe):
    dump, truth, _, _ = probe
    p = _proc(dump, truth["pid"])
    assert truth["child_ok"] and truth["late_fork_ok"]
    leftover = _match(truth["launches"], p["launches"], p["tmaps"])
    assert leftover == [], f"recorded launches the probe did not make: {[r['symbol'] for r in leftover]}"
    assert [r["seq"] for r in p["launches"]] == list(range(len(p["launches"])))


def test_probe_apis_handles_and_module_link(probe):
    dump, truth, _, cubin = probe
    p = _proc(dump, truth["pid"])
    by_id = {m["module"]: m for m in p["modules"] if m["event"] == "load"}
    apis = Counter(r["api"] for r in p["launches"])
    assert apis["cuLaunchKernelEx"] >= 1 and apis["cuLaunchKernel"] >= 2
    for r in p["launches"]:
        assert r["module"] in by_id, r["symbol"]
        assert r["symbol"] in by_id[r["module"]]["entries"]
        assert r["sha256"] == by_id[r["module"]]["sha256"]
        assert (p["dir"] / "cubins" / f"{r['sha256']}.cubin").is_file()
        want = "function" if r["symbol"].startswith("drv_") else "kernel"
        if r["api"].startswith("cuGraph"):   # a kernel node: the runtime may hand the driver either kind
            want = r["handle"] if r["handle"] in ("kernel", "function") else want
        assert r["handle"] == want, r["symbol"]
        assert r["attrs"]["regs"] > 0 and r["dev"] == 0
    drv = [r for r in p["launches"] if r["symbol"].startswith("drv_")]
    assert {r["sha256"] for r in drv} == {hashlib.sha256(cubin).hexdigest()}


def test_probe_graph_lifecycle(probe):
    dump, truth, _, _ = probe
    p = _proc(dump, truth["pid"])
    ev = Counter(g["event"] for g in p["graphs"])
    assert ev["capture_begin"] == 1 and ev["capture_end"] == 1 and ev["instantiate"] == 2
    assert ev["launch"] == truth["graph_replays"] + truth["hand_graph_replays"]
    end = next(g for g in p["graphs"] if g["event"] == "capture_end")
    inst = next(g for g in p["graphs"] if g["event"] == "instantiate" and g["graph"] == end["graph"])
    assert end["nodes"] == 2
    assert sum(g["exec"] == inst["exec"] for g in p["graphs"] if g["event"] == "launch") == truth["graph_replays"]
    captured = [r for r in p["launches"] if r["graph"] and r["graph"]["capture_id"]]
    assert [r["seq"] for r in captured] == list(range(end["seq_first"], end["seq_last"] + 1))
    assert {r["graph"]["capture_id"] for r in captured} == {end["capture_id"]}
    # the graph built by hand: its kernel node is one launch record, named by a kernel_node event
    node = [g for g in p["graphs"] if g["event"] == "kernel_node"]
    assert len(node) == 1
    rec = next(r for r in p["launches"] if r["seq"] == node[0]["seq"])
    assert rec["api"].startswith("cuGraphAdd") and rec["graph"] == {"graph": node[0]["graph"], "capture_id": 0}
    hand = next(g for g in p["graphs"] if g["event"] == "instantiate" and g["graph"] == node[0]["graph"])
    assert sum(g["exec"] == hand["exec"] for g in p["graphs"] if g["event"] == "launch") == truth["hand_graph_replays"]


def test_probe_threads_fork_and_meta(probe):
    dump, truth, child, _ = probe
    p = _proc(dump, truth["pid"])
    threads = [r for r in p["launches"] if r["symbol"] == "_Z6k_axpyPfPKffi" and r["stream"] not in ("0x0",)
               and not r["graph"]]
    assert len(threads) == 200 and len({r["tid"] for r in threads}) == 8
    c = _proc(dump, child["pid"])
    assert _match(child["launches"], c["launches"], c["tmaps"]) == []
    assert c["meta"]["ppid"] == truth["pid"]
    m = p["meta"]
    assert m["format_version"] == 1 and m["devices"][0]["cc"] == [9, 0]
    assert m["counters"]["launches_recorded"] == len(p["launches"]) and m["counters"]["no_layout"] == 0
    assert "disabled" not in m
    # the child forked after CUDA started made no records, so it left no folder
    assert {d.name for d in dump.iterdir()} == {f"pid{truth['pid']}", f"pid{child['pid']}"}


@pytest.fixture(scope="module", params=FORMATS)
def torch_dump(dumps, request):
    pytest.importorskip("torch")
    dump = dumps / ("torch" if request.param == "json" else "torch_bin")
    r = subprocess.run([sys.executable, "-m", "mine.cli", "capture", "-o", str(dump), "--format", request.param, "--",
                        sys.executable, str(ROOT / "examples" / "torch_forward.py")],
                       cwd=ROOT, capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr
    return _proc(dump, json.loads(next(dump.glob("pid*/meta.json")).read_text())["pid"])


def test_torch_every_aten_kernel_has_params(torch_dump):
    launches = torch_dump["launches"]
    aten = [r for r in launches if "at6native" in r["symbol"] or r["name"].startswith(("void at::", "at::"))]
    assert len(aten) > 20
    for r in aten:
        assert r["layout"] != "none" and r["params"], r["name"]
        assert all(p["hex"] for p in r["params"]), r["name"]
    assert torch_dump["meta"]["counters"]["no_layout"] == 0
    assert all(r["module"] is not None for r in launches)


def test_torch_cublaslt_gemms_decoded(torch_dump):
    extra = [r for r in torch_dump["launches"] if r["packing"] == "extra"]
    assert extra, "no extra-packed launch (cuBLASLt) recorded"
    for r in extra:
        assert r["layout"] != "none" and r["params"] and "extra_hex" not in r, r["symbol"]
        assert any(p.get("ptrs") for p in r["params"]), r["symbol"]


def test_torch_graph_recorded(torch_dump):
    ev = Counter(g["event"] for g in torch_dump["graphs"])
    assert ev["capture_begin"] >= 1 and ev["capture_end"] >= 1 and ev["launch"] >= 3
    assert any(r["graph"] for r in torch_dump["launches"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_probe_under_the_toggler_loads(dumps, fmt):
    """MINE_CAPTURE_TOGGLE_MS: the launch callbacks switched off and on by the library's thread
    while the probe runs; the dump (meta.json `toggles` included) loads, and every launch recorded
    is one the probe made (a launch made while the callbacks were off is simply not recorded)."""
    from mining.load import load_dump

    build = dumps / "probe_build"
    if not (build / "probe").is_file():
        subprocess.run([str(ROOT / "examples" / "capture_probe" / "build.sh"), str(build)], check=True)
    dump, gt = dumps / f"probe_toggle_{fmt}", dumps / f"probe_toggle_{fmt}_truth.json"
    env = dict(os.environ, MINE_CAPTURE_TOGGLE_MS="1")
    r = subprocess.run([sys.executable, "-m", "mine.cli", "capture", "-o", str(dump), "--format", fmt, "--",
                        str(build / "probe"), str(build / "probe_mod.cubin"), str(gt)],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    truth = json.loads(gt.read_text())
    p = _proc(dump, truth["pid"])
    m = p["meta"]
    assert m["options"]["toggle_ms"] == 1 and "disabled" not in m
    toggles = m.get("toggles", [])
    assert [on for _, on in toggles] == [i % 2 for i in range(len(toggles))]   # off first, then alternating
    assert all(a[0] < b[0] for a, b in zip(toggles, toggles[1:]))
    d = load_dump(p["dir"], cache=False)
    assert d.meta.get("toggles", []) == toggles and len(d.launches) == len(p["launches"])
    assert _match([t for t in truth["launches"] if any(
        r["symbol"] == t["symbol"] and [q["hex"] for q in r["params"]] == [q["hex"] for q in t["params"]]
        for r in p["launches"])], p["launches"], p["tmaps"]) == []
