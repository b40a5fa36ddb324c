"""The machinery that reads wire JSON into typed values (the names themselves: `vocab.wire`).

Contract: every scalar position of the format (integers range-checked by their wire type, floats,
strings, enumerations, param-type strings) and the generic containers (`ListOf`, `MapOf`,
`Struct` with its field table) live here, so `model.py` is only the format's shape: which struct
has which fields. Values are checked where they are read and every failure is a `ModelError` with
the JSON path; `constants` are substituted through `_Ctx`. Nothing here knows a manifest's
cross-references (that is `verify`).

Paths are built only when something fails: a container adds its own step to the error on the way
out, so reading an accepted manifest never formats a path (that was most of the parse's time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from vocab.errors import MineError
from vocab.wire import (  # noqa: F401  (re-exported: the reader's vocabulary)
    AXES,
    DTYPE_BYTES,
    DTYPES,
    FILLS,
    INT_RANGES,
    KINDS,
    PLACEMENTS,
    RUST_WHITESPACE,
    SCHEMA_VERSION,
    TMA_DTYPES,
    U64_MAX,
    param_type,
)

# kern's JSON reader (serde_json) refuses a document nested deeper than this many arrays/objects.
MAX_DEPTH = 127
F64_MAX = 1.7976931348623157e308


class ModelError(MineError, ValueError):
    """The JSON does not have the shape of a schema_version 7 manifest.

    `path` is where, `fact` what. `fatal` marks a fault kern finds while reading the whole
    document, before it tries the members of an untagged union, so no other member may rescue
    it: "json" for the text itself (nesting depth, a number out of range: faults of the JSON
    that only the schema tells apart from content), "constant" for an undefined constant.
    """

    def __init__(self, path: str, fact: str, fatal: str | bool = False):
        super().__init__(f"{path}: {fact}")
        self.path, self.fact, self.fatal = path, fact, fatal

    def within(self, step: str) -> "ModelError":
        """This error, one container further out (`step` is `.key` or `[i]`)."""
        path = "$" + step + self.path[1:] if self.path.startswith("$") else step + self.path
        return ModelError(path, self.fact, self.fatal)


def _obj(v) -> dict | None:
    """A JSON object, or None for anything else (`jsonload` has refused duplicate keys)."""
    return v if type(v) is dict else None


def check_junk(v, depth: int) -> None:
    """What kern still reads in a value it then ignores: its depth and its numbers' f64 range."""
    t = type(v)
    if t is dict or t is list:
        if depth > MAX_DEPTH:
            raise ModelError("$", f"JSON nesting deeper than {MAX_DEPTH} levels", fatal="json")
        items = v.values() if t is dict else v
        for x in items:
            check_junk(x, depth + 1)
    elif t is int and not -F64_MAX <= v <= F64_MAX:
        raise ModelError("$", "number out of range", fatal="json")


def _locate(parse, items, ctx) -> ModelError:
    """The first failing entry's error, with its step; `items` are (step, value) pairs."""
    for step, x in items:
        try:
            parse(x, ctx)
        except ModelError as exc:
            return exc.within(step)
    raise AssertionError("a container failed but none of its entries does")


# ---- scalar wire types -------------------------------------------------------------------
class _Ctx:
    def __init__(self, constants: dict[str, Any]):
        self.constants = constants


def _const(v: Any, ctx: _Ctx) -> Any:
    """A numeric position's value with constants substituted. kern substitutes only when the
    manifest has (non-empty) constants, and then an unknown name fails the whole document."""
    if type(v) is str and ctx.constants:
        if v not in ctx.constants:
            raise ModelError("$", f"undefined constant `{v}`", fatal="constant")
        return ctx.constants[v]
    return v


class Int:
    def __init__(self, name: str, lo: int, hi: int, consts: bool = True):
        self.name, self.lo, self.hi, self.consts = name, lo, hi, consts

    def parse(self, v, ctx):
        if type(v) is int and self.lo <= v <= self.hi:
            return v
        if self.consts:
            v = _const(v, ctx)
        if type(v) is not int:
            raise ModelError("$", f"expected {self.name}, got {_kind(v)}")
        if not self.lo <= v <= self.hi:
            raise ModelError("$", f"{v} is outside the {self.name} range")
        return v

    def dump(self, v):
        return v


U64, U32, U16, U8, I32, I64 = (Int(t, *INT_RANGES[t])
                               for t in ("u64", "u32", "u16", "u8", "i32", "i64"))


class Float:
    def parse(self, v, ctx):
        v = _const(v, ctx)
        if type(v) is float:
            return v
        if type(v) is not int:
            raise ModelError("$", f"expected a number, got {_kind(v)}")
        if not -F64_MAX <= v <= F64_MAX:  # serde_json reads a long integer as f64
            raise ModelError("$", "number out of range", fatal="json")
        return v

    def dump(self, v):
        return v


