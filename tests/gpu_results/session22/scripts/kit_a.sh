#!/bin/bash
# The first of two chained calls for a vLLM run (the kit is over one call's 64 MiB): kit half a's
# vLLM part into /tmp/kit and its wheels into /tmp/vllm-deps, nothing else, so that the second
# call (session21/scripts/b17.sh, carrying KIT2/b) follows within the warm machine's 30 s.
set -u; T0=$(date +%s)
mkdir -p /tmp/kit /tmp/vllm-deps && cp KIT2/a/v.aa /tmp/kit/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/a/d/*.whl > $OUT/a_pip.log 2>&1
echo "pip a rc=$? in $(( $(date +%s) - T0 )) s"
