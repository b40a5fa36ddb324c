"""The manifest: ops, modules, buffers, states and programs from the layout and the fits.

One op per distinct launch (entry, module, block, grid, shared memory, parameter types and
folded constants): calls of the same kernel with the same constants share it. A launch's
parameters, in its ABI order:

- a pointer -> an interface pointer param (`<dir> buffer<dtype>` or `<dir> state`), the call
  passing the buffer or state at the word's offset;
- a 1/4/8-byte integer -> a literal folded into the launch (`u8`/`i32`/`i64`) when constant, an
  interface `i32`/`i64` the call passes as an expression in `rows` when it follows the tokens;
- anything else (a by-value struct) -> `bytes<N>` with a `pack`: its pointer words as fields of
  interface pointer params, each non-zero 4-byte lane as an `i32` literal or `expr` field.

A call whose launch differs by row count (compiler.builds: another block, module or entry, or a
grid/smem/scalar in two pieces) is one op with a launch per build, each guarded by `when` over
`rows`; its launches share the interface (pointers once, a scalar's param once per argument), a
field one expression serves over the program's forwards keeps that expression in every build, the
others are fitted over each build's own forwards. The splits go to `Emitter.splits` (provenance)
and one note per program and kind of split.

A GEMM is a call of the one op `gemm` (`extern:cublaslt_bf16_tn`, args x, W, C, m, n, k).
Modules are pinned by the dump's sha256 (`source` `<sha256>.cubin`). Decode runs `graph: true`
(every value of its calls is a constant: one token); prefill runs with `rows` up to the largest
prefill forward the program was built from.
"""

from __future__ import annotations

import json

import numpy as np

from compiler import builds
from compiler.buffers import Decl, Layout
from compiler.errors import CompileError, ProgramError
from compiler.exprs import ROWS, SEQS, Fitter, lanes
from compiler.externs import GEMM_ENTRY
from compiler.programs import Program
from vocab.wire import DTYPE_BYTES, EXTERN_PARAMS, SCHEMA_VERSION, pointer_type

SCALAR = {1: "u8", 4: "i32", 8: "i64"}


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _arg(e, typ: str = "i32") -> dict:
    if isinstance(e, int):
        return {typ: e}
    return {"var": e} if isinstance(e, str) else {"expr": e}


class _Whole:
    """Every field of a call that launches one way: the program's fitter decides (compiler.exprs)."""

    def __init__(self, fit: Fitter, k: int, site: str):
        self.fit, self.k, self.site = fit, k, site

    def value(self, field: str, values: list[int], lane: bool = False):
        return self.fit.value(self.k, field, values, self.site, lane)


class _Split(_Whole):
    """A field of one build of a split call (compiler.builds): what one expression serves over the
    program's forwards stays the program's (the builds share it); a field no single expression
    serves is fitted over the build's own forwards."""

    def __init__(self, fit: Fitter, part: Fitter, k: int, site: str, build: builds.Build, tokens: list[int],
                 shared: dict):
        super().__init__(fit, k, site)
        self.part, self.build, self.shared = part, build, shared     # shared: field -> the program's value
        self.tokens = np.asarray(tokens, np.int64)
        self.index = np.asarray(build.samples, np.int64)

    def value(self, field: str, values: list[int], lane: bool = False):
        launches = [s.steps[self.k].launch for s in self.fit.prog.samples]
        v_all = np.asarray(_field(launches, field), np.int64)
        if not builds.needs_pieces(self.tokens, v_all):
            if field not in self.shared:
                self.shared[field] = self.fit.value(self.k, field, v_all.tolist(), self.site, lane)
            return self.shared[field]
        return self.part.value(self.k, field, values, self.site, lane)


def _field(launches, field: str) -> list[int]:
    """A field's value in each launch, by the names compiler.exprs fits them under."""
    if field.startswith("grid_"):
        j = "xyz".index(field[-1])
        return [x.grid[j] for x in launches]
    if field == "smem":
        return [x.smem for x in launches]
    i, _, at = field[len("param"):].partition("+")
    if not at:
        return [x.params[int(i)].value for x in launches]
    at = int(at)
    return [int.from_bytes((x.params[int(i)].raw or b"")[at:at + 4].ljust(4, b"\0"), "little") for x in launches]


