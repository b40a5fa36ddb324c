#!/bin/bash
# Capture overhead on an H200, one device call: bash tests/gpu_results/run_overhead.sh OUT_DIR
# Builds the library through pip, then the overhead matrix pinned to one core: 7 interleaved
# repeats of 200k launches per configuration, 4 interleaved repeats of the torch forward.
set -o pipefail
out=${1:?usage: run_overhead.sh OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > "$out/machine.txt"
pip install --no-build-isolation --no-deps -e . > "$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; exit 1; }
timeout 420 python benchmarks/bench_capture.py --launches 200000 --repeats 7 --forwards 100 --forward-repeats 4 \
  --pin 3 --configs noop,filtered,write_cls1,bin_write,bin_mmap_pf1,bin_mmap_pf0 \
  --json "$out/bench_overhead.json" 2>&1 | tail -3
