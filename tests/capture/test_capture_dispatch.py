"""The injected library's launch path from mc_callback() down, on CPU, in both record forms.

tests/helpers/harness_dispatch.c plays CUPTI (each launch's callback data, API entry then exit) and the
driver (a kernel table answering cuKernelGetParamInfo & co.), and links every library source
(init.c included). Three launch paths are driven here (every other one: test_dispatch_paths.py):
cuLaunchKernel with kernelParams on a runtime CUkernel, cuLaunchKernel_ptsz with a packed
`extra` buffer on a driver CUfunction, and cuLaunchKernelEx with launch attributes and a struct
by value. Every recorded byte is compared with what the harness launched. The GPU test
(tests/capture/test_capture_gpu.py) proves the same against the real driver and CUPTI.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vocab import binfmt
from dispatch_harness import CUBIN, build_dispatch_harness  # noqa: F401  (benchmarks/bench_record_path.py imports it here)


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build_dispatch_harness(tmp_path_factory.mktemp("dispatch"))


def _records(harness: Path, out: Path, form: str, n: int) -> tuple[list[dict], list[dict]]:
    r = subprocess.run([str(harness), "records", str(out), form, str(n)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    truth = [json.loads(x) for x in r.stdout.splitlines()]
    (pid_dir,) = out.glob("pid*")
    if form == "bin":
        got = binfmt.decode_records(pid_dir)
    else:
        got = [json.loads(x) for x in (pid_dir / "launches.jsonl").read_bytes().splitlines()]
    if form == "bin":   # the compact form: each function's identity once, in functions.jsonl
        fns = binfmt.read_functions(pid_dir / "functions.jsonl")
        for g in got:
            g.update({k: v for k, v in fns[g["fn"]].items() if k != "fn"})
    return truth, got


@pytest.mark.parametrize("form", ["json", "bin"])
def test_every_launch_is_recorded_byte_for_byte(harness, tmp_path, form):
    n = 300   # > the 8 launches per function the binary form learns host words on: both phases
    truth, got = _records(harness, tmp_path / form, form, n)
    assert len(truth) == len(got) == n
    for seq, (t, g) in enumerate(zip(truth, got)):
        assert g["seq"] == seq
        assert (g["api"], g["symbol"], g["grid"], g["block"], g["smem"]) == \
            (t["api"], t["symbol"], t["grid"], t["block"], t["smem"])
        assert [p["hex"] for p in g["params"]] == t["params"]
        assert g["result"] == 0 and g["ctx"] == "0xc7000" and g["dev"] == 0
        if "cluster" in t:
            assert g["launch_attrs"]["cluster"] == t["cluster"] and g["launch_attrs"]["pdl"] == 1
    by_api = {g["api"]: g for g in got}
    assert by_api["cuLaunchKernel"]["handle"] == "kernel" and by_api["cuLaunchKernel"]["layout"] == "kernel"
    assert by_api["cuLaunchKernel_ptsz"]["handle"] == "function"
    assert by_api["cuLaunchKernel_ptsz"]["packing"] == "extra" and by_api["cuLaunchKernel_ptsz"]["stream"] == "0x5500"
    assert by_api["cuLaunchKernel"]["name"] == "k_empty(float*, float const*, float, int)"


def test_both_forms_agree(harness, tmp_path):
    _, j = _records(harness, tmp_path / "json", "json", 60)
    _, b = _records(harness, tmp_path / "bin", "bin", 60)
    keep = ("seq", "api", "func", "grid", "block", "smem", "stream", "graph", "packing", "launch_attrs", "symbol")
    assert [{k: r[k] for k in keep} | {"hex": [p["hex"] for p in r["params"]]} for r in j] == \
           [{k: r[k] for k in keep} | {"hex": [p["hex"] for p in r["params"]]} for r in b]


# ---------------------------------------------------------------- out of memory, at every allocation


def _oom(harness: Path, out: Path, form: str, fail_at: int):
    r = subprocess.run([str(harness), "oom", str(out), form, str(fail_at), str(CUBIN)], capture_output=True,
                       text=True, timeout=60)
    return r, (json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 and r.stdout else None)


@pytest.mark.parametrize("form", ["json", "bin"])
def test_an_allocation_failure_anywhere_turns_capture_off_and_the_host_runs_on(harness, tmp_path, form):
    """The library's allocator fails its Nth allocation, for every N the module, allocation-log
    and launch paths reach: each time the host finishes its work (every launch returns, exit 0),
    capture turns off with exactly one line on stderr naming the choke point, and what was
    written before is a dump the readers take (or refuse in one sentence when nothing is in it)."""
    from mining.load import DumpError, load_dump

    r, clean = _oom(harness, tmp_path / "clean", form, 0)
    assert r.returncode == 0 and r.stderr == "" and clean["off"] == 0, r.stderr
    total = clean["allocs"]
    assert total >= 5
    phases = set()
    for n in range(1, total + 1):
        out = tmp_path / f"fail{n}"
        r, got = _oom(harness, out, form, n)
        assert r.returncode == 0 and got is not None, (n, r.returncode, r.stderr)
        assert got["host_launches"] == 30 and got["off"] == 1, (n, got)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and "capture off" in lines[0] and "malloc failed with code 12" in lines[0], (n, lines)
        phases.add(got["failed_in"])
        (pid_dir,) = out.glob("pid*")
        try:
            d = load_dump(pid_dir, cache=False)
            assert len(d.launches) < 30
        except DumpError as exc:
            assert "\n" not in str(exc)
    assert phases == {"module", "alloc_log", "launch"}, phases