def _same_abi(launch: dict, earlier: list[dict], where: str) -> None:
    """The builds of one call must take the same parameter list: one interface serves them all."""
    for e in earlier:
        if e["params"] != launch["params"]:
            raise CompileError(f"{where}: its builds take different parameter lists ({len(e['params'])} and "
                               f"{len(launch['params'])} params), so one op cannot hold them")


def _words(x) -> list[tuple]:
    return sorted((w.i, w.at) for w in x.words)


class Emitter:
    def __init__(self, decls: dict[str, Decl], doc, label: str):
        self.decls, self.doc = decls, doc
        self.ops: dict[str, dict] = {}
        self.op_keys: dict[str, str] = {}
        self.modules: dict[str, dict] = {}
        self.notes: list[str] = []
        self.label = label
        self.calls_info: dict[str, list] = {}
        self.splits: dict[str, list] = {}     # program -> calls split by row range (compiler.builds)
        self.limits: tuple[int, int] | None = None   # (rows max, seqs max): a batched fit's domain

    def _where(self, lay: Layout, k: int, i: int, at: int) -> tuple[dict, str]:
        u = lay.uses[(k, i, at)]
        kind, name, off = lay.where[(k, i, at)]
        if kind == "state":
            return ({"state": name, **({"offset": off} if off else {})}, pointer_type(u.direction, "state"))
        d = self.decls[name]
        return ({"buf": name, **({"offset": off} if off else {})}, pointer_type(u.direction, d.dtype))

    def _op(self, params: list[str], launches: list[dict], hint: str) -> str:
        key = json.dumps([params, launches], sort_keys=True)
        if key not in self.op_keys:
            name = f"k{len(self.op_keys)}.{hint[:40]}"
            self.op_keys[key] = name
            self.ops[name] = {"params": params, "impl": {"launches": launches}}
        return self.op_keys[key]

    def gemm(self, prog: Program, fit: Fitter, lay: Layout, k: int) -> dict:
        st = prog.rep.steps[k]
        g = st.gemm
        args = []
        for (i, at) in (g.x, g.w, g.c):
            a, _ = self._where(lay, k, i, at)
            if "buf" not in a or self.decls[a["buf"]].dtype != "bf16":
                raise CompileError(f"{prog.name} call {k} (call site {st.launch.site}): a GEMM operand lands in "
                                   f"{a}, not a bf16 buffer")
            args.append(a)
        for what in ("m", "n", "k"):
            vals = [getattr(s.steps[k].gemm, what) for s in prog.samples]
            e = fit.value(k, f"gemm.{what}", vals, st.launch.site)
            if what != "m" and not isinstance(e, int):
                raise CompileError(f"{prog.name} call {k} (call site {st.launch.site}): the GEMM's {what} follows "
                                   f"the token count; only m (the rows) may")
            args.append(_arg(e))
        if "gemm" not in self.ops:
            self.ops["gemm"] = {"params": list(EXTERN_PARAMS[GEMM_ENTRY]), "impl": {"launches": [{"entry": GEMM_ENTRY}]}}
        return {"label": f"{k}.gemm", "op": "gemm", "args": args}

    def kernel(self, prog: Program, fit: Fitter, lay: Layout, k: int) -> dict:
        st = prog.rep.steps[k]
        x = st.launch
        where = f"{prog.name} call {k} (call site {x.site}, launch seq {x.seq})"
        if not x.sha256:
            raise CompileError(f"{where}: the capture did not resolve the launch's module, so no sha256 pins it")
        samples = [s.steps[k].launch for s in prog.samples]
        tokens = [prog.size(s) for s in prog.samples]
        try:
            parts = builds.partition(samples, tokens)
        except builds.Interleaved as exc:
            raise CompileError(f"{where}: its launch differs between forwards and {exc}; kern's launches "
                               f"split by row ranges only") from None
        iface, iargs, memo = [], [], {}

        def pointer(i: int, at: int) -> int:
            if ("ptr", i, at) not in memo:
                a, t = self._where(lay, k, i, at)
                iface.append(t)
                iargs.append(a)
                memo[("ptr", i, at)] = len(iface) - 1
            return memo[("ptr", i, at)]

        def interface(key: tuple, typ: str, arg: dict) -> int:
            # one interface param per field and argument: a later build passing the same reuses it
            if (key, typ, json.dumps(arg, sort_keys=True)) not in memo:
                iface.append(typ)
                iargs.append(arg)
                memo[(key, typ, json.dumps(arg, sort_keys=True))] = len(iface) - 1
            return memo[(key, typ, json.dumps(arg, sort_keys=True))]

        launches, shared = [], {}
        for b in parts:
            if len(parts) == 1:
                view, choose = prog, _Whole(fit, k, x.site)
            else:
                view = Program(prog.name, [prog.samples[n] for n in b.samples], batched=prog.batched,
                               kind=prog.kind)
                if _words(view.rep.steps[k].launch) != _words(x):
                    raise CompileError(f"{where}: its builds pass pointers at other parameter places (forward "
                                       f"{view.rep.forward}), so one op's interface cannot serve them")
                choose = _Split(fit, Fitter(view, self.doc, self.limits), k, x.site, b, tokens, shared)
            launch = self._launch(view, choose, k, where, pointer, interface, iface)
            if len(parts) > 1:
                launch["when"] = {"var": prog.var, "min": b.when[0], **({"max": b.when[1]} if b.when[1] is not None else {})}
                _same_abi(launch, launches, where)
                fit.notes += choose.part.notes
            launches.append(launch)
        if len(parts) > 1:
            self.splits.setdefault(prog.name, []).append(
                {"call": k, "site": x.site, "entry": x.symbol,
                 "builds": [{**b.to_json(), "forwards": [prog.samples[n].forward for n in b.samples]} for b in parts]})
        op = self._op(iface, launches, x.symbol.lstrip("_"))
        return {"label": f"{k}.{x.site[:60]}", "op": op, "args": iargs}

    def _launch(self, view: Program, choose, k: int, where: str, pointer, interface, iface: list) -> dict:
        """One kernel launch of call k over the samples of `view` (the program, or one build)."""
        x = view.rep.steps[k].launch
        lparams, largs = [], []

        def scalar(i: int, size: int, field: str, values: list[int]):
            # a one-byte param may be an empty C++ struct, whose byte is indeterminate: a lane
            e = choose.value(field, values, lane=size == 1)
            typ = SCALAR[size]
            if isinstance(e, int):
                return {typ: e if typ == "u8" else _signed(e, size * 8)}
            if typ == "u8":
                raise CompileError(f"{where}: the one-byte param #{i} follows the token count; kern passes u8 literals only")
            return {"param": interface(("param", i), typ, _arg(e, typ))}

        for p in x.params:
            vals = [s.steps[k].launch.params[p.i].value for s in view.samples]
            if p.pointer:
                lparams.append(None)
                largs.append({"param": pointer(p.i, 0)})
            elif p.size in SCALAR and p.aligned and not [w for w in x.words if w.i == p.i]:
                lparams.append(SCALAR[p.size])
                largs.append(scalar(p.i, p.size, f"param{p.i}", vals))
            else:
                lparams.append(f"bytes<{p.size}>")
                largs.append({"pack": self._pack(view, choose, k, p, pointer, where)})
        for n, t in enumerate(lparams):
            if t is None:
                lparams[n] = iface[largs[n]["param"]]
        grid = [choose.value(f"grid_{a}", [s.steps[k].launch.grid[j] for s in view.samples])
                for j, a in enumerate("xyz")]
        smem = choose.value("smem", [s.steps[k].launch.smem for s in view.samples])
        if not x.sha256:
            raise CompileError(f"{where}: the capture did not resolve the launch's module, so no sha256 pins it")
        mod = f"m.{x.sha256[:16]}"
        self.modules[mod] = {"source": f"{x.sha256}.cubin", "sha256": x.sha256}
        launch = {"module": mod, "entry": x.symbol, "block": list(x.block), "grid": grid,
                  "params": lparams, "args": largs}
        if smem:
            launch["shared_mem"] = smem
        return launch

    def _pack(self, view, choose, k, p, pointer, where) -> dict:
        if p.raw is None or len(p.raw) < p.size:
            raise CompileError(f"{where}: the dump kept only {0 if p.raw is None else len(p.raw)} of the "
                               f"{p.size} bytes of by-value param #{p.i}")
        x = view.rep.steps[k].launch
        words = [w for w in x.words if w.i == p.i]
        fields = [{"at": w.at, "param": pointer(p.i, w.at)} for w in words]
        for at in lanes(p.raw, {w.at for w in words}):
            vals = []
            for s in view.samples:
                raw = s.steps[k].launch.params[p.i].raw or b""
                vals.append(int.from_bytes(raw[at:at + 4].ljust(4, b"\0"), "little"))
            e = choose.value(f"param{p.i}+{at}", vals, lane=True)
            if isinstance(e, int):
                if e:
                    fields.append({"at": at, "i32": _signed(e, 32)})
            else:
                fields.append({"at": at, "width": 4, "expr": e})
        for at in range(len(p.raw) - len(p.raw) % 4, p.size):
            # the bytes past the last whole lane (a 2-byte fill value, a struct's short tail)
            seen = {(s.steps[k].launch.params[p.i].raw or b"").ljust(p.size, b"\0")[at] for s in view.samples}
            if len(seen) > 1:
                choose.fit.notes.append(f"{where}, param{p.i}+{at}: a by-value byte that differs between forwards "
                                        f"({len(seen)} values); forward {view.rep.forward}'s {p.raw[at]} is taken")
            if p.raw[at]:
                fields.append({"at": at, "u8": p.raw[at]})
        return {"size": p.size, "fields": fields}


