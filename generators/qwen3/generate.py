"""`generate_qwen3`: a vLLM Qwen3 capture to a verified kern manifest, its kernels and bindings.

The library function under `mine gen qwen3` (the command only checks its output folder first and
prints `Qwen3Result.lines()`). Steps: the dump is read with `mining.load` and its analysis taken
from `analysis` (`mine analyze --json`) or computed; `mined.mine` checks the capture against the
config; `build.generate` writes the manifest, which is verified with `manifests.verify` (a
rejection is `RejectedManifest`: a generator bug, one sentence). Then, into the output folder:
qwen3.json, qwen3-bindings.safetensors (rope cos/sin, kv scale) and kernels/ (the dumped vLLM
cubins by sha256; this repository's own kernels built with nvcc, `manifests.kernels.build_module`,
and their hash checked against the kernels.toml pin), and last the offline ABI check over
kernels/ (a finding is `RejectedManifest`; a cubin that could not be had is left to a note).

`out` is a folder object (`generators.folder`) or a plain path. Bad input is a `MineError`
(`check_inputs` names the option the command line gives it with).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from vocab.errors import RejectedManifest, UsageError

ROOT = Path(__file__).resolve().parents[2]
KERNELS_TOML = ROOT / "kernels.toml"
# this repository's own kernels the manifest launches: role -> (kernels.toml module, entry)
OWN = {"embed": ("mine_embed", "mine_embed_rows"), "argmax": ("mine_argmax", "mine_argmax_rows")}


@dataclass
class Qwen3Result:
    """What one generation wrote and found."""

    path: Path                # the manifest file written
    manifest: dict
    mined: object             # generators.qwen3.mined.Mined
    abi_complete: bool        # every module's cubin was there, so the ABI check saw every launch
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The command's report: one summary line, then one `note:` line per note."""
        m, mm = self.manifest, self.mined
        head = (f"{self.path}: {len(mm.forwards)} forwards mined ({mm.skipped} partial left out), "
                f"{len(m['programs']['prefill']['calls'])} prefill / {len(m['programs']['decode']['calls'])} decode "
                f"calls; verified; ABI {'checked' if self.abi_complete else 'checked where cubins exist'}")
        return [head] + [f"note: {n}" for n in self.notes]


def check_inputs(dump: Path, config: Path, analysis: Optional[Path] = None, weights: Optional[Path] = None,
                 chunk: int = 2048, max_seqs: int = 1) -> list[Path]:
    """Refuse inputs that cannot serve before any work; the checkpoint's .safetensors files."""
    if chunk < 1:
        raise UsageError(f"--chunk must be at least 1, got {chunk}", value=chunk, limit=1)
    if not 1 <= max_seqs <= chunk:
        raise UsageError(f"--max-seqs must be between 1 and --chunk ({chunk}), got {max_seqs}", value=max_seqs, limit=chunk)
    for flag, given in (("--dump", dump), ("--config", config), ("--analysis", analysis), ("--weights", weights)):
        if given is not None and not Path(given).exists():
            raise FileNotFoundError(f"{flag} {given}: cannot be read (no such file or folder)")
    files = sorted(Path(weights).glob("*.safetensors")) if weights is not None else []
    if weights is not None and not files:
        raise UsageError(f"--weights {weights} holds no .safetensors files", value=weights)
    return files


def build_manifest(dump_path: Path, config: Path, kernels: Path = KERNELS_TOML, chunk: int = 2048,
                   pid: Optional[int] = None, analysis: Optional[Path] = None, cache: bool = True,
                   cache_dir: Optional[Path] = None, max_seqs: int = 1):
    """(config, mined, kernel table, verified manifest) of the capture at `dump_path` (`cache` and
    `cache_dir` as in `mining.load.load_dump`)."""
    from generators.qwen3 import build, config as qconfig, mined
    from manifests.kernels import load_kernels
    from manifests.verify import verify
    from mining.analyze import analyze, document
    from vocab.analysis import read_analysis
    from mining.load import load_dump

    cfg = qconfig.load(config)
    doc = read_analysis(analysis) if analysis is not None else None
    table = load_kernels(kernels)   # a bad kernels.toml is refused before the capture is read
    dump = load_dump(dump_path, pid=pid, cache=cache, cache_dir=cache_dir)
    if doc is None:
        doc = document(analyze(dump))
    mm = mined.mine(dump, cfg, doc)
    own = {k: (mod, table.op_launch(mod, e), table.module_ref(mod)) for k, (mod, e) in OWN.items()}
    m = build.generate(cfg, mm, own, chunk=chunk, label=dump.source.parent.name, max_seqs=max_seqs)
    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the generated manifest fails verification ({len(bad)} violations, first: {bad[0]})")
    return cfg, mm, table, m


