"""Declaration rules: version, vars, topology, cut, states, buffers and modules.

Contract: each function appends diagnostics to the shared `Scope` and records what later groups
need (buffer byte sizes, var/group/state uses). Nothing here looks at ops or programs, except
that a peer buffer's `of` counts as a use of its target, as in kern.
"""

from __future__ import annotations

import re

from manifests import expr as ex
from manifests.diagnostics import key_path
from manifests.model import SCHEMA_VERSION, Expr
from manifests.wire import RUST_WHITESPACE
from manifests.verify import U64_MAX, Scope, shape_bytes

FLOATS = {"bf16", "f16", "f32", "fp8e4m3", "fp8e8m0"}
OUTPUT_FILLS = {"tokens", "count", "error"}
HEX64 = re.compile(r"[0-9a-fA-F]{64}")  # fullmatch: `$` would let a trailing newline through


def check(s: Scope) -> None:
    m = s.m
    if m.schema_version != SCHEMA_VERSION:
        s.add("version.unsupported", "$.schema_version",
              f"unsupported schema_version {m.schema_version} (kern reads {SCHEMA_VERSION})")
    _vars(s)
    for g, size in sorted(s.groups.items()):
        if size == 0:
            s.add("topology.zero_group", key_path("$.topology.groups", g), "size must be > 0")
    if m.cut is not None and (not m.cut.id or m.cut.stages < 2 or m.cut.stage >= m.cut.stages):
        s.add("cut.invalid", "$.cut", "a cut has at least 2 stages, a stage below their count "
              "and a non-empty id")
    for name in sorted(s.states):
        _state(s, name, s.states[name], key_path("$.states", name))
    _shards(s)
    _position_dealt_alike(s)
    for name in sorted(m.buffers):
        _buffer(s, name, m.buffers[name], key_path("$.buffers", name))
    _replicated_batch(s)
    for name in sorted(m.modules):
        _module(s, m.modules[name], key_path("$.modules", name))


def _vars(s: Scope) -> None:
    axes: dict[str, str] = {}
    for name in sorted(s.vars):
        var, path = s.vars[name], key_path("$.vars", name)
        if var.max < 1:
            s.add("var.zero_max", f"{path}.max", "max must be >= 1")
        if var.axis is not None:
            if var.axis in axes:
                s.add("var.axis_taken", f"{path}.axis",
                      f"the `{var.axis}` axis is already counted by var `{axes[var.axis]}`")
            else:
                axes[var.axis] = name


def state_kind(st) -> str:
    if st.host is not None:
        return "host"
    if st.bytes_per_token:
        return "paged"
    if st.bytes_per_seq:
        return "per-seq"
    return "owned"


def _state(s: Scope, name: str, st, path: str) -> None:
    sizes = [x for x in (st.bytes_per_token, st.bytes, st.bytes_per_seq) if x]
    if st.host is not None:
        if sizes:
            s.add("state.host_sized", path, "a host state is sized by the host; bytes_per_token,"
                  " bytes and bytes_per_seq must be absent")
        h, hp = st.host, f"{path}.host"
        if not h.shape or len(h.shape) != len(h.strides):
            s.add("state.host_layout", hp, "want as many extents as strides, at least one")
        else:
            if any(e == 0 for e in h.shape[1:]):
                s.add("state.host_open_extent", f"{hp}.shape",
                      "only the outermost extent may be 0 (the host's count)")
            if any(x == 0 for x in h.strides):
                s.add("state.host_zero_stride", f"{hp}.strides", "a zero stride aliases elements")
            from manifests.model import DTYPE_BYTES
            span = sum((max(e, 1) - 1) * st_ for e, st_ in zip(h.shape, h.strides)) + 1
            if span * DTYPE_BYTES[h.dtype] > U64_MAX:
                s.add("state.host_overflow", hp, "the layout's byte span overflows u64")
    elif not sizes:
        s.add("state.unsized", path,
              "one of bytes_per_token / bytes / bytes_per_seq / host must be set")
    elif len(sizes) > 1:
        s.add("state.sizes_exclusive", path, "bytes_per_token, bytes and bytes_per_seq are "
              "exclusive")


