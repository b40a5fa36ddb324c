"""compare.record_sglang: SGLang's /generate answers to a mine reference, and bad answers refused.

The answers are of SGLang 0.5.17's shape (meta_info.output_token_logprobs and output_top_logprobs:
`[logprob, token id, text]` triples, best first, one list per generated position); what is checked
is the conversion: the chosen token joins its position's top-k, positions keep their order, the
log-probabilities are SGLang's, and an answer without log-probabilities, with a chosen token that
is not the output, or with a position missing, is one sentence naming the request and the field.
"""

from __future__ import annotations

import random

import pytest

from compare import record_sglang, reference

CFG = {"model_type": "qwen3", "vocab_size": 500, "num_hidden_layers": 2, "hidden_size": 64}


def answer(out: list[int], k: int, rng: random.Random, chosen_in_top: bool = True) -> dict:
    tops, chosen = [], []
    for t in out:
        lps = sorted((-rng.uniform(0.01, 9.0) for _ in range(k)), reverse=True)
        others = rng.sample([x for x in range(500) if x != t], k)
        ids = ([t] + others[:k - 1]) if chosen_in_top else others
        tops.append([[lp, i, None] for lp, i in zip(lps, ids)])
        chosen.append([lps[0] if chosen_in_top else lps[-1], t, None])   # outside: tied with the k-th
    return {"output_ids": out, "meta_info": {"output_token_logprobs": chosen, "output_top_logprobs": tops}}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_answers_become_the_reference(seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(500) for _ in range(n)] for n in (1, rng.randrange(2, 40), rng.randrange(40, 90))]
    outs = [[rng.randrange(500) for _ in range(rng.randrange(1, 9))] for _ in prompts]
    k = rng.choice([2, 5, 20])
    answers = [answer(o, k, rng) for o in outs]
    ref = record_sglang.reference_from_answers(prompts, answers, CFG, "sha256:" + "0" * 64, k, "sglang 0.5.17", "graph")
    assert ref.engine == "sglang 0.5.17" and ref.mode == "graph" and ref.top_k == k and ref.vocab == 500
    for p, o, a, r in zip(prompts, outs, answers, ref.requests):
        assert list(r.prompt) == p and list(r.output) == o
        for j, st in enumerate(r.steps):
            want = sorted(((e[1], e[0]) for e in a["meta_info"]["output_top_logprobs"][j]), key=lambda x: -x[1])
            assert list(zip(st.ids, st.logprobs)) == want
            assert st.ids[0] == o[j]
    # what it writes is a file compare.reference reads back unchanged
    assert reference.from_json(reference.to_json(ref)) == ref


def test_a_chosen_token_outside_the_top_k_joins_it():
    """SGLang's top-k may leave the sampled token out (ties at the k-th place): it is added with its
    own log-probability, as compare.record_vllm keeps it."""
    rng = random.Random(5)
    a = answer([7, 9], 3, rng, chosen_in_top=False)
    ref = record_sglang.reference_from_answers([[1, 2]], [a], CFG, "sha256:" + "1" * 64, 3, "sglang x", "eager")
    for j, st in enumerate(ref.requests[0].steps):
        assert len(st.ids) == 4 and [7, 9][j] in st.ids
        assert list(st.logprobs) == sorted(st.logprobs, reverse=True)


@pytest.mark.parametrize("spoil, says", [
    (lambda a: a.pop("meta_info"), "meta_info.output_token_logprobs has no positions"),
    (lambda a: a["meta_info"]["output_top_logprobs"].pop(), "output_top_logprobs has 1 positions for 2"),
    (lambda a: a["meta_info"]["output_token_logprobs"][1].__setitem__(1, 3), "names token 3, but output_ids[1] is 9"),
    (lambda a: a["meta_info"]["output_top_logprobs"][0][0].__setitem__(0, float("nan")), "not a finite number"),
    (lambda a: a.__setitem__("output_ids", []), "has no output_ids"),
])
def test_bad_answers_are_one_sentence(spoil, says):
    a = answer([7, 9], 4, random.Random(3))
    spoil(a)
    with pytest.raises(reference.ReferenceError, match="request 0") as e:
        record_sglang.reference_from_answers([[1]], [a], CFG, "sha256:" + "2" * 64, 4, "sglang x", "eager")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_request_body_asks_for_greedy_log_probabilities():
    b = record_sglang.request_body([3, 4], 6, 20)
    assert b == {"input_ids": [3, 4], "return_logprob": True, "top_logprobs_num": 20,
                 "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
