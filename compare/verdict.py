"""The judgement of one teacher-forced step and of a run: pure functions over numbers.

At a generated position the reference gives its top-k ids with log-probabilities l_i (best
first; `want` is the token it chose) and kern gives its logits z over the whole vocabulary. A
log-probability is a logit less a per-position constant, so the two are compared as
differences from the reference's token:

    error = max over the reference's top-k ids i of |(z_i - z_want) - (l_i - l_want)|

The bound on that error is bf16 noise at the logits' magnitude: `tol_ulps` bf16 steps of the
largest |z_i| over those ids (bf16 keeps 8 significant bits, so one step at |z| in [2, 4) is
2**-6), never less than `tol` (absolute). A step is

- `match`: kern's top-1 is the reference's token and the error is within the bound;
- `flip`: kern's top-1 is another of the reference's top-k ids and the reference's own margin
  l_want - l_kern is within the bound (the two engines disagree only where the reference itself
  could not tell the tokens apart) and the error is within the bound: allowed;
- `wrong`: kern's top-1 is outside the reference's top-k, or the margin exceeds the bound;
- `off`: the top-1 agrees but kern's logit differences are off by more than the bound (a broken
  manifest can keep a flat model's top-1 for a while; its logits cannot hide).

`wrong` and `off` fail the run; the first of them, in request order then position, is named.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

VERDICTS = ("match", "flip", "wrong", "off")
FAILING = ("wrong", "off")
DEFAULT_TOL_ULPS = 8.0
BF16_BITS = 8  # significant bits, the implicit one included


def bf16_step(x: float) -> float:
    """The spacing of bf16 values at |x| (of the smallest normal below it)."""
    a = abs(float(x))
    if a < 2.0 ** -126:
        return 2.0 ** (-126 - BF16_BITS + 1)
    return 2.0 ** (math.floor(math.log2(a)) - BF16_BITS + 1)


@dataclass(frozen=True)
class Bounds:
    tol_ulps: float = DEFAULT_TOL_ULPS
    tol: float = 0.0  # absolute floor on the bound, in logit units

    def at(self, magnitude: float) -> float:
        return max(self.tol, self.tol_ulps * bf16_step(magnitude))


@dataclass(frozen=True)
class StepResult:
    request: int
    step: int  # index into the request's output
    position: int  # the position of the token fed (len(prompt) - 1 + step)
    want: int  # the reference's token
    got: int  # kern's top-1
    verdict: str
    error: float  # max |difference error| over the reference's top-k ids
    bound: float
    margin: Optional[float]  # the reference's l_want - l_got when they differ and got is in its top-k
    rel_rms: float  # RMS of the difference errors over the RMS of the reference's differences

    def as_dict(self) -> dict:
        return asdict(self)


def judge(request: int, step: int, position: int, want: int, ids: Sequence[int], logprobs: Sequence[float],
          z_at_ids: Sequence[float], got: int, bounds: Bounds) -> StepResult:
    """One step. `z_at_ids[i]` is kern's logit of `ids[i]`; `got` is kern's top-1 over the vocabulary."""
    if len(ids) != len(logprobs) or len(ids) != len(z_at_ids):
        raise ValueError("ids, logprobs and logits at the ids must be as long as each other")
    k = list(ids).index(want)
    dz = [z - z_at_ids[k] for z in z_at_ids]
    dl = [lp - logprobs[k] for lp in logprobs]
    errs = [abs(a - b) for a, b in zip(dz, dl)]
    error = max(errs)
    spread = math.sqrt(sum(d * d for d in dl) / len(dl))
    rel = math.sqrt(sum(e * e for e in errs) / len(errs)) / spread if spread > 0 else 0.0
    bound = bounds.at(max(abs(z) for z in z_at_ids))
    margin = None
    if got == want:
        verdict = "match" if error <= bound else "off"
    elif got in ids:
        margin = logprobs[k] - logprobs[list(ids).index(got)]
        verdict = "flip" if margin <= bound and error <= bound else "wrong"
    else:
        verdict = "wrong"
    return StepResult(request, step, position, want, got, verdict, error, bound, margin, rel)


def agreement(want: Sequence[int], got: Sequence[int]) -> int:
    """How many leading tokens of a free-running run equal the reference's."""
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


@dataclass(frozen=True)
class Summary:
    steps: int
    counts: dict  # verdict -> number of steps
    max_error: float
    max_bound: float
    max_flip_margin: Optional[float]  # the largest reference margin at an allowed flip
    rel_rms_max: float
    first_failure: Optional[StepResult]
    passed: bool


def summarize(results: Sequence[StepResult]) -> Summary:
    counts = {v: 0 for v in VERDICTS}
    for r in results:
        counts[r.verdict] += 1
    flips = [r.margin for r in results if r.verdict == "flip"]
    first = next((r for r in results if r.verdict in FAILING), None)
    return Summary(len(results), counts, max((r.error for r in results), default=0.0),
                   max((r.bound for r in results), default=0.0), max(flips) if flips else None,
                   max((r.rel_rms for r in results), default=0.0), first, first is None and bool(results))
