"""kernels.toml: strict loading, the generator API, checks against cubins and manifests, nvcc builds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.kernels import (KernelsTomlError, MissingKernel, build_table, check_table, load_kernels,
                               variant_name)

from paths import FIXTURES, ROOT

CUBINS = FIXTURES / "cubins"
DBL_SHA = "168b1435e657e696174230945a2fee37de46a0bd8f0476306e65160fe4ed8e3c"

GOOD = f'''
[modules."dbl"]
sha256 = "{DBL_SHA}"
arch = "sm_90a"
source = "src/dbl.cu"

[modules."dbl".entries."dbl"]
params = ["in buffer<f32>", "out buffer<f32>", "i32"]
block = [256, 1, 1]
grid = [{{ ceil_div = ["n", 256] }}, 1, 1]

[modules."vendor_gemm+TILE=128"]
sha256 = "{"ab" * 32}"
arch = "sm_100a"
upstream = {{ project = "somelib", version = "1.2", where = "lib/gemm.cubin", note = "pin only" }}
'''


def _repo(tmp_path: Path, text: str = GOOD) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    shutil.copy(ROOT / "kernels" / "src" / "dbl.cu", tmp_path / "src" / "dbl.cu")
    (tmp_path / "kernels.toml").write_text(text)
    return tmp_path / "kernels.toml"


def test_the_repository_table_loads_and_checks_against_the_fixture_cubins():
    table = load_kernels(ROOT / "kernels.toml")
    assert {"dbl", "dbl+SCALE=3", "abi_probe", "tma_probe"} <= set(table.modules)
    assert table.modules["dbl+SCALE=3"].defines == {"SCALE": "3"}
    assert check_table(table, CUBINS) == []


def test_op_launch_and_module_ref(tmp_path):
    table = load_kernels(_repo(tmp_path))
    assert table.op_launch("dbl", "dbl") == {
        "module": "dbl", "entry": "dbl", "block": [256, 1, 1],
        "grid": [{"ceil_div": ["n", 256]}, 1, 1], "params": ["in buffer<f32>", "out buffer<f32>", "i32"]}
    assert table.module_ref("dbl") == {"source": "dbl.cubin", "sha256": DBL_SHA}
    assert table.by_sha256(DBL_SHA).name == "dbl"
    with pytest.raises(MissingKernel, match="pins no module `nope`"):
        table.op_launch("nope", "dbl")
    with pytest.raises(MissingKernel, match="module `dbl` declares no entry `add`"):
        table.op_launch("dbl", "add")


def test_variant_names_sort_defines():
    assert variant_name("k3_moe", {"TOPK": 16, "EXPERTS": 896}) == "k3_moe+EXPERTS=896+TOPK=16"


@pytest.mark.parametrize("edit, fragment", [
    (lambda t: t.replace('arch = "sm_90a"', 'arch = "sm_90a"\nsurprise = 1'), "unknown key `surprise`"),
    (lambda t: t.replace(DBL_SHA, DBL_SHA.upper()), "sha256: must be 64 lowercase hex"),
    (lambda t: t.replace('arch = "sm_90a"', 'arch = "hopper"'), "arch: must look like sm_90a"),
    (lambda t: t.replace('source = "src/dbl.cu"', 'source = "src/dbl.cu"\ndefines = { SCALE = 3 }'),
     "the defines make the name `dbl+SCALE=3`"),
    (lambda t: t.replace('source = "src/dbl.cu"', 'source = "src/dbl.cu"\nprebuilt = "x.cubin"'),
     "`source` and `prebuilt` are exclusive"),
    (lambda t: t.replace('source = "src/dbl.cu"', ''), "needs `source`, `prebuilt`, or at least `upstream`"),
    (lambda t: t.replace('"i32"]', '"u32"]'), "params: must be a list of kern param types"),
    (lambda t: t.replace('"i32"]', '7]'), "params: must be a list of kern param types"),      # not a string
    (lambda t: t.replace('"i32"]', '["i32"]]'), "params: must be a list of kern param types"),
    (lambda t: t.replace("block = [256, 1, 1]", "block = [2048, 1, 1]"), "at most 1024 threads"),
    (lambda t: t.replace('ceil_div = ["n", 256]', 'ceil_div = ["n", 0]'), "grid: must be three kern expressions"),
    (lambda t: t.replace('where = "lib/gemm.cubin", ', ''), "upstream.where: required text"),
    (lambda t: t.replace("vendor_gemm+TILE=128", "vendor_gemm+TILE"), "`TILE` is not KEY=VALUE"),
    (lambda t: t + '\n[modules."dup"]\nsha256 = "' + DBL_SHA + '"\narch = "sm_90a"\nprebuilt = "d.cubin"\n',
     "same sha256 as `dbl`"),
    (lambda t: "version = 2\n" + t, "unknown top-level key `version`"),
])
def test_loader_is_strict(tmp_path, edit, fragment):
    with pytest.raises(KernelsTomlError) as exc:
        load_kernels(_repo(tmp_path, edit(GOOD)))
    assert fragment in str(exc.value)


def test_every_problem_is_listed_at_once(tmp_path):
    text = GOOD.replace('arch = "sm_90a"', 'arch = "x"').replace("block = [256, 1, 1]", "block = [0, 1, 1]")
    with pytest.raises(KernelsTomlError, match="2 problem"):
        load_kernels(_repo(tmp_path, text))


def test_not_toml(tmp_path):
    with pytest.raises(KernelsTomlError, match="is not valid TOML"):
        load_kernels(_repo(tmp_path, "[modules\n"))


def _rules(table, build_dir=None):
    return [(d.rule, d.path) for d in check_table(table, build_dir)]


def test_check_finds_missing_tampered_and_mismatched_cubins(tmp_path):
    path = _repo(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    assert _rules(load_kernels(path), build) == [("kernels.file", 'modules."dbl".source')]
    shutil.copy(CUBINS / "dbl.cubin", build / "dbl.cubin")
    assert _rules(load_kernels(path), build) == []
    # a cubin with a different kernel: wrong hash, and the declared entry is absent
    shutil.copy(CUBINS / "tma_probe.cubin", build / "dbl.cubin")
    assert _rules(load_kernels(path), build) == [("kernels.sha256", 'modules."dbl".sha256'),
                                                ("kernels.entry", 'modules."dbl".entries.dbl')]
    # declared ABI that does not fit: one param too many
    shutil.copy(CUBINS / "dbl.cubin", build / "dbl.cubin")
    table = load_kernels(_repo(tmp_path, GOOD.replace('"i32"]', '"i32", "i32"]')))
    assert _rules(table, build) == [("abi.param-count", 'modules."dbl".entries.dbl.params')]
    # an sm_100a cubin pinned as sm_90a
    shutil.copy(CUBINS / "tma_probe.sm_100a.cubin", build / "dbl.cubin")
    assert ("kernels.arch", 'modules."dbl".arch') in _rules(load_kernels(path), build)


def test_check_finds_manifest_modules_that_are_not_pinned(tmp_path):
    path = _repo(tmp_path)
    (tmp_path / "manifests" / "toy").mkdir(parents=True)
    doc = {"modules": {"dbl": {"source": "dbl.cubin", "sha256": DBL_SHA},
                       "other": {"source": "o.cubin", "sha256": "cd" * 32}}}
    (tmp_path / "manifests" / "toy" / "toy.json").write_text(json.dumps(doc))
    assert _rules(load_kernels(path)) == [("kernels.unpinned", "manifests/toy/toy.json")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_build_reproduces_the_pins(tmp_path):
    table = load_kernels(ROOT / "kernels.toml")
    built = {b.module: b for b in build_table(table, tmp_path)}
    assert {"abi_probe", "dbl", "dbl+SCALE=3", "tma_probe"} <= set(built)
    assert all(b.matches for b in built.values()), [b for b in built.values() if not b.matches]
    assert (tmp_path / "dbl+SCALE=3.cubin").read_bytes() == (CUBINS / "dbl+SCALE=3.cubin").read_bytes()
    assert check_table(table, tmp_path) == []


def _mine(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mine.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_kernels_check_and_user_errors(tmp_path):
    ok = _mine("kernels", "check", str(CUBINS))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = _mine("kernels", "check", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    bad = _repo(tmp_path, GOOD.replace('arch = "sm_90a"', 'arch = "x"'))
    res = _mine("kernels", "check", "--toml", str(bad))
    assert res.returncode == 2 and "arch: must look like sm_90a" in res.stderr and "Traceback" not in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    found = _mine("kernels", "check", str(empty))
    assert found.returncode == 1 and "kernels.file" in found.stdout