def _shards(s: Scope) -> None:
    position_group = None
    for name in sorted(s.states):
        st = s.states[name]
        if st.shard is None:
            continue
        path = key_path("$.states", name) + ".shard"
        g = st.shard.group
        s.used_groups.add(g)
        if g not in s.groups:
            s.add("state.shard_group", f"{path}.group", f"unknown topology group `{g}`")
        kind = state_kind(st)
        if st.shard.by == "position":
            if kind != "paged":
                s.add("state.shard_position_kind", path,
                      f"`by: position` deals a paged state, got a {kind} one")
            if position_group is None:
                position_group = g
            elif g != position_group:
                s.add("state.shard_groups_differ", f"{path}.group",
                      f"shards deal positions over `{position_group}` and `{g}`; one group "
                      "deals them all")
        else:
            if kind != "per-seq":
                s.add("state.shard_heads_kind", path,
                      f"`by: heads` splits a per-sequence state, got a {kind} one")
            zero = [i for i, (r, wd) in enumerate(st.shard.segments or []) if not r or not wd]
            for i in zero:
                s.add("state.shard_zero_segment", f"{path}.segments[{i}]",
                      "a segment has neither 0 rows nor 0 bytes")
            if not st.shard.segments:
                s.add("state.shard_no_segments", f"{path}.segments",
                      "`by: heads` needs at least one segment")
            elif g in s.groups and kind == "per-seq":
                w = s.groups[g]
                total = sum(r * wd for r, wd in st.shard.segments)
                if w and (any(wd % w for _, wd in st.shard.segments)
                          or total != w * st.bytes_per_seq):
                    s.add("state.shard_segments", f"{path}.segments",
                          "every width must be a multiple of the group size and rows times "
                          "widths must sum to the group size times bytes_per_seq")


def _position_dealt_alike(s: Scope) -> None:
    """Paged states share one page id space: once one is dealt by position, all must be."""
    dealt = [n for n in sorted(s.states) if state_kind(s.states[n]) == "paged"
             and s.states[n].shard is not None and s.states[n].shard.by == "position"]
    if not dealt:
        return
    for name in sorted(s.states):
        st = s.states[name]
        if state_kind(st) == "paged" and (st.shard is None or st.shard.by != "position"):
            s.add("state.shard_position_mixed", key_path("$.states", name),
                  f"not dealt by position, but `{dealt[0]}` is; the paged states share one "
                  "page id space, so every one is dealt the same way")


def _bound_ok(s: Scope, b, path: str, dtype: str) -> bool:
    if isinstance(b, float):
        if dtype not in FLOATS:
            s.add("domain.float_bound", path, f"float bound on a {dtype} buffer")
            return False
        return True
    if isinstance(b, (str, Expr)):
        s.used_vars |= ex.var_names(b)
        faults = ex.check(b, s.vars)
        for rule, msg in faults:
            s.add(rule, path, msg)
        return not faults
    return True


def _bound_value(b, env):
    """A bound at one var corner as kern compares it, an f64 (probed: 2^53 + 1 is not above
    2^53); None when the expression overflows there, which skips the comparison, as in kern."""
    if isinstance(b, (str, Expr)):
        try:
            b = ex.evaluate(b, env)
        except ex.EvalError:
            return None
    return float(b)


def _show(x: float) -> str:
    return str(int(x)) if x.is_integer() else str(x)


