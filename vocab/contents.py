"""`mine-replay-contents/1`: the bytes a forward's launches found at their pointer words, as an
in-order replay rebuilt them (replay/forward.py) -- the contract between `mine replay --in-order
--contents-out` and `mine compile --contents`.

Why a file between the two: an engine builds a forward's inputs on the device (vLLM 0.26's staging
kernels turn host-mapped per-request tables into the token ids, positions and slots the layers
read), so no host-to-device copy holds them; only a replay that ran the staging kernels on the
captured host bytes knows them. The compiler names a manifest input by matching those bytes
against the requests, as it does a copy's.

Records per (forward, address): at the first launch of the forward that passes the address (a
launch inside two overlapping forwards counts for both), and again at every later launch of the
forward that passes it and finds its bytes changed, up to `limit` bytes (the word's span: to the
next word into the same region, or the region's end), before that launch ran. A reader takes the
record current at the launch it cares about (the latest at or before it): an engine's staging
kernels write a forward's inputs inside the forward, so the first record holds the previous
step's values. `source.launches` ties the file to its capture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vocab.errors import UsageError

FORMAT = "mine-replay-contents/1"


@dataclass
class Word:
    forward: int               # first launch seq of the forward (the caller's span) it belongs to
    seq: int                   # the launch before which the bytes were read
    i: int
    at: int
    addr: int                  # the captured address the word holds
    data: bytes                # the bytes there before the launch ran (at most `limit`)


@dataclass
class Contents:
    launches: int              # the capture's launch records (a file of another capture is refused)
    window: tuple[int, int]
    limit: int
    words: list[Word] = field(default_factory=list)

    def changing(self) -> frozenset:
        """Addresses whose recorded bytes differ between two records (over their common length,
        and never past the next address a launch passed): something wrote them during the window,
        so they hold no weight. Why the cut: a record holds up to `limit` bytes from its address,
        and in an engine's allocator a 1 KB norm weight sits in one block beside the step's input
        buffers; their changes are not the weight's."""
        addrs = sorted({w.addr for w in self.words})
        room = {a: b - a for a, b in zip(addrs, addrs[1:])}
        first: dict[int, bytes] = {}
        out = set()
        for w in self.words:
            seen = first.setdefault(w.addr, w.data)
            n = min(len(seen), len(w.data), room.get(w.addr, len(w.data)))
            if seen[:n] != w.data[:n]:
                out.add(w.addr)
        return frozenset(out)

    def to_json(self) -> dict:
        return {"format": FORMAT, "source": {"launches": self.launches}, "window": list(self.window),
                "limit": self.limit,
                "words": [{"forward": w.forward, "seq": w.seq, "i": w.i, "at": w.at, "addr": hex(w.addr),
                           "hex": w.data.hex()} for w in self.words]}


def read(path) -> Contents:
    """The file, checked: one sentence (UsageError) for anything not of the format."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable {FORMAT} file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{path}: not a {FORMAT} file (its format key differs)")
    try:
        words = [Word(int(w["forward"]), int(w["seq"]), int(w["i"]), int(w["at"]), int(w["addr"], 16),
                      bytes.fromhex(w["hex"])) for w in doc["words"]]
        return Contents(int(doc["source"]["launches"]), tuple(int(x) for x in doc["window"]), int(doc["limit"]),
                        words)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: a record of the {FORMAT} file is malformed ({exc})") from None
