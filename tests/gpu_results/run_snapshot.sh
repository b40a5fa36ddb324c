#!/bin/bash
# The GPU check of the snapshot knob (docs/dump-format.md "Snapshot") and of `mine compile --weights`
# (docs/compile.md "Weights by content"), run from the repository root on an H200 box:
#   bash tests/gpu_results/run_snapshot.sh OUT_DIR                       # part 1 only
#   DUMP=<vLLM capture folder> CKPT=<its checkpoint folder> bash tests/gpu_results/run_snapshot.sh OUT_DIR
# Part 1 (needs torch): a small PyTorch program captured with MINE_CAPTURE_SNAPSHOT_SIGNAL=1 sends
# itself SIGUSR2 just before a CUDA-graph capture; the snapshot must wait for the capture's end (the
# graph must still replay right) and hold, byte for byte, the tensors the program made before it
# (the program prints their address and sha256); a second run with MINE_CAPTURE_SNAPSHOT_AT and a
# budget below the largest tensor's segment must skip that one.
# Part 2 (DUMP and CKPT set): a vLLM capture made with the knob, e.g. the truth suite's eager q2e:
#   CUDA_INJECTION64_PATH=$PWD/capture/libmine_capture.so MINE_CAPTURE_DIR=<dump> \
#   MINE_CAPTURE_SNAPSHOT_AT=2000 <the usual vLLM run>
# (SNAPSHOT_AT: a launch count past the weights' loading -- vLLM's profile forward starts after it
# and makes thousands of launches; the KV pool, allocated later or not, is skipped by the default
# 8 GiB budget -- the allocation log is turned on by the knob). The snapshot files are checked
# (every `ok` region's file whole, the end record, what was skipped and why), then
# `mine compile DUMP -o OUT/compiled --weights CKPT` runs and the weights' provenance is
# summarised: how many bytes are bound to checkpoint tensors, how many to weights/extra.safetensors,
# and the equal-content choices. Look for "PROBLEM" lines; summary.json has the numbers.
set -o pipefail
out=${1:?usage: run_snapshot.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} RUST_BACKTRACE=0
{ date -u; hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD; } > "$out/machine.txt"
python setup.py build_ext --inplace > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
lib=$PWD/capture/libmine_capture.so
b=$(mktemp -d)

cat > "$b/probe.py" <<'EOF'
"""Tensors of known bytes, then SIGUSR2, then a CUDA-graph capture and replays."""
import hashlib, json, os, signal, sys
import torch
torch.manual_seed(0)
dev = "cuda"
made = {"small": torch.randn(1000, device=dev, dtype=torch.bfloat16),
        "mid": torch.randn(3000, 700, device=dev, dtype=torch.bfloat16),
        "big": torch.randn(64 << 20, device=dev, dtype=torch.float32)}            # 256 MiB
made["derived"] = (made["mid"] * 2 + 1).contiguous()                               # kernels wrote it
torch.cuda.synchronize()
def desc(t):
    return {"ptr": t.data_ptr(), "bytes": t.numel() * t.element_size(),
            "sha256": hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()}
