"""Fuzz: corrupted variants of every committed real dump, through the readers and through the
path `mine analyze` takes (issue 14). Slow: under three minutes on two cores.

Why: a dump is read after its process was killed or its copy was cut; nothing in it may make the
readers raise anything but the project's one-sentence `DumpError`, and single-byte damage may
cost at most the record it hit (tests/helpers/fuzz_dumps.py says what is mutated and what is checked).

Budget: PER_DUMP (10,000) variants of every committed real dump (the vLLM, capture and suite
fixtures: both record forms, every side file), split over its files and read straight through
each file's reader (one in FULL_EVERY with its frames built, the others through the stage that
finds the records and writes the report: launches.bin's scan, the per-line checks), on the file's
first PREFIX_BYTES (whole records: the readers are per line and
per record, so a prefix is the same code on less input, read in a millisecond); WHOLE more per file
on the whole file (the 23 MB vLLM launch files and the long side files on their first
WINDOW_LINES lines); ANALYZE_VARIANTS more through load, analyze, the report and the contract
round trip, on the small dumps (a whole analysis of the large ones takes seconds). Variants are
deterministic (seeded by file and index); the two worker processes split the folders.
"""

from __future__ import annotations

import os
import random
import tempfile
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest

from paths import FIXTURES
from fuzz_dumps import (SIDE, Outcome, check_analyze, check_bin, check_lines, copy_pid,
                        kinds_for, variant)

PER_DUMP = 10_000        # reader variants per committed dump, on prefixes of its files
WHOLE = 20               # and per file, on the whole file
PREFIX_BYTES = 48 << 10
FULL_EVERY = 5           # one prefix variant in FULL_EVERY through the whole reader, frames built;
                         # the others through the stage that decides what is read and reported
ANALYZE_VARIANTS = 1500
WINDOW_LINES = {"launches.jsonl": 256, "allocs.jsonl": 1000, "modules.jsonl": 24}
BIG = 256 << 10
SMALL_DUMPS = ("capture/probe", "capture/probe_bin", "capture/torch", "capture/torch_bin")


def _pid_dirs(root: Path) -> list[Path]:
    out = []
    for d in [root, *sorted(root.glob("pid*"))]:
        if d.is_dir() and any((d / n).is_file() for n in ("launches.jsonl", "launches.bin")):
            out.append(d)
    return out


def _dumps() -> dict[str, list[Path]]:
    from mining.archive import unpack

    out = {}
    for sub in ("vllm", "capture", "suite"):
        for a in sorted((FIXTURES / sub).glob("*.tar.xz")):
            pids = _pid_dirs(unpack(a))
            if pids:   # the truth archives hold expectations, not dumps
                out[f"{sub}/{a.name[:-len('.tar.xz')]}"] = pids
    return out


def _window(name: str, data: bytes) -> bytes:
    """The whole file, but the first WINDOW_LINES lines of the long ones (the 23 MB launch files)."""
    k = WINDOW_LINES.get(name)
    if k is None or len(data) <= BIG:
        return data
    cut = 0
    for _ in range(k):
        nl = data.find(b"\n", cut)
        if nl < 0:
            break
        cut = nl + 1
    return data[:cut]


def _prefix(name: str, data: bytes) -> bytes:
    """The file's first PREFIX_BYTES at most, cut after a whole record (a line; in launches.bin a
    record found by the reader): the real records of the file, few enough to read in a millisecond."""
    if len(data) <= PREFIX_BYTES:
        return data
    if name == "launches.bin":
        from vocab import binfmt
        offs = binfmt.scan(data).offsets
        if len(offs) < 2:    # one record (then the writer's zeros, a process that ended by _exit)
            return data[:PREFIX_BYTES]
        k = int(np.searchsorted(offs, PREFIX_BYTES, side="right")) - 1
        return data[:int(offs[max(k, 1)])]
    cut = data.rfind(b"\n", 0, PREFIX_BYTES) + 1
    return data[:cut] if cut else data[:data.find(b"\n") + 1]


