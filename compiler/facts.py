"""What the compiler reads from the checkpoint's config.json: two numbers, no model knowledge.

Why these two: the vocabulary size tells which GEMM makes a forward's logits (the forward ends
there, `programs.cut_at_logits`) and bounds the token input; `max_position_embeddings` bounds the
positions and sequence lengths a manifest may be fed. Both are fields every Hugging Face causal-LM
config carries (a multimodal config keeps them under `text_config`). Nothing else is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from compiler.errors import CompileError


@dataclass(frozen=True)
class Facts:
    vocab: int
    positions: Optional[int]     # max_position_embeddings, when the config has it
    source: str


def _int(doc: dict, key: str) -> Optional[int]:
    for d in (doc, doc.get("text_config") if isinstance(doc.get("text_config"), dict) else {}):
        v = d.get(key)
        if v is not None:
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else -1
    return None


def read(config) -> Optional[Facts]:
    """The Facts of a config.json (or a folder holding one); None without a config or, for a
    folder, without a config.json in it. A config without a positive vocab_size: CompileError."""
    if config is None:
        return None
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CompileError(f"--config {config}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise CompileError(f"--config {config}: not a JSON object")
    vocab, pos = _int(doc, "vocab_size"), _int(doc, "max_position_embeddings")
    if vocab is None or vocab < 1:
        raise CompileError(f"--config {config}: has no positive integer vocab_size")
    if pos is not None and pos < 1:
        raise CompileError(f"--config {config}: max_position_embeddings is not a positive integer")
    return Facts(vocab, pos, str(path))