def kernels_dir(out, mm, table, m: dict) -> list[str]:
    """Every module's cubin into `out`'s kernels/: the dump's copied, the own ones built; a cubin
    that does not hash to its pin is RejectedManifest. Returns notes on cubins that could not be had."""
    import hashlib

    from manifests.kernels import NvccMissing, build_module, find_nvcc

    notes, nvcc = [], None
    for name, ref in sorted(m["modules"].items()):
        target = out.path(f"kernels/{ref['source']}")
        src = mm.cubins.get(ref["sha256"])
        if src is not None:
            shutil.copyfile(src, target)
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
        elif name in table.modules and table.modules[name].source:
            try:
                nvcc = nvcc or find_nvcc()
            except NvccMissing:
                notes.append(f"`{name}` not built (no nvcc on PATH)")
                continue
            digest = build_module(table, name, target, nvcc).sha256
        else:
            notes.append(f"`{name}` has no cubin in the dump")
            continue
        if digest != ref["sha256"]:
            raise RejectedManifest(f"`{target.name}` does not hash to module `{name}`'s pin")
    return notes


def generate_qwen3(dump: Path, config: Path, out, *, weights: Optional[Path] = None, chunk: int = 2048,
                   pid: Optional[int] = None, kernels_toml: Path = KERNELS_TOML, analysis: Optional[Path] = None,
                   progress: Optional[Callable] = None, cache: bool = True,
                   cache_dir: Optional[Path] = None, max_seqs: int = 1) -> Qwen3Result:
    """Generate OUT/qwen3.json, OUT/qwen3-bindings.safetensors and OUT/kernels/ from the capture
    `dump` and the model's `config`; `weights` (a checkpoint folder) is checked to hold every bound
    tensor. `progress(what)` (a context manager) wraps the slow read-and-mine step; `cache` and
    `cache_dir` say where the capture's cache is (mining/cache.py); `max_seqs` > 1 writes a batched
    manifest (`build.generate`)."""
    from generators.folder import folder as as_folder
    from generators.qwen3 import bindings
    from generators.qwen3.build import dumps
    from manifests.abi import check_abi

    files = check_inputs(dump, config, analysis, weights, chunk, max_seqs)
    folder = as_folder(out)
    with (progress or (lambda _what: contextlib.nullcontext()))(f"reading and mining {dump}"):
        cfg, mm, table, m = build_manifest(dump, config, kernels_toml, chunk, pid, analysis, cache, cache_dir, max_seqs)
    if weights is not None:
        own = {k: v for k, v in m["buffers"].items() if not any(s["tensor"].startswith("mine.") for s in v.get("bind", []))}
        problems = bindings.checkpoint_problems({"buffers": own}, files)
        if problems:
            raise UsageError(f"the checkpoint does not fit the manifest: {problems[0]} ({len(problems)} problem(s))",
                             value=weights)
    path = folder.path("qwen3.json")
    path.write_text(dumps(m))
    bindings.write(folder.path("qwen3-bindings.safetensors"), cfg, mm.table_width * mm.block_size)
    notes = kernels_dir(folder, mm, table, m)
    folder.finish()
    unpinned = sorted(n for n, r in m["modules"].items() if table.by_sha256(r["sha256"]) is None)
    problems = check_abi(m, folder.root / "kernels")
    checkable = [d for d in problems if d.rule != "abi.module-file"]  # a missing cubin is a note above
    if checkable:
        raise RejectedManifest(f"the ABI check fails: {checkable[0]} ({len(checkable)} finding(s))")
    return Qwen3Result(path, m, mm, not problems, notes + [f"`{n}` is not pinned in kernels.toml" for n in unpinned])
