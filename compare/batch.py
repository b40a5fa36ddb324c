"""Serving several sequences at once through a batched manifest: the inputs of a step, and the host.

Why: serving is batched (issue 17). A batched decode call runs n sequences, one row each; a
packed prefill call runs the chunks of several prompts in one `rows`. The host must lay the
sequences' KV pages out so they never overlap, and write every per-sequence input (the rows'
tokens, positions and slots; the sequences' lengths, query start offsets and block-table rows) in
the order the call runs them. `Layout` and `step_inputs` are that arithmetic, pure and tested on
the CPU; `BatchHost` writes them into kern's regions and runs the programs (GPU only).

The page layout: sequence slot i (the host's own numbering, 0..max_seqs-1, not the call's row
order) owns pages [i * per_seq, (i + 1) * per_seq): its position p lives in page
i * per_seq + p // block at offset p % block. A step's block-table row j names the pages of the
sequence the step runs at row j, so sequences finishing at different lengths only drop out of
the step's list; nothing moves in the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from compare.host import KernHost
from compare.serving import ManifestError, groups


@dataclass(frozen=True)
class Layout:
    block: int        # positions per KV page
    per_seq: int      # pages each sequence slot owns
    width: int        # the block table's row width (the manifest's)

    @staticmethod
    def for_context(max_len: int, block: int, width: int) -> "Layout":
        per = -(-max_len // block)
        if per > width:
            raise ManifestError(f"a context of {max_len} positions needs {per} pages of {block}, more than the "
                                f"block table's {width} a sequence")
        return Layout(block, per, width)

    def slots(self, seq: int, positions: np.ndarray) -> np.ndarray:
        return (seq * self.per_seq + positions // self.block) * self.block + positions % self.block

    def pages(self, seq: int) -> np.ndarray:
        return seq * self.per_seq + np.arange(self.per_seq, dtype=np.int64)


@dataclass(frozen=True)
class Row:
    """One sequence's part of a step: its slot, the first position fed and the tokens fed."""
    seq: int
    start: int
    tokens: tuple[int, ...]


def packed_calls(prompts: Sequence[tuple[int, Sequence[int]]], rows: int, groups: int) -> list[list[Row]]:
    """The prefill calls that land `prompts` ((sequence slot, token ids) each, positions from 0),
    packed: each call takes at most `rows` rows and `groups` sequences, filled in order; a prompt
    that does not fit the room left is split, its rest starting the next call at the position it
    reached (a chunked prefill continues where the last chunk ended)."""
    if rows < 1 or groups < 1:
        raise ValueError("a call takes at least one row and one sequence")
    calls, cur, room = [], [], rows
    for seq, ids in prompts:
        at = 0
        while at < len(ids):
            if room == 0 or len(cur) == groups:
                calls.append(cur)
                cur, room = [], rows
            take = min(room, len(ids) - at)
            cur.append(Row(seq, at, tuple(ids[at:at + take])))
            at += take
            room -= take
    if cur:
        calls.append(cur)
    return calls


def step_inputs(layout: Layout, rows: Sequence[Row]) -> dict[str, np.ndarray]:
    """Every fill of one call over `rows` (in the call's order): token, position and slot per fed
    row; seq_len (the context after the step), cu_seqlens (query start offsets, with the leading 0)
    and the block-table rows per sequence."""
    if not rows:
        raise ValueError("a step needs at least one sequence")
    if len({r.seq for r in rows}) != len(rows):
        raise ValueError("a sequence appears twice in one step")
    toks, pos, slot, lens, cu, table = [], [], [], [], [0], []
    for r in rows:
        if not r.tokens:
            raise ValueError(f"sequence {r.seq} feeds no token")
        p = np.arange(r.start, r.start + len(r.tokens), dtype=np.int64)
        if p[-1] >= layout.per_seq * layout.block:
            raise ValueError(f"sequence {r.seq} reaches position {int(p[-1])}, past its "
                             f"{layout.per_seq * layout.block} positions of pages")
        toks.append(np.asarray(r.tokens, dtype=np.int64))
        pos.append(p)
        slot.append(layout.slots(r.seq, p))
        lens.append(r.start + len(r.tokens))
        cu.append(cu[-1] + len(r.tokens))
        row = np.zeros(layout.width, dtype=np.int64)
        row[:layout.per_seq] = layout.pages(r.seq)
        table.append(row)
    return {"token": np.concatenate(toks), "position": np.concatenate(pos), "slot": np.concatenate(slot),
            "seq_len": np.asarray(lens, dtype=np.int64), "cu_seqlens": np.asarray(cu, dtype=np.int64),
            "blocks": np.stack(table), "valid": np.ones(sum(len(r.tokens) for r in rows), dtype=np.int64)}


