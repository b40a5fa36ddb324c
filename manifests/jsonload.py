"""Strict JSON reading for manifests.

Contract: `loads(text)` returns plain Python values with every object checked for duplicate keys
(a duplicate is an error, never last-one-wins); `load_path(path)` additionally refuses files that
cannot be a manifest before reading them whole (missing, not a regular file, over the size limit,
or not starting like a JSON object). It does not know the manifest schema; `model` does.
Errors are `ManifestReadError` (a `ValueError`) or `OSError`, each one sentence.

Numbers and strings are read the way kern's reader (serde_json) reads them, probed: `-0` is the
float -0.0 (so it is no integer), a float literal beyond f64 is an error, a lone surrogate escape
(`\ud800` without its pair) is an error, and bytes are strict UTF-8 without a byte-order mark.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from vocab.errors import MineError

# kern's largest published manifests are ~17 MB; 256 MiB leaves room without reading garbage forever.
MAX_BYTES = 256 * 1024 * 1024
SNIFF_BYTES = 4096


class ManifestReadError(MineError, ValueError):
    """The input is not a readable JSON manifest document."""


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find which key, in document order
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise ManifestReadError(f"duplicate key `{key}` in a JSON object")
            seen.add(key)
    return out


def _reject_constant(name: str) -> float:
    raise ManifestReadError(f"`{name}` is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ManifestReadError(f"number out of range: `{text}` is beyond f64")
    return value


def _maybe_negative_zero(text: str) -> bool:
    """Whether `-0` occurs at all. One-character searches run at memchr speed, two-character
    ones ten times slower on a big document (measured), so look for `-` and check the next."""
    i = text.find("-")
    while i >= 0:
        if text.startswith("-0", i):
            return True
        i = text.find("-", i + 1)
    return False


def _int(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)


# A `\uD800`..`\uDFFF` escape somewhere (maybe preceded by an escaped backslash, which the
# exact check below then clears).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")


def _lone_surrogate(v) -> bool:
    """Whether a decoded value holds a surrogate code point: Python's reader pairs a proper
    escape pair into one character, so any surrogate left came from a lone escape."""
    t = type(v)
    if t is str:
        return _SURROGATE_CHAR.search(v) is not None
    if t is dict:
        return any(_lone_surrogate(k) or _lone_surrogate(x) for k, x in v.items())
    if t is list:
        return any(_lone_surrogate(x) for x in v)
    return False


def loads(text: str | bytes) -> object:
    """Parse JSON text; duplicate keys and NaN/Infinity literals are errors, not silently kept."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise ManifestReadError("not a manifest: the file is not UTF-8 text") from None
    hooks: dict = {"parse_constant": _reject_constant, "parse_float": _float,
                   "object_pairs_hook": _no_duplicates}
    if _maybe_negative_zero(text):  # rare; a hook on every integer costs a call each
        hooks["parse_int"] = _int
    try:
        obj = json.loads(text, **hooks)
    except json.JSONDecodeError as exc:
        raise ManifestReadError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise ManifestReadError("not a manifest: JSON nesting is too deep") from None
    except ManifestReadError:
        raise
    except ValueError as exc:  # e.g. an integer literal of thousands of digits
        raise ManifestReadError(f"not valid JSON: {exc}") from None
    if "\\" in text and _SURROGATE_ESCAPE.search(text) and _lone_surrogate(obj):
        raise ManifestReadError("not valid JSON: a lone surrogate escape (\\uD800-\\uDFFF "
                                "without its pair) in a string")
    return obj


def load_path(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> object:
    """Read a manifest file, sniffing its size and first bytes so garbage fails fast."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    if not p.is_file():
        raise ManifestReadError(f"{p}: not a regular file")
    size = p.stat().st_size
    with p.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
        start = head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
        if start != b"{":
            what = "is empty" if not head.strip() else "does not start with a JSON object"
            raise ManifestReadError(f"{p}: not a manifest: the file {what}")
        if size > max_bytes:
            raise ManifestReadError(
                f"{p}: not a manifest: {size} bytes is over the {max_bytes}-byte limit", value=size, limit=max_bytes
            )
        fh.seek(0)
        data = fh.read()  # in one read: `head + fh.read()` costs ten times as much (measured)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestReadError(f"{p}: not a manifest: the file is not UTF-8 text") from None
    try:
        return loads(text)
    except ManifestReadError as exc:
        raise ManifestReadError(f"{p}: {exc}") from None
