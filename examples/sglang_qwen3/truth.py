"""Write an SGLang capture's truth file and the kernel events of the profiler trace to compare it with.

    python3 truth.py WORK MODE PREFIX [MODEL_DIR]

WORK is capture.sh's folder: run.json (the captured run, run_serve.py's record)
and, when it ran, profile-run.json (the same server without the capture, under the torch
profiler). Writes PREFIX.truth.json -- what the program asked the engine to do, as the vLLM suite's
truth files say it (engine, mode, geometry, config, requests) plus SGLang's CUDA-graph config as the
server reported it, each request's prefill as the server logged it (`prefill`: tokens, cached
tokens, CUDA graph or eager; from WORK/server.log), the capture's window (CLOCK_MONOTONIC ns
around the requests) and where the profile came from -- and PREFIX.profile.json.gz, the kernel events of the trace that has them: the
captured process's own when kineto recorded GPU activity there (`same_process`), else the second
run's (`second_run`). Prints one line per file.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GEOMETRY_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "vocab_size", "tie_word_embeddings")


def _trace_kernels(run: dict) -> tuple[str | None, int]:
    from mining.completeness import TraceError, read_trace

    path = (run.get("profile") or {}).get("file")
    if not path or not Path(path).is_file():
        return None, 0
    try:
        return path, len(read_trace(path))
    except TraceError:
        return path, 0


PREFILL_LINE = re.compile(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+).*?cuda graph: (True|False)")


def prefills(server_log: str, requests: list[dict]) -> list[dict] | None:
    """What the server logged of each request's prefill -- tokens run, tokens taken from its cache,
    and whether it ran as a CUDA-graph replay (SGLang's "Prefill batch ... cuda graph: X" line; it
    runs a prefill eagerly when padding it to a captured size would waste too much) -- or None
    when the log does not show one prefill line per request. The requests, sent one at a time, are
    the log's last len(requests) prefill lines (the server's own warm-up request comes first)."""
    got = [(int(n), int(c), g == "True") for n, c, g in PREFILL_LINE.findall(server_log)]
    if len(got) < len(requests) or not requests:
        return None
    mine = got[len(got) - len(requests):]
    if any(n + c != len(r["prompt"]) for (n, c, _), r in zip(mine, requests)):
        return None
    return [{"new_tokens": n, "cached_tokens": c, "cuda_graph": g} for n, c, g in mine]


def build(work: Path, mode: str, model: Path | None = None) -> tuple[dict, str | None]:
    """(truth, the trace file to reduce) for capture.sh's folder (the checkpoint in WORK/model
    unless `model` names it)."""
    run = json.loads((work / "run.json").read_text())
    cfg = json.loads(((model or work / "model") / "config.json").read_text())
    info = run.get("server_info") or {}
    same, n_same = _trace_kernels(run)
    second, n_second = (None, 0)
    if (work / "profile-run.json").is_file():
        second, n_second = _trace_kernels(json.loads((work / "profile-run.json").read_text()))
    source, trace = (("same_process", same) if n_same else ("second_run", second) if n_second else ("none", None))
    requests = [{"prompt": r["prompt"], "output": r["output"]} for r in run["requests"]]
    log = work / "server.log"
    pre = prefills(log.read_text(errors="replace"), requests) if log.is_file() else None
    for r, p in zip(requests, pre or []):
        r["prefill"] = p
    truth = {
        "engine": f"sglang {info.get('version', '?')} (HTTP server, /generate with input_ids)",
        "mode": mode,
        "geometry": {k: cfg[k] for k in GEOMETRY_KEYS if k in cfg},
        "config": cfg,
        "requests": requests,
        "cuda_graph_config": info.get("cuda_graph_config"),
        "server_args": run.get("server_args"),
        "window": run.get("window"),
        "profile": {"source": source, "kernels_same_process": n_same, "kernels_second_run": n_second},
    }
    return truth, trace


def main() -> None:
    work, mode, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    truth, trace = build(work, mode, Path(sys.argv[4]) if len(sys.argv) > 4 else None)
    Path(f"{prefix}.truth.json").write_text(json.dumps(truth, indent=1))
    print(f"{prefix}.truth.json: {len(truth['requests'])} requests, profile {truth['profile']}")
    if trace:
        from mining.completeness import reduce_trace

        n = reduce_trace(trace, f"{prefix}.profile.json.gz")
        print(f"{prefix}.profile.json.gz: {n} kernel events from {truth['profile']['source']}")


if __name__ == "__main__":
    main()
