#!/usr/bin/env bash
# Record the references of compare_refs.txt again, on a GPU host with vLLM importable (the offline
# kit's use.sh sourced) and this project installed:
#
#   examples/vllm_qwen3/record_refs.sh WORK_DIR [NAME ...]     (default: every row)
#
# Each row: a seeded checkpoint (make_checkpoint.py) in WORK_DIR/NAME, then `mine reference` into
# WORK_DIR/ref_NAME.json. Two engines starting at once on one GPU can fail vLLM's KV-cache sizing,
# so they run one at a time. Commit the results as examples/vllm_qwen3/reference/compare-ref.json.xz
# (q06) and tests/fixtures/compare/ref_NAME.json.xz (xz -9).
set -uo pipefail
work=$(mkdir -p "${1:?usage: record_refs.sh WORK_DIR [NAME ...]}" && cd "$1" && pwd); shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0
want=" $* "
grep -v '^#' "$here/compare_refs.txt" | while IFS='|' read -r name ckpt flags; do
  [ $# -gt 0 ] && [[ "$want" != *" $name "* ]] && continue
  # shellcheck disable=SC2086
  python3 "$here/make_checkpoint.py" "$work/$name" $ckpt > "$work/ck_$name.log" 2>&1 \
    || { echo "$name: checkpoint failed"; tail -3 "$work/ck_$name.log"; continue; }
  # shellcheck disable=SC2086
  python3 -m mine.cli reference "$work/$name" -o "$work/ref_$name.json" $flags > "$work/ref_$name.log" 2>&1
  echo "$name: rc=$?"
done
