"""The K3 decode manifest at tensor/expert parallel `tp`, with or without decode-context parallelism.

`generate(c, kernels, experts, tp, max_ctx, seqs, dcp)` returns the manifest dict: program `decode`
(one row per sequence, up to `seqs` sequences, the batch replicated over the tp group, CUDA graph),
`load` and `derive`. Per member: 1/tp of the KDA/MLA output heads, 1/tp of the shared expert and the
dense FFN, experts r, r+tp, ... (round-robin), the KDA line split `by: heads`. Router, latent
down/up, norms, embed and lm_head are replicated.

MLA differs by form. DCP (TP8/EP8/DCP8): the latent slab is dealt `by: position` (token p on member
p % tp); each member attends all 96 heads over its positions and the partials are gathered and
LSE-merged (with W_UV + gate for its 12 heads). Plain (TP8/EP8, `dcp=False`): the slab is not dealt,
every member holds the latent rows of every token of the batch (1,152 B per token per MLA layer on
each member) and its attention is complete on its own; no partial crosses ranks. W_UV + gate for
the member's heads then o_proj, whose partial is summed over tp as in the KDA layers. The pinned
absorb and split-attention kernels are 96-head builds, so the plain form runs them for all heads and
selects its own at W_UV; that step's kernel (`PLAIN["vup_gate"]`) has no kernels.toml pin yet, so
the plain form stops with `build.UnpinnedKernel` naming it until one is added.
"""

from __future__ import annotations

from vocab.errors import UsageError

from . import layout, ops
from .build import Builder, render, stamp
from .config import K3
from .prefill import _fills, _moe_carries
from .weights import Binder

T, S = "tokens", "seqs"


