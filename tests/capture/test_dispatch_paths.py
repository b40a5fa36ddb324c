"""Every dispatch path of the capture library, driven on CPU: each row of the one callback table.

tests/helpers/harness_dispatch.c (mode `all`) walks the library's own table (capture/src/tables.h,
generated from vocab/capture_tables.py) and makes, for each row, a call shaped like the real one:
every launch API, every kernel-node call, every module-load call, every allocation / free /
mapping call, every tensor-map encode, every stream-capture begin and end, instantiate, graph
launch and destroy; then the resource callbacks and the toggler. For each row it says what the
dump must then hold; here each claim is checked against the files, in both record forms, and
the set of rows driven is checked against the Python table, so a row added to the table without
a path here (or a path the library lost) fails. What needs the real driver and CUPTI is proven by
tests/capture/test_capture_gpu.py on the GPU.
"""

from __future__ import annotations

import pytest

import dispatch_harness as H
from mining.load import load_dump, read_meta
from vocab import capture_tables as T

KNOBS = ("compact", "alloc_log", "selftime", "alternate=1000000", "toggle=1")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return H.build_dispatch_harness(tmp_path_factory.mktemp("dispatch_paths"))


def _expected_attrs() -> dict:
    """The launch attributes the harness sets on its cuLaunchKernelEx calls (all of the table's,
    and one it does not know), as launch_attrs must read them."""
    special = {"cluster": [2, 1, 1], "preferred_cluster": [4, 2, 1], "priority": -3, "smem_carveout": 50,
               "pdl_event": {"event": "0xe1", "flags": 1, "trigger_at_block_start": 1},
               "completion_event": {"event": "0xe2", "flags": 3}, "mem_sync_domain_map": [1, 0]}
    out = {a.key: special.get(a.key, 1) for a in T.LAUNCH_ATTRS}
    out["attr_13"] = "5c" * 64
    return out


def _matches(rec: dict, want: dict) -> bool:
    for k, v in want.items():
        if k == "all_attrs":
            if rec.get("launch_attrs") != _expected_attrs():
                return False
        elif rec.get(k) != v:
            return False
    return True


@pytest.fixture(scope="module", params=["json", "bin"])
def run(request, harness, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"all_{request.param}")
    lines, err = H.run_all(harness, out, request.param, *KNOBS)
    (pid_dir,) = out.glob("pid*")
    return request.param, lines, err, pid_dir, H.read_dump(pid_dir)


def test_every_row_of_the_table_is_driven(run):
    form, lines, err, _, _ = run
    assert err == "" and not [x for x in lines if "error" in x]
    rows = [x for x in lines if "name" in x]
    assert [x["name"] for x in rows] == [c.name for c in T.CALLBACKS]
    assert [x["family"] for x in rows] == [c.family.upper() for c in T.CALLBACKS]
    assert {n for x in rows for n in x["expect"]} == {"launches", "graphs", "allocs", "tensormaps", "modules",
                                                      "copies"}


def test_what_each_row_did_is_in_the_dump(run):
    form, lines, _, _, files = run
    for x in (x for x in lines if "name" in x):
        for name, wants in x["expect"].items():
            for want in wants:
                assert any(_matches(r, want) for r in files[name]), (x["name"], name, want)


def test_kernel_node_events_name_their_launch_record(run):
    _, _, _, _, files = run
    by_seq = {r["seq"]: r for r in files["launches"]}
    nodes = [g for g in files["graphs"] if g["event"] == "kernel_node"]
    assert sorted(g["api"] for g in nodes) == sorted(c.name for c in T.CALLBACKS if c.family == "kernel_node")
    assert all(by_seq[g["seq"]]["api"] == g["api"] for g in nodes)


def test_launch_api_names_are_the_tables(run):
    _, _, _, _, files = run
    assert {r["api"] for r in files["launches"]} == set(T.API_NAMES)


def test_captured_launches_lie_between_their_capture_events(run):
    _, _, _, _, files = run
    ends = [g for g in files["graphs"] if g["event"] == "capture_end"]
    assert len(ends) == sum(c.kind in ("CAPTURE_BEGIN", "CAPTURE_END") for c in T.CALLBACKS)
    by_seq = {r["seq"]: r for r in files["launches"]}
    for g in ends:
        assert g["seq_first"] == g["seq_last"] and by_seq[g["seq_first"]]["graph"]["capture_id"] == g["capture_id"]


