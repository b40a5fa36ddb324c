#!/usr/bin/env bash
# Capture the planted-truth programs on a GPU host with torch and triton (this project built):
#   examples/planted/capture.sh OUT_DIR
# Writes OUT_DIR/<name>.tar.xz (packed dump) and OUT_DIR/<name>.truth.json (written by the program).
set -uo pipefail
out=$(mkdir -p "${1:?usage: capture.sh OUT_DIR}" && cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${MINE_SUITE_WORK:-/tmp/mine-suite}
export PYTHONUNBUFFERED=1
runs=(
  "tri_mixed|--layers 2,3 --prompts 5,23,77 --decode 5 --graph-decode 3"
  "tri_dense|--layers 6,0 --prompts 9,130 --decode 7 --graph-decode 0 --profile 1024 --warmups 128,16,1 --hidden 128 --inter 256 --vocab 2048"
  "tri_gated|--layers 0,9 --prompts 40,3,61,12 --decode 2 --graph-decode 2 --profile 256 --warmups 1 --hidden 512 --inter 1024"
  "tri_more|--layers 1,4 --prompts 17,2,45 --decode 4 --graph-decode 2 --hidden 256 --inter 1024 --vocab 1024 --profile 300 --warmups 32,4"
)
for row in "${runs[@]}"; do
  IFS='|' read -r name flags <<<"$row"
  rm -rf "$work/$name"; mkdir -p "$work/$name"
  t0=$(date +%s)
  timeout 300 python3 -m mine.cli capture -o "$work/$name/dump" -- \
      python3 "$here/triton_engine.py" "$out/$name.truth.json" $flags > "$work/$name/run.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc = 0 ] || { tail -20 "$work/$name/run.log"; continue; }
  python3 -m capture.pack_fixture "$work/$name/dump" "$out/$name.tar.xz" --max-launches 100000000 \
      --max-cubin-bytes 4000000 | tail -1
done
