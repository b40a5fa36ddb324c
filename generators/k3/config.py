"""The K3 architecture as data: read once from a K3 `config.json`, never scattered literals.

`load(path)` returns a frozen `K3`; every dimension the generator, the layout arithmetic and the
memory/binds tools use is a field or a derived property here. What it does not check: that the
numbers describe a real checkpoint (binds.py does that against safetensors headers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from vocab.errors import ConfigError  # noqa: F401  (re-exported: callers catch it from here)


@dataclass(frozen=True)
class K3:
    tensor_prefix: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    mla_layer_period: int
    mla_layer_offset: int
    mla_extra_layers: tuple
    first_k_dense_replace: int
    intermediate_size: int
    moe_intermediate_size: int
    shared_intermediate_size: int
    moe_latent_size: int
    num_experts_per_tok: int
    n_routed_experts_choices: dict
    routed_scaling_factor: float
    router_eps: float
    situ_alpha: float
    situ_beta: float
    mxfp_block: int
    kda_short_conv_kernel: int
    kda_small_proj_rows: int
    kda_forget_rank: int
    kda_decay_lower_bound: float
    kda_l2_eps: float
    rms_norm_eps: float
    attn_res_block: int
    attn_res_slots: int
    kv_page_size: int

    # ---- derived widths -------------------------------------------------------------------
    @property
    def inner(self) -> int:  # KDA q/k/v/g width and MLA gate width
        return self.num_attention_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_a(self) -> int:  # one cached latent row
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def q_b(self) -> int:
        return self.num_attention_heads * self.qk_head_dim

    @property
    def kv_b_rows(self) -> int:  # per head W_UK (nope) then W_UV
        return self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim)

    @property
    def kv_exp(self) -> int:  # prefill expansion: k (192) | v (128) per head
        return self.num_attention_heads * (self.qk_head_dim + self.v_head_dim)

    @property
    def mla_fused(self) -> int:
        return self.q_lora_rank + self.kv_a + self.inner

    @property
    def kda_fused(self) -> int:
        return 4 * self.inner

    @property
    def conv_taps(self) -> int:  # previous inputs a conv window keeps
        return self.kda_short_conv_kernel - 1

    @property
    def dense_gu(self) -> int:
        return 2 * self.intermediate_size

    @property
    def shared_gu(self) -> int:
        return 2 * self.shared_intermediate_size

    # ---- layer pattern ----------------------------------------------------------------------
    def is_mla(self, i: int) -> bool:
        return i % self.mla_layer_period == self.mla_layer_offset or i in self.mla_extra_layers

    def is_dense(self, i: int) -> bool:
        return i < self.first_k_dense_replace

    def is_snapshot(self, i: int) -> bool:
        return i % self.attn_res_block == 0

    def snapshots_before(self, i: int) -> int:
        """Valid bank slots when layer i starts (its own snapshot not yet taken)."""
        return -(-i // self.attn_res_block)

    @property
    def layers(self) -> range:
        return range(self.num_hidden_layers)

    def mla_layers(self) -> list[int]:
        return [i for i in self.layers if self.is_mla(i)]

    def kda_layers(self) -> list[int]:
        return [i for i in self.layers if not self.is_mla(i)]

    def checkpoint(self, experts: int) -> str:
        try:
            return self.n_routed_experts_choices[str(experts)]
        except KeyError:
            choices = ", ".join(sorted(self.n_routed_experts_choices, key=int))
            raise ConfigError(f"K3 has no {experts}-expert checkpoint (choices: {choices})") from None

    def tensor(self, name: str) -> str:
        return self.tensor_prefix + name


NON_NEGATIVE = {"mla_layer_offset", "first_k_dense_replace"}  # int fields that may be 0


def _bad_value(f, v) -> str | None:
    """What is wrong with `v` as the value of field `f`, or None."""
    def is_int(x):
        return type(x) is int

    if f.type == "int":
        low = 0 if f.name in NON_NEGATIVE else 1
        return None if is_int(v) and v >= low else f"must be an integer of at least {low}"
    if f.type == "float":
        return None if type(v) in (int, float) and math.isfinite(v) else "must be a finite number"
    if f.type == "str":
        return None if isinstance(v, str) else "must be a string"
    if f.name == "mla_extra_layers":
        return None if isinstance(v, list) and all(is_int(x) and x >= 0 for x in v) else \
            "must be a list of layer indices"
    if f.name == "n_routed_experts_choices":
        ok = isinstance(v, dict) and v and all(k.isdigit() and int(k) > 0 and isinstance(c, str) for k, c in v.items())
        return None if ok else "must map expert counts to checkpoint names"
    return None


def _from_dict(raw: dict, where: str) -> K3:
    names = [f.name for f in fields(K3)]
    missing = [n for n in names if n not in raw]
    if missing:
        raise ConfigError(f"{where}: K3 config lacks {', '.join(missing)}")
    for f in fields(K3):
        why = _bad_value(f, raw[f.name])
        if why:
            raise ConfigError(f"{where}: `{f.name}` {why}, got {raw[f.name]!r}", value=raw[f.name])
    vals = {n: raw[n] for n in names}
    vals["mla_extra_layers"] = tuple(vals["mla_extra_layers"])
    cfg = K3(**vals)
    if cfg.attn_res_slots * cfg.attn_res_block < cfg.num_hidden_layers:
        raise ConfigError(f"{where}: {cfg.attn_res_slots} attention-residual slots cannot hold "
                          f"{cfg.num_hidden_layers} layers at period {cfg.attn_res_block}")
    return cfg


def load(path: str | Path | None = None) -> K3:
    """Read a K3 config.json; None reads the bundled generators/configs/k3.json."""
    if path is None:
        text = resources.files("generators").joinpath("configs/k3.json").read_text()
        return _from_dict(json.loads(text), "configs/k3.json")
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not JSON (not UTF-8 text)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: a K3 config is a JSON object")
    return _from_dict(raw, str(p))
