#!/bin/bash
# call C/D: compile + kern on one capture: which=e|d
set -u; w=${1:?}
ls /tmp/cap_$w /tmp/ck/config.json >/dev/null || exit 3
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
d=$(ls -d /tmp/cap_$w/pid* | head -1)
for p in /tmp/cap_$w/pid*; do [ -s $p/launches.bin -o -s $p/launches.jsonl ] && d=$p; done
DUMP=$d CKPT=/tmp/ck REF=/tmp/ref_$w.json REPLAY_S=${REPLAY_S:-330} COMPARES=${COMPARES:-"rows0 full gen"} bash tests/gpu_results/run_compile_kern.sh /tmp/run_$w
python3 capture/pack_fixture.py /tmp/cap_$w /tmp/run_$w/fixture.tar.xz --max-launches 1000000 --max-cubin-bytes 8000000 > /tmp/run_$w/pack.log 2>&1
cd /tmp/run_$w && tar cJf $OUT/run_$w.tar.xz --exclude='*.safetensors' --exclude='fixture.tar.xz' . ; cp fixture.tar.xz $OUT/fix_$w.tar.xz; ls -la $OUT
