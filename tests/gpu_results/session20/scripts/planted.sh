#!/bin/bash
# Issue 22's target (3) in one device call: the planted Triton engine served by
# examples/planted/serve.py (its own checkpoint and reference), run once plain and once under
# `mine capture` (copies, host pointees, a start-up snapshot), then run_compile_kern.sh: analysis,
# an in-order replay window (flow and contents), `mine compile --weights --requests`, and
# `mine compare` of the compiled manifest on kern against the captured run's own reference.
# Carry KIT2/kern: the kern-llm wheel and pyelftools' package folder.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /tmp/deps && cp -r KIT2/kern/elftools /tmp/deps/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps KIT2/kern/*.whl > $OUT/pip.log 2>&1; el "pip rc=$?"
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1; el "build rc=$?"
export PYTHONPATH=/tmp/deps:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt
L=${SERVE_ARGS:-"--lengths 7,33,90,150 --new 8"}
rm -rf /tmp/ck_plain /tmp/ckp /tmp/cap_p /tmp/run_p
timeout 90 python3 examples/planted/serve.py /tmp/ck_plain /tmp/ref_plain.json $L > $OUT/plain.log 2>&1; el "plain rc=$?"
tail -3 $OUT/plain.log
MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1 \
  timeout 150 python3 -m mine.cli capture -o /tmp/cap_p -- python3 examples/planted/serve.py /tmp/ckp /tmp/ref_p.json $L \
  > $OUT/cap.log 2>&1; el "capture rc=$?"
tail -4 $OUT/cap.log
python3 - <<'PY' > $OUT/plain_vs_captured.txt 2>&1
import json
a, b = (json.load(open(p))["requests"] for p in ("/tmp/ref_plain.json", "/tmp/ref_p.json"))
same = [x["output"] == y["output"] and x["top"] == y["top"] for x, y in zip(a, b)]
print(f"plain vs captured run: {sum(same)} of {len(same)} requests with equal tokens and top-k log-probabilities")
PY
cat $OUT/plain_vs_captured.txt
d=$(ls -d /tmp/cap_p/pid* | head -1)
COMPARES=${COMPARES:-"rows0 full"} REPLAY_S=${REPLAY_S:-200} DUMP=$d CKPT=/tmp/ckp REF=/tmp/ref_p.json \
  timeout ${RUN_S:-380} bash tests/gpu_results/run_compile_kern.sh /tmp/run_p; el "chain rc=$?"
python3 capture/pack_fixture.py /tmp/cap_p $OUT/fix_p.tar.xz --max-launches 1000000 --max-cubin-bytes 8000000 --snapshot-bytes 64000000 > $OUT/pack.log 2>&1
el "pack rc=$?"
# one file back (a call returns at most 8): logs, the reference, the checkpoint, the chain's folder
mkdir -p /tmp/back && cp -r $OUT/* /tmp/ref_p.json /tmp/ref_plain.json /tmp/ckp /tmp/back/ 2>/dev/null
cp -r /tmp/run_p /tmp/back/run_p 2>/dev/null; rm -rf /tmp/back/run_p/compiled/weights /tmp/back/run_p/*/kernels
rm -f $OUT/*; tar cJf $OUT/planted.tar.xz -C /tmp/back . ; ls -la $OUT
