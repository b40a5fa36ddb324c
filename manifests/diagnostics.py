"""One verifier finding: a stable rule id, the JSON path it is about, and one sentence.

Contract: rule ids are `group.fact` (e.g. `buffer.zero_dim`) and never change meaning; tests and
tools match on ids and paths, never on the wording of `message`. `Collector` only accumulates;
it never stops a walk, so a verifier reports every violation in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    rule: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} [{self.rule}]"


class Collector:
    """Accumulates diagnostics in the order rules find them."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def add(self, rule: str, path: str, message: str) -> None:
        self.items.append(Diagnostic(rule, path, message))


def key_path(base: str, name: str) -> str:
    """`$.buffers` + `x` -> `$.buffers.x`, quoting names that are not plain identifiers."""
    if name and all(c.isalnum() or c in "_-" for c in name):
        return f"{base}.{name}"
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{base}["{escaped}"]'
