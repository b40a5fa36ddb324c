"""The error model: `MineError` is the base of every error a user can cause.

Why one base: `mine` turns a `MineError` (and an `OSError`: a file the user named that cannot be
read or written) into one sentence and exit code 2; anything else that escapes a command is a bug
in mine and keeps its traceback (`mine.cli`). Were the CLI to catch `ValueError` or `LookupError`
as well, a `KeyError` of a bug would read as a bad input and leave no trace of where it came from.
So a stage that refuses input raises a `MineError` subclass, and nothing else means "your input".

Each subclass may also derive from the builtin exception that names the kind of fault
(`DumpError` is a `ValueError`, `MissingKernel` a `LookupError`), so that code written against
the builtin keeps working; the CLI goes by `MineError` alone.

A `MineError` carries the sentence (`str(exc)`) and, where the refusal is about one value, that
`value` and the `limit` it broke (a bound, a count, the set of allowed choices), so callers and
tests can read them without parsing the sentence. Both are None where there is no such value.

This module imports nothing; every stage may import it.
"""

from __future__ import annotations

from typing import Any


class MineError(Exception):
    """An error the user can cause and fix: `str(exc)` is one sentence saying what is wrong;
    `value` is the offending value and `limit` the bound or choices it broke (None when not one
    value's fault)."""

    def __init__(self, message: str, value: Any = None, limit: Any = None):
        super().__init__(message)
        self.value = value
        self.limit = limit


class UsageError(MineError, ValueError):
    """An argument the caller got wrong: an option value out of its range, a path that cannot
    serve as the input or output it is named for, options that do not go together."""


class DumpError(MineError, ValueError):
    """A dump that cannot be read; the message is one sentence naming the path."""


class ConfigError(MineError, ValueError):
    """A model's config.json is missing, unreadable, lacks a key, holds an impossible value, or
    describes a model the generator does not build."""


class RejectedManifest(MineError, ValueError):
    """A generated manifest fails verification or the ABI check (a generator bug or a kernel pin
    that does not fit; reported as one sentence naming the first finding)."""
