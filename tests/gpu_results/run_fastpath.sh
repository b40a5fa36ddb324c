#!/bin/bash
# The launch path after the fast-path work (issue 2's overhead goal), on an H200, two device calls:
#   bash tests/gpu_results/run_fastpath.sh OUT_DIR loop [BEFORE_LIB]   install, GPU tests, CPU record path, launch loop
#   bash tests/gpu_results/run_fastpath.sh OUT_DIR forward [BEFORE_LIB]  the torch forward (machine still warm)
# BEFORE_LIB: the library built from an earlier commit, run interleaved as <config>@before.
# Processes are pinned to two cores: the mmap writer's helper thread must not share the
# launching core (docs/benchmarks.md).
set -o pipefail
out=${1:?usage: run_fastpath.sh OUT_DIR loop|forward [BEFORE_LIB]}; what=${2:?}; before=${3:-}
ls .whl/*.whl > /dev/null 2>&1 && python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [ "$what" = loop ]; then
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc;
    grep -m1 "model name" /proc/cpuinfo; cat /sys/devices/system/clocksource/clocksource0/current_clocksource; } \
    > "$out/machine.txt"
  pip install --no-build-isolation --no-deps -e . > "$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; exit 1; }
  export MINE_GPU_DUMPS=/tmp/gd
  timeout 200 python -m pytest -p no:cacheprovider -m gpu tests/capture/test_capture_gpu.py tests/capture/test_capture_dispatch.py \
    -v -rA 2>&1 | tail -40 > "$out/gpu_tests.log"
  tail -3 "$out/gpu_tests.log"
  timeout 150 python benchmarks/bench_record_path.py --launches 20000 --repeats 5 --cpus 2,3 \
    --json "$out/record_path.json" 2>&1 | tail -18
  timeout 330 python benchmarks/bench_capture.py --launches 200000 --repeats 7 --forwards 0 --pin 2,3 \
    --configs noop,bin_mmap_pf1,noop_toggle,bin_mmap_pf1_toggle,bin_mmap_pf1_alt,bin_mmap_pf1_self ${before:+--before-lib $before} \
    --json "$out/bench_loop.json" > /dev/null 2>&1
  python -c "import json,sys; d=json.load(open(sys.argv[1]))['loop']; print(json.dumps({k: d[k] for k in ('paired_added_us','self_ns_per_launch','in_process_added_us','in_process_toggle_us')}, indent=1))" "$out/bench_loop.json"
else
  timeout 560 python benchmarks/bench_capture.py --launches 10000 --repeats 1 --forwards 100 --forward-repeats 3 \
    --pin 2,3 --configs bin_mmap_pf1,noop_toggle,bin_mmap_pf1_toggle ${before:+--before-lib $before} --json "$out/bench_forward.json" > /dev/null 2>&1
  python -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d['forward'][k] for k in ('paired_ratio_eager','ratio_graph','in_process_toggle')}, indent=1), d.get('forward_error'))" "$out/bench_forward.json"
fi
