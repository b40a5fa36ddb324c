"""Every environment variable the capture library reads, with its default (one place).

The C library (capture/src/init.c, read_knobs) reads the same names with the same defaults;
`tests/capture/test_capture_cpu.py` checks that the two lists agree. `mine capture` sets them from its
options through `knob_env()`. Values are validated here so bad input is one sentence, not a
silently ignored variable; the C side ignores a malformed value with one stderr line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vocab.errors import UsageError


@dataclass(frozen=True)
class Knob:
    env: str
    default: str  # as the C library sees it when unset ("" = no value)
    meaning: str
    kind: str  # "path" | "regex" | "uint" | "bool" | "choice"
    choices: tuple[str, ...] = ()


KNOBS: tuple[Knob, ...] = (
    Knob("MINE_CAPTURE_DIR", "dumped-kernels", "output folder; one pid<N>/ sub-folder per process", "path"),
    Knob("MINE_CAPTURE_INCLUDE", "", "POSIX extended regex; only symbols matching it are recorded", "regex"),
    Knob("MINE_CAPTURE_EXCLUDE", "", "POSIX extended regex; symbols matching it are not recorded", "regex"),
    Knob("MINE_CAPTURE_MAX_LAUNCHES", "0", "per process; 0 = unlimited; past it launches are counted only", "uint"),
    Knob("MINE_CAPTURE_MAX_BYTES", "0", "per process, all files together; 0 = unlimited", "uint"),
    Knob("MINE_CAPTURE_SKIP", "0", "do not record the first N launches that pass the filters", "uint"),
    Knob("MINE_CAPTURE_MODULES_ONLY", "0", "1: record modules and cubins, no launches", "bool"),
    Knob("MINE_CAPTURE_HOST_BYTES", "64", "bytes copied from a host pointee (at most 4096)", "uint"),
    Knob("MINE_CAPTURE_WRITER", "write",
         "write: one write(2) per record (files always exact); mmap: launches/graphs through a shared "
         "file mapping (no syscall per record, 1.2-1.4 us/launch less on a launch loop; eager torch forward "
         "not resolved, see docs/benchmarks.md; a killed or _exit()ed process leaves NUL bytes, see dump-format.md)",
         "choice", ("write", "mmap")),
    Knob("MINE_CAPTURE_PREFAULT", "1",
         "mmap writer only: 1 = a helper thread keeps 1 MiB ahead granted and faulted in; 0 = no helper, "
         "pages fault in on first touch (diagnostic)", "bool"),
    Knob("MINE_CAPTURE_CLASSIFY", "1",
         "1 = look up every plausible 8-byte parameter word (device allocation, host pointee, tensor map); "
         "0 = record parameter bytes only, no ptrs/host/tmap keys (diagnostic: times capture without it)",
         "bool"),
    Knob("MINE_CAPTURE_ALLOC_LOG", "0",
         "1 = write every device allocation/free/mapping event (cuMemAlloc*, cuMemFree*, VMM map/unmap, "
         "async pools, IPC) to allocs.jsonl, so mining classifies pointer words offline; combine with "
         "MINE_CAPTURE_CLASSIFY=0 to skip the per-launch driver lookups (docs/dump-format.md)",
         "bool"),
    Knob("MINE_CAPTURE_COPY_LOG", "1",
         "1 = write every host-to-device copy (cuMemcpyHtoD*, cudaMemcpy* from host memory, memcpy nodes) "
         "to copies.jsonl with the launch seq it precedes, its destination and size; 0 = no copy log "
         "(docs/dump-format.md \"Copy log\")", "bool"),
    Knob("MINE_CAPTURE_COPY_BYTES", "4096",
         "a copy of at most this many bytes carries them in copies.jsonl (hex); 0 = no bytes; at most 65536",
         "uint"),
    Knob("MINE_CAPTURE_SNAPSHOT_AT", "0",
         "N > 0 = once N launch records are written, at the next launch whose stream is not being captured "
         "into a graph, synchronize and copy every live device allocation to snapshot/ (one snapshot.jsonl "
         "record each; implies ALLOC_LOG=1; for `mine compile --weights`; docs/dump-format.md \"Snapshot\")",
         "uint"),
    Knob("MINE_CAPTURE_SNAPSHOT_SIGNAL", "0",
         "1 = SIGUSR2 triggers the snapshot at the next such launch (the library catches the signal; "
         "implies ALLOC_LOG=1)", "bool"),
    Knob("MINE_CAPTURE_SNAPSHOT_BYTES", str(8 << 30),
         "the most bytes a snapshot copies: allocations are skipped largest first (a serving engine's KV "
         "pool) until the rest fits; recorded as skipped", "uint"),
    Knob("MINE_CAPTURE_COMPACT", "0",
         "1 = write each distinct function (symbol, demangled name, attributes, module, parameter layout) "
         "once to functions.jsonl and let launch records carry \"fn\": id and params without off/size "
         "(smaller records; mining.load rebuilds the same frames; docs/dump-format.md)",
         "bool"),
    Knob("MINE_CAPTURE_NOOP", "0",
         "1 = every driver-API callback returns at once: CUPTI's own cost per launch, nothing recorded "
         "(diagnostic, for benchmarks/bench_capture.py)", "bool"),
    Knob("MINE_CAPTURE_SELFTIME", "0",
         "1 = time the recording of each launch inside the callback; meta.json counters self_ns and "
         "self_launches (diagnostic, for benchmarks/bench_capture.py)", "bool"),
    Knob("MINE_CAPTURE_ALTERNATE", "0",
         "N > 0 = launches are counted from the process's first; those in odd blocks of N are not recorded "
         "(the callback returns at once): recording's cost against CUPTI's alone inside one process "
         "(diagnostic, for benchmarks/bench_capture.py)", "uint"),
    Knob("MINE_CAPTURE_TOGGLE_MS", "0",
         "T > 0 = a thread switches the launch callbacks off and on every T ms and meta.json lists the switch "
         "times (\"toggles\"): the whole capture's cost against no launch callbacks inside one process "
         "(diagnostic, for benchmarks/bench_capture.py)", "uint"),
    Knob("MINE_CAPTURE_FORMAT", "json",
         "json: launches.jsonl; bin: launches.bin, fixed binary records (header + the raw parameter buffer; "
         "implies COMPACT=1, ALLOC_LOG=1, CLASSIFY=0; host pointees learnt per function); mining reads both, "
         "`python -m vocab.binfmt PID_DIR` turns launches.bin into launches.jsonl (docs/dump-format.md)",
         "choice", ("json", "bin")),
)
BY_ENV = {k.env: k for k in KNOBS}
INJECTION_ENV = "CUDA_INJECTION64_PATH"  # read by the CUDA driver, not by us
LIBRARY_ENV = "MINE_CAPTURE_LIB"  # launcher only: use this built library instead of the installed one


def defaults() -> dict[str, str]:
    return {k.env: k.default for k in KNOBS}


def check_value(env: str, value: str) -> str:
    """Returns the value as the C library will read it; raises UsageError (a ValueError) with one
    sentence."""
    knob = BY_ENV.get(env)
    if knob is None:
        raise UsageError(f"{env} is not a capture knob; known: {', '.join(BY_ENV)}.", value=env, limit=tuple(BY_ENV))
    value = str(value)
    if knob.kind == "uint" and not value.isdigit():
        raise UsageError(f"{env} must be a non-negative integer, got {value!r}.", value=value, limit=0)
    if knob.kind == "bool":
        if value.lower() in ("1", "true", "yes", "on"):
            return "1"
        if value.lower() in ("0", "false", "no", "off", ""):
            return "0"
        raise UsageError(f"{env} must be 0 or 1, got {value!r}.", value=value, limit=("0", "1"))
    if knob.kind == "choice":
        if value.lower() not in knob.choices:
            raise UsageError(f"{env} must be one of {', '.join(knob.choices)}, got {value!r}.", value=value,
                             limit=knob.choices)
        return value.lower()
    if knob.kind == "regex" and value:
        try:
            re.compile(value)
        except re.error as exc:
            raise UsageError(f"{env} is not a valid regular expression ({exc}).", value=value) from None
    limit = {"MINE_CAPTURE_HOST_BYTES": 4096, "MINE_CAPTURE_COPY_BYTES": 65536}.get(env)
    if knob.kind == "uint" and limit is not None and int(value) > limit:
        raise UsageError(f"{env} must be at most {limit}, got {value}.", value=int(value), limit=limit)
    return value


def knob_env(**values) -> dict[str, str]:
    """`knob_env(dir="out", max_launches=100)` -> the environment variables to set."""
    env = {}
    for key, value in values.items():
        if value is None:
            continue
        name = "MINE_CAPTURE_" + key.upper()
        env[name] = check_value(name, value)
    return env
