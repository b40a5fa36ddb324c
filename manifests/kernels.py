"""kernels.toml: the one place a kernel module's pin, provenance and launch ABI are written down.

Generators ask this table for launches instead of spelling params, blocks and grids themselves, so
a kernel's ABI is stated once and checked once (against its cubin, by `check_table`). The format is
documented in docs/kernels-toml.md.

Contract:
  load_kernels(path) -> KernelTable   strict: unknown keys, a malformed sha256/arch/param type/expr,
                                      a variant name that disagrees with its defines, a module with
                                      both or neither of source/prebuilt (neither is allowed only
                                      with `upstream`) all raise KernelsTomlError listing every
                                      problem found.
  table.op_launch(module, entry)      a manifest kernel launch skeleton; MissingKernel (LookupError)
                                      names what is absent.
  table.module_ref(module)            the manifest `modules` value {source, sha256}.
  table.cubin_path(module, build_dir) where that module's cubin is expected, or None.
  check_table(table, build_dir)       pins against files: sources and prebuilt cubins exist, cubins hash
                                      to their pins, are built for their arch, hold every entry with
                                      a matching param layout; every module a manifest under
                                      manifests/ names is pinned. Returns Diagnostics (rule `kernels.*`).
  build_table(table, out_dir)         compiles the source modules with the nvcc on PATH and reports
                                      each hash against its pin (nvcc 13 output is byte-stable);
                                      `build_module` does one module (`find_nvcc` finds nvcc).
Loading touches no file but kernels.toml itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocab.errors import MineError
from vocab.expr import ExprError, constants_positive, from_wire
from vocab.wire import is_canonical_param_type

SHA256 = re.compile(r"^[0-9a-f]{64}$")
ARCH = re.compile(r"^sm_[0-9]{2,3}[af]?$")
DEFINE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODULE_KEYS = {"sha256", "arch", "source", "defines", "prebuilt", "upstream", "entries"}
UPSTREAM_KEYS = {"project", "version", "where", "note"}
ENTRY_KEYS = {"params", "block", "grid", "shared_mem"}


class KernelsTomlError(MineError, ValueError):
    """kernels.toml is malformed; the message lists every problem."""


class MissingKernel(MineError, LookupError):
    """A generator asked for a module or entry that kernels.toml does not pin."""


@dataclass(frozen=True)
class Entry:
    params: list[str]
    block: list[int]
    grid: list[Any]
    shared_mem: Any = 0


@dataclass
class Module:
    name: str
    sha256: str
    arch: str
    source: str | None = None
    prebuilt: str | None = None
    defines: dict[str, str] = field(default_factory=dict)
    upstream: dict[str, str] | None = None
    entries: dict[str, Entry] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.name.split("+", 1)[0]


def variant_name(family: str, defines: dict[str, Any]) -> str:
    """The canonical module name: family plus `+KEY=VALUE` for each define, keys sorted."""
    return family + "".join(f"+{k}={defines[k]}" for k in sorted(defines))


def parse_variant(name: str) -> tuple[str, dict[str, str]]:
    family, *parts = name.split("+")
    defines = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not DEFINE_KEY.match(key) or not value:
            raise ValueError(f"`{part}` is not KEY=VALUE")
        defines[key] = value
    return family, defines


def _expr_ok(e: Any) -> bool:
    """A kern expression in the shared JSON form (`vocab.expr.from_wire`) whose `ceil_div` and
    `mul` constants are positive: a zero there is a verifier error in every manifest it reaches."""
    try:
        return constants_positive(from_wire(e))
    except ExprError:
        return False


def _entry(where: str, raw: Any, bad: list[str]) -> Entry | None:
    if not isinstance(raw, dict):
        bad.append(f"{where}: must be a table")
        return None
    for key in sorted(set(raw) - ENTRY_KEYS):
        bad.append(f"{where}: unknown key `{key}`")
    params, block, grid = raw.get("params"), raw.get("block"), raw.get("grid")
    if not isinstance(params, list) or not all(isinstance(p, str) and is_canonical_param_type(p.strip()) for p in params):
        bad.append(f"{where}.params: must be a list of kern param types, got {params!r}")
        params = []  # reported above; the entry is kept only for the other checks' messages
    if not (isinstance(block, list) and len(block) == 3 and all(type(b) is int and b > 0 for b in block)
            and block[0] * block[1] * block[2] <= 1024):
        bad.append(f"{where}.block: must be three positive integers with at most 1024 threads, got {block!r}")
    if not (isinstance(grid, list) and len(grid) == 3 and all(_expr_ok(g) for g in grid)):
        bad.append(f"{where}.grid: must be three kern expressions, got {grid!r}")
    shared = raw.get("shared_mem", 0)
    if not _expr_ok(shared):
        bad.append(f"{where}.shared_mem: must be a kern expression, got {shared!r}")
    return Entry([p.strip() for p in params], block, grid, shared)


def _module(name: str, raw: Any, bad: list[str]) -> Module | None:
    where = f"modules.\"{name}\""
    if not isinstance(raw, dict):
        bad.append(f"{where}: must be a table")
        return None
    for key in sorted(set(raw) - MODULE_KEYS):
        bad.append(f"{where}: unknown key `{key}`")
    sha, arch = raw.get("sha256"), raw.get("arch")
    if not (isinstance(sha, str) and SHA256.match(sha)):
        bad.append(f"{where}.sha256: must be 64 lowercase hex digits, got {sha!r}")
    if not (isinstance(arch, str) and ARCH.match(arch)):
        bad.append(f"{where}.arch: must look like sm_90a, got {arch!r}")
    source, prebuilt, upstream = raw.get("source"), raw.get("prebuilt"), raw.get("upstream")
    if source is not None and prebuilt is not None:
        bad.append(f"{where}: `source` and `prebuilt` are exclusive")
    elif source is None and prebuilt is None and upstream is None:
        bad.append(f"{where}: needs `source`, `prebuilt`, or at least `upstream` provenance")
    for key, value in (("source", source), ("prebuilt", prebuilt)):
        if value is not None and (not isinstance(value, str) or not value or Path(value).is_absolute()):
            bad.append(f"{where}.{key}: must be a path relative to the repository, got {value!r}")
    if source is not None and upstream is not None:
        bad.append(f"{where}: `upstream` describes a prebuilt cubin, not one built from `source`")
    if upstream is not None:
        if not isinstance(upstream, dict):
            bad.append(f"{where}.upstream: must be a table")
            upstream = None
        else:
            for key in sorted(set(upstream) - UPSTREAM_KEYS):
                bad.append(f"{where}.upstream: unknown key `{key}`")
            for key in ("project", "version", "where"):
                if not isinstance(upstream.get(key), str) or not upstream.get(key):
                    bad.append(f"{where}.upstream.{key}: required text")
    try:
        family, named = parse_variant(name)
    except ValueError as exc:
        bad.append(f"{where}: the variant name is family plus +KEY=VALUE parts; {exc}")
        family, named = name, {}
    defines = raw.get("defines")
    if defines is None:
        if source is not None and named:
            bad.append(f"{where}: the name carries defines but `defines` is missing")
        defines = named
    elif not isinstance(defines, dict) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                  for v in defines.values()):
        bad.append(f"{where}.defines: must be a table of strings or integers")
        defines = named
    else:
        defines = {str(k): str(v) for k, v in defines.items()}
        if variant_name(family, defines) != name:
            bad.append(f"{where}: the defines make the name `{variant_name(family, defines)}`")
    entries = {}
    raw_entries = raw.get("entries", {})
    if not isinstance(raw_entries, dict):
        bad.append(f"{where}.entries: must be a table")
        raw_entries = {}
    for sym in sorted(raw_entries):
        e = _entry(f"{where}.entries.{sym}", raw_entries[sym], bad)
        if e is not None:
            entries[sym] = e
    return Module(name, sha or "", arch or "", source, prebuilt, defines, upstream, entries)


@dataclass
class KernelTable:
    root: Path
    modules: dict[str, Module]

    def module(self, name: str) -> Module:
        if name not in self.modules:
            raise MissingKernel(f"kernels.toml pins no module `{name}`")
        return self.modules[name]

    def by_sha256(self, sha: str) -> Module | None:
        return next((m for m in self.modules.values() if m.sha256 == sha.lower()), None)

    def op_launch(self, module: str, entry: str) -> dict[str, Any]:
        mod = self.module(module)
        if entry not in mod.entries:
            raise MissingKernel(f"kernels.toml module `{module}` declares no entry `{entry}`")
        e = mod.entries[entry]
        launch = {"module": module, "entry": entry, "block": list(e.block), "grid": list(e.grid),
                  "params": list(e.params)}
        if e.shared_mem != 0:
            launch["shared_mem"] = e.shared_mem
        return launch

    def module_ref(self, module: str) -> dict[str, str]:
        mod = self.module(module)
        label = Path(mod.prebuilt).name if mod.prebuilt else f"{mod.name}.cubin"
        return {"source": label, "sha256": mod.sha256}

    def cubin_path(self, module: str, build_dir: Path | None = None) -> Path | None:
        mod = self.module(module)
        if mod.prebuilt:
            return self.root / mod.prebuilt
        if mod.source and build_dir is not None:
            return Path(build_dir) / f"{mod.name}.cubin"
        return None


def load_kernels(path: str | Path) -> KernelTable:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise KernelsTomlError(f"{path}: no such kernels.toml") from None
    except IsADirectoryError:
        raise KernelsTomlError(f"{path} is a folder, not a kernels.toml") from None
    except UnicodeDecodeError:
        raise KernelsTomlError(f"{path} is not UTF-8 text, not a kernels.toml") from None
    except OSError as exc:
        raise KernelsTomlError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise KernelsTomlError(f"{path} is not valid TOML ({exc})") from None
    bad: list[str] = []
    for key in sorted(set(doc) - {"modules"}):
        bad.append(f"unknown top-level key `{key}`")
    raw_modules = doc.get("modules", {})
    modules = {}
    if not isinstance(raw_modules, dict):
        bad.append("`modules` must be a table")
        raw_modules = {}
    for name in sorted(raw_modules):
        mod = _module(name, raw_modules[name], bad)
        if mod is not None:
            modules[name] = mod
    seen: dict[str, str] = {}
    for mod in modules.values():
        if mod.sha256 and mod.sha256 in seen:
            bad.append(f"modules.\"{mod.name}\": same sha256 as `{seen[mod.sha256]}`")
        seen.setdefault(mod.sha256, mod.name)
    if bad:
        raise KernelsTomlError(f"{path}: {len(bad)} problem(s): " + "; ".join(bad))
    return KernelTable(path.parent, modules)


class NvccMissing(MineError, OSError):
    """`mine kernels build` needs nvcc on PATH."""


def _cubin_problems(table: KernelTable, mod: Module, cubin: Path, out: list) -> None:
    from manifests.abi import Diagnostic, check_layout
    from manifests.nvinfo import CubinError, read_cubin

    where = f"modules.\"{mod.name}\""
    blob = cubin.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != mod.sha256:
        out.append(Diagnostic("kernels.sha256", f"{where}.sha256", f"`{cubin.name}` hashes to {digest}, not the pin"))
    try:
        parsed = read_cubin(blob)
    except CubinError as exc:
        out.append(Diagnostic("kernels.cubin", where, f"`{cubin.name}`: {exc}"))
        return
    if f"sm_{parsed.sm}" != mod.arch.rstrip("af"):
        out.append(Diagnostic("kernels.arch", f"{where}.arch", f"`{cubin.name}` is built for sm_{parsed.sm}, not {mod.arch}"))
    for sym, entry in mod.entries.items():
        kernel = parsed.kernels.get(sym)
        if kernel is None:
            out.append(Diagnostic("kernels.entry", f"{where}.entries.{sym}", f"`{cubin.name}` has no kernel `{sym}`"))
        else:
            check_layout(f"{where}.entries.{sym}", sym, entry.params, kernel, out)


def _manifest_pins(root: Path) -> dict[str, list[str]]:
    """sha256 -> manifests (relative paths) naming a module with it, over manifests/**/*.json."""
    pins: dict[str, list[str]] = {}
    for path in sorted((root / "manifests").glob("**/*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not every JSON file there need be a manifest; the verifier judges manifests
        modules = doc.get("modules") if isinstance(doc, dict) else None
        for mod in (modules or {}).values() if isinstance(modules, dict) else []:
            if isinstance(mod, dict) and isinstance(mod.get("sha256"), str):
                pins.setdefault(mod["sha256"].lower(), []).append(str(path.relative_to(root)))
    return pins


def check_table(table: KernelTable, build_dir: str | Path | None = None) -> list:
    from manifests.abi import Diagnostic

    out: list = []
    for mod in table.modules.values():
        where = f"modules.\"{mod.name}\""
        if mod.source and not (table.root / mod.source).is_file():
            out.append(Diagnostic("kernels.file", f"{where}.source", f"`{mod.source}` does not exist"))
        cubin = table.cubin_path(mod.name, Path(build_dir) if build_dir else None)
        if cubin is None:
            continue
        if not cubin.is_file():
            key = "prebuilt" if mod.prebuilt else "source"
            out.append(Diagnostic("kernels.file", f"{where}.{key}", f"cubin `{cubin.name}` is not at {cubin.parent}"))
            continue
        _cubin_problems(table, mod, cubin, out)
    for sha, users in sorted(_manifest_pins(table.root).items()):
        if table.by_sha256(sha) is None:
            out.append(Diagnostic("kernels.unpinned", users[0],
                                  f"module sha256 {sha} is not pinned in kernels.toml (named by {len(users)} manifest(s))"))
    return out


@dataclass(frozen=True)
class Built:
    module: str
    path: Path
    sha256: str
    matches: bool


def nvcc_command(table: KernelTable, mod: Module, out: Path, nvcc: str = "nvcc") -> list[str]:
    defines = [f"-D{k}={v}" for k, v in sorted(mod.defines.items())]
    return [nvcc, "-cubin", f"-arch={mod.arch}", *defines, "-o", str(out), str(table.root / mod.source)]


def find_nvcc(nvcc: str = "nvcc") -> str:
    """The nvcc executable on PATH; NvccMissing (one sentence) when there is none."""
    exe = shutil.which(nvcc)
    if exe is None:
        raise NvccMissing(f"`{nvcc}` is not on PATH; install the CUDA toolkit to build kernels")
    return exe


def build_module(table: KernelTable, name: str, target: str | Path, nvcc: str) -> Built:
    """Compile the `source` module `name` into `target` with the nvcc at `nvcc` (`find_nvcc`) and
    hash the cubin against its pin. A failing nvcc is an OSError naming the module."""
    mod = table.module(name)
    target = Path(target)
    proc = subprocess.run(nvcc_command(table, mod, target, nvcc), capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"nvcc failed on module `{mod.name}`: {proc.stderr.strip().splitlines()[-1:]}")
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    return Built(mod.name, target, digest, digest == mod.sha256)


def build_table(table: KernelTable, out_dir: str | Path, nvcc: str = "nvcc") -> list[Built]:
    exe = find_nvcc(nvcc)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [build_module(table, mod.name, out_dir / f"{mod.name}.cubin", exe)
            for mod in table.modules.values() if mod.source]
