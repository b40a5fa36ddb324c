"""The kern manifest, schema_version 7, as typed Python values.

Contract: `Manifest.from_json(obj)` accepts exactly what kern-llm 0.3.1's parser accepts in
object form and nothing else: unknown keys, missing required keys, misspelled enumerations,
out-of-range integers, floats or booleans in integer positions are `ModelError`s naming the JSON
path. `constants` are substituted during parsing (wire-only sugar, never written back). `to_json`
writes the same JSON it read (absent optional fields stay absent), with keys in kern's field
order and name-keyed maps sorted; `dumps` writes it in the one canonical form (`vocab.dumps`:
keys sorted, compact), so identical input gives identical bytes.
Deliberately not here: any cross-reference or limit check (that is `verify`), and serde's
struct-from-array quirk (an array where an object belongs is rejected here, kern may accept it).
"""

from __future__ import annotations

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
    F64_MAX,
    FILLS,
    Float,
    INT_RANGES,
    I32,
    I64,
    Int,
    _kind,
    KINDS,
    ListOf,
    MapOf,
    MAX_DEPTH,
    ModelError,
    param_type,
    ParamTypeT,
    PLACEMENTS,
    SCHEMA_VERSION,
    STR,
    Struct,
    TMA_DTYPES,
    U16,
    U32,
    U64,
    U8,
    U64_MAX,
    W,
    _obj,
    check_junk,
)
from vocab.dumps import dumps as _canonical
from vocab.expr import OPS as EXPR_OPS, Expr, to_wire


# ---- expressions, dims, bounds -----------------------------------------------------------


def _fatal_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ModelError("$", f"JSON nesting deeper than {MAX_DEPTH} levels", fatal="json")


def _check_constant_names(d: dict, ctx) -> None:
    """kern's constants pass over an expression object, before any union member is tried.

    Probed: under every operator key holding an array, entry 0 (and entry 1 of `add`) is an
    expression walked again, entry 1 of `ceil_div`/`mul` is a number position where a string must
    name a constant -- even when another operator key would have parsed. Other keys are skipped.
    """
    for op in EXPR_OPS:
        pair = d.get(op)
        if type(pair) is not list:
            continue
        for i, x in enumerate(pair[:2]):
            if i == 1 and op != "add":
                if type(x) is str and x not in ctx.constants:
                    raise ModelError(f"$.{op}[1]", f"undefined constant `{x}`", fatal="constant")
                continue
            sub = _obj(x)
            if sub is not None:
                try:
                    _check_constant_names(sub, ctx)
                except ModelError as exc:
                    raise exc.within(f".{op}[{i}]") from None


class ExprT:
    """An expression at one site of the format; `depth` is the JSON nesting level of a value
    there (the root object is 1), so nesting is refused exactly where serde_json refuses it."""

    def __init__(self, depth: int):
        self.depth = depth

    def parse(self, v, ctx):
        return self._parse(v, ctx, self.depth)

    def _parse(self, v, ctx, depth):
        t = type(v)
        if t is str:
            if v in ctx.constants:
                c = ctx.constants[v]
                if type(c) is int and 0 <= c <= U64_MAX:
                    return c
                raise ModelError("$", f"constant `{v}` = {c} is not a u64")
            return v
        if t is int:
            if 0 <= v <= U64_MAX:
                return v
            raise ModelError("$", f"{v} is outside the u64 range")
        d = _obj(v)
        if d is not None:
            _fatal_depth(depth)
            if ctx.constants:
                _check_constant_names(d, ctx)
            if len(d) > 1:  # members kern reads and then drops still count for depth and keys
                for x in d.values():
                    check_junk(x, depth + 1)
            # kern reads expressions as an untagged union whose members ignore extra keys:
            # the first operator key that parses wins, anything else in the object is dropped.
            for op in EXPR_OPS:
                pair = d.get(op)
                if not (type(pair) is list and len(pair) == 2):
                    continue
                _fatal_depth(depth + 1)
                try:
                    a = self._parse(pair[0], ctx, depth + 2)
                    b = (self._parse(pair[1], ctx, depth + 2) if op == "add"
                         else U64.parse(pair[1], ctx))
                except ModelError as exc:
                    if exc.fatal:
                        raise exc.within(f".{op}") from None
                    continue
                return Expr(op, a, b)
        raise ModelError("$", "not an expression (a u64, a var name, or one of "
                         "ceil_div/mul/add over two operands)")

    def dump(self, v):
        return to_wire(v)


