#!/bin/bash
# On a machine where session14's a.sh and b.sh ran (kit unpacked in /tmp): a default-mode capture
# whose first prompt is 2,048 tokens, so the compiled prefill program covers 2,048 rows; then
# session18's cd.sh (replay, compile, compare at full rows, the benchmark with --long-prompt 2048).
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/vllm-site/vllm /tmp/ck/config.json >/dev/null || exit 3
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
rm -rf /tmp/cap_d /tmp/run_d /tmp/ref_d.json
MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1 MINE_CAPTURE_SNAPSHOT_BYTES=268435456 \
  timeout 200 python3 -m mine.cli capture -o /tmp/cap_d -- python3 -m compare.record_vllm /tmp/ck /tmp/ref_d.json \
  ${LENGTHS:---lengths 2048,163,5 --new 8 --seed 73 --max-model-len 4096} --mode default > $OUT/b_cap_long.log 2>&1
el "capture rc=$?"; cp /tmp/ref_d.json $OUT/ref_long.json 2>/dev/null
left=$(( ${CALL_S:-585} - ($(date +%s) - T0) ))
CALL_S=$left RUN_S=${RUN_S:-300} BENCH_ARGS="--long-prompt 2048" bash tests/gpu_results/session18/scripts/cd.sh
