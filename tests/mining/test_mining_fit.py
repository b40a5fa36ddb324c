"""The expression fitter: planted forms come back; ambiguity is detected, not guessed."""

from __future__ import annotations

import numpy as np
import pytest

from mining.fit import evaluate, fit, render

T = np.array([16384, 512, 8, 1, 34, 85, 175, 1, 1])


@pytest.mark.parametrize("expr", [
    ("var", "tokens"), ("const", 7), ("mul", ("var", "tokens"), 32),
    ("ceil_div", ("var", "tokens"), 64), ("add", ("var", "tokens"), ("const", 3)),
    ("mul", ("ceil_div", ("var", "tokens"), 4), 12),
    ("add", ("mul", ("var", "tokens"), 3), ("const", 5)),
])
def test_planted_form_is_recovered(expr):
    v = evaluate(expr, {"tokens": T})
    f = fit(T, v)
    assert f.status == "fit"
    assert np.array_equal(evaluate(f.expr, {"tokens": T}), v)
    assert render(f.expr) == render(expr)


def test_one_point_is_underdetermined():
    f = fit(np.array([1, 1, 1]), np.array([16, 16, 16]))
    assert f.status == "underdetermined" and "16" in f.alternatives


def test_few_points_can_still_be_unique():
    # with tokens 1 and 2 only `tokens` reproduces 1, 2 in the closed set
    assert fit(np.array([1, 2]), np.array([1, 2])).text == "tokens"


def test_two_forms_disagreeing_between_samples_is_underdetermined():
    x = np.array([1, 64])
    f = fit(x, np.array([1, 1]))
    assert f.status == "fit" and f.text == "1"  # constant over two points is constant
    # 2x + 1 and ceil(9x / 4) agree on x = 2, 3 and part ways at x = 5
    f = fit(np.array([2, 3, 2]), np.array([5, 7, 5]))
    assert f.status == "underdetermined"
    assert "add(mul(tokens, 2), 1)" in f.alternatives and "ceil_div(mul(tokens, 9), 4)" in f.alternatives


def test_piecewise_prefill_decode():
    v = np.where(T == 1, 1024, 6144)
    f = fit(T, v)
    assert f.status == "piecewise" and f.text == "piecewise(tokens==1: 1024; tokens>1: 6144)"


def test_outside_the_set():
    f = fit(T, T * T)
    assert f.status == "no_fit" and f.text == "no fit"


def test_second_variable_used_when_tokens_fails():
    ctx = np.array([5, 9, 13, 40, 41])
    tok = np.array([1, 1, 1, 1, 1])
    f = fit({"tokens": tok, "ctx": ctx}, -(-ctx // 4))
    assert f.status == "fit" and f.text == "ceil_div(ctx, 4)"
