"""The dispatch harness (tests/helpers/harness_dispatch.c): built from every library source, run,
and its dump read back as plain records.

Why a module: the dispatch tests, the dump-key tests and benchmarks/bench_record_path.py all
build the same binary; the harness links init.c too (the library's own meta.json, error notes,
drop names), so it starts from the headers alone, not from c_harness.PRELUDE's stand-ins.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import c_harness
from vocab import binfmt
from capture import build_support
from paths import FIXTURES, HELPERS

HEADERS = r"""
#include "mc.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
"""
CUBIN = FIXTURES / "cubins" / "mine_argmax.cubin"   # entry mine_argmax_rows


def build_dispatch_harness(folder: Path) -> Path:
    """The harness binary (also used by benchmarks/bench_record_path.py)."""
    text = HEADERS + (HELPERS / "harness_dispatch.c").read_text()
    # __cxa_demangle, as in a C++ host; dlopen for init.c's driver lookup (never reached here)
    return c_harness.build(folder, text, *build_support.SOURCES, libs=("-Wl,--no-as-needed", "-lstdc++", "-ldl"))


def run_all(harness: Path, out: Path, form: str, *knobs: str) -> tuple[list[dict], str]:
    """`harness all`: every row of the callback table dispatched once; (its output lines, stderr)."""
    r = subprocess.run([str(harness), "all", str(out), form, str(CUBIN), *knobs], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    return [json.loads(x) for x in r.stdout.splitlines()], r.stderr


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_bytes().split(b"\n") if x.strip(b" \0")]


def read_dump(pid_dir: Path) -> dict[str, list[dict]]:
    """Every file of a process folder as records; launches in either form, each joined to its
    function record (compact form), as a reader of the default form would see them."""
    files = {name: read_jsonl(pid_dir / f"{name}.jsonl")
             for name in ("graphs", "tensormaps", "allocs", "modules", "functions", "copies")}
    if (pid_dir / "launches.bin").is_file():
        launches = binfmt.decode_records(pid_dir)
    else:
        launches = read_jsonl(pid_dir / "launches.jsonl")
    fns = {f["fn"]: f for f in files["functions"]}
    for rec in launches:
        if "fn" in rec and rec["fn"] in fns:
            rec.update({k: v for k, v in fns[rec["fn"]].items() if k not in ("fn", "params_layout")})
    files["launches"] = launches
    files["meta"] = [json.loads((pid_dir / "meta.json").read_text())] if (pid_dir / "meta.json").is_file() else []
    return files
