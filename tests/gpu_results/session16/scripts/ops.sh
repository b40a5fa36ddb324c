#!/bin/bash
# after session14's b.sh: what the capture logged beside the launches -- copies.jsonl records by op
# (in a graph or not) and the captured graphs' node types -- one line per process
python3 - > $OUT/b_ops.txt 2>&1 <<'PY'
import collections, glob, json
for d in sorted(glob.glob("/tmp/cap_d/pid*")):
    ops = collections.Counter()
    for line in open(f"{d}/copies.jsonl") if glob.glob(f"{d}/copies.jsonl") else []:
        r = json.loads(line); ops[(r.get("op", "htod"), r["graph"] is not None)] += 1
    ends = [json.loads(x) for x in open(f"{d}/graphs.jsonl")] if glob.glob(f"{d}/graphs.jsonl") else []
    ends = [e for e in ends if e["event"] == "capture_end"]
    types = collections.Counter(json.dumps(e.get("node_types"), sort_keys=True) for e in ends)
    print(d, "copies (op, in graph):", dict(ops), "captures:", len(ends), "node types:", dict(types.most_common(6)))
PY
cat $OUT/b_ops.txt
