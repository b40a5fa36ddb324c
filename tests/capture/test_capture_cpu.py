"""CPU tests for capture: build discovery, knobs, launcher errors, and the committed GPU dumps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from capture import build_support, knobs, launcher
from paths import ROOT

FIX = ROOT / "tests" / "fixtures" / "capture"


def test_find_cuda_and_clear_error(monkeypatch):
    paths = build_support.find_cuda()
    assert (paths.cuda_include / "cuda.h").is_file() and (paths.cupti_include / "cupti.h").is_file()
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build_support, "DEFAULT_CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(build_support, "_from_wheels", lambda: None)
    with pytest.raises(build_support.CudaNotFound, match="cannot build the capture library"):
        build_support.find_cuda()


def test_library_built_plain_and_driver_free():
    lib = launcher.find_library()
    dyn = subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True).stdout
    assert "libcuda" not in dyn and "libcupti" in dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert re.findall(r" T (\w+)", syms) == ["InitializeInjection"]
    # without a driver, initialization turns capture off with one line and the process goes on
    r = subprocess.run([sys.executable, "-c", f"import ctypes; print(ctypes.CDLL('{lib}').InitializeInjection())"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "1"
    assert len(r.stderr.strip().splitlines()) == 1 and "capture off" in r.stderr


def test_knobs_match_the_c_library():
    src = (ROOT / "capture" / "src" / "init.c").read_text()
    in_c = set(re.findall(r'"(MINE_CAPTURE_[A-Z_]+)"', src))
    assert in_c == {k.env for k in knobs.KNOBS}
    assert knobs.knob_env(max_launches=5, modules_only=True) == {"MINE_CAPTURE_MAX_LAUNCHES": "5",
                                                                  "MINE_CAPTURE_MODULES_ONLY": "1"}
    with pytest.raises(ValueError, match="non-negative integer"):
        knobs.knob_env(skip="-1")
    with pytest.raises(ValueError, match="regular expression"):
        knobs.knob_env(include="(")


def _mine(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", "from mine.cli import main; main()", *args], cwd=cwd,
                          capture_output=True, text=True)


@pytest.mark.parametrize("args,msg", [
    (["capture", "true"], "put the command after `--`"),
    (["capture", "--", "no-such-command-xyz"], "command not found"),
    (["capture", "-o", "pyproject.toml", "--", "true"], "is not a folder"),
    (["capture", "--format", "xml", "--", "true"], "Invalid value for '--format'"),
    (["capture", "--writer", "fast", "--", "true"], "Invalid value for '--writer'"),
])
def test_cli_bad_input_is_one_sentence_exit_2(args, msg):
    r = _mine(*args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_cli_exit_code_is_the_commands(tmp_path):
    r = _mine("capture", "-o", str(tmp_path / "d"), "--", "sh", "-c", "exit 7")
    assert r.returncode == 7 and "nothing was captured" in r.stderr


def _extract(name, tmp_path):
    with tarfile.open(FIX / name) as t:
        t.extractall(tmp_path)
    return tmp_path


def _jsonl(p):
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_probe_fixture(tmp_path):
    d = _extract("probe.tar.xz", tmp_path)
    truth = json.loads(tarfile.open(FIX / "truth.tar.xz").extractfile("probe_truth.json").read())
    parent = d / f"pid{truth['pid']}"
    launches = _jsonl(parent / "launches.jsonl")
    assert len(launches) == len(truth["launches"]) and [r["seq"] for r in launches] == list(range(len(launches)))
    assert {r["api"] for r in launches} >= {"cuLaunchKernel", "cuLaunchKernelEx"}
    ex = next(r for r in launches if r["api"] == "cuLaunchKernelEx")
    assert ex["launch_attrs"]["cluster"] == [2, 1, 1]
    extra = next(r for r in launches if r["packing"] == "extra")
    assert [p["size"] for p in extra["params"]] == [8, 4, 4] and extra["params"][0]["ptrs"][0]["off"] == 256
    for r in launches:  # every pointer word is base + off
        for p in r["params"]:
            for w in p.get("ptrs", []):
                value = int.from_bytes(bytes.fromhex(p["hex"])[w["at"]:w["at"] + 8], "little")
                assert value == int(w["base"], 16) + w["off"]
    host = next(r for r in launches if r["symbol"] == "_Z9k_hostptrPfPKf")
    assert len(bytes.fromhex(host["params"][1]["host"][0]["hex"])) == 64
    tma = next(r for r in launches if r["symbol"].startswith("_Z5k_tma"))
    enc = _jsonl(parent / "tensormaps.jsonl")[tma["params"][0]["tmap"][0]["encode"]]
    assert enc["hex"] == tma["params"][0]["hex"]
    summ = launcher.summarize(d)
    assert {s.pid for s in summ} == {truth["pid"], truth["child_pid"]}


def test_torch_fixture(tmp_path):
    d = _extract("torch.tar.xz", tmp_path)
    (s,) = launcher.summarize(d)
    assert s.launches > 50 and s.no_layout == 0
    launches = _jsonl(next(d.glob("pid*/launches.jsonl")))
    extra = [r for r in launches if r["packing"] == "extra"]
    assert extra and all(r["params"] and r["layout"] == "kernel" for r in extra)
    assert all(r["params"] for r in launches if "at6native" in r["symbol"])
    assert any(r["graph"] for r in launches)
    # no cubin of NVIDIA's closed libraries was committed
    kept = {p.stem for p in d.glob("pid*/cubins/*.cubin")}
    for m in _jsonl(next(d.glob("pid*/modules.jsonl"))):
        if m["sha256"] in kept:
            assert m["entries"] and all("nvjet" not in e and "cublas" not in e.lower() for e in m["entries"])


def test_binary_fixture_summary(tmp_path):
    """`mine capture`'s summary of a binary dump: launches from launches.bin, kernels by the
    symbols of functions.jsonl (the compact and binary forms carry no symbol per launch)."""
    from vocab import binfmt

    d = _extract("probe_bin.tar.xz", tmp_path)
    truth = json.loads(tarfile.open(FIX / "truth_bin.tar.xz").extractfile("probe_bin_truth.json").read())
    s = launcher.summarize_process(d / f"pid{truth['pid']}")
    recs = binfmt.decode_records(d / f"pid{truth['pid']}")
    fns = {f["fn"]: f["symbol"] for f in _jsonl(d / f"pid{truth['pid']}" / "functions.jsonl")}
    assert s.launches == len(recs) == len(truth["launches"]) and s.truncated_lines == 0
    assert s.kernels == len({fns[r["fn"]] for r in recs}) >= 5 and s.no_layout == 0


def test_pack_fixture_keeps_a_binary_dump_whole(tmp_path):
    """Re-packing the binary probe fixture keeps every record and the cubins its functions name."""
    from vocab import binfmt
    from capture import pack_fixture

    d = _extract("probe_bin.tar.xz", tmp_path / "in")
    res = pack_fixture.pack(d, tmp_path / "out.tar.xz", max_launches=10**6, max_cubin_bytes=10**7)
    again = _extract(str(tmp_path / "out.tar.xz"), tmp_path / "again")
    for pid in d.glob("pid*"):
        assert (again / pid.name / "launches.bin").read_bytes() == (pid / "launches.bin").read_bytes()
        used = {f["sha256"] for f in binfmt.read_functions(pid / "functions.jsonl").values()}
        assert {c.stem for c in (again / pid.name / "cubins").glob("*.cubin")} == used
    assert res["cubins_kept"] == 3 and res["cubins_dropped"] == 0


def test_pack_fixture_keeps_the_copy_log(tmp_path):
    """The copy log (copies.jsonl) survives packing: a fixture's inputs are named from it."""
    from capture import pack_fixture

    d = _extract("probe_io.tar.xz", tmp_path / "in")
    pack_fixture.pack(d, tmp_path / "out.tar.xz", max_launches=10**6, max_cubin_bytes=10**7)
    again = _extract(str(tmp_path / "out.tar.xz"), tmp_path / "again")
    logs = sorted(d.glob("pid*/copies.jsonl"))
    assert logs
    for log in logs:
        assert (again / log.parent.name / "copies.jsonl").read_bytes() == log.read_bytes()


def test_pack_fixture_budget_keeps_the_most_used_kernels(tmp_path):
    """Under a cubin budget the packer keeps as many launched cubins as fit, smallest first: a
    large framework cubin must not crowd out a model's small kernel (the torch capture's two
    launched cubins, a budget one byte short of both)."""
    from vocab import binfmt
    from capture import pack_fixture

    d = _extract("torch_bin.tar.xz", tmp_path / "in")
    pid = next(d.glob("pid*"))
    sizes = sorted((c.stat().st_size, c.stem) for c in (pid / "cubins").glob("*.cubin"))
    used = {f["sha256"] for f in binfmt.read_functions(pid / "functions.jsonl").values()}
    assert len(sizes) >= 2 and {s for _, s in sizes} <= used
    res = pack_fixture.pack(d, tmp_path / "out.tar.xz", max_launches=10**6,
                            max_cubin_bytes=sizes[0][0] + sizes[1][0] - 1)
    again = _extract(str(tmp_path / "out.tar.xz"), tmp_path / "again")
    kept = {c.stem for c in (again / pid.name / "cubins").glob("*.cubin")}
    assert kept == {sizes[0][1]} and res["cubins_dropped"] == len(sizes) - 1