def test_a_parameter_equal_to_an_encoded_tensor_map_is_linked_to_it(run):
    form, lines, _, _, files = run
    (sym,) = [x["tmap_launch"]["symbol"] for x in lines if "tmap_launch" in x]
    (rec,) = [r for r in files["launches"] if r.get("symbol") == sym]
    tiled = [t["seq"] for t in files["tensormaps"] if t["api"] == "cuTensorMapEncodeTiled"]
    if form == "json":
        assert rec["params"][0]["tmap"] == [{"at": 0, "encode": tiled[0]}]
    else:   # the binary form leaves the link to content matching (docs/dump-format.md)
        assert "tmap" not in rec["params"][0] and len(rec["params"][0]["hex"]) == 256


def test_enabling_follows_the_table(run):
    _, lines, _, _, _ = run
    (enabled,) = [x["enabled"] for x in lines if "enabled" in x]
    assert enabled == [c.name for c in T.CALLBACKS]   # all of them with the allocation log on
    assert [x["resource_enabled"] for x in lines if "resource_enabled" in x] == [[1, 1, 1]]


def test_the_toggler_switches_exactly_the_launch_apis_and_meta_json_loads(run):
    _, lines, _, pid_dir, files = run
    (toggled,) = [x["toggled"] for x in lines if "toggled" in x]
    assert toggled == [c.name for c in T.CALLBACKS if c.family == "launch"]
    (meta,) = files["meta"]
    assert meta["options"]["toggle_ms"] == 1 and len(meta["toggles"]) >= 2
    assert [on for _, on in meta["toggles"]] == [i % 2 for i in range(len(meta["toggles"]))]  # off first
    warnings: list[str] = []
    assert read_meta(pid_dir, warnings)["toggles"] == meta["toggles"] and warnings == []


def test_the_dump_loads(run):
    _, _, _, pid_dir, files = run
    d = load_dump(pid_dir, cache=False)
    assert len(d.launches) == len(files["launches"])
    assert d.meta["counters"]["launches_recorded"] == len(files["launches"])
    assert not [w for w in d.warnings if "unknown" in w or "wrong type" in w]


@pytest.mark.parametrize("knob,enabled", [("modules_only", "ALWAYS"), ("", "LAUNCHES")])
def test_without_the_allocation_log_or_with_modules_only_fewer_callbacks_are_enabled(harness, tmp_path, knob,
                                                                                     enabled):
    lines, _ = H.run_all(harness, tmp_path, "json", *([knob] if knob else []))
    (got,) = [x["enabled"] for x in lines if "enabled" in x]
    want = ("ALWAYS",) if enabled == "ALWAYS" else ("ALWAYS", "LAUNCHES", "COPY_LOG")   # the harness turns the copy log on
    assert got == [c.name for c in T.CALLBACKS if c.enable in want]


def test_resource_callbacks_write_modules_and_devices(run):
    _, lines, _, _, files = run
    (unloaded,) = [x["unloaded"] for x in lines if "unloaded" in x]
    loads = {m["module"]: m for m in files["modules"] if m["event"] == "load"}
    (unload,) = [m for m in files["modules"] if m["event"] == "unload"]
    assert unload["module"] == unloaded and unload["sha256"] == loads[unloaded]["sha256"]
    assert all(m["entries"] == ["mine_argmax_rows"] for m in loads.values())
    (meta,) = files["meta"]
    assert [d["name"] for d in meta["devices"]] == ["Fake GPU"]   # asked once the context existed


def test_noop_records_nothing(harness, tmp_path):
    H.run_all(harness, tmp_path, "json", "noop", "alloc_log")
    (pid_dir,) = tmp_path.glob("pid*")
    files = H.read_dump(pid_dir)
    assert files["launches"] == files["graphs"] == files["allocs"] == files["tensormaps"] == files["copies"] == []
    assert files["meta"][0]["options"]["noop"] == 1 and files["meta"][0]["counters"]["launches"] == 0
