"""Cut a whole-model manifest into pipeline stages, with kern's `cut` semantics.

A stage is an ordinary manifest: the serving shell wires stage s's outputs to stage s+1's inputs by
name, so the only thing a cut may pass between stages is runtime scratch (workspaces). Everything
else a stage needs (weights, states, once/derive setup) it owns itself.

Contract: `cut(manifest, at) -> list[dict]` takes a manifest dict that passes the verifier and
strictly increasing call indices (it is verified first); every batch ("driven") program is cut at the same indices.
It returns len(at)+1 stage dicts, each re-verified, or raises `CutRefused` (a ValueError) carrying
every reason at once. Semantics:
  - a call's accesses are its `buf`/`state` args with the op interface's direction; a buffer
    crosses the cut at index a when calls[a:] read it before fully overwriting it (only an `out`
    at offset 0 kills) and calls[:a] wrote it;
  - crossing buffers must be workspaces; calls before the last stage may not write outputs or
    carries; a crossing buffer a stage does not touch "passes through untouched" (refused);
    a (state, offset) region belongs to one stage;
  - a crossing buffer is `output` on the stage before the cut, `input` (only read) or `inout`
    (also written, or also leaving) on the stage after, with `export: true` when arriving;
  - once/derive programs are sliced backwards to the calls producing what the stage reads;
    buffers, states, ops, modules, vars and constants are kept only when the stage names them; a
    domain `index_into` a dropped state moves to a kept state of the same kind, else it is dropped;
  - `cut = {id, stage, stages}`, id = FNV-1a-64 over the source manifest's pretty JSON then each
    cut index as u64 little-endian, as 16 hex digits.
Not reproduced: kern's exact pretty-printer, so ids agree with kern's only where the JSON text does;
harness programs (neither batch, once nor derive) are not carried into stages.
"""

from __future__ import annotations

import copy
import json
import struct
from typing import Any, Callable, Iterable

from vocab.dumps import pretty
from vocab.errors import MineError
from vocab.wire import param_direction

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


class NoSuchCall(MineError, LookupError):
    """A cut point names no call of the batch programs (an unknown label, a negative index)."""


