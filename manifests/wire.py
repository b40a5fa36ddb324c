"""The manifest's vocabulary and the machinery that reads wire JSON into typed values.

Contract: every scalar position of the format (integers range-checked by their wire type, floats,
strings, enumerations, param-type strings) and the generic containers (`ListOf`, `MapOf`,
`Struct` with its field table) live here, so `model.py` is only the format's shape: which struct
has which fields. Values are checked where they are read and every failure is a `ModelError` with
the JSON path; `constants` are substituted through `_Ctx`. Nothing here knows a manifest's
cross-references (that is `verify`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import field
from typing import Any

SCHEMA_VERSION = 7
DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e8m0", "i8", "i32", "u32", "i64", "u64", "u8")
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8e4m3": 1, "fp8e8m0": 1, "i8": 1,
               "i32": 4, "u32": 4, "i64": 8, "u64": 8, "u8": 1}
KINDS = ("input", "output", "inout", "weight", "source", "workspace", "carry", "peer")
FILLS = ("token", "position", "valid", "slot", "seq_len", "cu_seqlens", "blocks",
         "tokens", "count", "error")
AXES = ("rows", "groups", "ranks")
PLACEMENTS = ("device", "host")
TMA_DTYPES = ("u8", "u16", "u32", "i32", "u64", "i64", "f16", "bf16", "f32", "tf32", "u4",
              "u4packed")


class ModelError(ValueError):
    """The JSON does not have the shape of a schema_version 7 manifest."""

    def __init__(self, path: str, fact: str):
        super().__init__(f"{path}: {fact}")
        self.path = path
        self.fact = fact


# ---- scalar wire types -------------------------------------------------------------------
class _Ctx:
    def __init__(self, constants: dict[str, Any]):
        self.constants = constants


def _const(v: Any, path: str, ctx: _Ctx) -> Any:
    if isinstance(v, str):
        if v not in ctx.constants:
            raise ModelError(path, f"undefined constant `{v}`")
        return ctx.constants[v]
    return v


class Int:
    def __init__(self, name: str, lo: int, hi: int, consts: bool = True):
        self.name, self.lo, self.hi, self.consts = name, lo, hi, consts

    def parse(self, v, path, ctx):
        if self.consts:
            v = _const(v, path, ctx)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelError(path, f"expected {self.name}, got {_kind(v)}")
        if not self.lo <= v <= self.hi:
            raise ModelError(path, f"{v} is outside the {self.name} range")
        return v

    def dump(self, v):
        return v


U64 = Int("u64", 0, 2**64 - 1)
U32 = Int("u32", 0, 2**32 - 1)
I32 = Int("i32", -2**31, 2**31 - 1)
I64 = Int("i64", -2**63, 2**63 - 1)
U8 = Int("u8", 0, 255)


class Float:
    def parse(self, v, path, ctx):
        v = _const(v, path, ctx)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelError(path, f"expected a number, got {_kind(v)}")
        return v

    def dump(self, v):
        return v


class Plain:
    def __init__(self, typ, name):
        self.typ, self.name = typ, name

    def parse(self, v, path, ctx):
        if not isinstance(v, self.typ) or (self.typ is int and isinstance(v, bool)):
            raise ModelError(path, f"expected {self.name}, got {_kind(v)}")
        return v

    def dump(self, v):
        return v


STR, BOOL = Plain(str, "a string"), Plain(bool, "a boolean")


class Enum(Plain):
    def __init__(self, values, what):
        super().__init__(str, "a string")
        self.values, self.what = values, what

    def parse(self, v, path, ctx):
        v = super().parse(v, path, ctx)
        if v not in self.values:
            raise ModelError(path, f"unknown {self.what} `{v}`, expected one of "
                             + ", ".join(self.values))
        return v


class ParamTypeT(Plain):
    def __init__(self):
        super().__init__(str, "a string")

    def parse(self, v, path, ctx):
        v = super().parse(v, path, ctx)
        if param_type(v) is None:
            raise ModelError(path, f"invalid param type `{v}`")
        return v


@functools.lru_cache(maxsize=4096)  # a manifest repeats a handful of type strings many times
def param_type(text: str) -> tuple | None:
    """`"in buffer<bf16>"` -> ("buffer", "in", "bf16"); scalars ("scalar", t); None if invalid.

    Other forms: ("state", dir), ("bytes", n). Words may be separated by any whitespace.
    """
    words = text.split()
    if len(words) == 1:
        w = words[0]
        if w in ("i32", "i64", "f32", "u8"):
            return ("scalar", w)
        m = re.fullmatch(r"bytes<([0-9]+)>", w)
        if m and 1 <= int(m.group(1)) <= 2**64 - 1:
            return ("bytes", int(m.group(1)))
        return None
    if len(words) == 2 and words[0] in ("in", "out", "inout"):
        if words[1] == "state":
            return ("state", words[0])
        m = re.fullmatch(r"buffer<(\w+)>", words[1])
        if m and m.group(1) in DTYPES:
            return ("buffer", words[0], m.group(1))
    return None


class ListOf:
    def __init__(self, item, length: int | None = None):
        self.item, self.length = item, length

    def parse(self, v, path, ctx):
        if not isinstance(v, list):
            raise ModelError(path, f"expected an array, got {_kind(v)}")
        if self.length is not None and len(v) != self.length:
            raise ModelError(path, f"expected {self.length} entries, got {len(v)}")
        return [self.item.parse(x, f"{path}[{i}]", ctx) for i, x in enumerate(v)]

    def dump(self, v):
        return [self.item.dump(x) for x in v]


class MapOf:
    def __init__(self, item):
        self.item = item

    def parse(self, v, path, ctx):
        if not isinstance(v, dict):
            raise ModelError(path, f"expected an object, got {_kind(v)}")
        return {k: self.item.parse(x, f"{path}.{k}", ctx) for k, x in v.items()}

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
def W(typ, *, required: bool = False, key: str | None = None):
    """A dataclass field carrying its wire type; absent optional fields stay None."""
    return field(default=None, metadata={"wire": typ, "required": required, "key": key})


class Struct:
    def __init__(self, cls):
        self.cls = cls
        self.fields = [(f.metadata.get("key") or f.name, f.name, f.metadata["wire"],
                        f.metadata["required"]) for f in dataclasses.fields(cls)]
        self.keys = {k for k, *_ in self.fields}

    def parse(self, v, path, ctx):
        if not isinstance(v, dict):
            raise ModelError(path, f"expected an object, got {_kind(v)}")
        extra = [k for k in v if k not in self.keys]
        if extra:
            raise ModelError(path, f"unknown field `{extra[0]}`, expected one of "
                             + ", ".join(k for k, *_ in self.fields))
        kw = {}
        for key, name, typ, req in self.fields:
            if key in v:
                kw[name] = typ.parse(v[key], f"{path}.{key}", ctx)
            elif req:
                raise ModelError(path, f"missing field `{key}`")
        return self.cls(**kw)

    def dump(self, obj):
        out = {}
        for key, name, typ, _ in self.fields:
            val = getattr(obj, name)
            if val is not None:
                out[key] = typ.dump(val)
        return out


class Lazy:
    """Resolve a wire type defined later in this module (recursive and forward references)."""

    def __init__(self, name):
        self.name, self._t = name, None

    def _get(self):
        if self._t is None:
            self._t = globals()[self.name]
        return self._t

    def parse(self, v, path, ctx):
        return self._get().parse(v, path, ctx)

    def dump(self, v):
        return self._get().dump(v)
