"""The verifier's view of manifest expressions: structural faults as rules, values via `vocab.expr`.

Contract: `check(expr, vars)` lists every structural fault (undeclared var, division by zero,
multiplication by zero, a float constant) as (rule, sentence) pairs; `evaluate(expr, env)` is
the shared checked-u64 evaluator (`vocab.expr.evaluate`), raising `EvalError` on overflow, a zero
divisor or an unknown var. The set is monotone in every var, so callers evaluate at the lower
corner (all vars 1) and the upper corner (all vars at max) to bound every reachable value.

Only grids report an overflow. Everywhere else (shared_mem, call and pack expressions, domain
bounds) kern evaluates the same checked way and, probed, skips the check an overflowing value
would have fed: no error, no limit, no comparison -- callers there treat `EvalError` as "no value".
"""

from __future__ import annotations

from typing import Any

from vocab.expr import EvalError, Expr, evaluate, var_names, walk  # noqa: F401  (re-exported)
from vocab.wire import U64_MAX  # noqa: F401  (re-exported)


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
