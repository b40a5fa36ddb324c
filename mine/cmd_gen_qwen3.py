"""`mine gen qwen3`: a vLLM Qwen3 capture to a verified kern manifest, its kernels and bindings.

Reads the dump with `mining.load` and its analysis (the contract of `mining/contract.py`: from
`--analysis FILE`, as `mine analyze --json` wrote it, or computed here), mines and checks it
(`generators.qwen3.mined`, which takes the analysis' forwards and checks its layer structure
against the config), writes
OUT/qwen3.json (verified with `manifests.verify`; a rejection is a generator bug reported as one
sentence), OUT/qwen3-bindings.safetensors (rope cos/sin, kv scale), and OUT/kernels/ (the dumped
vLLM cubins by sha256, this repository's own kernels built with nvcc and checked against their
kernels.toml pins), then runs the offline ABI check over OUT/kernels. The output folder is checked
before the capture is read (`mine.checks.OutFolder`: refused when it holds files, unless
`--force`; a `--force` run replaces what an earlier run wrote and keeps the user's other files),
so a wrong `--out` costs no analysis.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import typer

from mine.cmd_gen import gen_app

ROOT = Path(__file__).resolve().parent.parent
OWN = {"embed": ("mine_embed", "mine_embed_rows"), "argmax": ("mine_argmax", "mine_argmax_rows")}


class RejectedManifest(ValueError):
    """The generated manifest failed verification or the ABI check (one sentence)."""


def read_analysis(path: Path):
    """The analysis contract in `path` (`mine analyze --json`); one sentence when it cannot be read."""
    import json

    from mining.contract import from_json

    try:
        obj = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    try:
        return from_json(obj)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def build_manifest(dump_path: Path, config: Path, kernels: Path, chunk: int, pid: Optional[int] = None,
                   analysis: Optional[Path] = None):
    from generators.qwen3 import build, config as qconfig, mined
    from manifests.kernels import load_kernels
    from manifests.verify import verify
    from mining.analyze import analyze, document
    from mining.load import load_dump

    cfg = qconfig.load(config)
    doc = read_analysis(analysis) if analysis is not None else None
    dump = load_dump(dump_path, pid=pid)
    if doc is None:
        doc = document(analyze(dump))
    mm = mined.mine(dump, cfg, doc)
    table = load_kernels(kernels)
    own = {k: (mod, table.op_launch(mod, e), table.module_ref(mod)) for k, (mod, e) in OWN.items()}
    m = build.generate(cfg, mm, own, chunk=chunk, label=dump.source.parent.name)
    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the generated manifest fails verification ({len(bad)} violations, first: {bad[0]})")
    return cfg, mm, table, m


def _kernels_dir(out, mm, table, m: dict) -> list[str]:
    from manifests.kernels import nvcc_command

    notes = []
    for name, ref in sorted(m["modules"].items()):
        target = out.path(f"kernels/{ref['source']}")
        src = mm.cubins.get(ref["sha256"])
        if src is not None:
            shutil.copyfile(src, target)
        elif name in table.modules and table.modules[name].source:
            nvcc = shutil.which("nvcc")
            if nvcc is None:
                notes.append(f"`{name}` not built (no nvcc on PATH)")
                continue
            proc = subprocess.run(nvcc_command(table, table.modules[name], target, nvcc), capture_output=True, text=True)
            if proc.returncode != 0:
                raise OSError(f"nvcc failed on `{name}`: {proc.stderr.strip()[-200:]}")
        else:
            notes.append(f"`{name}` has no cubin in the dump")
            continue
        if hashlib.sha256(target.read_bytes()).hexdigest() != ref["sha256"]:
            raise RejectedManifest(f"`{target.name}` does not hash to module `{name}`'s pin")
    return notes


def qwen3(
    dump: Path = typer.Option(..., "--dump", help="The capture: a dump folder (or its .tar.xz), a pid<N>/ folder "
                              "or a launches file."),
    config: Path = typer.Option(..., "--config", help="The model's config.json."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (qwen3.json, qwen3-bindings.safetensors, kernels/)."),
    force: bool = typer.Option(False, "--force", help="Write into an existing --out folder (files of an earlier "
                               "run there are replaced, other files kept)."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Checkpoint folder: check every bound tensor is there."),
    chunk: int = typer.Option(2048, help="Most rows one prefill call takes."),
    pid: Optional[int] = typer.Option(None, help="Which process of a multi-process dump (default: most launches)."),
    kernels_toml: Path = typer.Option(ROOT / "kernels.toml", "--kernels-toml", show_default="kernels.toml of this "
                                      "repository", help="kernels.toml with the own kernels' pins."),
    kernels: Optional[Path] = typer.Option(None, "--kernels", hidden=True),
    analysis: Optional[Path] = typer.Option(None, "--analysis",
                                            help="The capture's analysis (`mine analyze --json`); computed when omitted."),
) -> None:
    """Generate the Qwen3 kern manifest from a vLLM capture.

    \b
    Examples:
      mine gen qwen3 --dump tests/fixtures/vllm/vllm-offline.tar.xz --config examples/vllm_qwen3/reference/config.json -o out/qwen3
      mine analyze tests/fixtures/vllm/vllm-offline.tar.xz --json out/a.json && mine gen qwen3 --dump tests/fixtures/vllm/vllm-offline.tar.xz --analysis out/a.json --config examples/vllm_qwen3/reference/config.json -o out/qwen3b
    """
    from generators.qwen3 import bindings
    from generators.qwen3.build import dumps
    from manifests.abi import check_abi
    from mine.checks import OutFolder, archive_named, progress

    if chunk < 1:
        raise ValueError(f"--chunk must be at least 1, got {chunk}")
    toml = kernels if kernels is not None else kernels_toml
    for flag, given in (("--dump", dump), ("--config", config), ("--analysis", analysis), ("--weights", weights)):
        if given is not None and not given.exists():
            raise FileNotFoundError(f"{flag} {given}: cannot be read (no such file or folder)")
    files = sorted(Path(weights).glob("*.safetensors")) if weights is not None else []
    if weights is not None and not files:
        raise ValueError(f"--weights {weights} holds no .safetensors files")
    folder = OutFolder(out, force, inputs=[dump, config, analysis, toml, weights])
    with archive_named(dump), progress(f"reading and mining {dump}"):
        cfg, mm, table, m = build_manifest(dump, config, toml, chunk, pid, analysis)
    if weights is not None:
        problems = bindings.checkpoint_problems({"buffers": {k: v for k, v in m["buffers"].items()
                                                             if not any(s["tensor"].startswith("mine.") for s in v.get("bind", []))}}, files)
        if problems:
            raise ValueError(f"the checkpoint does not fit the manifest: {problems[0]} ({len(problems)} problem(s))")
    folder.path("qwen3.json").write_text(dumps(m))
    bindings.write(folder.path("qwen3-bindings.safetensors"), cfg, mm.table_width * mm.block_size)
    notes = _kernels_dir(folder, mm, table, m)
    folder.finish()
    unpinned = sorted(n for n, r in m["modules"].items() if table.by_sha256(r["sha256"]) is None)
    problems = check_abi(m, out / "kernels")
    checkable = [d for d in problems if d.rule != "abi.module-file"]
    if checkable:
        raise RejectedManifest(f"the ABI check fails: {checkable[0]} ({len(checkable)} finding(s))")
    typer.echo(f"{out / 'qwen3.json'}: {len(mm.forwards)} forwards mined ({mm.skipped} partial left out), "
               f"{len(m['programs']['prefill']['calls'])} prefill / {len(m['programs']['decode']['calls'])} decode calls; "
               f"verified; ABI {'checked' if not problems else 'checked where cubins exist'}")
    for n in notes + [f"`{n}` is not pinned in kernels.toml" for n in unpinned]:
        typer.echo(f"note: {n}")


def register(app: typer.Typer) -> None:
    gen_app.command("qwen3")(qwen3)
