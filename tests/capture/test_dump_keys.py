"""Every key the capture library writes is documented in docs/dump-format.md and read by the loader.

Why: the writer, the reader and the docs drifted apart (the library wrote meta.json `toggles`,
which the loader refused as an unknown key; the `no_memory` drop reason was missing from the
docs). The dispatch harness (tests/helpers/harness_dispatch.c, every library source linked, the
real meta.json writer included) is run with every knob that adds a key -- the compact and binary
forms, the allocation log, self timing, alternation, the toggler, noop, the default form, and an
allocation failure that turns capture off -- and every key of every file it leaves must be named
in that file's section of the docs; every meta.json must be read by `mining.load.read_meta`
without a warning. The writer's source is checked too, for keys no run happened to emit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

import dispatch_harness as H
from capture import knobs
from mining.load import META_KEYS, load_dump, read_meta
from paths import ROOT
from vocab import capture_tables as T

DOC = (ROOT / "docs" / "dump-format.md").read_text()
RUNS = {
    "full": ("json", "compact", "alloc_log", "selftime", "alternate=1000000", "toggle=1"),
    "bin": ("bin", "toggle=1"),
    "default": ("json",),
    "noop": ("json", "noop", "alloc_log"),
}
SECTIONS = {"meta": "meta.json", "launches": "launches.jsonl", "functions": "Compact form",
            "graphs": "graphs.jsonl", "tensormaps": "tensormaps.jsonl", "allocs": "Allocation log",
            "modules": "modules.jsonl", "copies": "Copy log"}


def _section(title: str) -> str:
    """The text of the `## <title>...` section (up to the next `## `)."""
    m = re.search(rf"^## {re.escape(title)}\b.*?(?=^## )", DOC, re.S | re.M)
    assert m, f"docs/dump-format.md has no section '## {title}'"
    return m.group(0)


def _documented(title: str) -> set[str]:
    """The words inside the section's code spans (`...`)."""
    return {w for span in re.findall(r"`([^`]+)`", _section(title)) for w in re.findall(r"\w+", span)}


