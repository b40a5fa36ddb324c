"""Shared test configuration: the `gpu` marker skips cleanly where no NVIDIA driver exists.

Tests live one folder per stage (capture, mining, manifests, generators, replay, cli, vocab); the
modules they share (simulators, encoders, harnesses, `paths`) live in tests/helpers, which is put
on the import path here so that every test imports them by their plain names.
"""

from __future__ import annotations

import ctypes
import functools
import sys
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
