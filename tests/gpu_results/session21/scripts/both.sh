#!/bin/bash
# One device call for both: sg.sh (issue 21, SGLang graph mode to kern) within its limits, then
# batch_hf.sh (issue 17) with what is left of CALL_S (default 585 s). Carry KIT2/sgl and KIT2/kern.
T0=$(date +%s)
MODE=graph CAP_S=${CAP_S:-160} RUN_S=${RUN_S:-210} REPLAY_S=${REPLAY_S:-110} bash tests/gpu_results/session21/scripts/sg.sh
left=$(( ${CALL_S:-585} - ($(date +%s) - T0) ))
echo "batch_hf with $left s"
[ $left -gt 90 ] && CALL_S=$left bash tests/gpu_results/session21/scripts/batch_hf.sh
ls -la $OUT
