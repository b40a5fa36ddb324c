"""The compiler's refusal: one sentence naming what the capture does not pin.

`CompileError` is a `MineError` (vocab.errors), so `mine compile` turns it into that sentence and
exit code 2; anything else escaping the compiler is a bug (exit 70).
"""

from __future__ import annotations

from vocab.errors import MineError


class CompileError(MineError, ValueError):
    """The capture (or its analysis) does not pin something the manifest needs; names it."""


class ProgramError(CompileError):
    """One program of a batched capture cannot be compiled (`program`: its name). Why a class of its
    own: a batched capture gives one program per step kind and range of sequences, and one whose
    field the capture does not pin is left out of the manifest with this sentence, while the
    others still serve (compiler.compile); with no program left the sentence is the refusal."""

    def __init__(self, program: str, message: str):
        super().__init__(message)
        self.program = program
