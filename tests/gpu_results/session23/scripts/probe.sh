#!/bin/bash
# Session 23: torch alone, no kern or vLLM: does a cuBLASLt GEMM in a CUDA graph idle before it
# starts (benchmarks/probe_gemm_graph_gaps.py)? Writes $OUT/probe.json.
set -u
python3 benchmarks/probe_gemm_graph_gaps.py $OUT/probe.json --rows ${ROWS:-1,64} > $OUT/probe.log 2>&1; echo "probe rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/probe.json"))
for r, v in d["rows"].items():
    for k, m in v.items():
        print(r, k, "step", m["step_us"], "busy", m["gpu_busy_us"], "idle", m["idle"] and m["idle"]["idle_us"])
        for g in (m["idle"] or {}).get("by_kernel", [])[:4]:
            print("    ", g["kernel"][:70], g["idle_before_us"], g["launches"])
PY
