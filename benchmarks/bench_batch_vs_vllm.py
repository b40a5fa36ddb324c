"""Output tokens/s at concurrency, vLLM (default compile + CUDA-graph mode, or eager) against kern on a
batched manifest of the same checkpoint, on one GPU, in one run (issue 17).

    python3 benchmarks/bench_batch_vs_vllm.py CKPT REF OUT_JSON --manifest DIR [--mode default]
        [--concurrency 1,8,32,64] [--prompt-len 175] [--new 64] [--long-prompt 2048]

The request mix, the same for both engines: c prompts of `--prompt-len` tokens (seeded, a
different draw per request) submitted together, each generating `--new` tokens (greedy, EOS
ignored). The figure is c * new / wall time of the whole batch, prefill included, median of 3
after a warm-up run. Every run (warm-up, timed, profiled) draws new prompts, the same draws for
both engines: before session 23 the runs repeated one batch, and vLLM's prefix cache (on by
default) served the repeats' prompts from the warm-up's KV, so its figures left most of the
prefill out where kern's did not. Each engine runs in a child process of its own.
- vLLM: `LLM.generate` of the c requests at once (its scheduler batches them, chunked prefill on).
- kern (`compare.batch.BatchHost`): the c prompts but their last tokens in packed prefill calls,
  then `new` decode steps of the c sequences a call with the loop on the device (the argmax of
  every row fed back as its next token, positions, slots and lengths one further on the device, one
  synchronization at the end); the decode program is a CUDA graph per sequence count. Also the
  decode step alone (the device loop's time over `new` steps, prefill excluded) and the decode
  program replayed back to back at the batch (`replay_step_us`: no host work between steps), with
  the device time of that step and its largest kernels from torch.profiler (`replay_gpu_busy_us`).
With `--long-prompt N`: the warm time to the first token of one N-token prompt on each.
`REF` is what `compare.run.prepare` checks the manifest against first (`mine compare`'s checks).
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
from common import finish, gaps_before, kernel_table, kernel_us, per_kernel  # noqa: E402


def _prompts(ckpt: str, c: int, n: int, run: int = 0, seed: int = 11) -> list[list[int]]:
    """c seeded prompts of n tokens for timed run `run`: every run draws new ones, so an engine that
    caches prefixes (vLLM's default) finds nothing of an earlier run to reuse, as a server fed new
    requests would; both engines get the same draws."""
    from compare import checkpoint
    from compare.record_vllm import seeded_prompts

    return seeded_prompts([n] * c, int(checkpoint.config(Path(ckpt))["vocab_size"]), seed + 7919 * run + 104729 * c)


def _median_after_warmup(fn, runs: int = 3) -> float:
    """fn(run) for a warm-up (run 0) and `runs` timed runs (1..runs): their median."""
    fn(0)
    return statistics.median(fn(i) for i in range(1, runs + 1))


PROFILED_RUN = 9   # the run index the profiled passes draw their prompts with (none timed uses it)


def _profiled(fn):
    """fn() under torch.profiler (device activity only): (device us, kernel -> us, the profile)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return kernel_us(prof), per_kernel(prof), prof


def run_vllm(ckpt: str, mode: str, conc: list[int], plen: int, new: int, out: Path, long_len: int,
             profile_at: list[int] = ()) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=ckpt, enforce_eager=(mode == "eager"), attention_backend="TRITON_ATTN", skip_tokenizer_init=True,
              gpu_memory_utilization=0.30, max_model_len=4096, seed=0, max_num_seqs=max(conc))
    sp = SamplingParams(max_tokens=new, temperature=0.0, detokenize=False, ignore_eos=True)
    rows = {}
    for c in conc:
        def gen(run):
            batch = [{"prompt_token_ids": p} for p in _prompts(ckpt, c, plen, run)]
            t0 = time.perf_counter()
            outs = llm.generate(batch, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            assert all(len(o.outputs[0].token_ids) == new for o in outs)
            return dt

        t = _median_after_warmup(gen)
        rows[str(c)] = {"wall_s": t, "tokens_per_s": c * new / t}
        if c in profile_at:
            # vLLM's decode step at this batch, device side: the c requests' new-token run less a
            # one-token run of a batch of as many fresh prompts (prefill and start-up cancel), over
            # new - 1 steps
            one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)
            first_batch = [{"prompt_token_ids": p} for p in _prompts(ckpt, c, plen, PROFILED_RUN + 1)]
            b1, k1, _ = _profiled(lambda: llm.generate(first_batch, one, use_tqdm=False))
            bn, kn, pn = _profiled(lambda: gen(PROFILED_RUN))
            gaps = gaps_before(pn, steps=new)
            rows[str(c)].update(decode_gpu_busy_us=None if None in (b1, bn) else (bn - b1) / (new - 1),
                                decode_kernels=kernel_table(kn, k1, new - 1, top=20),
                                prefill_gpu_busy_us=b1, prefill_kernels=kernel_table(k1, None, 1, top=12),
                                # idle before each kernel over the whole profiled run (its host
                                # gaps between steps included), per decode step
                                decode_idle=gaps)
    doc = {"engine": f"vllm {mode}", "concurrency": rows}
    if long_len:
        one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)

        def first(run):
            long_ids = _prompts(ckpt, 1, long_len, run, 12)[0]
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": long_ids}], one, use_tqdm=False)
            return time.perf_counter() - t0

        doc.update({"long_prompt": long_len, "ttft_ms": _median_after_warmup(first) * 1e3})
        busy, kern_us, _ = _profiled(lambda: first(PROFILED_RUN))
        doc.update(ttft_gpu_busy_us=busy, ttft_kernels=kernel_table(kern_us, None, 1, top=15))
    out.write_text(json.dumps(doc))


