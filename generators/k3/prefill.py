"""The whole-model K3 prefill manifest (one GPU, every expert, per-layer states), to be cut into stages.

`generate(c, kernels, experts, chunk, pack, max_ctx)` returns the manifest dict: program `prefill`
(packed chunk: `seqs` sequences, `tokens` rows, context `ctx`), `load` (once) and `derive` (inside
weight loading). Calls are labelled `l<i>.<step>`; each layer starts with `l<i>.res_in`, which is
where the pipeline cut goes. Only the hidden stream (`hidden`) and the attention-residual bank
(`blocks`) are live across a layer boundary. What it does not do: cut, verify, or read kernels.toml.
"""

from __future__ import annotations

from vocab.errors import UsageError

from . import layout, ops
from .build import Builder, render, stamp
from .config import K3
from .weights import Binder

T, S, CTX = "tokens", "seqs", "ctx"


def _io(b: Builder, c: K3, chunk: int, pack: int, max_ctx: int, first_kv: str, first_kda: str) -> None:
    line = layout.kda_line_bytes(c)
    b.buf("token_ids", "i32", [T], "input", fill="token", domain={"min": 0, "max": c.vocab_size - 1})
    b.buf("slot_mapping", "i32", [T], "input", fill="slot", domain={"index_into": first_kv})
    b.buf("block_table", "i32", [S, layout.pages(c, max_ctx)], "input",
          domain={"index_into": first_kv, "stride": c.kv_page_size})
    b.buf("seq_lens", "i32", [S], "input", fill="seq_len", domain={"min": 1, "max": max_ctx})
    b.buf("cu_seqlens", "i32", [pack + 1], "input", fill="cu_seqlens", domain={"min": 0, "max": chunk, "monotone": True})
    b.buf("kda.line_index", "i32", [S], "input", domain={"index_into": first_kda, "stride": line})
    b.buf("next_token", "i32", [S], "output", fill="tokens")


def _workspaces(b: Builder, c: K3, experts: int, chunk: int, pack: int) -> None:
    H = c.hidden_size
    R = layout.route_rows(c, chunk, experts)
    for name, dt, shape in [
        ("hidden", "bf16", [T, H]), ("blocks", "bf16", [T, c.attn_res_slots, H]), ("x", "bf16", [T, H]),
        ("attn", "bf16", [T, c.inner]), ("attn_o", "bf16", [T, H]), ("mlp_o", "bf16", [T, H]),
        ("kda.qkvg", "bf16", [T, c.kda_fused]), ("kda.small", "bf16", [T, c.kda_small_proj_rows]),
        ("kda.qkv", "bf16", [T, 3 * c.inner]), ("kda.beta", "f32", [T, c.num_attention_heads]),
        ("kda.flow", "bf16", [T, c.kda_forget_rank]), ("kda.g", "bf16", [T, c.inner]),
        ("mla.fu", "bf16", [T, c.mla_fused]), ("mla.qa", "bf16", [T, c.q_lora_rank]), ("mla.q", "bf16", [T, c.q_b]),
        ("mla.lat", "bf16", [CTX, c.kv_a]), ("mla.kv_exp", "bf16", [CTX, c.kv_exp]), ("mla.o", "bf16", [T, c.inner]),
        *layout.routed_moe_workspaces(c, T, R, experts),
        ("moe.shgu", "bf16", [T, c.shared_gu]), ("moe.shact", "bf16", [T, c.shared_intermediate_size]),
        ("dense.gu", "bf16", [T, c.dense_gu]), ("dense.act", "bf16", [T, c.intermediate_size]),
        ("out.last", "bf16", [S, H]), ("out.logits", "f32", [S, c.vocab_size]),
    ]:
        b.ws(name, dt, shape)


def _moe_carries(b: Builder, experts: int) -> list[dict]:
    for name, dt in (("moe.alpha", "f32"), ("moe.beta", "f32")):
        b.buf(name, dt, [experts], "carry")
    b.buf("moe.rs", "bf16", [1], "carry")
    return []


def _fills(c: K3, experts: int) -> list[dict]:
    return [
        {"label": "load.moe.alpha", "op": "fill_f32", "args": [{"buf": "moe.alpha"}, {"i32": experts}, {"f32": c.situ_alpha}]},
        {"label": "load.moe.beta", "op": "fill_f32", "args": [{"buf": "moe.beta"}, {"i32": experts}, {"f32": c.situ_beta}]},
        {"label": "load.moe.rs", "op": "fill_bf16", "args": [{"buf": "moe.rs"}, {"i32": 1}, {"f32": c.routed_scaling_factor}]},
        {"label": "load.out.res_score", "op": "res_scoring", "args": [{"buf": "out.res_score.src"}, {"buf": "out.res_score"}, {"i32": 1}]},
    ]


