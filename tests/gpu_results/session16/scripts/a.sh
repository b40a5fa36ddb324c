#!/bin/bash
# call A: kit half a, the capture library built, the checkpoint, the replay's GPU tests
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /tmp/kit /tmp/vllm-deps && cp KIT2/a/v.aa /tmp/kit/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/a/d/*.whl > $OUT/a_pip.log 2>&1; el "pip a rc=$?"
python3 setup.py build_ext --inplace > $OUT/a_build.log 2>&1; el "build rc=$?"
mkdir -p /tmp/build && cp capture/*.so /tmp/build/
python3 examples/vllm_qwen3/make_checkpoint.py /tmp/ck ${CKPT_ARGS:---layers 4 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 --inter 1408 --vocab 16384} > $OUT/a_ck.log 2>&1; el "ckpt rc=$?"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt
[ -n "${SKIP_TESTS:-}" ] || PYTHONPATH=/tmp/vllm-deps:$PWD timeout ${TESTS_S:-240} python3 -m pytest -q -rs tests/replay/test_replay_gpu.py tests/replay/test_diff_kernel_source.py > $OUT/a_replay_gpu.log 2>&1; el "replay gpu tests rc=$?"; tail -8 $OUT/a_replay_gpu.log