ROW_FILLS = ("token", "position", "slot")     # kern fills of one element per row fed


def domains(buffers: dict, decls: dict[str, Decl], states: dict, rows_max: int, model) -> list[str]:
    """kern `domain`s onto the named inputs, from what bounds them (notes list each): the token ids
    below the config's vocabulary, positions and lengths below its max_position_embeddings, query
    offsets monotone up to the largest prefill, slots and page tables indexing the first KV state
    (every state of a program is indexed alike: one slot numbering), a page table's stride the page
    size its contents showed. Where nothing bounds one, it gets none (kern accepts that)."""
    notes, first_state = [], min(states) if states else None
    for name, b in buffers.items():
        fill, d = b.get("fill"), decls.get(name)
        dom = None
        if fill == "token" and model is not None:
            dom = {"min": 0, "max": model.vocab - 1}
        elif fill == "position" and model is not None and model.positions:
            dom = {"min": 0, "max": model.positions - 1}
        elif fill == "seq_len" and model is not None and model.positions:
            dom = {"min": 1, "max": model.positions}
        elif fill == "cu_seqlens":
            dom = {"min": 0, "max": rows_max, "monotone": True}
        elif fill in ("slot", "blocks") and first_state is not None:
            dom = {"index_into": first_state}
            if fill == "blocks":
                if d is None or not d.page:
                    notes.append(f"input {name} (blocks) showed no page size; declared without a stride")
                else:
                    dom["stride"] = d.page
        if dom is not None:
            b["domain"] = dom
    return notes


