#!/bin/bash
# The on-device serving loop (compare.host.KernHost.decode_on_device) on the planted engine's
# compiled manifest (planted/compiled_manifest.json, its cubins from tests/fixtures/compile/tri_serve):
# serve.py writes the checkpoint and reference again (the same seed), `mine compare` checks the
# manifest, then the benchmark times kern's graph replay, host loop and device loop (--skip-vllm).
# Carry KIT2/kern (the kern-llm wheel and pyelftools' package folder).
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /tmp/deps && cp -r KIT2/kern/elftools /tmp/deps/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps KIT2/kern/*.whl > $OUT/pip.log 2>&1; el "pip rc=$?"
export PYTHONPATH=/tmp/deps:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt
timeout 90 python3 examples/planted/serve.py /tmp/ckp /tmp/ref_p.json --lengths 7,33,90,150 --new 8 > $OUT/serve.log 2>&1; el "serve rc=$?"
M=/tmp/tri_m; rm -rf $M /tmp/fx; mkdir -p $M/kernels /tmp/fx
tar xJf tests/fixtures/compile/tri_serve.tar.xz -C /tmp/fx && cp /tmp/fx/*/cubins/*.cubin $M/kernels/ 2>/dev/null || cp $(find /tmp/fx -name '*.cubin') $M/kernels/
cp tests/gpu_results/session20/planted/compiled_manifest.json $M/manifest.json
timeout 120 python3 -m mine.cli compare $M --weights /tmp/ckp --reference /tmp/ref_p.json --json $OUT/compare.json > $OUT/compare.log 2>&1
el "compare rc=$?: $(tail -1 $OUT/compare.log)"
timeout 200 python3 benchmarks/bench_decode_vs_vllm.py /tmp/ckp /tmp/ref_p.json $OUT/bench.json --skip-vllm \
  --manifest tri_serve=$M --prompt-len 100 --new 64 > $OUT/bench.log 2>&1; el "bench rc=$?"
tail -30 $OUT/bench.log
