#!/usr/bin/env bash
# Capture SGLang serving a seeded random Qwen3 in one command, on a GPU host with this project built
# (`pip install -e .` builds the injection library) and SGLang importable (KIT=DIR: the offline kit
# of shared tools' sglang-offline-kit.sh, whose DIR/use.sh is sourced):
#
#   examples/sglang_qwen3/capture.sh OUT_DIR [eager|graph]
#
# 1. writes OUT_DIR/model (or MODEL_DIR, where it is kept when already there) with
#    ../vllm_qwen3/make_checkpoint.py and the checkpoint flags of GEOMETRY,
#    a row of examples/truth_suite/suite.txt (default q3d: 3 layers, hidden 1024, 16/8 heads, vocab
#    32000, the checkpoint the vLLM server capture q3ds served), or 0.6b for Qwen3-0.6B's geometry;
# 2. captures `python -m sglang.launch_server` under `mine capture` (its library; OUT_DIR/dump): run_serve.py sends
#    the four prompts of ../vllm_qwen3/prompts.py as token ids, one at a time, greedy, 4 new tokens,
#    and stops the server cleanly. eager: --disable-cuda-graph; graph: SGLang's CUDA graphs, kept few
#    (GRAPH_ARGS). SGLang's torch profiler is asked to trace the prompts in the same process too;
#    CUPTI takes one callback subscriber per process and kineto falls back to CPU-only tracing when
#    its own subscription fails, so this trace is expected to hold no kernel (run.json says);
# 3. (PROFILE_RUN=1, the default) runs the same server again without the capture, under SGLang's
#    torch profiler (OUT_DIR/profile-run.json, OUT_DIR/profile/);
# 4. writes OUT_DIR/sglang_MODE.tar.xz (the packed dump, no closed-library cubins),
#    OUT_DIR/sglang_MODE.truth.json (geometry, requests, CUDA-graph sizes, the capture's window) and
#    OUT_DIR/sglang_MODE.profile.json.gz (the kernel events of the trace that has them).
# Exit code: the capture run's (0: every prompt answered); the profile run and the packing are
# reported, not fatal. Timeouts: RUN_TIMEOUT (default 360 s) per server run, STARTUP_TIMEOUT (240 s);
# with DEADLINE_EPOCH (date +%s), each run is cut to fit before it and the profile run is skipped when
# less than PROFILE_MIN_S (150 s) is left.
set -uo pipefail
out=$(mkdir -p "${1:?usage: capture.sh OUT_DIR [eager|graph]}" && cd "$1" && pwd)
mode=${2:-eager}
[[ "$mode" == eager || "$mode" == graph ]] || { echo "capture.sh: mode must be eager or graph, not $mode" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
geometry=${GEOMETRY:-q3d}
run_timeout=${RUN_TIMEOUT:-360}
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
budget() {   # budget RESERVE_S: seconds a server run may take (RUN_TIMEOUT, cut to DEADLINE_EPOCH - RESERVE_S)
  local b=$run_timeout
  if [ -n "${DEADLINE_EPOCH:-}" ]; then
    local left=$(( DEADLINE_EPOCH - $(date +%s) - $1 ))
    [ "$left" -lt "$b" ] && b=$left
  fi
  echo "$b"
}

if [ "$geometry" = 0.6b ]; then flags=""; else
  flags=$(grep "^$geometry|" "$repo/examples/truth_suite/suite.txt" | cut -d'|' -f2)
  [ -n "$flags" ] || { echo "capture.sh: GEOMETRY=$geometry is no row of examples/truth_suite/suite.txt" >&2; exit 2; }
fi
model=${MODEL_DIR:-$out/model}
if [ ! -f "$model/config.json" ]; then
  stamp "checkpoint ($geometry) -> $model"
  # shellcheck disable=SC2086
  python3 "$repo/examples/vllm_qwen3/make_checkpoint.py" "$model" $flags > "$out/checkpoint.log" 2>&1 \
    || { echo "capture.sh: the checkpoint failed:" >&2; tail -5 "$out/checkpoint.log" >&2; exit 1; }
fi
if [ -n "${KIT:-}" ]; then
  # shellcheck disable=SC1091
  source "$KIT/use.sh" || { echo "capture.sh: sourcing $KIT/use.sh failed" >&2; exit 1; }
fi

# `mine capture -o DIR -- CMD` through its library (capture/launcher.py, the CLI's defaults: binary
# records, mmap writer), so the kit's own click on PYTHONPATH never meets the CLI's typer
cap=(python3 -c 'import sys; from pathlib import Path; from capture.launcher import run_capture
code, procs = run_capture(sys.argv[2:], Path(sys.argv[1]), format="bin", writer="mmap")
for s in procs:
    print(f"mine capture: pid {s.pid}: {s.launches} launches, {s.kernels} kernels, {s.cubins} cubins, "
          + ("exited cleanly" if s.duration_s is not None else "did not exit cleanly"), file=sys.stderr)
sys.exit(code)' "$out/dump")

graph_args=${GRAPH_ARGS:-}
serve_flags=(--mode "$mode" --startup-timeout "${STARTUP_TIMEOUT:-240}")
[ -n "$graph_args" ] && serve_flags+=(--graph-args "$graph_args")

reap() {   # reap PIDFILE: a server left behind by a killed run_serve.py (its process group, by id)
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if [ -n "$pid" ] && kill -0 -- "-$pid" 2>/dev/null; then
    stamp "killing the server group $pid left behind"; kill -KILL -- "-$pid" 2>/dev/null
  fi
  rm -f "$1"
}

rm -rf "$out/dump" "$out/prof-inproc"
stamp "capture run ($mode) -> $out/dump"
t=$(budget 90)
[ "$t" -gt 30 ] || { echo "capture.sh: no time left for the capture run ($t s)" >&2; exit 1; }
( cd "$here" && timeout -k 30 "$t" "${cap[@]}" python3 run_serve.py "$model" "$out/run.json" \
    "${serve_flags[@]}" --port 30011 --profile-dir "$out/prof-inproc" --log "$out/server.log" \
    --pidfile "$out/server.pid" ) > "$out/capture.log" 2>&1
rc=$?
reap "$out/server.pid"
stamp "capture run rc=$rc"; tail -4 "$out/capture.log"

t=$(budget 60)
if [ "${PROFILE_RUN:-1}" = 1 ] && [ "$t" -lt "${PROFILE_MIN_S:-150}" ] && [ "$t" -lt "$run_timeout" ]; then
  stamp "profile run skipped: $t s left (PROFILE_MIN_S ${PROFILE_MIN_S:-150})"
elif [ "${PROFILE_RUN:-1}" = 1 ]; then
  rm -rf "$out/profile"
  stamp "profile run ($mode, no capture) -> $out/profile"
  ( cd "$here" && timeout -k 30 "$t" python3 run_serve.py "$model" "$out/profile-run.json" \
      "${serve_flags[@]}" --port 30012 --profile-dir "$out/profile" --log "$out/server-profile.log" \
      --pidfile "$out/server-profile.pid" ) > "$out/profile.log" 2>&1
  prc=$?
  reap "$out/server-profile.pid"
  stamp "profile run rc=$prc"; tail -2 "$out/profile.log"
fi

if [ -d "$out/dump" ]; then
  stamp "truth and trace -> $out/sglang_$mode.*"
  python3 "$here/truth.py" "$out" "$mode" "$out/sglang_$mode" "$model" || echo "capture.sh: truth.py failed" >&2
  python3 -m capture.pack_fixture "$out/dump" "$out/sglang_$mode.tar.xz" --max-launches 100000000 \
      --max-cubin-bytes "${MAX_CUBIN_BYTES:-6000000}" | tail -1
  if [ -f "$out/sglang_$mode.tar.xz" ] && [ "$(stat -c %s "$out/sglang_$mode.tar.xz")" -gt 8000000 ]; then
    stamp "fixture over 8 MB: packed again with 2 MB of cubins"
    python3 -m capture.pack_fixture "$out/dump" "$out/sglang_$mode.tar.xz" --max-launches 100000000 \
        --max-cubin-bytes 2000000 | tail -1
  fi
  ls -la "$out"/sglang_"$mode".* 2>/dev/null
fi
exit $rc