def generate(c: K3, kernels, experts: int = 896, chunk: int = 8192, pack: int = 16, max_ctx: int = 262144) -> dict:
    ckpt = c.checkpoint(experts)
    if chunk < 1 or pack < 1 or max_ctx < chunk:
        raise UsageError(f"need chunk >= 1, pack >= 1 and max-ctx >= chunk (got {chunk}, {pack}, {max_ctx})",
                         value=(chunk, pack, max_ctx))
    b = Builder(stamp(f"{ckpt}/{c.num_hidden_layers}l/ep1-prefill"), kernels, {"rows": T})
    b.var(T, chunk, "rows")
    b.var(S, pack, "groups")
    b.var(CTX, max_ctx)
    mla, kda = c.mla_layers(), c.kda_layers()
    for i in mla:
        b.state(f"kv.{i}", bytes_per_token=layout.kv_bytes_per_token(c))
    for i in kda:
        b.state(f"kda.{i}", bytes_per_seq=layout.kda_line_bytes(c))
    _io(b, c, chunk, pack, max_ctx, f"kv.{mla[0]}", f"kda.{kda[0]}")
    _workspaces(b, c, experts, chunk, pack)
    _moe_carries(b, experts)
    w = Binder(b, c, tp=1)
    w.model_ends()
    for name in ops.SINGLE:
        if name not in ("last_rows",):
            ops.declare(b, name, experts)
    b.kernel_op("last_rows", ops.module("k3_prefill_glue", experts), "last_rows")
    ops.declare_kda_fwd(b, T, S, c.inner)
    ops.declare_argmax(b, experts, S)
    for g in ("gemm", "gemm_acc", "gemm_f32"):
        b.extern_op(g)

    calls = b.program("prefill", batch={"groups": pack, "rows": T, "context": CTX})
    load = b.program("load", once=True)
    derive = b.program("derive", derive=True)
    load.extend(_fills(c, experts))
    calls.append({"label": "embed", "op": "embed", "args": [{"buf": "token_ids"}, {"buf": "embed"}, {"buf": "hidden"}, {"var": T}]})
    scale = round((c.qk_head_dim) ** -0.5, 9)
    for i in c.layers:
        kind = "mla" if c.is_mla(i) else "kda"
        w.common(i)
        getattr(w, kind)(i, True) if kind == "mla" else w.kda(i)
        moe = not c.is_dense(i)
        w.moe(i, experts) if moe else w.dense(i)
        nb = c.snapshots_before(i)
        res = dict(c=c, i=i, T=T, snap=c.is_snapshot(i), nb=nb, nb_mlp=i // c.attn_res_block + 1,
                   score_mlp=4 * c.hidden_size)
        calls += render("k3_res.j2", part="in", **res)
        st = f"{kind}.{i}" if kind == "kda" else f"kv.{i}"
        calls += render(f"k3_prefill_{kind}.j2", c=c, i=i, T=T, S=S, CTX=CTX, st=st, scale=scale)
        calls += render("k3_res.j2", part="mlp", **res)
        if moe:
            calls += render("k3_moe.j2", c=c, i=i, T=T, E=experts, tp=1, sh=c.shared_intermediate_size,
                            first_expert='{"i32": 0}', stride_log2=0)
        else:
            calls += render("k3_dense.j2", c=c, i=i, T=T, tp=1, di=c.intermediate_size)
        calls += render("k3_res.j2", part="add", **res)
        load += render("k3_load.j2", c=c, i=i, kind=kind, expand=True, conv_width=c.inner)
        derive += render("k3_derive.j2", c=c, i=i, kind=kind, moe=moe, experts=experts,
                         fc1_rows=layout.fc1_rows(c), wsm_b=c.num_attention_heads, wsm_fa=c.kda_forget_rank,
                         wsm_rows=c.kda_small_proj_rows)
    calls += render("k3_head.j2", c=c, T=T, S=S, nb=c.snapshots_before(c.num_hidden_layers), last_rows=True)
    return b.finish()


def cut_points(manifest: dict, c: K3, stages: int) -> list[int]:
    """Call indices of `l<a>.res_in` for each stage start a > 0 (where `mine cut` splits)."""
    labels = [call.get("label") for call in manifest["programs"]["prefill"]["calls"]]
    return [labels.index(f"l{a}.res_in") for a, _ in layout.stage_bounds(c, stages)[1:]]
