"""The requests a capture served, and the steps an engine plausibly ran them in.

Why: an input's bytes are named by what they hold *for the requests of that step* -- the prompt's
token ids or the previous step's outputs, positions from the context length, sequence lengths,
query start offsets. The capture does not say which requests a forward served; a requests file
does (the truth files of the repository's captures: `{"requests": [...]}`, requests served one
after the other, as examples/vllm_qwen3/run_suite.py sends them without --batches; or `{"groups":
[{"requests": [...]}]}`, each group's requests submitted together; each request `{"prompt": [ids],
"output": [ids]}`, optionally `{"scheduler": {"max_num_batched_tokens": N}}`).

`steps` turns the requests into a hypothesis of the engine's steps, by continuous batching with no
engine names: groups run one after the other (a group's requests were submitted together); in a
step, the group's running sequences decode one token each (in submission order), then prompts
fill what the token budget leaves (in submission order, the last one cut: chunked prefill). A
prompt's last chunk yields its first output token; a sequence decodes until it has produced all
of its outputs, feeding its previous output at the next position. The hypothesis is only a
candidate list: `compiler.fills` accepts a step for a forward only where the copied bytes equal
the step's values, in any order of its sequences, and says which step that was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from compiler.errors import CompileError


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    group: int = 0


@dataclass(frozen=True)
class Run:
    """One sequence's part of a step: `tokens` fed at positions start, start + 1, ..."""
    request: int              # index into the requests, in submission order
    start: int                # the context length before this step (its first position)
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:     # the sequence length after this step
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class Step:
    index: int
    runs: tuple[Run, ...]

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.runs)

    @property
    def prefill(self) -> bool:
        """Some sequence feeds more than one token (a prompt or a chunk of it)."""
        return any(len(r.tokens) > 1 or r.start == 0 for r in self.runs)


@dataclass
class Requests:
    requests: list[Request]
    budget: int | None = None        # tokens a step may hold (the scheduler's, when the file gives it)
    source: str = ""
    steps: list[Step] = field(default_factory=list)


def read_requests(path: Path) -> Requests:
    """A requests file (module docstring) -> Requests with their step hypothesis; one sentence
    (CompileError) when the file holds no requests of that shape."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CompileError(f"--requests {path}: not a readable JSON file ({exc.__class__.__name__})") from None
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if groups is None and isinstance(doc, dict) and isinstance(doc.get("requests"), list):
        groups = [{"requests": [r]} for r in doc["requests"]]     # served one after the other
    reqs: list[Request] = []
    for g, grp in enumerate(groups or []):
        for r in (grp.get("requests") if isinstance(grp, dict) else None) or []:
            p, o = r.get("prompt") if isinstance(r, dict) else None, r.get("output") if isinstance(r, dict) else None
            if not (isinstance(p, list) and p and isinstance(o, list) and all(isinstance(v, int) for v in p + o)):
                raise CompileError(f"--requests {path}: a request needs a non-empty `prompt` and an `output`, "
                                   f"lists of token ids")
            reqs.append(Request(tuple(p), tuple(o), g))
    if not reqs:
        raise CompileError(f"--requests {path}: holds no requests ({{\"requests\": [...]}} or "
                           f"{{\"groups\": [{{\"requests\": [...]}}]}})")
    sched = doc.get("scheduler") if isinstance(doc.get("scheduler"), dict) else {}
    budget = sched.get("max_num_batched_tokens")
    out = Requests(reqs, budget if isinstance(budget, int) and budget > 0 else None, str(path))
    out.steps = steps(out.requests, out.budget)
    return out


def steps(reqs: list[Request], budget: int | None = None) -> list[Step]:
    """The continuous-batching hypothesis of the module docstring."""
    out: list[Step] = []
    for g in sorted({r.group for r in reqs}):
        members = [i for i, r in enumerate(reqs) if r.group == g]
        fed = {i: 0 for i in members}          # prompt tokens fed so far
        made = {i: 0 for i in members}         # outputs produced so far
        while any(made[i] < len(reqs[i].output) for i in members):
            runs, room = [], budget if budget is not None else 1 << 62
            for i in members:                  # running sequences decode first
                r = reqs[i]
                if fed[i] == len(r.prompt) and 0 < made[i] < len(r.output) and room > 0:
                    runs.append(Run(i, len(r.prompt) + made[i] - 1, (r.output[made[i] - 1],)))
                    room -= 1
            for i in members:                  # then prompts, chunked to the budget
                r = reqs[i]
                if fed[i] < len(r.prompt) and room > 0:
                    n = min(room, len(r.prompt) - fed[i])
                    runs.append(Run(i, fed[i], r.prompt[fed[i]:fed[i] + n]))
                    room -= n
            if not runs:
                break
            for run in runs:
                r = reqs[run.request]
                if fed[run.request] < len(r.prompt):
                    fed[run.request] += len(run.tokens)
                    if fed[run.request] == len(r.prompt):
                        made[run.request] = 1
                else:
                    made[run.request] += 1
            out.append(Step(len(out), tuple(runs)))
    return out
