"""A tensor-parallel worker's capture says which rank it is (docs/dump-format.md "meta.json" `env`,
docs/ranks.md), and the allocation log records the VMM handles shared between processes.

Driven through the dispatch harness (the whole library, the driver and CUPTI played by hand): the
rank variables the process's environment holds land in meta.json `env` (and only those), the key
is absent when none is set, a value is escaped as JSON, and the exit rewrite keeps it; every
cuMemImportFromShareableHandle / cuMemExportToShareableHandle call is one allocs.jsonl event.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import dispatch_harness as H
from mining.load import read_meta

RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return H.build_dispatch_harness(tmp_path_factory.mktemp("rank-harness"))


def _run(harness, folder, env: dict, *knobs):
    base = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    r = subprocess.run([str(harness), "all", str(folder), "json", str(H.CUBIN), *knobs], capture_output=True,
                       text=True, timeout=120, env={**base, **env})
    assert r.returncode == 0, r.stderr
    (pid_dir,) = folder.glob("pid*")
    return pid_dir


@pytest.mark.parametrize("rank,world", [(0, 2), (3, 4)])
def test_the_rank_variables_land_in_meta(harness, tmp_path, rank, world):
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    pid_dir = _run(harness, tmp_path, {**env, "NOT_A_RANK_VAR": "x"})
    warnings: list[str] = []
    meta = read_meta(pid_dir, warnings)
    assert warnings == [] and "counters" in meta          # the exit rewrite, which keeps it
    assert meta["env"] == env                              # only the rank variables, as set


def test_no_rank_variables_no_env_key(harness, tmp_path):
    meta = json.loads((_run(harness, tmp_path, {}) / "meta.json").read_text())
    assert "env" not in meta


def test_a_value_is_escaped(harness, tmp_path):
    odd = 'a"b\\c\td'
    meta = json.loads((_run(harness, tmp_path, {"LOCAL_WORLD_SIZE": odd}) / "meta.json").read_text())
    assert meta["env"] == {"LOCAL_WORLD_SIZE": odd}


def test_shareable_handle_calls_are_logged(harness, tmp_path):
    pid_dir = _run(harness, tmp_path, {}, "alloc_log")
    events = H.read_jsonl(pid_dir / "allocs.jsonl")
    by_api = {e["api"]: e for e in events}
    assert by_api["cuMemImportFromShareableHandle"]["event"] == "vmm_import"
    assert by_api["cuMemExportToShareableHandle"]["event"] == "vmm_export"
    assert all(by_api[a]["base"] is None and by_api[a]["result"] == 0
               for a in ("cuMemImportFromShareableHandle", "cuMemExportToShareableHandle"))
