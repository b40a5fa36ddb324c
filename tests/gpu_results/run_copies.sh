#!/bin/bash
# The GPU check of the copy log (copies.jsonl; docs/dump-format.md "Copy log"), run from the
# repository root on an H200 box:
#   bash tests/gpu_results/run_copies.sh OUT_DIR
# Builds the library and tests/gpu_results/copies_probe.cu (known host-to-device copies between
# kernel launches: cudaMemcpy, cudaMemcpyAsync from pinned and pageable memory, cudaMemcpyDefault,
# cuMemcpyHtoD[Async], overlapping copies, one above the byte knob, one inside a stream capture, a
# hand-built memcpy node, and device-to-host / device-to-device copies that must not be logged),
# captures it in both record forms and both writers, with the byte knob at its default, at 0 and
# the log off, and checks each dump against what the program printed (check_copies.py). Then a
# small PyTorch program (pageable and pinned .to("cuda") copies between ops) the same way.
# Finally the per-copy cost inside the process: the probe's copy loop timed with the log on and off.
set -o pipefail
out=${1:?usage: run_copies.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u; hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD; } > "$out/machine.txt"
python setup.py build_ext --inplace > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
python -m vocab.capture_tables --check || exit 1
lib=$PWD/capture/libmine_capture.so
b=$(mktemp -d)
nvcc -O2 -arch=sm_90 -o "$b/copies_probe" tests/gpu_results/copies_probe.cu -lcuda || exit 1
"$b/copies_probe" > "$out/probe_plain.jsonl" || { echo "the probe fails without capture"; exit 1; }

fail=0
run() {   # run NAME PROGRAM... : captured with the knobs in the environment, then checked
  local name=$1; shift
  rm -rf "$b/dump_$name"
  env CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR="$b/dump_$name" "$@" > "$out/$name.jsonl" 2> "$out/$name.err"
  local rc=$?
  local pid_dir
  pid_dir=$(ls -d "$b/dump_$name"/pid* 2>/dev/null | head -1)
  echo "== $name: rc=$rc, stderr $(wc -l < "$out/$name.err") line(s), $(ls "$pid_dir" 2>/dev/null | tr '\n' ' ')"
  [ $rc -eq 0 ] || echo "PROBLEM $name exited with $rc: $(tail -2 "$out/$name.err")"
  if [ "${MINE_CAPTURE_COPY_LOG:-1}" = 0 ]; then
    [ ! -e "$pid_dir/copies.jsonl" ] && echo "no copies.jsonl: ok" || echo "PROBLEM copies.jsonl with the log off"
  else
    python tests/gpu_results/check_copies.py "$out/$name.jsonl" "$pid_dir" "${MINE_CAPTURE_COPY_BYTES:-4096}" ||
      echo "PROBLEM $name: the check failed"
  fi
  cp "$pid_dir/copies.jsonl" "$out/$name.copies.jsonl" 2>/dev/null
  cp "$pid_dir/meta.json" "$out/$name.meta.json" 2>/dev/null
}
{
  MINE_CAPTURE_FORMAT=json run probe_json "$b/copies_probe"
  MINE_CAPTURE_FORMAT=bin MINE_CAPTURE_WRITER=mmap run probe_bin_mmap "$b/copies_probe"
  MINE_CAPTURE_FORMAT=bin MINE_CAPTURE_WRITER=write run probe_bin_write "$b/copies_probe"
  export MINE_CAPTURE_COPY_BYTES=0; MINE_CAPTURE_FORMAT=bin run probe_bytes0 "$b/copies_probe"; unset MINE_CAPTURE_COPY_BYTES
  export MINE_CAPTURE_COPY_BYTES=65536; MINE_CAPTURE_FORMAT=bin run probe_bytes64k "$b/copies_probe"; unset MINE_CAPTURE_COPY_BYTES
  export MINE_CAPTURE_COPY_LOG=0; MINE_CAPTURE_FORMAT=bin run probe_log_off "$b/copies_probe"; unset MINE_CAPTURE_COPY_LOG
} 2>&1 | tee "$out/probe.log"
grep -q PROBLEM "$out/probe.log" && fail=1

cat > "$b/torch_copies.py" <<'PY'
# Known host-to-device copies from PyTorch between ops; prints what the checker needs. The seq a
# copy precedes is not known to the program (torch may launch kernels of its own): null.
import json
import torch

def show(how, dst, host):
    data = host.numpy().tobytes()
    print(json.dumps({"copy": {"how": how, "dst": hex(dst.data_ptr()), "size": len(data), "hex": data.hex(),
                               "launches_before": None, "graph": 0}}), flush=True)

torch.cuda.init()
acc = torch.zeros(1, device="cuda", dtype=torch.int64)
for step in range(3):
    ids = torch.arange(step, step + 24, dtype=torch.int32)                 # pageable, blocking
    d_ids = ids.to("cuda")
    show("torch_pageable", d_ids, ids)
    acc += d_ids.sum()
    lens = torch.tensor([7 + step, 130 + step, 4096 + step], dtype=torch.int64).pin_memory()
    d_lens = lens.to("cuda", non_blocking=True)                            # pinned, async
    show("torch_pinned", d_lens, lens)
    acc += d_lens.sum()
    table = torch.arange(64 * step, 64 * step + 512, dtype=torch.int32).pin_memory()   # a block table
    d_table = torch.empty(512, dtype=torch.int32, device="cuda")
    d_table.copy_(table, non_blocking=True)
    show("torch_copy_", d_table, table)
    acc += d_table.sum()
    torch.cuda.synchronize()
back = acc.cpu()                                                           # device -> host: not logged
print(json.dumps({"done": {"launches": None}}))
PY
if python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  { MINE_CAPTURE_FORMAT=bin MINE_CAPTURE_WRITER=mmap run torch_bin python "$b/torch_copies.py"
    MINE_CAPTURE_FORMAT=json run torch_json python "$b/torch_copies.py"; } 2>&1 | tee "$out/torch.log"
  grep -q PROBLEM "$out/torch.log" && fail=1
else
  echo "no torch with CUDA here: the torch check was not run" | tee "$out/torch.log"
fi

# the cost inside the process: wall time of the probe with the copy log on and off (5 runs each)
for log in 1 0; do
  for i in 1 2 3 4 5; do
    s=$(date +%s%N)
    env CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR="$b/cost" MINE_CAPTURE_FORMAT=bin MINE_CAPTURE_WRITER=mmap \
      MINE_CAPTURE_COPY_LOG=$log "$b/copies_probe" > /dev/null
    echo "copy_log=$log run $i: $(( ($(date +%s%N) - s) / 1000 )) us"
    rm -rf "$b/cost"
  done
done 2>&1 | tee "$out/cost.log"
echo "run_copies: $([ $fail = 0 ] && echo ok || echo FAIL)" | tee "$out/result.txt"
exit $fail
