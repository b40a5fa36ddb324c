"""A reference (`mine-reference/1`) from SGLang's own answers: greedy /generate runs with log-probabilities.

Why a module of its own: SGLang is driven over HTTP (its scheduler runs in a child process), so the
reference is read from the JSON it answers rather than from Python objects in the engine's process
(`compare.record_vllm`). What a request must ask for: `return_logprob: true`, `top_logprobs_num: K`,
greedy (`temperature: 0`) and `ignore_eos`; `request_body` builds it. SGLang answers, per generated
position, `meta_info.output_token_logprobs[j]` = `[logprob, token id, text]` for the chosen token
and `meta_info.output_top_logprobs[j]` = a list of such triples, best first (the text is null under
`--skip-tokenizer-init`). Its log-probabilities are the log-softmax of the model's logits at
temperature 1 (a greedy request is not rescaled), which is what `mine compare` judges against.

Nothing here imports SGLang: examples/sglang_qwen3/run_serve.py sends the requests and calls
`reference_from_answers`; the tests feed it answers of SGLang's shape.
"""

from __future__ import annotations

import math
import time

from compare import reference


def request_body(ids: list[int], new: int, top_k: int) -> dict:
    """The /generate body of one greedy request that returns its top-k log-probabilities."""
    return {"input_ids": list(ids), "return_logprob": True, "top_logprobs_num": top_k,
            "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}


def _triple(x, what: str) -> tuple[int, float]:
    """(token id, log-probability) of one SGLang logprob entry `[logprob, id, text]`."""
    if not isinstance(x, (list, tuple)) or len(x) < 2:
        raise reference.ReferenceError(f"{what} is {x!r}, not SGLang's [logprob, token id, text]")
    lp, tid = x[0], x[1]
    if isinstance(tid, bool) or not isinstance(tid, int):
        raise reference.ReferenceError(f"{what} has token id {tid!r}, not an integer")
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
        raise reference.ReferenceError(f"{what} has log-probability {lp!r}, not a finite number")
    return tid, float(lp)


def request_from_answer(prompt: list[int], answer: dict, top_k: int, where: str) -> reference.Request:
    """One reference request from SGLang's answer to `request_body(prompt, ...)`."""
    if not isinstance(answer, dict):
        raise reference.ReferenceError(f"{where}: the answer is not a JSON object")
    out = answer.get("output_ids")
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    chosen, tops = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
    if not isinstance(out, list) or not out:
        raise reference.ReferenceError(f"{where}: the answer has no output_ids")
    for name, v in (("output_token_logprobs", chosen), ("output_top_logprobs", tops)):
        if not isinstance(v, list) or len(v) != len(out):
            n = len(v) if isinstance(v, list) else "no"
            raise reference.ReferenceError(f"{where}: meta_info.{name} has {n} positions for {len(out)} output "
                                           f"tokens (was the request sent with return_logprob and top_logprobs_num?)")
    steps = []
    for j, (tok, c, top) in enumerate(zip(out, chosen, tops)):
        cid, clp = _triple(c, f"{where}: output_token_logprobs[{j}]")
        if cid != tok:
            raise reference.ReferenceError(f"{where}: output_token_logprobs[{j}] names token {cid}, "
                                           f"but output_ids[{j}] is {tok}")
        if not isinstance(top, list) or len(top) < min(top_k, 2):
            raise reference.ReferenceError(f"{where}: output_top_logprobs[{j}] is not a list of {top_k} entries")
        pairs = dict(_triple(x, f"{where}: output_top_logprobs[{j}][{k}]") for k, x in enumerate(top))
        pairs.setdefault(cid, clp)          # the chosen token too, as compare.record_vllm keeps it
        steps.append(reference.best_first(pairs))
    return reference.Request(tuple(prompt), tuple(int(t) for t in out), tuple(steps))


def reference_from_answers(prompts: list[list[int]], answers: list[dict], cfg: dict, fingerprint: str, top_k: int,
                           engine: str, mode: str, made: dict | None = None) -> reference.Reference:
    """The reference of a run that sent `prompts` one at a time and got `answers` back, in order;
    checked as `compare.reference.from_json` checks a file (a wrong answer is one sentence)."""
    if len(prompts) != len(answers):
        raise reference.ReferenceError(f"{len(prompts)} prompts but {len(answers)} answers")
    reqs = tuple(request_from_answer(p, a, top_k, f"request {n}") for n, (p, a) in enumerate(zip(prompts, answers)))
    model = {k: cfg.get(k) for k in reference.MODEL_KEYS}
    made = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **(made or {})}
    ref = reference.Reference(engine, mode, model, fingerprint, top_k, reqs, made)
    return reference.from_json(reference.to_json(ref), "the SGLang reference")
