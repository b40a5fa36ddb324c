"""Serve seeded prompts through vLLM in-process, eager or in vLLM's default mode, for the truth suite.

Why: the mining must hold on captures it was not built on, so each capture of the suite differs
in geometry, prompt lengths, decode length and engine mode. The truth this script writes
(OUT_JSON) is what it asked vLLM to do: every request's prompt and output token ids, in order;
a test derives the expected forwards from it (one prefill of len(prompt) tokens, then
len(output) - 1 decode steps of one token each, per request).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 \\
        python3 run_suite.py MODEL_DIR OUT_JSON [--lengths 3,50,130] [--new 6] [--mode eager|default]
        [--seed 5] [--batches 1,8,32]

--batches N1,N2,...: instead of one request at a time, groups of N1, N2, ... requests submitted
together (one `generate` call each, so vLLM batches them): prompt lengths drawn (seeded) from
--lengths, new tokens per request from 1 to --new, so sequences finish at different steps and the
decode batch shrinks step by step. The truth then holds each group's requests in submission order
and vLLM's scheduler budget (max_num_batched_tokens, max_num_seqs) to derive the expected steps from.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--lengths", default="3,50,130")
    ap.add_argument("--new", type=int, default=6, help="new tokens per request")
    ap.add_argument("--mode", choices=("eager", "default"), default="eager")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--batches", default="", help="groups of requests submitted together, e.g. 1,8,32")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM, SamplingParams

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, min(vocab, 151643)) for _ in range(int(n))]
               for n in args.lengths.split(",")]
    t0 = time.time()
    llm = LLM(model=args.model, enforce_eager=args.mode == "eager", attention_backend="TRITON_ATTN",
              skip_tokenizer_init=True, gpu_memory_utilization=0.30, max_model_len=2048, seed=0)
    t_start = time.time() - t0
    params = SamplingParams(max_tokens=args.new, temperature=0.0, detokenize=False, logprobs=2)
    results = []
    if args.batches:
        return _batched(llm, args, rng, vocab, t_start, SamplingParams)
    for ids in prompts:
        t = time.time()
        o = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
        lps = [[[int(k), float(v.logprob)] for k, v in step.items()] for step in (o.logprobs or [])]
        results.append({"prompt": ids, "output": list(o.token_ids), "logprobs": lps,
                        "seconds": round(time.time() - t, 4)})
        time.sleep(0.05)
    args.out.write_text(json.dumps({"mode": args.mode, "engine_start_s": round(t_start, 2),
                                    "requests": results}, indent=1))
    print(json.dumps([r["output"] for r in results]))


def _batched(llm, args, rng, vocab, t_start, SamplingParams) -> None:
    lengths = [int(n) for n in args.lengths.split(",")]
    groups = []
    for size in (int(b) for b in args.batches.split(",")):
        reqs = [{"prompt": [rng.randrange(100, min(vocab, 151643)) for _ in range(rng.choice(lengths))],
                 "new": rng.randint(1, args.new)} for _ in range(size)]
        plist = [SamplingParams(max_tokens=r["new"], temperature=0.0, detokenize=False, logprobs=2,
                                ignore_eos=True) for r in reqs]
        t = time.time()
        outs = llm.generate([{"prompt_token_ids": r["prompt"]} for r in reqs], plist, use_tqdm=False)
        for r, o in zip(reqs, outs):
            c = o.outputs[0]
            r["output"] = list(c.token_ids)
            r["logprobs"] = [[[int(k), float(v.logprob)] for k, v in step.items()] for step in (c.logprobs or [])]
        groups.append({"size": size, "seconds": round(time.time() - t, 4), "requests": reqs})
        time.sleep(0.05)
    sched = llm.llm_engine.vllm_config.scheduler_config
    args.out.write_text(json.dumps({"mode": args.mode, "engine_start_s": round(t_start, 2),
                                    "scheduler": {"max_num_batched_tokens": sched.max_num_batched_tokens,
                                                  "max_num_seqs": sched.max_num_seqs,
                                                  "chunked_prefill": bool(getattr(sched, "enable_chunked_prefill", False))},
                                    "groups": groups}, indent=1))
    print(json.dumps([[len(r["output"]) for r in g["requests"]] for g in groups]))


if __name__ == "__main__":
    main()
