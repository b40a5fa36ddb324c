"""Record a reference with Hugging Face transformers: greedy runs of seeded prompts with every step's
top-k log-probabilities (a GPU host with torch and transformers).

    python -m compare.record_hf CKPT OUT.json [--lengths 1,37,300] [--new 16] [--seed 7]
        [--prompts FILE] [--top-k 20]

Why a third recorder: it needs neither vLLM nor SGLang, only the checkpoint's own reference
implementation, so a manifest built from a capture can be judged on a host where the engine that
was captured is not installed (issue 17's batched manifest from the bundled capture). Each request
runs alone: the prompt in one forward, then one token at a time with the model's KV cache, greedy
(the argmax of the logits), for exactly `--new` tokens; the log-probabilities are the log-softmax
of the float32 logits of the bf16 model, as vLLM's raw log-probabilities are.
"""

from __future__ import annotations

import argparse
import sys
import time

from compare import reference
from compare.record_vllm import recorder_args


def step_of(logits, top_k: int) -> tuple[int, reference.Step]:
    """The greedy token and the reference step (top-k plus the chosen token, best first) of one
    position's logits (a 1-D torch tensor)."""
    import torch

    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = int(torch.argmax(logits).item())
    top = torch.topk(lp, top_k)
    pairs = {int(i): float(v) for i, v in zip(top.indices.tolist(), top.values.tolist())}
    pairs.setdefault(tok, float(lp[tok].item()))
    return tok, reference.best_first(pairs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a, cfg, prompts, fp = recorder_args(ap, argv, "1,37,300", 16)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(str(a.checkpoint), dtype=torch.bfloat16).cuda().eval()
    start_s = time.time() - t0
    reqs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model(torch.tensor([ids], device="cuda"), use_cache=True)
            past, toks, steps = out.past_key_values, [], []
            for _ in range(a.new):
                tok, st = step_of(out.logits[0, -1], a.top_k)
                toks.append(tok)
                steps.append(st)
                out = model(torch.tensor([[tok]], device="cuda"), past_key_values=past, use_cache=True)
                past = out.past_key_values
            reqs.append(reference.Request(tuple(ids), tuple(toks), tuple(steps)))
    made = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
            "transformers": transformers.__version__, "torch": torch.__version__, "engine_start_s": round(start_s, 2),
            "prompts": str(a.prompts.name) if a.prompts else {"lengths": a.lengths, "seed": a.seed},
            "attention": getattr(model.config, "_attn_implementation", None)}
    model_keys = {k: cfg.get(k) for k in reference.MODEL_KEYS}
    ref = reference.Reference(f"transformers {transformers.__version__}", "eager", model_keys, fp, a.top_k,
                              tuple(reqs), made)
    reference.write(ref, a.out)
    print(f"wrote {a.out}: {len(reqs)} requests, {sum(len(r.output) for r in reqs)} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
