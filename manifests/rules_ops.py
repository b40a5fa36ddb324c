"""Op rules: interfaces, scratch, launch geometry, argument wiring, packs and tensormaps.

Contract: per op (sorted), checks what kern checks without a GPU; records per op which launches
are extern/nccl and the tensormap footprints per interface param, for the call checks in
`rules_programs`. Not checked: whether the kernel really has the declared ABI (`abi` does that
against a cubin), whether `when` ranges cover every value, extern names beyond `extern:`.
"""

from __future__ import annotations

from manifests import expr as ex
from manifests.diagnostics import key_path
from manifests.model import KernelLaunch, param_type
from manifests.verify import Scope, shape_bytes
from vocab.wire import DTYPE_BYTES, POINTER_BYTES, SCALARS, TMA_DTYPE_BITS, param_type_bytes

GRID_LIMITS = (2**31 - 1, 65535, 65535)
SHARED_MEM_LIMIT = 232448
# A pack field's width by its source form: scalars at their dtype's size, a scratch pointer at a
# pointer's, var/expr/rank values as i32, a tensormap as the 128-byte CUtensorMap.
NATURAL_WIDTH = {**{t: DTYPE_BYTES[t] for t in SCALARS}, "scratch": POINTER_BYTES, "var": 4,
                 "expr": 4, "rank": 4, "tensormap": 128}
GEMMS_WITH_ALGO = ("extern:cublaslt_bf16_tn", "extern:cublaslt_bf16_tn_acc")


def check(s: Scope) -> None:
    for name in sorted(s.m.ops):
        _op(s, name, s.m.ops[name], key_path("$.ops", name))


def _op(s: Scope, name: str, op, path: str) -> None:
    iface = [param_type(p) for p in op.params]
    s.op_iface[name] = iface
    for i, pt in enumerate(iface):
        if pt[0] == "bytes":
            s.add("op.bytes_param", f"{path}.params[{i}]", "a byte aggregate is launch-private; "
                  "the interface takes the buffers and scalars it is assembled from")
    scratch = op.impl.scratch or {}
    for sn in sorted(scratch):
        shape_bytes(s, scratch[sn].dtype, scratch[sn].shape, key_path(f"{path}.impl.scratch", sn),
                    "scratch")
    launches = op.impl.launches
    if not launches:
        s.add("op.no_launches", f"{path}.impl.launches", "implementation has no launches")
    st = _OpState(iface, scratch)
    s.op_footprints[name] = st.footprints
    s.op_extern[name] = any(not isinstance(ln, KernelLaunch) for ln in launches)
    s.op_nccl[name] = any(not isinstance(ln, KernelLaunch) and ln.entry.startswith("extern:nccl")
                          for ln in launches)
    for li, ln in enumerate(launches):
        _launch(s, st, ln, f"{path}.impl.launches[{li}]")
    for i, pt in enumerate(iface):
        if pt[0] in ("buffer", "state") and pt[1] == "out" and i not in st.written:
            s.add("op.out_never_written", f"{path}.params[{i}]",
                  f"interface `out` param #{i} is never written by any launch")
    for sn in sorted(scratch):
        if sn not in st.scratch_used:
            s.add("op.scratch_unused", key_path(f"{path}.impl.scratch", sn),
                  f"scratch `{sn}` is never used")


class _OpState:
    def __init__(self, iface, scratch):
        self.iface, self.scratch = iface, scratch
        self.written: set[int] = set()
        self.scratch_written: set[str] = set()
        self.scratch_used: set[str] = set()
        self.footprints: dict[int, list] = {}


