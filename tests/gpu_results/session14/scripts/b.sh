#!/bin/bash
# call B: kit half b, a default-mode capture with its start-up snapshot, packed as a fixture (NO_PACK=1: not)
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/kit/v.aa /tmp/ck/config.json || exit 3
mkdir -p /tmp/vllm-site && cat /tmp/kit/v.aa KIT2/b/v.ab | tar xJ -C /tmp/vllm-site; el "untar rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/b/d/*.whl > $OUT/b_pip.log 2>&1; el "pip b rc=$?"
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
export MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1 MINE_CAPTURE_SNAPSHOT_BYTES=268435456
L=${LENGTHS:-"--lengths 1,29,88,163,7 --new 8 --seed 73 --max-model-len 2048"}
timeout 280 python3 -m mine.cli capture -o /tmp/cap_d -- python3 -m compare.record_vllm /tmp/ck /tmp/ref_d.json $L --mode default > $OUT/b_cap_d.log 2>&1; el "cap default rc=$?"
du -sh /tmp/cap_d; ls /tmp/cap_d
cp /tmp/ref_d.json $OUT/ 2>/dev/null; cp /tmp/ck/config.json $OUT/ck_config.json
[ -n "${NO_PACK:-}" ] || python3 capture/pack_fixture.py /tmp/cap_d $OUT/fix_d.tar.xz --max-launches 1000000 --max-cubin-bytes 8000000 > $OUT/b_pack.log 2>&1; el "pack rc=$?"
tail -n 5 $OUT/b_cap_d.log; ls -la $OUT