class BatchHost(KernHost):
    """A host that runs up to `groups` sequences a call through a batched manifest (GPU only)."""

    def __init__(self, *a, max_len: int | None = None, **k):
        super().__init__(*a, **k)
        s = self.s
        width = int(self.v["blocks"].shape[-1]) if "blocks" in self.v else 1
        self.layout = Layout.for_context(max_len or s.max_len, s.block_size, width)
        self.groups = groups(self.m, s.decode)

    def feed(self, rows: Sequence[Row]) -> int:
        """Write one call's inputs for `rows`; returns its row count."""
        torch = self.torch
        arrays = step_inputs(self.layout, rows)
        for fill, t in self.v.items():
            a = arrays[fill]
            if fill == "blocks":      # [seqs, width]: the step's rows, the rest cleared
                full = np.zeros(tuple(t.shape), dtype=np.int64)
                full[:len(a)] = a
                a = full
            else:
                t = t.view(-1)[:len(a)]
            # cast on the host, one copy into the input itself: a device tensor made first and
            # copied in costs a staging allocation, a cast and a device copy per input per call,
            # which session 23 measured as idle device time before every prefill call
            t.copy_(torch.from_numpy(np.ascontiguousarray(a)).to(t.dtype))
        torch.cuda.synchronize()
        return int(arrays["cu_seqlens"][-1])

    def run(self, program: str, rows: Sequence[Row]) -> None:
        most = groups(self.m, program)
        if len(rows) > most:
            raise ManifestError(f"a call of {len(rows)} sequences, but program {program!r} runs at most {most}")
        self.rt.run(program, self.vars(self.feed(rows), len(rows)))
        self.torch.cuda.synchronize()

    def prefill_packed(self, prompts: Sequence[tuple[int, Sequence[int]]]) -> int:
        """Land several prompts' KV ((sequence slot, ids) each) in packed prefill calls
        (`packed_calls` over the prefill program's rows and groups); returns the calls made."""
        calls = packed_calls([(q, list(ids)) for q, ids in prompts if ids], self.s.chunk,
                             groups(self.m, self.s.prefill))
        for rows in calls:
            self.run(self.s.prefill, rows)
        return len(calls)

    def decode_rows(self, rows: Sequence[Row]):
        """One batched decode step (one token a sequence); kern's logits, [len(rows), vocab] float32."""
        self.run(self.s.decode, rows)
        return self.logits_v.view(-1, self.s.vocab)[:len(rows)].float().clone()

    def decode_batch_on_device(self, rows: Sequence[Row], steps: int) -> list[list[int]]:
        """`steps` greedy decode steps of every sequence in `rows` with the loop on the device (as
        `KernHost.decode_on_device`, per row: argmax into the token input, positions, slots and
        lengths one further; a sequence's slots stay consecutive inside its own pages, so one more
        position is one more slot). The tokens chosen, per sequence."""
        if self.feed(rows) != len(rows):
            raise ValueError("a decode step feeds one token a sequence")
        return self.device_loop(len(rows), steps)
