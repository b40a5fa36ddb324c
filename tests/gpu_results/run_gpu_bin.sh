#!/bin/bash
# The GPU session for the binary launch records (issue 2), run from the repository root on an H200:
#   bash tests/gpu_results/run_gpu_bin.sh OUT_DIR
# 1. builds the capture library through pip;
# 2. the gpu-marked capture tests, in both record forms (json and bin): the probe byte for byte,
#    the torch forward (ATen params, cuBLASLt GEMMs decoded, pointer words);
# 3. the allocation log against per-launch classification on real processes (three allocator
#    configurations): the loader's "check" mode counts words where the two disagree;
# 4. fixtures of the binary dumps; 5. the overhead matrix (launch loop + torch forward).
set -o pipefail
out=${1:?usage: run_gpu_bin.sh OUT_DIR}
# wheels the image lacks (pyelftools), when carried in .whl/
ls .whl/*.whl > /dev/null 2>&1 && python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > "$out/machine.txt"
pip install --no-build-isolation --no-deps -e . > "$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; exit 1; }
export MINE_GPU_DUMPS=/tmp/gd
timeout 400 python -m pytest -p no:cacheprovider -m gpu tests/capture/test_capture_gpu.py -v -rA 2>&1 | tail -45 > "$out/gpu_tests.log"
tail -25 "$out/gpu_tests.log"
lib=$(python -c "from capture import launcher; print(launcher.find_library())")
for conf in "" expandable_segments:True backend:cudaMallocAsync; do
  d=/tmp/alloclog_${conf:-default}; d=${d//:/_}
  env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR=$d \
      MINE_CAPTURE_ALLOC_LOG=1 python examples/torch_forward.py > /dev/null 2>&1
  python - "$d" "${conf:-default}" <<'PY'
import sys
from pathlib import Path
from mining.load import load_dump
d, conf = Path(sys.argv[1]), sys.argv[2]
pid = max(d.glob("pid*"), key=lambda p: p.stat().st_mtime)
x = load_dump(pid, cache=False)
ptr = x.params[x.params["is_ptr"]]
print(conf, "launches", len(x.launches), "pointer words", len(ptr), "alloc events", len(x.allocs),
      "warnings", x.warnings)
PY
done 2>&1 | tee "$out/alloclog.log"
for d in probe_bin torch_bin; do
  [ -d /tmp/gd/$d ] && python -m capture.pack_fixture /tmp/gd/$d "$out/$d.tar.xz" --max-launches 2000
done
(cd /tmp/gd && tar cJf "$out/truth_bin.tar.xz" probe_bin_truth.json probe_bin_truth.json.child.json) 2>/dev/null
timeout 330 python benchmarks/bench_capture.py --launches 100000 --repeats 5 --forwards 100 --forward-repeats 3 \
  --configs filtered,write_cls1,mmap_pf1_cls1,mmap_alloclog_cls0_compact,bin_write,bin_mmap_pf1,bin_mmap_pf0 \
  --json "$out/bench.json" 2>&1 | tail -5
