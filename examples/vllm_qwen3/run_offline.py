"""Serve the four prompts through vLLM in-process (eager, Triton attention), one at a time.

Runs under `mine capture` to produce the reference dump; writes the prompt and output token ids
to OUT_JSON so another engine's run can be compared token for token.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 \
        python3 run_offline.py MODEL_DIR OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(
        model=model,
        enforce_eager=True,
        attention_backend="TRITON_ATTN",
        skip_tokenizer_init=True,
        gpu_memory_utilization=0.30,
        max_model_len=4096,
        seed=0,
    )
    t_start = time.time() - t0
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, detokenize=False)
    results = []
    for ids in prompts():
        t = time.time()
        out_ = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        results.append(
            {"prompt": ids, "output": list(out_.outputs[0].token_ids), "seconds": round(time.time() - t, 4)}
        )
        time.sleep(0.05)  # a clear gap between requests in the launch timeline
    out.write_text(json.dumps({"engine_start_s": round(t_start, 2), "requests": results}, indent=1))
    print(json.dumps([r["output"] for r in results]))


if __name__ == "__main__":
    main()
