"""A dump simulator: writes dumps in the documented format (docs/dump-format.md v1) with known truth.

Why: the analysis must recover, with no model knowledge, what a serving engine's capture encodes.
This simulator plants that structure on purpose, so tests can check every planted fact comes back:
- a noise window, a profiling pass at 16384 tokens, a window of warm-up passes (512, 8, 1), and
  prompts of 1/34/85/175 tokens with 4 decode steps each (bs = 1);
- a layered decoder (`layers` blocks) whose per-layer weights sit in one arena at a fixed stride,
  a KV pool split into K and V inside one 3.2 GB range (one offset per layer), an input arena
  (ids, positions, slot mapping, sampled ids) at stable addresses, and a workspace that moves;
- grids that are `var`, `mul`, `ceil_div`, a scalar `add(tokens, 64)`, and a stride scalar that is
  3072 in prefill and 512 in decode (decode hides it);
- a once-per-forward decoy kernel whose grid is ceil_div(tokens, 256) (a bad tokens reference);
- prefill attention (one 2D kernel) vs decode attention (3D + reduce): per-forward kernel sets
  differ, and kernels with no parameter layout (an `extra`-packed GEMM);
- jitter: in some decode transitions the sampling kernel of forward f is launched after the first
  launches of forward f+1;
- a u64 seed that sometimes lands inside an allocation (captured as a pointer in a few forwards).

With `graph_decode`, decode steps run as CUDA-graph replays, as an engine in graph mode runs them:
after the warm-ups one decode forward is stream-captured (its launches carry `graph.capture_id`),
instantiated, destroyed, captured again and instantiated at the *same exec address* (drivers
reuse handles); every decode step is then a graphs.jsonl `launch` of that exec and no launch
records. Truth.replayed says which forwards were replays.

Written for this project; nothing here reproduces an engine's code. Not simulated: tensor maps,
multi-stream interleaving.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1 << 30
WEIGHTS = (0x7F0000000000, 8 * GiB, 1)     # base, size, buffer id
EMBED_W = (0x7E0000000000, 300 << 20, 2)
FINAL_W = (0x7E8000000000, 2 << 20, 3)
COS_SIN = (0x7E9000000000, 2 << 20, 4)
INPUTS = (0x7EA000000000, 2 << 20, 5)
KV = (0x7C0000000000, 3_435_973_836, 6)
WS = [(0x7D0000000000 + k * 0x1000000000, 1 * GiB, 100 + k) for k in range(3)]
LAYER_STRIDE = 0x2000000
KV_HALF = 0x4000000
IN_IDS, IN_POS, IN_SLOT, IN_SAMPLED = 0, 0x10000, 0x20000, 0x30000


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class SimConfig:
    layers: int = 4
    prompts: tuple[int, ...] = (1, 34, 85, 175)
    decode_steps: int = 4
    profile_tokens: int = 16384
    warmups: tuple[int, ...] = (512, 8, 1)
    jitter_every: int = 3          # every n-th decode transition jitters the sampling kernel
    seed: int = 7
    extra_pid: bool = True         # also write a small second process
    layout_none_gemm: bool = True
    graph_decode: bool = False     # decode steps as CUDA-graph replays (module docstring)


@dataclass
class Truth:
    forwards: list[int] = field(default_factory=list)   # tokens of each forward, in order
    windows: list[int] = field(default_factory=list)    # forwards per request window (noise excluded)
    launches_per_forward: list[int] = field(default_factory=list)
    layers: int = 0
    sites_per_layer_decode: int = 13
    weight_stride: int = LAYER_STRIDE
    kv_layer_stride: int = 2 * KV_HALF
    replayed: list[bool] = field(default_factory=list)   # per forward: run from a graph replay


def _p(i: int, size: int, value: int = 0, ptr=None, raw: bytes | None = None, inner=None) -> dict:
    data = raw if raw is not None else (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    rec = {"i": i, "off": 0, "size": size, "hex": data.hex()}
    ptrs = []
    if ptr is not None:
        base, asz, bid = ptr
        ptrs.append({"at": 0, "base": hex(base), "size": asz, "id": bid, "off": value - base})
    for at, addr, (base, asz, bid) in inner or ():
        ptrs.append({"at": at, "base": hex(base), "size": asz, "id": bid, "off": addr - base})
    if ptrs:
        rec["ptrs"] = ptrs
    return rec


def _ptr(i: int, alloc, off: int) -> dict:
    return _p(i, 8, alloc[0] + off, ptr=alloc)


def _f32(i: int, x: float) -> dict:
    return _p(i, 4, raw=struct.pack("<f", x))


class _Forward:
    """Builds the launch list of one forward pass at `t` tokens."""

    def __init__(self, t: int, fidx: int, cfg: SimConfig, rng: random.Random):
        self.t, self.f, self.cfg, self.rng = t, fidx, cfg, rng
        self.ws = WS[fidx % 3]
        self.bump = 0
        self.out: list[tuple[str, list[int], list[int], list[dict], str]] = []

    def buf(self) -> dict:
        off = self.bump
        self.bump += ((self.t * 8192 + 4095) // 4096) * 4096 + 4096 * (self.f % 5)
        return off

    def wsp(self, i: int) -> dict:
        return _ptr(i, self.ws, self.buf())

    def k(self, sym, grid, block, params, layout="kernel"):
        self.out.append((sym, grid, block, params, layout))

    def weight(self, i: int, layer: int, slot: int) -> dict:
        return _ptr(i, WEIGHTS, layer * LAYER_STRIDE + slot * 0x400000)

    def norm(self, wparam: dict):
        t = self.t
        self.k("rms_norm_kernel", [t, 1, 1], [256, 1, 1],
               [self.wsp(0), self.wsp(1), wparam, _f32(3, 1e-6), _p(4, 4, t), _p(5, 4, 1024)])

    def gemm(self, layer: int, slot: int, n: int):
        t = self.t
        self.k("gemm_bf16_kernel", [ceil_div(t, 128), n // 128, 1], [128, 1, 1],
               [self.wsp(0), self.weight(1, layer, slot), self.wsp(2), _p(3, 4, t), _p(4, 4, n),
                _p(5, 4, 1024)])

    def build(self) -> list:
        t, cfg = self.t, self.cfg
        self.k("embed_kernel", [t, 1, 1], [256, 1, 1],
               [self.wsp(0), _ptr(1, INPUTS, IN_IDS), _ptr(2, EMBED_W, 0), _p(3, 4, 1024)])
        self.k("prep_positions_kernel", [ceil_div(t, 256), 1, 1], [256, 1, 1],
               [_ptr(0, INPUTS, IN_POS), _p(1, 4, t)])
        for layer in range(cfg.layers):
            kv_k, kv_v = layer * 2 * KV_HALF, layer * 2 * KV_HALF + KV_HALF
            self.norm(self.weight(2, layer, 0))
            self.gemm(layer, 1, 3072)
            for slot, heads in ((2, 16), (3, 8)):
                self.k("qk_norm_kernel", [t * heads, 1, 1], [32, 1, 1],
                       [self.wsp(0), self.weight(1, layer, slot), _p(2, 4, t * heads)])
            pos_addr = INPUTS[0] + IN_POS
            rope_arg = _p(0, 24, raw=t.to_bytes(8, "little") + pos_addr.to_bytes(8, "little")
                          + bytes(8), inner=[(8, pos_addr, INPUTS)])
            self.k("rope_kernel", [t, 1, 1], [128, 1, 1],
                   [rope_arg, _ptr(1, COS_SIN, 0), self.wsp(2), _p(3, 4, t + 64)])
            self.k("reshape_and_cache_kernel", [t, 1, 1], [256, 1, 1],
                   [self.wsp(0), self.wsp(1), _ptr(2, KV, kv_k), _ptr(3, KV, kv_v),
                    _ptr(4, INPUTS, IN_SLOT), _p(5, 8, 3072), _p(6, 8, 3072 if t > 1 else 512)])
            if t > 1:
                self.k("attn_2d_kernel", [ceil_div(t, 16), 16, 1], [128, 1, 1],
                       [self.wsp(0), _ptr(1, KV, kv_k), _ptr(2, KV, kv_v), self.wsp(3),
                        _f32(4, 0.125), _p(5, 4, t)])
            else:
                self.k("attn_3d_kernel", [1, 16, 16], [128, 1, 1],
                       [self.wsp(0), _ptr(1, KV, kv_k), _ptr(2, KV, kv_v), self.wsp(3),
                        _f32(4, 0.125)])
                self.k("reduce_segments_kernel", [1, 16, 1], [128, 1, 1],
                       [self.wsp(0), self.wsp(1), _p(2, 4, 16)])
            self.gemm(layer, 4, 1024)
            self.norm(self.weight(2, layer, 5))
            self.gemm(layer, 6, 6144)
            self.k("silu_and_mul_kernel", [t, 1, 1], [1024, 1, 1],
                   [self.wsp(0), self.wsp(1), _p(2, 4, 3072), _p(3, 8, t * 3072)])
            self.gemm(layer, 7, 1024)
        self.norm(_ptr(2, FINAL_W, 0))
        if cfg.layout_none_gemm:
            self.k("nvjet_lm_head_kernel", [1, 1186, 1], [384, 1, 1], [], layout="none")
        seed_val = self.rng.getrandbits(63) | 1
        seed = _p(2, 8, seed_val)
        if self.f % 7 == 3:  # an integer that happens to land in an allocation
            seed_val = self.ws[0] + 0x123450
            seed = _p(2, 8, seed_val, ptr=self.ws)
        self.k("argmax_sample_kernel", [1, 1, 1], [1024, 1, 1],
               [self.wsp(0), _ptr(1, INPUTS, IN_SAMPLED), seed])
        return self.out


def _record(seq: int, t_ns: int, launch, shas: dict) -> dict:
    sym, grid, block, params, layout = launch[:5]
    capture = launch[5] if len(launch) > 5 else None
    sha, mod = shas[sym]
    off = 0
    for prm in params:
        align = min(prm["size"], 8)
        off = (off + align - 1) // align * align
        prm["off"] = off
        off += prm["size"]
    rec = {
        "seq": seq, "t_ns": t_ns, "tid": 4242, "dev": 0, "ctx": "0x5555aaaa0000",
        "stream": "0x0", "api": "cuLaunchKernel" if layout != "none" else "cuLaunchKernelEx",
        "result": 0, "graph": None if capture is None else {"graph": capture[1], "capture_id": capture[0]},
        "handle": "function", "func": hex(0x6000 + mod),
        "module": mod, "sha256": sha, "symbol": "_Z" + str(len(sym)) + sym + "v", "name": sym,
        "grid": grid, "block": block, "smem": 0, "launch_attrs": {},
        "attrs": {"regs": 32, "static_smem": 0, "local": 0, "const": 0, "max_threads": 1024,
                  "ptx": 90, "binary": 90},
        "packing": "params" if layout != "none" else "extra", "layout": layout, "params": params,
    }
    if layout == "none":
        rec["extra_hex"] = "00" * 64
    return rec


def _write_pid(folder: Path, pid: int, launches: list, times: list[int], graphs: list | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cubins").mkdir(exist_ok=True)
    syms = sorted({x[0] for x in launches})
    shas, mods = {}, []
    for k, sym in enumerate(syms):
        blob = f"fake cubin for {sym}".encode()
        sha = hashlib.sha256(blob).hexdigest()
        shas[sym] = (sha, k + 1)
        (folder / "cubins" / f"{sha}.cubin").write_bytes(blob)
        mods.append({"event": "load", "module": k + 1, "ctx": "0x5555aaaa0000", "dev": 0,
                     "t_ns": times[0] - 1000, "sha256": sha, "size": len(blob),
                     "entries": ["_Z" + str(len(sym)) + sym + "v"]})
    with open(folder / "modules.jsonl", "w") as fh:
        fh.writelines(json.dumps(m) + "\n" for m in mods)
    with open(folder / "launches.jsonl", "w") as fh:
        for seq, (launch, t_ns) in enumerate(zip(launches, times)):
            fh.write(json.dumps(_record(seq, t_ns, launch, shas), separators=(",", ":")) + "\n")
    if graphs:
        with open(folder / "graphs.jsonl", "w") as fh:
            fh.writelines(json.dumps(g) + "\n" for g in graphs)
    meta = {"format_version": 1, "pid": pid, "ppid": 1, "argv": ["python", "serve.py"],
            "start_ns": times[0] - 10**9, "start_unix_ns": 1_700_000_000 * 10**9,
            "driver_version": 13000, "cupti_version": 130000,
            "devices": [{"ordinal": 0, "name": "Simulated GPU", "cc": [9, 0], "uuid": "GPU-sim",
                         "sm_count": 132, "total_mem": 150 * GiB}],
            "options": {}, "counters": {"launches": len(launches),
                                        "launches_recorded": len(launches)},
            "end_ns": times[-1] + 1000}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def simulate(out: Path, cfg: SimConfig | None = None) -> tuple[Path, Truth]:
    """Write a dump folder at `out` (pid folders inside); returns the main pid folder and the truth."""
    cfg = cfg or SimConfig()
    rng = random.Random(cfg.seed)
    truth = Truth(layers=cfg.layers)
    windows = [[cfg.profile_tokens], list(cfg.warmups)]
    windows += [[p] + [1] * cfg.decode_steps for p in cfg.prompts]
    launches: list = [("init_fill_kernel", [4, 1, 1], [256, 1, 1], [_p(0, 4, k)], "kernel")
                      for k in range(5)]
    times = [10**9 + 20_000 * k for k in range(5)]
    t = times[-1] + 10**9
    fidx = 0
    transitions = 0
    graphs: list = []
    exec_ = "0xe0e0"
    for w_i, w in enumerate(windows):
        if cfg.graph_decode and w_i == 2:
            # capture a decode forward twice; the second exec reuses the first's address
            for cid, g in ((1, "0x9a01"), (2, "0x9a02")):
                t += 2_000_000
                graphs.append({"event": "capture_begin", "t_ns": t, "stream": "0x77", "capture_id": cid})
                cap = _Forward(1, fidx, cfg, rng).build()
                first = len(launches)
                for launch in cap:
                    t += 3000
                    launches.append((*launch, (cid, g)))
                    times.append(t)
                graphs.append({"event": "capture_end", "t_ns": t + 10, "stream": "0x77", "graph": g,
                               "capture_id": cid, "seq_first": first, "seq_last": len(launches) - 1,
                               "nodes": len(cap)})
                graphs.append({"event": "instantiate", "t_ns": t + 20, "graph": g, "exec": exec_})
                if cid == 1:
                    graphs.append({"event": "exec_destroy", "t_ns": t + 30, "exec": exec_})
            t += 50_000_000
        truth.windows.append(len(w))
        prev_tail = None
        for j, tokens in enumerate(w):
            replay = cfg.graph_decode and w_i >= 2 and j > 0
            fwd = _Forward(tokens, fidx, cfg, rng).build()
            truth.forwards.append(tokens)
            truth.launches_per_forward.append(len(fwd))
            truth.replayed.append(replay)
            if replay:
                # a decode step replayed: one graph launch, no launch records
                if prev_tail is not None:
                    t += 4000
                    launches.append(prev_tail)
                    times.append(t)
                    prev_tail = None
                t += 5000
                graphs.append({"event": "launch", "t_ns": t, "stream": "0x0", "exec": exec_})
                t += rng.randrange(300_000, 1_700_000)
                fidx += 1
                continue
            if prev_tail is not None:
                transitions += 1
                if tokens == 1 and transitions % cfg.jitter_every == 0:
                    fwd = fwd[:1] + [prev_tail] + fwd[1:]   # late sampling launch of forward f-1
                else:
                    fwd = [prev_tail] + fwd
            tail = fwd[-1] if j + 1 < len(w) else None
            body = fwd[:-1] if tail is not None else fwd
            for k, launch in enumerate(body):
                if k:
                    t += 4000 + rng.randrange(3000)
                launches.append(launch)
                times.append(t)
            prev_tail = tail
            t += rng.randrange(300_000, 1_700_000)
            fidx += 1
        t += rng.randrange(50_000_000, 300_000_000)
    main = out / "pid4242"
    _write_pid(main, 4242, launches, times, graphs)
    if cfg.extra_pid:
        small = [("init_fill_kernel", [1, 1, 1], [32, 1, 1], [_p(0, 4, 1)], "kernel")] * 3
        _write_pid(out / "pid4300", 4300, small, [5 * 10**9 + k * 1000 for k in range(3)])
    truth.sites_per_layer_decode = 13
    return main, truth


if __name__ == "__main__":
    import sys

    folder, tr = simulate(Path(sys.argv[1] if len(sys.argv) > 1 else "sim-dump"))
    print(folder, len(tr.forwards), "forwards")
