"""Where a generator writes: a folder object with `path(rel)` and `finish()`.

Why: `mine gen` hands the generators an `OutFolder` (`mine.checks`: refuses a non-empty folder
without `--force`, records what a run wrote); a library caller hands a plain path and expects the
files written there as asked. `folder(out)` takes either, so the generators never import the
command layer.
"""

from __future__ import annotations

from pathlib import Path


class PlainFolder:
    """A caller's own folder: files written into it as asked, nothing checked or recorded."""

    def __init__(self, root):
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        return []


def folder(out):
    """`out` itself when it is a folder object (has `path` and `finish`), else a PlainFolder."""
    return out if hasattr(out, "path") and hasattr(out, "finish") else PlainFolder(out)
