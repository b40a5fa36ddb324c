"""The four prompts of the reference capture, as token ids: 1, 34, 85 and 175 tokens.

Seeded and drawn from ordinary vocabulary ids (below the special tokens), so any run of any
engine on the same checkpoint sees exactly the same requests.
"""

from __future__ import annotations

import random

LENGTHS = (1, 34, 85, 175)
MAX_NEW_TOKENS = 4
SPECIAL_FROM = 151643  # Qwen3's first special token id


def prompts(seed: int = 1234) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, SPECIAL_FROM) for _ in range(n)] for n in LENGTHS]
