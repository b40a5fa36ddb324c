"""The closed expression set of the manifest, and the one evaluator of it.

    e := c | var | ceil_div(e, c) | mul(e, c) | add(e, e)

Why one module: the verifier bounds grids and shared memory with it, the generators check the
grids they write against mined launches, the kernel table validates its grids, the ABI check
sizes shared memory, and the mining fits search, print and read back this set. Each had an
evaluator of its own; they agreed on the operators but not on overflow or on division by zero.

Forms of one expression:
- the tree: an `int` constant, a `str` var name, or `Expr(op, a, b)` where `b` is a constant
  `int` for `ceil_div` and `mul` and a tree for `add`;
- the JSON (wire) form of manifests and kernels.toml: `7`, `"rows"`, `{"ceil_div": ["rows", 16]}`,
  read by `from_wire` and written by `to_wire`;
- the text form of the mining fits: `ceil_div(tokens, 16)`, written by `render`, read by `parse`
  (constants there may be negative: a fitted offset can be).

`evaluate(e, env)` is kern's checked u64 arithmetic: `EvalError` on an unknown var, a zero
divisor, or a value (or the `a + c - 1` of a ceiling division) past u64. With `checked=False`
it does the same operations without the u64 checks, on anything with `+`, `*` and `//` -- the
mining fits pass int64 arrays and get one value per row. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from vocab.errors import MineError
from vocab.wire import U64_MAX

OPS = ("ceil_div", "mul", "add")


@dataclass(frozen=True)
class Expr:
    """A compound expression `{op: [a, b]}`; leaves are ints (constants) and strs (vars)."""
    op: str
    a: Any
    b: Any


class EvalError(MineError, ValueError):
    """An expression has no value at the given var assignment."""


class ExprError(MineError, ValueError):
    """A JSON or text value is not an expression of the closed set."""


def evaluate(e: Any, env: dict, *, checked: bool = True) -> Any:
    """The value of `e` with its vars taken from `env` (see the module note for `checked`)."""
    if isinstance(e, bool):
        raise EvalError("a boolean is not an expression")
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        if e not in env:
            raise EvalError(f"unknown var `{e}`")
        return env[e]
    if not isinstance(e, Expr):
        raise EvalError(f"a {type(e).__name__} is not an expression")
    a = evaluate(e.a, env, checked=checked)
    if e.op == "ceil_div":
        if e.b == 0:
            raise EvalError("division by zero")
        if checked and a + e.b - 1 > U64_MAX:
            _overflow()
        v = -(-a // e.b)
    elif e.op == "mul":
        v = a * e.b
    elif e.op == "add":
        v = a + evaluate(e.b, env, checked=checked)
    else:
        raise EvalError(f"unknown operator `{e.op}`")
    if checked and v > U64_MAX:
        _overflow()
    return v


def _overflow() -> None:
    raise EvalError("arithmetic overflow")


def walk(e: Any) -> Iterator[Any]:
    """Every node of the tree, the root first; a `ceil_div`/`mul` constant is no node."""
    yield e
    if isinstance(e, Expr):
        yield from walk(e.a)
        if e.op == "add":
            yield from walk(e.b)


def var_names(e: Any) -> set[str]:
    return {n for n in walk(e) if isinstance(n, str)}


# ---- the JSON form -------------------------------------------------------------------------
def from_wire(v: Any) -> Any:
    """The tree of a JSON expression, strictly: a u64, a non-empty var name, or an object with
    exactly one operator key holding two operands. Not kern's reader (that is the manifest
    model's, with kern's constants and union quirks): this reads JSON the project writes."""
    if isinstance(v, bool):
        raise ExprError("a boolean is not an expression")
    if isinstance(v, int):
        if not 0 <= v <= U64_MAX:
            raise ExprError(f"{v} is outside the u64 range")
        return v
    if isinstance(v, str):
        if not v:
            raise ExprError("an empty var name")
        return v
    if not (isinstance(v, dict) and len(v) == 1):
        raise ExprError(f"not an expression: {v!r}")
    (op, pair), = v.items()
    if op not in OPS or not (isinstance(pair, list) and len(pair) == 2):
        raise ExprError(f"not an expression: {v!r}")
    a = from_wire(pair[0])
    if op == "add":
        return Expr(op, a, from_wire(pair[1]))
    b = pair[1]
    if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= U64_MAX:
        raise ExprError(f"{op}'s second operand must be a u64 constant, got {b!r}")
    return Expr(op, a, b)


def to_wire(e: Any) -> Any:
    """The JSON form of a tree (the inverse of `from_wire`)."""
    if isinstance(e, Expr):
        return {e.op: [to_wire(e.a), to_wire(e.b)]}
    return e


def constants_positive(e: Any) -> bool:
    """No `ceil_div` or `mul` by the constant zero (kern's verifier refuses both)."""
    return all(n.b > 0 for n in walk(e) if isinstance(n, Expr) and n.op != "add")


# ---- the text form -------------------------------------------------------------------------
def render(e: Any) -> str:
    """`ceil_div(tokens, 16)`: operators as calls, constants in decimal, vars by name."""
    if isinstance(e, Expr):
        b = render(e.b) if e.op == "add" else str(e.b)
        return f"{e.op}({render(e.a)}, {b})"
    if isinstance(e, (int, str)) and not isinstance(e, bool):
        return str(e)
    raise ExprError(f"not an expression: {e!r}")


def parse(text: str) -> Any:
    """The tree `render` wrote; spaces anywhere are ignored. `ExprError` names the offset."""
    s = text.replace(" ", "")
    pos = 0

    def fail(what: str, at: int):
        raise ExprError(f"{text!r}: expected {what} at offset {at}")

    def number() -> int:
        nonlocal pos
        start = pos
        if s.startswith("-", pos):
            pos += 1
        while pos < len(s) and s[pos].isdigit():
            pos += 1
        if start == pos or s[start:pos] == "-":
            fail("a number", start)
        return int(s[start:pos])

    def expect(ch: str) -> None:
        nonlocal pos
        if not s.startswith(ch, pos):
            fail(repr(ch), pos)
        pos += 1

    def term() -> Any:
        nonlocal pos
        for op in OPS:
            if s.startswith(op + "(", pos):
                pos += len(op) + 1
                a = term()
                expect(",")
                b = term() if op == "add" else number()
                expect(")")
                return Expr(op, a, b)
        if pos < len(s) and (s[pos].isdigit() or s[pos] == "-"):
            return number()
        start = pos
        while pos < len(s) and (s[pos].isalnum() or s[pos] == "_"):
            pos += 1
        if start == pos:
            fail("an expression", start)
        return s[start:pos]

    e = term()
    if pos != len(s):
        raise ExprError(f"{text!r}: unexpected text at offset {pos}")
    return e
