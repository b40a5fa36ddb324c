"""Find the CUDA headers and CUPTI that the injection library is built against.

Contract: `find_cuda()` returns a `CudaPaths` with an include folder holding `cuda.h`, one holding
`cupti.h`, and the CUPTI shared library to link with. It looks, in order, at `$CUDA_HOME`
(or `$CUDA_PATH`), `/usr/local/cuda`, then the pip wheels `nvidia-cuda-cupti` and the CUDA
header wheels (`nvidia-cuda-runtime`, `nvidia-cuda-nvcc`, ...) under `site-packages/nvidia/`.
It raises `CudaNotFound` (one sentence) when neither exists. It does not look for libcuda: the
library resolves the driver at run time, so it builds where no driver is installed.
`build_ext_class()` gives the setuptools command that builds `capture/libmine_capture.so` as a
plain shared library (no Python module init, no ABI suffix in its name).
"""

from __future__ import annotations

import glob
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

LIB_NAME = "libmine_capture.so"  # the file the launcher loads through CUDA_INJECTION64_PATH
SOURCES = ["dispatch.c", "launch.c", "graphs.c", "tmap.c", "toggle.c", "copies.c", "snapshot.c", "layout.c",
           "alloc.c", "record.c", "writer.c", "ident.c", "room.c", "init.c"]
DEFAULT_CUDA_HOME = "/usr/local/cuda"


class CudaNotFound(FileNotFoundError):
    """Neither a CUDA toolkit nor the CUPTI/CUDA-header wheels were found."""


@dataclass(frozen=True)
class CudaPaths:
    cuda_include: Path
    cupti_include: Path
    cupti_lib: Path  # the shared library file itself

    @property
    def include_dirs(self) -> list[str]:
        return sorted({str(self.cuda_include), str(self.cupti_include)})


def _cupti_lib_in(folder: Path) -> Path | None:
    for pattern in ("libcupti.so", "libcupti.so.*"):
        hits = sorted(folder.glob(pattern))
        if hits:
            return hits[0]
    return None


def _from_toolkit(home: Path) -> CudaPaths | None:
    include = home / "include"
    if not (include / "cuda.h").is_file():
        return None
    for inc in (include, home / "extras" / "CUPTI" / "include"):
        if (inc / "cupti.h").is_file():
            for libdir in (home / "lib64", home / "lib", home / "extras" / "CUPTI" / "lib64",
                           home / "targets" / "x86_64-linux" / "lib"):
                lib = _cupti_lib_in(libdir) if libdir.is_dir() else None
                if lib:
                    return CudaPaths(include, inc, lib)
    return None


def _site_dirs() -> list[Path]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d, "nvidia").is_dir()]


def _from_wheels() -> CudaPaths | None:
    for sp in _site_dirs():
        cupti_h = sorted(glob.glob(str(sp / "nvidia" / "**" / "include" / "cupti.h"), recursive=True))
        cuda_h = sorted(glob.glob(str(sp / "nvidia" / "**" / "include" / "cuda.h"), recursive=True))
        if not cupti_h or not cuda_h:
            continue
        cupti_inc = Path(cupti_h[0]).parent
        for libdir in (cupti_inc.parent / "lib", cupti_inc.parent / "lib64"):
            lib = _cupti_lib_in(libdir) if libdir.is_dir() else None
            if lib:
                return CudaPaths(Path(cuda_h[0]).parent, cupti_inc, lib)
    return None


def find_cuda() -> CudaPaths:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_CUDA_HOME]
    for home in homes:
        if home:
            found = _from_toolkit(Path(home))
            if found:
                return found
    found = _from_wheels()
    if found:
        return found
    raise CudaNotFound(
        "cannot build the capture library: no CUDA toolkit with cuda.h, cupti.h and libcupti was "
        "found in $CUDA_HOME or /usr/local/cuda, and the nvidia-cuda-cupti and CUDA header wheels "
        "are not installed (set CUDA_HOME or `pip install nvidia-cuda-cupti nvidia-cuda-runtime`)."
    )


def extension():
    """The setuptools Extension for the injection library (paths resolved at build time)."""
    from setuptools import Extension

    here = Path(__file__).resolve().parent
    return Extension(
        name="capture.libmine_capture",
        sources=[str(Path("capture") / "src" / s) for s in SOURCES],
        depends=[str(Path("capture") / "src" / h) for h in ("mc.h", "tables.h")],
        extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden", "-Wall"],
        libraries=["pthread", "dl"],
        py_limited_api=False,
    ) if here else None


def build_ext_class():
    from setuptools.command.build_ext import build_ext

    class BuildCaptureLib(build_ext):
        """Builds capture/libmine_capture.so: a plain shared library, not a Python module."""

        def get_ext_filename(self, fullname):
            # called with the full dotted name (copying) and with its last part (building)
            if fullname == "capture.libmine_capture":
                return os.path.join("capture", LIB_NAME)
            if fullname == "libmine_capture":
                return LIB_NAME
            return super().get_ext_filename(fullname)

        def get_export_symbols(self, ext):
            if ext.name == "capture.libmine_capture":
                return ["InitializeInjection"]
            return super().get_export_symbols(ext)

        def build_extension(self, ext):
            if ext.name == "capture.libmine_capture":
                try:
                    paths = find_cuda()
                except CudaNotFound as exc:
                    raise SystemExit(f"mine: {exc}") from None
                ext.include_dirs = paths.include_dirs + list(ext.include_dirs)
                libdir = str(paths.cupti_lib.parent)
                ext.extra_link_args = list(ext.extra_link_args) + [
                    f"-L{libdir}", f"-l:{paths.cupti_lib.name}", f"-Wl,-rpath,{libdir}"]
            super().build_extension(ext)

    return BuildCaptureLib
