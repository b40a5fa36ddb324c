"""Record a reference with vLLM: greedy runs of seeded prompts with every step's top-k log-probabilities.

Runs inside vLLM's process (a GPU host with vLLM importable); `mine reference` starts it as a
child so the CLI never imports vLLM. The prompts are drawn from ordinary vocabulary ids (below
Qwen3's special tokens) with a seeded generator, or read from a JSON file of token-id lists, so
any engine can be fed exactly the same requests. Each request runs alone (no batching effects),
greedy, with `ignore_eos` so every request yields its full length.

    python -m compare.record_vllm CKPT OUT.json [--lengths 1,37,300,2500] [--new 64] [--seed 7]
        [--prompts FILE] [--mode eager|default] [--top-k 20] [--max-model-len 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from compare import checkpoint, reference

SPECIAL_FROM = 151643  # Qwen3's first special token id; seeded prompts stay below it


def seeded_prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, min(vocab, SPECIAL_FROM)) for _ in range(n)] for n in lengths]


def read_prompts(path: Path, vocab: int) -> list[list[int]]:
    doc = json.loads(Path(path).read_text())
    if not (isinstance(doc, list) and doc and all(isinstance(p, list) and p for p in doc)):
        raise SystemExit(f"{path}: not a JSON list of non-empty token-id lists")
    for p in doc:
        for t in p:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise SystemExit(f"{path}: token id {t!r} is not in 0..{vocab - 1}")
    return doc


def recorder_args(ap, argv, lengths: str, new: int):
    """The options every recorder takes (checkpoint, out, --lengths, --new, --seed, --prompts,
    --top-k), parsed after the caller's own were added to `ap`; returns (args, config, prompts,
    the checkpoint's fingerprint)."""
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--lengths", default=lengths)
    ap.add_argument("--new", type=int, default=new)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prompts", type=Path)
    ap.add_argument("--top-k", type=int, default=20)
    a = ap.parse_args(argv)
    cfg = checkpoint.config(a.checkpoint)
    if not cfg:
        raise SystemExit(f"{a.checkpoint} has no config.json")
    vocab = int(cfg["vocab_size"])
    prompts = read_prompts(a.prompts, vocab) if a.prompts else \
        seeded_prompts([int(x) for x in a.lengths.split(",")], vocab, a.seed)
    return a, cfg, prompts, checkpoint.fingerprint(a.checkpoint)


def snapshot_now() -> None:
    """Under `mine capture` with MINE_CAPTURE_SNAPSHOT_SIGNAL=1: ask for the device snapshot now,
    when the engine has loaded its weights and run its warm-up, before the first request
    (docs/dump-format.md "Snapshot"; `mine compile --weights` binds weights by those bytes). Only
    when the capture library is injected: without its handler SIGUSR2 would end the process."""
    import signal

    if os.environ.get("MINE_CAPTURE_SNAPSHOT_SIGNAL") == "1" and os.environ.get("CUDA_INJECTION64_PATH"):
        os.kill(os.getpid(), signal.SIGUSR2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("eager", "default"), default="eager")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.30)
    a, cfg, prompts, fp = recorder_args(ap, argv, "1,37,300,2500", 64)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=str(a.checkpoint), enforce_eager=a.mode == "eager", attention_backend="TRITON_ATTN",
              skip_tokenizer_init=True, gpu_memory_utilization=a.gpu_memory_utilization,
              max_model_len=a.max_model_len, seed=0, max_logprobs=max(20, a.top_k))
    start_s = time.time() - t0
    snapshot_now()
    params = SamplingParams(max_tokens=a.new, temperature=0.0, detokenize=False, logprobs=a.top_k, ignore_eos=True)
    reqs = []
    for ids in prompts:
        o = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
        steps = []
        for st in o.logprobs:
            pairs = sorted(((int(t), float(lp.logprob)) for t, lp in st.items()), key=lambda p: -p[1])
            steps.append(reference.Step(tuple(i for i, _ in pairs), tuple(lp for _, lp in pairs)))
        reqs.append(reference.Request(tuple(ids), tuple(int(t) for t in o.token_ids), tuple(steps)))
    made = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
            "vllm": vllm.__version__, "torch": torch.__version__, "engine_start_s": round(start_s, 2),
            "prompts": str(a.prompts.name) if a.prompts else {"lengths": a.lengths, "seed": a.seed},
            "attention_backend": "TRITON_ATTN"}
    model = {k: cfg.get(k) for k in reference.MODEL_KEYS}
    ref = reference.Reference(f"vllm {vllm.__version__}", a.mode, model, fp, a.top_k, tuple(reqs), made)
    reference.write(ref, a.out)
    print(f"wrote {a.out}: {len(reqs)} requests, {sum(len(r.output) for r in reqs)} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
