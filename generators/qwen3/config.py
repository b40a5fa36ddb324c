"""The Qwen3 architecture facts the generator needs, read from a Hugging Face config.json.

Every field is checked once here (`ConfigError`, one sentence naming the key); layout arithmetic
lives on the dataclass so templates and checks share one source of numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vocab.errors import ConfigError  # noqa: F401  (re-exported: callers catch it from here)


@dataclass(frozen=True)
class Qwen3:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    theta: float
    max_pos: int
    tied: bool

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    @property
    def block_q(self) -> int:
        """Query rows per block of vLLM's unified Triton attention: 16 rows' worth of q heads per KV head."""
        qpk = self.heads // self.kv_heads
        return (16 if qpk <= 16 else 1 << (qpk - 1).bit_length()) // qpk

    @property
    def kv_bytes_per_token(self) -> int:
        """One layer's K and V for one token, bf16."""
        return 2 * self.kv_size * 2


def load(path: str | Path) -> Qwen3:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{p} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p} is not a JSON object")
    if raw.get("model_type") != "qwen3":
        raise ConfigError(f"{p}: model_type is {raw.get('model_type')!r}, not 'qwen3'")

    def num(key, typ=int, default=None):
        v = raw.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and v != int(v)) or v <= 0:
            raise ConfigError(f"{p}: `{key}` must be a positive {'integer' if typ is int else 'number'}, got {v!r}")
        return typ(v)

    rope = raw.get("rope_parameters") or {}
    theta = rope.get("rope_theta", raw.get("rope_theta"))
    if rope.get("rope_type", "default") != "default" or raw.get("rope_scaling"):
        raise ConfigError(f"{p}: only the default rope is generated (rope_type {rope.get('rope_type')!r})")
    if raw.get("attention_bias"):
        raise ConfigError(f"{p}: attention_bias is set; the generated attention has no bias")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{p}: hidden_act {raw.get('hidden_act')!r} is not silu")
    heads = num("num_attention_heads")
    cfg = Qwen3(
        hidden=num("hidden_size"), layers=num("num_hidden_layers"), heads=heads,
        kv_heads=num("num_key_value_heads"), head_dim=num("head_dim", default=raw.get("hidden_size", 0) // max(heads, 1)),
        inter=num("intermediate_size"), vocab=num("vocab_size"), eps=num("rms_norm_eps", float),
        theta=float(theta) if isinstance(theta, (int, float)) and theta > 0 else num("rope_theta", float),
        max_pos=num("max_position_embeddings"), tied=bool(raw.get("tie_word_embeddings", False)),
    )
    if cfg.heads % cfg.kv_heads:
        raise ConfigError(f"{p}: {cfg.heads} query heads are not a multiple of {cfg.kv_heads} KV heads")
    return cfg
