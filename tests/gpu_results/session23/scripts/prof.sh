#!/bin/bash
# Session 23, issue 17: where the batched step and the prefill go on both engines, in one run. The
# call after session22/scripts/kit_a.sh (kit half a), carrying KIT2/b: kit half b, then
# session21/scripts/batch_hf.sh with no compares (SKIP_CMP), the batched manifest only, and the
# benchmark against vLLM default mode profiling both engines at concurrency 64 (--profile-at) and
# the 2,048-token prefill.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/kit/v.aa || exit 3
mkdir -p /tmp/vllm-site && cat /tmp/kit/v.aa KIT2/b/v.ab | tar xJ -C /tmp/vllm-site; el "untar rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/b/d/*.whl > $OUT/b_pip.log 2>&1; el "pip b rc=$?"
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
[ -n "${PROBE:-}" ] && { timeout 120 bash tests/gpu_results/session23/scripts/probe.sh; el "probe"; }
NO_PIP=1 SKIP_CMP=1 ONLY_B16=${ONLY_B16:-} SEQS=64 CK=/tmp/ck CALL_S=$(( ${CALL_S:-585} - ($(date +%s) - T0) )) \
  BENCH_ARGS="--mode default --long-prompt 2048 --profile-at ${PROF_AT:-64}" CONC=${CONC:-1,8,32,64} \
  bash tests/gpu_results/session21/scripts/batch_hf.sh
