"""The copy log (copies.jsonl) from mc_callback() down, on CPU: copies made between fake launches.

tests/helpers/harness_dispatch.c (mode `copies`) makes, per round, a launch, a synchronous and an
overlapping asynchronous host-to-device copy, a launch, a copy larger than the byte knob, a
generic cuMemcpy from host memory (the fake driver's device range is the destination), a failed
copy, a device-to-host and a host-to-host copy through the generic calls (not recorded), device-
to-device copies (typed and generic) and memsets (recorded with their `op`, never their bytes), a
copy of exactly the default byte limit (its record grows the thread's buffer), a launch; in round 1
an async host and device copy on a stream being captured into a graph. It prints
each copy with the bytes it copied and the number of launches made before it. Here every record
is checked against that: destination, size, stream, api, result, the launch seq it precedes (and
that the launch file agrees), the bytes exactly when the knobs say they are kept; in both record
forms and both writers, with the byte knob at its default, raised, 0, and the log off; and under
an allocation failure at every allocation the run makes (the host's copies all go through, capture
turns off with one line, the counters equal the file). Every row's single call is in
test_dispatch_paths.py; the real driver's copies in tests/gpu_results/run_copies.sh.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import dispatch_harness as H
from vocab import binfmt
from mining.copies import bytes_before
from mining.load import DumpError, load_dump

DEFAULT_BYTES = 4096


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return H.build_dispatch_harness(tmp_path_factory.mktemp("copies"))


def _run(harness: Path, out: Path, form: str, rounds: int, *knobs: str):
    r = subprocess.run([str(harness), "copies", str(out), form, str(rounds), *knobs], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"copy"') or x.startswith('{"done"')
             or x.startswith('{"not_copied"')]
    (pid_dir,) = out.glob("pid*")
    return r, lines, pid_dir


def _launch_times(pid_dir: Path, form: str) -> dict[int, int]:
    recs = binfmt.decode_records(pid_dir) if form == "bin" else H.read_jsonl(pid_dir / "launches.jsonl")
    return {r["seq"]: r["t_ns"] for r in recs}


def _kept(copy: dict, nbytes: int) -> bool:
    return copy["op"] == "htod" and copy["result"] == 0 and nbytes > 0 and copy["size"] <= nbytes


@pytest.mark.parametrize("form,knobs,nbytes", [
    ("json", (), DEFAULT_BYTES), ("bin", (), DEFAULT_BYTES), ("json", ("writer=write",), DEFAULT_BYTES),
    ("bin", ("copy_bytes=8192",), 8192), ("json", ("copy_bytes=0",), 0), ("bin", ("copy_bytes=8",), 8)])
def test_every_copy_is_recorded_with_its_place_among_the_launches(harness, tmp_path, form, knobs, nbytes):
    r, lines, pid_dir = _run(harness, tmp_path, form, 3, *knobs)
    assert r.stderr == ""
    made = [x["copy"] for x in lines if "copy" in x]
    (done,) = [x["done"] for x in lines if "done" in x]
    got = H.read_jsonl(pid_dir / "copies.jsonl")
    assert len(made) == done["copies_made"] == len(got) > 0
    assert [r["seq"] for r in got] == list(range(len(got)))       # gap-free, in call order (one thread)
    for want, rec in zip(made, got):
        for k in ("api", "dst", "size", "seq_before", "result", "async", "stream", "op"):
            assert rec[k] == want[k], (k, want, rec)
        if want["op"] == "memset":
            assert rec["value"] == 0x5a and rec["elem"] in (1, 4) and rec["src"] == "0x0", rec
        assert rec["graph"] == ({"graph": "0x9e77", "capture_id": 777} if want["capture_id"] else None)
        if _kept(want, nbytes):
            assert rec["hex"] == want["bytes"], want
        else:
            assert "hex" not in rec, want
    not_copied = {a for x in lines if "not_copied" in x for a in x["not_copied"]}
    assert not_copied and not [r for r in got if r["dst"] in not_copied]
    # the launch file agrees: a copy falls after launch seq_before - 1 and before launch seq_before
    times = _launch_times(pid_dir, form)
    for rec in got:
        s = rec["seq_before"]
        assert (s == 0 or times[s - 1] <= rec["t_ns"]) and (s not in times or rec["t_ns"] <= times[s])
    meta = json.loads((pid_dir / "meta.json").read_text())
    assert meta["options"]["copy_log"] == 1 and meta["options"]["copy_bytes"] == nbytes
    assert meta["counters"]["copies"] == len(got) and meta["counters"]["copies_dropped"] == 0


def _model(made: list[dict], seq: int, base: int, size: int, nbytes: int) -> tuple[bytes, list[bool]]:
    """What [base, base + size) held before launch `seq`, replaying the printed copies in order."""
    data, known = bytearray(size), [False] * size
    for c in made:
        if c["result"] or c["capture_id"] or c["seq_before"] > seq or c["op"] != "htod":
            continue
        dst = int(c["dst"], 16)
        raw = bytes.fromhex(c["bytes"])
        for i in range(c["size"]):
            j = dst + i - base
            if 0 <= j < size:
                keep = _kept(c, nbytes)
                data[j] = raw[i] if keep else 0
                known[j] = keep
    return bytes(data), known


@pytest.mark.parametrize("form,knobs,nbytes", [("json", (), DEFAULT_BYTES), ("bin", ("copy_bytes=16",), 16)])
def test_the_loader_and_bytes_before_give_what_the_host_copied(harness, tmp_path, form, knobs, nbytes):
    r, lines, pid_dir = _run(harness, tmp_path, form, 4, *knobs)
    assert r.stderr == ""
    made = [x["copy"] for x in lines if "copy" in x]
    d = load_dump(pid_dir, cache=False)
    host = [c for c in made if c["op"] == "htod"]
    assert len(d.copies) == len(host) and not [w for w in d.warnings if "copies" in w]
    assert set(d.copies["op"]) == {"htod"} and not d.copies["api"].astype(str).str.contains("DtoD|Memset").any()
    dev = [c for c in made if c["op"] != "htod"]
    assert [(r.op, hex(r.dst), r.size, bool(r.in_graph)) for r in d.device_ops.itertuples()] == [
        (c["op"], c["dst"], c["size"], bool(c["capture_id"])) for c in dev] and len(dev) > 0
    assert not d.device_ops["has_bytes"].any()
    assert [r.file for r in d.damage if r.file == "copies.jsonl" and not r.damaged] == ["copies.jsonl"]
    base = int(made[0]["dst"], 16)
    ranges = [(base, 48), (base + 8, 16), (base + 0x10000, 8192), (base + 0x30000, 8), (base + 0x50000, 16),
              (base + 0x40000, 8), (base + 0x60000 + 100, 64)]
    for seq in range(int(d.launches["seq"].max()) + 2):
        for lo, n in ranges:
            f = bytes_before(d.copies, seq, lo, n)
            want, known = _model(made, seq, lo, n, nbytes)
            assert (f.data, list(f.known)) == (want, known), (seq, hex(lo), n)


def test_the_copy_log_off_writes_no_file(harness, tmp_path):
    r, lines, pid_dir = _run(harness, tmp_path, "json", 2, "copy_log0")
    assert r.stderr == "" and not (pid_dir / "copies.jsonl").exists()   # (the copies' callbacks called anyway)
    meta = json.loads((pid_dir / "meta.json").read_text())
    assert meta["options"]["copy_log"] == 0 and "copies" not in meta["counters"]
    assert load_dump(pid_dir, cache=False).copies is None


@pytest.mark.parametrize("form", ["json", "bin"])
def test_an_allocation_failure_on_the_copy_path_turns_capture_off_and_the_host_copies_on(harness, tmp_path, form):
    """The library's allocator fails its Nth allocation, for every N the run makes: every copy and
    launch of the host still returns, capture turns off with one line, and meta.json's copy
    counter equals the records in copies.jsonl (which the reader takes, or refuses in one
    sentence when no launch made it)."""
    r, lines, _ = _run(harness, tmp_path / "clean", form, 3)
    (clean,) = [x["done"] for x in lines if "done" in x]
    assert r.stderr == "" and clean["off"] == 0 and clean["allocs"] >= 3
    phases = set()
    for n in range(1, clean["allocs"] + 1):
        r, lines, pid_dir = _run(harness, tmp_path / f"fail{n}", form, 3, f"fail={n}")
        (done,) = [x["done"] for x in lines if "done" in x]
        assert done["copies_made"] == clean["copies_made"] and done["launches_made"] == clean["launches_made"]
        assert done["off"] == 1, (n, done)
        phases.add(done["failed_in"])
        err = r.stderr.splitlines()
        assert len(err) == 1 and "capture off" in err[0] and "malloc failed with code 12" in err[0], (n, err)
        meta = json.loads((pid_dir / "meta.json").read_text())
        assert meta["disabled"] == "malloc failed with code 12"
        got = H.read_jsonl(pid_dir / "copies.jsonl")
        assert meta["counters"]["copies"] == len(got) < clean["copies_made"], n
        try:
            d = load_dump(pid_dir, cache=False)
            assert len(d.copies) + len(d.device_ops) == len(got)
        except DumpError as exc:
            assert "\n" not in str(exc)
    assert "copy" in phases, phases   # the copy path's own allocations failed too, not only the launches'


def _as_probe_output(lines: list[dict], path: Path, break_one: bool = False) -> None:
    """The harness's copies in the GPU probe's output format (tests/gpu_results/copies_probe.cu)."""
    out = []
    for x in lines:
        if "copy" in x and x["copy"]["result"] == 0 and x["copy"]["op"] == "htod":
            c = x["copy"]
            out.append({"copy": {"how": c["api"], "dst": c["dst"], "size": c["size"], "hex": c["bytes"],
                                 "launches_before": c["seq_before"], "graph": int(bool(c["capture_id"]))}})
        elif "not_copied" in x:
            out += [{"not_copied": {"dst": a, "size": 16}} for a in x["not_copied"]]
        elif "done" in x:
            out.append({"done": {"launches": x["done"]["launches_made"]}})
    if break_one:
        out[0]["copy"]["hex"] = "ff" + out[0]["copy"]["hex"][2:]
    path.write_text("".join(json.dumps(o) + "\n" for o in out))


def test_the_gpu_checker_accepts_a_faithful_log_and_names_a_wrong_byte(harness, tmp_path, capsys):
    """tests/gpu_results/check_copies.py, the GPU script's judge, run on the harness's dump."""
    import runpy
    from paths import GPU_RESULTS
    check = runpy.run_path(str(GPU_RESULTS / "check_copies.py"))["main"]
    _, lines, pid_dir = _run(harness, tmp_path / "dump", "bin", 3)
    _as_probe_output(lines, tmp_path / "good.jsonl")
    assert check([str(tmp_path / "good.jsonl"), str(pid_dir), str(DEFAULT_BYTES)]) == 0
    assert "copies check: ok" in capsys.readouterr().out
    _as_probe_output(lines, tmp_path / "bad.jsonl", break_one=True)
    assert check([str(tmp_path / "bad.jsonl"), str(pid_dir), str(DEFAULT_BYTES)]) == 1
    text = capsys.readouterr().out
    assert "PROBLEM cuMemcpyHtoD_v2: bytes differ" in text and "copies check: FAIL" in text
