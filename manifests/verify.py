"""Verifier entry point: every rule of kern-llm 0.3.1's manifest verifier, as diagnostics.

Contract: `verify(manifest_or_dict)` returns the complete list of `Diagnostic`s (empty = kern
accepts it). A dict is parsed first; a parse failure is the single `parse.*` diagnostic, as in
kern. The rule groups live in `rules_decl` (version, vars, topology, cut, states, buffers,
modules), `rules_ops` (interfaces, launches, packs, tensormaps) and `rules_programs` (calls, data
flow, unused declarations); they share one `Scope`. Deliberately not checked (kern checks them
only at load, on a GPU): kernel ABIs against cubins, weight byte totals, artifact presence.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from manifests import jsonload
from manifests.diagnostics import Collector, Diagnostic
from manifests.model import DTYPE_BYTES, Manifest, ModelError
from vocab.wire import INT_RANGES, U64_MAX

I32_MAX, I64_MAX = INT_RANGES["i32"][1], INT_RANGES["i64"][1]


class Scope:
    """What every rule group reads: the manifest, var corners and what earlier groups learned."""

    def __init__(self, m: Manifest, out: Collector):
        self.m, self.out = m, out
        self.vars = m.vars or {}
        self.states = m.states or {}
        self.groups = m.topology.groups if m.topology else {}
        self.lo = {v: 1 for v in self.vars}
        self.hi = {v: var.max for v, var in self.vars.items()}
        self.buf_bytes: dict[str, int] = {}   # byte size at var upper bounds, when computable
        self.used_vars: set[str] = set()
        self.used_groups: set[str] = set()
        self.used_buffers: set[str] = set()
        self.used_states: set[str] = set()
        self.used_modules: set[str] = set()
        self.op_footprints: dict[str, dict[int, list[int | None]]] = {}
        self.op_extern: dict[str, bool] = {}
        self.op_nccl: dict[str, bool] = {}
        self.op_iface: dict[str, list[tuple]] = {}  # parsed param types, per op

    def add(self, rule: str, path: str, message: str) -> None:
        self.out.add(rule, path, message)


def shape_bytes(scope: Scope, dtype: str, shape: list, path: str, rule_prefix: str) -> int | None:
    """Check a shape (non-empty, no zero dim, declared vars, no u64 overflow); return its bytes."""
    if not shape:
        scope.add(f"{rule_prefix}.empty_shape", f"{path}.shape", "shape must not be empty")
        return None
    total, ok = DTYPE_BYTES[dtype], True
    for i, d in enumerate(shape):
        if isinstance(d, str):
            scope.used_vars.add(d)
            if d not in scope.vars:
                scope.add(f"{rule_prefix}.unknown_var", f"{path}.shape[{i}]",
                          f"shape names unknown var `{d}`")
                ok = False
                continue
            d = scope.hi[d]
        elif d == 0:
            scope.add(f"{rule_prefix}.zero_dim", f"{path}.shape[{i}]", "zero-sized dimension")
            ok = False
            continue
        total *= d
    if ok and total > U64_MAX:
        scope.add(f"{rule_prefix}.size_overflow", f"{path}.shape",
                  "byte size overflows u64 at var upper bounds")
        return None
    return total if ok else None


def parse(obj: Any) -> Manifest | Diagnostic:
    try:
        return Manifest.from_json(obj)
    except ModelError as exc:
        rule = "parse.json" if exc.fatal == "json" else "parse.schema"
        return Diagnostic(rule, exc.path, exc.fact)


def verify(manifest: Manifest | dict) -> list[Diagnostic]:
    """Every violation kern would report, in rule-group order; empty means verified."""
    from manifests import rules_decl, rules_ops, rules_programs

    if not isinstance(manifest, Manifest):
        parsed = parse(manifest)
        if isinstance(parsed, Diagnostic):
            return [parsed]
        manifest = parsed
    out = Collector()
    scope = Scope(manifest, out)
    rules_decl.check(scope)
    rules_ops.check(scope)
    rules_programs.check(scope)
    return out.items


def verify_file(path: str | os.PathLike) -> list[Diagnostic]:
    """Read strictly (size limit, duplicate keys) then verify. Unreadable input raises.

    The cyclic garbage collector is paused meanwhile: a 40 MB manifest is millions of fresh,
    acyclic objects, and the collector's passes over them cost more than reading them (measured
    in docs/benchmarks.md). Nothing here makes a cycle, so nothing is left for it to find.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        parsed = parse(jsonload.load_path(path))
        if isinstance(parsed, Diagnostic):
            if parsed.rule == "parse.json":  # the text itself, found only with the schema
                raise jsonload.ManifestReadError(f"{path}: not a manifest: {parsed.message}")
            return [parsed]
        return verify(parsed)
    finally:
        if paused:
            gc.enable()
