"""Check one SGLang fixture against its truth and its profiler trace; print a short summary.

    python3 check.py PREFIX [--json OUT]

PREFIX.tar.xz (or a dump folder PREFIX/ ... as capture.sh leaves it: give the .tar.xz),
PREFIX.truth.json and PREFIX.profile.json.gz as truth.py and capture.sh write them. Reports what
the committed tests assert (tests/mining/test_sglang_truth.py, test_sglang_completeness.py), so a
GPU run says at once whether its fixture will pass them: the capture's kernels in the window
against the trace's (mining/completeness.py), the serving forwards' token counts against the
requests (the forwards inside the truth's window; padded to the CUDA-graph sizes the server
reported, in graph mode), the layer count of every one of them, the KV pool and weight strides, and the struct parameters' words.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def graph_sizes(truth: dict, phase: str) -> list[int]:
    """The sizes SGLang captured graphs at for `phase` (decode | prefill); [] when it has none."""
    cfg = (truth.get("cuda_graph_config") or {}).get(phase) or {}
    if truth.get("mode") != "graph" or cfg.get("backend") in (None, "disabled"):
        return []
    return sorted(int(x) for x in cfg.get("bs") or [])


def padded(n: int, sizes: list[int]) -> int:
    return next((s for s in sizes if s >= n), n)


def expected_forwards(truth: dict) -> list[int]:
    """Tokens of every forward the requests made: a prefill of the prompt, then one-token decode
    steps; in graph mode each decode step at the smallest decode graph size that holds it, and a
    prefill the server logged as a graph replay (`requests[].prefill.cuda_graph`) at the smallest
    prefill graph size that holds it (an eager one at its own length)."""
    pre, dec = graph_sizes(truth, "prefill"), graph_sizes(truth, "decode")
    out: list[int] = []
    for r in truth["requests"]:
        n = len(r["prompt"])
        graph = bool(pre) and n <= pre[-1] and bool((r.get("prefill") or {}).get("cuda_graph", True))
        out += [padded(n, pre) if graph else n] + [padded(1, dec)] * (len(r["output"]) - 1)
    return out


def requested(forwards, truth: dict):
    """The forwards inside the truth's `window` (the client's requests; the server's own warm-up
    request before it is served too); without a window, the serving phase."""
    w = truth.get("window")
    if not w:
        return forwards[forwards["phase"] == "serve"]
    return forwards[(forwards["start_ns"] >= w["start_ns"]) & (forwards["end_ns"] <= w["end_ns"])]


def check(prefix: str) -> dict:
    from mining import completeness as C
    from mining.analyze import analyze
    from mining.load import load_dump
    from mining import structs as ST

    truth = json.loads(Path(f"{prefix}.truth.json").read_text())
    dump = load_dump(f"{prefix}.tar.xz", cache=False)
    res: dict = {"launches": int(len(dump.launches)), "pid": dump.pid}
    prof = Path(f"{prefix}.profile.json.gz")
    if prof.is_file():
        w = truth.get("window") or {}
        a_ns, b_ns = w.get("start_ns"), w.get("end_ns")
        comp = C.compare(C.read_trace(prof), C.capture_kernels(dump, a_ns, b_ns), C.copy_nodes(dump, a_ns, b_ns),
                         C.loaded_names(dump))
        res["completeness"] = {"source": truth["profile"]["source"], **comp.to_json()}
        res["completeness_lines"] = comp.lines()
    else:
        res["completeness_lines"] = [f"completeness: no trace ({truth.get('profile')})"]
    a = analyze(dump)
    f = a.forwards
    serve = requested(f, truth)
    want = expected_forwards(truth)
    got = [int(x) if x == x else None for x in serve["tokens"].tolist()]
    layers = truth["geometry"]["num_hidden_layers"]
    st = a.strides
    kv = st[(st["role"] == "kv_pool") & st["stride"].notna() & (st["layers"] == layers)] if len(st) else st
    res.update({
        "method": a.passes.method, "forwards": int(len(f)), "serve_tokens": got, "expected_tokens": want,
        "forwards_match": got == want, "tokens_from": sorted(set(serve["tokens_from"].astype(str))),
        "layers_every_serving_forward": bool(len(serve)) and bool((serve["layers"] == layers).all()),
        "layers_seen": sorted(set(int(x) for x in serve["layers"])), "layers_truth": layers,
        "reference": [a.reference.symbol, a.reference.axis],
        "kv_pool_strides": sorted(set(int(x) for x in kv["stride"])) if len(kv) else [],
        "pointer_roles": a.pointers["role"].value_counts().to_dict() if len(a.pointers) else {},
        "fits": a.fits["status"].value_counts().to_dict() if len(a.fits) else {},
        "structs": ST.summary(a.structs), "notes": a.notes[:8],
    })
    return res


def lines(res: dict) -> list[str]:
    out = [f"fixture: {res['launches']:,} launches (pid {res['pid']}), {res['forwards']} forwards ({res['method']})"]
    out += res["completeness_lines"][:8]
    out.append(f"serving forwards {'match' if res['forwards_match'] else 'DIFFER from'} the requests: "
               f"got {res['serve_tokens']}, want {res['expected_tokens']} (tokens from {res['tokens_from']})")
    out.append(f"layers: {res['layers_seen']} on the serving forwards, truth {res['layers_truth']}; "
               f"KV pool strides {res['kv_pool_strides']}; reference {res['reference']}")
    out.append(f"pointer roles {res['pointer_roles']}; fits {res['fits']}")
    out.append(res["structs"] or "no struct parameters")
    out += [f"note: {n}" for n in res["notes"][:4]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from vocab.errors import MineError

    try:
        res = check(a.prefix)
    except (MineError, OSError) as exc:
        sys.exit(f"check.py: {exc}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    print("\n".join(lines(res)))


if __name__ == "__main__":
    main()
