"""The copy log against what a program copied (tests/gpu_results/run_copies.sh, on the GPU host).

    python tests/gpu_results/check_copies.py PROGRAM_OUTPUT PID_DIR COPY_BYTES

PROGRAM_OUTPUT holds the JSON lines of tests/gpu_results/copies_probe.cu or of run_copies.sh's
torch program: {"copy": {"how", "dst", "size", "hex", "launches_before" (or null: unknown),
"graph"}}, {"not_copied": {"dst", "size"}}, {"done": {"launches" (or null)}}. Each copy must be
one record of PID_DIR/copies.jsonl (matched by destination and size, in program order) with the
bytes exactly when COPY_BYTES keeps them, the launch seq it precedes, and `graph` for a captured
copy or a memcpy node; no record may name a not_copied destination; meta.json's counters must
equal the file; `mining.copies.bytes_before` must give each kept copy's bytes before the next
launch. Prints one line per copy and every problem; exit 1 when there is one.
"""

from __future__ import annotations

import json
import sys

from mining.copies import bytes_before
from mining.load import load_dump


def main(argv: list[str]) -> int:
    prog_path, pid_dir, nbytes = argv[0], argv[1], int(argv[2])
    prog = [json.loads(x) for x in open(prog_path) if x.startswith("{")]
    made = [x["copy"] for x in prog if "copy" in x]
    (done,) = [x["done"] for x in prog if "done" in x]
    d = load_dump(pid_dir, cache=False)
    problems: list[str] = []
    if d.copies is None:
        print("no copies.jsonl")
        return 1
    recs = d.copies.to_dict("records")
    if done.get("launches") is not None and len(d.launches) != done["launches"]:
        problems.append(f"{len(d.launches)} launch records, the program made {done['launches']}")
    used: set[int] = set()
    for m in made:
        dst = int(m["dst"], 16)
        cands = [i for i, r in enumerate(recs) if r["dst"] == dst and r["size"] == m["size"] and i not in used]
        if not cands:
            problems.append(f"{m['how']}: no record of {m['size']} bytes at {m['dst']}")
            continue
        i = cands[0]
        used.add(i)
        r = recs[i]
        keep = 0 < m["size"] <= nbytes
        got = r["data"].hex() if r["data"] is not None else None
        if keep and got != m["hex"]:
            problems.append(f"{m['how']}: bytes differ ({(got or 'none')[:32]} vs {m['hex'][:32]})")
        if not keep and got is not None:
            problems.append(f"{m['how']}: {m['size']} bytes kept although the knob is {nbytes}")
        if m.get("launches_before") is not None and r["seq_before"] != m["launches_before"]:
            problems.append(f"{m['how']}: seq_before {r['seq_before']}, the program had made {m['launches_before']} launches")
        if bool(r["in_graph"]) != bool(m["graph"]):
            problems.append(f"{m['how']}: graph {r['in_graph']} (program: {m['graph']})")
        print(f"{m['how']:>26}: {r['api']}, stream {hex(r['stream'])}, async {int(r['async'])}, seq_before "
              f"{r['seq_before']} (program {m.get('launches_before')}), result {r['result']}, bytes "
              f"{'kept, equal' if keep and got == m['hex'] else 'not kept' if not keep else 'DIFFER'}")
    for n in (x["not_copied"] for x in prog if "not_copied" in x):
        hit = [r for r in recs if r["dst"] == int(n["dst"], 16)]
        if hit:
            problems.append(f"a copy that is not host-to-device was logged: {hit[0]['api']} to {n['dst']}")
    others = [r for i, r in enumerate(recs) if i not in used]
    print(f"{len(recs)} records, {len(used)} matched to the program's copies, {len(others)} others "
          f"(the runtime's or the framework's own): {sorted({r['api'] for r in others})}")
    counters = d.meta.get("counters", {})
    ndev = 0 if d.device_ops is None else len(d.device_ops)   # device-to-device copies and memsets
    if counters.get("copies") != len(recs) + ndev or counters.get("copies_dropped"):
        problems.append(f"meta.json counters copies {counters.get('copies')}, dropped "
                        f"{counters.get('copies_dropped')}; the file holds {len(recs) + ndev}")
    for m in made:   # what a replay would fill: the bytes of every kept copy, before the next launch
        if m["graph"] or not 0 < m["size"] <= nbytes or m.get("launches_before") is None:
            continue
        later = [x for x in made if x is not m and not x["graph"] and x.get("launches_before") == m["launches_before"]
                 and made.index(x) > made.index(m)]
        if later:
            continue   # overwritten before the same launch: the model below would need both
        f = bytes_before(d.copies, m["launches_before"], int(m["dst"], 16), m["size"])
        if f.data.hex() != m["hex"] or not f.complete:
            problems.append(f"{m['how']}: bytes_before gives {f.data.hex()[:32]}, complete {f.complete}")
    damage = [r.sentence() for r in d.damage if r.damaged]
    if damage:
        problems.append(f"damage: {damage}")
    for p in problems:
        print("PROBLEM", p)
    print("copies check:", "FAIL" if problems else "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
