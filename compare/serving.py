"""What a host must know to serve one sequence through a manifest, read from the manifest alone.

kern only replays declared launches; the host around it writes the inputs. A manifest declares
each input's meaning as a `fill` kind (token, position, slot, seq_len, cu_seqlens, blocks,
valid) and its limits as a `domain`, so the host needs no model-specific wiring: it finds the
inputs by fill, the logits as the one float buffer whose last dimension is the vocabulary, the
prefill program as the one whose row count is a var and the decode program as the one run at one
row. Everything here is checked on the CPU before a GPU is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vocab.errors import MineError

FLOATS = ("bf16", "f16", "f32")
KNOWN_INPUTS = ("token", "position", "slot", "seq_len", "cu_seqlens", "blocks", "valid")


class ManifestError(MineError, ValueError):
    """A manifest a one-sequence host cannot serve, in one sentence saying what it lacks."""


@dataclass(frozen=True)
class Serving:
    prefill: Optional[str]  # program name; None when the manifest has only a one-row program
    decode: str
    inputs: dict  # fill kind -> buffer name
    next_token: Optional[str]  # the `tokens` output (the manifest's own greedy choice)
    logits: str
    vocab: int
    chunk: int  # the most rows one prefill takes
    max_len: int  # the longest context (positions) the manifest allows one sequence
    block_size: int  # positions per KV page (1 when the manifest has no block table)
    binds: dict  # weight buffer -> [bind entries]


def _dim(m: dict, d):
    """A shape entry at its largest: a var at its max, a constant by name, an int as itself."""
    if isinstance(d, str):
        if d in m.get("vars", {}):
            return m["vars"][d]["max"]
        return m.get("constants", {}).get(d, d)
    return d


def _batch_rows(p: dict):
    b = p.get("batch") or {}
    return b.get("rows")


def _programs(m: dict) -> tuple[Optional[str], str]:
    progs = {n: p for n, p in m.get("programs", {}).items() if not p.get("once")}
    one = [n for n, p in progs.items() if _batch_rows(p) == 1]
    many = [n for n, p in progs.items() if isinstance(_batch_rows(p), str)]
    pick = lambda names, pref: pref if pref in names else (names[0] if len(names) == 1 else None)  # noqa: E731
    decode, prefill = pick(one, "decode"), pick(many, "prefill")
    if decode is None:
        raise ManifestError(f"the manifest has no program that runs one row (a decode step) it can be "
                            f"judged on; its programs: {sorted(progs) or 'none'}")
    return prefill, decode


def serving(m: dict, logits: Optional[str] = None) -> Serving:
    """How to serve one sequence through manifest `m` (a verified manifest document)."""
    bufs = m.get("buffers", {})
    inputs: dict = {}
    for name, b in sorted(bufs.items()):
        f = b.get("fill")
        if b.get("kind") != "input" or f is None:
            continue
        if f not in KNOWN_INPUTS:
            raise ManifestError(f"input buffer {name!r} has fill {f!r}, which a one-sequence host "
                                f"does not know how to write")
        if f in inputs:
            raise ManifestError(f"inputs {inputs[f]!r} and {name!r} both have fill {f!r}")
        inputs[f] = name
    for need in ("token", "position"):
        if need not in inputs:
            raise ManifestError(f"the manifest has no input with fill {need!r}, so it cannot be fed a sequence")
    tok = bufs[inputs["token"]]
    vmax = (tok.get("domain") or {}).get("max")
    if not isinstance(vmax, int):
        raise ManifestError(f"token input {inputs['token']!r} has no domain max, so the vocabulary is unknown")
    vocab = vmax + 1
    if logits is None:
        cands = [n for n, b in sorted(bufs.items())
                 if b.get("dtype") in FLOATS and b.get("kind") in ("workspace", "output", "inout")
                 and b.get("shape") and _dim(m, b["shape"][-1]) == vocab]
        if len(cands) > 1:
            # one per program (a compiled manifest's decode.out and prefill.out): the decode program's
            dec = _programs(m)[1]
            wrote = {a.get("buf") for c in m["programs"][dec].get("calls", []) for a in c.get("args", [])
                     if isinstance(a, dict)}
            cands = [n for n in cands if n in wrote] or cands
        if len(cands) != 1:
            raise ManifestError(f"the manifest has {'no' if not cands else len(cands)} float buffer(s) "
                                f"whose last dimension is the vocabulary ({vocab})"
                                + (f": {cands}; name the logits with --logits" if cands else
                                   ", so it has no logits output to compare"))
        logits = cands[0]
    elif logits not in bufs:
        raise ManifestError(f"the manifest has no buffer {logits!r} (--logits)")
    lb = bufs[logits]
    if lb.get("dtype") not in FLOATS or _dim(m, lb["shape"][-1]) != vocab:
        raise ManifestError(f"buffer {logits!r} is {lb.get('dtype')} {lb.get('shape')}, not float logits over "
                            f"the vocabulary ({vocab})")
    prefill, decode = _programs(m)
    chunk = _dim(m, _batch_rows(m["programs"][prefill])) if prefill else 1
    limits = []
    dom = lambda n: bufs[n].get("domain") or {}  # noqa: E731
    if isinstance(dom(inputs["position"]).get("max"), int):
        limits.append(dom(inputs["position"])["max"] + 1)
    if "seq_len" in inputs and isinstance(dom(inputs["seq_len"]).get("max"), int):
        limits.append(dom(inputs["seq_len"])["max"])
    block = 1
    if "blocks" in inputs:
        bb = bufs[inputs["blocks"]]
        block = int(dom(inputs["blocks"]).get("stride", 1))
        limits.append(int(_dim(m, bb["shape"][-1])) * block)
    if not limits:
        raise ManifestError("the manifest bounds no input's positions, so the longest context is unknown")
    binds = {n: b.get("bind", []) for n, b in bufs.items() if b.get("kind") == "weight"}
    nxt = next((n for n, b in sorted(bufs.items()) if b.get("kind") == "output" and b.get("fill") == "tokens"), None)
    return Serving(prefill, decode, inputs, nxt, logits, vocab, int(chunk), min(limits), block, binds)


def groups(m: dict, program: str) -> int:
    """The most sequences program `program` runs in one call (its `batch.groups`; 1 without a batch)."""
    return int((m["programs"][program].get("batch") or {}).get("groups", 1))


def elements(m: dict, b: dict) -> Optional[int]:
    """A buffer's element count at its largest shape, None when a dim is unresolved."""
    n = 1
    for d in b.get("shape", []):
        d = _dim(m, d)
        if not isinstance(d, int):
            return None
        n *= d
    return n