def _keys(value, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            out.add("attr_" if re.fullmatch(r"attr_\d+", k) else k)
            _keys(v, out)
    elif isinstance(value, list):
        for v in value:
            _keys(v, out)
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    harness = H.build_dispatch_harness(tmp_path_factory.mktemp("keys"))
    out = {}
    for name, (form, *knob) in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        H.run_all(harness, folder, form, *knob)
        (pid_dir,) = folder.glob("pid*")
        out[name] = pid_dir
    # a tensor-parallel worker's environment: meta.json's `env` (tests/capture/test_meta_rank.py)
    folder = tmp_path_factory.mktemp("rank")
    r = subprocess.run([str(harness), "all", str(folder), "json", str(H.CUBIN)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert r.returncode == 0, r.stderr
    (out["rank"],) = folder.glob("pid*")
    # an allocation failure half-way through the oom run: capture turns off, meta.json says why
    clean = subprocess.run([str(harness), "oom", str(tmp_path_factory.mktemp("clean")), "json", "0", str(H.CUBIN)],
                           capture_output=True, text=True, timeout=60)
    total = json.loads(clean.stdout.splitlines()[-1])["allocs"]
    folder = tmp_path_factory.mktemp("off")
    r = subprocess.run([str(harness), "oom", str(folder), "json", str(total // 2), str(H.CUBIN)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "capture off" in r.stderr
    (out["off"],) = folder.glob("pid*")
    return out


def test_every_meta_key_is_emitted_documented_and_accepted(dumps):
    seen: set[str] = set()
    for name, pid_dir in dumps.items():
        warnings: list[str] = []
        meta = read_meta(pid_dir, warnings)
        assert warnings == [], (name, warnings)
        assert set(meta) <= META_KEYS, name
        seen |= set(meta)
    assert seen == set(T.META_KEYS) == set(META_KEYS)   # each key of the table is one the writer emits
    doc = _documented("meta.json")
    assert sorted(k for k in seen if k not in doc) == []


def test_options_counters_and_drop_reasons_are_documented(dumps):
    metas = [json.loads((d / "meta.json").read_text()) for d in dumps.values()]
    doc = _documented("meta.json")
    options = {k for m in metas for k in m["options"]}
    counters = {k for m in metas for k in m.get("counters", {})}
    drops = {k for m in metas for k in m.get("counters", {}).get("dropped", {})}
    assert {"noop", "alternate", "toggle_ms", "compact", "format"} <= options
    assert {"functions", "self_ns", "self_launches", "alloc_events", "alloc_dropped"} <= counters
    assert drops == set(T.DROP_REASONS)
    assert sorted((options | counters | drops) - doc) == []
    assert json.loads((dumps["off"] / "meta.json").read_text())["disabled"] == "malloc failed with code 12"


def test_every_name_counters_errors_can_hold_is_documented():
    mc_h = (ROOT / "capture" / "src" / "mc.h").read_text()
    lists = re.findall(r"#define MC_(?:DRIVER|CUPTI)_FUNCS\(X\)(.*?)(?:\n\n|\ntypedef)", mc_h, re.S)
    names = {n for body in lists for n in re.findall(r"X\((\w+)\)", body)}
    assert "malloc" in names and "cuPointerGetAttributes" in names
    assert sorted(names - _documented("meta.json")) == []


def test_every_key_the_meta_writer_spells_is_documented():
    """init.c's meta.json writer, read as text: a key added there without the docs fails here
    even before a run emits it."""
    init = (ROOT / "capture" / "src" / "init.c").read_text()
    body = init[init.index("void mc_meta_write("):]
    spelt = set(re.findall(r'\\"(\w+)\\":', body))
    assert {"toggle_ms", "counters", "disabled"} <= spelt
    assert sorted(spelt - _documented("meta.json")) == []


@pytest.mark.parametrize("run", ["full", "bin", "default"])
def test_every_record_key_is_documented_in_its_files_section(dumps, run):
    files = H.read_dump(dumps[run])
    for name, title in SECTIONS.items():
        keys = _keys(files[name], set())
        if name == "meta":
            keys = set(files[name][0])  # the top level (options and counters: above)
        assert keys or (run == "default" and name in ("functions", "allocs")), (run, name)
        assert sorted(keys - _documented(title)) == [], (run, title)


@pytest.mark.parametrize("run", ["full", "bin", "default"])
def test_the_loader_reads_every_run(dumps, run):
    files = H.read_dump(dumps[run])
    d = load_dump(dumps[run], cache=False)
    assert len(d.launches) == len(files["launches"]) > 0
    assert not [w for w in d.warnings if "unknown" in w or "wrong type" in w or "dropped" in w]


def test_every_knob_and_api_name_is_documented():
    knob_doc = _documented("Capture knobs")
    assert sorted(k.env for k in knobs.KNOBS if k.env not in knob_doc) == []
    launches = _documented("launches.jsonl") | _documented("Binary launch records")
    assert sorted(set(T.API_NAMES) - launches) == []
    recorded = _documented("What is recorded") | _documented("Allocation log")
    spelled = {w.split("[")[0] for w in recorded}
    missing = [c.name for c in T.CALLBACKS
               if c.name not in spelled and c.name.replace("_ptsz", "").replace("_v2", "") not in spelled]
    assert missing == []


def test_every_allocation_log_event_is_documented_with_its_calls():
    rows = [line for line in _section("Allocation log").splitlines() if line.startswith("| `")]
    for c in T.CALLBACKS:
        if not c.log:
            continue
        row = [r for r in rows if f"`{c.log.event}`" in r.split("|")[1]]
        assert row, f"allocs.jsonl event {c.log.event} is not in the docs' event table"
        names = {w.split("[")[0] for r in row for w in re.findall(r"`([^`]+)`", r.split("|")[2])}
        assert c.name in names or c.name.replace("_ptsz", "").replace("_v2", "") in names, (c.log.event, c.name)
