#!/bin/bash
# Issue 17 on one GPU, the call after session14's a.sh (kit half a, the capture library, the
# checkpoint in /tmp/ck; SKIP_TESTS=1): kit half b, then
#   1. vLLM eager under `mine capture` recording a reference of many requests of mixed lengths, each
#      alone (compare.record_vllm);
#   2. `mine gen qwen3 --max-seqs 64` from that capture: the batched manifest;
#   3. `mine compare --batch 16`: the requests 16 at a time through the batched decode, every row
#      judged against its own request (packed prefill first); and --batch 1 on the same manifest;
#   4. benchmarks/bench_batch_vs_vllm.py: output tokens/s at concurrency 1, 8, 32, 64, kern against
#      vLLM default mode, and the first token of a 2,048-token prompt.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/kit/v.aa /tmp/ck/config.json || exit 3
mkdir -p /tmp/vllm-site && cat /tmp/kit/v.aa KIT2/b/v.ab | tar xJ -C /tmp/vllm-site; el "untar rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/b/d/*.whl > $OUT/b_pip.log 2>&1; el "pip b rc=$?"
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1
L=${LENGTHS:-"1,5,17,29,40,63,88,100,120,140,163,175,200,230,260,300,7,13,50,77,150,190,250,280"}
rm -rf /tmp/cap_e /tmp/gen64
timeout ${CAP_S:-150} python3 -m mine.cli capture -o /tmp/cap_e -- python3 -m compare.record_vllm /tmp/ck /tmp/ref_b.json \
  --lengths $L --new ${NEW:-12} --seed 91 --mode eager > $OUT/cap_e.log 2>&1; el "capture eager rc=$?"
tail -3 $OUT/cap_e.log; cp /tmp/ref_b.json $OUT/ 2>/dev/null
timeout 120 python3 -m mine.cli gen qwen3 --dump /tmp/cap_e --config /tmp/ck/config.json -o /tmp/gen64 --weights /tmp/ck \
  --max-seqs 64 --force > $OUT/gen64.log 2>&1; el "gen rc=$?"; tail -3 $OUT/gen64.log
# the same reference with requests cut at different lengths (1..12 tokens), so sequences leave the batch as
# they finish: request k keeps its first 1 + (5k mod 12) tokens
python3 - <<'PY2'
import json
d = json.load(open("/tmp/ref_b.json"))
for k, r in enumerate(d["requests"]):
    n = 1 + (5 * k) % len(r["output"])
    r["output"], r["top"] = r["output"][:n], r["top"][:n]
json.dump(d, open("/tmp/ref_mixed.json", "w"))
PY2
for b in ${BATCHES:-16 1}; do
  ref=/tmp/ref_mixed.json; [ $b = 1 ] && ref=/tmp/ref_b.json
  timeout 150 python3 -m mine.cli compare /tmp/gen64 --weights /tmp/ck --reference $ref --batch $b \
    --no-free-running --json $OUT/compare_b$b.json > $OUT/compare_b$b.log 2>&1; el "compare --batch $b rc=$?"
  tail -4 $OUT/compare_b$b.log
done
left=$(( ${CALL_S:-590} - ($(date +%s) - T0) - 15 ))
el "benchmark with $left s"
[ $left -gt 120 ] && timeout $left python3 benchmarks/bench_batch_vs_vllm.py /tmp/ck /tmp/ref_b.json $OUT/bench_batch.json \
  --manifest /tmp/gen64 --mode default --concurrency ${CONC:-1,8,32,64} --new 64 --long-prompt 2048 > $OUT/bench.log 2>&1
el "bench rc=$?"; tail -30 $OUT/bench.log
cd $OUT && tar cJf batch.tar.xz --exclude='*.tar.xz' . && find . -maxdepth 1 -type f ! -name batch.tar.xz -delete; ls -la $OUT
