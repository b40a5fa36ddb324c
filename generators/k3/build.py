"""Manifest assembly shared by the K3 prefill and decode generators.

`Builder` collects vars, states, buffers, ops and programs; ops are made from kernels.toml entries
(the kernel table passed in, anything with `op_launch(module, entry)` and `module_ref(module)`), so
no param list or grid is spelled here. Per-layer call lists come from Jinja templates that render to
JSON. Output is canonical (`vocab.dumps`): keys sorted at dump time, so the same inputs give the
same bytes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import jinja2

from vocab.dumps import dumps  # noqa: F401  (re-exported: the commands write with it)
from vocab.errors import MineError
from vocab.wire import EXTERN_PARAMS, SCHEMA_VERSION

from . import GENERATOR, VERSION

CLUSTERED = ("bmm_",)  # families launched as 2x1x1 clusters (kernels.toml has no cluster key)
EXTERNS = {op: (entry, list(EXTERN_PARAMS[entry])) for op, entry in (
    ("gemm", "extern:cublaslt_bf16_tn"), ("gemm_acc", "extern:cublaslt_bf16_tn_acc"),
    ("gemm_f32", "extern:cublas_bf16_tn_f32"), ("allreduce", "extern:nccl_allreduce_bf16"),
    ("allgather", "extern:nccl_allgather_f32"))}


class UnpinnedKernel(MineError, LookupError):
    """An op launches a kernel that kernels.toml does not pin."""


def _rename(expr, roles: dict):
    if isinstance(expr, str):
        return roles.get(expr, expr)
    if isinstance(expr, dict):
        return {k: [_rename(a, roles) for a in v] for k, v in expr.items()}
    return expr


@lru_cache(maxsize=None)
def _env() -> jinja2.Environment:
    root = resources.files("generators").joinpath("templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)


def render(template: str, **ctx) -> list[dict]:
    """Render one per-layer template to its call list: [{label, op, args}]."""
    text = _env().get_template(template).render(**ctx)
    calls = json.loads("[" + text.strip().rstrip(",") + "]")
    return calls


class Builder:
    def __init__(self, model: str, kernels, roles: dict):
        self.kernels = kernels
        self.roles = roles
        self.m = {"schema_version": SCHEMA_VERSION, "model": model, "vars": {}, "states": {},
                  "buffers": {}, "modules": {}, "ops": {}, "programs": {}}

    # ---- declarations -------------------------------------------------------------------------
    def var(self, name, vmax, axis=None):
        self.m["vars"][name] = {"max": vmax, **({"axis": axis} if axis else {})}

    def state(self, name, **spec):
        self.m["states"][name] = spec

    def buf(self, name, dtype, shape, kind, **extra):
        if name in self.m["buffers"]:
            raise AssertionError(f"buffer {name} declared twice")
        self.m["buffers"][name] = {"dtype": dtype, "shape": list(shape), "kind": kind, **extra}

    def ws(self, name, dtype, shape):
        self.buf(name, dtype, shape, "workspace")

    # ---- ops from the kernel table -------------------------------------------------------------
    def _launch(self, module: str, entry: str, roles: dict) -> dict:
        try:
            launch = self.kernels.op_launch(module, entry)
            ref = self.kernels.module_ref(module)
        except LookupError:
            raise UnpinnedKernel(f"kernel `{module}` (entry `{entry}`) has no kernels.toml entry; "
                                 "add its pin before generating") from None
        launch = dict(launch)
        launch["grid"] = [_rename(g, roles) for g in launch["grid"]]
        if "shared_mem" in launch:
            launch["shared_mem"] = _rename(launch["shared_mem"], roles)
        if module.startswith(CLUSTERED):
            launch["cluster"] = [2, 1, 1]
        self.m["modules"][module] = ref
        return launch

    def kernel_op(self, name, module, entry, roles=None):
        """An op that is exactly one kernel launch: its interface is the entry's params."""
        if name in self.m["ops"]:
            return name
        launch = self._launch(module, entry, {**self.roles, **(roles or {})})
        params = launch.pop("params")
        self.m["ops"][name] = {"params": params, "impl": {"launches": [launch]}}
        return name

    def multi_op(self, name, params, launches, scratch=None, roles=None):
        """An op of several launches: launches = [(module, entry, args)] with args in kern form."""
        if name in self.m["ops"]:
            return name
        out = []
        roles = {**self.roles, **(roles or {})}
        for module, entry, args in launches:
            launch = self._launch(module, entry, roles)
            launch["args"] = args
            out.append(launch)
        impl = {"launches": out}
        if scratch:
            impl["scratch"] = {k: {"dtype": d, "shape": [_rename(s, roles) for s in shp]}
                               for k, (d, shp) in scratch.items()}
        self.m["ops"][name] = {"params": params, "impl": impl}
        return name

    def extern_op(self, name):
        if name not in self.m["ops"]:
            entry, params = EXTERNS[name]
            self.m["ops"][name] = {"params": params, "impl": {"launches": [{"entry": entry}]}}
        return name

    # ---- programs -------------------------------------------------------------------------------
    def program(self, name, **flags):
        self.m["programs"].setdefault(name, {**flags, "calls": []})
        return self.m["programs"][name]["calls"]

    def finish(self) -> dict:
        for key in ("vars", "states"):
            if not self.m[key]:
                del self.m[key]
        return self.m


def stamp(model: str) -> str:
    """The model label carries the generator and its version (kern's `model` is a free label)."""
    return f"{model} ({GENERATOR} {VERSION})"
