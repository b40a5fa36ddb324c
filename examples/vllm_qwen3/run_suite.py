"""Serve seeded prompts through vLLM in-process, eager or in vLLM's default mode, for the truth suite.

Why: the mining must hold on captures it was not built on, so each capture of the suite differs
in geometry, prompt lengths, decode length and engine mode. The truth this script writes
(OUT_JSON) is what it asked vLLM to do: every request's prompt and output token ids, in order;
a test derives the expected forwards from it (one prefill of len(prompt) tokens, then
len(output) - 1 decode steps of one token each, per request).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 \\
        python3 run_suite.py MODEL_DIR OUT_JSON [--lengths 3,50,130] [--new 6] [--mode eager|default]
        [--seed 5]
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


if __name__ == "__main__":
    main()
