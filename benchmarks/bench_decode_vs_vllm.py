"""Decode step of vLLM (eager or default compile + CUDA-graph mode) and of kern on any manifests of
the same checkpoint, on one GPU, in one run.

    python3 benchmarks/bench_decode_vs_vllm.py CKPT REF OUT_JSON --mode default \
        --manifest compiled=DIR [--manifest gen=DIR ...] [--prompt-len 175] [--new 128]

Why a benchmark apart from bench_qwen3_vllm_vs_kern: that one runs `mine gen qwen3`'s manifest
through its own host; this one takes any manifest a one-sequence host can serve
(`compare.serving`: the inputs found by their fills), so a manifest `mine compile` made from
vLLM's default mode is timed against the default mode it came from.

Each engine runs in a child process of its own, so neither allocator sees the other:
- vLLM in-process (`--mode`): a seeded prompt of `--prompt-len` tokens generating 1 and 1 + `--new`
  tokens (ignore EOS); the step is (t[1+new] - t[1]) / new, median of 3. GPU busy per step: the
  CUDA kernel time torch.profiler records over the 1 + new run less the 1-token run, over new.
- kern, per manifest: the prompt prefilled through the manifest's own programs, then the decode
  program replayed back to back at the context vLLM's timed steps average (prompt + new / 2),
  20 warm-up steps then 200 timed, one sync at the end: the step kern's graph replay gives a
  serving loop that keeps tokens on the device. Also the host loop of `mine compare` (inputs
  written from the host, logits read back, a sync a step) over `--new` steps, and the GPU busy
  per step from torch.profiler over 50 replayed steps.
- both: the per-kernel table of a decode step (`decode_kernels`: device microseconds a step by
  kernel name, largest first; vLLM's from the profiled 1 + new run less the 1-token run) and,
  with `--long-prompt N`, the warm time to the first token of an N-token prompt and the prefill
  tokens/s it gives (kern: the prefill program in chunks of its rows, then one decode).
- kern also: the greedy decode with its loop on the device (`KernHost.decode_on_device`: the
  argmax fed back into the token input, positions advanced on the device, one sync at the end),
  `device_loop_step_us`, and whether its tokens equal the host loop's.
`REF` (a `mine reference` of the checkpoint) is what `compare.run.prepare` checks each manifest
against before it is loaded: the same checks `mine compare` makes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from common import finish, kernel_table, kernel_us, per_kernel  # noqa: E402


def _prompt(ckpt: str, n: int) -> list[int]:
    from compare import checkpoint
    from compare.record_vllm import seeded_prompts

    return seeded_prompts([n], int(checkpoint.config(Path(ckpt))["vocab_size"]), 11)[0]


def run_vllm(ckpt: str, mode: str, plen: int, new: int, out: Path, long_len: int = 0) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    llm = LLM(model=ckpt, enforce_eager=(mode == "eager"), attention_backend="TRITON_ATTN", skip_tokenizer_init=True,
              gpu_memory_utilization=0.30, max_model_len=4096, seed=0)
    ids = _prompt(ckpt, plen)
    sp = {n: SamplingParams(max_tokens=n, temperature=0.0, detokenize=False, ignore_eos=True) for n in (1, 1 + new)}

    def gen(n):
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], sp[n], use_tqdm=False)
        return time.perf_counter() - t0

    gen(1 + new)  # warm-up
    runs = []
    for _ in range(3):
        t1, tn = gen(1), gen(1 + new)
        runs.append((tn - t1) / new * 1e6)
    busy, kernels = {}, {}
    for n in (1, 1 + new):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            gen(n)
            torch.cuda.synchronize()
        busy[n], kernels[n] = kernel_us(prof), per_kernel(prof)
    row = {"engine": f"vllm {mode}", "decode_step_us": statistics.median(runs),
           "decode_step_us_runs": runs, "gpu_busy_us": (busy[1 + new] - busy[1]) / new if None not in busy.values() else None,
           "prompt_len": plen, "new": new, "decode_kernels": kernel_table(kernels[1 + new], kernels[1], new)}
    if long_len:
        # time to first token of a long prompt, warm (median of 3 after one): prefill tokens/s
        long_ids = _prompt(ckpt, long_len)
        one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)

        def first():
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": long_ids}], one, use_tqdm=False)
            return time.perf_counter() - t0

        first()
        ttft = statistics.median([first() for _ in range(3)])
        row.update({"long_prompt": long_len, "ttft_ms": ttft * 1e3, "prefill_tokens_per_s": long_len / ttft})
    out.write_text(json.dumps(row))


def run_kern(ckpt: str, ref: str, mdir: str, plen: int, new: int, out: Path, long_len: int = 0) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from compare.host import KernHost
    from compare.run import prepare

    setup = prepare(Path(mdir), Path(ckpt), Path(ref))
    s = setup.serving
    host = KernHost(setup.manifest_path, setup.kernels, setup.m, s, setup.weight_files, 0)
    ids = _prompt(ckpt, plen)
    t0 = time.perf_counter()
    host.prefill(ids[:-1])
    prefill_s = time.perf_counter() - t0
    tok, pos = ids[-1], len(ids) - 1
    host_tokens = []
    t0 = time.perf_counter()
    for _ in range(new):
        z = host.decode(tok, pos)
        tok, pos = int(torch.argmax(z).item()), pos + 1
        host_tokens.append(tok)
    host_loop_us = (time.perf_counter() - t0) / new * 1e6
    # the same greedy decode with the loop on the device (KernHost.decode_on_device), warm: the
    # prompt prefilled again each time, timed from the first enqueue to the tokens read back
    dev = {}
    for _ in range(2):
        host.reset()
        host.prefill(ids[:-1])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev_tokens = host.decode_on_device(ids[-1], len(ids) - 1, new)
        dev = {"device_loop_step_us": (time.perf_counter() - t0) / new * 1e6,
               "device_loop_tokens_equal_host_loop": dev_tokens == host_tokens}
    ctx = plen + new // 2
    host._feed([tok], ctx - 1)
    args = host.vars(1)
    for _ in range(20):
        host.rt.run(s.decode, args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        host.rt.run(s.decode, args)
    torch.cuda.synchronize()
    step = (time.perf_counter() - t0) / 200 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            host.rt.run(s.decode, args)
        torch.cuda.synchronize()
    graph = setup.m["programs"][s.decode].get("graph", False)
    row = {"engine": f"kern {mdir}", "decode_step_us": step, "context": ctx, "graph": graph,
           "decode_calls": len(setup.m["programs"][s.decode].get("calls", [])),
           "host_loop_step_us": host_loop_us, **dev, "gpu_busy_us": (kernel_us(prof) or 0) / 50 or None,
           "prefill_ms": prefill_s * 1e3, "prefill_tokens": len(ids) - 1,
           "decode_kernels": kernel_table(per_kernel(prof), None, 50)}
    if long_len and long_len <= s.max_len:
        # the long prompt through the prefill program in chunks of its rows, then its last token
        # through decode (what the first token costs), warm: median of 3 after one
        long_ids = _prompt(ckpt, long_len)

        def first():
            host.reset()
            t0 = time.perf_counter()
            host.prefill(long_ids[:-1])
            host.decode(long_ids[-1], long_len - 1)
            return time.perf_counter() - t0

        first()
        ttft = statistics.median([first() for _ in range(3)])
        row.update({"long_prompt": long_len, "ttft_ms": ttft * 1e3, "prefill_tokens_per_s": long_len / ttft,
                    "prefill_chunk_rows": s.chunk})
    elif long_len:
        row["long_prompt_error"] = f"the manifest serves at most {s.max_len} positions"
    out.write_text(json.dumps(row))


def main() -> None:
    if sys.argv[1] == "--vllm-child":
        a = sys.argv[2:]
        return run_vllm(a[0], a[1], int(a[2]), int(a[3]), Path(a[4]), int(a[5]))
    if sys.argv[1] == "--kern-child":
        a = sys.argv[2:]
        return run_kern(a[0], a[1], a[2], int(a[3]), int(a[4]), Path(a[5]), int(a[6]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("ref")
    ap.add_argument("out", type=Path)
    ap.add_argument("--mode", choices=("eager", "default"), default="default")
    ap.add_argument("--manifest", action="append", default=[], help="NAME=DIR (repeatable)")
    ap.add_argument("--prompt-len", type=int, default=175)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--long-prompt", type=int, default=0,
                    help="also time the first token of a prompt this long (prefill tokens/s); 0: not")
    ap.add_argument("--skip-vllm", action="store_true",
                    help="time kern only (a manifest of a program vLLM does not serve)")
    a = ap.parse_args()
    rows = {}
    if a.skip_vllm:
        rows["vllm"] = {"skipped": "--skip-vllm: no ratio to vLLM in this run"}
    else:
        v = a.out.with_suffix(".vllm.json")
        r = subprocess.run([sys.executable, __file__, "--vllm-child", a.ckpt, a.mode, str(a.prompt_len), str(a.new),
                            str(v), str(a.long_prompt)])
        rows["vllm"] = json.loads(v.read_text()) if r.returncode == 0 else {"error": f"rc {r.returncode}"}
    for spec in a.manifest:
        name, _, mdir = spec.partition("=")
        k = a.out.with_suffix(f".{name}.json")
        r = subprocess.run([sys.executable, __file__, "--kern-child", a.ckpt, a.ref, mdir, str(a.prompt_len),
                            str(a.new), str(k), str(a.long_prompt)])
        rows[name] = json.loads(k.read_text()) if r.returncode == 0 else {"error": f"rc {r.returncode}"}
    base = rows["vllm"].get("decode_step_us")
    for name, row in rows.items():
        if base and row.get("decode_step_us"):
            row["ratio_to_vllm"] = round(row["decode_step_us"] / base, 3)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": a.mode, "engines": rows}
    finish(doc, a.out)


if __name__ == "__main__":
    main()
