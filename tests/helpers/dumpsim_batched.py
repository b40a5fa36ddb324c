"""A batched serving dump with known truth: steps of several sequences and grids of two variables.

Why: the analysis' forward variables (mining/fwdvars.py) and its fits over tokens and sequences
(mining/fit.py) must recover what a batched engine plants, with nothing about the engine known.
The real capture (tests/fixtures/batched/q2b) checks them against vLLM. This simulator plants
every form on purpose, including one the samples cannot separate. It writes the dump format
through tests/helpers/dumpsim.py's writer.

Planted: request groups served one after the other (a gap between groups). In a group, the
first step prefills every prompt (tokens = the prompts' sum, sequences = their count), then
decode steps of one token per running sequence, the batch shrinking as sequences finish, and
optionally a mixed step (a late prompt chunk with the running decodes). Kernels per step,
t = tokens and s = sequences:

| kernel | planted |
|---|---|
| `embed_kernel` grid_x, `rms_norm_kernel` grid_x and param3 | t |
| `gemm_kernel` grid_x | ceil_div(t, 128) |
| `attn_kernel` grid_x | floor(t / 16) + s (`ATTN`) |
| `attn_kernel` param4 | s (its sequence count) |
| `mix_kernel` grid_x | ceil_div(t, 64) + 2 s (`MIX`) |
| `stage_kernel` grid_x | s + 1 (a query-offset array's length) |
| `gather_tables_kernel` grid_y, `sample_kernel` grid_x | s |
| `decode_reduce_kernel` grid_x | s, launched only in steps where t == s (decode), so tokens and seqs cannot be told apart (`UNSEPARATED`) |

With `groups` of one request each (`SINGLE`), every step serves one sequence: the capture has no
per-sequence count and the analysis has no `seqs` variable.
Written for this project; nothing here reproduces an engine's code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from dumpsim import INPUTS, WEIGHTS, _f32, _p, _ptr, _write_pid

ATTN = "add(add(ceil_div(add(tokens, 1), 16), seqs), -1)"
MIX = "add(ceil_div(tokens, 64), mul(seqs, 2))"
UNSEPARATED = ("tokens", "seqs")
# groups of prompts (lengths) and new tokens per request; a group's requests arrive together
BATCHED = (((300,), (4,)), ((40, 130, 7, 300, 64, 9, 130, 40), (6, 3, 5, 6, 2, 4, 6, 1)),
           ((130, 7, 40, 300, 40, 7, 130, 300, 64, 9, 40, 130), (5, 2, 4, 3, 5, 1, 2, 5, 4, 3, 5, 2)))
SINGLE = (((300,), (4,)), ((130,), (3,)), ((40,), (4,)), ((7,), (3,)))


@dataclass
class Step:
    tokens: int
    seqs: int


@dataclass
class Truth:
    steps: list[Step] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)   # steps per group
    layers: int = 0


def plan(groups) -> list[list[Step]]:
    """The steps of every group: one prefill of all prompts, then decodes until each request
    has its new tokens (the first comes from the prefill)."""
    out = []
    for prompts, new in groups:
        steps = [Step(sum(prompts), len(prompts))]
        left = [n - 1 for n in new]
        while any(x > 0 for x in left):
            run = sum(1 for x in left if x > 0)
            steps.append(Step(run, run))
            left = [x - 1 if x > 0 else 0 for x in left]
        out.append(steps)
    return out


def _step(t: int, s: int, layers: int) -> list:
    k = []

    def add(sym, grid, params):
        k.append((sym, grid, [128, 1, 1], params, "kernel"))

    add("stage_kernel", [s + 1, 1, 1], [_ptr(0, INPUTS, 0), _p(1, 4, 7)])
    add("gather_tables_kernel", [1, s, 1], [_ptr(0, INPUTS, 0x40000), _p(1, 4, 64)])
    add("embed_kernel", [t, 1, 1], [_ptr(0, INPUTS, 0x10000), _ptr(1, WEIGHTS, 0), _p(2, 4, 1024)])
    for layer in range(layers):
        w = WEIGHTS[0] + 0x100000 + layer * 0x2000000
        add("rms_norm_kernel", [t, 1, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 8, w, ptr=WEIGHTS),
                                           _f32(2, 1e-6), _p(3, 4, t)])
        add("gemm_kernel", [-(-t // 128), 24, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 8, w + 0x400000, ptr=WEIGHTS),
                                                   _p(2, 4, t), _p(3, 4, 3072)])
        add("attn_kernel", [t // 16 + s, 16, 1], [_ptr(0, INPUTS, 0x20000), _ptr(1, INPUTS, 0x30000),
                                                  _f32(2, 0.125), _p(3, 4, 16), _p(4, 4, s)])
        if t == s:
            add("decode_reduce_kernel", [s, 16, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 4, 16)])
        add("mix_kernel", [-(-t // 64) + 2 * s, 1, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 4, 64)])
        add("gemm_kernel", [-(-t // 128), 8, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 8, w + 0x800000, ptr=WEIGHTS),
                                                  _p(2, 4, t), _p(3, 4, 1024)])
    add("rms_norm_kernel", [t, 1, 1], [_ptr(0, INPUTS, 0x20000), _p(1, 8, WEIGHTS[0] + 0x80000, ptr=WEIGHTS),
                                       _f32(2, 1e-6), _p(3, 4, t)])
    add("sample_kernel", [s, 1, 1], [_ptr(0, INPUTS, 0x50000), _p(1, 4, 32000)])
    return k


def simulate(out: Path, groups=BATCHED, layers: int = 4, seed: int = 3) -> tuple[Path, Truth]:
    """Write the dump folder (`out`/pid5151) and return it with the truth."""
    rng = random.Random(seed)
    truth = Truth(layers=layers)
    launches: list = [("init_fill_kernel", [4, 1, 1], [256, 1, 1], [_p(0, 4, k)], "kernel") for k in range(3)]
    times = [10**9 + 20_000 * k for k in range(3)]
    t = times[-1] + 10**9
    for steps in plan(groups):
        truth.windows.append(len(steps))
        for st in steps:
            truth.steps.append(st)
            for j, launch in enumerate(_step(st.tokens, st.seqs, layers)):
                t += 4000 + rng.randrange(2000) if j else 0
                launches.append(launch)
                times.append(t)
            t += rng.randrange(300_000, 900_000)
        t += rng.randrange(200_000_000, 400_000_000)
    main = out / "pid5151"
    _write_pid(main, 5151, launches, times)
    return main, truth
