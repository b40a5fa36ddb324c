#!/bin/bash
# call C: the default-mode capture replayed in graph order, compiled, and run on kern (mine compare)
set -u
ls /tmp/cap_d /tmp/ck/config.json >/dev/null || exit 3
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
d=$(ls -d /tmp/cap_d/pid* | head -1)
for p in /tmp/cap_d/pid*; do [ -s $p/launches.bin -o -s $p/launches.jsonl ] && d=$p; done
TARGET=${TARGET:-} DUMP=$d CKPT=/tmp/ck REF=/tmp/ref_d.json REPLAY_S=${REPLAY_S:-400} COMPARES=${COMPARES:-"full"} \
  timeout ${RUN_S:-560} bash tests/gpu_results/run_compile_kern.sh /tmp/run_d; echo "run rc=$?"
cd /tmp/run_d && tar cJf $OUT/run_d.tar.xz --exclude='*.safetensors' . ; ls -la $OUT