def _domain(s: Scope, name: str, buf, path: str) -> None:
    d, dp = buf.domain, f"{path}.domain"
    if d.index_into is not None and (d.min is not None or d.max is not None):
        s.add("domain.exclusive", dp, "`index_into` and `min`/`max` are mutually exclusive")
    if d.index_into is None and d.min is None and d.max is None and not d.monotone:
        s.add("domain.empty", dp, "empty (declare bounds, `index_into`, or `monotone`)")
    if d.stride is not None:
        if d.stride == 0:
            s.add("domain.zero_stride", f"{dp}.stride", "`stride` must be > 0")
        elif d.stride > 1 and d.index_into is None:
            s.add("domain.stride_without_index", f"{dp}.stride",
                  "`stride` only applies with `index_into`")
    if d.index_into is not None:
        t = d.index_into
        if buf.dtype in FLOATS:
            s.add("domain.float_index", dp, f"a {buf.dtype} buffer cannot index anything")
        in_b, in_s = t in s.m.buffers, t in s.states
        if in_b and in_s:
            s.add("domain.index_ambiguous", f"{dp}.index_into", f"`{t}` is both a buffer and a "
                  "state")
        elif not in_b and not in_s:
            s.add("domain.index_unknown", f"{dp}.index_into", f"unknown buffer/state `{t}`")
        elif in_s:
            st = s.states[t]
            stride = d.stride if d.stride is not None else 1
            if state_kind(st) == "per-seq" and stride and st.bytes_per_seq % stride:
                s.add("domain.line_stride", f"{dp}.stride", f"lines of {stride} bytes do not "
                      f"divide the state's {st.bytes_per_seq} bytes per sequence")
        elif t == name:
            s.add("domain.self_index", f"{dp}.index_into", "a buffer cannot index itself")
    if d.monotone and len(buf.shape) != 1:
        s.add("domain.monotone_rank", f"{dp}.monotone", "`monotone` requires a one-dimensional "
              "buffer")
    ok_min = d.min is not None and _bound_ok(s, d.min, f"{dp}.min", buf.dtype)
    ok_max = d.max is not None and _bound_ok(s, d.max, f"{dp}.max", buf.dtype)
    if ok_min and ok_max:
        for env in (s.lo, s.hi):
            a, b = _bound_value(d.min, env), _bound_value(d.max, env)
            if a is not None and b is not None and a > b:
                s.add("domain.min_above_max", dp, f"min {_show(a)} > max {_show(b)}")
                break


def _buffer(s: Scope, name: str, buf, path: str) -> None:
    size = shape_bytes(s, buf.dtype, buf.shape, path, "buffer")
    if size is not None:
        s.buf_bytes[name] = size
    if buf.domain is not None:
        _domain(s, name, buf, path)
    if buf.fill is not None:
        want = "output" if buf.fill in OUTPUT_FILLS else "input"
        if buf.kind != want:
            s.add("buffer.fill_kind", f"{path}.fill", f"fill `{buf.fill}` sits on an {want} "
                  f"buffer, not a {buf.kind} one")
        if buf.dtype not in ("i32", "i64"):
            s.add("buffer.fill_dtype", f"{path}.fill",
                  f"fill `{buf.fill}` needs an i32 or i64 buffer, not {buf.dtype}")
    if buf.placement == "host":
        if buf.kind != "weight" or buf.export:
            s.add("buffer.host_placement", f"{path}.placement",
                  "host placement requires a non-exported immutable weight")
        if any(_ranked(seg) for seg in buf.bind or []):
            s.add("buffer.host_ranked_bind", f"{path}.bind",
                  "shared host weights cannot select tensors, rows or columns by rank")
    if buf.kind == "source" and buf.export:
        s.add("buffer.source_export", f"{path}.export", "a source buffer cannot be exported")
    _bind(s, buf, path)
    if buf.kind == "peer":
        _peer(s, name, buf, path)
    else:
        if buf.of is not None:
            s.add("buffer.of_not_peer", f"{path}.of", "`of` only applies to peer buffers")
        if buf.group is not None:
            s.add("buffer.group_not_peer", f"{path}.group", "`group` only applies to peer buffers")


