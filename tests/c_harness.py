"""Build a C test harness around some of the capture library's sources (no GPU, no libcuda).

The writer, record and allocation-log tests each compile their harness text together with the
library files under test, with the CUDA and CUPTI headers `capture.build_support` finds and
warnings as errors, so the tests exercise exactly the code the injected library ships.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from capture import build_support

SRC = Path(__file__).resolve().parent.parent / "capture" / "src"


def build(folder: Path, harness: str, *sources: str) -> Path:
    """Compile `harness` (C text) with capture/src/<sources> into folder/harness; its path."""
    src = folder / "harness.c"
    src.write_text(harness)
    paths = build_support.find_cuda()
    exe = folder / "harness"
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-Wall", "-Werror", "-pthread", f"-I{paths.cuda_include}",
                    f"-I{paths.cupti_include}", f"-I{SRC}", str(src), *(str(SRC / s) for s in sources),
                    "-o", str(exe)], check=True)
    return exe
