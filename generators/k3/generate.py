"""`generate_k3`: Kimi-K3 prefill pipeline stages (P) or the TP8/EP8 decode manifest (D), with or
without decode-context parallelism (`dcp`), written into a folder.

The library function under `mine gen k3`. P: the whole 93-layer prefill manifest is generated,
then cut with the project's cut (`manifests.cut`, which verifies its input and re-verifies every
stage) at the first call of every stage's first layer (`l12.res_in`, `l24.res_in`, ...) and
written as p/stage<N>.json. D: generated, verified (`RejectedManifest` on a finding: a generator
bug) and written as d.json. Kernels come from kernels.toml; a kernel it lacks stops generation
with its name. Options are checked before any work (`check_options`): `stages` must split the
layers, and the decode-only options (`tp`, `dcp`) are refused without `decode` rather than
ignored; the messages name the command's flags.

`out` is a folder object (`generators.folder`; the command passes its checked `OutFolder`) or a
plain path, written into as asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from vocab.errors import RejectedManifest, UsageError

ROOT = Path(__file__).resolve().parents[2]
KERNELS_TOML = ROOT / "kernels.toml"
STAGES, TP = 8, 8   # the defaults: eight prefill stages, a decode group of eight


def check_options(decode: bool, stages: Optional[int] = None, tp: Optional[int] = None,
                  dcp: bool = False) -> tuple[int, int]:
    """(stages, tp) with their defaults filled in; refuses an option of the other form."""
    if decode and stages is not None:
        raise UsageError("--stages is for the prefill stages; the decode manifest (--decode) is one rank group",
                         value=stages)
    if not decode and (tp is not None or dcp):
        raise UsageError(f"{'--tp' if tp is not None else '--dcp'} applies to the decode manifest; add --decode",
                         value=tp if tp is not None else dcp)
    return (STAGES if stages is None else stages), (TP if tp is None else tp)


def _verified(m: dict, what: str) -> dict:
    from manifests.verify import verify

    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the generated {what} fails verification ({len(bad)} violations, first: {bad[0]})")
    return m


def write_prefill(cfg, table, out, stages: int, experts: int, chunk: int, pack: int, max_ctx: int) -> list[Path]:
    """The prefill manifest of `cfg`, cut into `stages` stages, written as OUT/p/stage<N>.json."""
    from generators.folder import folder as as_folder
    from generators.k3 import layout, prefill
    from generators.k3.build import dumps
    from manifests.cut import cut, resolve_labels

    folder = as_folder(out)
    whole = prefill.generate(cfg, table, experts, chunk, pack, max_ctx)  # cut() verifies it first
    at = resolve_labels(whole, [f"l{a}.res_in" for a, _ in layout.stage_bounds(cfg, stages)[1:]])
    paths = []
    for s, stage in enumerate(cut(whole, at)):
        p = folder.path(f"p/stage{s}.json")
        p.write_text(dumps(stage))
        paths.append(p)
    folder.finish()
    return paths


def write_decode(cfg, table, out, experts: int, tp: int, max_ctx: int, dcp: bool = True) -> Path:
    """The decode manifest of `cfg` for a group of `tp`, verified, written as OUT/d.json."""
    from generators.folder import folder as as_folder
    from generators.k3 import decode
    from generators.k3.build import dumps

    folder = as_folder(out)
    m = _verified(decode.generate(cfg, table, experts, tp, max_ctx, dcp=dcp), "decode manifest")
    p = folder.path("d.json")
    p.write_text(dumps(m))
    folder.finish()
    return p


def generate_k3(out, *, decode: bool = False, stages: Optional[int] = None, experts: int = 896,
                chunk: int = 8192, pack: int = 16, max_ctx: int = 262144, tp: Optional[int] = None,
                dcp: bool = False, config: Optional[Path] = None,
                kernels_toml: Path = KERNELS_TOML) -> list[Path]:
    """Write the prefill stages (or, with `decode`, the decode manifest) into `out`; the paths
    written. `config` is a K3 config.json (None: the bundled one)."""
    from generators.k3 import config as k3config
    from generators.k3 import layout
    from manifests.kernels import load_kernels

    stages, tp = check_options(decode, stages, tp, dcp)
    cfg = k3config.load(config)
    cfg.checkpoint(experts)
    if not decode:
        layout.stage_bounds(cfg, stages)  # refuses a count that does not split the layers, before work
    table = load_kernels(kernels_toml)
    if decode:
        return [write_decode(cfg, table, out, experts, tp, max_ctx, dcp)]
    return write_prefill(cfg, table, out, stages, experts, chunk, pack, max_ctx)
