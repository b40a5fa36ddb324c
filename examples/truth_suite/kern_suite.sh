#!/usr/bin/env bash
# kern against vLLM on the truth suite's eager captures, teacher-forced (GPU host; kern-llm and this
# project importable; vLLM only for NAMEs given with a fresh capture):
#
#   examples/truth_suite/kern_suite.sh OUT_DIR NAME...
#
# For each NAME (examples/truth_suite/suite.txt): the seeded checkpoint; the capture (a fresh one
# under $MINE_SUITE_WORK/NAME/dump if capture_suite.sh made it there, else the committed fixture);
# `mine gen qwen3` from it through the analysis; examples/truth_suite/kern_check.py against the
# run's truth. Writes OUT_DIR/NAME.kern.json and OUT_DIR/NAME.gen.log.
set -uo pipefail
out=$(mkdir -p "${1:?usage: kern_suite.sh OUT_DIR NAME...}" && cd "$1" && pwd); shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=$(cd "$here/.." && pwd)
work=${MINE_SUITE_WORK:-/tmp/mine-suite}
export PYTHONUNBUFFERED=1
for name in "$@"; do
  flags=$(grep "^$name|" "$here/truth_suite/suite.txt" | cut -d'|' -f2)
  mkdir -p "$work/$name"
  [ -f "$work/$name/model/config.json" ] || python3 "$here/vllm_qwen3/make_checkpoint.py" "$work/$name/model" $flags \
      > "$work/$name/ckpt.log" 2>&1 || { echo "$name: checkpoint failed"; continue; }
  dump="$root/tests/fixtures/suite/$name.tar.xz"; truth="$root/tests/fixtures/suite/$name.truth.json"
  if [ -d "$work/$name/dump" ] && [ -f "$work/$name/run.json" ]; then
    dump="$work/$name/dump"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); c=json.load(open(sys.argv[2])); json.dump({'requests': r['requests'], 'config': c}, open(sys.argv[3],'w'))" \
        "$work/$name/run.json" "$work/$name/model/config.json" "$work/$name/truth.json"
    truth="$work/$name/truth.json"
  fi
  ( cd "$root" && python3 -m mine.cli gen qwen3 --dump "$dump" --config "$work/$name/model/config.json" \
      --out "$work/$name/manifest" --force ) > "$out/$name.gen.log" 2>&1 || { echo "$name: gen failed"; tail -3 "$out/$name.gen.log"; continue; }
  python3 "$here/truth_suite/kern_check.py" "$work/$name/manifest" "$work/$name/model" "$truth" "$out/$name.kern.json" \
      2>&1 | tail -3
  echo "$name: kern_check rc=${PIPESTATUS[0]}"
done
