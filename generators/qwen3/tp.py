"""`generate_tp`: a tensor-parallel vLLM Qwen3 capture to one kern manifest every rank loads.

Why a manifest of its own: kern runs a multi-rank model as one manifest per rank set -- a
`topology` group `tp` of the rank count, every weight bound per rank (`{"group": "tp", "ranges":
[...]}`: this rank's rows or columns of the checkpoint's tensor), and the collectives as runtime
built-ins (`extern:nccl_allreduce_bf16`, which kern 0.3.1 takes as [send, recv, count, rank]: the
last argument `{"rank": "tp"}` names the group). Steps:
1. the cross-rank analysis (`mining.ranks`, docs/ranks.md) must find the rank processes, lined up
   step by step (`aligned`), else `WiringMismatch` names where they part;
2. every rank's capture is mined (`mined.mine`) against the *shard* of the config -- heads, KV heads
   and intermediate size divided by tp (KV heads replicated when fewer than tp, as vLLM does) --
   so each rank's kernels are proved to run its shard;
3. the collectives the analysis found must be where Megatron-style TP puts them and where the
   generator writes them: two all-reduces per layer, each right after a row-parallel projection's
   GEMM (o_proj, down_proj) and before the residual add that consumes it (`fused_add_rms_norm`);
4. `build.generate` writes the shard's manifest (rank 0's kernels); this module then binds its
   weights per rank (column-parallel qkv and gate_up by rows, row-parallel o_proj and down_proj
   by columns; norms, embedding and lm_head whole on every rank), sends each row-parallel GEMM's
   output to a `partial` workspace and all-reduces it into `h`, and adds the topology.
The result is verified by `manifests.verify` (a rejection is `RejectedManifest`).
Not generated: vLLM's custom all-reduce as peer buffers (its kernel and its rank-data setup would
be the manifest's; NCCL's built-in computes the same sum), vocab-parallel embedding / lm_head
(every rank holds them whole, so no collective is needed there), pipeline ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vocab.errors import ConfigError, RejectedManifest, UsageError
from vocab.wire import NCCL_PARAMS

from generators.qwen3.kernels import tag
from generators.qwen3.mined import WiringMismatch

GROUP = "tp"
# kern 0.3.1's NCCL built-ins take [send, recv, count, rank] (vocab.wire.NCCL_PARAMS)
_AR = "extern:nccl_allreduce_bf16"
ALLREDUCE = (_AR, list(NCCL_PARAMS[_AR]))
ROW_PARALLEL = ("o_proj", "down_proj")   # GEMM call labels whose output is a partial sum


@dataclass
class TPResult:
    manifest: dict
    tp: int
    shard: object                      # the per-rank Qwen3 config
    mined: list                        # per rank, generators.qwen3.mined.Mined
    ranks: object                      # mining.ranks.RanksResult
    notes: list[str] = field(default_factory=list)
    path: Optional[Path] = None        # the manifest file written (generate_tp)

    def lines(self) -> list[str]:
        """The command's report: one summary line, then one `note:` line per note."""
        m = self.manifest
        return [f"{self.path}: {self.tp} ranks lined up over {self.ranks.doc.forwards} forwards, "
                f"{len(m['programs']['prefill']['calls'])} prefill / {len(m['programs']['decode']['calls'])} decode "
                f"calls; verified"] + [f"note: {n}" for n in self.notes]


