"""device job part: replay q2e's first serving decode and prefill forwards (host-mapped regions)."""
import collections, dataclasses, json, os, sys
from mining.load import load_dump
from mining.analyze import analyze, document
from replay.run import replay_seqs

if __name__ == "__main__":
    out = sys.argv[1]
    d = load_dump("tests/fixtures/suite/q2e.tar.xz", cache=False)
    doc = document(analyze(d))
    for which in ("decode", "prefill"):
        f = [x for x in doc.serve_forwards() if (x.tokens == 1) == (which == "decode")][0]
        seqs = [s for a, n in f.seqs for s in range(a, a + n)]
        res = replay_seqs(d, seqs, reps=5)
        json.dump([dataclasses.asdict(r) for r in res], open(os.path.join(out, f"q2e_{which}.json"), "w"))
        print(which, f.forward, len(res), collections.Counter(r.status for r in res),
              "host regions", sum(any(g["host"] for g in r.regions) for r in res if r.status == "ok"))
        for r in res:
            if r.status in ("fault", "error"):
                print("  ", r.seq, r.symbol[:50], r.status, r.message[:200])
