"""Evaluation of manifest expressions (constants, var names, ceil_div, mul, add) over u64.

Contract: `check(expr, vars)` lists every structural fault (undeclared var, division by zero,
multiplication by zero) as (rule, sentence) pairs; `evaluate(expr, env)` computes the value with
every var bound, raising `EvalError` on overflow, a zero divisor or an unknown var. The set is
monotone in every var, so callers evaluate at the lower corner (all vars 1) and the upper corner
(all vars at max) to bound every reachable value.

Only grids report an overflow. Everywhere else (shared_mem, call and pack expressions, domain
bounds) kern evaluates the same checked way and, probed, skips the check an overflowing value
would have fed: no error, no limit, no comparison -- callers there treat `EvalError` as "no value".
"""

from __future__ import annotations

from typing import Any, Iterator

from manifests.model import Expr

U64_MAX = 2**64 - 1


class EvalError(ValueError):
    """An expression has no u64 value at the given var assignment."""


def evaluate(e: Any, env: dict[str, int]) -> int:
    if isinstance(e, bool):
        raise EvalError("a boolean is not an expression")
    if isinstance(e, int):
        return e
    if isinstance(e, float):
        raise EvalError("a float is not an expression")
    if isinstance(e, str):
        if e not in env:
            raise EvalError(f"unknown var `{e}`")
        return env[e]
    a = evaluate(e.a, env)
    if e.op == "ceil_div":
        if e.b == 0:
            raise EvalError("division by zero")
        return (a + e.b - 1) // e.b if a + e.b - 1 <= U64_MAX else _overflow()
    b = e.b if e.op == "mul" else evaluate(e.b, env)
    v = a * b if e.op == "mul" else a + b
    return v if v <= U64_MAX else _overflow()


def _overflow() -> int:
    raise EvalError("arithmetic overflow")


def check(e: Any, vars_: dict) -> list[tuple[str, str]]:
    out = []
    for node in walk(e):
        if isinstance(node, str) and node not in vars_:
            out.append(("expr.unknown_var", f"unknown var `{node}`"))
        elif isinstance(node, Expr) and node.op == "ceil_div" and node.b == 0:
            out.append(("expr.division_by_zero", "division by zero"))
        elif isinstance(node, Expr) and node.op == "mul" and node.b == 0:
            out.append(("expr.mul_by_zero", "multiplication by constant zero"))
        elif isinstance(node, float):
            out.append(("expr.float", "a float constant is not an expression"))
    return out


def walk(e: Any) -> Iterator[Any]:
    yield e
    if isinstance(e, Expr):
        yield from walk(e.a)
        if e.op == "add":
            yield from walk(e.b)


def var_names(e: Any) -> set[str]:
    return {n for n in walk(e) if isinstance(n, str)}
