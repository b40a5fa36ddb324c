"""A real capture compiled with what its in-order GPU replay measured: the fixture files
tests/fixtures/compile/<name>.{tar.xz, flow.json.xz, contents.json.xz, ref.json.xz} (q3t, q3v, q3x)."""

from __future__ import annotations

import lzma
from pathlib import Path

from paths import FIXTURES

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
