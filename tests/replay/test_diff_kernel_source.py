"""The device compare's kernel ships as PTX beside the replay package (`replay/kernels/diff.ptx`):
the driver JITs it where the replay runs, so no compiler is needed there. These checks run on the
CPU: the file is found the way `Gpu.diff` finds it, it declares the entry `Gpu.diff` asks for with
the five parameters it packs, it matches its source, and the package data ships it."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _entry_params(ptx: str, name: str) -> list[str]:
    m = re.search(r"\.entry\s+" + name + r"\s*\((.*?)\)", ptx, re.S)
    assert m, f"{name} is not an entry of the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


def test_the_packaged_ptx_declares_the_entry_the_replay_loads():
    ptx = files("replay").joinpath("kernels/diff.ptx").read_text()
    assert re.search(r"^\.version\s+\d+\.\d+", ptx, re.M)
    target = re.search(r"^\.target\s+sm_(\d+)", ptx, re.M)
    assert target and int(target.group(1)) <= 80, "the PTX must JIT on every GPU from Ampere on"
    # Gpu.diff packs a, b (u64), words (u64), shift (u32), flags (u64)
    assert _entry_params(ptx, "mine_diff_chunks") == ["u64", "u64", "u64", "u32", "u64"]


def test_the_ptx_is_built_from_the_committed_source():
    src = (ROOT / "replay" / "kernels" / "diff.cu").read_text()
    assert 'extern "C" __global__ void mine_diff_chunks(' in src
    assert "diff.ptx" in (ROOT / "replay" / "kernels" / "build.sh").read_text()


def test_the_package_data_ships_the_kernels():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "kernels/*.ptx" in data["replay"]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
def test_the_ptx_assembles_for_hopper(tmp_path):
    ptx = files("replay").joinpath("kernels/diff.ptx")
    got = subprocess.run(["ptxas", "-arch=sm_90", "-o", str(tmp_path / "d.cubin"), str(ptx)],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
