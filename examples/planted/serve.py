"""Serve seeded requests through the planted Triton engine the way an inference engine does.

Why: `mine compile`'s third target is a program that is not an LLM engine, compiled from its
capture and run on kern against itself. This driver gives the planted engine (triton_engine.py,
`serving=True`: positions one per row, causal attention over its KV cache, the forward ending at
the logits) what an engine's host does around a model: it stages each step's token ids and
positions from pinned host memory (copies the capture logs), reads the last row's logits back,
picks the greedy token on the host and feeds it to the next step; decode runs eagerly for the
first request and as a CUDA-graph replay after it. It writes what `mine compile --weights` and
`mine compare` need, as a real engine's user would have them: a checkpoint folder (config.json
and the engine's weights as safetensors tensors) and a reference (mine-reference/1: every
generated position's top-k log-probabilities from this very run). Under `mine capture` with
MINE_CAPTURE_SNAPSHOT_SIGNAL=1 it asks for the device snapshot after start-up.

    python3 serve.py CKPT_DIR REF.json [--lengths 7,33,90,150] [--new 8] [--layers 1,3]
        [--hidden 256] [--inter 512] [--vocab 4096] [--seed 0] [--top-k 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_engine as te  # noqa: E402

from compare import checkpoint, reference  # noqa: E402
from compare.record_vllm import seeded_prompts, snapshot_now  # noqa: E402
from generators import safetensors  # noqa: E402


def write_checkpoint(eng: te.Engine, folder: Path, config: dict) -> None:
    """The engine's weight tensors as one safetensors file, with the config a serving host reads."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in eng.weights.items():
        data = t.contiguous().cpu().view(torch.uint8).numpy().tobytes()
        tensors[name] = ("BF16", list(t.shape), data)
    safetensors.write(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")


class Host:
    """Stages a step's rows from pinned memory, runs the forward (eager or the decode graph), reads
    the last row's logits back."""

    def __init__(self, eng: te.Engine, max_tokens: int):
        self.eng = eng
        self.ids = torch.zeros(max_tokens, dtype=torch.int32, pin_memory=True)
        self.pos = torch.zeros(max_tokens, dtype=torch.int32, pin_memory=True)
        self.graph = None

    def step(self, tokens: list[int], start: int, use_graph: bool) -> torch.Tensor:
        n, e = len(tokens), self.eng
        self.ids[:n] = torch.tensor(tokens, dtype=torch.int32)
        self.pos[:n] = torch.arange(start, start + n, dtype=torch.int32)
        e.ids[:n].copy_(self.ids[:n], non_blocking=True)
        e.pos[:n].copy_(self.pos[:n], non_blocking=True)
        if use_graph and n == 1 and self.graph is not None:
            self.graph.replay()
        else:
            e.forward(n)
        e.bookkeeping(n)
        return e.logits[n - 1].cpu().float()  # a device-to-host copy; synchronizes

    def capture_decode_graph(self) -> None:
        g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                self.eng.forward(1)
        torch.cuda.synchronize()
        self.graph = g


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path, help="folder to write config.json and model.safetensors into")
    ap.add_argument("reference", type=Path, help="where to write the mine-reference/1 JSON")
    ap.add_argument("--lengths", default="7,33,90,150")
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--layers", default="1,3", help="dense,gated layer counts (dense first)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=20)
    a = ap.parse_args(argv)
    dense, gated = (int(x) for x in a.layers.split(","))
    kinds = ["dense"] * dense + ["gated"] * gated
    lengths = [int(x) for x in a.lengths.split(",")]
    pow2 = lambda v: v >= 64 and v & (v - 1) == 0  # noqa: E731  (tl.arange spans a row)
    if min(lengths) < 1 or a.new < 1 or not pow2(a.hidden) or not pow2(a.inter) or a.vocab % 128:
        raise SystemExit("lengths and --new must be >= 1, --hidden and --inter powers of two >= 64, "
                         "--vocab a multiple of 128")
    max_tok = max(lengths)
    ctx = 1 << (max_tok + a.new).bit_length()
    eng = te.Engine(kinds, a.hidden, a.vocab, a.inter, max_tok, ctx, a.seed, serving=True)
    config = {"model_type": "planted_triton", "vocab_size": a.vocab, "num_hidden_layers": len(kinds),
              "hidden_size": a.hidden, "intermediate_size": a.inter, "max_position_embeddings": ctx,
              "layer_kinds": kinds}
    write_checkpoint(eng, a.checkpoint, config)
    host = Host(eng, max_tok)
    t0 = time.time()
    host.step([0] * max_tok, 0, False)  # a profile pass at the most rows, as engines size memory
    host.step([0], 0, False)
    host.capture_decode_graph()
    eng.kv.zero_()
    snapshot_now()
    start_s = time.time() - t0
    reqs = []
    for n, prompt in enumerate(seeded_prompts(lengths, a.vocab, a.seed)):
        steps, out = [], []
        z = host.step(prompt, 0, False)
        for j in range(a.new):
            lp = torch.log_softmax(z, -1)
            v, i = lp.topk(a.top_k)
            steps.append(reference.Step(tuple(int(x) for x in i), tuple(float(x) for x in v)))
            out.append(int(i[0]))
            if j + 1 < a.new:
                z = host.step([out[-1]], len(prompt) + j, use_graph=n > 0)
        reqs.append(reference.Request(tuple(prompt), tuple(out), tuple(steps)))
    made = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "triton": te.triton.__version__, "engine_start_s": round(start_s, 2),
            "prompts": {"lengths": a.lengths, "seed": a.seed}, "layer_kinds": kinds}
    model = {k: config[k] for k in reference.MODEL_KEYS}
    ref = reference.Reference("planted triton_engine", "eager prefill, decode eager then CUDA graph", model,
                              checkpoint.fingerprint(a.checkpoint), a.top_k, tuple(reqs), made)
    reference.write(ref, a.reference)
    print(f"wrote {a.checkpoint} and {a.reference}: {len(reqs)} requests, {sum(len(r.output) for r in reqs)} steps")


if __name__ == "__main__":
    main()
