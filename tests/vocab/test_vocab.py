"""The shared vocabulary (vocab/): one definition of each item, and the one expression evaluator.

Why: the schema version, the dtype table, the param-type grammar, the expression evaluator and
the manifest serialisation used to be written in several stages and could drift apart. The first
tests grep the source tree so a second copy fails here; the rest pin the evaluator to every
operator and edge case that the evaluators it replaced handled (the verifier's checked u64
arithmetic, the mining fits' array arithmetic and text form, the Qwen3 generator's grid check,
the kernel table's validation, the ABI check's shared-memory sizing).
"""

from __future__ import annotations

import ast
import json
import re
import tomllib

import numpy as np
import pytest

from vocab import dumps as D
from vocab import expr as E
from vocab import wire as W

from paths import ROOT

U64 = 2**64 - 1


def _packages() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def _sources():
    """(path, text) of every Python file of the installed packages (tests excluded)."""
    for pkg in _packages():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def _where(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.M)
    return [p for p, text in _sources() if rx.search(text)]


# ---- one definition of each item -----------------------------------------------------------
def test_vocab_is_a_package_and_imports_only_the_standard_library_and_numpy():
    """Every stage may import vocab, so vocab may import no stage and nothing outside stdlib but
    numpy (the project's own numeric dependency, which the binary record decoder needs)."""
    import sys

    assert "vocab" in _packages()
    stages = set(_packages()) - {"vocab"}
    for path in sorted((ROOT / "vocab").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                assert top not in stages, f"{path.name} imports the stage {name}"
                assert top in sys.stdlib_module_names or top in ("vocab", "__future__", "numpy"), (
                    f"{path.name} imports {name}, which is not the standard library")


@pytest.mark.parametrize("what, pattern", [
    ("the schema version", r"^\s*SCHEMA_VERSION\s*=(?!=)"),
    ("the u64 maximum", r"^\s*U64_MAX\s*=(?!=)"),
    ("a dtype size table", r"[\"']bf16[\"']\s*:\s*2\b"),
    ("a TMA dtype width table", r"[\"']tf32[\"']\s*:\s*32\b"),
    ("a scalar size table", r"[\"']i64[\"']\s*:\s*8\b"),
    ("the param-type grammar", r"buffer<\(|\(in\|out\|inout\)|def param_type\("),
    ("a param-type parser", r"in\", \"out\", \"inout\"|\(\"in\", \"out\", \"inout\"\)"),
    ("a serialisation of a manifest", r"sort_keys=True, separators|indent=2, ensure_ascii"),
])
def test_one_definition(what, pattern):
    assert _where(pattern) == [f"vocab/{'dumps' if 'serial' in what else 'wire'}.py"], what


def test_extern_signatures_come_from_the_table():
    """kern's built-ins are named with their param lists once (vocab.wire.EXTERN_PARAMS)."""
    assert _where(r'"extern:\w+",\s*[\[(]') == []
    from generators.k3.build import EXTERNS
    from generators.qwen3.build import GEMM
    assert all(tuple(params) == W.EXTERN_PARAMS[entry] for entry, params in [*EXTERNS.values(), GEMM])


def test_integer_ranges_come_from_the_table():
    """The integer wire types' bounds are vocab.wire.INT_RANGES; no stage spells them again."""
    assert _where(r'Int\("[ui]\d+", -?\d|_MAX\s*=\s*\(?-?2\*\*|"u8": 255') == []
    assert W.INT_RANGES["i32"] == (-2**31, 2**31 - 1) and W.U64_MAX == 2**64 - 1


@pytest.mark.parametrize("rel, func", [("generators/qwen3/build.py", "_eval"),
                                       ("manifests/abi.py", "eval_expr"),
                                       ("mining/fit.py", "evaluate")])
def test_one_evaluator(rel, func):
    """The old evaluators' names remain (callers use them) but do no arithmetic of their own:
    each hands the tree to `vocab.expr.evaluate`, the only one that computes the operators."""
    tree = ast.parse((ROOT / rel).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func)
    ops = [type(n.op).__name__ for n in ast.walk(fn) if isinstance(n, ast.BinOp)]
    assert not {"Add", "Mult", "FloorDiv"} & set(ops), (rel, func, ops)
    calls = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    assert calls & {"evaluate", "V.evaluate"}, (rel, func, calls)


def test_former_sites_delegate_to_vocab():
    """The names other code imports still exist, and are the vocabulary's own objects."""
    from generators.k3 import build as k3_build, memory
    from generators.qwen3 import build as q_build
    from manifests import expr as mexpr, model, wire as mwire

    assert k3_build.dumps is D.dumps and q_build.dumps is D.dumps
    assert k3_build.SCHEMA_VERSION is q_build.SCHEMA_VERSION is model.SCHEMA_VERSION == 7
    assert memory.DTYPE_BYTES is model.DTYPE_BYTES is W.DTYPE_BYTES
    assert mwire.param_type is W.param_type and model.Expr is E.Expr
    assert mexpr.evaluate is E.evaluate and mexpr.EvalError is E.EvalError


# ---- the wire vocabulary -------------------------------------------------------------------
def test_dtypes_and_sizes():
    assert W.DTYPES == ("bf16", "f16", "f32", "fp8e4m3", "fp8e8m0", "i8", "i32", "u32", "i64",
                        "u64", "u8")
    assert [W.DTYPE_BYTES[d] for d in W.DTYPES] == [2, 2, 4, 1, 1, 1, 4, 4, 8, 8, 1]
    assert set(W.SCALARS) <= set(W.DTYPES)
    assert W.TMA_DTYPES[-2:] == ("u4", "u4packed") and W.TMA_DTYPE_BITS["u4"] == 4


@pytest.mark.parametrize("text, parsed, size", [
    ("i32", ("scalar", "i32"), 4), ("i64", ("scalar", "i64"), 8), ("f32", ("scalar", "f32"), 4),
    ("u8", ("scalar", "u8"), 1), ("bytes<40>", ("bytes", 40), 40),
    ("in buffer<bf16>", ("buffer", "in", "bf16"), 8), ("out buffer<u64>", ("buffer", "out", "u64"), 8),
    ("inout state", ("state", "inout"), 8), ("in state", ("state", "in"), 8),
])
def test_param_type_parse_format_and_size(text, parsed, size):
    assert W.param_type(text) == parsed
    assert W.format_param_type(parsed) == text
    assert W.is_canonical_param_type(text)
    assert W.param_bytes(text) == W.param_type_bytes(parsed) == size


@pytest.mark.parametrize("text, parsed", [
    (" in buffer<f32> ", ("buffer", "in", "f32")),       # kern trims the whole string
    ("in   buffer<f32>", ("buffer", "in", "f32")),       # ... and the rest after the direction
    ("bytes<+8>", ("bytes", 8)), ("bytes<008>", ("bytes", 8)),
    ("\u3000i32", ("scalar", "i32")),                    # Unicode white space is kern's too
])
def test_kern_accepts_spellings_the_project_does_not_write(text, parsed):
    assert W.param_type(text) == parsed
    assert not W.is_canonical_param_type(text)


@pytest.mark.parametrize("text", [
    "u32", "f16", "buffer<f32>", "in buffer<f64>", "in\tbuffer<f32>", "sideways state",
    "bytes<0>", "bytes<>", f"bytes<{2**64}>", "bytes<-1>", "in bytes<4>", "\x1ci32", "",
])
def test_param_type_rejects(text):
    assert W.param_type(text) is None and W.param_bytes(text) is None
    assert not W.is_canonical_param_type(text) and W.param_direction(text) is None


def test_param_direction_and_pointer_type():
    assert [W.param_direction(t) for t in ("in buffer<i32>", "out state", " inout buffer<u8>",
                                           "i32", "bytes<4>")] == ["in", "out", "inout", None, None]
    assert W.pointer_type("inout", "state") == "inout state"
    assert W.pointer_type("out", "bf16") == "out buffer<bf16>"
    with pytest.raises(ValueError):
        W.format_param_type(("pointer", "in"))


# ---- the evaluator: checked u64 (the verifier's) -------------------------------------------
def ex(op, a, b):
    return E.Expr(op, a, b)


@pytest.mark.parametrize("e, env, value", [
    (7, {}, 7), ("n", {"n": 5}, 5),
    (ex("ceil_div", "n", 4), {"n": 9}, 3), (ex("ceil_div", "n", 4), {"n": 8}, 2),
    (ex("ceil_div", 0, 4), {}, 0),
    (ex("mul", "n", 3), {"n": 5}, 15), (ex("add", "n", "m"), {"n": 5, "m": 2}, 7),
    (ex("add", ex("mul", ex("ceil_div", "n", 16), 12), 1), {"n": 33}, 37),
    (ex("mul", "n", 2), {"n": 2**63 - 1}, U64 - 1),                    # just inside u64
    (ex("ceil_div", "n", 1), {"n": U64}, U64),
])
def test_checked_values(e, env, value):
    assert E.evaluate(e, env) == value


@pytest.mark.parametrize("e, env, fact", [
    ("n", {}, "unknown var `n`"),
    (ex("ceil_div", "n", 0), {"n": 1}, "division by zero"),
    (ex("ceil_div", "n", 2), {"n": U64}, "arithmetic overflow"),   # a + c - 1 passes u64
    (ex("mul", "n", 2), {"n": 2**63}, "arithmetic overflow"),
    (ex("add", "n", 1), {"n": U64}, "arithmetic overflow"),
    (True, {}, "a boolean is not an expression"),
    (1.5, {}, "a float is not an expression"),
    (ex("pow", "n", 2), {"n": 2}, "unknown operator `pow`"),
])
def test_checked_faults(e, env, fact):
    with pytest.raises(E.EvalError, match=re.escape(fact)):
        E.evaluate(e, env)


def test_unchecked_is_plain_arithmetic_and_works_on_arrays():
    """The fits evaluate over int64 arrays and may hold negative offsets: no u64 checks there."""
    e = ex("add", ex("mul", ex("ceil_div", "x", 4), 3), -5)
    assert E.evaluate(e, {"x": U64}, checked=False) == -(-U64 // 4) * 3 - 5
    x = np.array([1, 4, 5, 9], np.int64)
    assert E.evaluate(e, {"x": x}, checked=False).tolist() == [-2, -2, 1, 4]
    with pytest.raises(E.EvalError, match="division by zero"):
        E.evaluate(ex("ceil_div", "x", 0), {"x": x}, checked=False)


def test_walk_and_var_names():
    e = ex("add", ex("ceil_div", "a", 0), ex("mul", "b", 3))
    assert list(E.walk(e)) == [e, e.a, "a", e.b, "b"]   # a ceil_div/mul constant is no node
    assert E.var_names(e) == {"a", "b"}


def test_verifier_rules_still_come_from_check():
    from manifests.expr import check
    e = ex("add", ex("ceil_div", "a", 0), ex("mul", "zz", 0))
    assert [r for r, _ in check(e, {"a": 1})] == [
        "expr.division_by_zero", "expr.mul_by_zero", "expr.unknown_var"]
    assert check(1.5, {}) == [("expr.float", "a float constant is not an expression")]


# ---- the JSON form (kernels.toml, generators, the ABI check) -------------------------------
@pytest.mark.parametrize("wire", [
    0, 7, U64, "rows", {"ceil_div": ["rows", 16]}, {"mul": ["rows", 3]},
    {"add": [{"mul": ["rows", 3]}, {"ceil_div": [{"add": ["rows", 1]}, 64]}]},
])
def test_wire_round_trip(wire):
    assert E.to_wire(E.from_wire(wire)) == wire


@pytest.mark.parametrize("wire", [
    True, -1, 2**64, "", 1.0, None, [1, 2], {}, {"ceil_div": ["n", 2], "mul": ["n", 2]},
    {"ceil_div": ["n"]}, {"ceil_div": ("n", 2)}, {"div": ["n", 2]}, {"mul": ["n", "m"]},
    {"mul": ["n", True]}, {"add": ["n", -1]}, {"ceil_div": [{"pow": ["n", 2]}, 2]},
])
def test_wire_rejects(wire):
    with pytest.raises(E.ExprError):
        E.from_wire(wire)


@pytest.mark.parametrize("wire, ok", [
    (0, True), (5, True), ("n", True), ({"ceil_div": ["n", 256]}, True),
    ({"add": [{"mul": ["n", 2]}, 1]}, True),
    ({"ceil_div": ["n", 0]}, False), ({"mul": [{"add": ["n", {"mul": ["m", 0]}]}, 2]}, False),
    (-1, False), (True, False), ("", False), ({"mul": ["n", -2]}, False),
    ({"ceil_div": ["n", 2], "add": ["n", 1]}, False), ({"sub": ["n", 1]}, False),
])
def test_kernel_table_expressions(wire, ok):
    """kernels.toml's rule: an expression of the set whose ceil_div/mul constants are positive."""
    from manifests.kernels import _expr_ok
    assert _expr_ok(wire) is ok


def test_abi_and_qwen3_grid_evaluate_the_json_form():
    from generators.qwen3.build import _eval
    from manifests.abi import eval_expr

    grid = {"ceil_div": [{"add": [{"mul": ["rows", 3]}, 1]}, 16]}
    assert eval_expr(grid, {"rows": 100}) == 19
    assert eval_expr(48, {}) == 48
    assert _eval(grid, 100) == 19 and _eval("rows", 7) == 7 and _eval(3, 7) == 3
    with pytest.raises(E.ExprError):
        eval_expr({"div": ["rows", 2]}, {"rows": 1})


# ---- the text form (the mining fits) -------------------------------------------------------
@pytest.mark.parametrize("text, tree", [
    ("7", 7), ("-3", -3), ("tokens", "tokens"), ("ceil_div(tokens, 16)", ex("ceil_div", "tokens", 16)),
    ("mul(ceil_div(tokens, 4), 12)", ex("mul", ex("ceil_div", "tokens", 4), 12)),
    ("add(mul(tokens, 3), -5)", ex("add", ex("mul", "tokens", 3), -5)),
    ("add(tokens, ctx_len)", ex("add", "tokens", "ctx_len")),
])
def test_text_round_trip(text, tree):
    assert E.parse(text) == tree and E.render(tree) == text
    assert E.parse(text.replace(" ", "")) == tree


@pytest.mark.parametrize("text, offset", [
    ("", 0), ("mul(tokens)", 10), ("mul(tokens,x)", 11), ("ceil_div(tokens,4", 17),
    ("tokens)", 6), ("add(1,-)", 6),
])
def test_text_faults_name_the_offset(text, offset):
    """Offsets count in the text with its spaces removed (spaces are ignored anywhere)."""
    with pytest.raises(E.ExprError, match=f"offset {offset}"):
        E.parse(text)


def test_fit_tuples_evaluate_render_and_parse_through_vocab():
    from mining import fit as F

    t = np.array([1, 8, 33], np.int64)
    cases = {("const", 7): [7, 7, 7], ("var", "tokens"): [1, 8, 33],
             ("mul", ("var", "tokens"), 3): [3, 24, 99],
             ("ceil_div", ("var", "tokens"), 16): [1, 1, 3],
             ("add", ("var", "tokens"), ("const", -1)): [0, 7, 32],
             ("piecewise", "tokens", ("const", 4), ("mul", ("var", "tokens"), 2)): [4, 16, 66]}
    for e, want in cases.items():
        got = F.evaluate(e, {"tokens": t})
        assert got.dtype == np.int64 and got.tolist() == want, e
        if e[0] != "piecewise":
            assert F.render(e) == E.render(F._tree(e)) and F.parse(F.render(e)) == e
    assert F.render(("piecewise", "tokens", ("const", 4), ("var", "tokens"))) == (
        "piecewise(tokens==1: 4; tokens>1: tokens)")
    with pytest.raises(ValueError):
        F.parse("ceil_div(tokens, )")


# ---- the one serialisation ------------------------------------------------------------------
def test_dumps_is_sorted_compact_with_one_newline():
    m = {"model": "é", "schema_version": 7, "buffers": {"y": {"shape": [1, "n"]}, "x": {}}}
    assert D.dumps(m) == ('{"buffers":{"x":{},"y":{"shape":[1,"n"]}},"model":"\\u00e9",'
                          '"schema_version":7}\n')
    assert D.pretty(m).startswith('{\n  "model": "é",\n  "schema_version": 7')


@pytest.mark.parametrize("rel", ["manifests/qwen3/qwen3.json", "manifests/k3/224/d.json",
                                 "manifests/k3/224/p/stage0.json", "manifests/k3/224/p/stage1.json"])
def test_committed_manifests_are_the_canonical_bytes(rel):
    text = (ROOT / rel).read_text()
    assert D.dumps(json.loads(text)) == text
