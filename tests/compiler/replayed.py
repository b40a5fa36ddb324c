"""A real capture compiled with what its in-order GPU replay measured: the fixture files
tests/fixtures/compile/<name>.{tar.xz, flow.json.xz, contents.json.xz, ref.json.xz} (q3t, q3v)."""

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
    requests and the checkpoint's config (q3s.config.json: one checkpoint for all of them)."""
    unpack(name, tmp)
    res = compile_dump(FIX / f"{name}.tar.xz", tmp / "out", analysis=tmp / "flow.json", contents=tmp / "contents.json",
                       requests=tmp / "ref.json", config=FIX / "q3s.config.json", cache=False)
    return res, tmp / "out"
