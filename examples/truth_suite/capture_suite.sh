#!/usr/bin/env bash
# The mining truth suite's real captures, on a GPU host with vLLM 0.26.0 importable (the offline
# kit's use.sh sourced) and this project built (`pip install -e .`):
#
#   examples/truth_suite/capture_suite.sh OUT_DIR [NAME ...]      (default: every capture below)
#
# Each capture differs from the others in what a detector could overfit on: layer count, GQA
# ratio, hidden size, vocabulary, tied or untied head, prompt count and lengths, decode length,
# engine mode. Each writes OUT_DIR/NAME.tar.xz (the packed dump, no closed-library cubins) and
# OUT_DIR/NAME.truth.json (what the program asked the engine to do, and the geometry).
set -uo pipefail
out=$(mkdir -p "${1:?usage: capture_suite.sh OUT_DIR [NAME ...]}" && cd "$1" && pwd); shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${MINE_SUITE_WORK:-/tmp/mine-suite}
mkdir -p "$work"
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mapfile -t suite < <(grep -v '^#' "$here/truth_suite/suite.txt")   # name|checkpoint flags|run flags
want=" $* "
for row in "${suite[@]}"; do
  IFS='|' read -r name ckpt runf <<<"$row"
  [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
  t0=$(date +%s)
  rm -rf "$work/$name" && mkdir -p "$work/$name"
  python3 "$here/vllm_qwen3/make_checkpoint.py" "$work/$name/model" $ckpt > "$work/$name/ckpt.log" 2>&1 \
    || { echo "$name: checkpoint failed"; tail -5 "$work/$name/ckpt.log"; continue; }
  ( cd "$here/vllm_qwen3" && VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 420 python3 -m mine.cli capture \
      -o "$work/$name/dump" -- python3 run_suite.py "$work/$name/model" "$work/$name/run.json" $runf ) \
      > "$work/$name/run.log" 2>&1
  rc=$?
  echo "$name: capture rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc = 0 ] || { tail -15 "$work/$name/run.log"; continue; }
  python3 - "$work/$name" "$out/$name.truth.json" <<'PY'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
run = json.loads((w / "run.json").read_text())
cfg = json.loads((w / "model" / "config.json").read_text())
keep = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "tie_word_embeddings")
json.dump({"engine": "vllm 0.26.0", "mode": run["mode"], "geometry": {k: cfg[k] for k in keep},
           "config": cfg, "requests": run["requests"]}, open(sys.argv[2], "w"), indent=1)
PY
  python3 -m capture.pack_fixture "$work/$name/dump" "$out/$name.tar.xz" \
      --max-launches 100000000 --max-cubin-bytes 8000000 | tail -2
  ls -la "$out/$name.tar.xz"
done
# the OpenAI server in vLLM's default mode, on q3d's checkpoint (examples/vllm_qwen3/run_serve.py)
if [ $# = 0 ] || [[ "$want" == *" q3ds "* ]]; then
  ( cd "$here/vllm_qwen3" && timeout 420 python3 -m mine.cli capture -o "$work/q3ds/dump" -- \
      python3 run_serve.py "$work/q3d/model" "$work/q3ds/serve.json" --default-mode ) > "$work/q3ds.log" 2>&1
  echo "q3ds: capture rc=$?"
  python3 -m capture.pack_fixture "$work/q3ds/dump" "$out/q3ds.tar.xz" --max-launches 100000000 \
      --max-cubin-bytes 8000000 | tail -1
fi
