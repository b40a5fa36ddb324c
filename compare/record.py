"""Recording a reference: checks on this host, then the engine's recorder in a child process.

Why a child: the recorder imports the engine (vLLM), which takes tens of seconds, owns the GPU and
sets process-wide state; `mine` itself never imports it. Everything the child would only find out
after starting the engine (bad options, no checkpoint, no engine here) is refused first, in one
sentence.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from compare import checkpoint as ck
from vocab.errors import UsageError

ENGINES = ("vllm", "transformers")
MODES = ("eager", "default")
# the recorder module each engine runs in its child process, and the modes it has
RECORDER = {"vllm": "compare.record_vllm", "transformers": "compare.record_hf"}
ENGINE_MODES = {"vllm": MODES, "transformers": ("eager",)}


@dataclass(frozen=True)
class Plan:
    checkpoint: Path
    engine: str
    mode: str
    lengths: tuple[int, ...]
    new: int
    max_model_len: int


def check(checkpoint: Path, *, engine: str, mode: str, lengths: str, new: int, max_model_len: int) -> Plan:
    """The recording's options and checkpoint, checked; the engine is looked for, not imported."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: only {', '.join(ENGINES)} can be recorded so far", value=engine,
                         limit=ENGINES)
    if mode not in MODES:
        raise UsageError(f"--mode {mode!r} is not {' or '.join(MODES)}", value=mode, limit=MODES)
    if mode not in ENGINE_MODES[engine]:
        raise UsageError(f"--mode {mode!r}: {engine} records in {' or '.join(ENGINE_MODES[engine])} mode only",
                         value=mode, limit=ENGINE_MODES[engine])
    try:
        ns = tuple(int(x) for x in lengths.split(","))
    except ValueError:
        raise UsageError(f"--lengths {lengths!r} is not a comma-separated list of integers", value=lengths) from None
    if not ns or min(ns) < 1:
        raise UsageError(f"--lengths {lengths!r}: every prompt needs at least one token", value=lengths)
    if max(ns) + new > max_model_len:
        raise UsageError(f"a {max(ns)}-token prompt and {new} new tokens exceed --max-model-len {max_model_len}",
                         value=max(ns) + new, limit=max_model_len)
    ck.files(checkpoint)
    if not ck.config(checkpoint):
        raise UsageError(f"checkpoint {checkpoint} has no config.json", value=checkpoint)
    return Plan(Path(checkpoint), engine, mode, ns, new, max_model_len)


def run(plan: Plan, out: Path, *, seed: int = 7, prompts: Optional[Path] = None, top_k: int = 20) -> int:
    """Start the engine's recorder (`compare.record_vllm`, `compare.record_hf`) and wait for it; its
    exit status."""
    if importlib.util.find_spec(plan.engine) is None:
        raise UsageError(f"{plan.engine} is not importable here; record the reference on a host that serves with it")
    args = [sys.executable, "-m", RECORDER[plan.engine], str(plan.checkpoint), str(out),
            "--lengths", ",".join(map(str, plan.lengths)), "--new", str(plan.new), "--seed", str(seed),
            "--top-k", str(top_k)]
    if plan.engine == "vllm":
        args += ["--mode", plan.mode, "--max-model-len", str(plan.max_model_len)]
    if prompts is not None:
        args += ["--prompts", str(prompts)]
    return subprocess.call(args, env=dict(os.environ))