def generate(c: K3, kernels, experts: int = 896, tp: int = 8, max_ctx: int = 262144, seqs: int = 64,
             dcp: bool = True) -> dict:
    ckpt = c.checkpoint(experts)
    heads = c.num_attention_heads
    if tp < 2 or heads % tp or experts % tp or c.intermediate_size % tp or c.shared_intermediate_size % tp:
        raise UsageError(f"--tp {tp} must be at least 2 and divide the {heads} heads and {experts} experts",
                         value=tp, limit=(heads, experts))
    if max_ctx < 1 or seqs < 1:
        raise UsageError("--max-ctx and the sequence count must be positive", value=(max_ctx, seqs), limit=1)
    inner, H = c.inner // tp, c.hidden_size
    b = Builder(stamp(f"{ckpt}/{c.num_hidden_layers}l/tp{tp}" + ("-dcp" if dcp else "")), kernels, {"rows": T})
    b.m["topology"] = {"groups": {"tp": tp}}
    b.var(T, seqs, "rows")
    b.var(S, seqs, "groups")
    mla, kda = c.mla_layers(), c.kda_layers()
    for i in mla:  # DCP deals token positions over the group; plain: every member holds every token
        shard = {"shard": {"group": "tp", "by": "position"}} if dcp else {}
        b.state(f"kv.{i}", bytes_per_token=layout.kv_bytes_per_token(c), **shard)
    for i in kda:
        b.state(f"kda.{i}", bytes_per_seq=layout.kda_line_bytes(c, heads // tp),
                shard={"group": "tp", "by": "heads", "segments": layout.kda_head_segments(c)})
    local_ctx = -(-max_ctx // tp) if dcp else max_ctx
    b.buf("token_ids", "i32", [T], "input", fill="token", domain={"min": 0, "max": c.vocab_size - 1})
    b.buf("slot_mapping", "i32", [T], "input", fill="slot", domain={"index_into": f"kv.{mla[0]}"})
    b.buf("block_table", "i32", [S, layout.pages(c, local_ctx)], "input",
          domain={"index_into": f"kv.{mla[0]}", "stride": c.kv_page_size})
    b.buf("seq_lens", "i32", [S], "input", fill="seq_len", domain={"min": 0 if dcp else 1, "max": max_ctx})
    b.buf("kda.line_index", "i32", [S], "input",
          domain={"index_into": f"kda.{kda[0]}", "stride": layout.kda_line_bytes(c, heads // tp)})
    b.buf("next_token", "i32", [S], "output", fill="tokens")

    local = experts // tp
    R = layout.route_rows(c, seqs, local)
    sh, di = c.shared_intermediate_size // tp, c.intermediate_size // tp
    kp = 4 * inner + c.kda_small_proj_rows
    fu = c.q_lora_rank + c.kv_a + inner
    part = heads * (c.kv_lora_rank + 1)  # per head: latent-space output + log-sum-exp
    for name, dt, shape in [
        ("hidden", "bf16", [T, H]), ("blocks", "bf16", [T, c.attn_res_slots, H]), ("x", "bf16", [T, H]),
        ("attn", "bf16", [T, inner]), ("attn_o", "bf16", [T, H]), ("mlp_o", "bf16", [T, H]),
        ("kda.kp", "bf16", [T, kp]), ("mla.fu", "bf16", [T, fu]), ("mla.qa", "bf16", [T, c.q_lora_rank]),
        ("mla.q", "bf16", [T, c.q_b]), ("mla.qlat", "bf16", [T, heads * c.kv_a]),
        ("mla.part", "f32", [T, part]), *([("mla.parts", "f32", [tp, T, part])] if dcp else []),
        *layout.routed_moe_workspaces(c, T, R, experts),
        ("moe.shgu", "bf16", [T, 2 * sh]), ("moe.shact", "bf16", [T, sh]), ("moe.sh_o", "bf16", [T, H]),
        ("dense.gu", "bf16", [T, 2 * di]), ("dense.act", "bf16", [T, di]), ("out.logits", "f32", [S, c.vocab_size]),
    ]:
        b.ws(name, dt, shape)
    _moe_carries(b, local)
    w = Binder(b, c, tp=tp)
    w.model_ends()
    for name in ops.SINGLE:
        if name not in ("kda_gather", "mla_prep", "mla_gather", "fmha", "sigmoid_mul", "last_rows", "kvb_aug"):
            ops.declare(b, name, experts)
    for name in ops.DECODE:
        if dcp or name not in ops.DCP_ONLY:
            ops.declare(b, name, experts, ops.DECODE)
    if not dcp:
        for name in ops.PLAIN:
            ops.declare(b, name, experts, ops.PLAIN)
    ops.declare_argmax(b, experts, S)
    for g in ("gemm", "gemm_f32", "allreduce") + (("allgather",) if dcp else ()):
        b.extern_op(g)

    calls = b.program("decode", batch={"groups": seqs, "rows": 1}, graph=True)
    load = b.program("load", once=True)
    derive = b.program("derive", derive=True)
    load.extend(_fills(c, local))
    calls.append({"label": "embed", "op": "embed", "args": [{"buf": "token_ids"}, {"buf": "embed"}, {"buf": "hidden"}, {"var": T}]})
    for i in c.layers:
        kind = "mla" if c.is_mla(i) else "kda"
        w.common(i)
        w.mla(i, False) if kind == "mla" else w.kda(i)
        moe = not c.is_dense(i)
        w.moe(i, experts) if moe else w.dense(i)
        res = dict(c=c, i=i, T=T, snap=c.is_snapshot(i), nb=c.snapshots_before(i),
                   nb_mlp=i // c.attn_res_block + 1, score_mlp=4 * H)
        calls += render("k3_res.j2", part="in", **res)
        st = f"kda.{i}" if kind == "kda" else f"kv.{i}"
        calls += render(f"k3_decode_{kind}.j2", c=c, i=i, T=T, st=st, inner=inner, kp=kp, fu=fu, part=part,
                        dcp=dcp)
        calls += render("k3_res.j2", part="mlp", **res)
        if moe:
            calls += render("k3_moe.j2", c=c, i=i, T=T, E=experts, tp=tp, sh=sh,
                            first_expert='{"rank": "tp"}', stride_log2=(tp - 1).bit_length())
        else:
            calls += render("k3_dense.j2", c=c, i=i, T=T, tp=tp, di=di)
        calls += render("k3_res.j2", part="add", **res)
        load += render("k3_load.j2", c=c, i=i, kind=kind, expand=False, conv_width=inner)
        derive += render("k3_derive.j2", c=c, i=i, kind=kind, moe=moe, experts=local, fc1_rows=layout.fc1_rows(c),
                         wsm_b=4 * inner + heads // tp, wsm_fa=c.kda_forget_rank, wsm_rows=kp)
    calls += render("k3_head.j2", c=c, T=T, S=S, nb=c.snapshots_before(c.num_hidden_layers), last_rows=False)
    return b.finish()
