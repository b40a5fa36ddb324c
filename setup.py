"""Builds the capture injection library (capture/libmine_capture.so) during `pip install`.

Everything else about the package lives in pyproject.toml. The library is a plain shared library
loaded by the CUDA driver (CUDA_INJECTION64_PATH), so the build command gives it a fixed name
without the Python ABI suffix; capture/build_support.py finds CUDA and CUPTI.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "capture"))
import build_support  # noqa: E402  (capture/build_support.py, importable before install)

setup(
    ext_modules=[build_support.extension()],
    cmdclass={"build_ext": build_support.build_ext_class()},
)
