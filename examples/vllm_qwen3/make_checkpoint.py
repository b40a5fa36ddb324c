"""Write a Qwen3 checkpoint with the Qwen3-0.6B geometry and seeded random weights.

No hub access exists on the GPU hosts (and weights must never be downloaded), so the model the
capture serves is made here: the geometry is what matters for the kernels vLLM picks, the values
only have to be deterministic so two runs (vLLM, kern) can be compared token for token.

    python3 make_checkpoint.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GEOMETRY = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    bos_token_id=151643,
    eos_token_id=151645,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen3Config(**GEOMETRY, torch_dtype="bfloat16")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    (args.out / "mine-provenance.json").write_text(
        json.dumps({"geometry": "Qwen3-0.6B", "seed": args.seed, "weights": "random (transformers init)"}, indent=1)
    )
    print(f"wrote {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