print(json.dumps({"tensors": {k: desc(v) for k, v in made.items()}}))
x = torch.zeros(4096, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = x * 3 + 1                                                              # warm-up
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
if len(sys.argv) > 1 and sys.argv[1] == "signal":
    os.kill(os.getpid(), signal.SIGUSR2)        # due now: the next launch is inside the capture below
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 3 + 1
for i in range(5):
    x.fill_(float(i))
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(y == 3 * i + 1).item(), "the graph replays wrongly"
z = made["mid"].sum() + y.sum()                                                    # launches after it
for _ in range(300):                                    # MINE_CAPTURE_SNAPSHOT_AT=200 falls in here
    w = x + 1
torch.cuda.synchronize()
print(json.dumps({"done": True, "z": float(z)}))
EOF

cat > "$b/check.py" <<'EOF'
import hashlib, json, sys
from pathlib import Path
from mining.load import load_dump
probe, dump, want_skip = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "skip"
lines = [json.loads(x) for x in probe.read_text().splitlines() if x.startswith("{")]
tensors = lines[0]["tensors"]
bad = 0
if not lines[-1].get("done"):
    print("PROBLEM the probe did not finish"); bad += 1
d = load_dump(dump, cache=False)
snap = d.snapshot
if snap is None:
    print("PROBLEM no snapshot in", dump); sys.exit(1)
print("\n".join(snap.lines()))
print("end:", json.dumps(snap.end))
graphs = [json.loads(x) for x in (d.source.parent / "graphs.jsonl").read_text().splitlines() if x.strip()]
ends = [g for g in graphs if g["event"] == "capture_end"]
# inside a capture: a capture made launch records on both sides of the snapshot (one that began after it,
# seq_first >= seq_before, is not; the probe's signal can land before torch's own pre-capture launches)
inside = [e for e in ends if e["seq_first"] is not None and e["seq_first"] < snap.seq_before <= e["seq_last"]]
if inside:
    print("PROBLEM the snapshot was taken inside a capture (seq_before", snap.seq_before, "in",
          [(e["seq_first"], e["seq_last"]) for e in inside], ")"); bad += 1
print("captures:", [(e["seq_first"], e["seq_last"]) for e in ends], "snapshot before seq", snap.seq_before)
for name, t in tensors.items():
    data = snap.read(t["ptr"], t["bytes"])
    if data is None:
        skipped = name == "big" and want_skip
        print(f"{name}: not in the snapshot" + (" (skipped by the budget, as asked)" if skipped else ""))
        bad += 0 if skipped else 1
        continue
    same = hashlib.sha256(data).hexdigest() == t["sha256"]
    print(f"{name}: {t['bytes']} bytes {'equal' if same else 'DIFFER'}")
    bad += 0 if same else 1
if want_skip and not [r for r in snap.regions if r.status == "skipped"]:
    print("PROBLEM nothing skipped under the small budget"); bad += 1
print("snapshot check:", "ok" if bad == 0 else f"FAIL ({bad})")
sys.exit(1 if bad else 0)
EOF

fail=0
if python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for mode in signal budget; do
    rm -rf "$b/dump_$mode"
    if [ $mode = signal ]; then knobs="MINE_CAPTURE_SNAPSHOT_SIGNAL=1"; arg=signal; want=all
    else knobs="MINE_CAPTURE_SNAPSHOT_AT=200 MINE_CAPTURE_SNAPSHOT_BYTES=134217728"; arg=at; want=skip; fi
    env CUDA_INJECTION64_PATH=$lib MINE_CAPTURE_DIR="$b/dump_$mode" $knobs python "$b/probe.py" $arg \
      > "$out/probe_$mode.jsonl" 2> "$out/probe_$mode.err"
    rc=$?
    echo "== probe $mode: rc=$rc, stderr: $(grep -c mine-capture "$out/probe_$mode.err") capture line(s)"
    [ $rc -eq 0 ] || { echo "PROBLEM probe $mode exited $rc: $(tail -3 "$out/probe_$mode.err")"; fail=1; }
    pid_dir=$(ls -d "$b/dump_$mode"/pid* | head -1)
    cp "$pid_dir/snapshot.jsonl" "$out/probe_${mode}_snapshot.jsonl" 2>/dev/null
    python "$b/check.py" "$out/probe_$mode.jsonl" "$pid_dir" $want | tee "$out/probe_${mode}_check.txt" || fail=1
  done
else
  echo "part 1 skipped: torch with CUDA is not importable here"
fi

if [ -n "$DUMP" ] && [ -n "$CKPT" ]; then
  echo "== part 2: $DUMP with $CKPT"
  python - "$DUMP" <<'EOF' | tee "$out/vllm_snapshot.txt" || fail=1
import sys
from mining.load import load_dump
d = load_dump(sys.argv[1], cache=False)
s = d.snapshot
if s is None:
    print("PROBLEM the capture holds no snapshot (was MINE_CAPTURE_SNAPSHOT_AT set?)"); sys.exit(1)
print("\n".join(s.lines()), "| launches in the dump:", len(d.launches))
for r in s.regions:
    if r.status != "ok":
        print(f"  {r.status} {hex(r.base)} {r.size} bytes: {r.reason}")
print("  warnings:", [w for w in d.warnings if "snapshot" in w])
sys.exit(0 if s.status in ("ok", "partial") else 1)
EOF
  rm -rf "$out/compiled"
  python -m mine.cli compile "$DUMP" -o "$out/compiled" --weights "$CKPT" > "$out/compile.txt" 2> "$out/compile.err"
  echo "compile --weights: rc=$? $(tail -1 "$out/compile.err")"; cat "$out/compile.txt"
  python - "$out" "$CKPT" <<'EOF' || fail=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
p = out / "compiled" / "provenance.json"
if not p.is_file():
    print("PROBLEM no compiled manifest"); sys.exit(1)
w = json.loads(p.read_text()).get("weights", {})
bufs = w.get("buffers", {})
kinds, bound, extra = {}, 0, 0
for b in bufs.values():
    kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
    for x in b.get("pieces", []):
        bound += x["bytes"] if "tensor" in x else 0
        extra += x["bytes"] if "extra" in x else 0
summary = {"buffers": len(bufs), "kinds": kinds, "bytes_bound_to_checkpoint": bound, "bytes_in_extra": extra,
           "ambiguous": len(w.get("ambiguous", [])), "undetermined": [a for a in w.get("ambiguous", [])
                                                                      if "do not tell" in a["rule"]]}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
import kern
m = out / "compiled" / "manifest.json"
files = sorted(Path(sys.argv[2]).glob("*.safetensors")) + sorted((out / "compiled" / "weights").glob("*.safetensors"))
try:
    kern.Runtime(str(m), str(out / "compiled" / "kernels"), [str(f) for f in files], 0)
    print("kern: the manifest loads with its weights")
except ValueError as e:
    print("PROBLEM kern rejects the manifest or its weights:", str(e)[:2000]); sys.exit(1)
except BaseException as e:
    print("kern: loading stopped at", type(e).__name__, str(e)[:300])
EOF
fi
echo "run_snapshot: $([ $fail = 0 ] && echo ok || echo FAIL)"
