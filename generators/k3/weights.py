"""Checkpoint binds of K3 weights, one rank or sharded over a tp group of `tp` members.

Every weight/source buffer of a layer is declared here with its `bind` segments (tensor names carry
the config's prefix). Sharding: head-split tensors take this member's row or column range, experts
are dealt round-robin (member r holds experts r, r+tp, ...). Returns nothing; declares on the Builder.
"""

from __future__ import annotations

from . import layout
from .config import K3

BF16, F32, U8 = "bf16", "f32", "u8"


class Binder:
    def __init__(self, b, c: K3, tp: int):
        self.b, self.c, self.tp = b, c, tp

    def t(self, i, name):
        return self.c.tensor(f"model.layers.{i}.{name}" if i is not None else name)

    def rows(self, width):
        """This member's `width`-row slice (or the whole tensor at tp 1)."""
        if self.tp == 1:
            return None
        return {"group": "tp", "ranges": [[r * width, (r + 1) * width] for r in range(self.tp)]}

    def seg(self, tensor, rows=None, cols=None):
        s = {"tensor": tensor}
        if rows is not None:
            s["rows"] = rows
        if cols is not None:
            s["cols"] = cols
        return s

    def weight(self, name, dtype, shape, segs, kind="weight"):
        self.b.buf(name, dtype, shape, kind, bind=segs)

    # ---- per layer ----------------------------------------------------------------------------
    def common(self, i):
        L, H = f"l{i}.", self.c.hidden_size
        self.weight(L + "norms", BF16, [2, H], [self.seg(self.t(i, "input_layernorm.weight")),
                                               self.seg(self.t(i, "post_attention_layernorm.weight"))])
        names = ([] if i == 0 else ["self_attention_res_norm.weight", "self_attention_res_proj.weight"]) + \
                ["mlp_res_norm.weight", "mlp_res_proj.weight"]
        self.weight(L + "res_score.src", BF16, [len(names), H], [self.seg(self.t(i, n)) for n in names])
        self.b.buf(L + "res_score", F32, [2, H], "carry")

    def kda(self, i):
        c, L, H, tp = self.c, f"l{i}.", self.c.hidden_size, self.tp
        inner = c.inner // tp
        heads = c.num_attention_heads // tp
        at = "self_attn."
        qkvg = [self.seg(self.t(i, at + f"{p}_proj.weight"), self.rows(inner)) for p in "qkvg"]
        small = [self.seg(self.t(i, at + "b_proj.weight"), self.rows(heads)),
                 self.seg(self.t(i, at + "f_a_proj.weight"))]
        if tp == 1:
            self.weight(L + "wbig", BF16, [4 * inner, H], qkvg)
            self.weight(L + "wsm.src", BF16, [heads + c.kda_forget_rank, H], small, kind="source")
            self.b.buf(L + "wsm", BF16, [c.kda_small_proj_rows, H], "carry")
        else:  # decode fuses q|k|v|g and the small block into one GEMM weight, packed by derive
            self.weight(L + "wsm.src", BF16, [4 * inner + heads + c.kda_forget_rank, H], qkvg + small, kind="source")
            self.b.buf(L + "wsm", BF16, [4 * inner + c.kda_small_proj_rows, H], "carry")
        self.weight(L + "f_b", BF16, [inner, c.kda_forget_rank], [self.seg(self.t(i, at + "f_b_proj.weight"), self.rows(inner))])
        self.weight(L + "conv.src", F32, [3, inner, c.kda_short_conv_kernel],
                    [self.seg(self.t(i, at + f"{p}_conv1d.weight"), self.rows(inner)) for p in "qkv"])
        self.b.buf(L + "cw", F32, [3, c.kda_short_conv_kernel, inner], "carry")
        a_cols = [0, c.num_attention_heads] if tp == 1 else \
            {"group": "tp", "ranges": [[r * heads, (r + 1) * heads] for r in range(tp)]}
        self.weight(L + "kda_vec", F32, [inner + heads + c.head_dim],
                    [self.seg(self.t(i, at + "dt_bias"), self.rows(inner)),
                     self.seg(self.t(i, at + "A_log"), cols=a_cols),
                     self.seg(self.t(i, at + "o_norm.weight"))])
        self.o_proj(i, inner)

    def o_proj(self, i, inner):
        H = self.c.hidden_size
        cols = None if self.tp == 1 else {"group": "tp", "ranges": [[r * inner, (r + 1) * inner] for r in range(self.tp)]}
        self.weight(f"l{i}.o_proj", BF16, [H, inner], [self.seg(self.t(i, "self_attn.o_proj.weight"), cols=cols)])

    def mla(self, i, expand: bool):
        c, L, H, tp = self.c, f"l{i}.", self.c.hidden_size, self.tp
        inner = c.inner // tp
        at = "self_attn."
        self.weight(L + "wfu", BF16, [c.q_lora_rank + c.kv_a + inner, H],
                    [self.seg(self.t(i, at + "q_a_proj.weight")), self.seg(self.t(i, at + "kv_a_proj_with_mqa.weight")),
                     self.seg(self.t(i, at + "g_proj.weight"), self.rows(inner))])
        self.weight(L + "mla_norms", BF16, [c.q_lora_rank + c.kv_lora_rank],
                    [self.seg(self.t(i, at + "q_a_layernorm.weight")), self.seg(self.t(i, at + "kv_a_layernorm.weight"))])
        self.weight(L + "q_b", BF16, [c.q_b, c.q_lora_rank], [self.seg(self.t(i, at + "q_b_proj.weight"))])
        self.weight(L + "kv_b", BF16, [c.kv_b_rows, c.kv_lora_rank], [self.seg(self.t(i, at + "kv_b_proj.weight"))])
        if expand:
            self.b.buf(L + "w_aug", BF16, [c.kv_exp, c.kv_a], "carry")
        self.o_proj(i, inner)

    def dense(self, i):
        c, L, H = self.c, f"l{i}.", self.c.hidden_size
        di = c.intermediate_size // self.tp
        self.weight(L + "wgu", BF16, [2 * di, H], [self.seg(self.t(i, f"mlp.{p}_proj.weight"), self.rows(di)) for p in ("gate", "up")])
        cols = None if self.tp == 1 else {"group": "tp", "ranges": [[r * di, (r + 1) * di] for r in range(self.tp)]}
        self.weight(L + "down", BF16, [H, di], [self.seg(self.t(i, "mlp.down_proj.weight"), cols=cols)])

    def moe(self, i, experts: int):
        c, L, H, tp = self.c, f"l{i}.", self.c.hidden_size, self.tp
        m = "block_sparse_moe."
        sh = c.shared_intermediate_size // tp
        self.weight(L + "router", BF16, [experts, H], [self.seg(self.t(i, m + "gate.weight"))])
        self.weight(L + "router_bias", F32, [experts], [self.seg(self.t(i, m + "gate.e_score_correction_bias"))])
        self.weight(L + "lat_down", BF16, [c.moe_latent_size, H], [self.seg(self.t(i, m + "routed_expert_down_proj.weight"))])
        self.weight(L + "lat_up", BF16, [H, c.moe_latent_size], [self.seg(self.t(i, m + "routed_expert_up_proj.weight"))])
        self.weight(L + "lat_norm", BF16, [c.moe_latent_size], [self.seg(self.t(i, m + "routed_expert_norm.weight"))])
        self.weight(L + "wsh", BF16, [2 * sh, H], [self.seg(self.t(i, m + f"shared_experts.{p}_proj.weight"), self.rows(sh)) for p in ("gate", "up")])
        cols = None if tp == 1 else {"group": "tp", "ranges": [[r * sh, (r + 1) * sh] for r in range(tp)]}
        self.weight(L + "sh_down", BF16, [H, sh], [self.seg(self.t(i, m + "shared_experts.down_proj.weight"), cols=cols)])
        local = experts // tp
        h, inter = c.moe_latent_size, c.moe_intermediate_size
        shapes = {"w13": [2 * inter, layout.packed_cols(h)], "sf13": [2 * inter, layout.scale_cols(c, h)],
                  "w2": [h, layout.packed_cols(inter)], "sf2": [h, layout.scale_cols(c, inter)]}
        parts = {"w13": [("w3", "weight_packed"), ("w1", "weight_packed")],
                 "sf13": [("w3", "weight_scale"), ("w1", "weight_scale")],
                 "w2": [("w2", "weight_packed")], "sf2": [("w2", "weight_scale")]}
        for key, shape in shapes.items():
            segs = []
            for j in range(local):
                for w, kind in parts[key]:
                    names = [self.t(i, f"{m}experts.{j * tp + r}.{w}.{kind}") for r in range(tp)]
                    segs.append({"tensor": names[0] if tp == 1 else {"group": "tp", "tensors": names}})
            self.weight(L + key + ".raw", U8, [local] + shape, segs, kind="source")
            self.b.buf(L + key, U8, [local] + shape, "carry")

    def model_ends(self):
        c, H = self.c, self.c.hidden_size
        self.weight("embed", BF16, [c.vocab_size, H], [self.seg(self.t(None, "model.embed_tokens.weight"))])
        self.weight("out.norm", BF16, [H], [self.seg(self.t(None, "model.norm.weight"))])
        self.weight("out.res_score.src", BF16, [2, H], [self.seg(self.t(None, "model.output_attn_res_norm.weight")),
                                                       self.seg(self.t(None, "model.output_attn_res_proj.weight"))])
        self.b.buf("out.res_score", F32, [H], "carry")
        self.weight("out.lm_head", BF16, [c.vocab_size, H], [self.seg(self.t(None, "lm_head.weight"))])
