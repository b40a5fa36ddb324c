"""Run a command with the capture library injected, then summarize the dump per process.

Contract: `run_capture(cmd, out_dir, **knobs)` starts `cmd` with `CUDA_INJECTION64_PATH` and the
`MINE_CAPTURE_*` knobs set, waits, and returns `(exit_code, summaries)`, where exit_code is the
command's (128+N when a signal N killed it) and summaries cover the pid<N>/ folders this run
wrote. Bad input raises `CaptureInputError` (a ValueError: one sentence). `summarize(dump)`
reads a dump folder (also a committed fixture) and does not need the library or a GPU.
Not checked here: that the command really uses CUDA (a command that never initializes the driver
leaves no pid folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vocab import binfmt
from capture import knobs as K
from vocab.errors import MineError

PKG_DIR = Path(__file__).resolve().parent
SYMBOL_RE = re.compile(r'"symbol":"((?:[^"\\]|\\.)*)"')
FN_RE = re.compile(r'"fn":(\d+)')


class CaptureInputError(MineError, ValueError):
    """A bad command line: missing command, command not found, output folder is a file."""


@dataclass
class ProcessSummary:
    pid: int
    folder: Path
    argv: list[str]
    modules: int = 0
    cubin_bytes: int = 0
    cubins: int = 0
    launches: int = 0
    kernels: int = 0
    no_layout: int = 0
    duration_s: float | None = None  # None: the process did not exit cleanly
    disabled: str | None = None
    truncated_lines: int = 0
    errors: dict = field(default_factory=dict)


def find_library() -> Path:
    override = os.environ.get(K.LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise CaptureInputError(f"{K.LIBRARY_ENV}={override} is not a file.")
        return path.resolve()
    candidates = [PKG_DIR / "libmine_capture.so", *sorted(PKG_DIR.glob("libmine_capture*.so"))]
    candidates += sorted(PKG_DIR.parent.glob("build/lib*/capture/libmine_capture*.so"))
    for path in candidates:
        if path.is_file():
            return path
    raise CaptureInputError(
        "the capture library is not built; run `pip install -e .` (it builds capture/libmine_capture.so)."
    )


def check_command(cmd: list[str]) -> str:
    if not cmd:
        raise CaptureInputError("no command given; usage: mine capture [OPTIONS] -- CMD [ARGS...].")
    exe = cmd[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise CaptureInputError(f"command not found or not executable: {exe}.")
        return exe
    found = shutil.which(exe)
    if not found:
        raise CaptureInputError(f"command not found: {exe}.")
    return found


def check_out_dir(out_dir: Path) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureInputError(f"output folder {out_dir} exists and is not a folder.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CaptureInputError(f"cannot create output folder {out_dir} ({exc.strerror}).") from None
    if not os.access(out_dir, os.W_OK):
        raise CaptureInputError(f"output folder {out_dir} is not writable.")
    return out_dir.resolve()


def _lines(path: Path):
    """Yields complete lines; counts a truncated last line (a killed process) separately."""
    if not path.is_file():
        return
    with open(path, "rb") as f:
        for raw in f:
            if raw.endswith(b"\n"):
                raw = record_bytes(raw)
                if raw.strip():
                    yield raw


def record_bytes(line: bytes) -> bytes:
    """A line as the mmap writer may leave it after a kill: the record is what follows the last NUL
    (NULs in front are a record that was reserved but never written; a line that still does not
    parse is one that was cut short). Lines of a cleanly finished process hold no NUL."""
    return line.rpartition(b"\0")[2] if b"\0" in line else line


def summarize_process(folder: Path) -> ProcessSummary:
    meta = json.loads((folder / "meta.json").read_text())
    s = ProcessSummary(pid=meta["pid"], folder=folder, argv=meta.get("argv", []))
    for raw in _lines(folder / "modules.jsonl"):
        if b'"event":"load"' in raw:
            s.modules += 1
    cubins = list((folder / "cubins").glob("*.cubin")) if (folder / "cubins").is_dir() else []
    s.cubins = len(cubins)
    s.cubin_bytes = sum(p.stat().st_size for p in cubins)
    symbols = set()
    fns = {fn: (r.get("symbol") or "", r.get("layout") or "")   # compact and binary forms
           for fn, r in binfmt.read_functions(folder / binfmt.FUNCTIONS).items()}
    path = folder / "launches.jsonl"
    if (folder / binfmt.LAUNCHES_BIN).is_file() and not path.is_file():
        data = (folder / binfmt.LAUNCHES_BIN).read_bytes()
        sc = binfmt.scan(data)
        s.launches, s.truncated_lines = len(sc.offsets), sc.damaged
        ids, counts = np.unique(binfmt.headers(data, sc.offsets)["fn"], return_counts=True)
        for fn, n in zip(ids.tolist(), counts.tolist()):
            sym, layout = fns.get(fn, (None, None))
            symbols.add(sym or f"fn{fn}")
            s.no_layout += n if layout == "none" else 0
    elif path.is_file():
        data = path.read_bytes()
        if data.rstrip(b"\0") and not data.rstrip(b"\0").endswith(b"\n"):
            s.truncated_lines = 1
        for raw in data.splitlines(keepends=True):
            raw = record_bytes(raw)
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            s.launches += 1
            line = raw.decode("utf-8", "replace")
            m = SYMBOL_RE.search(line)
            if m:
                symbols.add(m.group(1))
            elif (f := FN_RE.search(line)) and int(f.group(1)) in fns:
                sym, layout = fns[int(f.group(1))]
                symbols.add(sym)
                s.no_layout += layout == "none"
            if '"layout":"none"' in line:
                s.no_layout += 1
    s.kernels = len(symbols)
    if "end_ns" in meta:
        s.duration_s = (meta["end_ns"] - meta["start_ns"]) / 1e9
    s.disabled = meta.get("disabled")
    s.errors = meta.get("counters", {}).get("errors", {})
    return s


def summarize(dump: Path, since_unix_ns: int = 0) -> list[ProcessSummary]:
    out = []
    for folder in sorted(Path(dump).glob("pid*")):
        meta = folder / "meta.json"
        if not meta.is_file():
            continue
        if since_unix_ns and json.loads(meta.read_text()).get("start_unix_ns", 0) < since_unix_ns:
            continue
        out.append(summarize_process(folder))
    return out


def run_capture(cmd: list[str], out_dir: Path, **knob_values) -> tuple[int, list[ProcessSummary]]:
    exe = check_command(cmd)
    out = check_out_dir(Path(out_dir))
    lib = find_library()
    env = dict(os.environ)
    env.update(K.knob_env(**knob_values))
    env["MINE_CAPTURE_DIR"] = str(out)
    env[K.INJECTION_ENV] = str(lib)
    started = time.time_ns()
    try:
        proc = subprocess.Popen([exe, *cmd[1:]], env=env)
    except OSError as exc:
        raise CaptureInputError(f"cannot start {cmd[0]} ({exc.strerror}).") from None
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child gets Ctrl-C from the terminal
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
    code = 128 - rc if rc < 0 else rc
    return code, summarize(out, since_unix_ns=started - 1)


def render(summaries: list[ProcessSummary], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(stderr=True)
    if not summaries:
        console.print("mine capture: no process initialized CUDA; nothing was captured.")
        return
    table = Table(title="mine capture", show_lines=False)
    for col in ("pid", "command", "modules", "cubin MiB", "launches", "kernels", "no layout", "duration"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for s in summaries:
        cmd = " ".join(s.argv)[:60]
        dur = f"{s.duration_s:.2f} s" if s.duration_s is not None else "killed"
        table.add_row(str(s.pid), cmd, str(s.modules), f"{s.cubin_bytes / 2**20:.2f}", str(s.launches),
                      str(s.kernels), str(s.no_layout), dur)
    console.print(table)
    for s in summaries:
        if s.disabled:
            console.print(f"pid {s.pid}: capture turned itself off: {s.disabled}")
        if s.truncated_lines:
            console.print(f"pid {s.pid}: {s.truncated_lines} launch record(s) incomplete (process killed).")
