"""Checks every command makes before it does its work: inputs it reads, outputs it will write.

Why: a command that fails half-way (after a 10 s analysis, or after writing two of five stage
files) or that writes over the user's files is worse than one that refuses at once. So the
commands call these first:

- `read_manifest(path)` reads a manifest and runs the verifier on it; a manifest that does not
  verify is refused with the verifier's first finding, before any command-specific code touches
  its fields (those assume a verified manifest and would otherwise fail with a traceback).
- `check_outputs(inputs, outputs)` refuses an output path that is one of the inputs (or lies
  inside an input folder), two outputs that are one path, and an output that cannot be made,
  before anything is read.
- `archive_named(path)` makes errors about an unpacked archive's members name the archive.
- `progress(what)` shows a spinner while a slow step runs.
- `OutFolder` owns an `--out` folder: an existing non-empty folder is refused unless `--force`;
  the files a run writes are listed in `OUT/.mine-written`, so that a `--force` run removes the
  files of an earlier run it does not write again (a stale `stage2.json` of another cut) and
  never a file it did not write itself.

Every refusal is a `UsageError` (`vocab.errors`, a MineError): `mine.cli` prints it as one
sentence, exit 2.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Optional

from vocab.errors import MineError, UsageError

WRITTEN = ".mine-written"


def read_manifest(path: Path) -> dict:
    """The manifest at `path`, verified; refused with the verifier's first finding otherwise."""
    from manifests import jsonload
    from manifests.verify import verify

    doc = jsonload.load_path(path)
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: not a manifest (the file holds no JSON object)")
    bad = verify(doc)
    if bad:
        more = f" (and {len(bad) - 1} more; `mine verify {path}` lists them)" if len(bad) > 1 else ""
        raise UsageError(f"{path}: the manifest does not verify: {bad[0]}{more}")
    return doc


def _resolved(p: Path) -> Path:
    return Path(os.path.abspath(p)).resolve()


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def check_outputs(inputs: Iterable[Optional[Path]], outputs: dict[str, Optional[Path]]) -> None:
    """Refuse output files that are inputs, lie in an input folder, coincide, or cannot be made
    (a file where a folder must be, a folder that is not writable); missing folders are fine.

    `outputs` maps the option that names a file (`--json`) to its path; None entries are skipped.
    Existing output files elsewhere are written over: the user named them as outputs."""
    ins = [(p, _resolved(p)) for p in inputs if p is not None]
    seen: dict[Path, str] = {}
    for flag, out in outputs.items():
        if out is None:
            continue
        r = _resolved(out)
        for given, src in ins:
            if r == src or (src.is_dir() and _inside(r, src)):
                what = "is" if r == src else "lies inside"
                raise UsageError(f"{flag} {out} {what} the input {given}; write the output elsewhere")
        if r in seen:
            raise UsageError(f"{flag} and {seen[r]} name one file, {out}")
        seen[r] = flag
        if r.is_dir():
            raise UsageError(f"{flag} {out} is a folder; give a file name")
        anc = r.parent
        while not anc.exists():  # missing folders are made when the file is written
            anc = anc.parent
        if not anc.is_dir():
            raise UsageError(f"{flag} {out}: {anc} is a file, not a folder")
        if not os.access(anc, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {out}: the folder {anc} is not writable")


class OutFolder:
    """An `--out` folder a command writes into, checked before the command starts.

    Refused: a path that is a file or an input, and an existing folder holding files unless
    `force`. The folder may lie inside an input folder (a dump's), and an input may lie inside the
    folder (an analysis written there before): nothing is removed that this tool did not record;
    `path` refuses to hand it out as an output and `finish` never removes it. `path(rel)` records
    what this run writes; `finish()` writes the record and, with `force`, removes the files the
    previous run recorded that this one did not write. (A library caller's own folder, unchecked
    and unrecorded, is `generators.folder.PlainFolder`.)"""

    def __init__(self, out: Path, force: bool = False, inputs: Iterable[Optional[Path]] = (),
                 flag: str = "--out"):
        self.root = Path(out)
        self.force = force
        self.written: list[str] = []
        self.flag = flag
        self.inputs = [(g, _resolved(g)) for g in inputs if g is not None]
        r = _resolved(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"{flag} {out} is a file, not a folder")
        for given, src in self.inputs:
            if r == src:
                raise UsageError(f"{flag} {out} overlaps the input {given}; write the output elsewhere")
        self.earlier = self._earlier()
        if self.root.is_dir() and any(self.root.iterdir()) and not force:
            raise UsageError(f"{flag} {out} already exists and is not empty; pass --force to write "
                             "over it (files of an earlier run are replaced, other files kept)")

    def _earlier(self) -> list[str]:
        rec = self.root / WRITTEN
        if not rec.is_file():
            return []
        try:
            names = json.loads(rec.read_text())
        except (OSError, ValueError):
            return []
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def path(self, rel: str) -> Path:
        """The path of `rel` in the folder, its parent made, recorded as written by this run."""
        p = self.root / rel
        for given, src in self.inputs:
            if _resolved(p) == src:
                raise UsageError(f"{self.flag} {self.root} would write {rel} over the input {given}; "
                                 "write the output elsewhere")
        p.parent.mkdir(parents=True, exist_ok=True)
        if rel not in self.written:
            self.written.append(rel)
        return p

    def finish(self) -> list[str]:
        """Record what this run wrote; remove what the earlier run wrote and this one did not.
        Returns the removed names."""
        self.root.mkdir(parents=True, exist_ok=True)
        removed = []
        root = _resolved(self.root)
        keep = {src for _, src in self.inputs}
        for rel in self.earlier:
            if rel in self.written:
                continue
            p = self.root / rel
            r = _resolved(p)
            # only plain files the record names inside the folder; never a folder, a link, an input
            if _inside(r, root) and r not in keep and p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(rel)
        (self.root / WRITTEN).write_text(json.dumps(sorted(self.written), indent=1) + "\n")
        return removed


@contextmanager
def archive_named(path: Optional[Path]):
    """Errors about an archive's unpacked members name the archive the user gave.

    Why: a dump archive is read from the folder it is unpacked into (`mining.archive`), so reader
    errors name `<cache>/archives/<archive>-<hash>/pid600/launches.jsonl` (or a temporary folder
    with --no-cache), a path the user never typed. Within this block such a message names
    `<archive>:pid600/launches.jsonl`."""
    from mining.archive import user_path

    try:
        yield
    except (MineError, OSError) as exc:
        text = str(exc)
        named = user_path(text)
        if path is None or named == text:
            raise
        raise UsageError(named) from None


@contextmanager
def progress(what: str):
    """A spinner on stderr while a step of a few seconds runs (reading and analysing a capture), so
    a silent terminal never looks like a hung one. Shown only on a terminal; nothing is printed
    into a pipe or a log."""
    import sys

    from rich.console import Console

    err = Console(stderr=True)
    if not (sys.stderr.isatty() and err.is_terminal):
        yield
        return
    with err.status(what, spinner="dots"):
        yield


def every(seconds: float):
    """A progress callback for a window replay that prints one line on stderr at most every
    `seconds`: a replay on a GPU runs for minutes, and a run cut by a time limit then still says
    how far it got."""
    import sys
    import time

    t0 = last = time.monotonic()

    def show(done: int, total: int, seq: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= seconds or done == total:
            last = now
            print(f"replay: {done}/{total} executions (launch {seq}) after {now - t0:.0f} s", file=sys.stderr, flush=True)
    return show
