#!/usr/bin/env bash
# Issue 21's SGLang captures on one H200 (no network there), from the repository root of a copy of
# this tree, in one device call:
#
#   examples/sglang_qwen3/device_run.sh KIT OUT [eager|graph|all|prep]        (default all)
#
# KIT: the SGLang 0.5.17 offline kit folder (shared tools' sglang-offline-kit.sh; its use.sh is
# sourced, which unpacks what is not yet in /tmp: a warm machine that already holds /tmp/sgl-site
# and /tmp/sgl-deps needs only use.sh and stubs/ in KIT). `prep` only sources it and builds the
# capture library (a call that carries part of the kit when the whole does not fit). For each mode, as far as DEADLINE_S (default 540 s from the start) allows -- `all` runs
# eager, then graph when at least NEED_S (300 s) is left; one mode takes about 5-7 minutes:
#   1. builds the capture library (pip install -e . --no-deps) unless it is there;
#   2. examples/sglang_qwen3/capture.sh WORK/MODE MODE: checkpoint, the captured run, the same run
#      under SGLang's torch profiler, truth, packed fixture;
#   3. examples/sglang_qwen3/check.py: the fixture against its trace (completeness) and its truth.
# What comes back (at most 8 files; everything else stays in WORK, default /tmp/sglang-issue21):
#   OUT/sglang_MODE-fixture.tar  sglang_MODE.{tar.xz,truth.json,profile.json.gz}: unpack into
#                                tests/fixtures/sglang/ (see tests/mining/test_sglang_truth.py)
#   OUT/sglang_MODE-logs.tar.xz  run JSONs, capture/server/profile logs, check.json, build log
# The checkpoint (WORK/model) is written once and served in every mode.
#   OUT/summary.txt              what this script printed
# A failing step prints what happened and the script goes on to the next; logs are always packed.
set -uo pipefail
kit=$(cd "${1:?usage: device_run.sh KIT OUT [eager|graph|all]}" && pwd) || exit 2
out=$(mkdir -p "${2:?usage: device_run.sh KIT OUT [eager|graph|all]}" && cd "$2" && pwd) || exit 2
want=${3:-all}
case "$want" in eager|graph) modes=("$want") ;; all) modes=(eager graph) ;; prep) modes=() ;;
  *) echo "device_run.sh: mode must be eager, graph, all or prep, not $want" >&2; exit 2 ;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo" || exit 2
t0=$(date +%s)
export DEADLINE_EPOCH=$(( t0 + ${DEADLINE_S:-540} ))
work=${WORK:-/tmp/sglang-issue21}
mkdir -p "$work/logs"
left() { echo $(( DEADLINE_EPOCH - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - t0 ))s] $*"; }
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 KIT="$kit" MODEL_DIR="$work/model"

pack() {   # pack MODE: the fixture files and the logs of one mode into OUT
  local m=$1 w="$work/$1"
  [ -d "$w" ] || return 0
  local fx=()
  for f in "$w/sglang_$m.tar.xz" "$w/sglang_$m.truth.json" "$w/sglang_$m.profile.json.gz"; do
    [ -f "$f" ] && fx+=("$(basename "$f")")
  done
  [ ${#fx[@]} -gt 0 ] && tar cf "$out/sglang_$m-fixture.tar" -C "$w" "${fx[@]}"
  local lg=()
  for f in run.json profile-run.json capture.log profile.log server.log server-profile.log checkpoint.log \
           check.json truth.log; do
    [ -f "$w/$f" ] && lg+=("$m/$f")
  done
  tar cJf "$out/sglang_$m-logs.tar.xz" -C "$work" "${lg[@]}" -C "$work" logs 2>/dev/null
}

main() {
stamp "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c 'import importlib.metadata as m
for p in ("torch", "triton", "transformers", "pandas", "pyarrow", "numpy"):
    try: print(p, m.version(p))
    except Exception as e: print(p, "missing", e)'
  ls "$kit"; nproc; df -h /tmp | tail -1; } > "$work/logs/machine.txt" 2>&1
head -3 "$work/logs/machine.txt"

lib='from capture.launcher import find_library; print(find_library())'
if python3 -c "$lib" > "$work/logs/build.log" 2>&1; then
  stamp "capture library: $(tail -1 "$work/logs/build.log")"
elif stamp "building the capture library" && python3 -m pip install -q --no-build-isolation --no-deps -e . \
     >> "$work/logs/build.log" 2>&1 && python3 -c "$lib" >> "$work/logs/build.log" 2>&1; then
  tail -1 "$work/logs/build.log"
else
  echo "device_run.sh: the capture library did not build:"; tail -20 "$work/logs/build.log"
  tar cJf "$out/sglang-logs.tar.xz" -C "$work" logs; return 1
fi

stamp "kit: sourcing $kit/use.sh"
( source "$kit/use.sh" > "$work/logs/kit.log" 2>&1
  python3 -c 'import importlib.util as u
for m in ("sglang", "sgl_kernel", "pydantic", "zmq", "flashinfer"):
    s = u.find_spec(m); print(m, s.origin if s else "MISSING")' ) 2>&1 | tee -a "$work/logs/kit.log"
if grep -q MISSING "$work/logs/kit.log"; then
  echo "device_run.sh: the kit is not complete in /tmp yet (see above); carry the missing parts and run prep again"
  tar cJf "$out/sglang-logs.tar.xz" -C "$work" logs; return 1
fi

for m in "${modes[@]}"; do
  need=$([ "$m" = "${modes[0]}" ] && echo 200 || echo "${NEED_S:-300}")
  if [ "$(left)" -lt "$need" ]; then
    stamp "$m: skipped, $(left) s left (needs $need): run again with MODE $m"; continue
  fi
  stamp "$m: capture.sh ($(left) s left)"
  bash examples/sglang_qwen3/capture.sh "$work/$m" "$m"
  stamp "$m: capture.sh rc=$?"
  if [ -f "$work/$m/sglang_$m.tar.xz" ] && [ -f "$work/$m/sglang_$m.truth.json" ]; then
    stamp "$m: check"
    t=$(( $(left) - 15 )); [ "$t" -gt 150 ] && t=150; [ "$t" -lt 10 ] && t=10
    timeout "$t" python3 examples/sglang_qwen3/check.py "$work/$m/sglang_$m" --json "$work/$m/check.json" \
      || echo "$m: check.py failed (rc $?)"
  else
    echo "$m: no fixture to check; the run's records:"
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({k: r.get(k) for k in ("error", "startup_s", "shutdown", "profile")})[:1500])' "$work/$m/run.json" 2>&1
    tail -25 "$work/$m/server.log" 2>/dev/null
  fi
  ls -la "$work/$m"/sglang_"$m".* 2>/dev/null
  pack "$m"
done
stamp "done; OUT holds:"; ls -la "$out"
}

main 2>&1 | tee "$out/summary.txt"
exit "${PIPESTATUS[0]}"
