#!/bin/bash
# Issue 17 on one GPU without vLLM on the host, in one device call: the batched manifest
# (`mine gen qwen3 --max-seqs 64`) from the bundled vLLM capture (tests/fixtures/vllm/vllm-offline,
# Qwen3-0.6B geometry, its vLLM cubins), judged per sequence on kern against a reference recorded
# by Hugging Face transformers (compare.record_hf) on a seeded checkpoint of that geometry:
#   1. checkpoint, reference of 24 requests of mixed prompt lengths (each alone, 12 new tokens);
#   2. gen --max-seqs 64, and gen --max-seqs 1 (the one-sequence manifest, as a baseline);
#   3. mine compare --batch 16 on the reference with requests cut at different lengths (sequences
#      leave the batch as they finish; prompts land in packed prefill calls), --batch 1 on the full
#      reference, and the one-sequence manifest on it;
#   4. kern's output tokens/s at concurrency 1, 8, 32, 64 (bench_batch_vs_vllm --skip-vllm).
# Carry KIT2/kern (the kern-llm wheel, pyelftools).
# Everything lands in H (default /tmp/hfout) and is packed into $OUT/batch_hf.tar.xz after every step,
# so a call cut by its time limit still brings back what was done. CALL_S: seconds this script may use.
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
H=${H:-/tmp/hfout}; rm -rf $H; mkdir -p $H; O=$OUT; OUT=$H
pack() { cp /tmp/ref_hf.json /tmp/ref_mixed.json $OUT/ 2>/dev/null; tar cJf $O/batch_hf.tar.xz -C $H . 2>/dev/null; }
left() { echo $(( ${CALL_S:-300} - ($(date +%s) - T0) - ${1:-10} )); }
if [ -z "${NO_PIP:-}" ]; then   # NO_PIP=1: kern-llm and pyelftools are on PYTHONPATH already (b17.sh)
  mkdir -p /tmp/deps && cp -r KIT2/kern/elftools /tmp/deps/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps KIT2/kern/*.whl > $OUT/pip.log 2>&1; el "pip rc=$?"
  export PYTHONPATH=/tmp/deps:$PWD
fi
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/machine.txt
ck=${CK:-/tmp/ck06}; D=tests/fixtures/vllm/vllm-offline.tar.xz
[ -f $ck/config.json ] || python3 examples/vllm_qwen3/make_checkpoint.py $ck --seed 5 > $OUT/ck.log 2>&1; el "checkpoint rc=$?"
L=${LENGTHS:-"1,5,17,29,40,63,88,100,120,140,163,175,200,230,260,300,7,13,50,77,150,190,250,280"}
timeout $(left 60) python3 -m compare.record_hf $ck /tmp/ref_hf.json --lengths $L --new ${NEW:-12} --seed 91 > $OUT/ref.log 2>&1
el "reference rc=$?"; tail -2 $OUT/ref.log; pack
python3 - <<'PY'
import json
d = json.load(open("/tmp/ref_hf.json"))
for k, r in enumerate(d["requests"]):
    n = 1 + (5 * k) % len(r["output"])
    r["output"], r["top"] = r["output"][:n], r["top"][:n]
json.dump(d, open("/tmp/ref_mixed.json", "w"))
PY
for s in ${SEQS:-64 1}; do
  timeout $(left 30) python3 -m mine.cli gen qwen3 --dump $D --config $ck/config.json -o /tmp/g$s --weights $ck --max-seqs $s \
    --force > $OUT/gen$s.log 2>&1; el "gen --max-seqs $s rc=$?"; tail -2 $OUT/gen$s.log
done
run_cmp() {  # NAME MANIFEST REF ARGS...
  local n=$1 m=$2 r=$3; shift 3
  timeout $(left 5) python3 -m mine.cli compare $m --weights $ck --reference $r "$@" --json $OUT/compare_$n.json \
    > $OUT/compare_$n.log 2>&1; el "compare $n rc=$?"; tail -3 $OUT/compare_$n.log; pack
}
if [ -n "${ONLY_B16:-}" ]; then   # ONLY_B16=1: the batched compare alone (then the benchmark)
  run_cmp b16_mixed /tmp/g64 /tmp/ref_mixed.json --batch 16
elif [ -z "${SKIP_CMP:-}" ]; then   # SKIP_CMP=1: the benchmark only
  run_cmp b16_mixed /tmp/g64 /tmp/ref_mixed.json --batch 16
  run_cmp one_seq /tmp/g1 /tmp/ref_hf.json --no-free-running
  run_cmp b1 /tmp/g64 /tmp/ref_hf.json --no-free-running
fi
lt=$(left 10); el "kern throughput with $lt s"
[ $lt -gt 40 ] && timeout $lt python3 benchmarks/bench_batch_vs_vllm.py $ck /tmp/ref_hf.json $OUT/bench_kern.json \
  --manifest /tmp/g64 ${BENCH_ARGS:---skip-vllm} --concurrency ${CONC:-1,8,32,64} --new 64 > $OUT/bench.log 2>&1
el "bench rc=$?"; tail -25 $OUT/bench.log
cp $ck/config.json $OUT/ 2>/dev/null; cp /tmp/g64/qwen3.json $OUT/g64.json; pack; ls -la $O
