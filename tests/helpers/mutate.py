"""Deterministic single-edit mutations of base manifests, for the differential test.

Contract: `mutants(base)` yields (label, json_text) pairs, each the base with exactly one edit
at one JSON path: a key removed, an unknown key added, a key duplicated (raw text), a value's
type changed, a number nudged across a limit, a name reference broken, an enum misspelled, an
array shortened, emptied or grown. Same base, same list, same order, every run. It never puts
an array where an object was (serde reads some structs from arrays; kern's quirk, not a case
worth pinning).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterator

NUMBERS = (0, 1, 2, 3, 7, 16, 17, 64, 255, 256, 1023, 1025, 65535, 65536, 232448, 232449,
           2**31 - 1, 2**31, 2**32, 2**63, 2**64 - 1, -1)


def _paths(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _set(doc: Any, path: tuple, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


def _delete(doc: Any, path: tuple) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    del parent[path[-1]]
    return doc


def _label(path: tuple) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _names(doc: dict) -> list[str]:
    names = set()
    for section in ("vars", "states", "buffers", "modules", "ops", "programs"):
        names |= set(doc.get(section, {}))
    names |= set(doc.get("topology", {}).get("groups", {}))
    return sorted(names)


ENUMS = (
    ("bf16", "f16", "f32", "fp8e4m3", "fp8e8m0", "i8", "i32", "u32", "i64", "u64", "u8"),
    ("input", "output", "inout", "weight", "source", "workspace", "carry", "peer"),
    ("token", "position", "valid", "slot", "seq_len", "cu_seqlens", "blocks", "tokens", "count",
     "error"),
    ("rows", "groups", "ranks"),
)
DIRS = ("in", "out", "inout")


def _swaps(v: str) -> list[str]:
    """Other members of the enumeration `v` belongs to; for a param type, its neighbours."""
    for enum in ENUMS:
        if v in enum:
            return [x for x in enum if x != v]
    words = v.split()
    if len(words) == 2 and words[0] in DIRS:
        out = [f"{d} {words[1]}" for d in DIRS if d != words[0]]
        if words[1].startswith("buffer<"):
            out += [f"{words[0]} buffer<{t}>" for t in ("bf16", "f32", "i32", "u64")
                    if f"buffer<{t}>" != words[1]] + [f"{words[0]} state"]
        else:
            out.append(f"{words[0]} buffer<f32>")
        return out + ["i32"]
    if v in ("i32", "i64", "f32", "u8"):
        return [x for x in ("i32", "i64", "f32", "u8", "bytes<8>", "in buffer<i32>") if x != v]
    if v.startswith("extern:"):
        return ["extern:nccl_allreduce_f32", "extern:cublaslt_bf16_tn_acc", "kernel_x"]
    return []


def _value_edits(path: tuple, v: Any, names: list[str]) -> Iterator[tuple[str, Any]]:
    if isinstance(v, bool):
        yield "flip", not v
        yield "int", 1
    elif isinstance(v, int):
        near = sorted({v - 1, v + 1, v * 2, v * 1000} | set(NUMBERS) - {v}, key=abs)
        # a deterministic spread: a few nudges plus the limits this position might cross
        for n in [x for x in near if x != v][: 10 if len(path) > 2 else 5]:
            yield f"num {n}", n
        yield "string", "zz"
        yield "float", v + 0.5
        yield "bool", True
    elif isinstance(v, float):
        yield "int", int(v)
        yield "string", "zz"
        yield "neg", -v
    elif isinstance(v, str):
        for alt in _swaps(v):
            yield f"swap {alt}", alt
        yield "misspell", v + "x"
        yield "empty", ""
        yield "int", 3
        for other in names[:: max(1, len(names) // 4)]:
            if other != v:
                yield f"rename {other}", other
    elif isinstance(v, list):
        if v:
            yield "drop-last", v[:-1]
            yield "dup-first", [v[0]] + v
        yield "empty-list", []
        yield "string", "zz"
    elif isinstance(v, dict):
        yield "string", "zz"
        yield "number", 5
        yield "empty-object", {}


def mutants(base: dict) -> Iterator[tuple[str, str]]:
    names = _names(base)
    for path, v in _paths(base):
        where = _label(path)
        if path:
            yield f"{where} removed", json.dumps(_delete(base, path))
            for how, nv in _value_edits(path, v, names):
                yield f"{where} {how}", json.dumps(_set(base, path, nv))
        if isinstance(v, dict):
            grown = copy.deepcopy(v)
            grown["zz_unknown"] = 1
            yield f"{where} unknown key", json.dumps(_set(base, path, grown) if path else grown)
            if v:
                text = json.dumps(v)
                k0 = next(iter(v))
                dup = "{" + json.dumps(k0) + ": " + json.dumps(v[k0]) + ", " + text[1:]
                marker = "\u0000MARK\u0000"
                doc = json.dumps(_set(base, path, marker)) if path else json.dumps(marker)
                yield f"{where} duplicate key", doc.replace(json.dumps(marker), dup)
        if isinstance(v, list) and v and isinstance(v[-1], dict):
            yield f"{where} grown", json.dumps(_set(base, path, v + [v[-1]]))
