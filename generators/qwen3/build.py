"""Manifest assembly: ops from the mined instances, per-layer calls from Jinja templates.

Each (phase, role) instance becomes one op (`p.<role>` for prefill, `d.<role>` for decode): its
interface is the role's pointers (first appearance order) then the scalars that follow the token
count; scalars constant in the capture are folded into the launch as literals of their mined
value. Grids are written from vLLM's launch rules and checked against every mined launch.
Output is canonical (`vocab.dumps`: sorted keys), so the same inputs give the same bytes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import jinja2

from vocab.dumps import dumps  # noqa: F401  (re-exported: the command writes with it)
from vocab.expr import evaluate, from_wire, var_names
from vocab.wire import EXTERN_PARAMS, SCHEMA_VERSION

from generators.qwen3 import GENERATOR, VERSION
from generators.qwen3.kernels import ptype
from generators.qwen3.mined import Mined, WiringMismatch, batched_decode

GEMM = ("extern:cublaslt_bf16_tn", list(EXTERN_PARAMS["extern:cublaslt_bf16_tn"]))


def _grid(role: str, cfg, mined: Mined, T, S=None):
    """vLLM's grid for a role as a kern expression in the row count T (a var name or 1); S: the
    sequence-count var of a batched manifest (None: one sequence a call).

    vLLM's attention launches floor(T / BLOCK_Q) + S query blocks (one block per BLOCK_Q rows plus
    one per sequence); with one sequence that is ceil_div(T + 1, BLOCK_Q). floor with a second
    variable is no kern expression (the closed set has no subtraction), so a batched manifest
    launches ceil_div(T, BLOCK_Q) + S, at most one block more: the kernel's own guard returns at
    once for a query block past its sequence's rows (its program looks the block's sequence up in
    the query start offsets and leaves when the block starts past that sequence's query length)."""
    mul = (lambda e, c: e * c) if isinstance(T, int) else (lambda e, c: e if c == 1 else {"mul": [e, c]})
    block_q = cfg.block_q
    rows = {"in_norm": T, "add_norm": T, "rope": T, "silu": T, "cache": T,
            "q_norm": mul(T, cfg.heads), "k_norm": mul(T, cfg.kv_heads)}
    if role in rows:
        y = mined.instances[("p" if T == "rows" else "d", role)][0].launches[0].grid[1]
        return [rows[role], y, 1]
    q_blocks = {"add": [{"ceil_div": [T, block_q]}, S]} if S is not None else None
    if role == "attn":
        if q_blocks:
            return [q_blocks, cfg.kv_heads, 1]
        return [T // block_q + 1 if isinstance(T, int) else {"ceil_div": [{"add": [T, 1]}, block_q]}, cfg.kv_heads, 1]
    if role == "attn3d":
        return [q_blocks or T // block_q + 1, cfg.kv_heads, mined.segments]
    if role == "reduce":
        return [T, cfg.heads, 1]
    raise KeyError(role)


def _eval(e, t: int, seqs: int | None = None) -> int:
    """A grid expression's value with its row var at `t` (and `seqs`, where given, for the sequence
    var), by the shared evaluator (unchecked: the comparison with the mined grid is the check)."""
    tree = from_wire(e)
    values = dict.fromkeys(var_names(tree), t)
    if seqs is not None and "seqs" in values:
        values["seqs"] = seqs
    return evaluate(tree, values, checked=False)


def _grid_agrees(grid: list, x, batched: bool) -> bool:
    """Whether a written grid gives the launch's captured grid at its rows and sequences: exactly;
    a batched manifest's attention x may be one block more (`_grid`'s docstring)."""
    if not batched:
        return [_eval(g, x.tokens) for g in grid] == list(x.grid)
    got = [_eval(g, x.tokens, x.seqs) for g in grid]
    return got[1:] == list(x.grid[1:]) and (got[0] == x.grid[0] or
                                            (isinstance(grid[0], dict) and "add" in grid[0] and got[0] == x.grid[0] + 1))


class Op:
    """One manifest op made from one or more mined instances; `args(**roles)` wires a call."""

    def __init__(self, name: str, insts: list, scratch: dict, cfg, mined: Mined, T, S=None):
        self.name, self.iface, self.kinds, self.scalars, self.T = name, [], {}, [], T
        launches = []
        for role, inst, *guard in insts:
            guard = guard[0] if guard else None      # {"var", "min", "max"?}: a build serving a range of a var
            if guard is None and inst.when is not None and isinstance(T, int) and not (
                    inst.when[0] <= T and (inst.when[1] is None or T <= inst.when[1])):
                continue                              # a build for other row counts than this op's fixed one
            one = guard is not None and guard.get("max") == 1   # a build that serves one sequence only
            grid = _grid(role, cfg, mined, 1, None) if one else _grid(role, cfg, mined, T, S)
            for x in inst.launches:
                if (x.seqs != 1 and S is None) or (guard is not None and x.tokens != x.seqs):
                    # a batched warm-up (its grid was proved by `mined._seqs`); or a build borrowed from
                    # prefill for decode, whose prefill launches the prefill op checks
                    continue
                if not _grid_agrees(grid, x, S is not None and not one):
                    raise WiringMismatch(f"{x.site()}: grid {list(x.grid)}, but vLLM's launch rule the generator "
                                         f"writes gives {[_eval(g, x.tokens, x.seqs) for g in grid]}")
            params, args = [], []
            for i, size in enumerate(inst.sizes):
                if i in inst.family.ptrs:
                    r, direction, dtype = inst.family.ptrs[i]
                    params.append(ptype(direction, dtype))
                    if r in scratch:
                        args.append({"scratch": r})
                        continue
                    if r not in self.kinds:
                        self.iface.append(r)
                        self.kinds[r] = (direction, dtype)
                    elif direction in ("out", "inout"):
                        self.kinds[r] = ("inout" if self.kinds[r][0] == "in" else self.kinds[r][0], dtype)
                    args.append(r)
                    continue
                kind, typ, *v = inst.scalars[i]
                params.append(typ)
                if kind == "seqs":
                    if "seqs" not in [k for k, *_ in self.scalars]:
                        self.scalars.append(("seqs", typ, None, None))
                    args.append("seqs")
                elif kind == "const":
                    args.append({typ: v[0]})
                else:
                    key = f"{role}.{i}"
                    known = next((sc for sc in self.scalars if sc[0] == key), None)
                    if known is None:
                        self.scalars.append((key, typ, v[0], v[1]))
                    elif known != (key, typ, v[0], v[1]):
                        raise WiringMismatch(f"{inst.launches[0].site()}: param #{i} follows the token count "
                                             f"differently in two builds of the kernel")
                    args.append(key)
            launch = {"module": None, "entry": inst.symbol, "block": list(inst.block), "grid": grid,
                      "params": params, "args": args, "_sha": inst.sha256}
            if guard is not None:
                launch["when"] = dict(guard)
            elif inst.when is not None and not isinstance(T, int):
                lo, hi = inst.when
                if T not in ("rows", "seqs"):
                    raise WiringMismatch(f"{inst.launches[0].site()}: a build split by rows where the row count "
                                         f"is the var {T}")
                launch["when"] = {"var": T, "min": lo, **({"max": hi} if hi is not None else {})}
            if inst.smem:
                launch["shared_mem"] = inst.smem
            launches.append(launch)
        names = self.iface + [k for k, _, _, _ in self.scalars]
        for launch in launches:
            launch["args"] = [{"param": names.index(a)} if isinstance(a, str) else a for a in launch["args"]]
        self.params = [ptype(*self.kinds[r]) for r in self.iface] + [t for _, t, _, _ in self.scalars]
        impl = {"launches": launches}
        if scratch:
            impl["scratch"] = {k: {"dtype": "f32", "shape": [n]} for k, n in scratch.items()}
        self.json = {"params": self.params, "impl": impl}

    def args(self, **roles) -> str:
        missing = [r for r in self.iface if r not in roles]
        if missing:
            raise KeyError(f"op {self.name}: no argument for {missing}")
        out = [roles[r] for r in self.iface]
        T = self.T if isinstance(self.T, str) else "rows"
        for key, typ, a, b in self.scalars:
            if key == "seqs":
                out.append({"var": "seqs"})
                continue
            out.append({"expr": {"add": [{"mul": [T, a]}, b]}} if b else
                       ({"var": T} if a == 1 else {"expr": {"mul": [T, a]}}))
        return json.dumps(out)


@lru_cache(maxsize=None)
def _env() -> jinja2.Environment:
    root = resources.files("generators").joinpath("templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.globals.update(B=lambda n, off=0: {"buf": n, **({"offset": off} if off else {})},
                       S=lambda n, off=0: {"state": n, **({"offset": off} if off else {})})
    return env


def render(template: str, **ctx) -> list[dict]:
    text = _env().get_template(template).render(**ctx)
    return json.loads("[" + text.strip().rstrip(",") + "]")


# Module names by the roles a cubin serves: vLLM's C++ extension ships norms in one module,
# rope and activations in others; each Triton build is a module of its own.
MODULE_BY_ROLE = {"in_norm": "vllm_layernorm", "q_norm": "vllm_layernorm", "k_norm": "vllm_layernorm",
                  "add_norm": "vllm_layernorm", "rope": "vllm_pos_encoding", "silu": "vllm_activation",
                  "cache": "vllm_reshape_and_cache", "attn": "vllm_unified_attention_2d",
                  "attn3d": "vllm_unified_attention_3d", "reduce": "vllm_reduce_segments"}


def module_names(mined: Mined) -> dict:
    """sha256 -> module name from the roles its kernels play; a sha serving two names keeps the
    first in sorted order, a name two shas claim gets `-<sha8>` on the later one."""
    names: dict[str, set] = {}
    for (_, role), variants in mined.instances.items():
        for inst in variants:
            names.setdefault(inst.sha256, set()).add(MODULE_BY_ROLE[role])
    out, taken = {}, set()
    for sha in sorted(names, key=lambda h: (sorted(names[h])[0], h)):
        name = sorted(names[sha])[0]
        if name in taken:
            name += "-" + sha[:8]
        taken.add(name)
        out[sha] = name
    return out


def _variants(mined: Mined, phase: str, role: str) -> list:
    """[(role, instance)] for every build the capture shows at a call site (one unless `when` splits it)."""
    return [(role, inst) for inst in mined.instances[(phase, role)]]


def _ops(cfg, mined: Mined, phase: str, max_seqs: int = 1) -> dict:
    """The ops of one phase. A batched manifest (max_seqs > 1) runs decode over the `seqs` var (one
    row a sequence) with the decode builds' row-following scalars read from prefill
    (`mined.batched_decode`); its attention is the captured split-KV pair at one sequence and the
    prefill's one-pass build above (comment below)."""
    batched = max_seqs > 1
    S = "seqs" if batched else None
    T = "rows" if phase == "p" else ("seqs" if batched else 1)
    inst = dict(mined.instances)
    if batched and phase == "d":
        inst.update(batched_decode(mined))
    variants = lambda ph, role: [(role, x) for x in inst[(ph, role)]]  # noqa: E731
    ops = {}
    for role in ("in_norm", "add_norm", "q_norm", "k_norm", "rope", "cache", "silu"):
        ops[role] = Op(f"{phase}.{role}", variants(phase, role), {}, cfg, mined, T, S)
    if phase == "p":
        ops["attn"] = Op("p.attn", variants("p", "attn"), {}, cfg, mined, T, S)
    else:
        pad = 1 << (cfg.head_dim - 1).bit_length()
        seg = {"segm_out": cfg.heads * mined.segments * pad, "segm_max": cfg.heads * mined.segments,
               "segm_expsum": cfg.heads * mined.segments}
        split = variants("d", "attn3d") + variants("d", "reduce")
        if batched and any(x.seqs > 1 for _, i in split for x in i.launches):
            # a capture of concurrent requests shows the split-KV pair at several sequences: its own
            # builds serve the sequence counts they were seen at (`mined._split_builds`' ranges), and
            # the segment scratch holds a row of segments per sequence (one query row each)
            seg = {k: n * max_seqs for k, n in seg.items()}
        elif batched:
            # vLLM's split-KV decode builds were compiled for one sequence: Triton folds an integer
            # argument equal to 1 into the build, and reduce_segments' sequence count is one (its
            # one-sequence build takes 12 parameters, the build vLLM launches for several sequences
            # 13: tests/fixtures/batched/q2b). So they serve seqs 1 only, and above it the decode
            # runs the prefill's one-pass attention build, whose sequence count is a parameter (what
            # vLLM itself launches for decode batches past its split-KV threshold).
            one = {"var": "seqs", "min": 1, "max": 1}
            split = [(r, x, one) for r, x in split] + [("attn", x, {"var": "seqs", "min": 2})
                                                        for _, x in variants("p", "attn")]
        ops["attn"] = Op("d.attn", split, seg, cfg, mined, T, S)
    return ops


def _own_op(launch: dict, rows) -> dict:
    launch = dict(launch)
    params = launch.pop("params")
    launch["grid"] = [rows if g == "rows" else g for g in launch["grid"]]
    return {"params": params, "impl": {"launches": [launch]}}


def generate(cfg, mined: Mined, own: dict, chunk: int = 2048, label: str = "", max_seqs: int = 1) -> dict:
    """The manifest. `own` maps "embed" / "argmax" to (module name, launch skeleton, module ref).

    `max_seqs` > 1: a batched manifest. Decode runs up to max_seqs sequences a call, one row each
    (every row-count of the decode ops is the `seqs` var; the GEMMs' m, the logits and the argmax
    over `seqs` rows), as a CUDA graph per sequence count; prefill packs up to max_seqs prompts into
    its `rows` (query start offsets in `cu_seqlens`, the attention's sequence count the `seqs` var).
    Per-sequence inputs are laid out by sequence: `seq_lens[seqs]`, `blocks[seqs, W]`,
    `cu_seqlens[max_seqs + 1]`. max_seqs 1 writes the one-sequence manifest byte for byte as before."""
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be at least 1, got {max_seqs}")
    batched = max_seqs > 1
    names = module_names(mined)
    W, bs = mined.table_width, mined.block_size
    max_pos = W * bs
    m = {"schema_version": SCHEMA_VERSION, "model": f"qwen3 ({GENERATOR} {VERSION}; capture {label})".replace("; capture )", ")"),
         "vars": {"rows": {"max": chunk, "axis": "rows"}, "seqs": {"max": max_seqs, "axis": "groups"}},
         "states": {f"kv.{i}": {"bytes_per_token": cfg.kv_bytes_per_token} for i in range(cfg.layers)},
         "buffers": {}, "modules": {}, "ops": {}, "programs": {}}
    buf = m["buffers"]

    def b(name, dtype, shape, kind, **extra):
        buf[name] = {"dtype": dtype, "shape": shape, "kind": kind, **extra}

    b("tokens", "i32", ["rows"], "input", fill="token", domain={"min": 0, "max": cfg.vocab - 1})
    b("positions", "i64", ["rows"], "input", fill="position", domain={"min": 0, "max": max_pos - 1})
    b("slots", "i64", ["rows"], "input", fill="slot", domain={"index_into": "kv.0"})
    b("seq_lens", "i32", ["seqs"], "input", fill="seq_len", domain={"min": 1, "max": max_pos})
    b("cu_seqlens", "i32", [max_seqs + 1], "input", fill="cu_seqlens", domain={"monotone": True, "min": 0, "max": chunk})
    b("blocks", "i32", ["seqs", W], "input", fill="blocks", domain={"index_into": "kv.0", "stride": bs})
    b("next_token", "i32", ["seqs"], "output", fill="tokens")
    for n, width in (("residual", cfg.hidden), ("h", cfg.hidden), ("qkv", cfg.qkv_size), ("q", cfg.q_size),
                     ("k", cfg.kv_size), ("attn", cfg.q_size), ("gate_up", 2 * cfg.inter), ("act", cfg.inter)):
        b(n, "bf16", ["rows", width], "workspace")
    b("logits", "bf16", ["seqs" if batched else 1, cfg.vocab], "workspace")
    b("embed", "bf16", [cfg.vocab, cfg.hidden], "weight", bind=[{"tensor": "model.embed_tokens.weight"}])
    b("final_norm", "bf16", [cfg.hidden], "weight", bind=[{"tensor": "model.norm.weight"}])
    b("cos_sin", "bf16", [max_pos, cfg.head_dim], "weight", bind=[{"tensor": "mine.rope.cos_sin"}])
    b("kv_scale", "f32", [1], "weight", bind=[{"tensor": "mine.kv_scale"}])
    lm_head = "embed"
    if not cfg.tied:
        lm_head = "lm_head"
        b("lm_head", "bf16", [cfg.vocab, cfg.hidden], "weight", bind=[{"tensor": "lm_head.weight"}])
    for i in range(cfg.layers):
        p, L = f"model.layers.{i}.", f"l{i}."
        b(L + "input_norm", "bf16", [cfg.hidden], "weight", bind=[{"tensor": p + "input_layernorm.weight"}])
        b(L + "post_norm", "bf16", [cfg.hidden], "weight", bind=[{"tensor": p + "post_attention_layernorm.weight"}])
        b(L + "q_norm", "bf16", [cfg.head_dim], "weight", bind=[{"tensor": p + "self_attn.q_norm.weight"}])
        b(L + "k_norm", "bf16", [cfg.head_dim], "weight", bind=[{"tensor": p + "self_attn.k_norm.weight"}])
        b(L + "qkv", "bf16", [cfg.qkv_size, cfg.hidden], "weight",
          bind=[{"tensor": p + f"self_attn.{w}_proj.weight"} for w in "qkv"])
        b(L + "o_proj", "bf16", [cfg.hidden, cfg.q_size], "weight", bind=[{"tensor": p + "self_attn.o_proj.weight"}])
        b(L + "gate_up", "bf16", [2 * cfg.inter, cfg.hidden], "weight",
          bind=[{"tensor": p + f"mlp.{w}_proj.weight"} for w in ("gate", "up")])
        b(L + "down", "bf16", [cfg.hidden, cfg.inter], "weight", bind=[{"tensor": p + "mlp.down_proj.weight"}])

    m["ops"]["gemm"] = {"params": GEMM[1], "impl": {"launches": [{"entry": GEMM[0]}]}}
    Td = "seqs" if batched else 1
    for key, rows in (("embed", "rows"), ("argmax", Td)):
        mod, launch, ref = own[key]
        m["modules"][mod] = ref
        m["ops"][f"{'p' if key == 'embed' else 'd'}.{key}"] = _own_op(launch, rows)
    m["ops"]["d.embed"] = _own_op(own["embed"][1], Td)
    calls = {}
    for phase in ("p", "d"):
        ops = _ops(cfg, mined, phase, max_seqs)
        for op in ops.values():
            for launch in op.json["impl"]["launches"]:
                sha = launch.pop("_sha")
                launch["module"] = names[sha]
                m["modules"][names[sha]] = {"source": f"{sha}.cubin", "sha256": sha}
            m["ops"][op.name] = op.json
        T = "rows" if phase == "p" else Td
        out = [{"label": "embed", "op": f"{phase}.embed",
                "args": [{"buf": "tokens"}, {"buf": "embed"}, {"buf": "residual"}, {"i32": cfg.hidden}]}]
        for i in range(cfg.layers):
            out += render("qwen3_layer.j2", ops=ops, i=i, T=T, c=cfg, kv_only=(phase == "p" and i == cfg.layers - 1))
        if phase == "d":
            out += render("qwen3_head.j2", ops=ops, c=cfg, lm_head=lm_head, T=T)
        calls[phase] = out
    m["programs"]["prefill"] = {"batch": {"groups": max_seqs, "rows": "rows"}, "calls": calls["p"]}
    m["programs"]["decode"] = {"batch": {"groups": max_seqs, "rows": 1}, "graph": True, "calls": calls["d"]}
    # only what the programs call: a one-layer model's prefill only lands KV, so its norm-and-MLP
    # ops are never called there (kern rejects ops no call uses, and modules no op launches)
    used = {c["op"] for prog in calls.values() for c in prog}
    m["ops"] = {k: v for k, v in m["ops"].items() if k in used}
    launched = {ln["module"] for op in m["ops"].values() for ln in op["impl"]["launches"] if "module" in ln}
    m["modules"] = {k: v for k, v in m["modules"].items() if k in launched}
    return m
