#!/bin/bash
# The issue-2 overhead matrix in one device call (repository root; OUT is the results folder):
#   bash tests/gpu_results/run_capture_matrix.sh OUT
# Builds the library through pip, runs benchmarks/bench_capture.py ({write, mmap} x prefault x
# classification on the launch loop and the torch forward), then the gpu-marked capture tests.
set -o pipefail
out=${1:?usage: run_capture_matrix.sh OUT}
export PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > "$out/machine.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 60 pip install --no-build-isolation --no-deps -e . >> "$out/pip.log" 2>&1 || \
  timeout 40 python3 setup.py build_ext --inplace >> "$out/pip.log" 2>&1
ls -la capture/libmine_capture.so >> "$out/pip.log" || { tail -20 "$out/pip.log"; exit 1; }
s=$(date +%s)
timeout 85 python3 benchmarks/bench_capture.py --launches 100000 --repeats 2 --forwards 100 \
  --json "$out/bench.json" > "$out/bench.log" 2>&1; echo "bench rc=$? $(( $(date +%s) - s ))s"
s=$(date +%s)
MINE_GPU_DUMPS=/tmp/gd timeout 45 python3 -m pytest -q -m gpu tests/capture/test_capture_gpu.py -rA \
  > "$out/gpu_tests.log" 2>&1; echo "tests rc=$? $(( $(date +%s) - s ))s"
python3 - > "$out/dump_check.txt" 2>&1 <<'PY'
import json, pathlib
for d in sorted(pathlib.Path("/tmp/gd").glob("*/pid*")):
    L = [json.loads(x.rpartition("\0")[2]) for x in (d / "launches.jsonl").read_text().splitlines() if x.strip("\0")]
    t = (d / "tensormaps.jsonl").read_text().count("\n") if (d / "tensormaps.jsonl").exists() else 0
    print(d, "launches", len(L), "with ptrs", sum(any("ptrs" in p for p in r["params"]) for r in L),
          "with tmap", sum(any("tmap" in p for p in r["params"]) for r in L), "tensormaps", t,
          "host", sum(any("host" in p for p in r["params"]) for r in L))
PY
tail -3 "$out/gpu_tests.log"; cat "$out/dump_check.txt" | head; python3 -c "
import json; d=json.load(open('$out/bench.json')); print(json.dumps({k: d.get(k) for k in ('loop','forward')})[:6000])"