def _ranked(seg) -> bool:
    il = seg.interleave
    return any(isinstance(x, dict) for x in (seg.tensor, seg.rows, seg.cols,
                                             il.with_ if il else None))


def _bind(s: Scope, buf, path: str) -> None:
    segs = buf.bind or []
    if buf.kind in ("weight", "source"):
        if not segs:
            s.add("bind.missing", path, f"a {buf.kind} buffer binds at least one checkpoint "
                  "tensor (`bind`)")
    elif segs:
        s.add("bind.not_weight", f"{path}.bind", "`bind` names checkpoint tensors for a weight "
              f"or a source, not a {buf.kind} buffer")
        return
    for i, seg in enumerate(segs):
        for rule, sub, msg in _tensor_source(s, seg.tensor):
            s.add(rule, f"{path}.bind[{i}].tensor{sub}", msg)
        if seg.interleave is None and seg.rows is None and seg.cols is None:
            continue  # a whole tensor, the common case: nothing more to check
        sp = f"{path}.bind[{i}]"
        if seg.interleave is not None:
            for rule, sub, msg in _tensor_source(s, seg.interleave.with_):
                s.add(rule, f"{sp}.interleave.with{sub}", msg)
            if seg.interleave.rows == 0:
                s.add("bind.interleave_rows", f"{sp}.interleave.rows", "rows must be > 0")
            if seg.rows is not None or seg.cols is not None:
                s.add("bind.interleave_range", sp, "an interleaved segment takes both tensors "
                      "whole, not a range")
        for axis in ("rows", "cols"):
            r = getattr(seg, axis)
            if r is None:
                continue
            rp = f"{sp}.{axis}"
            pairs = [r]
            if isinstance(r, dict):
                pairs = r["ranges"]
                _group_count(s, r["group"], len(pairs), rp, "ranges")
            for a, b in pairs:
                if a >= b:
                    s.add("bind.empty_range", rp, f"range starts at {a} but ends at {b}")


def _group_count(s: Scope, g: str, n: int, path: str, what: str) -> None:
    s.used_groups.add(g)
    if g not in s.groups:
        s.add("bind.unknown_group", f"{path}.group", f"unknown topology group `{g}`")
    elif s.groups[g] != n:
        s.add("bind.rank_count", path, f"group `{g}` needs {s.groups[g]} {what}, got {n}")


def _tensor_source(s: Scope, src) -> list[tuple[str, str, str]]:
    """A segment's tensor names: (rule, path below the source, sentence) per fault. Returned,
    not added, so the common faultless case never formats a path."""
    if type(src) is str:
        return [] if src else [("bind.empty_tensor", "", "empty tensor name")]
    names, g = src["tensors"], src["group"]
    s.used_groups.add(g)
    out = []
    if g not in s.groups:
        out.append(("bind.unknown_group", ".group", f"unknown topology group `{g}`"))
    elif s.groups[g] != len(names):
        out.append(("bind.rank_count", "", f"group `{g}` needs {s.groups[g]} tensor names, "
                    f"got {len(names)}"))
    if "" in names:
        out.append(("bind.empty_tensor", "", "empty tensor name"))
    return out