def _launch(s: Scope, st: _OpState, ln, path: str) -> None:
    if ln.when is not None:
        w = ln.when
        s.used_vars.add(w.var)
        if w.var not in s.vars:
            s.add("launch.when_unknown_var", f"{path}.when.var", f"when: unknown var `{w.var}`")
        if w.min is not None and w.max is not None and w.min > w.max:
            s.add("launch.when_empty", f"{path}.when", f"when: `{w.var}` range [{w.min}, "
                  f"{w.max}] is empty")
    if isinstance(ln, KernelLaunch):
        _geometry(s, ln, path)
    else:
        if not ln.entry.startswith("extern:"):
            s.add("launch.not_builtin", f"{path}.entry", "a launch without a module must be a "
                  "runtime built-in (`extern:<name>`)")
        if ln.algo is not None and ln.entry not in GEMMS_WITH_ALGO:
            s.add("launch.algo_not_gemm", f"{path}.algo", "`algo` pins a cublaslt_bf16_tn[_acc]"
                  f" launch, not `{ln.entry}`")
    params = st.iface if ln.params is None else [param_type(p) for p in ln.params]
    if not isinstance(ln, KernelLaunch) and any(p[0] == "bytes" for p in params):
        s.add("launch.extern_bytes", f"{path}.params", "a runtime built-in takes no byte "
              "aggregate")
    if ln.args is None:
        from manifests.model import Tagged
        args = [Tagged("param", i) for i in range(len(st.iface))]
    else:
        args = ln.args
    if len(args) != len(params):
        s.add("launch.arity", f"{path}.args", f"takes {len(params)} params, got {len(args)} args")
        return
    for i, (a, pt) in enumerate(zip(args, params)):
        _launch_arg(s, st, a, pt, f"{path}.args[{i}]")


def _geometry(s: Scope, ln, path: str) -> None:
    s.used_modules.add(ln.module)
    if not ln.entry:
        s.add("launch.empty_entry", f"{path}.entry", "empty entry")
    elif ln.entry.startswith("extern:"):
        s.add("launch.extern_with_module", f"{path}.entry",
              "an extern entry has no module or launch geometry")
    if ln.module not in s.m.modules:
        s.add("launch.unknown_module", f"{path}.module", f"unknown module `{ln.module}`")
    b = ln.block
    if 0 in b or b[0] * b[1] * b[2] > 1024:
        s.add("launch.block", f"{path}.block", f"block {b} exceeds 1024 threads or has a zero dim")
    if b[2] > 64:
        s.add("launch.block_z", f"{path}.block[2]", f"block.z {b[2]} exceeds 64")
    grid_vals = []
    for ax, g in enumerate(ln.grid):
        gp = f"{path}.grid[{ax}]"
        lo, hi = _expr_corners(s, g, gp)
        if hi is not None and hi > GRID_LIMITS[ax]:
            s.add("launch.grid_limit", gp, f"grid value {hi} exceeds CUDA limit "
                  f"{GRID_LIMITS[ax]} at var upper bounds")
        if lo == 0:
            s.add("launch.grid_zero", gp, "grid is 0 at var lower bounds")
        grid_vals.append((lo, hi))
    if ln.shared_mem is not None:
        sp = f"{path}.shared_mem"
        hi = _value_at_max(s, ln.shared_mem, sp)
        if hi is not None and hi > SHARED_MEM_LIMIT:
            s.add("launch.shared_mem", sp, f"{hi} bytes exceeds opt-in limit {SHARED_MEM_LIMIT} "
                  "at var upper bounds")
    if ln.cluster is not None:
        c = ln.cluster
        if 0 in c or c[0] * c[1] * c[2] > 16:
            s.add("launch.cluster", f"{path}.cluster", f"cluster {c} has a zero dim or more "
                  "than 16 blocks")
        else:
            for ax, (lo, hi) in enumerate(grid_vals):
                if any(v is not None and v % c[ax] for v in (lo, hi)):
                    s.add("launch.cluster_grid", f"{path}.grid[{ax}]",
                          f"grid is not a multiple of cluster extent {c[ax]}")


def _expr_corners(s: Scope, e, path: str):
    """A grid expression's value at var maxima and minima, in checked u64 arithmetic: in grids,
    unlike everywhere else, kern reports an overflow."""
    if type(e) is int:  # most grid extents are constants
        return e, e
    s.used_vars |= ex.var_names(e)
    faults = ex.check(e, s.vars)
    for rule, msg in faults:
        s.add(rule, path, msg)
    vals = []
    for env in (s.hi, s.lo):
        try:
            vals.append(ex.evaluate(e, env))
        except ex.EvalError as exc:
            if env is s.hi:
                s.add("expr.eval", path, f"{exc} at var upper bounds")
            vals.append(None)
    return vals[1], vals[0]


