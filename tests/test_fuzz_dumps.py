"""Fuzz: corrupted variants of every committed real dump, through the readers and through the
path `mine analyze` takes (issue 14). Slow: under three minutes on two cores.

Why: a dump is read after its process was killed or its copy was cut; nothing in it may make the
readers raise anything but the project's one-sentence `DumpError`, and single-byte damage may
cost at most the record it hit (tests/fuzz_dumps.py says what is mutated and what is checked).

Budget: READER_VARIANTS per (process folder, file) straight through that file's reader, for every
dump file of every committed real dump (the vLLM, capture and suite fixtures: both record forms,
every side file) -- more than 10,000 in all; ANALYZE_VARIANTS more through load, analyze, the
report and the contract round trip, on the small dumps (a whole analysis of the large ones takes
seconds). The launch files of the vLLM JSON dumps (23 MB) are fuzzed on their first
WINDOW_LINES lines, the long side files likewise: the readers are per line, so a window is the
same code on less input. Variants are deterministic (seeded by their index); the two worker
processes split the folders.
"""

from __future__ import annotations

import os
import random
import tempfile
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES
from fuzz_dumps import (SIDE, Outcome, check_analyze, check_bin, check_lines, copy_pid,
                        kinds_for, variant)

READER_VARIANTS = 200
ANALYZE_VARIANTS = 2000
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


def _readers(task) -> Outcome:
    """All reader variants of one process folder (runs in a worker)."""
    from capture import binfmt
    from mining.damage import FileReport
    from mining.functions import FUNCTIONS, read_functions
    from fuzz_dumps import run_reader

    label0, src, first = task
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        work = copy_pid(src, Path(tmp) / src.name)
        fns = read_functions(work / FUNCTIONS, []) if (work / FUNCTIONS).is_file() else None
        if fns is None:
            from mining.functions import Functions
            fns = Functions(np.zeros(0, np.int64), {}, *(np.zeros(0, np.int64),) * 4)
        names = [n for n in ("launches.jsonl", "launches.bin") + SIDE if (work / n).is_file()]
        for name in names:
            base = _window(name, (work / name).read_bytes())
            offs = binfmt.scan(base).offsets if name == "launches.bin" else None
            if name != "launches.bin":
                base_rep, _ = run_reader(work, name, base, fns, FileReport)
                base_read = base_rep.read
            kinds = kinds_for(name)
            for v in range(READER_VARIANTS):
                seed = first + v
                rng = random.Random(f"{label0}/{src.name}/{name}/{seed}")
                kind = kinds[v % len(kinds)] if v < 2 * len(kinds) else rng.choice(kinds)
                data, hit = variant(base, kind, rng, offs)
                label = f"{label0}/{src.name}/{name} {kind} seed {seed}"
                out.count += 1
                if name == "launches.bin":
                    check_bin(label, base, offs, data, kind, hit, out)
                    if v % 6 == 0:   # and the frames built from what was found
                        check_lines(label, work, name, base, 0, data, "none", None, fns, out)
                else:
                    check_lines(label, work, name, base, base_read, data, kind, hit, fns, out)
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
            from capture import binfmt
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
    tasks = [(label, pid, 0) for label, pids in dumps.items() for pid in pids]
    tasks.sort(key=lambda t: -sum(f.stat().st_size for f in t[1].iterdir() if f.is_file()))
    total = Outcome()
    with _pool() as pool:
        for out in pool.imap_unordered(_readers, tasks):
            total.add(out)
    assert total.count >= 10_000, _report(total)
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