class CutRefused(MineError, ValueError):
    """The manifest cannot be cut where asked; `reasons` lists why."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("manifest cannot be cut: " + "; ".join(reasons))


def cut_id(manifest: dict, at: Iterable[int]) -> str:
    h = FNV_OFFSET
    data = pretty(manifest).encode() + b"".join(
        struct.pack("<Q", a) for a in at)
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def accesses(manifest: dict, call: dict) -> list[tuple[str, str, str, int]]:
    """(`buf`|`state`, name, direction, offset) for each pointer arg of a call, in arg order."""
    params = manifest["ops"][call["op"]]["params"]
    out = []
    for arg, ptype in zip(call.get("args", []), params):
        d = param_direction(ptype)
        for kind in ("buf", "state"):
            if d and kind in arg:
                out.append((kind, arg[kind], d, int(arg.get("offset", 0))))
    return out


def _reads_writes(manifest, calls):
    reads, writes = set(), set()
    for call in calls:
        for kind, name, d, _ in accesses(manifest, call):
            (reads if d in ("in", "inout") else set()).add((kind, name))
            (writes if d in ("out", "inout") else set()).add((kind, name))
    return reads, writes


def live_in(manifest: dict, calls: list[dict]) -> set[str]:
    """Buffers the calls read before a full overwrite (an `out` access at offset 0)."""
    killed, live = set(), set()
    for call in calls:
        acc = [a for a in accesses(manifest, call) if a[0] == "buf"]
        live |= {n for _, n, d, _ in acc if d in ("in", "inout") and n not in killed}
        killed |= {n for _, n, d, off in acc if d == "out" and off == 0}
    return live


def written(manifest: dict, calls: list[dict]) -> set[str]:
    return {n for k, n, d, _ in (a for c in calls for a in accesses(manifest, c))
            if k == "buf" and d in ("out", "inout")}


def _driven(manifest: dict) -> list[str]:
    return sorted(p for p, prog in manifest["programs"].items() if prog.get("batch"))


def _preconditions(manifest: dict, at: list[int]) -> list[str]:
    why = []
    if manifest.get("topology"):
        why.append("a manifest with a topology spans several ranks; only single-rank manifests are cut")
    if manifest.get("cut"):
        why.append("the manifest is already a pipeline stage")
    if not at:
        why.append("no cut index given")
    elif at[0] <= 0:
        why.append(f"the first cut index is {at[0]}; a stage needs at least one call")
    if any(b <= a for a, b in zip(at, at[1:])):
        why.append(f"cut indices {at} are not strictly increasing")
    driven = _driven(manifest)
    if not driven:
        why.append("no batch program: there is no driven program to cut")
    for p in driven:
        n = len(manifest["programs"][p]["calls"])
        if at and n <= at[-1]:
            why.append(f"program `{p}` has {n} calls, not more than the last cut index {at[-1]}")
    return why


def _crossings(manifest, at, driven):
    """Per cut k: crossing buffer -> first (program, index) where it crosses; plus refusals."""
    why, crossing = [], [dict() for _ in at]
    bounds = [0, *at, None]
    for p in driven:
        calls = manifest["programs"][p]["calls"]
        stage_calls = [calls[bounds[s]:bounds[s + 1]] for s in range(len(at) + 1)]
        for k, a in enumerate(at):
            for name in sorted(live_in(manifest, calls[a:]) & written(manifest, calls[:a])):
                crossing[k].setdefault(name, (p, a))
        for s, sc in enumerate(stage_calls[:-1]):
            for name in sorted(written(manifest, sc)):
                kind = manifest["buffers"][name]["kind"]
                if kind in ("output", "carry"):
                    why.append(f"program `{p}` stage {s} writes {kind} buffer `{name}`; only the last stage may")
        for k in range(len(at)):
            for name, (_, a) in crossing[k].items():
                for s in (k, k + 1):
                    touched = {n for c in stage_calls[s] for kd, n, _, _ in accesses(manifest, c) if kd == "buf"}
                    if name not in touched:
                        why.append(f"buffer `{name}` crossing the cut at call {a} passes through stage {s} "
                                   f"of program `{p}` untouched")
    for k, names in enumerate(crossing):
        for name, (p, a) in sorted(names.items()):
            kind = manifest["buffers"][name]["kind"]
            if kind != "workspace":
                why.append(f"{kind} buffer `{name}` crosses the cut at call {a} of program `{p}`; only workspaces cross")
    return crossing, sorted(set(why), key=why.index)


def _state_regions(manifest, at, driven) -> list[str]:
    owner: dict[tuple[str, int], int] = {}
    why = []
    bounds = [0, *at, None]
    for p in driven:
        calls = manifest["programs"][p]["calls"]
        for s in range(len(at) + 1):
            for c in calls[bounds[s]:bounds[s + 1]]:
                for kind, name, _, off in accesses(manifest, c):
                    if kind == "state":
                        first = owner.setdefault((name, off), s)
                        if first != s:
                            msg = f"state `{name}` at offset {off} is touched by stages {first} and {s}"
                            if msg not in why:
                                why.append(msg)
    return why


def _slice_backwards(manifest, calls, needed: set) -> list[dict]:
    kept = []
    for call in reversed(calls):
        reads, writes = _reads_writes(manifest, [call])
        if writes & needed:
            kept.append(call)
            needed |= reads
    return kept[::-1]


def _strings(obj: Any) -> set[str]:
    if isinstance(obj, str):
        return {obj}
    if isinstance(obj, dict):
        return set().union(*(_strings(v) for v in obj.values()), set(obj))
    if isinstance(obj, list):
        return set().union(*(_strings(v) for v in obj)) if obj else set()
    return set()


def _state_kind(state: dict) -> str:
    for key in ("bytes_per_token", "bytes_per_seq", "host"):
        if state.get(key):
            return key
    return "bytes"


def _stage(manifest, at, s, crossing, driven, cid) -> dict:
    bounds = [0, *at, None]
    programs = {}
    for p in driven:
        prog = copy.deepcopy(manifest["programs"][p])
        prog["calls"] = prog["calls"][bounds[s]:bounds[s + 1]]
        programs[p] = prog
    stage_calls = [c for p in driven for c in programs[p]["calls"]]
    needed = set().union(*_reads_writes(manifest, stage_calls))
    for p, prog in sorted(manifest["programs"].items()):
        if p not in driven and (prog.get("once") or prog.get("derive")):
            kept = _slice_backwards(manifest, prog["calls"], set(needed))
            if kept:
                programs[p] = {**copy.deepcopy(prog), "calls": copy.deepcopy(kept)}
    all_calls = [c for prog in programs.values() for c in prog["calls"]]
    bufs = {a["buf"] for c in all_calls for a in c.get("args", []) if "buf" in a}
    states = {a["state"] for c in all_calls for a in c.get("args", []) if "state" in a}
    ops = {c["op"] for c in all_calls}
    out: dict[str, Any] = {"schema_version": manifest["schema_version"], "model": manifest["model"]}
    buffers = {n: copy.deepcopy(manifest["buffers"][n]) for n in sorted(bufs)}
    arriving = set(crossing[s - 1]) if s > 0 else set()
    leaving = set(crossing[s]) if s < len(at) else set()
    stage_writes = written(manifest, stage_calls)
    for n in sorted(arriving | leaving):
        b = buffers[n]
        if n in arriving:
            b["kind"] = "inout" if (n in stage_writes or n in leaving) else "input"
            b["export"] = True
        else:
            b["kind"] = "output"
            b.pop("export", None)
    kept_states = {n: copy.deepcopy(manifest["states"][n]) for n in sorted(states)}
    for b in buffers.values():
        target = (b.get("domain") or {}).get("index_into")
        if target is None or target in buffers or target in kept_states:
            continue
        old = (manifest.get("states") or {}).get(target)
        same = [n for n, st in kept_states.items() if old is not None and _state_kind(st) == _state_kind(old)]
        if same:
            b["domain"]["index_into"] = same[0]
        else:
            del b["domain"]
    kept_ops = {n: copy.deepcopy(manifest["ops"][n]) for n in sorted(ops)}
    used_modules = {l["module"] for op in kept_ops.values() for l in op["impl"]["launches"] if "module" in l}
    names = _strings([buffers, kept_ops, programs])
    if manifest.get("constants"):
        consts = {k: v for k, v in manifest["constants"].items() if k in names}
        if consts:
            out["constants"] = consts
    out["cut"] = {"id": cid, "stage": s, "stages": len(at) + 1}
    out["vars"] = {k: copy.deepcopy(v) for k, v in (manifest.get("vars") or {}).items() if k in names}
    if kept_states:
        out["states"] = kept_states
    out["buffers"] = buffers
    out["modules"] = {k: copy.deepcopy(v) for k, v in manifest["modules"].items() if k in used_modules}
    out["ops"] = kept_ops
    out["programs"] = programs
    return out


def default_verifier() -> Callable[[dict], list[str]]:
    """The project's verifier; kern-llm's when that is not importable (both give sentences)."""
    try:
        from manifests.verify import verify
    except ImportError:
        return _kern_verify
    return lambda m: [str(d) for d in verify(m)]


def _kern_verify(stage: dict) -> list[str]:
    import os
    import tempfile

    from manifests.kern_oracle import verdict  # kern-llm: test-only; the project's verifier is preferred

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stage.json")
        with open(path, "w") as f:
            json.dump(stage, f)
        v = verdict(path, tmp)
    if v.accepted and v.exc is not None and "cuda" not in str(v.exc).lower():
        raise v.exc  # accepted means: it went on to look for libcuda; anything else is kern's own failure
    return v.violations


def cut(manifest: dict, at: list[int], verify: Callable[[dict], list[str]] | None = None) -> list[dict]:
    at = [int(a) for a in at]
    check = verify or default_verifier()
    bad = check(manifest)
    if bad:
        raise CutRefused([f"the manifest does not verify: {msg}" for msg in bad])
    why = _preconditions(manifest, at)
    if why:
        raise CutRefused(why)
    driven = _driven(manifest)
    crossing, why = _crossings(manifest, at, driven)
    why += _state_regions(manifest, at, driven)
    if why:
        raise CutRefused(why)
    cid = cut_id(manifest, at)
    stages = [_stage(manifest, at, s, crossing, driven, cid) for s in range(len(at) + 1)]
    problems = [f"stage {s}: {msg}" for s, st in enumerate(stages) for msg in check(st)]
    if problems:
        raise CutRefused(problems)
    return stages


def resolve_labels(manifest: dict, labels: list[str]) -> list[int]:
    """Cut points by call label (the first call so labelled in the batch programs) or index."""
    out = []
    for label in labels:
        if str(label).isdigit():
            out.append(int(label))
            continue
        if str(label).startswith("-") and str(label)[1:].isdigit():
            raise NoSuchCall(f"cut index {label} is negative; give a call index of at least 1 or a call label",
                             value=label, limit=1)
        found = [i for p in _driven(manifest) for i, c in enumerate(manifest["programs"][p]["calls"])
                 if c.get("label") == label]
        if not found:
            raise NoSuchCall(f"no call labelled `{label}` in the batch programs", value=label)
        out.append(min(found))
    return out
