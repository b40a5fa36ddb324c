"""Offline launch-ABI check: does every kernel launch of a manifest fit the cubin it names?

kern cross-checks a launch's parameter layout against the driver (`cuFuncGetParamInfo`) only when
it loads the module on a GPU. This module makes the same promise checkable on any machine, from the
cubin bytes alone (see `manifests.nvinfo` for what is read from them).

Contract: `check_abi(manifest, kernels_dir) -> list[Diagnostic]`, every problem collected, in the
verifier's style (stable rule id, JSON path, one sentence). Rules:

  abi.module-file    a module's local `source` is not a file under `kernels_dir`
  abi.sha256         the file's sha256 differs from the module's pin
  abi.cubin          the file is not a readable cubin
  abi.entry          the launch's entry is not a kernel of the cubin
  abi.param-count    declared params (launch `params`, else the op's) and the kernel's differ in number
  abi.param-size     a declared param's ABI size differs from the kernel's
  abi.param-offset   the kernel places a param where the declared list would not: scalars and
                     pointers sit at their natural alignment after the previous param; a `bytes<N>`
                     sits at the first address past the previous param aligned to some power of two
                     (its alignment is the kernel's business, the manifest does not state it)
  abi.tensormap      a pack's tensormap field does not land on a 64-byte aligned constant-bank address
  abi.block          the block exceeds the kernel's `__launch_bounds__`
  abi.shared-mem     static plus dynamic shared memory (at every var's max) exceeds the SM's limit

Alignment is judged on absolute constant-bank addresses (param base + offset): nvcc aligns there,
which is why a 128-aligned CUtensorMap first param sits at offset 112 on sm_90 (base 0x210) and at
128 on sm_100 (base 0x380). Not checked: extern launches; modules named by registry refs (`hf:`,
`https:`), which need a download; anything the manifest verifier already checks (unknown modules,
arity of args, expressions). The manifest is expected to have passed the verifier.

Measured against kern-llm 0.3.1 on an H200 (tests/manifests/test_abi.py's base manifest and mutations): kern
loaded the base manifest (pointers, u8/i64/f32 scalars, a bytes<40> pack, a bytes<128> tensormap
pack) and refused at load exactly the size, offset, entry and bytes<N> mutations this check
flags, comparing param sizes only; the launch-bound mutation loaded, since the driver enforces
`__launch_bounds__` only when the kernel is launched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from manifests.diagnostics import Diagnostic
from manifests.nvinfo import Cubin, CubinError, read_cubin
from vocab.expr import evaluate, from_wire
from vocab.wire import param_bytes, param_type

# Shared memory a block may hold, static + dynamic, per SM major version (bytes).
_SHARED_LIMIT = {8: 167936, 9: 233472, 10: 233472, 12: 101376}
TENSORMAP_ALIGN = 64


def param_size(ptype: str) -> int | None:
    """ABI slot size of a kern ParamType string, None when it is not one (`vocab.wire`)."""
    return param_bytes(ptype)


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _as_dict(manifest: Any) -> Mapping[str, Any]:
    if isinstance(manifest, Mapping):
        return manifest
    if hasattr(manifest, "to_json"):
        out = manifest.to_json()
        return json.loads(out) if isinstance(out, str) else out
    raise TypeError("check_abi takes a manifest dict or an object with to_json()")


def eval_expr(expr: Any, vars_max: Mapping[str, int]) -> int:
    """Value of a kern expression (JSON form) with every var at its max (the upper corner),
    by the shared evaluator without its u64 checks: the verifier has bounded it already."""
    return evaluate(from_wire(expr), vars_max, checked=False)


class _Modules:
    """Loads each module's cubin once, remembering why one could not be loaded."""

    def __init__(self, modules: Mapping[str, Any], kernels_dir: Path, out: list[Diagnostic]):
        self.modules, self.dir, self.out = modules, kernels_dir, out
        self.cache: dict[str, Cubin | None] = {}

    def get(self, name: str) -> Cubin | None:
        if name not in self.cache:
            self.cache[name] = self._load(name)
        return self.cache[name]

    def _load(self, name: str) -> Cubin | None:
        mod = self.modules.get(name)
        if not isinstance(mod, Mapping):
            return None
        source, pin, path = str(mod.get("source", "")), str(mod.get("sha256", "")), f"$.modules.{name}"
        if source.startswith(("hf:", "https:")):
            return None
        file = self.dir / source
        if not file.is_file():
            self.out.append(Diagnostic("abi.module-file", path,
                                       f"module `{name}` names `{source}`, which is not a file under {self.dir}"))
            return None
        blob = file.read_bytes()
        digest = hashlib.sha256(blob).hexdigest()
        if digest != pin.lower():
            self.out.append(Diagnostic("abi.sha256", f"{path}.sha256",
                                       f"`{source}` hashes to {digest}, not the pinned {pin}"))
        try:
            return read_cubin(blob)
        except CubinError as exc:
            self.out.append(Diagnostic("abi.cubin", path, f"`{source}`: {exc}"))
            return None