# The sites of expressions, by the nesting level of the value there:
# $.ops.<op>.impl.launches[i].grid[j] and $.programs.<p>.calls[i].args[j].expr sit at level 8,
# $.ops.<op>.impl.launches[i].shared_mem at 7, a pack field's expr
# ($.ops.<op>.impl.launches[i].args[j].pack.fields[k].expr) at 12, a domain bound at 5.
GRID_EXPR, SHARED_MEM_EXPR, CALL_EXPR, FIELD_EXPR = ExprT(8), ExprT(7), ExprT(8), ExprT(12)
EXPR = CALL_EXPR  # for callers that only dump


class DimT:
    def parse(self, v, ctx):
        if type(v) is str:
            if v not in ctx.constants:
                return v
            v = ctx.constants[v]
        return U64.parse(v, ctx)

    def dump(self, v):
        return v


class BoundT:
    """A domain bound: an i64, else a float (serde tries i64 first, then f64), else an
    expression."""

    def __init__(self, depth: int):
        self.expr = ExprT(depth)

    def parse(self, v, ctx):
        if type(v) is str and v in ctx.constants:
            v = ctx.constants[v]
        t = type(v)
        if t is int:
            if -2**63 <= v < 2**63:
                return v
            if not -F64_MAX <= v <= F64_MAX:
                raise ModelError("$", "number out of range", fatal="json")
            return float(v)
        if t is float:
            return v
        if t is bool:
            raise ModelError("$", "a bound is an integer, a float or an expression")
        return self.expr.parse(v, ctx)

    def dump(self, v):
        return self.expr.dump(v)


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
        self.fail = f"not a {what} (one of " + ", ".join(forms) + ")"

    def parse(self, v, ctx):
        # exactly one form key, plus `offset` where that form allows it (objects have 1-2 keys,
        # so look at the object's keys rather than trying every form)
        if type(v) is dict and (len(v) == 1 or len(v) == 2 and "offset" in v):
            form = next(k for k in v if k != "offset") if len(v) == 2 else next(iter(v))
            typ = self.forms.get(form)
            if typ is not None and (len(v) == 1 or form in self.offset_forms):
                try:
                    off = U64.parse(v["offset"], ctx) if len(v) == 2 else None
                except ModelError as exc:
                    raise exc.within(".offset") from None
                try:
                    return Tagged(form, typ.parse(v[form], ctx), off)
                except ModelError as exc:
                    raise exc.within(f".{form}") from None
        raise ModelError("$", self.fail)

    def dump(self, t):
        out = {t.form: self.forms[t.form].dump(t.value)}
        if t.offset is not None:
            out["offset"] = t.offset
        return out


