#!/bin/bash
# The GPU session for issue 2, run from the repository root on an H200 box:
#   bash tests/gpu_results/run_gpu.sh OUT_DIR
# Builds the capture library through pip, smoke-runs the launch loop under each capture mode,
# runs the gpu-marked capture tests, packs fixtures and runs the overhead benchmark.
set -o pipefail
out=${1:?usage: run_gpu.sh OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$out/machine.txt"
pip install --no-build-isolation --no-deps -e . > "$out/pip.log" 2>&1 || python setup.py build_ext --inplace >> "$out/pip.log" 2>&1
ls -la capture/libmine_capture.so || exit 1
lib=$PWD/capture/libmine_capture.so
b=/tmp/mcb; mkdir -p $b
nvcc -g -O2 -arch=sm_90 -o $b/bench_launch benchmarks/bench_launch.cu
for cfg in modules_only filtered full; do
  env=(CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR=$b/dump_$cfg)
  [ $cfg = modules_only ] && env+=(MINE_CAPTURE_MODULES_ONLY=1)
  [ $cfg = filtered ] && env+=(MINE_CAPTURE_INCLUDE=nothing_matches)
  env "${env[@]}" $b/bench_launch 2000; rc=$?
  echo "smoke $cfg rc=$rc"
  if [ $rc != 0 ]; then env "${env[@]}" cuda-gdb -batch -ex run -ex bt --args $b/bench_launch 2000 2>&1 | tail -30; fi
  head -c 1500 $b/dump_$cfg/pid*/launches.jsonl; echo; cat $b/dump_$cfg/pid*/meta.json | head -c 1500; echo
done 2>&1 | tee "$out/smoke.log"
export MINE_GPU_DUMPS=/tmp/gd
timeout 300 python -m pytest -m gpu tests/capture/test_capture_gpu.py -v -rA 2>&1 | tee "$out/gpu_tests.log" | tail -60
for d in probe torch; do [ -d /tmp/gd/$d ] && python -m capture.pack_fixture /tmp/gd/$d "$out/$d.tar.xz" --max-launches 2000; done
(cd /tmp/gd && tar cJf "$out/truth.tar.xz" probe_truth.json probe_truth.json.child.json)
timeout 240 python benchmarks/bench_capture.py --launches 100000 --repeats 3 --forwards 100 --json "$out/bench.json" 2>&1 | tail -40
