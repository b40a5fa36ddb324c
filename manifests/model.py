"""The kern manifest, schema_version 7, as typed Python values.

Contract: `Manifest.from_json(obj)` accepts exactly what kern-llm 0.3.1's parser accepts in
object form and nothing else: unknown keys, missing required keys, misspelled enumerations,
out-of-range integers, floats or booleans in integer positions are `ModelError`s naming the JSON
path. `constants` are substituted during parsing (wire-only sugar, never written back). `to_json`
writes the same JSON it read (absent optional fields stay absent), with keys in kern's field
order and name-keyed maps sorted, so `dumps` gives identical bytes for identical input.
Deliberately not here: any cross-reference or limit check (that is `verify`), and serde's
struct-from-array quirk (an array where an object belongs is rejected here, kern may accept it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from manifests import jsonload
from manifests.wire import (  # noqa: F401  (re-exported: the model's vocabulary)
    AXES,
    BOOL,
    _Ctx,
    DTYPE_BYTES,
    DTYPES,
    Enum,
    FILLS,
    Float,
    I32,
    I64,
    Int,
    _kind,
    KINDS,
    ListOf,
    MapOf,
    ModelError,
    param_type,
    ParamTypeT,
    PLACEMENTS,
    SCHEMA_VERSION,
    STR,
    Struct,
    TMA_DTYPES,
    U32,
    U64,
    U8,
    W,
)


# ---- expressions, dims, bounds -----------------------------------------------------------
@dataclass(frozen=True)
class Expr:
    """A compound expression `{op: [a, b]}`; leaves are ints (constants) and strs (vars)."""
    op: str
    a: Any
    b: Any


EXPR_OPS = ("ceil_div", "mul", "add")


class ExprT:
    def parse(self, v, path, ctx):
        if isinstance(v, str):
            return ctx.constants.get(v, v)
        if isinstance(v, int) and not isinstance(v, bool):
            return U64.parse(v, path, ctx)
        if isinstance(v, dict):
            # kern reads expressions as an untagged union whose members ignore extra keys:
            # the first operator key that parses wins, anything else in the object is dropped.
            for op in EXPR_OPS:
                pair = v.get(op)
                if not (isinstance(pair, list) and len(pair) == 2):
                    continue
                try:
                    a = self.parse(pair[0], f"{path}.{op}[0]", ctx)
                    rhs = self if op == "add" else U64
                    return Expr(op, a, rhs.parse(pair[1], f"{path}.{op}[1]", ctx))
                except ModelError:
                    continue
        raise ModelError(path, "not an expression (a u64, a var name, or one of "
                         "ceil_div/mul/add over two operands)")

    def dump(self, v):
        if isinstance(v, Expr):
            return {v.op: [self.dump(v.a), self.dump(v.b)]}
        return v


EXPR = ExprT()


class DimT:
    def parse(self, v, path, ctx):
        if isinstance(v, str):
            v = ctx.constants.get(v, v)
            if isinstance(v, str):
                return v
        return U64.parse(v, path, ctx)

    def dump(self, v):
        return v


class BoundT:
    def parse(self, v, path, ctx):
        if isinstance(v, str):
            v = ctx.constants.get(v, v)
        if isinstance(v, bool):
            raise ModelError(path, "a bound is an integer, a float or an expression")
        if isinstance(v, int):
            return v if -2**63 <= v < 2**63 else float(v)
        if isinstance(v, float):
            return v
        return EXPR.parse(v, path, ctx)

    def dump(self, v):
        return EXPR.dump(v)


# ---- one-key forms (call args, launch args, pack field sources) --------------------------
@dataclass
class Tagged:
    """A one-key union member such as `{"buf": "x", "offset": 4}` or `{"i32": 7}`."""
    form: str
    value: Any
    offset: int | None = None


class TaggedT:
    def __init__(self, what, forms: dict, offset_forms=()):
        self.what, self.forms, self.offset_forms = what, forms, offset_forms

    def parse(self, v, path, ctx):
        # exactly one form key, plus `offset` where that form allows it (objects have 1-2 keys,
        # so look at the object's keys rather than trying every form)
        if isinstance(v, dict) and 1 <= len(v) <= 2:
            present = [k for k in v if k in self.forms]
            if len(present) == 1:
                form = present[0]
                rest = len(v) - 1
                if rest == 0 or ("offset" in v and form in self.offset_forms):
                    off = U64.parse(v["offset"], f"{path}.offset", ctx) if "offset" in v else None
                    return Tagged(form, self.forms[form].parse(v[form], f"{path}.{form}", ctx), off)
        raise ModelError(path, f"not a {self.what} (one of "
                         + ", ".join(self.forms) + ")")

    def dump(self, t):
        out = {t.form: self.forms[t.form].dump(t.value)}
        if t.offset is not None:
            out["offset"] = t.offset
        return out


ARG = TaggedT("call argument", {"buf": STR, "state": STR, "var": STR, "expr": EXPR,
                                "i32": I32, "i64": I64, "f32": Float(), "u8": U8,
                                "rank": STR}, offset_forms=("buf", "state"))


@dataclass
class TensorMap:
    param: int = W(U32, required=True)
    dtype: str = W(Enum(TMA_DTYPES, "TMA dtype"), required=True)
    dims: list = W(ListOf(U64), required=True)
    strides: list = W(ListOf(U64))
    box: list = W(ListOf(U32), required=True)
    swizzle: int = W(U32)
    l2_promotion: int = W(U32)
    oob_nan: bool = W(BOOL)
    wrap: bool = W(BOOL)


FIELD_SRC = {"param": U32, "scratch": STR, "i32": I32, "i64": I64, "f32": Float(), "u8": U8,
             "var": STR, "expr": EXPR, "rank": STR, "tensormap": Struct(TensorMap)}


@dataclass
class Field:
    at: int
    width: int | None
    form: str
    value: Any


class FieldT:
    def parse(self, v, path, ctx):
        if not isinstance(v, dict):
            raise ModelError(path, f"expected an object, got {_kind(v)}")
        srcs = [k for k in v if k not in ("at", "width")]
        if "at" not in v or len(srcs) != 1 or srcs[0] not in FIELD_SRC:
            raise ModelError(path, "a pack field is `at`, optional `width` and one source of "
                             + ", ".join(FIELD_SRC))
        form = srcs[0]
        width = U32.parse(v["width"], f"{path}.width", ctx) if "width" in v else None
        return Field(U32.parse(v["at"], f"{path}.at", ctx), width, form,
                     FIELD_SRC[form].parse(v[form], f"{path}.{form}", ctx))

    def dump(self, f):
        out = {"at": f.at}
        if f.width is not None:
            out["width"] = f.width
        out[f.form] = FIELD_SRC[f.form].dump(f.value)
        return out


@dataclass
class Pack:
    size: int = W(U32, required=True)
    fields: list = W(ListOf(FieldT()), required=True)


LAUNCH_ARG = TaggedT("launch argument", {"param": U32, "scratch": STR, "i32": I32, "i64": I64,
                                         "f32": Float(), "u8": U8, "rank": STR,
                                         "pack": Struct(Pack)})


@dataclass
class When:
    var: str = W(STR, required=True)
    min: int = W(U64)
    max: int = W(U64)


@dataclass
class GemmAlgo:
    id: int = W(I32, required=True)
    tile: int = W(U32, required=True)
    stages: int = W(U32, required=True)
    split_k: int = W(I32, required=True)
    reduction: int = W(U32, required=True)
    swizzle: int = W(U32, required=True)
    custom: int = W(U32, required=True)
    inner_shape: int = W(U32, required=True)
    cluster_shape: int = W(U32, required=True)


@dataclass
class KernelLaunch:
    module: str = W(STR, required=True)
    entry: str = W(STR, required=True)
    params: list = W(ListOf(ParamTypeT()))
    block: list = W(ListOf(U32, 3), required=True)
    grid: list = W(ListOf(EXPR, 3), required=True)
    shared_mem: Any = W(EXPR)
    cluster: list = W(ListOf(U32, 3))
    pdl: bool = W(BOOL)
    args: list = W(ListOf(LAUNCH_ARG))
    when: When = W(Struct(When))


@dataclass
class ExternLaunch:
    entry: str = W(STR, required=True)
    params: list = W(ListOf(ParamTypeT()))
    args: list = W(ListOf(LAUNCH_ARG))
    when: When = W(Struct(When))
    algo: GemmAlgo = W(Struct(GemmAlgo))


class LaunchT:
    kernel, extern = Struct(KernelLaunch), Struct(ExternLaunch)

    def parse(self, v, path, ctx):
        for form in (self.kernel, self.extern):  # untagged: kernel form first, as kern does
            try:
                return form.parse(v, path, ctx)
            except ModelError:
                continue
        raise ModelError(path, "matches neither a kernel launch (module, entry, block, grid) "
                         "nor an extern launch (entry, params, args, when, algo)")

    def dump(self, v):
        return (self.kernel if isinstance(v, KernelLaunch) else self.extern).dump(v)


@dataclass
class Scratch:
    dtype: str = W(Enum(DTYPES, "dtype"), required=True)
    shape: list = W(ListOf(DimT()), required=True)


@dataclass
class Impl:
    scratch: dict = W(MapOf(Struct(Scratch)))
    launches: list = W(ListOf(LaunchT()), required=True)


@dataclass
class Op:
    params: list = W(ListOf(ParamTypeT()), required=True)
    impl: Impl = W(Struct(Impl), required=True)


@dataclass
class Call:
    label: str = W(STR)
    op: str = W(STR, required=True)
    args: list = W(ListOf(ARG), required=True)


@dataclass
class Batch:
    groups: int = W(U64, required=True)
    rows: Any = W(DimT(), required=True)
    context: str = W(STR)


@dataclass
class Program:
    batch: Batch = W(Struct(Batch))
    once: bool = W(BOOL)
    derive: bool = W(BOOL)
    graph: bool = W(BOOL)
    calls: list = W(ListOf(Struct(Call)), required=True)


# ---- buffers, states, modules, topology ---------------------------------------------------
class UnionT:
    """Untagged union of a plain form and a ranked `{group, <key>: [...]}` form."""

    def __init__(self, plain, ranked_key, ranked_item, what):
        self.plain, self.key, self.item, self.what = plain, ranked_key, ranked_item, what

    def parse(self, v, path, ctx):
        if isinstance(v, dict):
            if set(v) == {"group", self.key}:
                return {"group": STR.parse(v["group"], f"{path}.group", ctx),
                        self.key: ListOf(self.item).parse(v[self.key], f"{path}.{self.key}", ctx)}
            raise ModelError(path, f"not a {self.what}")
        try:
            return self.plain.parse(v, path, ctx)
        except ModelError:
            raise ModelError(path, f"not a {self.what}") from None

    def dump(self, v):
        return dict(v) if isinstance(v, dict) else self.plain.dump(v)


RANGE = ListOf(U64, 2)
TENSOR_SOURCE = UnionT(STR, "tensors", STR, "tensor source (a name or {group, tensors})")
RANGES = UnionT(RANGE, "ranges", RANGE, "range ([from, to) or {group, ranges})")


@dataclass
class Interleave:
    with_: Any = W(TENSOR_SOURCE, required=True, key="with")
    rows: int = W(U64, required=True)


@dataclass
class Segment:
    tensor: Any = W(TENSOR_SOURCE, required=True)
    rows: Any = W(RANGES)
    cols: Any = W(RANGES)
    interleave: Interleave = W(Struct(Interleave))


@dataclass
class Domain:
    min: Any = W(BoundT())
    max: Any = W(BoundT())
    index_into: str = W(STR)
    stride: int = W(U64)
    monotone: bool = W(BOOL)


@dataclass
class Buffer:
    dtype: str = W(Enum(DTYPES, "dtype"), required=True)
    shape: list = W(ListOf(DimT()), required=True)
    kind: str = W(Enum(KINDS, "kind"), required=True)
    placement: str = W(Enum(PLACEMENTS, "placement"))
    fill: str = W(Enum(FILLS, "fill"))
    domain: Domain = W(Struct(Domain))
    export: bool = W(BOOL)
    of: str = W(STR)
    group: str = W(STR)
    bind: list = W(ListOf(Struct(Segment)))


@dataclass
class HostTensor:
    dtype: str = W(Enum(DTYPES, "dtype"), required=True)
    shape: list = W(ListOf(U64), required=True)
    strides: list = W(ListOf(U64), required=True)


@dataclass
class Shard:
    by: str
    group: str
    segments: list | None = None


class ShardT:
    def parse(self, v, path, ctx):
        if not isinstance(v, dict):
            raise ModelError(path, f"expected an object, got {_kind(v)}")
        by = v.get("by")
        want = {"position": {"by", "group"}, "heads": {"by", "group", "segments"}}.get(by)
        if want is None:
            raise ModelError(path, "a shard is `by: position` or `by: heads`")
        if set(v) - want or "group" not in v:
            raise ModelError(path, f"`by: {by}` takes exactly " + ", ".join(sorted(want)))
        segs = None
        if by == "heads":
            segs = ListOf(ListOf(U64, 2)).parse(v.get("segments", []), f"{path}.segments", ctx)
        return Shard(by, STR.parse(v["group"], f"{path}.group", ctx), segs)

    def dump(self, s):
        out = {"by": s.by, "group": s.group}
        if s.segments is not None:
            out["segments"] = s.segments
        return out


@dataclass
class State:
    bytes_per_token: int = W(U64)
    bytes: int = W(U64)
    bytes_per_seq: int = W(U64)
    host: HostTensor = W(Struct(HostTensor))
    shard: Shard = W(ShardT())


@dataclass
class Module:
    source: str = W(STR, required=True)
    sha256: str = W(STR, required=True)


@dataclass
class Var:
    max: int = W(U64, required=True)
    axis: str = W(Enum(AXES, "var axis"))


@dataclass
class Topology:
    groups: dict = W(MapOf(U64), required=True)


@dataclass
class Cut:
    id: str = W(STR, required=True)
    stage: int = W(U64, required=True)
    stages: int = W(U64, required=True)


@dataclass
class Manifest:
    schema_version: int = W(Int("u32", 0, 2**32 - 1, consts=False), required=True)
    model: str = W(STR, required=True)
    topology: Topology = W(Struct(Topology))
    cut: Cut = W(Struct(Cut))
    vars: dict = W(MapOf(Struct(Var)))
    states: dict = W(MapOf(Struct(State)))
    buffers: dict = W(MapOf(Struct(Buffer)), required=True)
    modules: dict = W(MapOf(Struct(Module)), required=True)
    ops: dict = W(MapOf(Struct(Op)), required=True)
    programs: dict = W(MapOf(Struct(Program)), required=True)

    @classmethod
    def from_json(cls, obj: Any) -> "Manifest":
        """Parse a decoded JSON document; the one place constants are expanded."""
        if not isinstance(obj, dict):
            raise ModelError("$", f"a manifest is a JSON object, got {_kind(obj)}")
        obj = dict(obj)
        consts = obj.pop("constants", None)
        constants = _check_constants(consts, obj.get("vars"))
        return _MANIFEST.parse(obj, "$", _Ctx(constants))

    def to_json(self) -> dict:
        return _MANIFEST.dump(self)


_MANIFEST = Struct(Manifest)


def _check_constants(consts: Any, vars_: Any) -> dict:
    if consts is None:
        return {}
    if not isinstance(consts, dict):
        raise ModelError("$.constants", "constants must be an object")
    for name, value in consts.items():
        if not name or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelError(f"$.constants.{name}",
                             "constants need non-empty names and numeric literal values")
        if isinstance(vars_, dict) and name in vars_:
            raise ModelError(f"$.constants.{name}", f"constant `{name}` conflicts with a var")
    return consts


def dumps(manifest: Manifest) -> str:
    """Deterministic bytes: kern's field order, sorted maps, two-space indent, final newline."""
    return json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n"


def load(path: str | os.PathLike) -> Manifest:
    """Read and parse a manifest file strictly (see `jsonload.load_path` for the size limit)."""
    return Manifest.from_json(jsonload.load_path(path))
