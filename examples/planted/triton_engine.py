"""A small hand-written Triton "engine" whose structure is known: the truth for the mining suite.

Why: a capture of a real engine only has the truth someone reads off its code; this program
plants every fact the analysis must recover and writes it down itself (TRUTH_JSON), so a test can
compare what `mine analyze` finds with what was launched. It is built to differ from vLLM in the
ways a detector could overfit: its own kernel set, a heterogeneous layer stack (dense blocks
before gated blocks), a profile pass and warm-ups before the requests, a bookkeeping kernel
between forwards, and decode steps that are partly eager and partly CUDA-graph replays.

    python3 triton_engine.py TRUTH_JSON [--layers 2,3] [--prompts 5,23,77] [--decode 5]
        [--graph-decode 3] [--hidden 256] [--seed 0]

Per forward (T tokens, context C after it):
  embed (grid ceil_div(T, 16)) ; per dense layer: norm, up-proj, act, down-proj+residual ;
  per gated layer: norm, kv_write (K), kv_write (V), attend (reads both back), up-proj, gate-proj,
  act, down-proj+residual ;
  final norm ; logits-proj ; argmax (grid T).
After every forward a bookkeeping kernel (`step_stats`, grid 1) runs outside the model.
Every grid is a closed-set expression of T: ceil_div(T, 16), T, mul(T, 2), 1.
Weights of the layers sit in one arena at a fixed stride per layer kind; the KV cache is one
pool of `--kv-ctx` rows per gated layer, K and V of each layer at a fixed offset.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

BLOCK_T = 16
# the kernels each kind of layer launches, in order (Engine.forward)
LAYER_KERNELS = {"dense": ["norm_kernel", "proj_kernel", "act_kernel", "proj_kernel"],
                 "gated": ["norm_kernel", "kv_write_kernel", "kv_write_kernel", "attend_kernel",
                           "proj_kernel", "proj_kernel", "act_kernel", "proj_kernel"]}
# the buffer each pointer parameter of those kernels names (Engine.forward), param index -> name,
# weights left out: h the residual stream, x the normed activation, u/gt/a the MLP activations,
# kv0/kv1 the layer's K and V cache rows, pos the staged position. Shared names are one buffer
# in every layer; kv0/kv1 are the layer's own.
LAYER_FLOW = {"dense": [{0: "h", 2: "x"}, {0: "x", 2: "u", 3: "u"}, {0: "u", 1: "gt", 2: "a"},
                        {0: "a", 2: "h", 3: "h"}],
              "gated": [{0: "h", 2: "x"}, {0: "x", 1: "kv0", 2: "pos"}, {0: "x", 1: "kv1", 2: "pos"},
                        {0: "x", 1: "kv0", 2: "kv1", 3: "pos"}, {0: "x", 2: "u", 3: "u"},
                        {0: "x", 2: "gt", 3: "gt"}, {0: "u", 1: "gt", 2: "a"}, {0: "a", 2: "h", 3: "h"}]}


@triton.jit
def embed_kernel(ids, table, out, T, H: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BT + tl.arange(0, BT)
    cols = tl.arange(0, H)
    m = rows < T
    tok = tl.load(ids + rows, mask=m, other=0)
    v = tl.load(table + tok[:, None] * H + cols[None, :], mask=m[:, None])
    tl.store(out + rows[:, None] * H + cols[None, :], v, mask=m[:, None])


@triton.jit
def norm_kernel(x, w, out, T, eps, H: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BT + tl.arange(0, BT)
    cols = tl.arange(0, H)
    m = rows < T
    v = tl.load(x + rows[:, None] * H + cols[None, :], mask=m[:, None]).to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=1) / H + eps)
    g = tl.load(w + cols).to(tl.float32)
    tl.store(out + rows[:, None] * H + cols[None, :], (v * r[:, None] * g[None, :]).to(tl.bfloat16),
             mask=m[:, None])


@triton.jit
def proj_kernel(x, w, out, res, T, K: tl.constexpr, N: tl.constexpr, BN: tl.constexpr,
                ADD: tl.constexpr):
    # one token row per program along axis 0, BN output columns per program along axis 1
    row = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, K)
    a = tl.load(x + row * K + ks).to(tl.float32)
    b = tl.load(w + ks[:, None] * N + cols[None, :]).to(tl.float32)
    acc = tl.sum(a[:, None] * b, axis=0)
    if ADD:
        acc += tl.load(res + row * N + cols).to(tl.float32)
    tl.store(out + row * N + cols, acc.to(tl.bfloat16))


@triton.jit
def act_kernel(a, b, out, n, GATED: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(a + offs, mask=m).to(tl.float32)
    y = x * tl.sigmoid(x)
    if GATED:
        y = y * tl.load(b + offs, mask=m).to(tl.float32)
    tl.store(out + offs, y.to(tl.bfloat16), mask=m)


@triton.jit
def kv_write_kernel(x, cache, pos, T, H: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)
    pos0 = tl.load(pos)
    rows = pid * BT + tl.arange(0, BT)
    cols = tl.arange(0, H)
    m = rows < T
    v = tl.load(x + rows[:, None] * H + cols[None, :], mask=m[:, None])
    tl.store(cache + (pos0 + rows)[:, None] * H + cols[None, :], v, mask=m[:, None])


@triton.jit
def attend_kernel(x, k_cache, v_cache, pos, T, H: tl.constexpr, BT: tl.constexpr):
    # reads this step's cache rows back: the cache is written by one kernel and read by another
    pid = tl.program_id(0)
    rows = pid * BT + tl.arange(0, BT)
    cols = tl.arange(0, H)
    m = rows < T
    p0 = tl.load(pos)
    at = (p0 + rows)[:, None] * H + cols[None, :]
    k = tl.load(k_cache + at, mask=m[:, None]).to(tl.float32)
    v = tl.load(v_cache + at, mask=m[:, None]).to(tl.float32)
    xv = tl.load(x + rows[:, None] * H + cols[None, :], mask=m[:, None]).to(tl.float32)
    w = tl.sigmoid(tl.sum(k * xv, axis=1) / H)
    tl.store(x + rows[:, None] * H + cols[None, :], (xv + w[:, None] * v).to(tl.bfloat16), mask=m[:, None])


@triton.jit
def context_attend_kernel(x, k_cache, v_cache, pos, H: tl.constexpr, BJ: tl.constexpr, SCALE: tl.constexpr):
    # causal softmax attention of each row over every cached position up to its own (serve.py):
    # what a row sees depends on the whole KV history, so a wrong cache or position shows
    row = tl.program_id(0)
    p = tl.load(pos + row)
    cols = tl.arange(0, H)
    q = tl.load(x + row * H + cols).to(tl.float32)
    m_i = tl.max(tl.zeros([BJ], dtype=tl.float32), axis=0) - 1e30
    l_i = tl.sum(tl.zeros([BJ], dtype=tl.float32), axis=0)
    acc = tl.zeros([H], dtype=tl.float32)
    for start in range(0, p + 1, BJ):
        js = start + tl.arange(0, BJ)
        mj = js <= p
        k = tl.load(k_cache + js[:, None] * H + cols[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache + js[:, None] * H + cols[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        s = tl.where(mj, tl.sum(k * q[None, :], axis=1) * SCALE, -1e30)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        e = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(e, axis=0)
        acc = acc * alpha + tl.sum(e[:, None] * v, axis=0)
        m_i = m_new
    tl.store(x + row * H + cols, (q + acc / l_i).to(tl.bfloat16))


@triton.jit
def argmax_kernel(logits, out, V: tl.constexpr):
    row = tl.program_id(0)
    v = tl.load(logits + row * V + tl.arange(0, V)).to(tl.float32)
    tl.store(out + row, tl.argmax(v, axis=0))


@triton.jit
def step_stats_kernel(counter, tokens):
    tl.store(counter, tl.load(counter) + tokens)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    def __init__(self, kinds: list[str], hidden: int, vocab: int, inter: int, max_tokens: int,
                 max_ctx: int, seed: int, serving: bool = False):
        # serving (serve.py): positions one per row, causal attention over the cache, and the
        # forward ends at the logits (the host picks the token); else the mining suite's engine
        self.serving = serving
        g = torch.Generator(device="cuda").manual_seed(seed)
        H, F = hidden, inter
        self.kinds, self.H, self.V, self.F = kinds, H, vocab, F
        r = lambda *s: (torch.randn(*s, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        self.embed = r(vocab, H)
        self.final_norm = torch.ones(H, device="cuda", dtype=torch.bfloat16)
        self.lm_head = r(H, vocab)
        # one arena per layer kind, one fixed-size slot per layer: a constant stride
        per = {"dense": H + 2 * H * F, "gated": H + 3 * H * F}
        self.layers = []
        for kind in sorted(set(kinds)):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            arena = r(len(idx), per[kind])
            for j, i in enumerate(idx):
                s = arena[j]
                w = {"norm": s[:H], "up": s[H:H + H * F].view(H, F), "down": s[H + H * F:H + 2 * H * F].view(F, H)}
                if kind == "gated":
                    w["gate"] = s[H + 2 * H * F:].view(H, F)
                self.layers.append((i, kind, w))
        self.layers.sort(key=lambda x: x[0])
        self.stride = {kind: per[kind] * 2 for kind in per}
        n_gated = kinds.count("gated")
        self.kv = torch.zeros(max(n_gated, 1), 2, max_ctx, H, device="cuda", dtype=torch.bfloat16)
        z = lambda *s, dt=torch.bfloat16: torch.zeros(*s, device="cuda", dtype=dt)
        self.h, self.x = z(max_tokens, H), z(max_tokens, H)
        self.u, self.gt, self.a = z(max_tokens, F), z(max_tokens, F), z(max_tokens, F)
        self.logits = z(max_tokens, vocab)
        self.ids = z(max_tokens, dt=torch.int32)
        self.out = z(max_tokens, dt=torch.int32)
        self.counter = z(1, dt=torch.int32)
        self.pos = z(max_tokens if serving else 1, dt=torch.int32)
        self.weights = {"embed.weight": self.embed, "final_norm.weight": self.final_norm,
                        "lm_head.weight": self.lm_head}
        for i, _, w in self.layers:
            self.weights.update({f"layers.{i}.{k}.weight": t for k, t in w.items()})

    def forward(self, T: int) -> None:
        H, F, V = self.H, self.F, self.V
        grid_t = (cdiv(T, BLOCK_T),)
        embed_kernel[grid_t](self.ids, self.embed, self.h, T, H=H, BT=BLOCK_T)
        g = 0
        for _, kind, w in self.layers:
            norm_kernel[grid_t](self.h, w["norm"], self.x, T, 1e-6, H=H, BT=BLOCK_T)
            if kind == "gated":
                kv_write_kernel[grid_t](self.x, self.kv[g, 0], self.pos, T, H=H, BT=BLOCK_T)
                kv_write_kernel[grid_t](self.x, self.kv[g, 1], self.pos, T, H=H, BT=BLOCK_T)
                if self.serving:
                    context_attend_kernel[(T,)](self.x, self.kv[g, 0], self.kv[g, 1], self.pos, H=H, BJ=32,
                                                SCALE=H ** -0.5)
                else:
                    attend_kernel[grid_t](self.x, self.kv[g, 0], self.kv[g, 1], self.pos, T, H=H, BT=BLOCK_T)
                g += 1
            proj_kernel[(T, F // 64)](self.x, w["up"], self.u, self.u, T, K=H, N=F, BN=64, ADD=False)
            if kind == "gated":
                proj_kernel[(T, F // 64)](self.x, w["gate"], self.gt, self.gt, T, K=H, N=F, BN=64, ADD=False)
            act_kernel[(cdiv(T * F, 1024),)](self.u, self.gt, self.a, T * F, GATED=kind == "gated", BLOCK=1024)
            proj_kernel[(T, H // 64)](self.a, w["down"], self.h, self.h, T, K=F, N=H, BN=64, ADD=True)
        norm_kernel[grid_t](self.h, self.final_norm, self.x, T, 1e-6, H=H, BT=BLOCK_T)
        proj_kernel[(T, V // 128)](self.x, self.lm_head, self.logits, self.logits, T, K=H, N=V, BN=128, ADD=False)
        if not self.serving:
            argmax_kernel[(T,)](self.logits, self.out, V=V)

    def bookkeeping(self, T: int) -> None:
        step_stats_kernel[(1,)](self.counter, T)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("truth", help="where to write the truth JSON")
    ap.add_argument("--layers", default="2,3", help="dense,gated layer counts (dense first)")
    ap.add_argument("--prompts", default="5,23,77")
    ap.add_argument("--decode", type=int, default=5, help="decode steps per prompt")
    ap.add_argument("--graph-decode", type=int, default=3,
                    help="of those, the last N run as CUDA-graph replays (prompts after the first)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--profile", type=int, default=512)
    ap.add_argument("--warmups", default="64,1")
    ap.add_argument("--kv-ctx", type=int, default=2048, help="KV cache rows per gated layer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dense, gated = (int(x) for x in args.layers.split(","))
    kinds = ["dense"] * dense + ["gated"] * gated
    prompts = [int(x) for x in args.prompts.split(",")]
    warmups = [int(x) for x in args.warmups.split(",") if x]
    max_tok = max([args.profile, *prompts, *warmups])
    kv_ctx = max(args.kv_ctx, max_tok + args.decode + 8)
    eng = Engine(kinds, args.hidden, args.vocab, args.inter, max_tok, kv_ctx, args.seed)
    truth = {"program": "examples/planted/triton_engine.py", "args": vars(args), "layer_kinds": kinds,
             "forwards": [], "hidden": args.hidden, "inter": args.inter, "vocab": args.vocab,
             "block_t": BLOCK_T,
             "grids": {"embed_kernel": "ceil_div(tokens, 16)", "norm_kernel": "ceil_div(tokens, 16)",
                       "kv_write_kernel": "ceil_div(tokens, 16)", "attend_kernel": "ceil_div(tokens, 16)",
                       "argmax_kernel": "tokens",
                       "act_kernel": f"ceil_div(mul(tokens, {args.inter}), 1024)",
                       "step_stats_kernel": "1"},
             "weights": {"arena_stride": eng.stride, "kv_layer_stride": 2 * kv_ctx * args.hidden * 2},
             "layer_kernels": LAYER_KERNELS,
             "flow": {"layer": LAYER_FLOW, "per_layer": ["kv0", "kv1"],
                      "kv1_minus_kv0": eng.kv[0, 1].data_ptr() - eng.kv[0, 0].data_ptr()}}
    torch.cuda.synchronize()

    def step(kind: str, T: int, pos0: int, graph=None) -> None:
        eng.pos.fill_(pos0)          # staging outside the model, as an engine writes positions
        if graph is None:
            eng.forward(T)
        else:
            graph.replay()
        eng.bookkeeping(T)
        truth["forwards"].append({"kind": kind, "tokens": T, "graph": graph is not None, "pos0": pos0})

    step("profile", args.profile, 0)
    torch.cuda.synchronize()
    time.sleep(0.05)
    for w in warmups:
        step("warmup", w, 0)
    torch.cuda.synchronize()
    # one decode graph, captured after the warm-ups as an engine captures per batch size: its
    # capture-time launches are not a forward (the dump tags them with the stream capture)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            eng.forward(1)
    torch.cuda.synchronize()
    truth["graph_captures"] = 1
    time.sleep(0.05)
    for n, T in enumerate(prompts):
        eng.ids[:T] = torch.arange(T, device="cuda", dtype=torch.int32) % args.vocab
        step("prefill", T, 0)
        for d in range(args.decode):
            use_graph = n > 0 and d >= args.decode - args.graph_decode
            step("decode", 1, T + d, graph if use_graph else None)
        torch.cuda.synchronize()
        time.sleep(0.05)
    with open(args.truth, "w") as f:
        json.dump(truth, f, indent=1)
    print(f"{len(truth['forwards'])} forwards, layers {kinds}")


if __name__ == "__main__":
    main()
