"""What vLLM 0.26.0 launches per Qwen3 layer, as data: kernel families, their pointer parameters
and which scalars are floats.

Facts read from vLLM's source (the mangled C++ signatures of `_C`, the Triton kernels'
Python signatures and how Triton 3.6 compiles them): a Triton parameter is kept in the launch ABI
unless it is a constexpr, None, or an unannotated int equal to 1; two 8-byte scratch pointers
(global, profile; NULL here) close every Triton ABI. Parameter *sizes* are never written here:
they come from the dump. Indices are positions in the launch ABI (the dump's `params[i]`).
A scalar that is not listed as a float is an integer of the size the dump records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vocab.wire import pointer_type

BF16, F32, I32, I64 = "bf16", "f32", "i32", "i64"


@dataclass(frozen=True)
class Family:
    match: str                      # substring of the mangled symbol
    n_params: int                   # ABI length vLLM 0.26 / Triton 3.6 give it
    ptrs: dict                      # index -> (role, direction, dtype | "state")
    floats: frozenset = field(default_factory=frozenset)
    exclude: str = ""
    seqs: int | None = None         # index of the sequence count, passed as the manifest's `seqs` var
    inserted: int | None = None     # a build with one parameter more than the family's first: where it sits


FAMILIES = {
    # rms_norm_kernel<bf16, VEC, NUM_DIMS, ..>(out, input, 5 x i64 strides/shapes, weight, i64, f32 eps, i32 tokens, i32 hidden)
    "rms": Family("rms_norm_kernel", 12, {0: ("out", "out", BF16), 1: ("inp", "in", BF16), 7: ("weight", "in", BF16)},
                  frozenset({9}), exclude="fused_add"),
    # fused_add_rms_norm_kernel<bf16, 8, ..>(input, i64 stride, residual, weight, f32 eps, i32 tokens, i32 hidden)
    "fadd": Family("fused_add_rms_norm_kernel", 7,
                   {0: ("x", "inout", BF16), 2: ("residual", "inout", BF16), 3: ("weight", "in", BF16)}, frozenset({4})),
    # rotary_embedding_kernel<bf16, bf16, neox>(positions, query, key, cos_sin, i32 rot_dim, 3 x i64 strides, 3 x i32 heads, i64, bool)
    "rope": Family("rotary_embedding_kernel", 13,
                   {0: ("positions", "in", I64), 1: ("query", "inout", BF16), 2: ("key", "inout", BF16), 3: ("cos_sin", "in", BF16)}),
    # act_and_mul_kernel<bf16, bf162, silu, ..>(out, input, i32 d, 3 x f32)
    "silu": Family("silu_kernel", 6, {0: ("out", "out", BF16), 1: ("inp", "in", BF16)}, frozenset({3, 4, 5}),
                   exclude="quant"),
    # reshape_and_cache_kernel_flash(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, 7 x i64, 2 scratch)
    "cache": Family("reshape_and_cache_kernel_flash", 16, {
        0: ("key", "in", BF16), 1: ("value", "in", BF16), 2: ("k_cache", "inout", "state"), 3: ("v_cache", "inout", "state"),
        4: ("slots", "in", I64), 5: ("k_scale", "in", F32), 6: ("v_scale", "in", F32)}, exclude="diffkv"),
    # kernel_unified_attention, 2D: out, q, k, v, block_table, seq_lens, scale, k_scale, v_scale, out_scale, softcap,
    # 6 x i64 strides, rswa_prefix_lens (= seq_lens), 6 x i64 cache strides, query_start_len, i32 num_seqs, 2 scratch
    "attn": Family("kernel_unified_attention", 28, {
        0: ("out", "out", BF16), 1: ("query", "in", BF16), 2: ("k_cache", "in", "state"), 3: ("v_cache", "in", "state"),
        4: ("block_table", "in", I32), 5: ("seq_lens", "in", I32), 7: ("k_scale", "in", F32), 8: ("v_scale", "in", F32),
        17: ("seq_lens", "in", I32), 24: ("cu_seqlens", "in", I32)}, frozenset({6, 9, 10}), exclude="diffkv", seqs=25),
    # reduce_segments(out, segm_output, segm_max, segm_expsum, seq_lens, f32 out_scale_inv, 3 x i64, query_start_len, 2 scratch)
    "reduce": Family("reduce_segments", 12, {
        0: ("out", "out", BF16), 1: ("segm_out", "in", F32), 2: ("segm_max", "in", F32), 3: ("segm_expsum", "in", F32),
        4: ("seq_lens", "in", I32), 9: ("cu_seqlens", "in", I32)}, frozenset({5})),
}
# The 3D (split-KV decode) build of kernel_unified_attention adds the three segment buffers.
ATTN3D = Family("kernel_unified_attention", 31, {
    **FAMILIES["attn"].ptrs, 26: ("segm_out", "out", F32), 27: ("segm_max", "out", F32), 28: ("segm_expsum", "out", F32)},
    FAMILIES["attn"].floats, seqs=25)
# reduce_segments as Triton builds it for more than one sequence: its unannotated `num_seqs` is 1 in
# a single-sequence forward, which Triton folds into the build (the 12-parameter ABI above); at
# several sequences it is parameter 5 (13 parameters; tests/fixtures/batched/q2b shows both).
REDUCE_SEQS = Family("reduce_segments", 13, {
    **{i: r for i, r in FAMILIES["reduce"].ptrs.items() if i < 5}, 10: ("cu_seqlens", "in", I32)},
    frozenset({6}), seqs=5, inserted=5)
# tag -> the builds of other ABI lengths a tag's kernel has
BUILDS = {"reduce": (FAMILIES["reduce"], REDUCE_SEQS)}


def family_of(tag_: str, role: str, n_params: int) -> Family:
    """The family of one launch: its tag's (or the 3D attention's), the build matching its ABI
    length where the kernel has several (a kernel Triton specialises on a sequence count of one)."""
    if role == "attn3d":
        return ATTN3D
    return next((f for f in BUILDS.get(tag_, ()) if f.n_params == n_params), FAMILIES[tag_])


def base_index(fam: Family, i: int) -> int:
    """Parameter i of a build as the index it has in the family's first ABI, so that one table of
    model facts (`mined._expected`) serves both builds; the inserted parameter itself maps to -1."""
    if fam.inserted is None or i < fam.inserted:
        return i
    return -1 if i == fam.inserted else i - 1

# rms_norm's and fused_add's hidden-size and token-count scalars, used to read a forward's structure
RMS_TOKENS, RMS_HIDDEN = 10, 11
FADD_TOKENS, FADD_HIDDEN = 5, 6
# kernel_unified_attention's num_seqs (2D and 3D builds): tells single-sequence forwards from
# vLLM's warm-ups that batch one token per sequence
NUM_SEQS = 25
F32_EXPECT = {("rms", 9): "eps", ("fadd", 4): "eps", ("attn", 6): "scale"}


def tag(symbol: str) -> str | None:
    """The family of a launch by its mangled symbol, None for everything else (GEMMs, ATen, sampling)."""
    for name, fam in FAMILIES.items():
        if fam.match in symbol and not (fam.exclude and fam.exclude in symbol):
            if name == "silu" and "act_and_mul" not in symbol:
                continue
            return name
    return None


def ptype(direction: str, dtype: str) -> str:
    """The param type of a pointer parameter (a FAMILIES entry's direction and dtype)."""
    return pointer_type(direction, dtype)
