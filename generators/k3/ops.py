"""The K3 op table as data: op name -> the kernels.toml module family and entry that implements it.

Families whose build depends on the expert count resolve to their `+EXPERTS=<n>` variant when n is
not the default 224 (kern's naming: defines only when non-default). Declaring an op whose module or
entry kernels.toml lacks raises `build.UnpinnedKernel` naming it.
"""

from __future__ import annotations

FC1 = "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_Ab32_Bb32_Cb32_t128x128x256u2_s4x4x4x4x1x4_et128x32_m256x128x32_c2x1x1_rM_TN_transOut_schPd2x1x2x3_biasFp32M_fCp_bN_ldgsts_ldgstsSf_rgTma_clmp_siTuGlu_lbW4_lsfbW4_dynB_sm100f"
FC2 = "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_Ab32_Bb32_t128x128x256u2_s4_et128x64_m256x128x32_c2x1x1_rM_TN_transOut_schPd2x1x2x3_biasFp32M_bN_rgTma_clmp_dynB_sm100f"
FMHA = "fmhaSm103aKernel_QkvBfloat16OBfloat16HQk192HV128SeparateQkvCausalVarSeqQ256Kv128PersistentContext"
DEFAULT_EXPERTS = 224
EXPERT_BUILT = ("k3_router_argmax", "k3_prefill_glue")

# op -> (module family, entry); one launch each
SINGLE = {
    "embed": ("embedding", "embedding_bf16"),
    "res_first": ("k3_residual", "attnres_rms_first"),
    "res_in": ("k3_residual", "attnres_rms"),
    "res_in_snap": ("k3_residual", "attnres_rms_snap"),
    "res_mlp": ("k3_residual", "land_add_attnres_rms"),
    "land_add": ("k3_residual", "land_add2"),
    "kda_gather": ("k3_span_gather", "span_gather"),
    "mla_prep": ("k3_mla_prep", "mla_prep_gather"),
    "mla_gather": ("k3_mla_glue", "mla_gather"),
    "fmha": ("trtllm_fmha_ctx_h192_v128", FMHA),
    "sigmoid_mul": ("sigmoid_mul", "sigmoid_mul_cols"),
    "router_topk": ("k3_router_argmax", "router_topk"),
    "route_map": ("flashinfer_moe_routing", "moe_route_map"),
    "latent_quant": ("k3_prefill_glue", "latent_quant"),
    "moe_fc1": (FC1, "fc1"),
    "moe_fc2": (FC2, "fc2"),
    "moe_finalize": ("k3_prefill_glue", "moe_finalize"),
    "latent_rms": ("k3_prefill_glue", "latent_rms"),
    "situ": ("k3_prefill_glue", "situ_glu"),
    "last_rows": ("k3_prefill_glue", "last_rows"),
    "res_scoring": ("k3_weight_prep", "res_scoring"),
    "conv_taps": ("k3_weight_prep", "conv_taps"),
    "kvb_aug": ("k3_weight_prep", "kvb_aug"),
    "wsm_pack": ("k3_weight_prep", "wsm_pack"),
    "moe_shuffle": ("k3_weight_prep", "moe_w_shuffle"),
    "fill_f32": ("k3_weight_prep", "fill_f32"),
    "fill_bf16": ("k3_weight_prep", "fill_bf16"),
}
# the TP8 / DCP decode swaps these in
DECODE = {
    "kda_core": ("k3_kda_core+HEADS=12+KDA_CONV=1+LDS=6400+WSM_FA=12+WSM_LDS=6400", "kda_core"),
    "mla_prep": ("k3_mla_prep+INNER=1536+MLA_FUSED=3648", "mla_prep"),
    "absorb": ("k3_mla_absorb_mma", "mla_absorb_mma"),
    "mla_split": ("k3_mla_v2", "mla_decode_split"),
    "dcp_merge": ("k3_dcp", "dcp_merge_vup_gate"),
}
DCP_ONLY = ("dcp_merge",)
# the plain TP decode (no DCP): W_UV + output gate for the member's heads from its own complete
# attention output. The reference names this kernel (`mla_vup_gate`) but gives no pin, and
# kernels.toml has none: declaring it raises build.UnpinnedKernel naming it.
PLAIN = {
    "vup_gate": ("k3_mla_vup_gate", "mla_vup_gate"),
}
ROLE_N = 1 << 16  # element-count role of load/derive grids (grid-stride kernels)


def module(family: str, experts: int) -> str:
    if family in EXPERT_BUILT and experts != DEFAULT_EXPERTS:
        return f"{family}+EXPERTS={experts}"
    return family


def declare(b, name: str, experts: int, table=SINGLE) -> str:
    family, entry = table[name]
    return b.kernel_op(name, module(family, experts), entry, roles={"n": ROLE_N})


def declare_kda_fwd(b, T: str, S: str, inner: int) -> None:
    """FlashKDA K1 (varlen prepare) then the recurrence from/to each sequence's line, output gate fused."""
    p = ["in buffer<bf16>", "in buffer<bf16>", "in buffer<f32>", "in buffer<f32>", "inout state",
         "in buffer<i32>", "in buffer<i32>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32"]
    b.multi_op("kda_fwd", p, [
        ("flash_kda_d128_varlen", "flash_kda_prepare",
         [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 6}, {"scratch": "prep"}, {"param": 9}, {"param": 10}]),
        ("k3_kda_rec", "kda_rec",
         [{"scratch": "prep"}, {"param": 7}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"param": 8}, {"param": 9}, {"param": 10}]),
    ], scratch={"prep": ("bf16", [T, 3 * inner])})


def declare_argmax(b, experts: int, rows: str) -> None:
    mod = module("k3_router_argmax", experts)
    b.multi_op("argmax", ["in buffer<f32>", "out buffer<i32>", "i32"], [
        (mod, "argmax_partial", [{"param": 0}, {"scratch": "pval"}, {"scratch": "pidx"}, {"param": 2}]),
        (mod, "argmax_final", [{"scratch": "pval"}, {"scratch": "pidx"}, {"param": 1}, {"param": 2}]),
    ], scratch={"pval": ("f32", ["rows", 64]), "pidx": ("i32", ["rows", 64])}, roles={"rows": rows})
