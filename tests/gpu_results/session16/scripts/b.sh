#!/bin/bash
# call B: kit half b, a default-mode capture with its start-up snapshot, packed as a fixture
set -u; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
ls /tmp/kit/v.aa /tmp/ck/config.json || exit 3
mkdir -p /tmp/vllm-site && cat /tmp/kit/v.aa KIT2/b/v.ab | tar xJ -C /tmp/vllm-site; el "untar rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-deps KIT2/b/d/*.whl > $OUT/b_pip.log 2>&1; el "pip b rc=$?"
ls capture/*.so >/dev/null 2>&1 || cp /tmp/build/*.so capture/
export PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
export MINE_CAPTURE_COPY_BYTES=65536 MINE_CAPTURE_HOST_BYTES=4096 MINE_CAPTURE_SNAPSHOT_SIGNAL=1 MINE_CAPTURE_SNAPSHOT_BYTES=268435456
L=${LENGTHS:-"--lengths 1,29,88,163,7 --new 8 --seed 73 --max-model-len 2048"}
timeout 280 python3 -m mine.cli capture -o /tmp/cap_d -- python3 -m compare.record_vllm /tmp/ck /tmp/ref_d.json $L --mode default > $OUT/b_cap_d.log 2>&1; el "cap default rc=$?"
du -sh /tmp/cap_d; ls /tmp/cap_d
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
cp /tmp/ref_d.json $OUT/ 2>/dev/null; cp /tmp/ck/config.json $OUT/ck_config.json
python3 capture/pack_fixture.py /tmp/cap_d $OUT/fix_d.tar.xz --max-launches 1000000 --max-cubin-bytes 8000000 > $OUT/b_pack.log 2>&1; el "pack rc=$?"
tail -n 5 $OUT/b_cap_d.log; ls -la $OUT