def _value_at_max(s: Scope, e, path: str):
    """Structural faults, then the value at var maxima, None when there is none: outside grids
    kern skips the checks of an expression that overflows (probed), so it is no error here."""
    s.used_vars |= ex.var_names(e)
    faults = ex.check(e, s.vars)
    for rule, msg in faults:
        s.add(rule, path, msg)
    try:
        return ex.evaluate(e, s.hi)
    except ex.EvalError:
        return None


def _compatible(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "buffer":
        return a[2] == b[2]
    return a[0] == "state" or a == b


def _launch_arg(s: Scope, st: _OpState, a, pt: tuple, path: str) -> None:
    form = a.form
    if form == "param":
        i = a.value
        if i >= len(st.iface):
            s.add("launch.param_range", path, f"forwarded param #{i} out of range")
            return
        ip = st.iface[i]
        if not _compatible(ip, pt):
            s.add("launch.param_mismatch", path, "interface param does not match launch param")
            return
        if pt[0] in ("buffer", "state"):
            writes, reads = pt[1] in ("out", "inout"), pt[1] in ("in", "inout")
            if writes and ip[1] == "in":
                s.add("launch.write_through_in", path,
                      f"launch writes through interface `in` param #{i}")
            if reads and ip[1] == "out" and i not in st.written:
                s.add("launch.read_unwritten_out", path,
                      f"interface `out` param #{i} is read before any launch wrote it")
            if writes:
                st.written.add(i)
    elif form == "scratch":
        name = a.value
        if name not in st.scratch:
            s.add("launch.unknown_scratch", path, f"unknown scratch `{name}`")
            return
        st.scratch_used.add(name)
        if pt[0] != "buffer":
            s.add("launch.scratch_not_buffer", path, f"scratch `{name}` bound to a non-buffer "
                  "param")
            return
        if pt[2] != st.scratch[name].dtype:
            s.add("launch.scratch_dtype", path, f"scratch `{name}` has dtype "
                  f"{st.scratch[name].dtype} but param expects {pt[2]}")
        if pt[1] in ("in", "inout") and name not in st.scratch_written:
            s.add("launch.scratch_read_unwritten", path, f"scratch `{name}` is read before any "
                  "launch wrote it")
        if pt[1] in ("out", "inout"):
            st.scratch_written.add(name)
    elif form in ("i32", "i64", "f32", "u8"):
        if pt != ("scalar", form):
            s.add("launch.literal_type", path, f"a {form} literal does not match the launch param")
    elif form == "rank":
        s.used_groups.add(a.value)
        if pt not in (("scalar", "i32"), ("scalar", "i64")):
            s.add("launch.rank_type", path, "a rank binds only to an i32 or i64 param")
        if a.value not in s.groups:
            s.add("launch.unknown_group", path, f"unknown topology group `{a.value}`")
    elif form == "pack":
        _pack(s, st, a.value, pt, path)


def _pack(s: Scope, st: _OpState, pack, pt: tuple, path: str) -> None:
    if pt[0] != "bytes":
        s.add("pack.not_bytes", path, "a pack binds only to a `bytes<n>` param")
        return
    if pt[1] != pack.size:
        s.add("pack.size", path, f"pack of {pack.size} bytes bound to a `bytes<{pt[1]}>` param")
    spans = []
    for fi, f in enumerate(pack.fields):
        fp = f"{path}.pack.fields[{fi}]"
        width = f.width
        if width is None:
            if f.form == "param":
                width = param_type_bytes(st.iface[f.value]) if f.value < len(st.iface) else None
            else:
                width = NATURAL_WIDTH[f.form]
        if width is not None:
            if width == 0:
                s.add("pack.zero_width", fp, "a field has zero width")
            if f.form == "tensormap":
                if width != 128:
                    s.add("pack.tensormap_width", fp, f"a tensormap field is 128 bytes, not "
                          f"{width}")
                if f.at % 64:
                    s.add("pack.tensormap_align", fp, f"tensormap at {f.at} is not 64-byte "
                          "aligned")
            if f.at + width > pack.size:
                s.add("pack.field_outside", fp, f"field at {f.at} of {width} bytes is past the "
                      f"{pack.size} byte image")
            elif width:
                spans.append((f.at, f.at + width, fi))
        _field(s, st, f, fp)
    spans.sort()
    for (a0, a1, ai), (b0, b1, bi) in zip(spans, spans[1:]):
        if b0 < a1:
            s.add("pack.overlap", path, f"fields #{ai} and #{bi} overlap")


def _field(s: Scope, st: _OpState, f, fp: str) -> None:
    form, v = f.form, f.value
    if form == "param":
        if v >= len(st.iface):
            s.add("pack.param_range", fp, f"interface param #{v} out of range")
        elif st.iface[v][0] in ("buffer", "state") and st.iface[v][1] in ("out", "inout"):
            st.written.add(v)
    elif form == "scratch":
        if v not in st.scratch:
            s.add("pack.unknown_scratch", fp, f"unknown scratch `{v}`")
        else:
            st.scratch_used.add(v)
            st.scratch_written.add(v)
    elif form == "var":
        s.used_vars.add(v)
        if v not in s.vars:
            s.add("pack.unknown_var", fp, f"unknown var `{v}`")
    elif form == "expr":
        _value_at_max(s, v, f"{fp}.expr")
    elif form == "rank":
        s.used_groups.add(v)
        if v not in s.groups:
            s.add("pack.unknown_group", fp, f"unknown topology group `{v}`")
    elif form == "tensormap":
        _tensormap(s, st, v, f"{fp}.tensormap")


def _tensormap(s: Scope, st: _OpState, tm, path: str) -> None:
    if tm.param >= len(st.iface):
        s.add("tensormap.param_range", path, f"tensormap over interface param #{tm.param} "
              "out of range")
        return
    ip = st.iface[tm.param]
    if ip[0] not in ("buffer", "state"):
        s.add("tensormap.not_pointer", path, f"tensormap over interface param #{tm.param}, "
              "which is not a buffer or state")
        return
    if ip[1] in ("out", "inout"):
        st.written.add(tm.param)
    n = len(tm.dims)
    bad = []
    if not 1 <= n <= 5:
        bad.append("1 to 5 dims")
    else:
        strides = tm.strides or []
        if len(strides) != n - 1:
            bad.append("dims.len() - 1 strides")
        if len(tm.box) != n:
            bad.append("one box entry per dim")
        if any(d == 0 for d in tm.dims[:-1]) or (n == 1 and tm.dims[0] == 0):
            bad.append("only the outermost dim may be 0")
        if any(not 1 <= b <= 256 for b in tm.box):
            bad.append("box entries 1..=256")
        if any(x == 0 or x % 16 for x in strides):
            bad.append("strides positive multiples of 16")
        bits = TMA_DTYPE_BITS[tm.dtype]
        if (tm.dims[0] * bits) % 128:
            bad.append("dims[0] a multiple of 16 bytes")
        if tm.box and (tm.box[0] * bits) % 128:
            bad.append("box[0] a multiple of 16 bytes")
        sw = tm.swizzle or 0
        if sw not in (0, 32, 64, 128):
            bad.append("swizzle 0, 32, 64 or 128")
        elif sw and tm.box and tm.box[0] * bits > sw * 8:
            bad.append("box[0] within the swizzle span")
        if (tm.l2_promotion or 0) not in (0, 64, 128, 256):
            bad.append("l2_promotion 0, 64, 128 or 256")
    if bad:
        s.add("tensormap.malformed", path, "malformed tensormap: needs " + ", ".join(bad))
        return
    dims = tm.dims if tm.dims[-1] else tm.dims[:-1]
    bits = dims[0] * TMA_DTYPE_BITS[tm.dtype] if dims else 0
    foot = (bits + 7) // 8 + sum((d - 1) * x for d, x in zip(dims[1:], tm.strides or []))
    # kern counts the innermost extent in bits first (probed: 2^61 u8 elements overflow)
    overflow = bits > ex.U64_MAX or foot > ex.U64_MAX
    if tm.wrap and not overflow:
        s.add("tensormap.needless_wrap", path, "`wrap` on a tensormap whose strides do not "
              "overflow")
    elif overflow and not tm.wrap:
        s.add("tensormap.overflow", path, "the tensormap's strides overflow (declare `wrap` "
              "if that is the kernel's trick)")
    elif not tm.wrap and ip[0] == "buffer":
        st.footprints.setdefault(tm.param, []).append(foot)
