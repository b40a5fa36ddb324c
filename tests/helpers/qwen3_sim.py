"""A hand-made vLLM Qwen3 capture (docs/dump-format.md v1) for the Qwen3 generator's tests.

It writes the launches vLLM 0.26.0 makes per layer with TRITON_ATTN (eager, one sequence): the
families and parameter layouts of `generators/qwen3/kernels.py`, at addresses laid out the way
vLLM's tensors are (q/k/v views of one fused qkv allocation, one residual, a KV pool with one
region per layer), with a GEMM between them that has no layout. A profiling pass without attention
comes first (the generator must leave it out). `plant` lets a test break one relation.
Written for this project; the cubin bytes are placeholders (no ABI check against them).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

SYM = {
    "rms": "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb0EEEvPT_PKS3_lllllS6_lfii",
    "rms_head": "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi3ELb0EEEvPT_PKS3_lllllS6_lfii",
    "fadd": "_ZN4vllm25fused_add_rms_norm_kernelIN3c108BFloat16ELi8ELb0EEENSt9enable_ifIXaagtT0_Li0Esr4vllm12_typeConvertIT_EE6existsEvE4typeEPS4_lS7_PKS4_fii",
    "rope": "_ZN4vllm23rotary_embedding_kernelIN3c108BFloat16ES2_Lb1EEEvPKlPT_S6_PKT0_illliiilb",
    "silu": "_ZN4vllm18act_and_mul_kernelIN3c108BFloat16E14__nv_bfloat162XadL_ZNS_11silu_kernelIS2_EET_RKS5_fEEXadL_ZNS_18packed_silu_kernelIS3_EES5_S7_fEELb1ELb0ELb0ELb0EEEvPS5_PS6_ifff",
    "cache": "reshape_and_cache_kernel_flash",
    "attn": "kernel_unified_attention",
    "reduce": "reduce_segments",
    "gemm": "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_coopA_TNT",
    # cuBLASLt picks a kernel per GEMM shape, so each projection has its own symbol
    "qkv": "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "o": "nvjet_sm90_tst_8x64_64x16_2x1_v_bz_TNN",
    "gate_up": "nvjet_sm90_tst_64x24_64x16_1x2_h_bz_TNT", "down": "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
    "lm_head": "nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT",
    "embed": "_ZN2at6native44_GLOBAL__N__50c743a2_11_Indexing_cu_89862edb21indexSelectSmallIndex",
}
SHA = {k: hashlib.sha256(f"placeholder cubin {k}".encode()).hexdigest() for k in ("C", "cache", "attn2d", "attn3d", "reduce", "gemm")}
MODULE = {"rms": "C", "rms_head": "C", "fadd": "C", "rope": "C", "silu": "C", "cache": "cache",
          "reduce": "reduce", "gemm": "gemm", "qkv": "gemm", "o": "gemm", "gate_up": "gemm", "down": "gemm",
          "lm_head": "gemm", "embed": "gemm"}
EPS, BS, W, SEGS = 1e-6, 16, 256, 16


class Alloc:
    def __init__(self):
        self.next, self.id = 0x7F0000000000, 10

    def __call__(self, size):
        self.id += 1
        base = self.next
        self.next += (size + 0xFFFFF) & ~0xFFFFF
        return (base, size, self.id)


def P(alloc, off=0):
    return ("ptr", alloc, off)


def _param(i, off, v):
    kind = v[0]
    if kind == "ptr":
        _, (base, size, bid), o = v
        return {"i": i, "off": off, "size": 8, "hex": (base + o).to_bytes(8, "little").hex(),
                "ptrs": [{"at": 0, "base": hex(base), "size": size, "id": bid, "off": o}]}, 8
    fmt, size = {"i64": ("<q", 8), "i32": ("<i", 4), "f32": ("<f", 4), "u8": ("<B", 1)}[kind]
    return {"i": i, "off": off, "size": size, "hex": struct.pack(fmt, v[1]).hex()}, size


def simulate(out: Path, cfg, prompts=(34, 85, 5), steps=3, plant=None) -> Path:
    """Write pid100/ under `out`; plant(layer, role, params) may edit one call's params."""
    A = Alloc()
    H, D, L = cfg.hidden, cfg.head_dim, cfg.layers
    q, kv, qkvw = cfg.q_size, cfg.kv_size, cfg.qkv_size
    maxT = 512
    R, X, QKV, Qb, Kb, ATT, GU, ACT = (A(maxT * w * 2) for w in (H, H, qkvw, q, kv, q, 2 * cfg.inter, cfg.inter))
    POS, SLOTS, BT, SL, CU, COS = A(maxT * 8), A(maxT * 8), A(W * 4), A(64), A(64), A(W * BS * D * 2)
    SEGO, SEGM, SEGE = A(1 << 20), A(1 << 16), A(1 << 16)
    WTS = A(L * 8 * H * 2 + (1 << 20))
    KV = A(L * 64 * BS * kv * 4)
    SCALES = A(L * 16)
    kvb = cfg.kv_heads * BS * 2 * D     # vLLM 0.26 Triton layout: [block][token][kv head][K|V][D]
    row = cfg.kv_heads * 2 * D
    qpk = cfg.heads // cfg.kv_heads
    bq = (16 if qpk <= 16 else 1 << (qpk - 1).bit_length()) // qpk
    recs, seq, t = [], [0], [1_000_000_000]

    def w(layer, k):
        return P(WTS, (layer * 8 + k) * H * 2)

    def launch(kind, grid, block, params, layer=-1, role="", sha=None, regs=32):
        if plant:
            plant(layer, role, params)
        ps, off = [], 0
        for i, v in enumerate(params):
            rec, size = _param(i, off, v)
            off += size
            ps.append(rec)
        sha = sha or SHA[MODULE[kind]]
        recs.append({"seq": seq[0], "t_ns": t[0], "tid": 1, "dev": 0, "ctx": "0x1", "stream": "0x0", "api": "cuLaunchKernel",
                     "result": 0, "graph": None, "handle": "function", "func": "0x2", "module": 1, "sha256": sha,
                     "symbol": SYM[kind], "name": SYM[kind], "grid": list(grid), "block": list(block), "smem": 0,
                     "launch_attrs": {}, "attrs": {"regs": regs}, "packing": "params", "layout": "kernel" if params else "none",
                     "params": ps})
        seq[0] += 1
        t[0] += 5000

    def gemm(which):
        launch(which, [8, 1, 1], [128, 1, 1], [])

    def forward(T, decode, attention=True):
        rms = lambda out, inp, s2, s3, sh2, weight, n, hid: [P(*out) if isinstance(out, tuple) and out[0] != "ptr" else out, inp,
                                                             ("i64", s2), ("i64", s3), ("i64", 0), ("i64", sh2), ("i64", T), weight,
                                                             ("i64", 0), ("f32", EPS), ("i32", n), ("i32", hid)]
        launch("embed", [T, 1, 1], [128, 1, 1], [])   # embedding (ATen)
        for layer in range(L):
            if layer == 0:
                launch("rms", [T, 1, 1], [1024, 1, 1], rms(P(X), P(R), H, H * T, T, w(layer, 0), T, H), layer, "in_norm")
            else:
                launch("fadd", [T, 1, 1], [1024, 1, 1], [P(X), ("i64", H), P(R), w(layer, 0), ("f32", EPS), ("i32", T), ("i32", H)],
                       layer, "add_norm")
            gemm("qkv")
            launch("rms_head", [T * cfg.heads, 1, 1], [256, 1, 1],
                   rms(P(Qb), P(QKV), D, qkvw, cfg.heads, w(layer, 2), T * cfg.heads, D), layer, "q_norm")
            launch("rms_head", [T * cfg.kv_heads, 1, 1], [256, 1, 1],
                   rms(P(Kb), P(QKV, 2 * q), D, qkvw, cfg.kv_heads, w(layer, 3), T * cfg.kv_heads, D), layer, "k_norm")
            launch("rope", [T, 1, 1], [512, 1, 1], [P(POS), P(Qb), P(Kb), P(COS), ("i32", D), ("i64", q), ("i64", kv), ("i64", D),
                                                    ("i32", cfg.heads), ("i32", cfg.kv_heads), ("i32", D), ("i64", 0), ("u8", 1)],
                   layer, "rope")
            if not attention:
                launch("fadd", [T, 1, 1], [1024, 1, 1], [P(X), ("i64", H), P(R), w(layer, 1), ("f32", EPS), ("i32", T), ("i32", H)])
                continue
            kc = P(KV, layer * 64 * BS * kv * 4)
            vc = P(KV, layer * 64 * BS * kv * 4 + 2 * D)
            ks, vs = P(SCALES, layer * 16), P(SCALES, layer * 16 + 8)
            launch("cache", [T, 1, 1], [512, 1, 1], [P(Kb), P(QKV, 2 * (q + kv)), kc, vc, P(SLOTS), ks, vs, ("i64", kv), ("i64", qkvw),
                                                     ("i64", kvb), ("i64", 2 * D), ("i64", 0), ("i64", 0), ("i64", row),
                                                     ("i64", 0), ("i64", 0)], layer, "cache")
            common = [P(ATT), P(Qb), kc, vc, P(BT), P(SL), ("f32", D ** -0.5), ks, vs, ("f32", 1.0), ("f32", 0.0), ("i64", W),
                      ("i64", q), ("i64", D), ("i64", q), ("i64", D), ("i64", 0), P(SL), ("i64", kvb), ("i64", row),
                      ("i64", 2 * D), ("i64", kvb), ("i64", row), ("i64", 2 * D), P(CU), ("i32", 1)]
            if decode:
                launch("attn", [T // bq + 1, cfg.kv_heads, SEGS], [128, 1, 1],
                       common + [P(SEGO), P(SEGM), P(SEGE), ("i64", 0), ("i64", 0)], layer, "attn3d", sha=SHA["attn3d"], regs=96)
                launch("reduce", [T, cfg.heads, 1], [128, 1, 1], [P(ATT), P(SEGO), P(SEGM), P(SEGE), P(SL), ("f32", 1.0),
                                                                   ("i64", q), ("i64", D), ("i64", W), P(CU), ("i64", 0), ("i64", 0)],
                       layer, "reduce")
            else:
                launch("attn", [T // bq + 1, cfg.kv_heads, 1], [128, 1, 1], common + [("i64", 0), ("i64", 0)], layer, "attn",
                       sha=SHA["attn2d"], regs=128)
            gemm("o")
            launch("fadd", [T, 1, 1], [1024, 1, 1], [P(X), ("i64", H), P(R), w(layer, 1), ("f32", EPS), ("i32", T), ("i32", H)],
                   layer, "post_norm")
            gemm("gate_up")
            launch("silu", [T, 1, 1], [1024, 1, 1], [P(ACT), P(GU), ("i32", cfg.inter), ("f32", 0.0), ("f32", 0.0), ("f32", 0.0)],
                   layer, "silu")
            gemm("down")
        launch("fadd", [T, 1, 1], [1024, 1, 1], [P(X), ("i64", H), P(R), w(L, 0), ("f32", EPS), ("i32", T), ("i32", H)], -1, "final_norm")
        gemm("lm_head")
        t[0] += 3_000_000

    forward(256, False, attention=False)
    for T in prompts:
        forward(T, False)
        for _ in range(steps):
            forward(1, True)
        t[0] += 50_000_000
    folder = out / "pid100"
    (folder / "cubins").mkdir(parents=True, exist_ok=True)
    (folder / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for k, sha in SHA.items():
        (folder / "cubins" / f"{sha}.cubin").write_bytes(f"placeholder cubin {k}".encode())
    return folder
