"""Program rules: flags, batch shape, per-call typing and data flow, and unused declarations.

Contract: programs are walked in sorted order; inside one, calls and their args left to right,
so a buffer written at an earlier position may be read at a later one. "Written" starts as the
kinds that hold a value before a run (input, inout, weight, source, carry, peer). A buffer read
before any write in the same program is an error; outputs and carries must be written by some
program. The batch/protocol facts checked here are the ones kern's verifier itself enforces.
"""

from __future__ import annotations

from manifests import expr as ex
from manifests.diagnostics import key_path
from manifests.model import DTYPE_BYTES
from manifests.verify import Scope
from vocab.wire import INT_RANGES

PRE_WRITTEN = {"input", "inout", "weight", "source", "carry", "peer"}
READ_ONLY = {"input", "weight", "source", "peer"}
SCALAR_MAX = {t: INT_RANGES[t][1] for t in ("i32", "i64", "u8")}  # the integer scalars


def check(s: Scope) -> None:
    m = s.m
    if not m.programs:
        s.add("program.none", "$.programs", "no programs declared")
    written_anywhere: set[str] = set()
    called_ops: set[str] = set()
    for name in sorted(m.programs):
        _program(s, m.programs[name], key_path("$.programs", name), written_anywhere, called_ops)
    for name in sorted(m.buffers):
        if m.buffers[name].kind in ("output", "carry") and name not in written_anywhere:
            s.add("program.never_written", key_path("$.buffers", name),
                  f"{m.buffers[name].kind} buffer `{name}` is never written by any program")
    _unused(s, called_ops)


def _program(s: Scope, p, path: str, written_anywhere: set, called_ops: set) -> None:
    if p.once and p.batch is not None:
        s.add("program.once_batch", path, "`once` (run after load) and `batch` (driven per "
              "step) are exclusive")
    if p.derive and (p.once or p.batch is not None or p.graph):
        s.add("program.derive_flags", path, "`derive` (run inside weight loading) excludes "
              "`once`, `batch` and `graph`")
    if p.graph and p.batch is None:
        s.add("program.graph_without_batch", path, "`graph` (captured per call shape) needs a "
              "`batch`")
    if p.batch is not None:
        b, bp = p.batch, f"{path}.batch"
        if b.groups < 1:
            s.add("batch.zero_groups", f"{bp}.groups", "batch.groups must be >= 1")
        if isinstance(b.rows, str):
            s.used_vars.add(b.rows)
            if b.rows not in s.vars:
                s.add("batch.unknown_rows_var", f"{bp}.rows", f"batch.rows names unknown var "
                      f"`{b.rows}`")
        elif b.rows < 1:
            s.add("batch.zero_rows", f"{bp}.rows", "batch.rows must be >= 1")
        if b.context is not None:
            s.used_vars.add(b.context)
            if b.context not in s.vars:
                s.add("batch.unknown_context_var", f"{bp}.context", "batch.context names unknown "
                      f"var `{b.context}`")
    written = {n for n, buf in s.m.buffers.items() if buf.kind in PRE_WRITTEN}
    for ci, call in enumerate(p.calls):
        cp = f"{path}.calls[{ci}]"
        called_ops.add(call.op)
        op = s.m.ops.get(call.op)
        if op is None:
            s.add("call.unknown_op", f"{cp}.op", f"unknown op `{call.op}`")
            for a in call.args:
                if a.form == "buf":
                    s.used_buffers.add(a.value)
            continue
        if p.derive and s.op_nccl.get(call.op):
            s.add("call.derive_collective", f"{cp}.op", "a `derive` program runs before any group"
                  f" is joined; op `{call.op}` is a collective")
        if len(call.args) != len(op.params):
            s.add("call.arity", f"{cp}.args", f"op `{call.op}` takes {len(op.params)} params, "
                  f"got {len(call.args)} args")
            for a in call.args:
                if a.form == "buf":
                    s.used_buffers.add(a.value)
            continue
        for ai, (a, pt) in enumerate(zip(call.args, s.op_iface[call.op])):
            _arg(s, p, call.op, ai, a, pt, f"{cp}.args[{ai}]", written, written_anywhere)


