"""`when` splits (compiler.builds): a call launched by row range, on real captures and planted ones.

Real captures: q12e and q36e (vLLM's fused_add_rms_norm launches another block above a row count)
compile, pass our verifier, kern-llm's and the ABI check; in every prefill forward the capture
holds, the launch whose range holds the forward's rows is the one the engine launched. Captures
without such a call emit no `when`. Simulated dumps (tests/helpers/dumpsim.py, its random seed
pinned) with planted builds whose thresholds are known: a block switch, a grid capped at a row
count (one call, two pieces), another module above a row count (forwards joining the program);
the boundaries must be the documented rule's over the rows the capture holds, with the gaps left
open said so; interleaved builds are refused (block) or left out (module) with the row counts, and
builds with another parameter list are refused (one op's launches share its interface).
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from paths import FIXTURES

from compiler import builds
from compiler.compile import compile_capture, write
from compiler.errors import CompileError
from manifests.kern_oracle import quiet_stderr, verdict
from manifests.verify import verify
from kern_verdicts import kern_violations

SUITE = FIXTURES / "suite"
NORM = "rms_norm_kernel"      # the simulator's kernels the plants change
SILU = "silu_and_mul_kernel"
EMBED = "embed_kernel"


# ------------------------------------------------------------------ the rule, on plain numbers
def test_ranges_follow_the_rule_and_say_open_gaps():
    tokens = [8, 34, 85, 175, 512, 176]
    groups = builds.order(tokens, ["a", "a", "a", "b", "b", "b"])
    bs = builds.ranges(tokens, groups, [[], []])
    assert [b.seen for b in bs] == [[8, 34, 85], [175, 176, 512]]
    assert [b.when for b in bs] == [(1, 174), (175, None)]
    assert bs[0].open is None and bs[1].open == (86, 175)       # the threshold lies in 86..175
    # neighbouring row counts pin it
    tokens = [3, 4, 9]
    bs = builds.ranges(tokens, builds.order(tokens, [1, 2, 3]), [[], [], []])
    assert [b.when for b in bs] == [(1, 3), (4, 8), (9, None)] and [b.open for b in bs] == [None, None, (5, 9)]


def test_interleaved_builds_are_named_with_their_rows():
    with pytest.raises(builds.Interleaved, match=r"rows 8, 85.*rows 34") as exc:
        builds.order([8, 34, 85], ["a", "b", "a"])
    assert "\n" not in str(exc.value)
    assert not builds.separable([5, 5], ["a", "b"])              # one row count, two builds


def test_a_field_splits_only_at_one_cut_into_pinned_pieces():
    x = np.array([8, 34, 85, 175, 512, 1024])
    capped = np.minimum(x, 300)
    assert builds.needs_pieces(x, capped) and builds.cut(x, capped) == 512
    assert not builds.needs_pieces(x, -(-x // 16))              # one expression serves it
    assert not builds.needs_pieces(x, np.full(6, 7))
    noisy = np.array([3, 70, 1, 900, 2, 5])
    assert builds.needs_pieces(x, noisy) and builds.cut(x, noisy) is None
    # a piece must be pinned: 2 * rows over 8 and 34 alone also reads as mul(ceil_div(rows, 2), 4)
    # (bare `rows` among such forms is taken, as compiler.exprs takes it)
    assert builds.cut(np.array([8, 34, 85, 175]), np.array([16, 68, 5, 5])) is None
    assert builds.cut(np.array([8, 34, 85, 175]), np.array([8, 34, 5, 5])) == 85
    assert builds.cut(np.array([8, 34, 85, 175, 300]), np.array([8, 34, 85, 5, 5])) == 175


# ------------------------------------------------------------------ real captures
@lru_cache(maxsize=None)
def _real(name: str):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(SUITE / f"{name}.tar.xz")
    doc = document(analyze(dump))
    return dump, doc, compile_capture(dump, doc, label="test")


def _range_holds(when: dict | None, rows: int) -> bool:
    return when is None or (when.get("min", 1) <= rows and ("max" not in when or rows <= when["max"]))


@pytest.mark.parametrize("name", ["q12e", "q36e"])
def test_norm_builds_by_rows_compile_and_kern_accepts(name, tmp_path):
    from compiler import programs

    dump, doc, res = _real(name)
    m = res.manifest
    assert verify(m) == []
    write(res, tmp_path / "out", dump)            # the offline ABI check over the real cubins
    with quiet_stderr():
        v = verdict(tmp_path / "out" / "manifest.json", tmp_path / "out" / "kernels")
    assert v.accepted, v.violations[:3]
    split = {n: o for n, o in m["ops"].items() if any("when" in ln for ln in o["impl"]["launches"])}
    assert split, "no op launches by row range"
    top = m["vars"]["rows"]["max"]
    for o in split.values():
        # the ranges partition rows 1..max: ascending, no gap, no overlap, the last unbounded
        ws = [ln["when"] for ln in o["impl"]["launches"]]
        assert ws[0]["min"] == 1 and "max" not in ws[-1] and ws[-1]["min"] <= top
        assert all(a["max"] + 1 == b["min"] for a, b in zip(ws, ws[1:]))
        assert len({tuple(ln["block"]) for ln in o["impl"]["launches"]}) == len(ws)
    # every forward of the prefill program: the launch its rows select is the engine's block
    pre = next(p for p in programs.programs(dump, doc)[0] if p.name == "prefill")
    calls = m["programs"]["prefill"]["calls"]
    checked = 0
    for k, c in enumerate(calls):
        if c["op"] not in split:
            continue
        for s in pre.samples:
            ln = [x for x in m["ops"][c["op"]]["impl"]["launches"] if _range_holds(x["when"], s.tokens)]
            assert len(ln) == 1 and ln[0]["block"] == list(s.steps[k].launch.block), (k, s.tokens)
            checked += 1
    assert checked >= 2 * len(pre.samples)
    # decode runs one row count: nothing there is split
    for c in m["programs"]["decode"]["calls"]:
        assert all("when" not in ln for ln in m["ops"][c["op"]]["impl"]["launches"])
    # the open gap: in provenance and in a note line, between the rows seen on either side
    sp = res.provenance["splits"]["prefill"]
    assert len(sp) == sum(c["op"] in split for c in calls)
    for entry in sp:
        lo, hi = entry["builds"]
        assert lo["when"]["max"] + 1 == hi["when"]["min"] == hi["seen_rows"][0]     # the documented rule
        if hi["seen_rows"][0] > lo["seen_rows"][-1] + 1:
            assert hi["open"] == [lo["seen_rows"][-1] + 1, hi["seen_rows"][0]]
    notes = [n for n in res.notes if "launch by row range:" in n]
    assert notes and all("open over rows" in n for n in notes)


@pytest.mark.parametrize("name", ["q1e", "tri_gated"])
def test_captures_without_row_builds_emit_no_when(name):
    _, _, res = _real(name)
    assert res.provenance["splits"] == {}
    assert all("when" not in ln for o in res.manifest["ops"].values() for ln in o["impl"]["launches"])


# ------------------------------------------------------------------ planted builds in the simulator
def _sim(tmp: Path, plant, prompts=(1, 34, 85, 175), new_module=None):
    """A simulated dump with the sampling seed pinned and `plant(name, rows, record)` applied to
    every launch record (the simulator's rms_norm, silu and embed grids' x axis is the rows)."""
    from dumpsim import SimConfig, simulate

    out = tmp / "sim"
    shutil.rmtree(out, ignore_errors=True)
    pid, _ = simulate(out, SimConfig(extra_pid=False, profile_tokens=1024, prompts=tuple(prompts)))
    recs = [json.loads(ln) for ln in (pid / "launches.jsonl").read_text().splitlines()]
    for r in recs:
        if r["name"] == "argmax_sample_kernel":     # the simulator's random seed: pinned, no pointer
            r["params"][2]["hex"] = (12345).to_bytes(8, "little").hex()
            r["params"][2].pop("ptrs", None)
        if r["name"] in (NORM, SILU, EMBED):
            plant(r["name"], r["grid"][0], r)
    (pid / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if new_module is not None:                       # a second build of a kernel, in a module of its own
        sha, mod, sym = new_module
        blob = f"another build of {sym}".encode()
        (pid / "cubins" / f"{sha}.cubin").write_bytes(blob)
        with open(pid / "modules.jsonl", "a") as fh:
            first = json.loads((pid / "modules.jsonl").read_text().splitlines()[0])
            fh.write(json.dumps({**first, "module": mod, "sha256": sha, "size": len(blob),
                                 "entries": ["_Z" + str(len(sym)) + sym + "v"]}) + "\n")
    return pid


def _compile(pid: Path):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(pid, cache=False)
    return compile_capture(dump, document(analyze(dump)))


def _expect(seen: list[int], threshold: int) -> tuple:
    """The documented rule over the rows the capture holds: (when below, when above, open gap)."""
    lo = min(t for t in seen if t >= threshold)
    hi = max(t for t in seen if t < threshold)
    return {"min": 1, "max": lo - 1}, {"min": lo, "max": None}, (None if lo == hi + 1 else [hi + 1, lo])


BLOCK_AT, CAP, MODULE_AT = 100, 300, 600
OTHER_SHA = "ab" * 32


def _planted(name, rows, r):
    if name == NORM:
        r["block"] = [1024 if rows < BLOCK_AT else 256, 1, 1]
    elif name == SILU:
        r["grid"][0] = min(rows, CAP)                 # a launcher capping its grid
    elif name == EMBED and rows >= MODULE_AT:
        r["sha256"], r["module"] = OTHER_SHA, 99


@pytest.mark.parametrize("prompts", [(1, 34, 85, 175), (1, 20, 64, 130, 400)])
def test_planted_builds_split_at_the_rule_boundaries(prompts, tmp_path):
    res = _compile(_sim(tmp_path, _planted, prompts, new_module=(OTHER_SHA, 99, EMBED)))
    m = res.manifest
    assert verify(m) == []
    assert kern_violations(m, ".", tmp_path) == []
    seen = sorted({t for _, t in res.provenance["programs"]["prefill"]["forwards"]})
    assert max(seen) == 1024 and min(seen) > 1
    by = {}
    for c in res.provenance["splits"]["prefill"]:
        by.setdefault(c["entry"].split("_kernel")[0][4:] + "_kernel", []).append(c)
    assert set(by) == {NORM, SILU, EMBED}
    for name, threshold in ((NORM, BLOCK_AT), (SILU, CAP + 1), (EMBED, MODULE_AT)):
        below, above, gap = _expect(seen, threshold)
        for c in by[name]:
            lo, hi = c["builds"]
            assert (lo["when"], hi["when"]) == (below, above), name
            assert hi["open"] == gap and lo["open"] is None
            assert lo["seen_rows"] == [t for t in seen if t < threshold]
    # the launches: blocks, the capped grid's two pieces, the other module, each under its range
    ops = m["ops"]
    for c in m["programs"]["prefill"]["calls"]:
        lns = ops[c["op"]]["impl"]["launches"]
        entry = lns[0]["entry"]
        if NORM in entry:
            assert [ln["block"] for ln in lns] == [[1024, 1, 1], [256, 1, 1]]
        elif SILU in entry:
            assert [ln["grid"][0] for ln in lns] == ["rows", CAP]
        elif EMBED in entry:
            assert [m["modules"][ln["module"]]["sha256"] for ln in lns][1] == OTHER_SHA
    # decode (one row) has no split; a note says each split and its open gap
    assert all("when" not in ln for c in m["programs"]["decode"]["calls"] for ln in ops[c["op"]]["impl"]["launches"])
    notes = [n for n in res.notes if "launch by row range:" in n]
    assert len(notes) == 3
    assert any("joined the program" in n for n in res.notes)


def test_planted_interleaved_blocks_are_refused_with_the_rows(tmp_path):
    def plant(name, rows, r):
        if name == NORM:
            r["block"] = [256 if rows in (34, 175) else 1024, 1, 1]
    with pytest.raises(CompileError, match=r"rms_norm_kernel.*rows 8, 85, 512, 1024.*rows 34, 175") as exc:
        _compile(_sim(tmp_path, plant))
    assert "\n" not in str(exc.value) and "threshold" in str(exc.value)


def test_planted_interleaved_module_leaves_its_forward_out(tmp_path):
    """A forward launching another module at rows inside the program's range cannot join it:
    left out as before, with a reason naming the rows."""
    def plant(name, rows, r):
        if name == SILU and rows == 85:
            r["sha256"], r["module"] = OTHER_SHA, 99
    res = _compile(_sim(tmp_path, plant, new_module=(OTHER_SHA, 99, SILU)))
    pre = res.provenance["programs"]["prefill"]
    assert 85 not in {t for _, t in pre["forwards"]}
    why = [w for w in pre["left_out"].values() if "85 rows" in w]
    assert why and "no one row threshold" in why[0]
    assert res.provenance["splits"] == {}


def test_planted_builds_with_other_parameters_are_refused(tmp_path):
    """One op's launches share its interface: a build passing another parameter list is named."""
    def plant(name, rows, r):
        if name == NORM:
            r["block"] = [1024 if rows < BLOCK_AT else 256, 1, 1]
            if rows >= BLOCK_AT:
                r["params"][5].update(size=8, hex=(1024).to_bytes(8, "little").hex())
    with pytest.raises(CompileError, match="rms_norm_kernel.*different parameter lists") as exc:
        _compile(_sim(tmp_path, plant))
    assert "\n" not in str(exc.value)
