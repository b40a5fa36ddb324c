"""Host pointees: the bytes a launch's words into host memory pointed at, as the launch record
keeps them (MINE_CAPTURE_HOST_BYTES, 64 B by default, at most 4096; docs/dump-format.md).

Why a reader of its own: the loaded frames leave the pointee sections out (they are per word,
variable-sized and rarely needed), and two stages read them: `mine compile` names an input by
them, `mine replay` seeds a forward's pinned staging buffers with them.
"""

from __future__ import annotations

import json
from pathlib import Path


def host_pointees(dump, seqs: set[int]) -> dict[tuple[int, int, int], tuple[int, bytes]]:
    """(launch seq, param, at) -> (host address, pointee bytes) from the launch records (launches.bin,
    or a plain launches.jsonl); empty when the dump keeps none."""
    src = Path(str(dump.source))
    out: dict = {}
    if src.name == "launches.bin":
        from vocab.binfmt import BinDump
        recs = (r for r in BinDump(src.parent).records() if r["seq"] in seqs)
    elif src.name == "launches.jsonl":
        recs = (r for r in map(_json, src.read_bytes().splitlines()) if r and r.get("seq") in seqs)
    else:
        return out
    for r in recs:
        for p in r.get("params") or []:
            for h in p.get("host") or []:
                out[(r["seq"], p["i"], h["at"])] = (int(h["addr"], 16), bytes.fromhex(h["hex"]))
    return out


def _json(line: bytes):
    if b'"host"' not in line:
        return None
    try:
        return json.loads(line[line.rfind(b"\0") + 1:])
    except ValueError:
        return None
