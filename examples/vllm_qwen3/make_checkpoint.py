"""Write a Qwen3 checkpoint with the Qwen3-0.6B geometry and seeded random weights.

No hub access exists on the GPU hosts (and weights must never be downloaded), so the model the
capture serves is made here: the geometry is what matters for the kernels vLLM picks, the values
only have to be deterministic so two runs (vLLM, kern) can be compared token for token.

    python3 make_checkpoint.py OUT_DIR [--seed 0] [--layers N --hidden H --heads Q --kv-heads K
                                   --head-dim D --inter I --vocab V --untied]

The flags change the geometry (the mining truth suite captures several); without them it is
Qwen3-0.6B's.
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
    for flag, key in (("--layers", "num_hidden_layers"), ("--hidden", "hidden_size"),
                      ("--heads", "num_attention_heads"), ("--kv-heads", "num_key_value_heads"),
                      ("--head-dim", "head_dim"), ("--inter", "intermediate_size"),
                      ("--vocab", "vocab_size")):
        ap.add_argument(flag, dest=key, type=int, default=GEOMETRY[key])
    ap.add_argument("--untied", action="store_true", help="an lm_head of its own")
    args = ap.parse_args()
    geometry = dict(GEOMETRY, **{k: getattr(args, k) for k in GEOMETRY if hasattr(args, k)})
    geometry["tie_word_embeddings"] = not args.untied
    named = geometry == GEOMETRY

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen3Config(**geometry, torch_dtype="bfloat16")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    (args.out / "mine-provenance.json").write_text(
        json.dumps({"geometry": "Qwen3-0.6B" if named else geometry, "seed": args.seed, "weights": "random (transformers init)"}, indent=1)
    )
    print(f"wrote {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
