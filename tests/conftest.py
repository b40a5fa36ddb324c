"""Shared test configuration: the `gpu` marker skips cleanly where no NVIDIA driver exists.

Tests live one folder per stage (capture, mining, manifests, generators, replay, cli, vocab); the
modules they share (simulators, encoders, harnesses, `paths`) live in tests/helpers, which is put
on the import path here so that every test imports them by their plain names. Also here: a cache
folder of the run's own (MINE_CACHE_DIR), and the bundled vLLM captures loaded and analysed once
per session (`offline_dump`, `offline_analysis`, `offline_document`, `offline_analysis_json`,
`offline_bin_analysis`, `offline_bin_analysis_json`) for the many tests that read them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

from paths import FIXTURES  # noqa: E402


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


def pytest_configure(config):
    """Tests, and the processes they start, cache into a folder of this run (removed at its end),
    never into the user's ~/.cache/mine (mining/cache.py); a MINE_CACHE_DIR already set is used
    as it is (a developer keeping a warm cache between runs)."""
    if not os.environ.get("MINE_CACHE_DIR"):
        config._mine_cache = tempfile.mkdtemp(prefix="mine-test-cache-")
        os.environ["MINE_CACHE_DIR"] = config._mine_cache


def pytest_unconfigure(config):
    if getattr(config, "_mine_cache", None):
        shutil.rmtree(config._mine_cache, ignore_errors=True)
        os.environ.pop("MINE_CACHE_DIR", None)


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


# ---------------------------------------------------------------- the bundled vLLM capture, once
# Several stages' tests read the same real capture; loading and analysing it takes seconds, so it
# is done once per session. Analyses are pure functions of the dump: sharing it is safe as long as
# no test changes these objects in place (none does; a test that must, copies).
OFFLINE = FIXTURES / "vllm" / "vllm-offline.tar.xz"


@pytest.fixture(scope="session")
def offline_dump():
    from mining.load import load_dump

    return load_dump(OFFLINE)


@pytest.fixture(scope="session")
def offline_analysis(offline_dump):
    from mining.analyze import analyze

    return analyze(offline_dump)


@pytest.fixture(scope="session")
def offline_document(offline_analysis):
    """The analysis as `mine analyze --json` writes it (vocab.analysis.Analysis)."""
    from mining.analyze import document

    return document(offline_analysis)


@pytest.fixture(scope="session")
def offline_analysis_json(offline_analysis, tmp_path_factory) -> Path:
    """The analysis as `mine analyze --json` writes it, for commands given `--analysis` (a test of
    something else than the analysis need not pay for it again)."""
    import json

    from mining.analyze import to_json

    path = tmp_path_factory.mktemp("offline") / "analysis.json"
    path.write_text(json.dumps(to_json(offline_analysis), indent=1))
    return path


@pytest.fixture(scope="session")
def offline_bin_analysis():
    """The same workload captured in the binary form (vllm-offline-bin.tar.xz), analysed once."""
    from mining.analyze import analyze
    from mining.load import load_dump

    return analyze(load_dump(FIXTURES / "vllm" / "vllm-offline-bin.tar.xz"))


@pytest.fixture(scope="session")
def offline_bin_analysis_json(offline_bin_analysis, tmp_path_factory) -> Path:
    import json

    from mining.analyze import to_json

    path = tmp_path_factory.mktemp("offline-bin") / "analysis.json"
    path.write_text(json.dumps(to_json(offline_bin_analysis), indent=1))
    return path
