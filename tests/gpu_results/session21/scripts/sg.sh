#!/bin/bash
# Issue 21 on one GPU, in one device call: SGLang serving the q3d checkpoint under `mine capture`
# (copy log, host pointees, a snapshot signalled once the server is up, and the answers' top-k
# log-probabilities written as the mine reference: the captured run is the reference), then
# run_compile_kern.sh: analysis, an in-order replay window (flow and contents), `mine compile
# --weights --requests`, and `mine compare` of the compiled manifest on kern against that reference.
# Carry KIT2/sgl (shared tools' SGLang kit) and KIT2/kern (the kern-llm wheel, pyelftools).
#   MODE=graph|eager (graph)  NEW=8 (new tokens a prompt)  CAP_S=230  RUN_S=250  COMPARES="rows0 full"
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
MODE=${MODE:-graph}; W=/tmp/sg21/$MODE; ck=/tmp/sg21/model
export PYTHONUNBUFFERED=1
mkdir -p /tmp/deps "$W"
cp -r KIT2/kern/elftools /tmp/deps/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps KIT2/kern/*.whl > $OUT/pip.log 2>&1; el "pip rc=$?"
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1; el "build rc=$?"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/machine.txt
[ -f $ck/config.json ] || python3 examples/vllm_qwen3/make_checkpoint.py $ck \
  $(grep "^q3d|" examples/truth_suite/suite.txt | cut -d'|' -f2) > $OUT/ck.log 2>&1; el "checkpoint rc=$?"
rm -rf "$W/dump"
( source KIT2/sgl/use.sh > $OUT/kit.log 2>&1; export PYTHONPATH=$PYTHONPATH:$PWD
  flags=(--mode $MODE --reference $W/ref.json --snapshot --new ${NEW:-8} --port 30011 --log $W/server.log
         --pidfile $W/server.pid --startup-timeout 240)
  MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1 \
  MINE_CAPTURE_SNAPSHOT_BYTES=4294967296 timeout -k 20 ${CAP_S:-230} python3 -c '
import sys; from pathlib import Path; from capture.launcher import run_capture
code, procs = run_capture(sys.argv[2:], Path(sys.argv[1]), format="bin", writer="mmap")
for s in procs:
    print(f"mine capture: pid {s.pid}: {s.launches} launches, {s.kernels} kernels, {s.cubins} cubins, "
          + ("exited cleanly" if s.duration_s is not None else "did not exit cleanly"), file=sys.stderr)
sys.exit(code)' "$W/dump" python3 examples/sglang_qwen3/run_serve.py $ck $W/run.json "${flags[@]}" ) > $W/capture.log 2>&1
el "capture rc=$?"; tail -6 $W/capture.log
pid=$(cat $W/server.pid 2>/dev/null) && kill -KILL -- -$pid 2>/dev/null
d=$(ls -S $W/dump/pid*/launches.bin 2>/dev/null | head -1); d=${d%/launches.bin}
echo "scheduler dump: ${d:-none}"; [ -n "$d" ] && grep -h '"event": "end"' $d/snapshot.jsonl | head -c 600; echo
export PYTHONPATH=/tmp/deps:$PWD
if [ -n "$d" ] && [ -s $W/ref.json ]; then
  COMPARES=${COMPARES:-"rows0 full"} REPLAY_S=${REPLAY_S:-200} DUMP=$d CKPT=$ck REF=$W/ref.json TARGET=${TARGET:-} \
    timeout ${RUN_S:-250} bash tests/gpu_results/run_compile_kern.sh $W/run; el "chain rc=$?"
fi
[ -n "$d" ] && python3 capture/pack_fixture.py $W/dump $OUT/sglang_${MODE}_kern.tar.xz --max-launches 100000000 \
  --max-cubin-bytes 6000000 > $OUT/pack.log 2>&1; el "pack rc=$?"
mkdir -p /tmp/back && rm -rf /tmp/back/* && cp $OUT/*.log $OUT/machine.txt /tmp/back/ 2>/dev/null
cp $W/*.json $W/*.log /tmp/back/ 2>/dev/null; cp $ck/config.json /tmp/back/ckpt_config.json
cp -r $W/run /tmp/back/run 2>/dev/null; rm -rf /tmp/back/run/*/weights /tmp/back/run/*/kernels
rm -f $OUT/*.log $OUT/machine.txt; tar cJf $OUT/sg_$MODE.tar.xz -C /tmp/back . ; ls -la $OUT
