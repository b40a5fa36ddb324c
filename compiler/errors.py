"""The compiler's refusal: one sentence naming what the capture does not pin.

`CompileError` is a `MineError` (vocab.errors), so `mine compile` turns it into that sentence and
exit code 2; anything else escaping the compiler is a bug (exit 70).
"""

from __future__ import annotations

from vocab.errors import MineError


class CompileError(MineError, ValueError):
    """The capture (or its analysis) does not pin something the manifest needs; names it."""
