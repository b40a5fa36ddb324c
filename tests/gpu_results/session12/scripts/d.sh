#!/bin/bash
# call D: default-mode capture compiled + kern, then the benchmark
set -u
REPLAY_S=${REPLAY_S:-330} COMPARES=${COMPARES:-"full"} bash tests/gpu_results/session12/scripts/c.sh d
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
ms="--manifest compiled_default=/tmp/run_d/compiled"; [ -d /tmp/run_e/gen ] && ms="$ms --manifest gen_eager=/tmp/run_e/gen"; [ -d /tmp/run_e/compiled ] && ms="$ms --manifest compiled_eager=/tmp/run_e/compiled"
timeout ${BENCH_S:-200} python3 benchmarks/bench_decode_vs_vllm.py /tmp/ck /tmp/ref_d.json $OUT/bench_decode.json --mode default $ms --new 64 > $OUT/bench.log 2>&1; echo "bench rc=$?"; tail -20 $OUT/bench.log
