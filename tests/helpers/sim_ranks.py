"""A simulated tensor-parallel vLLM Qwen3 capture: one pid folder per rank, with known truth.

Why: no machine with two GPUs has been lent yet, and the cross-rank analysis (mining/ranks.py)
and the TP manifest (generators/qwen3/tp.py) need a dump whose ranks, shards and collectives are
known. Each rank is the hand-made vLLM capture of tests/helpers/qwen3_sim.py run at that rank's
shard of the model (heads, KV heads and intermediate size divided by tp: column-parallel qkv and
gate_up produce N/tp, row-parallel o and down reduce over K/tp), then rewritten the way a TP
worker's capture differs from a single GPU's:
- its launches run on its own device (`dev` = device_base + rank, its own context and thread);
- every GEMM carries a parameter layout (A, W, C, M, N, K) with its shard's N and K and a weight
  pointer into the rank's own weight allocation (`gemm_layout`; False keeps qwen3_sim's layout-less
  cuBLASLt launches, as real captures have them);
- an all-reduce runs after the o-projection and after the down-projection of every layer: vLLM's
  custom all-reduce (`collective="custom"`: RankData*, RankSignals by value -- one Signal* per rank,
  the peers' mapped through cuIpcOpenMemHandle --, self Signal*, result, rank, size), an NCCL
  kernel (`"nccl"`: one 4 KB ncclDevKernelArgs4K by value), or custom for decode and NCCL for
  prefill (`"mixed"`); with `edges`, also vLLM's vocab-parallel collectives: an NCCL all-reduce
  after the embedding and an NCCL all-gather of the logits after lm_head;
- meta.json lists every GPU of the host and (with `env_rank`) the RANK / LOCAL_RANK / WORLD_SIZE
  the worker's environment held; allocs.jsonl logs every allocation its pointers land in, the
  peers' signal buffers as `ipc_open`.
A small non-rank process (an API server's few launches, no collective) is written too
(`extra_pid`). `plant(rank, records)` may edit one rank's launch records before they are written.
Written for this project; no engine code. Not simulated: CUDA graphs, NCCL's host API calls.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import qwen3_sim

CUSTOM_AR = "_ZN4vllm26cross_device_reduce_1stageI13__nv_bfloat16Li2EEEvPNS_8RankDataENS_11RankSignalsEPNS_6SignalEPT_ii"
CUSTOM_AR_NAME = ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, "
                  "vllm::Signal*, __nv_bfloat16*, int, int)")
NCCL_AR = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL19ncclDevKernelArgs4K"
NCCL_AR_NAME = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs4K)"
NCCL_AG = "_Z31ncclDevKernel_AllGather_RING_LL19ncclDevKernelArgs4K"
GEMMS = ("qkv", "o", "gate_up", "down", "lm_head")
PEER_BASE = 0x7A0000000000       # where a rank maps its peers' signal buffers
OWN_BASE = 0x7B0000000000        # this simulator's own allocations (GEMM weights, activations, AR)
MAX_RANKS = 8


@dataclass
class TPSim:
    tp: int = 2
    layers: int = 2
    prompts: tuple[int, ...] = (34, 85, 5)
    steps: int = 3
    collective: str = "custom"       # custom | nccl | mixed (custom in decode, NCCL in prefill)
    gemm_layout: bool = True
    env_rank: bool = True
    device_base: int = 0             # rank r runs on GPU device_base + r
    one_device: bool = False         # every worker sees only its own GPU, as ordinal 0 (CUDA_VISIBLE_DEVICES per worker)
    devices: int | None = None       # GPUs the host lists (default device_base + tp)
    extra_pid: bool = True
    edges: bool = False              # vLLM's vocab-parallel edges too: an NCCL all-reduce after the
                                     # embedding, an NCCL all-gather of the logits after lm_head
    pid_base: int = 7100
    plant: Callable | None = None    # plant(rank, records) edits one rank's launch records


@dataclass
class TPTruth:
    tp: int
    pids: list[int]                  # in rank order
    devices: list[int]               # in rank order
    shard: object                    # the per-rank Qwen3 config (heads, kv_heads, inter divided)
    gemm_n: dict[str, int]           # GEMM -> its shard's N (output columns)
    gemm_k: dict[str, int]           # GEMM -> its shard's K (reduced dimension)
    collectives_per_layer: int = 2
    peer_words_per_launch: int = 0   # custom all-reduce: tp - 1 peer Signal* words
    extra_pid: int | None = None
    forwards: int = 0


def shard_config(cfg, tp: int, layers: int | None = None):
    """The per-rank Qwen3 dimensions of a tp-way shard (KV heads replicated when fewer than tp)."""
    kv = cfg.kv_heads // tp if cfg.kv_heads >= tp else 1
    return dataclasses.replace(cfg, heads=cfg.heads // tp, kv_heads=kv, inter=cfg.inter // tp,
                               layers=layers if layers is not None else cfg.layers)


class _Allocs:
    """The simulator's own allocations in one rank: (base, size, id), ids above qwen3_sim's."""

    def __init__(self):
        self.next, self.id = OWN_BASE, 5000

    def __call__(self, size: int) -> tuple[int, int, int]:
        self.id += 1
        base = self.next
        self.next += (size + 0xFFFFF) & ~0xFFFFF
        return (base, size, self.id)


def _ptr_param(i: int, off: int, alloc, o: int = 0) -> dict:
    base, size, bid = alloc
    return {"i": i, "off": off, "size": 8, "hex": (base + o).to_bytes(8, "little").hex(),
            "ptrs": [{"at": 0, "base": hex(base), "size": size, "id": bid, "off": o}]}


def _int_param(i: int, off: int, v: int, size: int = 4) -> dict:
    return {"i": i, "off": off, "size": size, "hex": (v & ((1 << (8 * size)) - 1)).to_bytes(size, "little").hex()}


def _struct_param(i: int, off: int, size: int, words: dict[int, int], ptrs: list) -> dict:
    raw = bytearray(size)
    for at, v in words.items():
        raw[at:at + 8] = v.to_bytes(8, "little")
    rec = {"i": i, "off": off, "size": size, "hex": bytes(raw).hex()}
    if ptrs:
        rec["ptrs"] = ptrs
    return rec


class _Rank:
    """Rewrites one rank's qwen3_sim records (module docstring)."""

    def __init__(self, rank: int, sim: TPSim, cfg, shard):
        self.r, self.sim, self.cfg, self.shard = rank, sim, cfg, shard
        A = _Allocs()
        H = cfg.hidden
        self.n = {"qkv": shard.qkv_size, "o": H, "gate_up": 2 * shard.inter, "down": H, "lm_head": cfg.vocab}
        self.k = {"qkv": H, "o": shard.q_size, "gate_up": H, "down": shard.inter, "lm_head": H}
        self.w_off, off = {}, 0
        for layer in range(shard.layers):
            for g in GEMMS[:4]:
                self.w_off[(layer, g)] = off
                off += self.n[g] * self.k[g] * 2
        self.w_off[(-1, "lm_head")] = off
        off += self.n["lm_head"] * H * 2
        self.weights = A(off)
        self.acts = A(512 * max(self.n["qkv"], self.n["gate_up"], H) * 2 * 2 + cfg.vocab * 2)
        self.rank_data = A(8 * MAX_RANKS * 64)
        self.signal = A(1 << 20)
        self.ar_out = A(512 * H * 2)
        self.comm = A(1 << 16)
        self.work = A(1 << 20)
        self.peers = {k: (PEER_BASE + (k << 32), 1 << 20, 9000 + k) for k in range(sim.tp) if k != rank}
        self.allocs = [self.weights, self.acts, self.rank_data, self.signal, self.ar_out, self.comm, self.work]

    def gemm(self, rec: dict, which: str, layer: int, T: int) -> None:
        n, k = self.n[which], self.k[which]
        rec["grid"] = [-(-n // 128), -(-T // 64), 1]
        if not self.sim.gemm_layout:
            return
        rec["layout"], rec["packing"] = "kernel", "params"
        rec["params"] = [_ptr_param(0, 0, self.acts), _ptr_param(1, 8, self.weights, self.w_off[(layer, which)]),
                         _ptr_param(2, 16, self.acts, 512 * max(self.n["qkv"], self.n["gate_up"], self.cfg.hidden) * 2),
                         _int_param(3, 24, T), _int_param(4, 28, n), _int_param(5, 32, k)]

    def collective(self, like: dict, T: int, decode: bool, nccl_symbol: str | None = None) -> dict:
        rec = {**like, "params": None, "launch_attrs": {}, "graph": None, "layout": "kernel", "packing": "params"}
        nccl = nccl_symbol or self.sim.collective == "nccl" or (self.sim.collective == "mixed" and not decode)
        numel = T * self.cfg.hidden
        if nccl:
            sym = nccl_symbol or NCCL_AR
            rec.update(symbol=sym, name=NCCL_AR_NAME if sym == NCCL_AR else sym, sha256=qwen3_sim.SHA["gemm"], api="cuLaunchKernelEx",
                       grid=[2, 1, 1], block=[640, 1, 1])
            words = {0: self.comm[0], 8: 0x3, 16: 1, 24: self.work[0]}
            ptrs = [{"at": 0, "base": hex(self.comm[0]), "size": self.comm[1], "id": self.comm[2], "off": 0},
                    {"at": 24, "base": hex(self.work[0]), "size": self.work[1], "id": self.work[2], "off": 0}]
            rec["params"] = [_struct_param(0, 0, 4096, words, ptrs)]
            return rec
        rec.update(symbol=CUSTOM_AR, name=CUSTOM_AR_NAME, sha256=qwen3_sim.SHA["C"], api="cuLaunchKernel",
                   grid=[min(36, -(-numel // 512)), 1, 1], block=[512, 1, 1])
        words, ptrs = {}, []
        for k in range(self.sim.tp):
            a = self.signal if k == self.r else self.peers[k]
            words[8 * k] = a[0]
            ptrs.append({"at": 8 * k, "base": hex(a[0]), "size": a[1], "id": a[2], "off": 0})
        rec["params"] = [_ptr_param(0, 0, self.rank_data), _struct_param(1, 8, 8 * MAX_RANKS, words, ptrs),
                         _ptr_param(2, 72, self.signal), _ptr_param(3, 80, self.ar_out),
                         _int_param(4, 88, self.r), _int_param(5, 92, numel)]
        return rec

    def rewrite(self, recs: list[dict]) -> list[dict]:
        gemm_of = {qwen3_sim.SYM[g]: g for g in GEMMS}
        out, T, layer, decode = [], 1, -1, False
        for rec in recs:
            rec = dict(rec)
            sym = rec["symbol"]
            if sym == qwen3_sim.SYM["embed"]:
                T, layer = rec["grid"][0], -1
            if sym == qwen3_sim.SYM["qkv"]:   # one per layer, the profiling pass's too
                layer += 1
            if sym == qwen3_sim.SYM["attn"]:
                decode = rec["grid"][2] > 1
            rec["dev"] = 0 if self.sim.one_device else self.sim.device_base + self.r
            rec["ctx"], rec["tid"] = hex(0xC000 + self.r), 100 + self.r
            out.append(rec)
            if sym == qwen3_sim.SYM["embed"] and self.sim.edges:
                out.append(dict(self.collective(rec, T, decode, NCCL_AR), t_ns=rec["t_ns"] + 2_000))
            g = gemm_of.get(sym)
            if g is None:
                continue
            if g == "lm_head" and self.sim.edges:
                out.append(dict(self.collective(rec, T, decode, NCCL_AG), t_ns=rec["t_ns"] + 2_000))
            self.gemm(rec, g, layer if g != "lm_head" else -1, T)
            if g in ("o", "down"):
                out.append(dict(self.collective(rec, T, decode), t_ns=rec["t_ns"] + 2_000))
        for seq, rec in enumerate(out):   # host time as qwen3_sim spaced it (its gaps mark the steps)
            rec["seq"] = seq
            rec["t_ns"] += 700 * self.r
        return out


def _alloc_events(recs: list[dict], peers: dict) -> list[dict]:
    """An allocation event before the first launch for every allocation a pointer lands in; the
    peers' signal buffers as ipc_open."""
    seen: dict[int, tuple[int, int]] = {}
    for rec in recs:
        for p in rec.get("params") or []:
            for q in p.get("ptrs", []):
                seen.setdefault(int(q["base"], 16), (q["size"], q["id"]))
    ipc = {a[0] for a in peers.values()}
    events = []
    for order, (base, (size, bid)) in enumerate(sorted(seen.items())):
        kind = "ipc_open" if base in ipc else "alloc"
        events.append({"seq_before": 0, "order": order, "t_ns": 900_000_000 + order, "tid": 1, "dev": 0,
                       "event": kind, "api": "cuIpcOpenMemHandle_v2" if kind == "ipc_open" else "cuMemAlloc_v2",
                       "base": hex(base), "size": size, "id": bid, "result": 0})
    return events


def _meta(pid: int, argv: list[str], sim: TPSim, rank: int | None, n: int) -> dict:
    ndev = 1 if sim.one_device else sim.devices if sim.devices is not None else sim.device_base + sim.tp
    meta = {"format_version": 1, "pid": pid, "ppid": sim.pid_base - 1, "argv": argv,
            "start_ns": 900_000_000, "start_unix_ns": 1_700_000_000 * 10**9, "driver_version": 13000,
            "cupti_version": 130000,
            "devices": [{"ordinal": d, "name": "Simulated GPU", "cc": [9, 0], "uuid": f"{0xab00 + d + (rank or 0 if sim.one_device else 0):032x}",
                         "sm_count": 132, "total_mem": 150 << 30} for d in range(ndev)],
            "options": {"classify": 1, "alloc_log": 1},
            "counters": {"launches": n, "launches_recorded": n}, "end_ns": 10**12}
    if rank is not None and sim.env_rank:
        meta["env"] = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(sim.tp)}
    return meta


def _write(folder: Path, recs: list[dict], meta: dict, allocs: list[dict], cubins: Path) -> None:
    (folder / "cubins").mkdir(parents=True, exist_ok=True)
    for f in cubins.glob("*.cubin"):
        shutil.copyfile(f, folder / "cubins" / f.name)
    (folder / "launches.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    if allocs:
        (folder / "allocs.jsonl").write_text("".join(json.dumps(a) + "\n" for a in allocs))
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def simulate_tp(out: Path, cfg, sim: TPSim | None = None) -> TPTruth:
    """Write the rank folders (and the extra process) under `out`; the truth of what was planted."""
    sim = sim or TPSim()
    if cfg.heads % sim.tp or cfg.inter % sim.tp or not (sim.tp <= MAX_RANKS):
        raise ValueError(f"tp {sim.tp} does not divide the model's heads {cfg.heads} / inter {cfg.inter}")
    shard = shard_config(cfg, sim.tp, sim.layers)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = qwen3_sim.simulate(Path(tmp), shard, prompts=sim.prompts, steps=sim.steps)
        recs0 = [json.loads(x) for x in (base / "launches.jsonl").read_text().splitlines()]
        pids, devs = [], []
        for r in range(sim.tp):
            rk = _Rank(r, sim, cfg, shard)
            recs = rk.rewrite([dict(x) for x in recs0])
            if sim.plant:
                sim.plant(r, recs)
            pid = sim.pid_base + 3 * r
            argv = ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"]
            _write(out / f"pid{pid}", recs, _meta(pid, argv, sim, r, len(recs)), _alloc_events(recs, rk.peers), base / "cubins")
            pids.append(pid)
            devs.append(0 if sim.one_device else sim.device_base + r)
        extra = None
        if sim.extra_pid:
            small = [dict(recs0[0], seq=k, t_ns=950_000_000 + 1000 * k) for k in range(3)]
            extra = sim.pid_base - 1
            _write(out / f"pid{extra}", small, _meta(extra, ["vllm", "serve"], sim, None, 3), [], base / "cubins")
        nfw = 1 + len(sim.prompts) * (1 + sim.steps)
    rk0 = _Rank(0, sim, cfg, shard)
    return TPTruth(sim.tp, pids, devs, shard, {g: rk0.n[g] for g in GEMMS}, {g: rk0.k[g] for g in GEMMS},
                   2, sim.tp - 1 if sim.collective != "nccl" else 0, extra, nfw)


def model_config(layers: int = 2, **over):
    """The bundled Qwen3 0.6B config at `layers` layers (other fields replaced by `over`)."""
    from generators.qwen3 import config
    from paths import ROOT

    cfg = config.load(ROOT / "examples/vllm_qwen3/reference/config.json")
    return dataclasses.replace(cfg, layers=layers, **over)


if __name__ == "__main__":
    import sys

    t = simulate_tp(Path(sys.argv[1] if len(sys.argv) > 1 else "sim-tp"), model_config(), TPSim())
    print(t.pids, t.devices, t.gemm_n, t.gemm_k)
