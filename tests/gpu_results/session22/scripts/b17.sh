#!/bin/bash
# Issue 17 with vLLM, the call after session22/scripts/kit_a.sh (kit half a;
# batch_hf.sh writes the Qwen3-0.6B-geometry checkpoint in /tmp/ck): kit half b (vLLM, its deps and kern-llm), then
# batch_hf.sh on that checkpoint (the batched manifest from the bundled capture judged per
# sequence against transformers) with its benchmark against vLLM default mode in the same run.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/kit/v.aa || exit 3   # the checkpoint is written by batch_hf.sh when missing
mkdir -p /tmp/vllm-site && cat /tmp/kit/v.aa KIT2/b/v.ab | tar xJ -C /tmp/vllm-site; el "untar rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/b/d/*.whl > $OUT/b_pip.log 2>&1; el "pip b rc=$?"
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
NO_PIP=1 CK=/tmp/ck CALL_S=$(( ${CALL_S:-585} - ($(date +%s) - T0) )) BENCH_ARGS="--mode default --long-prompt 2048" \
  bash tests/gpu_results/session21/scripts/batch_hf.sh
