"""Byte and shape arithmetic of K3 buffers and states, in one place.

States: the MLA latent slab (bytes per token per MLA layer) and the KDA line (bytes per sequence per
KDA layer: f32 recurrent state [heads][dv][dk], then three bf16 conv windows [taps][heads*dk]).
Expert weights: MXFP4 packed (two e2m1 per byte) plus one UE8M0 scale per `mxfp_block` elements.
"""

from __future__ import annotations

from vocab.errors import UsageError

from .config import K3

BF16, F32 = 2, 4


def kv_bytes_per_token(c: K3) -> int:
    return c.kv_a * BF16


def kda_rec_bytes(c: K3, heads: int | None = None) -> int:
    h = c.num_attention_heads if heads is None else heads
    return h * c.head_dim * c.head_dim * F32


def kda_conv_row_bytes(c: K3, heads: int | None = None) -> int:
    """One tap of one conv window (q, k or v) over `heads` heads."""
    h = c.num_attention_heads if heads is None else heads
    return h * c.head_dim * BF16


def kda_line_bytes(c: K3, heads: int | None = None) -> int:
    return kda_rec_bytes(c, heads) + 3 * c.conv_taps * kda_conv_row_bytes(c, heads)


def kda_head_segments(c: K3) -> list[list[int]]:
    """`by: heads` segments of a full line: [row count, row bytes], each row head-major."""
    return [[1, kda_rec_bytes(c)], [3 * c.conv_taps, kda_conv_row_bytes(c)]]


def fc1_rows(c: K3) -> int:
    return 2 * c.moe_intermediate_size


def packed_cols(k: int) -> int:
    return k // 2


def scale_cols(c: K3, k: int) -> int:
    return k // c.mxfp_block


def routed_moe_workspaces(c: K3, T, R, experts: int) -> list[tuple]:
    """(name, dtype, shape) of the routed-MoE workspaces, the same in prefill and decode: router
    logits, top-k ids and weights, the routing map over R routed rows, the latent activations and
    their MXFP quantisation, the expert intermediate, the expert outputs and their combination."""
    return [
        ("moe.logits", "f32", [T, experts]), ("moe.ids", "i32", [T, c.num_experts_per_tok]),
        ("moe.w", "f32", [T, c.num_experts_per_tok]), ("moe.map", "i32", [R]),
        ("moe.lat", "bf16", [T, c.moe_latent_size]), ("moe.lq", "u8", [T, c.moe_latent_size]),
        ("moe.lsf", "u8", [T, scale_cols(c, c.moe_latent_size)]),
        ("moe.h", "u8", [R, c.moe_intermediate_size]), ("moe.hsf", "u8", [R, scale_cols(c, c.moe_intermediate_size)]),
        ("moe.y", "bf16", [R, c.moe_latent_size]), ("moe.comb", "bf16", [T, c.moe_latent_size]),
    ]


def expert_bytes(c: K3) -> int:
    h, i, lat = c.moe_latent_size, c.moe_intermediate_size, c.moe_latent_size
    w13 = 2 * i * packed_cols(h) + 2 * i * scale_cols(c, h)
    w2 = lat * packed_cols(i) + lat * scale_cols(c, i)
    return w13 + w2


def route_rows(c: K3, tokens: int, experts: int, tile: int = 128) -> int:
    """Rows of the expert-sorted activations: every (token, pick) plus one tile of padding per expert."""
    return tokens * c.num_experts_per_tok + experts * tile


def pages(c: K3, ctx: int) -> int:
    return -(-ctx // c.kv_page_size)


def stage_bounds(c: K3, stages: int) -> list[tuple[int, int]]:
    """Layers [a, b) of each pipeline stage: cut every attention-residual block."""
    per = -(-c.num_hidden_layers // stages)
    out = [(a, min(a + per, c.num_hidden_layers)) for a in range(0, c.num_hidden_layers, per)]
    if len(out) != stages:
        raise UsageError(f"{c.num_hidden_layers} layers do not split into {stages} stages of {per}",
                         value=stages, limit=c.num_hidden_layers)
    return out
