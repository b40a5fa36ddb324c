"""What the injected library keeps per thread: one block, reached through one static TLS word.

Why: the library is dlopened by the driver (CUDA_INJECTION64_PATH), and a dlopened library's
__thread variables of the default model are dynamic TLS, which glibc allocates at a thread's first
touch and, when that fails, ends the whole host with "cannot allocate memory for thread-local
data: ABORT" (issue 14's address-space squeeze; tests/capture/test_capture_fullfs.py runs the
squeeze dlopened). Now the only thread-local is one 8-byte initial-exec pointer to a block made
through the library's allocation choke point (mc.h mc_tl_t). These tests hold what that rests on:
the TLS segment of the library as built, the blocks freed when their threads leave, and a forked
child's view of the forking thread's block (the harness: tests/helpers/harness_process.c, the whole
library in CPU processes with the driver and CUPTI faked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import process_harness
from capture import launcher
from dispatch_harness import read_dump
from paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "stress"))
import check  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return process_harness.build(tmp_path_factory.mktemp("threads"))


@pytest.fixture(scope="module", params=["linked", "dlopened"])
def exe(request, built) -> Path:
    """The harness with the library linked in, and its launcher that dlopens it."""
    return built / "harness" if request.param == "linked" else process_harness.build_dlopened(built)


def _tls_segment(so: Path) -> list[list[str]]:
    out = subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True, check=True).stdout
    return [x.split() for x in out.splitlines() if x.split()[:1] == ["TLS"]]


@pytest.mark.parametrize("which", ["shipped", "harness"])
def test_the_library_has_one_static_tls_word(built, which):
    """The library's TLS segment is one 8-byte word, the object is marked STATIC_TLS (initial-exec:
    glibc places it in the static TLS surplus when dlopened, no allocation at a thread's first
    touch), and no code calls __tls_get_addr: in the library `pip install` builds and in the
    dlopened harness built from the same sources."""
    so = launcher.find_library() if which == "shipped" else process_harness.build_dlopened(built).parent / "libharness.so"
    seg = _tls_segment(so)
    assert len(seg) == 1 and int(seg[0][5], 16) == 8, seg   # MemSiz
    dyn = subprocess.run(["readelf", "-dW", str(so)], capture_output=True, text=True, check=True).stdout
    assert "STATIC_TLS" in dyn
    dis = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "__tls_get_addr" not in dis


def test_a_threads_block_is_freed_when_it_leaves(built, exe, tmp_path):
    """500 threads one after another, each launching (its block and JSON buffer made) and leaving:
    the heap in use is what it was after the first 16 (the old per-thread buffers stayed: 4 KB a
    thread)."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(built), MINE_CAPTURE_DIR=str(tmp_path / "dump"),
               MINE_CAPTURE_FORMAT="json")
    r = subprocess.run([str(exe), "CHURN", "500"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = json.loads(r.stdout)
    assert got["after"] - got["warm"] < 500 * 64, got   # far below one block (~11 KB) a thread


@pytest.mark.parametrize("form", ["bin", "json"])
def test_a_forked_child_starts_its_thread_state_afresh(built, exe, tmp_path, form):
    """fork without exec: the child's copy of the forking thread's block says nothing of the
    parent's -- its launches carry the child's thread id, not the parent's, and name functions of
    the child's own functions.jsonl (the launch cache starts over); a thread the child starts gets
    a block of its own; the parent goes on with its own. Counters exact in both."""
    dump, truth = tmp_path / "dump", tmp_path / "truth"
    dump.mkdir()
    truth.mkdir()
    env = dict(os.environ, LD_LIBRARY_PATH=str(built), MINE_CAPTURE_DIR=str(dump), MINE_CAPTURE_FORMAT=form)
    n = 1500
    r = subprocess.run([str(exe), "FORK", str(n), str(truth), str(process_harness.CUBIN)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    truths = {t["role"]: t for t in (json.loads(f.read_text()) for f in truth.glob("*.json"))}
    main, forked = truths["main"], truths["forked"]
    assert main["children"] == [forked["pid"]] and main["child_status"] == [0]
    for t in (main, forked):
        info, problems = check.check_process(dump, t, r.stderr)
        assert not problems and info["launches_recorded"] == 2 * n, (problems, info)
    parent = read_dump(dump / f"pid{main['pid']}")["launches"]
    child = read_dump(dump / f"pid{forked['pid']}")["launches"]
    assert {x["tid"] for x in parent} == {main["pid"]}
    tids = sorted({x["tid"] for x in child})
    assert forked["pid"] in tids and len(tids) == 2 and main["pid"] not in tids, tids
    assert sum(x["tid"] == forked["pid"] for x in child) == n
    sym = "_Z7k_emptyPfPKffi"
    assert all(x.get("symbol") == sym for x in parent + child), {x.get("symbol") for x in parent + child}
