#!/bin/bash
# Where the per-launch cost of the binary form goes, on the H200 host (one device call):
#   bash tests/gpu_results/run_loop.sh OUT_DIR
# the C harness cost of building + writing a record (no GPU), the clock source, and the launch
# loop alone: 15 interleaved repeats, pinned to one core.
set -o pipefail
out=${1:?usage: run_loop.sh OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc;
  cat /sys/devices/system/clocksource/clocksource0/current_clocksource; } > "$out/machine_loop.txt"
pip install --no-build-isolation --no-deps -e . > /dev/null 2>&1 || exit 1
timeout 200 python -m pytest -p no:cacheprovider -q -s tests/capture/test_capture_bin.py 2>&1 | tail -16 > "$out/harness_cost.txt"
timeout 300 python benchmarks/bench_capture.py --launches 200000 --repeats 11 --forwards 0 --pin 3 \
  --configs noop,filtered,write_cls1,bin_mmap_pf1,filtered_self,write_cls1_self,bin_mmap_pf1_self --json "$out/bench_loop.json" 2>&1 | tail -3
cat "$out/machine_loop.txt" "$out/harness_cost.txt"
