"""A small PyTorch model forward, eager and through a CUDA graph, for `mine capture`.

    mine capture -o dumps/torch -- python examples/torch_forward.py
    python examples/torch_forward.py --bench 200     # 5 blocks of 200 forwards of each kind; the
                                                     # fastest block's mean, one JSON line
    MINE_BENCH_MARKS=1 ... --bench 200               # also 4000 eager forwards, each one's start time
                                                     # (CLOCK_MONOTONIC) in "marks_ns", for
                                                     # benchmarks/bench_capture.py's toggled runs

The model is a 2-layer pre-norm MLP block stack in bf16: LayerNorm, Linear (bf16 matmul ->
cuBLASLt, whose GEMMs launch with packed `extra` parameters), GELU, residual adds, softmax.
Eager runs go through ATen's own kernels; the graph run captures one forward and replays it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


class Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        return x + self.down(torch.nn.functional.gelu(h))


class Model(torch.nn.Module):
    def __init__(self, d: int = 512, layers: int = 2, vocab: int = 1000):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return torch.softmax(self.head(x).float(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=int, default=0, help="time this many forwards of each kind")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Model().cuda().to(torch.bfloat16).eval()
    x = torch.randn(args.tokens, 512, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        ref = model(x)  # eager
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                model(static_x)  # warm-up on the side stream, as graph capture requires
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_x)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        ok = torch.allclose(static_out, ref, atol=1e-2)
        result = {"graph_matches_eager": bool(ok)}
        if args.bench:
            for name, fn in (("eager", lambda: model(x)), ("graph", g.replay)):
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
                blocks = []  # five timed blocks; the fastest is the least disturbed by the host
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(args.bench):
                        fn()
                    torch.cuda.synchronize()
                    blocks.append((time.perf_counter() - t0) / args.bench * 1e6)
                result[f"{name}_us_per_forward"] = min(blocks)
                result[f"{name}_us_blocks"] = [round(b, 2) for b in blocks]
            if os.environ.get("MINE_BENCH_MARKS"):  # CLOCK_MONOTONIC before every eager forward
                marks = []
                for _ in range(20 * args.bench):
                    marks.append(time.monotonic_ns())
                    model(x)
                marks.append(time.monotonic_ns())
                torch.cuda.synchronize()
                result["block"], result["marks_ns"] = 1, marks
    print(json.dumps(result))
    if not ok:
        raise SystemExit("torch_forward: the graph replay differs from the eager forward")


if __name__ == "__main__":
    main()
