#!/bin/bash
# call D: the benchmark: vLLM default mode against kern on the compiled default-mode manifest
set -u
ls /tmp/run_d/compiled /tmp/ck/config.json >/dev/null || exit 3
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
timeout ${BENCH_S:-300} python3 benchmarks/bench_decode_vs_vllm.py /tmp/ck /tmp/ref_d.json $OUT/bench_decode.json --mode default \
  --manifest compiled_default=/tmp/run_d/compiled --new 64 ${BENCH_ARGS:-} > $OUT/bench.log 2>&1; echo "bench rc=$?"; tail -25 $OUT/bench.log