def _arg(s: Scope, p, opname, pos, a, pt, path, written, written_anywhere) -> None:
    form = a.form
    if form == "buf" and pt[0] == "buffer":
        name = a.value
        s.used_buffers.add(name)
        buf = s.m.buffers.get(name)
        if buf is None:
            s.add("call.unknown_buffer", path, f"unknown buffer `{name}`")
            return
        if buf.dtype != pt[2]:
            s.add("call.dtype", path, f"buffer `{name}` has dtype {buf.dtype} but param expects "
                  f"{pt[2]}")
        size = s.buf_bytes.get(name)
        off = a.offset or 0
        if off:
            if off % DTYPE_BYTES[buf.dtype]:
                s.add("call.offset_align", f"{path}.offset", f"offset {off} is not "
                      f"{DTYPE_BYTES[buf.dtype]}-aligned for {buf.dtype}")
            if size is not None and off >= size:
                s.add("call.offset_outside", f"{path}.offset", f"offset {off} is outside buffer "
                      f"`{name}` ({size} bytes at var upper bounds)")
        reads, writes = pt[1] in ("in", "inout"), pt[1] in ("out", "inout")
        if reads and name not in written:
            s.add("call.read_before_write", path, f"buffer `{name}` is read before ever being "
                  "written")
        if size is not None:
            for foot in s.op_footprints.get(opname, {}).get(pos, []):
                if foot > size - off:
                    s.add("call.tensormap_footprint", path, f"a tensormap addresses {foot} bytes"
                          f" but buffer `{name}` has {size - off} bytes past offset {off}")
        if buf.kind == "source" and not p.derive:
            s.add("call.source_outside_derive", path, f"source buffer `{name}` is read only by "
                  "a `derive` program; it is gone after load")
        if p.derive and buf.kind in ("input", "output", "inout", "peer"):
            s.add("call.derive_io", path, f"a `derive` program runs inside weight loading, before"
                  f" {buf.kind} buffer `{name}` holds anything")
        if buf.kind == "peer" and s.op_extern.get(opname):
            s.add("call.peer_to_extern", path, f"peer buffer `{name}` passed to op `{opname}`, "
                  "which has an extern launch; runtime built-ins never receive peer memory")
        if writes:
            if buf.kind in READ_ONLY:
                s.add("call.write_read_only", path, f"op writes to read-only {buf.kind} buffer "
                      f"`{name}`")
            written.add(name)
            written_anywhere.add(name)
    elif form == "state" and pt[0] == "state":
        s.used_states.add(a.value)
        if p.derive:
            s.add("call.derive_state", path, "a `derive` program runs inside weight loading, "
                  f"before state `{a.value}` holds anything")
        if a.value not in s.states:
            s.add("call.unknown_state", path, f"unknown state `{a.value}`")
    elif form == "var" and pt[0] == "scalar":
        s.used_vars.add(a.value)
        if a.value not in s.vars:
            s.add("call.unknown_var", path, f"unknown var `{a.value}`")
        elif pt[1] == "f32":
            s.add("call.var_to_f32", path, f"var `{a.value}` cannot bind to an f32 param")
        elif s.vars[a.value].max > SCALAR_MAX[pt[1]]:
            s.add("call.var_range", path, f"var `{a.value}` max exceeds {pt[1]}")
    elif form == "expr" and pt[0] == "scalar":
        s.used_vars |= ex.var_names(a.value)
        faults = ex.check(a.value, s.vars)
        for rule, msg in faults:
            s.add(rule, f"{path}.expr", msg)
        if pt[1] == "f32":
            s.add("call.expr_to_f32", path, "an expression cannot bind to an f32 param")
        elif not faults:
            # at var maxima only; an expression that overflows there is not range-checked at
            # all by kern (probed), so neither an error nor a range violation here
            try:
                hi = ex.evaluate(a.value, s.hi)
            except ex.EvalError:
                hi = None
            if hi is not None and hi > SCALAR_MAX[pt[1]]:
                s.add("call.expr_range", path, f"expression value {hi} exceeds {pt[1]}")
    elif form in ("i32", "i64", "f32", "u8") and pt == ("scalar", form):
        pass
    elif form == "rank" and pt in (("scalar", "i32"), ("scalar", "i64")):
        s.used_groups.add(a.value)
        if a.value not in s.groups:
            s.add("call.unknown_group", path, f"unknown topology group `{a.value}`")
    else:
        if form == "buf":
            s.used_buffers.add(a.value)
        elif form == "state":
            s.used_states.add(a.value)
        elif form == "rank":
            s.used_groups.add(a.value)
        elif form == "var":
            s.used_vars.add(a.value)
        elif form == "expr":
            s.used_vars |= ex.var_names(a.value)
        s.add("call.arg_mismatch", path, f"a `{form}` arg does not match param `"
              f"{s.m.ops[opname].params[pos]}`")


def _unused(s: Scope, called_ops: set) -> None:
    m = s.m
    for name in sorted(m.buffers):
        if name not in s.used_buffers:
            s.add("unused.buffer", key_path("$.buffers", name), f"buffer `{name}` is never used "
                  "by any program")
    for name in sorted(m.ops):
        if name not in called_ops:
            s.add("unused.op", key_path("$.ops", name), f"op `{name}` is never called")
    for name in sorted(m.modules):
        if name not in s.used_modules:
            s.add("unused.module", key_path("$.modules", name), f"module `{name}` is never "
                  "launched")
    for name in sorted(s.states):
        if name not in s.used_states:
            s.add("unused.state", key_path("$.states", name), f"state `{name}` is never used by "
                  "any program")
    for name in sorted(s.vars):
        if name not in s.used_vars:
            s.add("unused.var", key_path("$.vars", name), f"var `{name}` is never used")
    for name in sorted(s.groups):
        if name not in s.used_groups:
            s.add("unused.group", key_path("$.topology.groups", name), f"topology group `{name}`"
                  " is never used (no peer buffer or rank arg names it)")
