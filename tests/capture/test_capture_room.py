"""The address-space guard (capture/src/room.c) on CPU: the dispatch harness (every library source,
CUPTI and the driver played by tests/helpers/harness_dispatch.c) run under `ulimit -v`.

With little room left under the limit the library turns capture off at its first growth, says so in
one stderr line and in meta.json, and the host runs to its end; with room to spare the limit changes
nothing. The GPU side of the same question is the stress run (benchmarks/stress/run.sh).
"""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest

from dispatch_harness import build_dispatch_harness
from vocab import binfmt


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build_dispatch_harness(tmp_path_factory.mktemp("room"))


def _run_limited(harness: Path, out: Path, limit_mb: int, n: int = 200) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    return subprocess.run([str(harness), "records", str(out), "bin", str(n)], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)


def _meta(out: Path) -> dict:
    (pid_dir,) = out.glob("pid*")
    return json.loads((pid_dir / "meta.json").read_text().rstrip(" \n\0"))


def _smallest_limit_that_runs(harness: Path, tmp: Path) -> int:
    """The harness's own need: the smallest limit (MB, 16 MB steps) under which it runs at all, with
    the library's reserve taken at start."""
    for mb in range(64, 2048, 16):
        if _run_limited(harness, tmp / f"probe{mb}", mb, n=1).returncode == 0:
            return mb
    pytest.fail("the harness does not run under any limit below 2 GB")


def test_little_room_turns_capture_off_and_the_host_runs_on(harness, tmp_path):
    need = _smallest_limit_that_runs(harness, tmp_path)
    out = tmp_path / "tight"
    r = _run_limited(harness, out, need + 32)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("[mine-capture]")]
    assert len(lines) == 1 and "address space is nearly full" in lines[0], r.stderr
    meta = _meta(out)
    assert "address space" in (meta.get("disabled") or "")
    assert len(r.stdout.splitlines()) == 200          # the host made every launch


def test_room_to_spare_changes_nothing(harness, tmp_path):
    out = tmp_path / "roomy"
    r = _run_limited(harness, out, 8192)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert not _meta(out).get("disabled")
    (pid_dir,) = out.glob("pid*")
    assert len(binfmt.decode_records(pid_dir)) == 200
