"""Whether a cuBLASLt GEMM inside a CUDA graph waits before it starts, with torch alone (no kern,
no vLLM): the idle device time before each kernel of a decode-shaped layer stack replayed as one
graph, by kernel name.

    python3 benchmarks/probe_gemm_graph_gaps.py OUT_JSON [--rows 1,64] [--layers 28]

Why: kern's replayed decode step of the batched Qwen3 manifest (session 23, run1) idles about
15 us (under the profiler) before the first kernel of nearly every `extern:cublaslt_bf16_tn` call,
and 2-5 us before every other kernel. That is either what these cuBLASLt kernels cost in any CUDA
graph on this GPU (then vLLM pays it too and no manifest change helps) or something of kern's
extern path (then launching the GEMM kernels directly would remove it). torch's `mm` goes to the
same cuBLASLt, so one graph of the model's GEMM shapes, each after a small elementwise kernel as in
a layer (norm, attention, activation stand-ins), tells the two apart.

Per row count: the shapes of the Qwen3-0.6B geometry (hidden 1024; qkv 4096, o 2048 -> 1024,
gate_up 6144, down 3072 -> 1024; bf16), `--layers` times, plus an lm_head of 151936 x 1024.
Replayed 50 times back to back (one sync): the step; 20 replays under torch.profiler: device busy
and the idle before each kernel (common.gaps_before). Also the same stack with the elementwise
kernels left out (GEMMs back to back), and eager (no graph).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import finish, gaps_before, kernel_table, kernel_us, per_kernel  # noqa: E402


def _stack(torch, rows: int, layers: int, with_elementwise: bool):
    """The decode-shaped work as a closure over preallocated tensors (graph-capturable)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(n, k):
        return (torch.randn(n, k, device="cuda", generator=g, dtype=torch.float32) * 0.02).to(torch.bfloat16)

    H, Q, I, V = 1024, 2048, 3072, 151936
    ws = [(w(4096, H), w(H, Q), w(2 * I, H), w(H, I)) for _ in range(layers)]
    head = w(V, H)
    x = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)
    qkv = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)
    attn = torch.empty(rows, Q, device="cuda", dtype=torch.bfloat16)
    gu = torch.empty(rows, 2 * I, device="cuda", dtype=torch.bfloat16)
    act = torch.empty(rows, I, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(rows, V, device="cuda", dtype=torch.bfloat16)

    def step():
        for wq, wo, wg, wd in ws:
            if with_elementwise:
                h.copy_(x).mul_(1.0)                           # the input norm's stand-in
            torch.mm(h if with_elementwise else x, wq.t(), out=qkv)
            if with_elementwise:
                attn.copy_(qkv[:, :Q]).mul_(1.0)               # rope / attention stand-in
            torch.mm(attn, wo.t(), out=h)
            if with_elementwise:
                h.add_(x)                                      # the post norm's stand-in
            torch.mm(h, wg.t(), out=gu)
            if with_elementwise:
                act.copy_(gu[:, :I]).mul_(gu[:, I:])           # SiLU-and-mul's stand-in
            torch.mm(act, wd.t(), out=x)
        torch.mm(x, head.t(), out=logits)

    return step


def _measure(torch, step, graph: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    run = step
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            step()
        run = cg.replay
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        run()
    torch.cuda.synchronize()
    step_us = (time.perf_counter() - t0) / 50 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            run()
        torch.cuda.synchronize()
    busy = kernel_us(prof)
    gaps = gaps_before(prof, steps=20)
    return {"step_us": round(step_us, 1), "gpu_busy_us": None if busy is None else round(busy / 20, 1),
            "idle": gaps, "kernels": kernel_table(per_kernel(prof), None, 20, top=10)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--layers", type=int, default=28)
    a = ap.parse_args()
    import torch

    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "layers": a.layers, "rows": {}}
    for rows in (int(r) for r in a.rows.split(",")):
        r = {}
        for name, graph, elementwise in (("graph", True, True), ("graph_gemms_only", True, False),
                                         ("eager", False, True)):
            r[name] = _measure(torch, _stack(torch, rows, a.layers, elementwise), graph)
            torch.cuda.empty_cache()
        doc["rows"][str(rows)] = r
    finish(doc, a.out)


if __name__ == "__main__":
    main()
