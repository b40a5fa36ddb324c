#!/bin/bash
# calls C and D in one (a small device budget): session14's c.sh, then, only where the compiled
# default-mode manifest passed `mine compare` at full rows, the benchmark against vLLM default mode
set -u
T0=$(date +%s)
RUN_S=${RUN_S:-320} COMPARES=${COMPARES:-full} bash tests/gpu_results/session14/scripts/c.sh
ok=$(python3 -c "import json,sys; print(json.load(open('/tmp/run_d/compare_full.json'))['passed'])" 2>/dev/null)
echo "compare full passed: ${ok:-no result}"
left=$(( ${CALL_S:-590} - ($(date +%s) - T0) - 10 ))
if [ "$ok" = True ] && [ $left -gt 90 ]; then echo "benchmark with ${left} s"; BENCH_S=$left bash tests/gpu_results/session14/scripts/d.sh
else echo "no benchmark (passed: ${ok:-no result}, ${left} s left)"; fi
ls -la $OUT