def run_kern(ckpt: str, ref: str, mdir: str, conc: list[int], plen: int, new: int, out: Path, long_len: int,
             profile_at: list[int] = ()) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from compare.batch import BatchHost, Row
    from compare.run import prepare

    setup = prepare(Path(mdir), Path(ckpt), Path(ref))
    host = BatchHost(setup.manifest_path, setup.kernels, setup.m, setup.serving, setup.weight_files, 0,
                     max_len=plen + new)
    rows = {}
    for c in conc:
        if c > host.groups:
            rows[str(c)] = {"error": f"the decode program runs at most {host.groups} sequences a call"}
            continue
        timing = {}

        def batch(run):
            prompts = _prompts(ckpt, c, plen, run)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            calls = host.prefill_packed([(i, p[:-1]) for i, p in enumerate(prompts)])
            t1 = time.perf_counter()
            toks = host.decode_batch_on_device([Row(i, plen - 1, (p[-1],)) for i, p in enumerate(prompts)], new)
            t2 = time.perf_counter()
            timing.update(prefill_calls=calls, prefill_s=t1 - t0, decode_step_us=(t2 - t1) / new * 1e6,
                          tokens=[t[:8] for t in toks[:2]])
            return t2 - t0

        t = _median_after_warmup(batch)
        # the decode program alone, replayed back to back at this batch (its CUDA graph where the
        # manifest asks for one), one sync at the end: the step a loop with no host work would give
        args = host.vars(c, c)
        for _ in range(5):
            host.rt.run(setup.serving.decode, args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            host.rt.run(setup.serving.decode, args)
        torch.cuda.synchronize()
        replay_us = (time.perf_counter() - t0) / 50 * 1e6
        # where the replayed step's time goes: device time per step (kernels, copies, memsets) and
        # the kernels that take most of it, from torch.profiler over 20 replays
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                host.rt.run(setup.serving.decode, args)
            torch.cuda.synchronize()
        busy = kernel_us(prof)
        gaps = gaps_before(prof, steps=20)   # per step, as the other replay figures
        rows[str(c)] = {"wall_s": t, "tokens_per_s": c * new / t, **timing, "replay_step_us": replay_us,
                        "replay_tokens_per_s": c / replay_us * 1e6,
                        "replay_gpu_busy_us": None if busy is None else busy / 20,
                        "replay_kernels": kernel_table(per_kernel(prof), None, 20, top=12),
                        "replay_idle": gaps}
        if c in profile_at:   # the batch's packed prefill calls, device side
            prompts = _prompts(ckpt, c, plen, PROFILED_RUN)
            busy, kern_us, prof = _profiled(lambda: host.prefill_packed([(i, p[:-1]) for i, p in enumerate(prompts)]))
            rows[str(c)].update(prefill_gpu_busy_us=busy, prefill_kernels=kernel_table(kern_us, None, 1, top=12),
                                prefill_idle=gaps_before(prof, top=6))
    doc = {"engine": f"kern {mdir}", "groups": host.groups, "concurrency": rows,
           "graph": setup.m["programs"][setup.serving.decode].get("graph", False)}
    if long_len:
        from compare.batch import Layout

        host.layout = Layout.for_context(long_len, host.layout.block, host.layout.width)   # sequence 0 alone

        def first(run):
            long_ids = _prompts(ckpt, 1, long_len, run, 12)[0]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            host.prefill_packed([(0, long_ids[:-1])])
            host.decode_rows([Row(0, long_len - 1, (long_ids[-1],))])
            return time.perf_counter() - t0

        doc.update({"long_prompt": long_len, "ttft_ms": _median_after_warmup(first) * 1e3,
                    "prefill_chunk_rows": setup.serving.chunk})
        busy, kern_us, prof = _profiled(lambda: first(PROFILED_RUN))
        doc.update(ttft_gpu_busy_us=busy, ttft_kernels=kernel_table(kern_us, None, 1, top=15),
                   ttft_idle=gaps_before(prof))
    out.write_text(json.dumps(doc))


def main() -> None:
    if sys.argv[1] in ("--vllm-child", "--kern-child"):
        a = json.loads(sys.argv[2])
        fn = run_vllm if sys.argv[1] == "--vllm-child" else run_kern
        return fn(**{k: (Path(v) if k == "out" else v) for k, v in a.items()})
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("ref")
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", required=True, help="the batched manifest's folder (mine gen qwen3 --max-seqs)")
    ap.add_argument("--mode", choices=("eager", "default"), default="default")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--prompt-len", type=int, default=175)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--long-prompt", type=int, default=0)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--profile-at", default="", help="concurrencies at which both engines' prefill and vLLM's decode step are profiled too (kernel tables)")
    a = ap.parse_args()
    conc = [int(x) for x in a.concurrency.split(",")]
    common = {"ckpt": a.ckpt, "conc": conc, "plen": a.prompt_len, "new": a.new, "long_len": a.long_prompt,
              "profile_at": [int(x) for x in a.profile_at.split(",") if x]}
    engines = {}
    if not a.skip_vllm:
        v = a.out.with_suffix(".vllm.json")
        r = subprocess.run([sys.executable, __file__, "--vllm-child", json.dumps({**common, "mode": a.mode, "out": str(v)})])
        engines["vllm"] = json.loads(v.read_text()) if r.returncode == 0 else {"error": f"rc {r.returncode}"}
    k = a.out.with_suffix(".kern.json")
    r = subprocess.run([sys.executable, __file__, "--kern-child",
                        json.dumps({**common, "ref": a.ref, "mdir": a.manifest, "out": str(k)})])
    engines["kern"] = json.loads(k.read_text()) if r.returncode == 0 else {"error": f"rc {r.returncode}"}
    ratios = {}
    for c in map(str, conc):
        v_, k_ = (engines.get(e, {}).get("concurrency", {}).get(c, {}).get("tokens_per_s") for e in ("vllm", "kern"))
        if v_ and k_:
            ratios[c] = round(k_ / v_, 3)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": a.mode, "prompt_len": a.prompt_len,
           "new": a.new, "engines": engines, "kern_over_vllm_tokens_per_s": ratios}
    finish(doc, a.out)


if __name__ == "__main__":
    main()
