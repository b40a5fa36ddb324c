#!/bin/bash
# The GPU check of issue 16's capture half (callbacks.c split by concept, the per-API tables of
# vocab/capture_tables.py), run from the repository root on an H200 box:
#   bash tests/gpu_results/run_capture_tables.sh OUT_DIR
# Builds the library, checks the generated header, runs the gpu-marked capture tests (the probe
# and a PyTorch forward in both record forms, the probe under MINE_CAPTURE_TOGGLE_MS), then a
# launch loop under the toggler in both forms, whose dump must load with its meta.json toggles.
set -o pipefail
out=${1:?usage: run_capture_tables.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD; } > "$out/machine.txt"
python setup.py build_ext --inplace > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
python -m vocab.capture_tables --check || exit 1
timeout 900 python -m pytest -m gpu tests/capture/test_capture_gpu.py -v -rA 2>&1 | tee "$out/gpu_tests.log" | tail -40
b=$(mktemp -d)
nvcc -O2 -arch=sm_90 -o "$b/bench_launch" benchmarks/bench_launch.cu || exit 1
for fmt in json bin; do
  CUDA_INJECTION64_PATH=$PWD/capture/libmine_capture.so MINE_CAPTURE_DIR="$b/dump_$fmt" MINE_CAPTURE_FORMAT=$fmt \
    MINE_CAPTURE_TOGGLE_MS=5 "$b/bench_launch" 200000 > "$b/loop_$fmt.log" 2>&1
  echo "toggle $fmt rc=$?"
  python - "$b/dump_$fmt" <<'PY'
import sys
from mining.load import load_dump
d = load_dump(sys.argv[1], cache=False)
t = d.meta.get("toggles", [])
c = d.meta["counters"]
print(f"launches seen {c['launches']}, recorded {c['launches_recorded']}, read {len(d.launches)}, "
      f"toggles {len(t)} (first {t[:2]}), errors {c['errors']}, warnings {d.warnings}")
assert t and [on for _, on in t] == [i % 2 for i in range(len(t))] and len(d.launches) == c["launches_recorded"]
PY
done 2>&1 | tee "$out/toggle.log"
