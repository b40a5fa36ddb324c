"""Differential test: our verdict (accept/reject) equals kern-llm 0.3.1's on every manifest of
the corpus -- the base manifests plus every single-edit mutant `mutate.mutants` derives from them
-- and, in the slow test, on 21,000 seeded random mutants of seven families (`mutate_gen`).

kern is the oracle: a manifest it rejects raises ValueError ("manifest failed verification");
one it accepts goes on to load the CUDA driver, which on a machine without a GPU panics (a
pyo3 PanicException, a BaseException). With a GPU it might load; an empty kernels dir then
fails on the missing artifact, also after verification, so the verdict reading holds.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

import mutate_gen
from manifests import jsonload, kern_oracle
from manifests.verify import verify, verify_file
from mutate import mutants
from paths import CORPUS

pytest.importorskip("kern")

MIN_CORPUS = 5000


def kern_accepts(path: Path, kernels: Path) -> bool:
    v = kern_oracle.verdict(path, kernels)
    if not v.accepted and "failed verification" not in v.message:
        raise v.exc  # a ValueError that is not a verdict: kern's own failure
    return v.accepted


def ours_accepts(text: str) -> bool:
    try:
        return not verify(jsonload.loads(text))
    except ValueError:
        return False


@functools.lru_cache(maxsize=1)   # deriving the ~12,000 mutants takes seconds; tests share them
def corpus() -> tuple[tuple[str, str], ...]:
    items = []
    for base_path in sorted(CORPUS.glob("*.json")):
        text = base_path.read_text()
        items.append((f"{base_path.stem}: base", text))
        items += [(f"{base_path.stem}: {label}", t) for label, t in mutants(json.loads(text))]
    return tuple(items)


def test_bases_are_accepted_by_both():
    bases = sorted(CORPUS.glob("*.json"))
    assert len(bases) >= 4
    for p in bases:
        assert verify(json.loads(p.read_text())) == [], p.name


def test_corpus_size():
    assert len(corpus()) >= MIN_CORPUS, f"corpus shrank to {len(corpus())} manifests"


@pytest.mark.parametrize("part", [
    pytest.param(8, id="an eighth"),                             # every 8th manifest, all four bases' mutants
    pytest.param(1, id="all", marks=pytest.mark.slow),           # ~12,000 kern runs
])
def test_verdicts_match_kern(tmp_path, monkeypatch, part):
    monkeypatch.setenv("RUST_BACKTRACE", "0")
    items = corpus()[::part]
    path = tmp_path / "m.json"
    disagreements, rejected = [], 0
    with kern_oracle.quiet_stderr():
        for label, text in items:
            path.write_text(text)
            theirs = kern_accepts(path, tmp_path)
            rejected += not theirs
            if theirs != ours_accepts(text):
                disagreements.append(f"{label}: kern {'accepts' if theirs else 'rejects'}")
    assert disagreements == [], f"{len(disagreements)} of {len(items)}:\n" + "\n".join(
        disagreements[:50])
    # The corpus must exercise both verdicts in bulk, or it proves little.
    assert rejected > len(items) // 2 and len(items) - rejected > 200 // part


GENERATED = 21_000  # 3,000 of each of the seven families of mutate_gen (six plus combined)


@pytest.mark.slow
def test_generated_verdicts_match_kern(tmp_path, monkeypatch):
    """The wide differential: seeded random mutants of every family (tests/helpers/mutate_gen.py), each
    read the way `mine verify` reads a file (`verify_file`); kern's verdict on the same bytes.
    Our side may reject by diagnostics or by an unreadable-input error, never by a traceback."""
    monkeypatch.setenv("RUST_BACKTRACE", "0")
    bases = {p.stem: json.loads(p.read_text()) for p in sorted(CORPUS.glob("*.json"))}
    items = mutate_gen.generate(bases, GENERATED)
    path = tmp_path / "m.json"
    disagreements, tracebacks = [], []
    per_family: dict[str, list[int]] = {}
    with kern_oracle.quiet_stderr():
        for label, data in items:
            path.write_bytes(data)
            # any ValueError is a verdict here: JSON faults (bad UTF-8, depth) are not reported
            # as "failed verification" but as kern's reader's own sentence
            theirs = kern_oracle.verdict(path, tmp_path).accepted
            try:
                ours = not verify_file(path)
            except (ValueError, OSError):  # `mine verify` exit 2: one sentence, a rejection
                ours = False
            except Exception as exc:  # noqa: BLE001 - the finding this test exists for
                tracebacks.append(f"{label}: {exc!r}")
                continue
            counts = per_family.setdefault(label.split("[")[1].split("]")[0], [0, 0])
            counts[theirs] += 1
            if theirs != ours:
                disagreements.append(f"{label}: kern {'accepts' if theirs else 'rejects'}")
    assert tracebacks == [], "\n".join(tracebacks[:20])
    assert disagreements == [], f"{len(disagreements)} of {len(items)}:\n" + "\n".join(
        disagreements[:50])
    assert set(per_family) == set(mutate_gen.FAMILIES) | {"combined"}
    for family, (rejected, accepted) in per_family.items():
        # every family makes both verdicts in bulk, or it proves little
        assert rejected >= 300 and accepted >= 100, (family, rejected, accepted)
