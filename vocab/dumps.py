"""The one canonical serialisation of a manifest, and the text kern hashes for a cut id.

Why one: the committed manifests (manifests/qwen3/qwen3.json, the K3 stages) are these bytes,
the example job compares them byte for byte, and the generators' tests compare regenerated
manifests with the committed ones; a second writer would be a second answer to "what bytes is
this manifest". Standard library only.
"""

from __future__ import annotations

import json
from typing import Any


def dumps(manifest: dict[str, Any]) -> str:
    """Canonical bytes of a manifest's JSON object: keys sorted at every level, compact
    separators (no spaces), non-ASCII escaped, one trailing newline. The same object always
    gives the same text, whatever order its keys were inserted in."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n"


def pretty(manifest: dict[str, Any]) -> str:
    """The manifest as kern pretty-prints it before hashing a cut id: keys in the object's own
    order, two-space indent, non-ASCII kept, no trailing newline. It agrees with kern's text
    only where Python's and serde_json's pretty printers agree (see manifests/cut.py)."""
    return json.dumps(manifest, indent=2, ensure_ascii=False)