def _plan(dumps: dict[str, list[Path]]):
    """Tasks (label, pid folder, [(file, base, variants)]): every dump gets PER_DUMP variants on
    prefixes of its files, split evenly over its (process, file) pairs, and every file WHOLE more
    on the whole file."""
    tasks = []
    for label, pids in dumps.items():
        pairs = [(pid, n) for pid in pids for n in ("launches.jsonl", "launches.bin") + SIDE
                 if (pid / n).is_file()]
        each = -(-PER_DUMP // len(pairs))
        for pid in pids:
            mine = [n for p, n in pairs if p == pid]
            tasks.append((label, pid, [(n, "prefix", each) for n in mine] + [(n, "whole", WHOLE) for n in mine]))
    return tasks


def _readers(task) -> Outcome:
    """The reader variants of one process folder (runs in a worker)."""
    from vocab import binfmt
    from mining.damage import FileReport
    from mining.functions import FUNCTIONS, read_functions
    from fuzz_dumps import run_reader

    label0, src, plan = task
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_pid(src, Path(tmp) / src.name)
        fns = read_functions(work / FUNCTIONS, []) if (work / FUNCTIONS).is_file() else None
        if fns is None:
            from mining.functions import Functions
            fns = Functions(np.zeros(0, np.int64), {}, *(np.zeros(0, np.int64),) * 4)
        for name, mode, count in plan:
            whole = _window(name, (src / name).read_bytes())
            base = _prefix(name, whole) if mode == "prefix" else whole
            offs = binfmt.scan(base).offsets if name == "launches.bin" else None
            if name != "launches.bin":
                base_rep, _ = run_reader(work, name, base, fns, FileReport)
                base_read = base_rep.read
            kinds = kinds_for(name)
            for v in range(count):
                rng = random.Random(f"{label0}/{src.name}/{name}/{mode}/{v}")
                kind = kinds[v % len(kinds)] if v < 2 * len(kinds) else rng.choice(kinds)
                data, hit = variant(base, kind, rng, offs)
                label = f"{label0}/{src.name}/{name} {mode} {kind} seed {v}"
                out.count += 1
                full = v % FULL_EVERY == 0 or mode == "whole"   # the frames too, not only the report
                if name == "launches.bin":
                    check_bin(label, base, offs, data, kind, hit, out)
                    if full:
                        check_lines(label, work, name, base, 0, data, "none", None, fns, out)
                else:
                    check_lines(label, work, name, base, base_read, data, kind, hit, fns, out, full)
            (work / name).write_bytes((src / name).read_bytes())
    return out


def _analyzes(task) -> Outcome:
    """Whole-analysis variants of one small process folder (runs in a worker)."""
    label0, src, seeds = task
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_pid(src, Path(tmp) / src.name)
        names = [n for n in ("launches.jsonl", "launches.bin") + SIDE if (work / n).is_file()]
        originals = {n: (work / n).read_bytes() for n in names}
        for seed in seeds:
            rng = random.Random(f"analyze/{label0}/{src.name}/{seed}")
            name = names[seed % len(names)] if seed % 3 else names[0]   # the launch file most often
            base = originals[name]
            from vocab import binfmt
            offs = binfmt.scan(base).offsets if name == "launches.bin" else None
            kind = rng.choice(kinds_for(name))
            data, _ = variant(base, kind, rng, offs)
            (work / name).write_bytes(data)
            out.count += 1
            check_analyze(f"analyze {label0}/{src.name}/{name} {kind} seed {seed}", work, out)
            (work / name).write_bytes(base)
    return out


def _report(out: Outcome) -> str:
    lines = [f"{out.count} variants, {out.refused} refused with one sentence, "
             f"{len(out.escaped)} escaped, {len(out.broken)} over the loss bound or unsound"]
    for label, tb in out.escaped[:5]:
        lines.append(f"ESCAPED {label}\n{tb}")
    for label, why in out.broken[:10]:
        lines.append(f"BROKEN {label}: {why}")
    return "\n".join(lines)


def _pool():
    return get_context("fork").Pool(max(1, min(2, os.cpu_count() or 1)))


@pytest.mark.slow
def test_fuzz_every_dump_file_through_its_reader():
    dumps = _dumps()
    assert len(dumps) >= 18 and {"vllm/vllm-offline-bin", "capture/probe_bin", "suite/q3ds"} <= set(dumps)
    tasks = _plan(dumps)
    total = Outcome()
    with _pool() as pool:
        for out in pool.imap_unordered(_readers, tasks):
            total.add(out)
    assert total.count >= PER_DUMP * len(dumps), _report(total)
    assert not total.escaped and not total.broken, _report(total)


@pytest.mark.slow
def test_fuzz_small_dumps_through_the_analysis():
    dumps = _dumps()
    pids = [(label, pid) for label in SMALL_DUMPS for pid in dumps[label]]
    per = -(-ANALYZE_VARIANTS // len(pids))
    tasks = [(label, pid, list(range(k, per, 2))) for label, pid in pids for k in (0, 1)]
    total = Outcome()
    with _pool() as pool:
        for out in pool.imap_unordered(_analyzes, tasks):
            total.add(out)
    assert total.count >= ANALYZE_VARIANTS, _report(total)
    assert not total.escaped, _report(total)
    assert total.refused < total.count, _report(total)   # most variants still analyse