def limits(progs: list[Program]) -> tuple[int, int]:
    """(rows max, seqs max) of the manifest. rows: the largest prefill forward laid out from (1
    without prefill). seqs: the most sequences of a forward a program is laid out from: buffers
    hold the engine's offsets in that forward (compiler.buffers), so a program serves up to its
    representative's sequences and no more than the capture showed; the var's max is the largest
    over the programs."""
    pre = [p.rep.tokens for p in progs if p.kind == "prefill"]
    return max(pre, default=1), max((p.rep.seqs for p in progs), default=1)


def _own_limits(prog: Program) -> tuple[int, int]:
    """(rows, seqs) a batched program serves, the domain its open forms are compared on: up to its
    representative forward's tokens (a prefill's rows; buffers are laid out from it) and up to its
    `batch.groups` sequences (the representative's)."""
    return prog.rep.tokens, prog.rep.seqs


def manifest(progs: list[Program], layouts: dict, decls: dict[str, Decl], doc, label: str,
             model=None) -> tuple[dict, Emitter]:
    em = Emitter(decls, doc, label)
    programs, fitnotes = {}, []
    batched = any(p.batched for p in progs)
    em.limits = limits(progs)
    em.fits = []
    for prog in progs:
        em.limits = _own_limits(prog)
        fit, lay, calls = Fitter(prog, doc, em.limits), layouts[prog.name], []
        try:
            for k, st in enumerate(prog.rep.steps):
                calls.append(em.gemm(prog, fit, lay, k) if st.gemm is not None else em.kernel(prog, fit, lay, k))
        except CompileError as exc:
            if prog.batched and len(progs) > 1:
                raise ProgramError(prog.name, str(exc)) from None
            raise
        if prog.batched:
            # up to `groups` sequences per call: a decode's each one row, a prefill's packed into `rows`
            batch = {"groups": prog.rep.seqs, "rows": 1 if prog.kind == "decode" else ROWS}
            constant = not any(SEQS in json.dumps(c["args"]) or ROWS in json.dumps(c["args"]) for c in calls)
            programs[prog.name] = {"batch": batch, "calls": calls,
                                   **({"graph": True} if prog.kind == "decode" and constant else {})}
        else:
            rows = 1 if prog.name == "decode" else ROWS
            programs[prog.name] = {"batch": {"groups": 1, "rows": rows}, "calls": calls,
                                   **({"graph": True} if prog.name == "decode" else {})}
        fitnotes += fit.notes
        em.fits += fit.provenance
    em.limits = limits(progs)
    em.notes += fitnotes + builds.notes(em.splits)
    vars_ = {}
    pre = [p for p in progs if p.kind == "prefill"]
    if pre:
        vars_[ROWS] = {"max": em.limits[0], "axis": "rows"}
    if batched:
        vars_[SEQS] = {"max": em.limits[1], "axis": "groups"}
    buffers, states = {}, {}
    for d in decls.values():
        if d.kind == "state":
            states[d.name] = {"bytes": d.size}
            continue
        el = DTYPE_BYTES[d.dtype]
        whole = d.shape and d.shape[0] * d.shape[1] * el == d.size
        b = {"dtype": d.dtype, "shape": list(d.shape) if whole else [d.size // el], "kind": d.kind}
        if d.fill:
            b["fill"] = d.fill
            rows_max = vars_.get(ROWS, {}).get("max", 1)
            if d.fill in ROW_FILLS and d.kind == "input" and b["shape"] == [d.size // el] and d.size // el < rows_max:
                # the host writes one element per row fed: the capture's touched extent (the span
                # to the next word the engine used) can be shorter than the largest prefill
                em.notes.append(f"input {d.name} ({d.fill}) holds one element per row: {d.size // el} grown to "
                                f"the {rows_max} rows of the largest prefill")
                b["shape"] = [rows_max]
        if d.kind == "weight":
            b["bind"] = [{"tensor": f"capture.{d.name}"}]
        buffers[d.name] = b
    em.notes += domains(buffers, decls, states, vars_.get(ROWS, {}).get("max", 1), model)
    m = {"schema_version": SCHEMA_VERSION, "model": label, "vars": vars_, "states": states,
         "buffers": buffers, "modules": em.modules, "ops": em.ops, "programs": programs}
    return m, em
