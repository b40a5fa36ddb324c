#!/usr/bin/env bash
# Redo the reference vLLM capture in one command, on a machine with an NVIDIA GPU, vLLM 0.26.0 and
# this project installed (`pip install -e .` builds the injection library):
#
#   examples/vllm_qwen3/capture.sh OUT_DIR
#
# 1. writes a Qwen3 checkpoint with the 0.6B geometry and seeded random weights (OUT_DIR/qwen3);
# 2. captures vLLM in-process (eager, TRITON_ATTN) serving the four prompts (OUT_DIR/dump-offline);
# 3. captures the OpenAI server the way users start it, engine in a child process
#    (OUT_DIR/dump-serve), sending the same prompts as token ids;
# 4. packs both dumps into small fixtures without NVIDIA closed-library cubins.
set -euo pipefail
out=$(mkdir -p "${1:?usage: capture.sh OUT_DIR}" && cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export VLLM_USE_FLASHINFER_SAMPLER=0
[ -f "$out/qwen3/model.safetensors" ] || python3 "$here/make_checkpoint.py" "$out/qwen3"
cd "$here"
VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 -m mine.cli capture -o "$out/dump-offline" -- \
    python3 run_offline.py "$out/qwen3" "$out/offline.json"
env -u VLLM_ENABLE_V1_MULTIPROCESSING python3 -m mine.cli capture -o "$out/dump-serve" -- \
    python3 run_serve.py "$out/qwen3" "$out/serve.json"
for d in offline serve; do
    python3 -m capture.pack_fixture "$out/dump-$d" "$out/vllm-$d.tar.xz" \
        --max-launches 100000000 --max-cubin-bytes 40000000
done