def check_layout(path: str, entry: str, declared: list[str], kernel, out: list[Diagnostic]) -> None:
    if len(declared) != len(kernel.params):
        out.append(Diagnostic("abi.param-count", f"{path}.params",
                              f"`{entry}` takes {len(kernel.params)} params but the launch declares {len(declared)}"))
        return
    base, end = kernel.cbank_offset or 0, 0
    for i, (ptype, kp) in enumerate(zip(declared, kernel.params)):
        size = param_size(ptype)
        if size is None:
            continue  # a malformed type is the verifier's to report
        if size != kp.size:
            out.append(Diagnostic("abi.param-size", f"{path}.params[{i}]",
                                  f"param #{i} `{ptype}` is {size} bytes but `{entry}` takes {kp.size} there"))
        if param_type(ptype)[0] == "bytes":
            fits = any(_align_up(base + end, 1 << k) - base == kp.offset for k in range(9))
            want = f"the first aligned address at or after {end}"
        else:
            fits = _align_up(base + end, size) - base == kp.offset
            want = str(_align_up(base + end, size) - base)
        if not fits:
            out.append(Diagnostic("abi.param-offset", f"{path}.params[{i}]",
                                  f"param #{i} `{ptype}` sits at offset {kp.offset} in `{entry}`, not at {want}"))
        end = kp.offset + kp.size


def _check_packs(path: str, launch: Mapping[str, Any], kernel, out: list[Diagnostic]) -> None:
    for i, arg in enumerate(launch.get("args") or []):
        pack = arg.get("pack") if isinstance(arg, Mapping) else None
        if not isinstance(pack, Mapping) or i >= len(kernel.params):
            continue
        for j, fld in enumerate(pack.get("fields") or []):
            if "tensormap" not in fld:
                continue
            addr = (kernel.cbank_offset or 0) + kernel.params[i].offset + int(fld.get("at", 0))
            if addr % TENSORMAP_ALIGN:
                out.append(Diagnostic("abi.tensormap", f"{path}.args[{i}].pack.fields[{j}]",
                                      f"the tensormap lands at constant-bank address {addr:#x}, "
                                      f"not {TENSORMAP_ALIGN}-byte aligned"))


def _check_geometry(path: str, launch: Mapping[str, Any], kernel, sm: int, vars_max, out) -> None:
    block = launch.get("block") or [1, 1, 1]
    if kernel.max_threads and block[0] * block[1] * block[2] > kernel.max_threads[0] * kernel.max_threads[1] * kernel.max_threads[2]:
        out.append(Diagnostic("abi.block", f"{path}.block",
                              f"block {block} exceeds `{kernel.name}`'s launch bound of {list(kernel.max_threads)}"))
    limit = _SHARED_LIMIT.get(sm // 10)
    try:
        dynamic = eval_expr(launch.get("shared_mem", 0), vars_max)
    except (KeyError, ValueError, ZeroDivisionError, AttributeError, TypeError):
        return  # a malformed expression is the verifier's to report
    if limit is not None and kernel.static_shared + dynamic > limit:
        out.append(Diagnostic("abi.shared-mem", f"{path}.shared_mem",
                              f"{kernel.static_shared} static + {dynamic} dynamic bytes of shared memory "
                              f"exceed the sm_{sm} limit of {limit}"))


def check_abi(manifest: Any, kernels_dir: str | Path) -> list[Diagnostic]:
    m = _as_dict(manifest)
    out: list[Diagnostic] = []
    modules = _Modules(m.get("modules") or {}, Path(kernels_dir), out)
    for name in sorted(m.get("modules") or {}):
        modules.get(name)  # pins are checked even for modules no launch reaches
    vars_max = {k: v.get("max", 1) for k, v in (m.get("vars") or {}).items()}
    for op_name in sorted(m.get("ops") or {}):
        op = m["ops"][op_name]
        for li, launch in enumerate((op.get("impl") or {}).get("launches") or []):
            if "module" not in launch:
                continue
            path = f"$.ops.{op_name}.impl.launches[{li}]"
            cubin = modules.get(launch["module"])
            if cubin is None:
                continue
            entry = launch.get("entry", "")
            kernel = cubin.kernels.get(entry)
            if kernel is None:
                out.append(Diagnostic("abi.entry", f"{path}.entry",
                                      f"module `{launch['module']}` has no kernel `{entry}` "
                                      f"(it has {', '.join(sorted(cubin.kernels))})"))
                continue
            declared = list(launch.get("params") or op.get("params") or [])
            check_layout(path, entry, declared, kernel, out)
            _check_packs(path, launch, kernel, out)
            _check_geometry(path, launch, kernel, cubin.sm, vars_max, out)
    return out
