"""The reference a manifest is judged against: an engine's greedy run with its top-k log-probabilities.

One JSON file (docs/compare.md), written by a recorder that runs inside the engine's own process
(`compare.record_vllm`) and read here, where every field is checked before use: a reference is
often carried between machines and edited by hand, and a wrong one must be refused in one
sentence, never judged.
"""

from __future__ import annotations

import json
import lzma
import math
from dataclasses import dataclass, field
from pathlib import Path

from vocab.errors import MineError

FORMAT = "mine-reference/1"
MODEL_KEYS = ("model_type", "vocab_size", "num_hidden_layers", "hidden_size")


class ReferenceError(MineError, ValueError):
    """A reference file that cannot be used, in one sentence naming it and the value at fault."""


@dataclass(frozen=True)
class Step:
    """The reference's top-k at one generated position, best first (ids and natural-log probabilities)."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # the engine's greedy tokens; output[j] was chosen at steps[j]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Reference:
    engine: str  # e.g. "vllm 0.26.0"
    mode: str  # the engine's mode: eager, default (compile + CUDA graphs), ...
    model: dict  # MODEL_KEYS from the checkpoint's config
    checkpoint: str  # compare.checkpoint.fingerprint of the checkpoint it ran
    top_k: int
    requests: tuple[Request, ...]
    made: dict = field(default_factory=dict)  # date, machine, software: provenance, not judged

    @property
    def vocab(self) -> int:
        return int(self.model["vocab_size"])


def best_first(pairs: dict) -> Step:
    """A step from {token id: log-probability}, best first, each log-probability at most 0 (a
    recorder's float rounding must not make one positive)."""
    best = sorted(pairs.items(), key=lambda p: -p[1])
    return Step(tuple(i for i, _ in best), tuple(min(lp, 0.0) for _, lp in best))


def to_json(ref: Reference) -> dict:
    return {
        "format": FORMAT, "engine": ref.engine, "mode": ref.mode, "made": ref.made, "model": ref.model,
        "checkpoint": {"fingerprint": ref.checkpoint}, "top_k": ref.top_k,
        "requests": [{"prompt": list(r.prompt), "output": list(r.output),
                      "top": [[[i, lp] for i, lp in zip(s.ids, s.logprobs)] for s in r.steps]}
                     for r in ref.requests],
    }


def write(ref: Reference, path: Path) -> None:
    Path(path).write_text(json.dumps(to_json(ref), allow_nan=False) + "\n")


def _int(v, what: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v >= hi):
        limit = f"an integer >= {lo}" + (f" and < {hi}" if hi is not None else "")
        raise ReferenceError(f"{what} is {v!r}, not {limit}")
    return v


def _step(raw, what: str, vocab: int) -> Step:
    if not isinstance(raw, list) or not raw:
        raise ReferenceError(f"{what} is not a non-empty list of [token id, log-probability] pairs")
    pairs = []
    for k, p in enumerate(raw):
        if not (isinstance(p, list) and len(p) == 2):
            raise ReferenceError(f"{what}[{k}] is {p!r}, not a [token id, log-probability] pair")
        i = _int(p[0], f"{what}[{k}]'s token id", 0, vocab)
        lp = p[1]
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-6:
            raise ReferenceError(f"{what}[{k}]'s log-probability is {lp!r}, not a finite number <= 0")
        pairs.append((i, float(lp)))
    if len({i for i, _ in pairs}) != len(pairs):
        raise ReferenceError(f"{what} names one token id twice")
    pairs.sort(key=lambda p: -p[1])
    return Step(tuple(i for i, _ in pairs), tuple(lp for _, lp in pairs))


def from_json(doc, where: str = "the reference") -> Reference:
    """A Reference from its JSON document; ReferenceError names the first field at fault."""
    if not isinstance(doc, dict):
        raise ReferenceError(f"{where} is not a JSON object")
    if doc.get("format") != FORMAT:
        raise ReferenceError(f"{where} has format {doc.get('format')!r}, not {FORMAT!r} "
                             f"(written by `mine reference` / compare.record_vllm)")
    model = doc.get("model")
    if not isinstance(model, dict) or any(k not in model for k in MODEL_KEYS):
        raise ReferenceError(f"{where}: 'model' must hold {', '.join(MODEL_KEYS)}")
    vocab = _int(model["vocab_size"], f"{where}: model.vocab_size", 1)
    fp = (doc.get("checkpoint") or {}).get("fingerprint") if isinstance(doc.get("checkpoint"), dict) else None
    if not isinstance(fp, str) or not fp.startswith("sha256:"):
        raise ReferenceError(f"{where}: checkpoint.fingerprint is {fp!r}, not 'sha256:<hex>'")
    top_k = _int(doc.get("top_k"), f"{where}: top_k", 2)
    reqs = doc.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise ReferenceError(f"{where}: 'requests' is not a non-empty list")
    out = []
    for n, r in enumerate(reqs):
        w = f"{where}: request {n}"
        if not isinstance(r, dict):
            raise ReferenceError(f"{w} is not a JSON object")
        prompt, output, top = r.get("prompt"), r.get("output"), r.get("top")
        for name, v in (("prompt", prompt), ("output", output), ("top", top)):
            if not isinstance(v, list) or not v:
                raise ReferenceError(f"{w}: '{name}' is not a non-empty list")
        prompt = tuple(_int(t, f"{w}: prompt[{j}]", 0, vocab) for j, t in enumerate(prompt))
        output = tuple(_int(t, f"{w}: output[{j}]", 0, vocab) for j, t in enumerate(output))
        if len(top) != len(output):
            raise ReferenceError(f"{w} has {len(output)} output tokens but top-k for {len(top)} positions")
        steps = tuple(_step(s, f"{w}: top[{j}]", vocab) for j, s in enumerate(top))
        for j, (tok, s) in enumerate(zip(output, steps)):
            if tok not in s.ids:
                raise ReferenceError(f"{w}: output[{j}] = {tok} is not among that position's top-k ids "
                                     f"(a greedy reference's token is its top-1)")
        out.append(Request(prompt, output, steps))
    for k in ("engine", "mode"):
        if not isinstance(doc.get(k), str):
            raise ReferenceError(f"{where}: '{k}' is {doc.get(k)!r}, not a string")
    made = doc.get("made") if isinstance(doc.get("made"), dict) else {}
    return Reference(doc["engine"], doc["mode"], {k: model[k] for k in MODEL_KEYS}, fp, top_k, tuple(out), made)


def read(path: Path) -> Reference:
    """The reference at `path` (JSON, or JSON compressed with xz when the name ends in .xz)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = (lzma.decompress(raw) if path.suffix == ".xz" else raw).decode()
    except lzma.LZMAError:
        raise ReferenceError(f"reference {path} is not an xz file") from None
    except OSError as e:
        raise ReferenceError(f"cannot read reference {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ReferenceError(f"reference {path} is not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReferenceError(f"reference {path} is not JSON (line {e.lineno}: {e.msg})") from None
    return from_json(doc, f"reference {path}")