def shard_config(cfg, tp: int):
    """The per-rank dimensions of a tp-way Megatron shard; ConfigError when tp does not divide them."""
    if tp < 2:
        raise ConfigError(f"tensor parallelism needs 2 or more ranks, got {tp}")
    for what, n in (("num_attention_heads", cfg.heads), ("intermediate_size", cfg.inter)):
        if n % tp:
            raise ConfigError(f"{what} {n} is not divisible by the {tp} ranks")
    if cfg.kv_heads % tp and tp % cfg.kv_heads:
        raise ConfigError(f"num_key_value_heads {cfg.kv_heads} and the {tp} ranks: neither divides the other")
    kv = cfg.kv_heads // tp if cfg.kv_heads >= tp else 1
    return dataclasses.replace(cfg, heads=cfg.heads // tp, kv_heads=kv, inter=cfg.inter // tp)


def _ranges(tp: int, width: int, start=lambda r, w: r * w) -> dict:
    return {"group": GROUP, "ranges": [[start(r, width), start(r, width) + width] for r in range(tp)]}


def bind_shards(m: dict, cfg, shard, tp: int) -> None:
    """Rebind the shard manifest's projection weights to this rank's rows / columns (in place)."""
    q, kv, inter = shard.q_size, shard.kv_size, shard.inter
    if cfg.kv_heads >= tp:
        kv_rows = _ranges(tp, kv)
    else:   # fewer KV heads than ranks: rank r keeps head r * kv_heads // tp
        kv_rows = _ranges(tp, kv, lambda r, w: (r * cfg.kv_heads // tp) * w)
    for i in range(cfg.layers):
        p, L, b = f"model.layers.{i}.", f"l{i}.", m["buffers"]
        b[L + "qkv"]["bind"] = [{"tensor": p + "self_attn.q_proj.weight", "rows": _ranges(tp, q)},
                                {"tensor": p + "self_attn.k_proj.weight", "rows": kv_rows},
                                {"tensor": p + "self_attn.v_proj.weight", "rows": kv_rows}]
        b[L + "o_proj"]["bind"] = [{"tensor": p + "self_attn.o_proj.weight", "cols": _ranges(tp, q)}]
        b[L + "gate_up"]["bind"] = [{"tensor": p + f"mlp.{w}_proj.weight", "rows": _ranges(tp, inter)}
                                    for w in ("gate", "up")]
        b[L + "down"]["bind"] = [{"tensor": p + "mlp.down_proj.weight", "cols": _ranges(tp, inter)}]


def add_collectives(m: dict, cfg) -> int:
    """Every row-parallel GEMM call writes `partial`; an all-reduce of it into `h` follows (in
    place). Returns the all-reduce calls added."""
    m["buffers"]["partial"] = {"dtype": "bf16", "shape": ["rows", cfg.hidden], "kind": "workspace"}
    m["ops"]["allreduce"] = {"params": list(ALLREDUCE[1]), "impl": {"launches": [{"entry": ALLREDUCE[0]}]}}
    added = 0
    for name, prog in m["programs"].items():
        out = []
        for call in prog["calls"]:
            out.append(call)
            label = call.get("label", "")
            if call["op"] != "gemm" or label.rsplit(".", 1)[-1] not in ROW_PARALLEL:
                continue
            dest = call["args"][2]
            call["args"][2] = {"buf": "partial"}
            rows = call["args"][3]
            count = {"i32": rows["i32"] * cfg.hidden} if "i32" in rows else {"expr": {"mul": [rows["var"], cfg.hidden]}}
            out.append({"label": f"{label}.allreduce", "op": "allreduce",
                        "args": [{"buf": "partial"}, dest, count, {"rank": GROUP}]})
            added += 1
        prog["calls"] = out
    return added


def _places(mm) -> dict[str, tuple[int, str]]:
    """The mined role of every call site (the analysis' site name -> (layer, role))."""
    return {x.site_id: (x.layer, x.role) for insts in mm.instances.values() for inst in insts
            for x in inst.launches if x.site_id}


def check_collectives(ranks_doc, cfg, site_symbol: dict[str, str], places: dict[str, tuple[int, str]]) -> list[str]:
    """The analysis' collectives are the two all-reduces per layer the manifest writes (step 3 of
    the module docstring): each after a GEMM and before a residual add -- layer i's post-attention
    norm (after o_proj) or the next layer's input norm / the final norm (after down_proj) -- and
    both places of every layer taken. Two more are vLLM's and not the manifest's, which holds the
    embedding and lm_head whole on every rank: the vocab-parallel embedding's all-reduce (before the
    first layer's input norm) and the logits' gather after the lm_head GEMM (between kernels
    outside the model's families); they come back as notes. WiringMismatch names the first
    collective that is none of these, or the layer missing one."""
    seen, notes = set(), []
    for c in ranks_doc.collectives:
        layer, role = places.get(c.before, (None, ""))
        after_model = c.after in places or tag(site_symbol.get(c.after, "")) is not None
        if role == "in_norm" and c.op == "all_reduce" and not after_model:
            notes.append(f"{c.site}: the vocab-parallel embedding's all-reduce; every rank holds the embedding whole")
            continue
        if not after_model and c.before not in places:
            notes.append(f"{c.site}: a {c.op} of the logits after {c.after or '(start)'}; every rank holds lm_head whole")
            continue
        if c.op != "all_reduce":
            raise WiringMismatch(f"collective {c.site} is a {c.op} ({c.library}) inside the layers; a TP Qwen3 "
                                 f"layer all-reduces only")
        if after_model or role not in ("post_norm", "add_norm", "final_norm"):
            raise WiringMismatch(f"collective {c.site} runs between {c.after or '(start)'} and "
                                 f"{c.before or '(end)'}, not between a projection GEMM and a residual add")
        seen.add((layer, "o_proj") if role == "post_norm" else
                 (layer - 1 if role == "add_norm" else cfg.layers - 1, "down_proj"))
    for layer in range(cfg.layers):
        missing = [g for g in ROW_PARALLEL if (layer, g) not in seen]
        if missing:
            raise WiringMismatch(f"layer {layer} all-reduces at {2 - len(missing)} place(s), not 2: none after "
                                 f"{' and '.join(missing)}")
    return notes


def build_tp_manifest(dump: Path, config: Path, kernels: Optional[Path] = None, chunk: int = 2048,
                      cache: bool = True, cache_dir: Optional[Path] = None) -> TPResult:
    """The verified TP manifest of the multi-rank capture at `dump` (module docstring)."""
    from generators.qwen3 import build, config as qconfig, mined
    from generators.qwen3.generate import KERNELS_TOML, OWN
    from manifests.kernels import load_kernels
    from manifests.verify import verify
    from mining.analyze import document
    from mining.archive import unpack
    from mining.ranks import analyze_ranks

    cfg = qconfig.load(config)
    table = load_kernels(kernels or KERNELS_TOML)
    ranks = analyze_ranks(unpack(Path(dump), cache=cache, cache_dir=cache_dir), cache=cache, cache_dir=cache_dir)
    if ranks is None:
        raise UsageError(f"{dump}: not a multi-rank dump (two or more processes that ran collectives)", value=dump)
    doc = ranks.doc
    if not doc.aligned:
        m0 = doc.mismatches[0] if doc.mismatches else None
        where = (f"rank {m0.rank} forward {m0.forward} parts from rank 0 at call site {m0.position} "
                 f"({m0.got or '(end)'} where rank 0 runs {m0.expected or '(end)'})") if m0 else "; ".join(doc.notes)
        raise WiringMismatch(f"{dump}: the ranks do not run the same forwards: {where}")
    tp = len(ranks.runs)
    shard = shard_config(cfg, tp)
    mms = [mined.mine(run.dump, shard, document(run.analysis)) for run in ranks.runs]
    idx = ranks.main.sites.index
    edge_notes = check_collectives(doc, cfg, dict(zip(idx["site"].astype(str), idx["symbol"].astype(str))),
                                   _places(mms[0]))
    own = {k: (mod, table.op_launch(mod, e), table.module_ref(mod)) for k, (mod, e) in OWN.items()}
    m = build.generate(shard, mms[0], own, chunk=chunk, label=Path(str(dump)).name)
    m["model"] = m["model"].replace("qwen3 (", f"qwen3 tp{tp} (", 1)
    m["topology"] = {"groups": {GROUP: tp}}
    bind_shards(m, cfg, shard, tp)
    added = add_collectives(m, cfg)
    bad = verify(m)
    if bad:
        raise RejectedManifest(f"the generated TP manifest fails verification ({len(bad)} violations, first: {bad[0]})")
    return TPResult(m, tp, shard, mms, ranks, [f"{added} all-reduce calls over {tp} ranks"] + edge_notes)


def generate_tp(dump: Path, config: Path, out, *, chunk: int = 2048, kernels_toml: Optional[Path] = None,
                cache: bool = True, cache_dir: Optional[Path] = None) -> TPResult:
    """Write OUT/qwen3-tp.json, OUT/qwen3-bindings.safetensors and OUT/kernels/ (rank 0's cubins,
    the own kernels built) from the multi-rank capture `dump`; `out` a folder object
    (`generators.folder`) or a path."""
    from generators.folder import folder as as_folder
    from generators.qwen3 import bindings
    from generators.qwen3.build import dumps
    from generators.qwen3.generate import KERNELS_TOML, kernels_dir
    from manifests.abi import check_abi
    from manifests.kernels import load_kernels

    res = build_tp_manifest(dump, config, kernels_toml, chunk, cache, cache_dir)
    folder = as_folder(out)
    res.path = folder.path("qwen3-tp.json")
    res.path.write_text(dumps(res.manifest))
    mm = res.mined[0]
    bindings.write(folder.path("qwen3-bindings.safetensors"), res.shard, mm.table_width * mm.block_size)
    res.notes += kernels_dir(folder, mm, load_kernels(kernels_toml or KERNELS_TOML), res.manifest)
    folder.finish()
    problems = [d for d in check_abi(res.manifest, folder.root / "kernels") if d.rule != "abi.module-file"]
    if problems:
        raise RejectedManifest(f"the ABI check fails: {problems[0]} ({len(problems)} finding(s))")
    return res