class Plain:
    def __init__(self, typ, name):
        self.typ, self.name = typ, name

    def parse(self, v, ctx):
        if type(v) is not self.typ:
            raise ModelError("$", f"expected {self.name}, got {_kind(v)}")
        return v

    def dump(self, v):
        return v


STR, BOOL = Plain(str, "a string"), Plain(bool, "a boolean")


class Enum(Plain):
    def __init__(self, values, what):
        super().__init__(str, "a string")
        self.values, self.what = frozenset(values), what
        self.listed = ", ".join(values)

    def parse(self, v, ctx):
        if type(v) is str and v in self.values:
            return v
        v = super().parse(v, ctx)
        raise ModelError("$", f"unknown {self.what} `{v}`, expected one of {self.listed}")


class ParamTypeT(Plain):
    def __init__(self):
        super().__init__(str, "a string")

    def parse(self, v, ctx):
        v = super().parse(v, ctx)
        if param_type(v) is None:
            raise ModelError("$", f"invalid param type `{v}`")
        return v


class ListOf:
    def __init__(self, item, length: int | None = None):
        self.item, self.length = item, length
        # a list of plain values (tensor names) is checked at C speed, without a call each
        self.plain = {item.typ} if type(item) is Plain else None

    def parse(self, v, ctx):
        if type(v) is not list:
            raise ModelError("$", f"expected an array, got {_kind(v)}")
        if self.length is not None and len(v) != self.length:
            raise ModelError("$", f"expected {self.length} entries, got {len(v)}")
        if self.plain is not None and set(map(type, v)) <= self.plain:
            return v[:]
        parse = self.item.parse
        try:
            return [parse(x, ctx) for x in v]
        except ModelError:
            raise _locate(parse, ((f"[{i}]", x) for i, x in enumerate(v)), ctx) from None

    def dump(self, v):
        return [self.item.dump(x) for x in v]


class MapOf:
    def __init__(self, item):
        self.item = item

    def parse(self, v, ctx):
        d = _obj(v)
        if d is None:
            raise ModelError("$", f"expected an object, got {_kind(v)}")
        parse = self.item.parse
        try:
            return {k: parse(x, ctx) for k, x in d.items()}
        except ModelError:
            from manifests.diagnostics import key_path
            raise _locate(parse, ((key_path("", k), x) for k, x in d.items()), ctx) from None

    def dump(self, v):
        return {k: self.item.dump(v[k]) for k in sorted(v)}


def _kind(v) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return f"integer {v}"
    if isinstance(v, float):
        return f"float {v}"
    return {str: "a string", list: "an array", dict: "an object", type(None): "null"}.get(
        type(v), type(v).__name__)


# ---- structs -----------------------------------------------------------------------------
def W(typ, *, required: bool = False, key: str | None = None, nullable: bool = False):
    """A dataclass field carrying its wire type; absent optional fields stay None.

    `nullable`: kern reads the field as an `Option`, so JSON `null` there means absent. The other
    optional fields are serde defaults, where `null` is a type error (probed field by field).
    """
    return field(default=None, metadata={"wire": typ, "required": required, "key": key,
                                         "nullable": nullable})


class Struct:
    def __init__(self, cls):
        self.cls = cls
        self.fields = [(f.metadata.get("key") or f.name, f.name, f.metadata["wire"],
                        f.metadata["required"], f.metadata["nullable"])
                       for f in dataclasses.fields(cls)]
        self.table = {k: (name, typ.parse, nullable) for k, name, typ, _, nullable in self.fields}
        self.required = [k for k, _, _, req, _ in self.fields if req]
        self.required_keys = frozenset(self.required)
        self.listed = ", ".join(k for k, *_ in self.fields)

    def parse(self, v, ctx):
        if type(v) is not dict:
            raise ModelError("$", f"expected an object, got {_kind(v)}")
        kw = {}
        table = self.table
        for key, x in v.items():
            spec = table.get(key)
            if spec is None:
                raise ModelError("$", f"unknown field `{key}`, expected one of {self.listed}")
            name, parse, nullable = spec
            if x is None and nullable:
                continue
            try:
                kw[name] = parse(x, ctx)
            except ModelError as exc:
                raise exc.within(f".{key}") from None
        if not v.keys() >= self.required_keys:
            missing = next(k for k in self.required if k not in v)
            raise ModelError("$", f"missing field `{missing}`")
        return self.cls(**kw)

    def dump(self, obj):
        out = {}
        for key, name, typ, _, _ in self.fields:
            val = getattr(obj, name)
            if val is not None:
                out[key] = typ.dump(val)
        return out
