#!/bin/bash
# Issue 22's first target on a GPU host: a vLLM eager capture compiled by `mine compile` and run on
# kern against the engine's own reference, beside `mine gen qwen3`'s manifest of the same capture.
#   DUMP=<capture folder> CKPT=<checkpoint folder> REF=<mine reference JSON> \
#     bash tests/gpu_results/run_compile_kern.sh OUT_DIR
# The capture: `mine capture -o DUMP -- python -m compare.record_vllm CKPT REF ...` with
# MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1
# (compare.record_vllm asks for the snapshot after start-up; the reference and the capture are one run).
# Steps: the analysis; one in-order replay window over the first serving prefill and the three decodes
# after it (flow of the prefill and the last decode, contents of every forward in the window); the
# compile with --weights (config and snapshot binding), --contents and --requests; gen; both through
# `mine compare`. Every step's log and result lands in OUT_DIR; look for "rc=" lines.
set -u -o pipefail
out=${1:?usage: DUMP=... CKPT=... REF=... run_compile_kern.sh OUT_DIR}
: "${DUMP:?}" "${CKPT:?}" "${REF:?}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD; } > "$out/machine.txt"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python -m mine.cli analyze "$DUMP" --json "$out/analysis.json" > "$out/analyze.log" 2>&1
echo "analyze rc=$? at $(el) s"
python - "$out/analysis.json" > "$out/targets.txt" <<'PY'
import json, sys
fw = [f for f in json.load(open(sys.argv[1]))["passes"]["forwards"] if f.get("n_launches") and f.get("phase") == "serve"]
import os
pres = [k for k, f in enumerate(fw) if (f.get("tokens") or 0) > 1]
# TARGET=longest: the longest prompt's prefill, whose decodes read several KV pages (a block
# table of one entry reads like any small integer); default: the first serving prefill
# TARGET=longest-decodes: the first and fourth decode after it only (the prefill runs unmeasured)
t = os.environ.get("TARGET", "")
if t.startswith("fw:"):  # TARGET=fw:113,116: these forwards, as given
    print(" ".join(f"--forward {int(k)}" for k in t[3:].split(",")))
    raise SystemExit
pre = max(pres, key=lambda k: fw[k]["tokens"]) if t.startswith("longest") else pres[0]
dec = [f for f in fw[pre + 1:pre + 5] if f.get("tokens") == 1]
pick = [dec[0], dec[-1]] if t == "longest-decodes" else [fw[pre]] + dec[:3][-1:]
print(" ".join(f"--forward {f['forward']}" for f in pick))
PY
timeout ${REPLAY_S:-480} python -m mine.cli replay "$DUMP" $(cat "$out/targets.txt") --in-order --analysis "$out/analysis.json" \
  --flow-out "$out/flow.json" --contents-out "$out/contents.json" --json "$out/replay.json" > "$out/replay.log" 2>&1
echo "replay rc=$? at $(el) s ($(cat "$out/targets.txt"))"
fl=""; [ -s "$out/flow.json" ] && fl="--analysis $out/flow.json"; [ -s "$out/contents.json" ] && fl="$fl --contents $out/contents.json"
python -m mine.cli compile "$DUMP" -o "$out/compiled" $fl --requests "$REF" --weights "$CKPT" --force > "$out/compile.log" 2>&1
echo "compile rc=$? at $(el) s"
case " ${COMPARES:-gen} " in *" gen "*)
  python -m mine.cli gen qwen3 --dump "$DUMP" --config "$CKPT/config.json" -o "$out/gen" --weights "$CKPT" --force > "$out/gen.log" 2>&1
  echo "gen rc=$? at $(el) s" ;;
esac
# COMPARES (default "rows0 rows1 full gen"): rowsN = the compiled manifest with --prefill-rows N
# (0: the prompt through decode), full = the compiled manifest as it is, gen = gen's; a fault that
# only the full-row prefill shows is the prefill program's (mine compare --prefill-rows)
for c in ${COMPARES:-rows0 rows1 full gen}; do
  case $c in
    rows*) m=compiled; extra="--prefill-rows ${c#rows} --no-free-running" ;;
    full) m=compiled; extra="" ;;
    gen) m=gen; extra="" ;;
  esac
  timeout 300 python -m mine.cli compare "$out/$m" --weights "$CKPT" --reference "$REF" $extra \
    --json "$out/compare_$c.json" > "$out/compare_$c.log" 2>&1
  echo "compare $c rc=$? at $(el) s: $(tail -1 "$out/compare_$c.log")"
done
