"""Strict JSON reading for manifests.

Contract: `loads(text)` returns plain Python values with every object checked for duplicate keys
(a duplicate is an error, never last-one-wins); `load_path(path)` additionally refuses files that
cannot be a manifest before reading them whole (missing, not a regular file, over the size limit,
or not starting like a JSON object). It does not know the manifest schema; `model` does.
Errors are `ManifestReadError` (a `ValueError`) or `OSError`, each one sentence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# kern's largest published manifests are ~17 MB; 256 MiB leaves room without reading garbage forever.
MAX_BYTES = 256 * 1024 * 1024
SNIFF_BYTES = 4096


class ManifestReadError(ValueError):
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


def loads(text: str | bytes) -> object:
    """Parse JSON text; duplicate keys and NaN/Infinity literals are errors, not silently kept."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ManifestReadError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise ManifestReadError("not a manifest: JSON nesting is too deep") from None
    except UnicodeDecodeError:
        raise ManifestReadError("not a manifest: the file is not UTF-8 text") from None


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
                f"{p}: not a manifest: {size} bytes is over the {max_bytes}-byte limit"
            )
        data = head + fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestReadError(f"{p}: not a manifest: the file is not UTF-8 text") from None
    try:
        return loads(text)
    except ManifestReadError as exc:
        raise ManifestReadError(f"{p}: {exc}") from None
