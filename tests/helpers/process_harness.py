"""The whole injected library in CPU processes (tests/helpers/harness_process.c), built two ways.

Why a module: the full-filesystem tests and the thread-state tests run the same harness; it is
built here once per test module, as the library is linked into a program and as the driver loads
it (dlopened), with the fake libcuda.so.1 both resolve the driver through.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from c_harness import SRC
from capture import build_support
from paths import FIXTURES, HELPERS

CUBIN = FIXTURES / "cubins" / "mine_argmax.cubin"
SOURCE = HELPERS / "harness_process.c"
CC = ["gcc", "-O2", "-std=gnu11", "-Wall", "-Werror"]


def _inc() -> list[str]:
    paths = build_support.find_cuda()
    return [f"-I{paths.cuda_include}", f"-I{paths.cupti_include}", f"-I{SRC}"]


def _lib_sources() -> list[str]:
    return [str(SRC / s) for s in build_support.SOURCES]


def build(out: Path) -> Path:
    """out/harness (every library source linked in), out/libcuda.so.1 (the fake driver) and
    out/fullfs_shim.so (the full-disk LD_PRELOAD shim); out."""
    inc = _inc()
    subprocess.run(CC + ["-shared", "-fPIC", "-DMC_FAKE_LIBCUDA", *inc, str(SOURCE), "-o",
                         str(out / "libcuda.so.1"), "-ldl"], check=True)
    subprocess.run(CC + ["-pthread", "-rdynamic", *inc, str(SOURCE), *_lib_sources(), "-o", str(out / "harness"),
                         "-ldl", "-Wl,--no-as-needed", "-lstdc++"], check=True)
    subprocess.run(CC + ["-shared", "-fPIC", str(HELPERS / "fullfs_shim.c"), "-o", str(out / "fullfs_shim.so"),
                         "-ldl"], check=True)
    return out


def build_dlopened(out: Path) -> Path:
    """The harness as the driver loads the library: it and every library source as
    out/libharness.so (-fPIC, hidden visibility, as capture/build_support.py builds the library)
    and out/launcher, which dlopens it (so the library's thread-local storage is a dlopened
    library's); the launcher's path. Needs build(out) (the fake driver)."""
    subprocess.run(CC + ["-shared", "-fPIC", "-fvisibility=hidden", "-pthread", "-DMC_HARNESS_SO", *_inc(),
                         str(SOURCE), *_lib_sources(), "-o", str(out / "libharness.so"), "-ldl",
                         "-Wl,--no-as-needed", "-lstdc++"], check=True)
    subprocess.run(CC + ["-DMC_HARNESS_LAUNCHER", str(SOURCE), "-o", str(out / "launcher"), "-ldl"], check=True)
    return out / "launcher"
