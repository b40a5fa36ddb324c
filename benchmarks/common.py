"""What every benchmark's record ends with: the GPU it ran on, the document written and printed."""

from __future__ import annotations

import json
from pathlib import Path


def finish(doc: dict, out: Path) -> None:
    """Add the GPU's name to `doc` (or why it is missing), write it to `out` and print it."""
    try:
        import torch

        doc["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 -- the record says why the name is missing
        doc["gpu"] = f"unknown ({exc})"
    Path(out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
