#!/bin/bash
# The gpu-marked pytest tests of capture and replay on a bare GPU host (carry KIT2/kern: the
# kern-llm wheel and pyelftools' package folder). TESTS_S bounds the run.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /tmp/deps && cp -r KIT2/kern/elftools /tmp/deps/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps KIT2/kern/*.whl > /dev/null 2>&1
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1; el "build rc=$?"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt
PYTHONPATH=/tmp/deps:$PWD timeout ${TESTS_S:-200} python3 -m pytest -q -rs -p no:cacheprovider tests/capture/test_capture_gpu.py \
  tests/replay/test_replay_gpu.py tests/replay/test_diff_kernel_source.py > $OUT/gpu_tests.log 2>&1; el "tests rc=$?"
tail -15 $OUT/gpu_tests.log
