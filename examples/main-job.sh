#!/usr/bin/env bash
# The main job on the bundled real dump: vLLM 0.26.0 serving a Qwen3 (0.6B geometry) on an H200,
# captured with `mine capture` (examples/vllm_qwen3/capture.sh). Analyse it, generate the kern
# manifest from it, verify the manifest and check every launch against the cubins vLLM ran.
#
#   examples/main-job.sh [OUT_DIR]        (default: out/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-out}
dump=tests/fixtures/vllm/vllm-offline.tar.xz
mkdir -p "$out"
mine analyze "$dump" --json "$out/analysis.json" --plot "$out/timeline.png" --trace "$out/trace.json"
mine gen qwen3 --dump "$dump" --config examples/vllm_qwen3/reference/config.json -o "$out/qwen3" --force
mine verify "$out/qwen3/qwen3.json"
mine abi "$out/qwen3/qwen3.json" --cubins "$out/qwen3/kernels"
if cmp -s "$out/qwen3/qwen3.json" manifests/qwen3/qwen3.json; then
    echo "the manifest equals the committed manifests/qwen3/qwen3.json byte for byte"
else
    echo "the manifest differs from the committed manifests/qwen3/qwen3.json" >&2
    exit 1
fi
