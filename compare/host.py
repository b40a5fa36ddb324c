"""The manifest loaded on kern, and a host that serves one sequence through it (GPU only).

The host writes every input by its declared fill, the way a serving engine would for a batch of
one: tokens and positions of the rows fed, slots equal to positions (the sequence's pages are laid
out in order, page i holding positions i*block .. i*block+block-1), the sequence's length, the
query start offsets, and a block table naming pages 0, 1, 2, ... Nothing in it knows a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from compare.serving import Serving


class KernHost:
    def __init__(self, manifest_path: Path, kernels: Path, m: dict, s: Serving, weight_files: Sequence[Path],
                 gpu: int = 0):
        import torch
        import kern
        from kern.host import region

        self.torch, self.m, self.s = torch, m, s
        self.rt = kern.Runtime(str(manifest_path), str(kernels), [str(p) for p in weight_files], gpu)
        self.v = {f: region(self.rt, m, name) for f, name in s.inputs.items()}
        self.logits_v = region(self.rt, m, s.logits)
        self.next_v = region(self.rt, m, s.next_token) if s.next_token else None
        self.reset()

    def reset(self) -> None:
        """A fresh sequence: the block table names pages 0, 1, ... for the longest context."""
        torch, v = self.torch, self.v
        if "blocks" in v:
            need = -(-self.s.max_len // self.s.block_size)
            v["blocks"].zero_()
            v["blocks"].view(-1)[:need] = torch.arange(need, dtype=v["blocks"].dtype)
        torch.cuda.synchronize()

    def _feed(self, ids: Sequence[int], start: int) -> None:
        torch, v, n = self.torch, self.v, len(ids)
        dev = v["token"].device
        v["token"].view(-1)[:n] = torch.tensor(list(ids), dtype=v["token"].dtype, device=dev)
        pos = torch.arange(start, start + n, dtype=torch.int64, device=dev)
        v["position"].view(-1)[:n] = pos.to(v["position"].dtype)
        if "slot" in v:
            v["slot"].view(-1)[:n] = pos.to(v["slot"].dtype)
        if "seq_len" in v:
            v["seq_len"].view(-1)[0] = start + n
        if "cu_seqlens" in v:
            v["cu_seqlens"].view(-1)[:2] = torch.tensor([0, n], dtype=v["cu_seqlens"].dtype, device=dev)
        if "valid" in v:
            flat = v["valid"].view(-1)
            flat.zero_()
            flat[:n] = 1
        torch.cuda.synchronize()

    def vars(self, rows: int, seqs: int = 1) -> dict:
        """The var values a program of this manifest runs `seqs` sequences of `rows` rows in all with."""
        return {"rows": rows, "seqs": seqs} if "seqs" in self.m.get("vars", {}) else {"rows": rows}

    def _run(self, program: str, rows: int) -> None:
        self.rt.run(program, self.vars(rows))
        self.torch.cuda.synchronize()

    def prefill(self, ids: Sequence[int]) -> None:
        """Land the KV of `ids` (positions 0..len-1) in chunks of the prefill program's rows."""
        if not ids:
            return
        if self.s.prefill is None:
            for p, t in enumerate(ids):
                self._feed([t], p)
                self._run(self.s.decode, 1)
            return
        for a in range(0, len(ids), self.s.chunk):
            part = ids[a:a + self.s.chunk]
            self._feed(part, a)
            self._run(self.s.prefill, len(part))

    def decode(self, token: int, position: int):
        """Feed one token at `position`; kern's logits of the next token, float32 on the GPU."""
        self._feed([token], position)
        self._run(self.s.decode, 1)
        lg = self.logits_v.view(-1, self.s.vocab)
        return lg[0].float().clone()  # decode runs one row: row 0 is the last row fed either way

    def decode_on_device(self, token: int, position: int, steps: int) -> list[int]:
        """Greedy decode of `steps` tokens from `token` at `position` with the loop on the device:
        each step's decode program is enqueued after the host stream's work (kern's
        `enqueue_after`), the argmax of its logits is written into the token input and the
        position, slot and sequence length advance by one on the device, so no step waits for the
        host; one synchronization at the end reads the tokens back. Why: a host loop that reads
        the logits back and writes the next inputs pays a round trip a step, which is what keeps
        an engine's GPU idle (docs/benchmarks.md, session 20). Slots follow positions, as `_feed`
        lays a sequence's pages out."""
        self._feed([token], position)
        return [t[0] for t in self.device_loop(1, steps)]

    def device_loop(self, n: int, steps: int) -> list[list[int]]:
        """`steps` greedy decode steps of the n sequences whose inputs are written, one row each, with
        the loop on the device (`decode_on_device`); the tokens chosen, per sequence."""
        torch, v, s = self.torch, self.v, self.s
        stream = torch.cuda.current_stream()
        out = torch.empty((steps, n), dtype=torch.int64, device=v["token"].device)
        args = self.vars(n, n)
        logits = self.logits_v.view(-1, s.vocab)[:n]
        tok = v["token"].view(-1)[:n]
        moving = [v[f].view(-1)[:n] for f in ("position", "slot", "seq_len") if f in v]
        for k in range(steps):
            self.rt.enqueue_after(s.decode, args, stream.cuda_stream)
            nxt = torch.argmax(logits, dim=-1)
            out[k] = nxt
            tok.copy_(nxt)
            for t in moving:
                t.add_(1)
        torch.cuda.synchronize()
        return out.t().tolist()

    def next_token(self) -> int:
        """The manifest's own greedy choice after the last decode (its `tokens` output)."""
        if self.next_v is None:
            raise RuntimeError("the manifest has no tokens output")
        return int(self.next_v.view(-1)[0].item())
