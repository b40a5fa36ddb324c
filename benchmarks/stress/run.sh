#!/usr/bin/env bash
# The injected capture library under stress on a GPU machine (issue 14), in one command:
#
#   benchmarks/stress/run.sh [OUT_DIR]        (default OUT_DIR: stress-results)
#
# Needs: an NVIDIA GPU with its driver, gcc, the CUDA headers (CUDA_HOME, default /usr/local/cuda),
# this repository installed (`pip install -e .`: the library built, `python` the project's), and
# root, passwordless sudo or unprivileged user namespaces (to mount a small tmpfs). About 5 min.
#
# What it does: builds benchmarks/stress/stress.c (driver API, PTX kernels: no nvcc), measures the
# address space a run takes, then RUNS runs (default 20) of 16 threads x 100,000 launches each
# (THREADS, LAUNCHES), modules loading as they run (CUDA_MODULE_LOADING=LAZY) and a child that
# forks and execs, under the capture (MINE_CAPTURE_* as `mine capture` sets them), with the dump
# on a tmpfs of TMPFS_MB (512) MB that a filler file leaves nearly full, and `ulimit -v` set just
# above the measured need; every fourth run also squeezes its own address space to 64 MB of room.
# The runs cycle through binary and JSON records, the mmap and write writers, and 512/96/16 MB
# free. Each run is checked by benchmarks/stress/check.py (every dump readable, meta.json counters
# equal to the launches made, one stderr line per capture that turned off); the results go to
# OUT_DIR/results.jsonl, OUT_DIR/summary.txt and OUT_DIR/machine.txt (date, GPU, driver). Exit 0
# only if every run passed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$(mkdir -p "${1:-stress-results}" && cd "${1:-stress-results}" && pwd)"
RUNS="${RUNS:-20}" THREADS="${THREADS:-16}" LAUNCHES="${LAUNCHES:-100000}" TMPFS_MB="${TMPFS_MB:-512}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
PER_RUN_S="${PER_RUN_S:-30}"        # a run that takes longer hung: killed, counted as a failure
DEADLINE_S="${DEADLINE_S:-540}"     # the runs not started by then are reported as not run

PY="${PY:-$(command -v python)}"     # the project's python (kept across sudo)
LIB="$(cd "$ROOT" && "$PY" -c 'from capture.launcher import find_library; print(find_library())')"
[ -f "$LIB" ] || { echo "run.sh: the capture library is not built (pip install -e .)" >&2; exit 2; }

BIN="$OUT/stress"
LINK="-l:libcuda.so.1"
if [ "${2:-}" != "--inside" ]; then
if ! gcc -O2 -std=gnu11 -Wall -pthread -I"$CUDA_HOME/include" "$HERE/stress.c" -o "$BIN" $LINK -ldl 2>"$OUT/build.log"; then
  gcc -O2 -std=gnu11 -Wall -pthread -I"$CUDA_HOME/include" "$HERE/stress.c" -o "$BIN" \
      -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl 2>>"$OUT/build.log" || { cat "$OUT/build.log" >&2; exit 2; }
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || true
  echo "kernel: $(uname -r)"
  echo "commit: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "runs: $RUNS x $THREADS threads x $LAUNCHES launches, tmpfs $TMPFS_MB MB"
} > "$OUT/machine.txt"
fi

# The runs themselves, in a mount namespace of their own (the tmpfs is private to it): this script
# again, with --inside.
if [ "${2:-}" = "--inside" ]; then
  fs="$OUT/tmpfs"
  mkdir -p "$fs"
  mount -t tmpfs -o size="${TMPFS_MB}m" stress-tmpfs "$fs"
  : > "$OUT/results.jsonl"
  export CUDA_INJECTION64_PATH="$LIB" CUDA_MODULE_LOADING=LAZY

  # what one run takes, with capture on and no limit (a short run: threads, modules, the child)
  mkdir -p "$OUT/calib/truth"
  MINE_CAPTURE_DIR="$fs/calib" MINE_CAPTURE_FORMAT=bin MINE_CAPTURE_WRITER=mmap \
    timeout -k 5 "$PER_RUN_S" "$BIN" MAIN "$THREADS" 20000 "$OUT/calib/truth" 0 2> "$OUT/calib/stderr" || true
  peak="$("$PY" -c 'import json,glob,sys; print(max(json.load(open(f)).get("vm_peak_kb",0) for f in glob.glob(sys.argv[1]+"/*.json")))' "$OUT/calib/truth" 2>/dev/null || echo 0)"
  rm -rf "$fs/calib"
  [ "$peak" -gt 0 ] || { echo "run.sh: the calibration run did not report (see $OUT/calib/stderr)" >&2; exit 3; }
  limit=$((peak + 2 * 1024 * 1024))   # KB: the measured peak plus 2 GiB
  echo "ulimit -v: $limit KB (calibration peak $peak KB)" >> "$OUT/machine.txt"

  frees=("$TMPFS_MB" 96 16)
  for ((i = 0; i < RUNS; i++)); do
    form=$([ $((i % 2)) -eq 0 ] && echo bin || echo json)
    writer=$([ $(((i / 2) % 2)) -eq 0 ] && echo mmap || echo write)
    free="${frees[$((i % 3))]}"
    squeeze=$([ $((i % 4)) -eq 3 ] && echo 64 || echo 0)
    label="run$i $form/$writer free=${free}MB squeeze=${squeeze}MB"
    if [ "$SECONDS" -gt "$DEADLINE_S" ]; then
      echo "{\"ok\": false, \"label\": \"$label\", \"problems\": [\"not run: the time budget was spent\"], \"processes\": []}" >> "$OUT/results.jsonl"
      continue
    fi
    dump="$fs/run$i"; truth="$OUT/run$i/truth"
    rm -rf "${fs:?}"/* && mkdir -p "$dump" "$truth"
    fill=$((TMPFS_MB - free - 1))
    if [ "$fill" -gt 0 ]; then
      dd if=/dev/zero of="$fs/filler" bs=1M count="$fill" status=none 2>/dev/null || true
    fi
    rc=0
    ( ulimit -v "$limit"
      MINE_CAPTURE_DIR="$dump" MINE_CAPTURE_FORMAT="$form" MINE_CAPTURE_WRITER="$writer" \
        exec timeout -k 5 "$PER_RUN_S" "$BIN" MAIN "$THREADS" "$LAUNCHES" "$truth" "$squeeze"
    ) > "$OUT/run$i/stdout" 2> "$OUT/run$i/stderr" || rc=$?
    (cd "$ROOT" && "$PY" "$HERE/check.py" "$dump" "$truth" "$OUT/run$i/stderr" "$rc" \
        --label "$label" --json "$OUT/results.jsonl") > /dev/null || true
    echo "$label: exit $rc ($SECONDS s)"
  done
  rm -rf "${fs:?}"/*
  umount "$fs"
  exit 0
fi

export OUT LIB BIN RUNS THREADS LAUNCHES TMPFS_MB PER_RUN_S DEADLINE_S PY
if [ "$(id -u)" -eq 0 ]; then
  unshare -m "$0" "$OUT" --inside
elif sudo -n true 2>/dev/null; then
  sudo -E unshare -m "$0" "$OUT" --inside
else
  unshare -r -m "$0" "$OUT" --inside
fi

(cd "$ROOT" && "$PY" "$HERE/check.py" --summary "$OUT/results.jsonl") | tee "$OUT/summary.txt"
