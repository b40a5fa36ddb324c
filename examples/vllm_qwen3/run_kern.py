"""Run the generated Qwen3 manifest on kern (kern-llm) greedily for the four prompts (GPU host).

    python3 run_kern.py MANIFEST_DIR CHECKPOINT_DIR OUT_JSON [--reference VLLM_JSON]

MANIFEST_DIR is what `mine gen qwen3` wrote (qwen3.json, qwen3-bindings.safetensors, kernels/).
Each prompt: all but its last token go through `prefill` in chunks (they only land KV), then the
last prompt token and each generated token go through `decode` (graph-replayed), 4 new tokens.
One sequence at a time, pages laid out in order (block i holds positions 16i..16i+15). Prints the
tokens per prompt and, with --reference (run_offline.py's output), whether they equal vLLM's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402


class KernQwen3:
    """The manifest loaded on kern, with the serving loop a host writes around it."""

    def __init__(self, mdir: Path, ckpt: Path, max_len: int):
        import torch
        import kern
        from kern.host import region

        self.torch = torch
        self.m = json.loads((mdir / "qwen3.json").read_text())
        weights = [str(p) for p in sorted(ckpt.glob("*.safetensors"))] + [str(mdir / "qwen3-bindings.safetensors")]
        self.rt = kern.Runtime(str(mdir / "qwen3.json"), str(mdir / "kernels"), weights, 0)
        names = ("tokens", "positions", "slots", "seq_lens", "cu_seqlens", "blocks", "next_token", "logits")
        self.v = {n: region(self.rt, self.m, n) for n in names}
        self.chunk = self.m["vars"]["rows"]["max"]
        bs = self.m["buffers"]["blocks"]["domain"]["stride"]
        # in-order pages for the longest request, page 0 (a valid index) in the table's unused tail
        need = -(-max_len // bs)
        self.v["blocks"].zero_()
        self.v["blocks"][0, :need] = torch.arange(need, dtype=torch.int32)

    def feed(self, ids: list[int], start: int) -> None:
        torch, v, n = self.torch, self.v, len(ids)
        v["tokens"][:n] = torch.tensor(ids, dtype=torch.int32)
        v["positions"][:n] = torch.arange(start, start + n, dtype=torch.int64)
        v["slots"][:n] = torch.arange(start, start + n, dtype=torch.int64)  # identity page table
        v["seq_lens"][0] = start + n
        v["cu_seqlens"][:2] = torch.tensor([0, n], dtype=torch.int32)
        torch.cuda.synchronize()

    def prefill(self, ids: list[int]) -> None:
        """Land the KV of every prompt token but the last."""
        for s in range(0, len(ids) - 1, self.chunk):
            part = ids[s:min(s + self.chunk, len(ids) - 1)]
            self.feed(part, s)
            self.rt.run("prefill", {"rows": len(part), "seqs": 1})

    def decode(self, tok: int, pos: int) -> int:
        self.feed([tok], pos)
        self.rt.run("decode", {"rows": 1, "seqs": 1})
        return int(self.v["next_token"][0].item())

    def logits(self):
        """The last decode step's logits (float32, [vocab]); read right after `decode`."""
        return self.v["logits"][0].float().clone()

    def generate(self, ids: list[int], n: int, on_step=None) -> list[int]:
        self.prefill(ids)
        tok, pos, outs = ids[-1], len(ids) - 1, []
        for _ in range(n):
            tok = self.decode(tok, pos)
            if on_step is not None:
                on_step(len(outs), self)
            outs.append(tok)
            pos += 1
        return outs

    def step_us(self, tok: int, pos: int, steps: int = 200) -> float:
        """Mean decode step time at context pos + 1, graph replay, after 20 warm-up steps."""
        torch = self.torch
        self.feed([tok], pos)
        for _ in range(20):
            self.rt.run("decode", {"rows": 1, "seqs": 1})
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.rt.run("decode", {"rows": 1, "seqs": 1})
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    mdir, ckpt, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ref = Path(sys.argv[sys.argv.index("--reference") + 1]) if "--reference" in sys.argv else None
    engine = KernQwen3(mdir, ckpt, max(len(p) + MAX_NEW_TOKENS for p in prompts()))
    results = []
    for ids in prompts():
        t0 = time.time()
        outs = engine.generate(ids, MAX_NEW_TOKENS)
        results.append({"prompt": ids, "output": outs, "seconds": round(time.time() - t0, 4)})
        print(json.dumps(outs), flush=True)
    last = results[-1]
    step = engine.step_us(last["output"][-1], len(last["prompt"]) + MAX_NEW_TOKENS - 1)
    print(f"kern decode step (graph replay, context {len(last['prompt']) + MAX_NEW_TOKENS}): {step:.1f} us", flush=True)
    report = {"requests": results, "decode_step_us": round(step, 2)}
    if ref is not None:
        want = [r["output"] for r in json.loads(ref.read_text())["requests"]]
        report["equal_to_vllm"] = [r["output"] == w for r, w in zip(results, want)]
        print("equal to vLLM:", report["equal_to_vllm"])
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
