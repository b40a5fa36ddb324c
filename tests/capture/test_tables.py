"""The capture's per-API tables are stated once (vocab/capture_tables.py) and agree with CUDA.

Why: the launch API names, the callback-id lists and the launch attribute ids used to be written
in C (three callback lists, the toggler counting on their order) and again in Python (bare
numbers). Now the C header is generated from the Python table; these tests check that the
committed header is the table's, that every name in it is a real CUPTI callback id and every
number a real CUDA value (the C build asserts the struct layouts; see capture/src/dispatch.c),
and that no other copy of a table is left in the library or the readers.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vocab import binfmt
from capture import build_support
from paths import ROOT
from vocab import capture_tables as T


def test_the_committed_header_is_the_tables():
    assert T.HEADER.read_text() == T.render_header()
    r = subprocess.run([sys.executable, "-m", "vocab.capture_tables", "--check"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def _cuda_text(name: str) -> str:
    paths = build_support.find_cuda()
    for folder in (paths.cupti_include, paths.cuda_include):
        if (folder / name).is_file():
            return (folder / name).read_text(errors="replace")
    pytest.fail(f"{name} not found next to cupti.h / cuda.h")


def test_every_callback_is_a_cupti_callback_id():
    cbids = set(re.findall(r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=", _cuda_text("cupti_driver_cbid.h")))
    assert [c.name for c in T.CALLBACKS if c.name not in cbids] == []
    res = _cuda_text("cupti_callbacks.h")
    assert [r for r in T.RESOURCE_CALLBACKS if f"CUPTI_CBID_RESOURCE_{r}" not in res] == []


def test_launch_attribute_ids_are_cudas():
    ids = {m[0]: int(m[1]) for m in re.findall(r"CU_LAUNCH_ATTRIBUTE_(\w+)\s*=\s*(\d+)", _cuda_text("cuda.h"))}
    assert {a.cu_name: a.id for a in T.LAUNCH_ATTRS} == {a.cu_name: ids.get(a.cu_name) for a in T.LAUNCH_ATTRS}
    assert {a.shape for a in T.LAUNCH_ATTRS} <= set(T.ATTR_SHAPES)
    assert len({a.key for a in T.LAUNCH_ATTRS}) == len(T.LAUNCH_ATTRS)


def test_the_table_is_consistent():
    names = [c.name for c in T.CALLBACKS]
    assert len(names) == len(set(names))
    assert T.API_NAMES == tuple(names[:len(T.API_NAMES)]) and len(T.API_NAMES) < 256   # the api byte
    assert {c.family for c in T.CALLBACKS if c.name in T.API_NAMES} == {"launch", "kernel_node"}
    assert all(c.enable in T.ENABLES for c in T.CALLBACKS)
    assert all(c.kind in T.KIND_FAMILY for c in T.CALLBACKS)
    assert set(T.KIND_FAMILY) == {c.kind for c in T.CALLBACKS}
    assert "no_memory" in T.DROP_REASONS and "toggles" in T.META_KEYS


def test_the_readers_use_the_table():
    assert binfmt.API_NAMES is T.API_NAMES
    assert binfmt.api_name(7) == "cuGraphAddKernelNode_v2" and binfmt.api_name(200) == "api_200"
    from mining.load import META_KEYS
    assert META_KEYS == frozenset(T.META_KEYS)


def _sources(*globs: str) -> dict[str, str]:
    out = {}
    for g in globs:
        for p in ROOT.glob(g):
            out[str(p.relative_to(ROOT))] = p.read_text()
    return out


def test_no_other_copy_of_a_table():
    """An API name, a callback id or an attribute id appears in the library's C only through
    tables.h, and a launch API's name in no Python module but the table's."""
    c = _sources("capture/src/*.c")
    for path, text in c.items():
        spelt = [n for n in (cb.name for cb in T.CALLBACKS) if f'"{n}"' in text]
        assert spelt == [], f"{path} spells API names {spelt[:3]}; use tables.h"
        listed = re.findall(r"CUPTI_DRIVER_TRACE_CBID_cu\w+", text)
        assert listed == [], f"{path} lists callback ids {listed[:3]}...; use tables.h"
        assert not re.search(r"case\s+CU_LAUNCH_ATTRIBUTE_\w+", text), f"{path} decodes attributes by hand"
    py = _sources("capture/*.py", "mining/*.py", "vocab/*.py", "mine/*.py")
    holders = [p for p, text in py.items() if "cuGraphExecKernelNodeSetParams_v2" in text]
    assert holders == ["vocab/capture_tables.py"]


def test_the_allocation_log_rows_are_well_formed():
    """Every logged call says how its event's base, size and handle are read (alloc.c expands
    these rows into its parameter reading; the dispatch harness checks each one's record)."""
    for c in T.CALLBACKS:
        assert (c.log is not None) == (c.family in ("free", "alloc", "alloc_log")), c.name
        if c.log:
            for spec in (c.log.base, c.log.size, c.log.handle):
                mode, _, field = spec.partition(":")
                assert mode in T.READS and bool(field) == (mode in ("in", "ptr", "out", "outv")), (c.name, spec)
    assert {c.log.event for c in T.CALLBACKS if c.at_entry} == {"free", "release", "unmap", "ipc_close",
                                                                 "unreserve", "host_free", "host_unregister"}
