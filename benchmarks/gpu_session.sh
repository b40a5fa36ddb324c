#!/usr/bin/env bash
# Everything that needs a GPU, in one run from the repository root (an H200 host with torch,
# transformers, nvcc; vLLM only for the last step):
#
#   bash benchmarks/gpu_session.sh OUT_DIR
#
# 1. capture: the gpu-marked tests, the probe/torch fixtures and the overhead matrix
#    (tests/gpu_results/run_gpu.sh; the matrix includes the alloc-log, no-classify configuration);
# 2. the offline pointer classification checked against recorded ptrs on real processes
#    (default allocator, expandable segments, cudaMallocAsync);
# 3. kern runs the committed Qwen3 manifest: tests/generators/test_qwen3_gpu.py (tokens equal vLLM's).
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$out/machine.txt"
bash tests/gpu_results/run_gpu.sh "$out" 2>&1 | tail -80 > "$out/capture.log"
lib=$(python -c "from capture import launcher; print(launcher.find_library())")
for conf in "" expandable_segments:True backend:cudaMallocAsync; do
  d=/tmp/alloclog_${conf:-default}; d=${d//:/_}
  env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR=$d \
      MINE_CAPTURE_ALLOC_LOG=1 python examples/torch_forward.py > /dev/null 2>&1
  python -c "from mining.load import load_dump; d=load_dump('$d', cache=False); print('${conf:-default}', d.warnings, d.meta.get('counters'))"
done 2>&1 | tee "$out/alloclog.log"
timeout 400 python -m pytest -q -m gpu tests/generators/test_qwen3_gpu.py -rA 2>&1 | tail -20 | tee "$out/qwen3_gpu.log"
