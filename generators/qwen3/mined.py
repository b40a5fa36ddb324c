"""Read a vLLM Qwen3 capture: the forwards, every call site's kernel instance, and the wiring check.

`mine(dump, cfg, analysis)` takes the forward passes of the analysis contract (`vocab.analysis`:
the forwards `mine analyze` reports, by the launch records each one ran), walks each one's launches that belong to the model's layers (families in
`kernels.py`; GEMMs, ATen and sampling kernels are skipped) through the Qwen3 structure (input
norm, per layer: norm, q/k head norms, rope, cache write, attention [+ reduce], norm, silu; final
norm), and returns per (phase, role) the one kernel instance it launches and how each scalar
depends on the forward's token count. Forwards whose structure differs (profiling and warm-up
passes that skip attention) are left out and counted.

The wiring the generator writes is proved over the analysis, never on raw addresses: `check`
asks the analysis' buffer views (pointer words in one allocation at constant distances in every
forward) for the q/k/v views at their offsets of the fused qkv output, one residual through all
layers, rope in place on the normed q/k, the KV cache shared by the cache write and attention and
distinct per layer, reduce reading the 3D attention's segments; `check_weights_distinct` its
pointer records for weights bound once and distinct per layer; `check_kv_pool` its strides for one
KV pool. A mismatch raises `WiringMismatch`, one sentence naming the call site. Not checked: GEMM
operands (cuBLAS launches carry no usable layout).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from generators.qwen3.kernels import (FADD_HIDDEN, FAMILIES, NUM_SEQS, RMS_HIDDEN, Family, base_index, family_of,
                                      tag)
from vocab.analysis import AnalysisDoc, site_name
from vocab.errors import MineError


class WiringMismatch(MineError, ValueError):
    """The capture contradicts the wiring or structure the generator writes; names the call site."""


@dataclass
class Launch:
    seq: int
    tag: str
    symbol: str
    sha256: str
    regs: int
    grid: tuple
    block: tuple
    smem: int
    sizes: tuple
    values: tuple          # little-endian value of each param's first min(size, 8) bytes
    forward: int = -1
    tokens: int = 0
    seqs: int = 1          # sequences in the forward (attention's num_seqs); warm-ups batch many
    layer: int = -1
    role: str = ""
    site_id: str = ""      # the analysis' name of its call site (`vocab.analysis.site_name`)

    def site(self) -> str:
        where = f"layer {self.layer} {self.role}" if self.layer >= 0 else self.role
        return (f"call site {where} (`{short(self.symbol)}`, launch seq {self.seq}, forward {self.forward} "
                f"of {self.tokens} tokens)")

    def f32(self, i: int) -> float:
        return struct.unpack("<f", int(self.values[i] & 0xFFFFFFFF).to_bytes(4, "little"))[0]


def short(sym: str, width: int = 60) -> str:
    return sym if len(sym) <= width else sym[: width - 3] + "..."


@dataclass
class Instance:
    """One kernel build as launched at one (phase, role): everything a manifest launch needs."""
    family: Family
    symbol: str
    sha256: str
    regs: int
    sizes: tuple
    block: tuple
    smem: int
    launches: list = field(default_factory=list)
    scalars: dict = field(default_factory=dict)   # index -> ("const", type, value) | ("affine", type, a, b)
    when: tuple | None = None                      # (min, max | None) row range this build serves; None: all


@dataclass
class Mined:
    instances: dict            # (phase, role) -> [Instance], one per build (see `_split_builds`)
    forwards: list             # [(forward, phase, tokens)]
    skipped: int               # forwards left out for their structure
    cubins: dict               # sha256 -> path of the cubin in the dump (None when absent)
    source: str                # the dump's launches file, for the manifest's record
    block_size: int = 0
    table_width: int = 0
    segments: int = 0


# ------------------------------------------------------------------ reading the dump
def _launches(dump) -> list[Launch]:
    df = dump.launches
    sym = df["symbol"].astype(str).to_numpy()
    tags = np.array([tag(s) or "" for s in dump.launches["symbol"].cat.categories], dtype=object)
    codes = df["symbol"].cat.codes.to_numpy()
    keep = np.flatnonzero(tags[codes] != "")
    if len(keep) == 0:
        return []
    seqs = df["seq"].to_numpy()[keep]
    p = dump.params
    p = p[(~p["word"]) & p["seq"].isin(seqs)].sort_values(["seq", "i"], kind="stable")
    by_seq: dict[int, list] = {}
    for seq, size, value in zip(p["seq"].to_numpy(), p["size"].to_numpy(), p["value"].to_numpy()):
        by_seq.setdefault(int(seq), []).append((int(size), int(value)))
    out = []
    sha = df["sha256"].astype(str).to_numpy()
    cols = {c: df[c].to_numpy() for c in ("regs", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "smem")}
    for r in keep:
        ps = by_seq.get(int(df["seq"].iat[r]), [])
        out.append(Launch(int(df["seq"].iat[r]), tags[codes[r]], sym[r], sha[r], int(cols["regs"][r]),
                          (int(cols["grid_x"][r]), int(cols["grid_y"][r]), int(cols["grid_z"][r])),
                          (int(cols["block_x"][r]), int(cols["block_y"][r]), int(cols["block_z"][r])),
                          int(cols["smem"][r]), tuple(s for s, _ in ps), tuple(v for _, v in ps)))
    return out


def _val(x: Launch, i: int) -> int:
    return x.values[i] if i < len(x.values) else -1


def _layer_block(ls: list[Launch], k: int, first: bool, cfg) -> tuple[list, int] | None:
    """The launches of one layer starting at ls[k] as [(role, launch)], or None if the shape differs."""
    want = [("in_norm", "rms") if first else ("add_norm", "fadd"), ("q_norm", "rms"), ("k_norm", "rms"),
            ("rope", "rope"), ("cache", "cache"), ("attn", "attn")]
    got = []
    for role, t in want:
        if k >= len(ls) or ls[k].tag != t:
            return None
        got.append((role, ls[k]))
        k += 1
    if k < len(ls) and ls[k].tag == "reduce":
        got[-1] = ("attn3d", got[-1][1])
        got.append(("reduce", ls[k]))
        k += 1
    for role, t in (("post_norm", "fadd"), ("silu", "silu")):
        if k >= len(ls) or ls[k].tag != t:
            return None
        got.append((role, ls[k]))
        k += 1
    q, kk = got[1][1], got[2][1]
    if _val(q, RMS_HIDDEN) != cfg.head_dim or _val(kk, RMS_HIDDEN) != cfg.head_dim:
        return None
    return got, k


def _walk(ls: list[Launch], cfg) -> list[Launch] | None:
    """One forward's model launches with layer and role set, or None if its shape is not a whole
    Qwen3 forward (vLLM's profiling pass runs without attention and is left out)."""
    if not ls or not (ls[0].tag == "rms" and _val(ls[0], RMS_HIDDEN) == cfg.hidden):
        return None
    fwd, j = [], 0
    for layer in range(cfg.layers):
        blk = _layer_block(ls, j, layer == 0, cfg)
        if blk is None:
            return None
        for role, lx in blk[0]:
            lx.layer, lx.role = layer, role
            fwd.append(lx)
        j = blk[1]
    if j != len(ls) - 1 or ls[j].tag != "fadd" or _val(ls[j], FADD_HIDDEN) != cfg.hidden:
        return None
    ls[j].layer, ls[j].role = -1, "final_norm"
    fwd.append(ls[j])
    return fwd


def forwards(launches: list[Launch], forward_of: dict[int, int], cfg) -> tuple[list[list[Launch]], int]:
    """The whole forwards among the analysis' forward passes (`mining.passes`), each with its
    forward number; also how many passes were left out for their shape."""
    by: dict[int, list[Launch]] = {}
    for x in launches:
        f = forward_of.get(x.seq, -1)
        if f >= 0:
            by.setdefault(f, []).append(x)
    out, skipped = [], 0
    for f in sorted(by):
        occ: dict[str, int] = {}
        for x in by[f]:   # every launch of a tagged symbol is here, so this is the analysis' occurrence
            x.site_id = site_name(x.symbol, occ.setdefault(x.symbol, 0))
            occ[x.symbol] += 1
        fwd = _walk(by[f], cfg)
        if fwd is None:
            skipped += 1
            continue
        for x in fwd:
            x.forward = f
        out.append(fwd)
    return out, skipped


# ------------------------------------------------------------------ instances and scalars
def op_role(role: str) -> str:
    return "add_norm" if role in ("final_norm", "post_norm") else role


def _family(x: Launch) -> Family:
    return family_of(x.tag, x.role, len(x.sizes))


def _seqs(fwd: list[Launch], tokens: int, cfg) -> int:
    """Sequences in a forward, from the attention grid (one q block per BLOCK_Q rows plus one per
    sequence), proved against the kernel's num_seqs argument. vLLM's warm-ups batch one token per
    sequence; the manifest's programs run one sequence per call."""
    attn = [x for x in fwd if x.role in ("attn", "attn3d")]
    seqs = attn[0].grid[0] - tokens // cfg.block_q
    for x in attn:
        if x.grid[0] - tokens // cfg.block_q != seqs or x.values[NUM_SEQS] != seqs:
            raise WiringMismatch(f"{x.site()}: grid x {x.grid[0]} and num_seqs {x.values[NUM_SEQS]} do not agree "
                                 f"with {tokens} rows in {cfg.block_q}-row query blocks plus one block per sequence")
    return seqs


def _scalar(inst: Instance, i: int) -> tuple:
    xs = inst.launches
    if i == inst.family.seqs:
        return ("seqs", "i32")
    size = inst.sizes[i]
    is_f = i in inst.family.floats
    typ = "f32" if is_f else {1: "u8", 4: "i32", 8: "i64"}.get(size)
    if typ is None:
        raise WiringMismatch(f"{xs[0].site()}: param #{i} is {size} bytes, not a scalar kern can pass")
    vals = np.array([x.values[i] for x in xs], dtype=np.uint64)
    if (vals == vals[0]).all():
        v = int(vals[0])
        if typ == "f32":
            return ("const", typ, xs[0].f32(i))
        if typ in ("i32", "i64"):
            bits = 32 if typ == "i32" else 64
            v = v - (1 << bits) if v >= 1 << (bits - 1) else v
        return ("const", typ, v)
    if is_f:
        raise WiringMismatch(f"{xs[0].site()}: float param #{i} changes between launches; only integers may follow the token count")
    t = np.array([x.tokens for x in xs], dtype=np.int64)
    v = vals.astype(np.int64)
    multi = vals[t > 1]
    if typ == "i64" and len(multi) and (multi == multi[0]).all():
        # only one-row launches disagree: the stride of a dimension of size 1, which PyTorch sets as
        # its view computes it (vLLM's one-token value view of the fused qkv output: 768 where rows
        # are 2304 apart); a launch of one row never reads it, so the rows' stride serves every launch
        m0 = int(multi[0])
        return ("const", typ, m0 - (1 << 64) if m0 >= 1 << 63 else m0)
    if len(np.unique(t)) >= 2:
        i0, i1 = np.argmin(t), np.argmax(t)
        a, rem = divmod(int(v[i1] - v[i0]), int(t[i1] - t[i0]))
        b = int(v[i0]) - a * int(t[i0])
        if rem == 0 and a > 0 and b >= 0 and (a * t + b == v).all():
            return ("affine", typ, a, b)
    bad = next(x for x in xs if x.values[i] != xs[0].values[i])
    raise WiringMismatch(f"{bad.site()}: param #{i} takes values {sorted(set(v.tolist()))[:5]} that are not "
                         "a multiple of the token count plus a constant")


def _split_builds(xs: list[Launch]) -> list[tuple[list[Launch], tuple | None]]:
    """One (launches, when) per kernel build of a call site, or a WiringMismatch.

    vLLM picks some launch shapes by the token count (fused_add_rms_norm: 1024 threads below 256
    tokens, 256 above). Builds that share symbol, cubin, registers and ABI and differ only in
    block/shared memory become launches guarded by `when` ranges of the row count, provided the
    token counts they were seen at do not interleave. The boundary between two seen ranges is not
    pinned by the data; the smallest power of two inside the gap is taken (the fitter's canonical
    choice) and recorded in the manifest through the ranges.
    """
    key = lambda x: (x.symbol, x.sha256, x.regs, x.sizes, x.block, x.smem)  # noqa: E731
    builds: dict[tuple, list[Launch]] = {}
    for x in xs:
        builds.setdefault(key(x), []).append(x)
    if len(builds) == 1:
        return [(xs, None)]
    ordered = sorted(builds.values(), key=lambda g: min(x.tokens for x in g))
    first, other = ordered[0][0], ordered[1][0]
    # builds of one kernel whose ABIs the families know (a Triton build specialised on one
    # sequence and its general build) split like shapes do; any other second build is a mismatch
    known = len({x.symbol for x in xs}) == 1 and all(_family(g[0]).n_params == len(g[0].sizes) for g in ordered) \
        and len({len(g[0].sizes) for g in ordered}) == len(ordered)
    if not known and len({(x.symbol, x.sha256, x.regs, x.sizes) for x in xs}) > 1:
        raise WiringMismatch(f"{other.site()}: launches a second build of the kernel (regs {other.regs}, block "
                             f"{list(other.block)}, smem {other.smem}, sha256 {other.sha256[:12]}) where other forwards "
                             f"launch regs {first.regs}, block {list(first.block)}, smem {first.smem}, sha256 "
                             f"{first.sha256[:12]}")
    out, lo = [], 1
    for n, group in enumerate(ordered):
        t_lo, t_hi = min(x.tokens for x in group), max(x.tokens for x in group)
        if n + 1 < len(ordered):
            nxt = min(x.tokens for x in ordered[n + 1])
            if nxt <= t_hi:
                bad = next(x for x in ordered[n + 1] if x.tokens <= t_hi)
                raise WiringMismatch(f"{bad.site()}: launches block {list(bad.block)} at {bad.tokens} tokens, inside "
                                     f"the range {t_lo}..{t_hi} where the kernel runs with block {list(group[0].block)}; "
                                     "the shape does not follow the token count")
            edge = 1 << t_hi.bit_length()          # smallest power of two above t_hi
            hi = (edge if edge <= nxt else nxt) - 1
            out.append((group, (lo, hi)))
            lo = hi + 1
        else:
            out.append((group, (lo, None)))
    return out


def _instances(fwds: list[list[Launch]]) -> dict:
    """(phase, role) -> [Instance], one per build, each with its `when` row range (None: always)."""
    groups: dict[tuple, list[Launch]] = {}
    for fwd in fwds:
        phase = "d" if any(x.role == "attn3d" for x in fwd) else "p"
        for x in fwd:
            groups.setdefault((phase, op_role(x.role)), []).append(x)
    out = {}
    for key, xs in sorted(groups.items()):
        variants = []
        for group, when in _split_builds(xs):
            x0 = group[0]
            fam = _family(x0)
            sym, sha, regs, sizes, block, smem = x0.symbol, x0.sha256, x0.regs, x0.sizes, x0.block, x0.smem
            if len(sizes) != fam.n_params:
                raise WiringMismatch(f"{x0.site()}: the captured kernel takes {len(sizes)} params {list(sizes)}, "
                                     f"the vLLM 0.26 model of `{fam.match}` has {fam.n_params}")
            for i in fam.ptrs:
                if sizes[i] != 8:
                    raise WiringMismatch(f"{x0.site()}: param #{i} ({fam.ptrs[i][0]}) is {sizes[i]} bytes, not a pointer")
            if not sha:
                raise WiringMismatch(f"{x0.site()}: the capture did not resolve the launch's module")
            inst = Instance(fam, sym, sha, regs, sizes, block, smem, group, when=when)
            inst.scalars = {i: _scalar(inst, i) for i in range(len(sizes)) if i not in fam.ptrs}
            variants.append(inst)
        out[key] = variants
    return out


# ------------------------------------------------------------------ model facts the scalars must show
def _expected(cfg, bs: int) -> dict:
    """(role, param index) -> the value the model implies: an int, a float (f32), or ("tokens", a).

    The KV layout these strides describe is vLLM 0.26's for the Triton backend, per layer:
    [block][token in block][kv head][K | V][head_dim], so one token's K and V of all heads sit in
    one 2·H·D-element row (the manifest's `bytes_per_token`) and V is D elements past K.
    """
    D, H = cfg.head_dim, cfg.kv_heads
    token_row, block_stride = H * 2 * D, bs * H * 2 * D
    e = {("in_norm", 9): cfg.eps, ("in_norm", 10): ("tokens", 1), ("in_norm", 11): cfg.hidden,
         ("q_norm", 9): cfg.eps, ("q_norm", 10): ("tokens", cfg.heads), ("q_norm", 11): D,
         ("k_norm", 9): cfg.eps, ("k_norm", 10): ("tokens", cfg.kv_heads), ("k_norm", 11): D,
         ("add_norm", 4): cfg.eps, ("add_norm", 5): ("tokens", 1), ("add_norm", 6): cfg.hidden,
         ("rope", 4): D, ("rope", 8): cfg.heads, ("rope", 9): cfg.kv_heads, ("rope", 10): D,
         # reshape_and_cache_kernel_flash: key/value row strides, block, head, dim (unused: 0), token strides
         ("cache", 7): cfg.kv_size, ("cache", 8): cfg.qkv_size, ("cache", 9): block_stride, ("cache", 10): 2 * D,
         ("cache", 11): 0, ("cache", 12): 0, ("cache", 13): token_row,
         ("reduce", 6): cfg.q_size, ("reduce", 7): D}
    for role in ("attn", "attn3d"):
        e.update({(role, 6): D ** -0.5, (role, 12): cfg.q_size, (role, 13): D, (role, 14): cfg.q_size,
                  (role, 15): D, (role, 18): block_stride, (role, 19): token_row, (role, 20): 2 * D,
                  (role, 21): block_stride, (role, 22): token_row, (role, 23): 2 * D})
    return e


# Row strides: with one row per launch (decode) the kernel never multiplies by them, and vLLM
# passes whatever stride its view reports (1024 for the value view where prefill shows 4096).
ROW_STRIDES = {("cache", 7), ("cache", 8), ("attn", 12), ("attn", 14), ("attn3d", 12), ("attn3d", 14),
               ("reduce", 6)}


def _check_scalars(instances: dict, cfg, bs: int) -> None:
    want = _expected(cfg, bs)
    for (phase, role), variants in instances.items():
        for inst in variants:
            one_row = all(x.tokens == 1 for x in inst.launches)
            at = {base_index(inst.family, i): i for i in range(len(inst.sizes))}
            for (r, i), w in want.items():
                if r == role and not (one_row and (r, i) in ROW_STRIDES):
                    _check_scalar(inst, at[i], w)


def _check_scalar(inst: Instance, i: int, w) -> None:
    got = inst.scalars[i]
    x = inst.launches[0]
    if isinstance(w, float):
        ok = got[0] == "const" and np.float32(got[2]) == np.float32(w)
    elif isinstance(w, tuple):
        ok = (got[0] == "affine" and got[2:] == (w[1], 0)) or (
            got[0] == "const" and all(x_.tokens * w[1] == got[2] for x_ in inst.launches))
    else:
        ok = got[0] == "const" and got[2] == w
    if not ok:
        shown = w if not isinstance(w, tuple) else f"{w[1]} x tokens"
        raise WiringMismatch(f"{x.site()}: param #{i} is {got[2:] if got[0] == 'affine' else got[2]}, "
                             f"the Qwen3 layout the generator writes needs {shown}")


# ------------------------------------------------------------------ the wiring, proved on the analysis' views
class _Views:
    """The analysis' buffer views (`mining.pointers.views`) as the generator asks about them: is
    param `i` of one launch the same buffer as, or a view at a byte offset of, another's, in every
    forward both ran in."""

    def __init__(self, doc: AnalysisDoc):
        self.rel = doc.relation()

    def distance(self, base: Launch, j: int, a: Launch, i: int) -> int | None:
        return self.rel.distance((base.site_id, j, 0), (a.site_id, i, 0))

    def same(self, a: Launch, i: int, b: Launch, j: int, what: str) -> None:
        self.at(a, i, b, j, 0, what, f"the same buffer as param #{j} of layer {b.layer} {b.role}")

    def at(self, a: Launch, i: int, base: Launch, j: int, off: int, what: str, want: str | None = None) -> None:
        want = want or f"param #{j} of layer {base.layer} {base.role} + {off} bytes"
        d = self.distance(base, j, a, i)
        if d == off:
            return
        got = ("at no constant distance from it in the forwards both ran in (no view of the analysis holds both)"
               if d is None else f"at {d:+d} bytes from it")
        raise WiringMismatch(f"{a.site()}: {what} (param #{i}, analysis site {a.site_id}) should be {want}, "
                             f"but it is {got}")


def check(fwd: list[Launch], cfg, views: _Views) -> None:
    """Every address relation the generated wiring relies on, for one forward's call sites, as
    facts of the analysis (each relation held in every forward the two sites ran in)."""
    layers: dict[int, dict[str, Launch]] = {}
    for x in fwd:
        layers.setdefault(x.layer, {})
        layers[x.layer][x.role] = x
    residual = layers[0]["in_norm"]
    caches: list[Launch] = []
    for layer in range(cfg.layers):
        s = layers[layer]
        qn, kn, rope, cache = s["q_norm"], s["k_norm"], s["rope"], s["cache"]
        attn = s.get("attn") or s["attn3d"]
        norm_in = s["in_norm"] if layer == 0 else s["add_norm"]
        if layer > 0:
            views.same(norm_in, 2, residual, 1, "the residual")
        views.same(s["post_norm"], 2, residual, 1, "the residual")
        views.at(kn, 1, qn, 1, 2 * cfg.q_size, "the k-norm input (the k view of the fused qkv)")
        views.at(cache, 1, qn, 1, 2 * (cfg.q_size + cfg.kv_size), "the cached value (the v view of the fused qkv)")
        views.same(rope, 1, qn, 0, "rope's query (in place on the normed q)")
        views.same(rope, 2, kn, 0, "rope's key (in place on the normed k)")
        views.same(cache, 0, kn, 0, "the cached key")
        views.same(attn, 1, qn, 0, "the attention query")
        views.same(attn, 2, cache, 2, "the attention's key cache")
        views.same(attn, 3, cache, 3, "the attention's value cache")
        views.same(attn, 7, cache, 5, "the attention's k scale")
        views.same(attn, 8, cache, 6, "the attention's v scale")
        views.same(attn, 17, attn, 5, "the attention's prefix-length pointer")
        views.at(cache, 3, cache, 2, 2 * cfg.head_dim, "the value cache",
                 f"{2 * cfg.head_dim} bytes past the key cache (the generated KV state's layout)")
        for other in caches:
            if views.distance(other, 2, cache, 2) == 0:
                raise WiringMismatch(f"{cache.site()}: writes the KV cache layer {other.layer} writes; the "
                                     "manifest gives every layer its own state")
        caches.append(cache)
        if "reduce" in s:
            red = s["reduce"]
            at = {r: i for i, (r, *_) in _family(red).ptrs.items()}
            for r, j, what in (("out", 0, "the output"), ("segm_out", 26, "the segment outputs"),
                               ("segm_max", 27, "the segment maxima"), ("segm_expsum", 28, "the segment sums"),
                               ("seq_lens", 5, "the sequence lengths"), ("cu_seqlens", 24, "the query starts")):
                views.same(red, at[r], attn, j, what)
        if layer > 0:
            prev = layers[layer - 1]
            views.same(rope, 0, prev["rope"], 0, "the positions")
            views.same(rope, 3, prev["rope"], 3, "the rope cos/sin cache")
            views.same(attn, 5, (prev.get("attn") or prev["attn3d"]), 5, "the sequence lengths")
    final = layers[-1]["final_norm"]
    views.same(final, 2, residual, 1, "the residual")


# ------------------------------------------------------------------ entry point
def forward_map(doc: AnalysisDoc) -> dict[int, int]:
    """launch seq -> forward of the analysis, over the forwards that ran eagerly (a graph-replayed
    forward re-runs records captured once; this generator binds eager launches)."""
    out: dict[int, int] = {}
    for f in doc.passes.forwards:
        if f.replayed:
            continue
        for first, n in f.seqs:
            for s in range(first, first + n):
                out[s] = f.forward
    return out


def check_analysis(doc: AnalysisDoc, dump, cfg) -> None:
    """The analysis is of this capture, and its layer structure is the config's: one sentence
    naming what disagrees."""
    if doc.source.launches != len(dump.launches) or doc.source.launches_file != dump.source.name:
        raise WiringMismatch(f"the analysis was made from another capture ({doc.source.launches} launches in "
                             f"{doc.source.launches_file}; {dump.source} holds {len(dump.launches)})")
    if doc.layers.layers != cfg.layers:
        raise WiringMismatch(f"the analysis finds {doc.layers.layers} layers per forward "
                             f"(pattern {doc.layers.pattern or 'none'}); the config has {cfg.layers}")
    bad = [f for f in doc.serve_forwards() if f.layers != cfg.layers]
    if bad:
        raise WiringMismatch(f"forward {bad[0].forward} of the analysis has {bad[0].layers} layers "
                             f"(pattern {bad[0].pattern}); the config has {cfg.layers}")


def check_kv_pool(doc: AnalysisDoc, cfg) -> None:
    """Over the analysis: one KV pool, laid out one region per layer at a constant stride, that
    the kernel writing the cache and the attention reading it share in every layer (the manifest
    binds one `kv.<layer>` state per layer). Names the call sites when it does not hold. A
    one-layer model has no stride to check (the address check of `check` still holds there)."""
    if cfg.layers < 2:
        return
    pools: dict[int, set] = {}
    for st in doc.layers.strides:
        if st.role == "kv_pool" and st.stride is not None and st.layers == cfg.layers:
            pools.setdefault(st.stride, set()).add(st.symbol)
    if not any(len(users) >= 2 for users in pools.values()):
        kv = [p for p in doc.pointers if p.role == "kv_pool"]
        where = (f"call site {kv[0].site} (layer {kv[0].layer})" if kv else "no call site")
        raise WiringMismatch(f"the analysis finds no KV pool that two kernels share in all {cfg.layers} layers "
                             f"at one stride ({where} is the first kv_pool pointer); the manifest's "
                             f"per-layer KV states need one")


def check_weights_distinct(doc: AnalysisDoc) -> None:
    """Over the analysis: the weights this generator binds (rms_norm's and fused_add_rms_norm's
    weight words, rope's cos/sin cache; GEMM operands are not bound) are at one address in every
    forward (bound once at load), and a layer's norm weight is no other layer's (the manifest
    binds a distinct tensor per layer). Names the call sites."""
    seen: dict[tuple, object] = {}
    per_layer = {("rms", 7), ("fadd", 3)}
    for ptr in doc.pointers:
        which = (tag(ptr.symbol), ptr.i)
        if ptr.at != 0 or which not in per_layer | {("rope", 3)}:
            continue
        if ptr.addresses != 1 or ptr.ptr_forwards != ptr.forwards:
            raise WiringMismatch(f"call site {ptr.site} (layer {ptr.layer}): its weight (param #{ptr.i}) is at "
                                 f"{ptr.addresses} addresses over {ptr.forwards} forwards; weights are bound once at load")
        if which not in per_layer or ptr.layer < 0:
            continue
        other = seen.setdefault((ptr.value, ptr.i), ptr)
        if other.layer != ptr.layer:
            raise WiringMismatch(f"call site {ptr.site} (layer {ptr.layer}) takes the weight {ptr.value} that "
                                 f"call site {other.site} (layer {other.layer}) takes too; the manifest binds "
                                 f"a distinct tensor per layer")


def check_config(tagged: list[Launch], cfg) -> None:
    """The config's sizes are the ones the capture's norms ran at: a config of another model is
    blamed on the config, not reported as a capture without forwards."""
    sizes = sorted({_val(x, RMS_HIDDEN) for x in tagged if x.tag == "rms"} - {-1})
    if not sizes:
        return
    for name, want in (("hidden_size", cfg.hidden), ("head_dim", cfg.head_dim)):
        if want not in sizes:
            raise WiringMismatch(f"the config's {name} is {want}, but the capture's rms_norm launches ran at "
                                 f"sizes {sizes}: the config is of another model than the capture")


def mine(dump, cfg, doc: AnalysisDoc) -> Mined:
    """Forwards, instances and checks of a loaded dump (`mining.load.load_dump`) and its analysis."""
    check_analysis(doc, dump, cfg)
    tagged = _launches(dump)
    check_config(tagged, cfg)
    forward_of = forward_map(doc)
    fwds, skipped = forwards(tagged, forward_of, cfg)
    result = []
    for fwd in fwds:
        tokens = next(x for x in fwd if x.role == "rope").grid[0]
        seqs = _seqs(fwd, tokens, cfg)
        for x in fwd:
            x.tokens, x.seqs = tokens, seqs
        result.append((fwd[0].forward, "d" if any(x.role == "attn3d" for x in fwd) else "p", tokens))
    phases = {p for _, p, _ in result}
    if phases != {"p", "d"}:
        have = ", ".join(sorted(phases)) or "none"
        raise WiringMismatch(f"{dump.source}: needs whole prefill and decode forwards of a {cfg.layers}-layer Qwen3 "
                             f"(found {len(fwds)} forward(s), phases: {have}; {skipped} partial)")
    views = _Views(doc)
    for fwd in fwds:
        check(fwd, cfg, views)
    check_kv_pool(doc, cfg)
    check_weights_distinct(doc)
    inst = _instances(fwds)
    cache = inst[("p", "cache")][0]
    block_stride, token_row = cache.scalars[9][2], cache.scalars[13][2]
    bs = block_stride // token_row if token_row > 0 else 0
    if bs <= 0 or block_stride % token_row:
        raise WiringMismatch(f"{cache.launches[0].site()}: block stride {block_stride} is not a whole number of "
                             f"{token_row}-element token rows")
    _check_scalars(inst, cfg, bs)
    folder = dump.source.parent
    cubins = {}
    for i in (v for vs in inst.values() for v in vs):
        f = folder / "cubins" / f"{i.sha256}.cubin"
        cubins[i.sha256] = f if f.is_file() else None
    return Mined(inst, result, skipped, cubins, str(dump.source), bs, inst[("p", "attn")][0].scalars[11][2],
                 inst[("d", "attn3d")][0].launches[0].grid[2])


def batched_decode(mined: Mined) -> dict:
    """The decode instances as a batch of sequences runs them: (phase "d", role) -> [Instance] whose
    scalars are those a launch of more than one row needs, where a one-token capture cannot say.

    Why: a single-sequence capture's decode forwards all run one row. Two kinds of scalar are not
    pinned by one row: a token-count parameter (a norm's rows: the constant 1 there, n for a decode
    of n sequences), and a row stride (the distance between two tokens' rows: PyTorch gives a
    dimension of size 1 whatever stride its view computes, so vLLM's one-token q view of the fused
    qkv output says 2048 where the real row is 4096 elements apart; measured on the bundled
    capture, where the same kernels in prefill and in vLLM's 1,024-sequence warm-up batch say
    4096). Both are properties of the kernel's ABI and the model's layout, so they are read from
    the prefill instance of the same role that launches the same build (symbol, cubin, parameter
    sizes): a parameter affine there, a*t + b, whose decode value is a + b, is that form in
    decode; a 64-bit constant there that decode saw otherwise is the prefill's (a stride).
    A decode build no prefill launches keeps its scalars as mined (the split-KV attention and its
    reduction, whose strides are those of buffers of their own, equal to prefill attention's)."""
    out = {}
    for (phase, role), variants in mined.instances.items():
        if phase != "d":
            continue
        same = mined.instances.get(("p", role), [])
        new = []
        for inst in variants:
            twin = next((p for p in same if (p.symbol, p.sha256, p.sizes) == (inst.symbol, inst.sha256, inst.sizes)), None)
            scalars = dict(inst.scalars)
            if twin is not None:
                for i, s in inst.scalars.items():
                    t = twin.scalars.get(i)
                    if s[0] != "const" or t is None or s[1] != t[1]:
                        continue
                    if t[0] == "affine" and s[2] == t[2] + t[3]:
                        scalars[i] = t
                    elif t[0] == "const" and s[1] == "i64" and s[2] != t[2]:
                        scalars[i] = t
            copy = Instance(inst.family, inst.symbol, inst.sha256, inst.regs, inst.sizes, inst.block, inst.smem,
                            inst.launches, scalars, inst.when)
            new.append(copy)
        out[("d", role)] = new
    return out
