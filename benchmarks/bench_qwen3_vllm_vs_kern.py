"""Qwen3 (0.6B geometry) on vLLM 0.26 eager vs the mined manifest on kern, on one GPU, one run.

    python3 benchmarks/bench_qwen3_vllm_vs_kern.py CHECKPOINT_DIR MANIFEST_DIR OUT_JSON

Two child processes in turn, so neither engine's allocator sees the other:
1. vLLM in-process, eager, TRITON_ATTN: the four reference prompts greedily with the top-20
   log-probabilities of every step, then the decode step time: one 175-token prompt generating 1
   and 129 tokens (ignore EOS), (t129 - t1) / 128, median of 3.
2. kern: the same prompts through the manifest; after every decode step the logits buffer's
   log-softmax is compared with vLLM's log-probabilities at vLLM's top-20 tokens of that step
   (teacher-forced: the inputs are the tokens both engines chose). Then the decode step time
   (graph replay) at context 240, vLLM's mean context over its 128 timed steps.
Prints and writes both, with max abs / relative log-prob error per step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples" / "vllm_qwen3"))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402


def run_vllm(ckpt: str, out: Path) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=ckpt, enforce_eager=True, attention_backend="TRITON_ATTN", skip_tokenizer_init=True,
              gpu_memory_utilization=0.30, max_model_len=4096, seed=0)
    greedy = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, detokenize=False, logprobs=20)
    requests = []
    for ids in prompts():
        o = llm.generate([{"prompt_token_ids": ids}], greedy, use_tqdm=False)[0].outputs[0]
        steps = [{str(t): lp.logprob for t, lp in step.items()} for step in o.logprobs]
        requests.append({"prompt": ids, "output": list(o.token_ids), "logprobs": steps})
    ids = prompts()[-1]
    times = []
    for _ in range(3):
        t = []
        for n in (1, 129):
            p = SamplingParams(max_tokens=n, temperature=0.0, detokenize=False, ignore_eos=True)
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": ids}], p, use_tqdm=False)
            t.append(time.perf_counter() - t0)
        times.append((t[1] - t[0]) / 128 * 1e6)
    out.write_text(json.dumps({"requests": requests, "decode_step_us": statistics.median(times),
                               "decode_step_us_runs": times}))


def run_kern(ckpt: str, mdir: str, vllm_json: Path, out: Path) -> None:
    import torch
    from run_kern import KernQwen3

    ref = json.loads(vllm_json.read_text())["requests"]
    engine = KernQwen3(Path(mdir), Path(ckpt), 175 + 129 + 1)
    report = []
    for req in ref:
        errs = []

        def on_step(i, eng, req=req, errs=errs):
            lp = torch.log_softmax(eng.logits(), dim=-1)
            want = req["logprobs"][i]
            ids = torch.tensor([int(t) for t in want], device=lp.device)
            got = lp[ids].cpu()
            ref_v = torch.tensor(list(want.values()))
            d = (got - ref_v).abs()
            errs.append({"max_abs": float(d.max()), "max_rel": float((d / ref_v.abs().clamp_min(1e-6)).max()),
                         "argmax_equal": int(lp.argmax()) == int(max(want, key=want.get))})

        outs = engine.generate(req["prompt"], MAX_NEW_TOKENS, on_step)
        report.append({"output": outs, "equal_to_vllm": outs == req["output"], "steps": errs})
    step = engine.step_us(report[-1]["output"][-1], 239)
    out.write_text(json.dumps({"requests": report, "decode_step_us": step}))


def main() -> None:
    if sys.argv[1] == "--vllm":
        return run_vllm(sys.argv[2], Path(sys.argv[3]))
    if sys.argv[1] == "--kern":
        return run_kern(sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5]))
    ckpt, mdir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    v, k = out.with_suffix(".vllm.json"), out.with_suffix(".kern.json")
    subprocess.run([sys.executable, __file__, "--vllm", ckpt, str(v)], check=True)
    subprocess.run([sys.executable, __file__, "--kern", ckpt, mdir, str(v), str(k)], check=True)
    vr, kr = json.loads(v.read_text()), json.loads(k.read_text())
    result = {"vllm_decode_step_us": round(vr["decode_step_us"], 1), "kern_decode_step_us": round(kr["decode_step_us"], 1),
              "speedup": round(vr["decode_step_us"] / kr["decode_step_us"], 2),
              "tokens_equal": [r["equal_to_vllm"] for r in kr["requests"]],
              "logprob_error": [[{k_: round(v_, 5) if isinstance(v_, float) else v_ for k_, v_ in s.items()}
                                 for s in r["steps"]] for r in kr["requests"]]}
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
