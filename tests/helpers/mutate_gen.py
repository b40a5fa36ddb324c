"""Seeded random mutants of base manifests, by family, for the wide differential test.

Contract: `generate(bases, n, seed)` returns `n` (label, bytes) pairs, the same for the same
arguments on every run. Each mutant is one base with one to three edits, drawn round-robin from
`FAMILIES` so every family is exercised in bulk; the label names the base, the families and the
edits. Families (each one a function of (rng, doc) returning an edited doc or raw text):

- structural: delete / null / duplicate / empty / swap / unknown keys, at any JSON path;
- string: whitespace (ASCII, Unicode, and the separators Python and Rust disagree about) and
  non-ASCII in strings, case, truncation, escapes of ordinary characters;
- numeric: integers across limits, -0, integer forms with `.0` or an exponent, huge integers,
  floats beyond f64, below f64, negative numbers;
- json: raw-text edits -- duplicate keys, lone and paired surrogate escapes, nesting depth,
  byte-order mark, trailing bytes, invalid escapes, whitespace layout, control characters;
- expression: several operator keys, constants (defined, undefined, float, negative), nesting,
  overflowing values in grids, shared_mem, call and pack expressions, domain bounds;
- shard: segments (empty, zero, short, overflowing) and `by` of every JSON type;
- combined: two or three edits of the families above, applied in turn.

Unlike `mutate.mutants` (every single edit, exhaustively), this draws from a far larger space;
like it, it never puts an array where an object was (serde's struct-from-array quirk, see
docs/manifest.md).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Callable

WHITESPACE = [" ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0",
              "\u1680", "\u2003", "\u200b", "\u2028", "\u202f", "\u3000", "\ufeff"]
NON_ASCII = ["é", "ｆ", "\u0661", "\u00a0", "ß", "\U0001f600", "\u0301", "İ"]
LIMITS = [0, 1, 2, 7, 16, 63, 64, 65, 127, 128, 255, 256, 1023, 1024, 1025, 65535, 65536,
          232448, 232449, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**53 + 1, 2**63 - 1,
          2**63, 2**64 - 1, 2**64, 10**30, -1, -2**31, -2**31 - 1, -2**63, -2**63 - 1]
NUMBER_TEXT = ["-0", "-0.0", "0.0", "1.0", "1e0", "1E2", "2.5", "1e308", "1e400", "-1e400",
               "1e-400", "4.9e-324", "18446744073709551616", "1" + "0" * 30, "1" + "0" * 400,
               "-9223372036854775809", "0.5e1", "100e-2"]


# names of optional fields somewhere in the format (null is absent in some, an error in others)
KEYS = ["zz", "shard", "host", "batch", "when", "algo", "cluster", "shared_mem", "params", "args",
        "fill", "domain", "of", "group", "axis", "rows", "cols", "interleave", "width", "context",
        "index_into", "min", "max", "topology", "cut", "constants", "pdl", "export", "placement",
        "stride", "monotone", "once", "graph", "derive", "scratch", "bind", "strides", "swizzle",
        "wrap", "label", "offset", "segments", "l2_promotion", "oob_nan", "bytes", "vars"]


def _paths(node: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    out = [(path, node)]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, path + (i,))
    return out


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _pick(rng, doc, pred=lambda p, v: True):
    cands = [(p, v) for p, v in _paths(doc) if pred(p, v)]
    return rng.choice(cands) if cands else (None, None)


def _label(path) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


# ---- structural ------------------------------------------------------------------------------
def structural(rng, doc):
    path, v = _pick(rng, doc, lambda p, v: bool(p))
    how = rng.choice(["delete", "null", "unknown", "empty", "dup-item", "swap", "drop-item",
                      "bool", "string", "copy-sibling"])
    parent = _get(doc, path[:-1])
    if how == "delete":
        del parent[path[-1]]
    elif how == "null":
        parent[path[-1]] = None
    elif how == "unknown" and isinstance(v, dict):  # unknown here, or a field's null
        v[rng.choice(KEYS)] = rng.choice([1, None, None, "x"])
    elif how == "empty":
        parent[path[-1]] = type(v)() if isinstance(v, (dict, list, str)) else 0
    elif how == "dup-item" and isinstance(v, list) and v:
        v.append(copy.deepcopy(rng.choice(v)))
    elif how == "swap" and isinstance(v, list) and len(v) > 1:
        i, j = rng.sample(range(len(v)), 2)
        v[i], v[j] = v[j], v[i]
    elif how == "drop-item" and isinstance(v, list) and v:
        v.pop(rng.randrange(len(v)))
    elif how == "bool":
        parent[path[-1]] = rng.choice([True, False])
    elif how == "string":
        parent[path[-1]] = rng.choice(["x", "n", "tokens", "in buffer<f32>", ""])
    elif how == "copy-sibling" and isinstance(parent, dict) and len(parent) > 1 and not (
            isinstance(v, dict) and any(isinstance(x, list) for x in parent.values())):
        other = rng.choice([k for k in parent if k != path[-1]])
        parent[path[-1]] = copy.deepcopy(parent[other])
    else:
        parent[path[-1]] = None
        how = "null"
    return doc, f"{how} {_label(path)}"


# ---- string ----------------------------------------------------------------------------------
def string(rng, doc):
    path, v = _pick(rng, doc, lambda p, v: isinstance(v, str) and bool(p))
    if path is None:
        return doc, "no string"
    how = rng.choice(["ws-start", "ws-end", "ws-mid", "ws-after-first-space", "non-ascii",
                      "upper", "truncate", "escape-char", "ws-only"])
    ws = rng.choice(WHITESPACE)
    if how == "ws-start":
        s = ws + v
    elif how == "ws-end":
        s = v + ws
    elif how == "ws-mid":
        i = rng.randrange(len(v) + 1)
        s = v[:i] + ws + v[i:]
    elif how == "ws-after-first-space":
        s = v.replace(" ", " " + ws, 1) if " " in v else v.replace("<", ws + "<", 1)
    elif how == "non-ascii":
        i = rng.randrange(len(v) + 1)
        s = v[:i] + rng.choice(NON_ASCII) + v[i + 1:]
    elif how == "upper":
        s = v.upper()
    elif how == "truncate":
        s = v[:rng.randrange(len(v) + 1)]
    elif how == "ws-only":
        s = ws
    else:
        s = v
    _set(doc, path, s)
    if how == "escape-char" and v:
        # the same string, one ordinary character written as a \\u escape: raw text
        c = rng.choice(v)
        text = json.dumps(doc)
        target = json.dumps(v)
        escaped = target.replace(c, "\\u%04x" % ord(c), 1) if ord(c) < 0x10000 else target
        return text.replace(target, escaped, 1), f"escape {c!r} in {_label(path)}"
    return doc, f"{how} {ws!r} {_label(path)}"


# ---- numeric ---------------------------------------------------------------------------------
def numeric(rng, doc):
    path, v = _pick(rng, doc, lambda p, v: bool(p) and type(v) in (int, float))
    if path is None:
        return doc, "no number"
    how = rng.choice(["limit", "limit", "near", "text", "text", "neg", "float"])
    if how == "limit":
        _set(doc, path, rng.choice(LIMITS))
    elif how == "near":
        _set(doc, path, v + rng.choice([-1, 1, -2, 2]) if type(v) is int else v * 2)
    elif how == "neg":
        _set(doc, path, -v if v else -1)
    elif how == "float":
        _set(doc, path, float(v) + rng.choice([0.0, 0.5]))
    else:
        marker = "__NUMBER__"
        _set(doc, path, marker)
        number = rng.choice(NUMBER_TEXT + [f"{v}.0", f"{v}e0", f"{v}E+0"])
        return json.dumps(doc).replace(f'"{marker}"', number), f"text {number} {_label(path)}"
    return doc, f"{how} {_label(path)} = {_get(doc, path)!r}"


# ---- JSON text -------------------------------------------------------------------------------
def _nested(n: int) -> str:
    return "[" * n + "1" + "]" * n


def json_text(rng, doc):
    text = json.dumps(doc, indent=rng.choice([None, 1]))
    how = rng.choice(["dup-key", "surrogate", "depth", "bom", "trailing", "bad-escape", "layout",
                      "control", "utf8", "depth-expr"])
    if how == "dup-key":
        keys = [m for m in _paths(doc) if m[0] and isinstance(m[0][-1], str)]
        path, v = rng.choice(keys)
        key = json.dumps(path[-1])
        i = text.find(key + ":")
        if i >= 0:
            text = text[:i] + key + ": " + json.dumps(rng.choice([v, 1, None])) + ", " + text[i:]
    elif how == "surrogate":
        esc = rng.choice([r"\ud800", r"\udc00", r"\ud83d\ude00", r"\udbff\udfff", r"\ud800\u0041",
                          r"\\ud800", r"\ud800\ud800"])
        path, v = _pick(rng, doc, lambda p, v: isinstance(v, str) and bool(p))
        if path is not None:
            text = text.replace(json.dumps(v), json.dumps(v)[:-1] + esc + '"', 1)
    elif how in ("depth", "depth-expr"):
        grids = [p for p, v in _paths(doc) if p and p[-1] == "grid"]
        if grids:
            path = rng.choice(grids)
            n = rng.choice([55, 58, 59, 60, 61, 62, 65, 100])
            if how == "depth":
                e: Any = {"ceil_div": [1, 1], "zz": "__DEEP__"}
            else:
                e = "n"
                for _ in range(n):
                    e = {"add": [e, 1]}
            _get(doc, path)[0] = e
            text = json.dumps(doc).replace('"__DEEP__"', _nested(n * 2 + rng.choice([-1, 0, 1])))
    elif how == "bom":
        return b"\xef\xbb\xbf" + text.encode(), "bom"
    elif how == "trailing":
        text += rng.choice(["\n", " \t\r\n", "x", "{}", "\x00", "\x0c"])
    elif how == "bad-escape":
        path, v = _pick(rng, doc, lambda p, v: isinstance(v, str) and bool(p))
        if path is not None:
            esc = rng.choice([r"\x41", r"\u12", r"\U0001F600", r"\/", r"\'", r"\a", r"\u00e9"])
            text = text.replace(json.dumps(v), json.dumps(v)[:-1] + esc + '"', 1)
    elif how == "layout":
        text = json.dumps(doc, indent=rng.choice([0, 2, "\t"]), separators=rng.choice(
            [(",", ":"), (" , ", " : "), (",\n", ":\t")]))
    elif how == "control":
        path, v = _pick(rng, doc, lambda p, v: isinstance(v, str) and bool(p))
        if path is not None:
            text = text.replace(json.dumps(v), json.dumps(v)[:-1] + rng.choice(
                ["\x00", "\x01", "\t", "\x7f", "\x1f"]) + '"', 1)
    elif how == "utf8":
        raw = text.encode()
        bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"])
        i = raw.rfind(b'"', 0, len(raw) // 2)
        return raw[:i] + bad + raw[i:], f"utf8 {bad!r}"
    return text, how


# ---- expressions -----------------------------------------------------------------------------
EXPR_FORMS = [
    lambda v: {"ceil_div": [v, 2], "mul": [v, 2]},
    lambda v: {"mul": [v, 0], "ceil_div": [v, 4]},
    lambda v: {"add": [v, 1], "mul": [v, 0]},
    lambda v: {"ceil_div": [v, v], "mul": [v, 2]},
    lambda v: {"ceil_div": [v, "K"], "mul": [v, 2]},
    lambda v: {"ceil_div": [v, "NOPE"], "mul": [v, 2]},
    lambda v: {"ceil_div": [v, 2], "mul": [{"ceil_div": [v, "NOPE"]}, 2]},
    lambda v: {"ceil_div": [v, 2], "add": [v, "NOPE"]},
    lambda v: {"ceil_div": [v, 2], "zz": {"mul": [v, "NOPE"]}},
    lambda v: {"ceil_div": [v, 2], "mul": ["NOPE"]},
    lambda v: {"ceil_div": [v, 2, 3]},
    lambda v: {"add": [v, 2**64 - 1]},
    lambda v: {"mul": [v, 2**62]},
    lambda v: {"add": [{"mul": [v, 2**52]}, 2**63]},
    lambda v: {"ceil_div": [{"add": [v, 2**64 - 5000]}, 4096]},
    lambda v: {"mul": [{"ceil_div": [v, 3]}, 7]},
    lambda v: "K",
    lambda v: {"add": ["K", v]},
    lambda v: 2**64 - 1,
    lambda v: 0,
]
CONSTANTS = [None, {}, {"K": 4}, {"K": 0}, {"K": 2.5}, {"K": -1}, {"K": 2**64}, {"K": 2**40}]


def _var(doc) -> str:
    return next(iter(doc.get("vars") or {"n": 0}))


def expression(rng, doc):
    sites = [p for p, v in _paths(doc) if p and (
        (len(p) >= 2 and p[-2] == "grid") or p[-1] in ("shared_mem", "expr", "min", "max")
        and "domain" in p or p[-1] == "expr")]
    site = rng.choice(sites) if sites else None
    form = rng.randrange(len(EXPR_FORMS))
    consts = rng.choice(CONSTANTS)
    if consts is not None:
        doc["constants"] = dict(consts)
    if site is not None:
        _set(doc, site, EXPR_FORMS[form](_var(doc)))
    return doc, f"expr #{form} at {_label(site or ())} constants {consts}"


# ---- shards ----------------------------------------------------------------------------------
SEGMENTS = [[], [[]], [[1]], [[0, 0]], [[1, 0]], [[0, 8]], [[1, 4096], [2, 2048]],
            [[1, 4096], [2, 2048], [0, 0]], [[2, 4096]], [[1, 8192]], [[2**64 - 1, 2], [1, 8192]],
            [[1, 4096, 1]], [[1, 4096.0]], [[-1, 4096]]]
BYS = ["heads", "position", ["heads"], [], {"heads": 1}, None, 5, "Heads", "heads ", True]


def shard(rng, doc):
    states = doc.get("states") or {}
    if not states:
        return doc, "no state"
    name = rng.choice(sorted(states))
    st = states[name]
    by = rng.choice(BYS)
    s: dict = {"by": by, "group": rng.choice(sorted((doc.get("topology") or {}).get("groups") or
                                                  {"tp": 1}) + ["zz"])}
    if by == "heads" or rng.random() < 0.3:
        s["segments"] = rng.choice(SEGMENTS)
    if rng.random() < 0.3:
        st.clear()
        st[rng.choice(["bytes_per_token", "bytes_per_seq", "bytes"])] = rng.choice([64, 4096])
    st["shard"] = s
    return doc, f"shard {name} {json.dumps(s)}"


FAMILIES: dict[str, Callable] = {"structural": structural, "string": string, "numeric": numeric,
                                 "json": json_text, "expression": expression, "shard": shard}


def _apply(rng, doc, fams):
    """Apply object-level edits in turn; a raw-text edit (json, or one returning text) ends."""
    labels = []
    for name in fams:
        try:
            doc, label = FAMILIES[name](rng, doc)
        except (TypeError, KeyError, IndexError, AttributeError):
            label = "skipped: an earlier edit left no place for it"  # e.g. its object nulled
            continue
        labels.append(f"{name}: {label}")
        if isinstance(doc, (str, bytes)):
            break
    return doc, "; ".join(labels)


def generate(bases: dict[str, dict], n: int, seed: int = 15) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    names = sorted(bases)
    order = list(FAMILIES) + ["combined"]
    out = []
    for i in range(n):
        family = order[i % len(order)]
        base = names[(i // len(order)) % len(names)]
        if family == "combined":
            fams = rng.sample([f for f in FAMILIES if f != "json"], rng.choice([2, 3]))
            if rng.random() < 0.3:
                fams.append("json")
        else:
            fams = [family]
        doc, label = _apply(rng, copy.deepcopy(bases[base]), fams)
        if isinstance(doc, str):
            data = doc.encode("utf-8", "surrogatepass")
        elif isinstance(doc, bytes):
            data = doc
        else:
            data = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        out.append((f"#{i} {base} [{family}] {label}", data))
    return out
