"""A real capture compiled with what its in-order GPU replay measured: the fixture files
tests/fixtures/compile/<name>.{tar.xz, flow.json.xz, contents.json.xz, ref.json.xz} (q3t, q3v, q3x)."""

from __future__ import annotations

import lzma
from pathlib import Path

from kern_verdicts import accepted_by_both
from paths import FIXTURES

from compare.serving import serving
from compiler.compile import compile_dump

FIX = FIXTURES / "compile"


def unpack(name: str, tmp: Path) -> Path:
    """The fixture's flow, contents and reference, decompressed into `tmp`."""
    for part in ("flow", "contents", "ref"):
        (tmp / f"{part}.json").write_bytes(lzma.decompress((FIX / f"{name}.{part}.json.xz").read_bytes()))
    return tmp


def compile_replayed(name: str, tmp: Path):
    """(CompileResult, out folder) of `mine compile` with the replay's flow and contents, the
    requests and the checkpoint's config (<name>.config.json where the capture has a checkpoint
    of its own, else q3s.config.json, the checkpoint of q3s to q3w)."""
    unpack(name, tmp)
    cfg = FIX / f"{name}.config.json"
    res = compile_dump(FIX / f"{name}.tar.xz", tmp / "out", analysis=tmp / "flow.json", contents=tmp / "contents.json",
                       requests=tmp / "ref.json", config=cfg if cfg.exists() else FIX / "q3s.config.json", cache=False)
    return res, tmp / "out"


# the six fills vLLM's one-sequence serving needs, with the width each has in vLLM 0.26
FILLS = {"token": "i64", "position": "i64", "slot": "i64", "seq_len": "i64", "cu_seqlens": "i32", "blocks": "i32"}


def check_served(res, out: Path) -> None:
    """Both verifiers accept the compiled manifest and a one-sequence host finds every fill."""
    accepted_by_both(res, out)
    s = serving(res.manifest)
    assert set(s.inputs) == set(FILLS) and s.prefill and s.decode


def check_fills(manifest: dict) -> None:
    """Every fill named once, with its width."""
    named = [(b["fill"], b["dtype"]) for b in manifest["buffers"].values() if b["kind"] == "input" and b.get("fill")]
    assert sorted(named) == sorted(FILLS.items())


def check_every_step_tied(name: str, files: Path) -> None:
    """Every serving forward of the capture takes a step of its requests, in the order the engine
    ran them, each step once; start-up passes take none."""
    from compiler.compile import explain_inputs
    from compiler.requests import read_requests
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from vocab import contents as VC

    dump = load_dump(FIX / f"{name}.tar.xz", cache=False)
    reqs = read_requests(files / "ref.json")
    fwds, _ = explain_inputs(dump, document(analyze(dump)), reqs, VC.read(files / "contents.json"))
    serve = [fi for fi in fwds if fi.phase == "serve"]
    assert [fi.step.index if fi.step else None for fi in serve] == list(range(len(reqs.steps))), \
        [(fi.forward, fi.step_because) for fi in serve]
    assert all(fi.step is None for fi in fwds if fi.phase != "serve")