def _peer(s: Scope, name: str, buf, path: str) -> None:
    if buf.export:
        s.add("peer.exported", f"{path}.export", "a peer buffer cannot itself be exported")
    if buf.dtype != "u64":
        s.add("peer.dtype", f"{path}.dtype", "a peer buffer holds u64 addresses")
    if buf.domain is not None:
        s.add("peer.domain", f"{path}.domain", "a peer buffer has no domain")
    t = buf.of
    if t is None:
        s.add("peer.no_of", path, "a peer buffer must name the exported buffer or state it "
              "holds addresses `of`")
    elif t == name:
        s.add("peer.self", f"{path}.of", "a peer buffer cannot be `of` itself")
    else:
        in_b, in_s = t in s.m.buffers, t in s.states
        if in_b:
            s.used_buffers.add(t)
        if in_s:
            s.used_states.add(t)
        if in_b and in_s:
            s.add("peer.of_ambiguous", f"{path}.of", f"`{t}` is both a buffer and a state")
        elif not in_b and not in_s:
            s.add("peer.of_unknown", f"{path}.of", f"unknown buffer/state `{t}`")
        elif in_b:
            target = s.m.buffers[t]
            if target.kind == "peer":
                s.add("peer.of_peer", f"{path}.of", f"`{t}` is itself a peer buffer")
            elif not target.export:
                s.add("peer.of_not_exported", f"{path}.of", f"buffer `{t}` is not exported")
        elif s.states[t].host is not None:
            s.add("peer.of_host_state", f"{path}.of",
                  f"state `{t}` is the host's; only runtime memory is exported")
    g = buf.group
    if g is None:
        s.add("peer.no_group", path, "a peer buffer must name the topology `group` its "
              "addresses are indexed by")
        return
    s.used_groups.add(g)
    if not s.groups:
        s.add("peer.no_topology", f"{path}.group", f"group `{g}` but the manifest declares no "
              "topology")
    elif g not in s.groups:
        s.add("peer.unknown_group", f"{path}.group", f"unknown topology group `{g}`")
    elif buf.shape != [s.groups[g]]:
        s.add("peer.shape", f"{path}.shape", f"a peer buffer over group `{g}` has shape "
              f"[{s.groups[g]}]")


def _module(s: Scope, mod, path: str) -> None:
    if not HEX64.fullmatch(mod.sha256):
        s.add("module.sha256", f"{path}.sha256", "sha256 is not 64 hex chars")
    src = mod.source
    if not src:
        s.add("module.empty_source", f"{path}.source", "empty source")
    elif "://" in src and not src.startswith("https://"):
        s.add("module.bad_scheme", f"{path}.source", "only https:// and hf: sources are fetched")
    elif src.startswith("hf:") and not _hf_ok(src[3:]):
        s.add("module.bad_ref", f"{path}.source",
              f"invalid registry ref `{src}`: expected hf:<org>/<repo>/<path>[@revision]")
    elif src.startswith("https://") and not _https_ok(src[8:]):
        s.add("module.bad_ref", f"{path}.source",
              f"invalid registry ref `{src}`: expected https://<host>/<path>")


def _hf_ok(ref: str) -> bool:
    if "@" in ref:
        ref, rev = ref.rsplit("@", 1)
        if not rev or "/" in rev:
            return False
    parts = ref.split("/", 2)
    if len(parts) != 3 or not all(parts):
        return False
    return all(seg not in ("", ".", "..") for seg in parts[2].split("/"))


def _https_ok(rest: str) -> bool:
    """kern's https grammar, probed: a host, a path, and no (Unicode) whitespace anywhere; an hf:
    ref, by contrast, may hold whitespace."""
    host, _, path = rest.partition("/")
    return bool(host) and bool(path) and not any(c in RUST_WHITESPACE for c in rest)


def _replicated_batch(s: Scope) -> None:
    """A state dealt by position makes its group run one replicated batch: no per-rank rows."""
    dealt = sorted(n for n, st in s.states.items() if st.shard and st.shard.by == "position")
    if not dealt:
        return
    for name in sorted(s.vars):
        if s.vars[name].axis == "ranks":
            s.add("var.ranks_replicated", key_path("$.vars", name) + ".axis",
                  f"`axis: ranks` counts every member's rows, but state `{dealt[0]}` deals "
                  "positions over its group, so every member takes the same rows")
    for name in sorted(s.m.buffers):
        if s.m.buffers[name].fill == "blocks":
            s.add("buffer.blocks_replicated", key_path("$.buffers", name) + ".fill",
                  f"fill `blocks` splits the batch into members' blocks, but state "
                  f"`{dealt[0]}` deals positions over its group (one replicated batch)")
