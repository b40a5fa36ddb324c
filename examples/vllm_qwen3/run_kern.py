"""Run the generated Qwen3 manifest on kern (kern-llm) greedily for the four prompts (GPU host).

    python3 run_kern.py MANIFEST_DIR CHECKPOINT_DIR OUT_JSON [--reference VLLM_JSON]

MANIFEST_DIR is what `mine gen qwen3` wrote (qwen3.json, qwen3-bindings.safetensors, kernels/).
Each prompt: all but its last token go through `prefill` in chunks (they only land KV), then the
last prompt token and each generated token go through `decode` (graph-replayed), 4 new tokens.
One sequence at a time, pages laid out in order (block i holds positions 16i..16i+15). Prints the
tokens per prompt and, with --reference (run_offline.py's output), whether they equal vLLM's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402


def main() -> None:
    mdir, ckpt, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ref = Path(sys.argv[sys.argv.index("--reference") + 1]) if "--reference" in sys.argv else None
    import torch
    import kern
    from kern.host import region

    m = json.loads((mdir / "qwen3.json").read_text())
    weights = [str(p) for p in sorted(ckpt.glob("*.safetensors"))] + [str(mdir / "qwen3-bindings.safetensors")]
    rt = kern.Runtime(str(mdir / "qwen3.json"), str(mdir / "kernels"), weights, 0)
    v = {n: region(rt, m, n) for n in ("tokens", "positions", "slots", "seq_lens", "cu_seqlens", "blocks", "next_token")}
    chunk = m["vars"]["rows"]["max"]
    bs = m["buffers"]["blocks"]["domain"]["stride"]
    # in-order pages for the longest request, page 0 (a valid index) in the table's unused tail
    need = -(-max(len(p) + MAX_NEW_TOKENS for p in prompts()) // bs)
    v["blocks"].zero_()
    v["blocks"][0, :need] = torch.arange(need, dtype=torch.int32)

    def feed(ids: list[int], start: int) -> None:
        n = len(ids)
        v["tokens"][:n] = torch.tensor(ids, dtype=torch.int32)
        v["positions"][:n] = torch.arange(start, start + n, dtype=torch.int64)
        v["slots"][:n] = torch.arange(start, start + n, dtype=torch.int64)  # identity page table
        v["seq_lens"][0] = start + n
        v["cu_seqlens"][:2] = torch.tensor([0, n], dtype=torch.int32)
        torch.cuda.synchronize()

    results = []
    for ids in prompts():
        t0 = time.time()
        for s in range(0, len(ids) - 1, chunk):
            part = ids[s:min(s + chunk, len(ids) - 1)]
            feed(part, s)
            rt.run("prefill", {"rows": len(part), "seqs": 1})
        tok, pos, outs = ids[-1], len(ids) - 1, []
        for _ in range(MAX_NEW_TOKENS):
            feed([tok], pos)
            rt.run("decode", {"rows": 1, "seqs": 1})
            tok = int(v["next_token"][0].item())
            outs.append(tok)
            pos += 1
        results.append({"prompt": ids, "output": outs, "seconds": round(time.time() - t0, 4)})
        print(json.dumps(outs), flush=True)
    # decode step time with graph replay: one sequence at the last request's length, 200 steps
    feed([tok], pos)
    for _ in range(20):
        rt.run("decode", {"rows": 1, "seqs": 1})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    steps = 200
    for _ in range(steps):
        rt.run("decode", {"rows": 1, "seqs": 1})
    torch.cuda.synchronize()
    step_us = (time.perf_counter() - t0) / steps * 1e6
    print(f"kern decode step (graph replay, context {pos + 1}): {step_us:.1f} us", flush=True)
    report = {"requests": results, "decode_step_us": round(step_us, 2)}
    if ref is not None:
        want = [r["output"] for r in json.loads(ref.read_text())["requests"]]
        report["equal_to_vllm"] = [r["output"] == w for r, w in zip(results, want)]
        print("equal to vLLM:", report["equal_to_vllm"])
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
