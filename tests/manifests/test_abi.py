"""Offline ABI check against cubins built here from kernels/src (see tests/fixtures/cubins/README.md).

The layout facts asserted first come from the kernels' C signatures; the manifest tests start from
one base manifest that kern-llm accepts and mutate one field per rule.
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from manifests.abi import check_abi, param_size
from manifests.nvinfo import CubinError, read_cubin

from kern_verdicts import kern_violations
from paths import FIXTURES

CUBINS = FIXTURES / "cubins"


def _sha(name: str) -> str:
    return hashlib.sha256((CUBINS / name).read_bytes()).hexdigest()


def _layout(cubin: str, entry: str):
    k = read_cubin(CUBINS / cubin).kernels[entry]
    return [(p.offset, p.size) for p in k.params]


def test_layouts_match_the_c_signatures():
    # (float*, char, long long, int, float)
    assert _layout("abi_probe.cubin", "probe_scalars") == [(0, 8), (8, 1), (16, 8), (24, 4), (28, 4)]
    # (unsigned char, float*, int): the pointer is 8-aligned after a 1-byte param
    assert _layout("abi_probe.cubin", "probe_u8_then_ptr") == [(0, 1), (8, 8), (16, 4)]
    assert _layout("abi_probe.cubin", "probe_struct16") == [(0, 8), (8, 16), (24, 4)]
    assert _layout("abi_probe.cubin", "probe_struct40") == [(0, 4), (8, 40), (48, 8)]
    assert _layout("abi_probe.cubin", "probe_struct1024") == [(0, 1024), (1024, 8), (1032, 4)]


def test_tensormap_is_aligned_on_the_constant_bank_not_the_param_list():
    sm90 = read_cubin(CUBINS / "tma_probe.cubin")
    sm100 = read_cubin(CUBINS / "tma_probe.sm_100a.cubin")
    assert (sm90.sm, sm100.sm) == (90, 100)
    k90, k100 = sm90.kernels["probe_tensormap"], sm100.kernels["probe_tensormap"]
    assert [(p.offset, p.size) for p in k90.params] == [(112, 128), (240, 8), (248, 4)]
    assert [(p.offset, p.size) for p in k100.params] == [(0, 128), (128, 8), (136, 4)]
    # param bases 0x210 and 0x380: the descriptor lands on a 128-aligned address in both
    assert (k90.cbank_offset + 112) % 128 == 0 and (k100.cbank_offset + 0) % 128 == 0


def test_registers_shared_and_launch_bounds():
    kernels = read_cubin(CUBINS / "abi_probe.cubin").kernels
    assert kernels["probe_bounded"].max_threads == (128, 1, 1)
    assert kernels["probe_ptrs"].max_threads is None
    assert all(k.registers and 1 <= k.registers <= 255 for k in kernels.values())
    # 64 floats of static shared on top of what every kernel of this module reports
    assert kernels["probe_shared"].static_shared - kernels["probe_ptrs"].static_shared == 256
    assert kernels["probe_scalars"].param_bytes == 32


def test_not_a_cubin_is_one_clear_error(tmp_path):
    bad = tmp_path / "x.cubin"
    bad.write_bytes(b"not an elf at all")
    with pytest.raises(CubinError, match="not a readable cubin"):
        read_cubin(bad)


def test_param_sizes():
    assert [param_size(t) for t in ("i32", "f32", "i64", "u8", "in buffer<bf16>", "inout state", "bytes<40>")] == [
        4, 4, 8, 1, 8, 8, 40]
    assert param_size("u32") is None


def _launch(entry, params=None, args=None, module="probe", block=(256, 1, 1), **extra):
    out = {"module": module, "entry": entry, "block": list(block), "grid": [{"ceil_div": ["n", 256]}, 1, 1]}
    if params is not None:
        out["params"] = params
    if args is not None:
        out["args"] = args
    out.update(extra)
    return out


@pytest.fixture
def base() -> dict:
    tmap = {"at": 0, "tensormap": {"param": 0, "dtype": "f32", "dims": [1024], "box": [256]}}
    return {
        "schema_version": 7, "model": "abi-probe",
        "vars": {"n": {"max": 1024}},
        "buffers": {"x": {"dtype": "f32", "shape": [1024], "kind": "input"},
                    "y": {"dtype": "f32", "shape": [1024], "kind": "output"}},
        "modules": {"probe": {"source": "abi_probe.cubin", "sha256": _sha("abi_probe.cubin")},
                    "tma": {"source": "tma_probe.cubin", "sha256": _sha("tma_probe.cubin")}},
        "ops": {
            "ptrs": {"params": ["in buffer<f32>", "out buffer<f32>", "i32"],
                     "impl": {"launches": [_launch("probe_ptrs")]}},
            "scalars": {"params": ["out buffer<f32>", "i32"], "impl": {"launches": [_launch(
                "probe_scalars", ["out buffer<f32>", "u8", "i64", "i32", "f32"],
                [{"param": 0}, {"u8": 3}, {"i64": 7}, {"param": 1}, {"f32": 0.5}])]}},
            "struct40": {"params": ["out buffer<f32>", "i32"], "impl": {"launches": [_launch(
                "probe_struct40", ["i32", "bytes<40>", "out buffer<f32>"],
                [{"param": 1}, {"pack": {"size": 40, "fields": [{"at": 0, "f32": 1.0}]}}, {"param": 0}])]}},
            "bounded": {"params": ["out buffer<f32>", "i32"],
                        "impl": {"launches": [_launch("probe_bounded", block=(128, 1, 1))]}},
            "tmap": {"params": ["in buffer<f32>", "out buffer<f32>", "i32"], "impl": {"launches": [_launch(
                "probe_tensormap", ["bytes<128>", "out buffer<f32>", "i32"],
                [{"pack": {"size": 128, "fields": [tmap]}}, {"param": 1}, {"param": 2}],
                module="tma", shared_mem=4096)]}},
        },
        "programs": {"main": {"calls": [
            {"op": "ptrs", "args": [{"buf": "x"}, {"buf": "y"}, {"var": "n"}]},
            {"op": "scalars", "args": [{"buf": "y"}, {"var": "n"}]},
            {"op": "struct40", "args": [{"buf": "y"}, {"var": "n"}]},
            {"op": "bounded", "args": [{"buf": "y"}, {"var": "n"}]},
            {"op": "tmap", "args": [{"buf": "x"}, {"buf": "y"}, {"var": "n"}]},
        ]}},
    }


def test_base_manifest_passes_kern_and_the_abi_check(base, tmp_path):
    assert kern_violations(base, CUBINS, tmp_path) == []
    assert check_abi(base, CUBINS) == []


def _rules(manifest):
    return [(d.rule, d.path) for d in check_abi(manifest, CUBINS)]


def _launch_of(m, op):
    return m["ops"][op]["impl"]["launches"][0]


MUTATIONS = {
    "entry": (lambda m: _launch_of(m, "ptrs").update(entry="probe_nothing"),
              [("abi.entry", "$.ops.ptrs.impl.launches[0].entry")]),
    "count": (lambda m: m["ops"]["ptrs"]["params"].append("i32"),
              [("abi.param-count", "$.ops.ptrs.impl.launches[0].params")]),
    # i32 where the kernel takes a char: both the size and (for the next param) nothing else
    "size": (lambda m: _launch_of(m, "scalars")["params"].__setitem__(1, "i32"),
             [("abi.param-size", "$.ops.scalars.impl.launches[0].params[1]")]),
    # a 40-byte aggregate declared as 36 bytes: size wrong, and the pointer after it is found
    # at 48 where natural alignment after 8 + 40 would also put it, so only the size is reported
    "bytes": (lambda m: _launch_of(m, "struct40")["params"].__setitem__(1, "bytes<36>"),
              [("abi.param-size", "$.ops.struct40.impl.launches[0].params[1]")]),
    # i64 declared where the kernel has i32 + f32: the kernel's f32 is at 28, not 8-aligned
    "offset": (lambda m: _launch_of(m, "scalars")["params"].__setitem__(4, "i64"),
               [("abi.param-size", "$.ops.scalars.impl.launches[0].params[4]"),
                ("abi.param-offset", "$.ops.scalars.impl.launches[0].params[4]")]),
    "tensormap": (lambda m: _launch_of(m, "tmap")["args"][0]["pack"]["fields"][0].update(at=32),
                  [("abi.tensormap", "$.ops.tmap.impl.launches[0].args[0].pack.fields[0]")]),
    "block": (lambda m: _launch_of(m, "bounded").update(block=[256, 1, 1]),
              [("abi.block", "$.ops.bounded.impl.launches[0].block")]),
    "shared": (lambda m: _launch_of(m, "tmap").update(shared_mem={"mul": ["n", 256]}),
               [("abi.shared-mem", "$.ops.tmap.impl.launches[0].shared_mem")]),
    "sha": (lambda m: m["modules"]["probe"].update(sha256="0" * 64),
            [("abi.sha256", "$.modules.probe.sha256")]),
    "file": (lambda m: m["modules"]["tma"].update(source="missing.cubin"),
             [("abi.module-file", "$.modules.tma")]),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_one_mutation_one_rule(base, name):
    mutate, expected = MUTATIONS[name]
    m = copy.deepcopy(base)
    mutate(m)
    assert _rules(m) == expected


def test_kern_accepts_what_only_the_abi_check_catches(base, tmp_path):
    """The verifier cannot see a cubin's layout: a wrong-size scalar passes kern's verify."""
    m = copy.deepcopy(base)
    MUTATIONS["size"][0](m)
    _launch_of(m, "scalars")["args"][1] = {"i32": 3}
    assert kern_violations(m, CUBINS, tmp_path) == []
    assert [d.rule for d in check_abi(m, CUBINS)] == ["abi.param-size"]


def test_every_problem_is_collected(base):
    m = copy.deepcopy(base)
    for name in ("entry", "size", "block", "sha"):
        MUTATIONS[name][0](m)
    assert sorted(r for r, _ in _rules(m)) == ["abi.block", "abi.entry", "abi.param-size", "abi.sha256"]


def test_cli_reports_findings_with_exit_1(base, tmp_path):
    import subprocess
    import sys

    m = copy.deepcopy(base)
    MUTATIONS["entry"][0](m)
    (tmp_path / "m.json").write_text(json.dumps(m))
    res = subprocess.run([sys.executable, "-m", "mine.cli", "abi", str(tmp_path / "m.json"), "--kernels", str(CUBINS)],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "[abi.entry]" in res.stdout
    res = subprocess.run([sys.executable, "-m", "mine.cli", "abi", str(tmp_path / "m.json"), "--kernels",
                          str(tmp_path / "none")], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