ARG = TaggedT("call argument", {"buf": STR, "state": STR, "var": STR, "expr": CALL_EXPR,
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
             "var": STR, "expr": FIELD_EXPR, "rank": STR, "tensormap": Struct(TensorMap)}


@dataclass
class Field:
    at: int
    width: int | None
    form: str
    value: Any


class FieldT:
    def parse(self, v, ctx):
        d = _obj(v)
        if d is None:
            raise ModelError("$", f"expected an object, got {_kind(v)}")
        srcs = [k for k in d if k not in ("at", "width")]
        if "at" not in d or len(srcs) != 1 or srcs[0] not in FIELD_SRC:
            raise ModelError("$", "a pack field is `at`, optional `width` and one source of "
                             + ", ".join(FIELD_SRC))
        form = srcs[0]
        out = []
        for key, typ in (("width", U32), ("at", U32), (form, FIELD_SRC[form])):
            x = d.get(key)
            if key == "width" and x is None:  # an `Option`: absent or null
                out.append(None)
                continue
            try:
                out.append(typ.parse(x, ctx))
            except ModelError as exc:
                raise exc.within(f".{key}") from None
        width, at, value = out
        return Field(at, width, form, value)

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
    min: int = W(U64, nullable=True)
    max: int = W(U64, nullable=True)


@dataclass
class GemmAlgo:
    id: int = W(I32, required=True)
    tile: int = W(U32, required=True)
    stages: int = W(U32, required=True)
    split_k: int = W(I32, required=True)
    reduction: int = W(U32, required=True)
    swizzle: int = W(U32, required=True)
    custom: int = W(U32, required=True)
    inner_shape: int = W(U16, required=True)  # u16 in kern (probed: 65536 is refused)
    cluster_shape: int = W(U16, required=True)


@dataclass
class KernelLaunch:
    module: str = W(STR, required=True)
    entry: str = W(STR, required=True)
    params: list = W(ListOf(ParamTypeT()), nullable=True)
    block: list = W(ListOf(U32, 3), required=True)
    grid: list = W(ListOf(GRID_EXPR, 3), required=True)
    shared_mem: Any = W(SHARED_MEM_EXPR, nullable=True)
    cluster: list = W(ListOf(U32, 3), nullable=True)
    pdl: bool = W(BOOL)
    args: list = W(ListOf(LAUNCH_ARG), nullable=True)
    when: When = W(Struct(When), nullable=True)


@dataclass
class ExternLaunch:
    entry: str = W(STR, required=True)
    params: list = W(ListOf(ParamTypeT()), nullable=True)
    args: list = W(ListOf(LAUNCH_ARG), nullable=True)
    when: When = W(Struct(When), nullable=True)
    algo: GemmAlgo = W(Struct(GemmAlgo), nullable=True)


class LaunchT:
    kernel, extern = Struct(KernelLaunch), Struct(ExternLaunch)

    def parse(self, v, ctx):
        for form in (self.kernel, self.extern):  # untagged: kernel form first, as kern does
            try:
                return form.parse(v, ctx)
            except ModelError as exc:
                if exc.fatal:
                    raise
        raise ModelError("$", "matches neither a kernel launch (module, entry, block, grid) "
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
    label: str = W(STR, nullable=True)
    op: str = W(STR, required=True)
    args: list = W(ListOf(ARG), required=True)


@dataclass
class Batch:
    groups: int = W(U64, required=True)
    rows: Any = W(DimT(), required=True)
    context: str = W(STR, nullable=True)


@dataclass
class Program:
    batch: Batch = W(Struct(Batch), nullable=True)
    once: bool = W(BOOL)
    derive: bool = W(BOOL)
    graph: bool = W(BOOL)
    calls: list = W(ListOf(Struct(Call)), required=True)


# ---- buffers, states, modules, topology ---------------------------------------------------
class UnionT:
    """Untagged union of a plain form and a ranked `{group, <key>: [...]}` form."""

    def __init__(self, plain, ranked_key, ranked_item, what):
        self.plain, self.key, self.item, self.what = plain, ranked_key, ranked_item, what
        self.items = ListOf(ranked_item)

    def parse(self, v, ctx):
        d = v if type(v) is dict else None
        if d is not None:
            if len(d) == 2 and "group" in d and self.key in d:
                if type(d["group"]) is not str:
                    raise ModelError("$.group", f"expected a string, got {_kind(d['group'])}")
                try:
                    return {"group": d["group"], self.key: self.items.parse(d[self.key], ctx)}
                except ModelError as exc:
                    raise exc.within(f".{self.key}") from None
            raise ModelError("$", f"not a {self.what}")
        try:
            return self.plain.parse(v, ctx)
        except ModelError:
            raise ModelError("$", f"not a {self.what}") from None

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
    rows: Any = W(RANGES, nullable=True)
    cols: Any = W(RANGES, nullable=True)
    interleave: Interleave = W(Struct(Interleave), nullable=True)


class SegmentT(Struct):
    """A bind segment. Most are one whole tensor, `{"tensor": name or {group, tensors}}` --
    tens of thousands in an expert-parallel manifest -- so those skip the field table."""

    def parse(self, v, ctx):
        if type(v) is dict and len(v) == 1 and "tensor" in v:
            try:
                return Segment(TENSOR_SOURCE.parse(v["tensor"], ctx))
            except ModelError as exc:
                raise exc.within(".tensor") from None
        return super().parse(v, ctx)


@dataclass
class Domain:
    min: Any = W(BoundT(5), nullable=True)
    max: Any = W(BoundT(5), nullable=True)
    index_into: str = W(STR, nullable=True)
    stride: int = W(U64)
    monotone: bool = W(BOOL)


@dataclass
class Buffer:
    dtype: str = W(Enum(DTYPES, "dtype"), required=True)
    shape: list = W(ListOf(DimT()), required=True)
    kind: str = W(Enum(KINDS, "kind"), required=True)
    placement: str = W(Enum(PLACEMENTS, "placement"))
    fill: str = W(Enum(FILLS, "fill"), nullable=True)
    domain: Domain = W(Struct(Domain), nullable=True)
    export: bool = W(BOOL)
    of: str = W(STR, nullable=True)
    group: str = W(STR, nullable=True)
    bind: list = W(ListOf(SegmentT(Segment)))


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
    def parse(self, v, ctx):
        d = _obj(v)
        if d is None:
            raise ModelError("$", f"expected an object, got {_kind(v)}")
        by = d.get("by")
        want = {"position": {"by", "group"}, "heads": {"by", "group", "segments"}}.get(
            by if type(by) is str else None)
        if want is None:
            raise ModelError("$", "a shard is `by: position` or `by: heads`")
        if not d.keys() <= want or "group" not in d:
            raise ModelError("$", f"`by: {by}` takes exactly " + ", ".join(sorted(want)))
        segs = None
        if by == "heads":
            try:
                segs = _SEGMENTS.parse(d.get("segments", []), ctx)
            except ModelError as exc:
                raise exc.within(".segments") from None
        try:
            group = STR.parse(d["group"], ctx)
        except ModelError as exc:
            raise exc.within(".group") from None
        return Shard(by, group, segs)

    def dump(self, s):
        out = {"by": s.by, "group": s.group}
        if s.segments is not None:
            out["segments"] = s.segments
        return out


_SEGMENTS = ListOf(ListOf(U64, 2))


@dataclass
class State:
    bytes_per_token: int = W(U64)
    bytes: int = W(U64)
    bytes_per_seq: int = W(U64)
    host: HostTensor = W(Struct(HostTensor), nullable=True)
    shard: Shard = W(ShardT(), nullable=True)


@dataclass
class Module:
    source: str = W(STR, required=True)
    sha256: str = W(STR, required=True)


@dataclass
class Var:
    max: int = W(U64, required=True)
    axis: str = W(Enum(AXES, "var axis"), nullable=True)


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
    schema_version: int = W(Int("u32", *INT_RANGES["u32"], consts=False), required=True)
    model: str = W(STR, required=True)
    topology: Topology = W(Struct(Topology), nullable=True)
    cut: Cut = W(Struct(Cut), nullable=True)
    vars: dict = W(MapOf(Struct(Var)))
    states: dict = W(MapOf(Struct(State)))
    buffers: dict = W(MapOf(Struct(Buffer)), required=True)
    modules: dict = W(MapOf(Struct(Module)), required=True)
    ops: dict = W(MapOf(Struct(Op)), required=True)
    programs: dict = W(MapOf(Struct(Program)), required=True)

    @classmethod
    def from_json(cls, obj: Any) -> "Manifest":
        """Parse a decoded JSON document; the one place constants are expanded."""
        d = _obj(obj)
        if d is None:
            raise ModelError("$", f"a manifest is a JSON object, got {_kind(obj)}")
        d = dict(d)
        consts = d.pop("constants", _ABSENT)
        constants = _check_constants(consts, d.get("vars"))
        return _MANIFEST.parse(d, _Ctx(constants))

    def to_json(self) -> dict:
        return _MANIFEST.dump(self)


_MANIFEST = Struct(Manifest)
_ABSENT = object()


def _check_constants(consts: Any, vars_: Any) -> dict:
    if consts is _ABSENT:
        return {}
    c = _obj(consts)
    if c is None:  # `null` included: kern reads constants as a plain map
        raise ModelError("$.constants", "constants must be an object")
    var_names = _obj(vars_) or {}
    for name, value in c.items():
        if not name or type(value) not in (int, float):
            raise ModelError(f"$.constants.{name}",
                             "constants need non-empty names and numeric literal values")
        if type(value) is int and not -F64_MAX <= value <= F64_MAX:
            raise ModelError(f"$.constants.{name}", "number out of range", fatal="json")
        if name in var_names:
            raise ModelError(f"$.constants.{name}", f"constant `{name}` conflicts with a var")
    return c


def dumps(manifest: Manifest) -> str:
    """The canonical bytes (`vocab.dumps`) of the manifest's JSON: the same bytes the
    generators commit, so a parsed-and-dumped committed manifest reads back unchanged."""
    return _canonical(manifest.to_json())


def load(path: str | os.PathLike) -> Manifest:
    """Read and parse a manifest file strictly (see `jsonload.load_path` for the size limit)."""
    return Manifest.from_json(jsonload.load_path(path))
