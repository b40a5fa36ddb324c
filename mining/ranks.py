"""A multi-rank dump: its rank processes found, ordered, analysed and lined up step by step.

Why: a tensor-parallel engine runs one worker process per GPU, each launching the same forward on
its shard of the weights, with collectives between the call sites; a capture leaves one pid folder
per worker (docs/dump-format.md "Processes"). This module is the cross-rank half of `mine
analyze` (docs/ranks.md): pure functions over the per-rank dumps and their one-process analyses
(`mining.analyze.analyze`), giving the analysis contract's `ranks` section (vocab/ranks.py).

- Which folders are ranks: the pid folders that ran a collective (mining/rank_comm.py: a kernel
  name the collectives table knows) or mapped another process's memory; a dump is multi-rank when
  two or more are. Other processes (an API server, a tokenizer) are left out.
- Their order: meta.json `env` RANK, else LOCAL_RANK (both distinct on every rank), else the device
  ordinal their launches ran on (distinct), else the pid, with a note.
- Step alignment: each rank-0 forward is paired with the other rank's forward that ran at the same
  time (`pair_forwards`), and must run the same call sites, in the same order, at the same tokens;
  every difference is a `StepMismatch` (rank, forward, the position where the sequences part, both
  sites); a rank-0 forward with no partner is compared kernel by kernel with the other rank's
  launches between its neighbours' partners.
- Collectives: rank 0's collective call sites, each placed between the call sites around it.
- Shards: per call site that reads stable memory (a pointer role weight, kv_pool or
  persistent: weights, the KV pool, tables), each grid axis and integer parameter that fits a
  constant, per rank (a column-parallel GEMM's N or a row-parallel one's K is the shard's), plus
  every such field that differs between ranks (`rank_index` when it is the rank's own index).
- Peer words: pointer words that land in peer memory, per (site, param, word), with the ranks
  where they did.
Not done: ranks of different models (pipeline stages: each would read as mismatched, with the
reason); ranks on several hosts (their monotonic clocks differ, so forwards would not pair).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mining import rank_comm as RC
from mining.analyze import Analysis, analyze, document
from mining.load import Dump, _launch_file, _pid_dirs, load_dump
from vocab import ranks as R
from vocab.analysis import SITE_SEP

STABLE = ("weight", "kv_pool", "persistent")   # pointer roles of memory a shard owns for good
MAX_MISMATCHES = 16   # listed per rank; the rest are counted in a note
_MARKERS = re.compile(rb"nccl|all_?reduce|all_?gather|reduce_?scatter|cross_device", re.IGNORECASE)


@dataclass
class RankRun:
    rank: int
    rank_from: str
    dump: Dump
    analysis: Analysis
    device: int
    uuid: str | None
    collectives: dict[str, tuple[str, str]]   # symbol -> (library, op)
    peer_words: pd.DataFrame                  # seq, i, at, how, site
    has_log: bool


@dataclass
class RanksResult:
    runs: list[RankRun]                       # in rank order
    doc: R.Ranks
    notes: list[str] = field(default_factory=list)

    @property
    def main(self) -> Analysis:
        """Rank 0's analysis: the body of the multi-rank analysis document."""
        return self.runs[0].analysis


# ------------------------------------------------------------------ finding the ranks
def _peer_log(pid_dir: Path) -> bool:
    f = pid_dir / "allocs.jsonl"
    if not f.is_file():
        return False
    raw = f.read_bytes()
    return b'"ipc_open"' in raw or b'"vmm_import"' in raw


def _ran_collective(pid_dir: Path) -> bool | None:
    """Whether the folder's launches name a collective: True/False from functions.jsonl or an
    uncompressed launches.jsonl holding no marker; None when only loading it can tell."""
    fns = pid_dir / "functions.jsonl"
    if fns.is_file():
        import json

        for line in fns.read_bytes().split(b"\n"):
            if not _MARKERS.search(line):
                continue
            try:
                r = json.loads(line[line.rfind(b"\0") + 1:])
            except ValueError:
                continue
            if isinstance(r, dict) and RC.classify_name(str(r.get("symbol", "")), str(r.get("name", ""))):
                return True
        return False
    f = _launch_file(pid_dir)
    if f is not None and f.name == "launches.jsonl" and not _file_has_marker(f):
        return False
    return None


def _file_has_marker(f: Path, chunk: int = 16 << 20) -> bool:
    """Whether a collective's marker appears in the file, read in chunks (a launches file can be
    gigabytes; the chunks overlap by more than a marker's length)."""
    with open(f, "rb") as fh:
        tail = b""
        while block := fh.read(chunk):
            if _MARKERS.search(tail + block):
                return True
            tail = block[-64:]
    return False


def rank_folders(folder: Path, cache: bool = True, cache_dir=None) -> list[Path]:
    """The pid folders of the dump folder that are ranks (module docstring); [] unless two or more."""
    if not Path(folder).is_dir():
        return []
    pids = [d for d in _pid_dirs(Path(folder)) if _launch_file(d) is not None]
    if len(pids) < 2:
        return []
    out = []
    for d in pids:
        hit = _ran_collective(d)
        if hit is None:
            hit = bool(RC.collective_symbols(load_dump(d, cache=cache, cache_dir=cache_dir).launches))
        if hit or _peer_log(d):
            out.append(d)
    return out if len(out) >= 2 else []


def _env_int(meta: dict, key: str) -> int | None:
    v = (meta.get("env") or {}).get(key)
    return int(v) if isinstance(v, str) and v.strip().isdigit() else None


def _device(d: Dump) -> tuple[int, str | None]:
    dev = d.launches["dev"].to_numpy()
    ordinal = int(pd.Series(dev).mode().iat[0]) if len(dev) else -1
    uuid = next((x.get("uuid") for x in d.meta.get("devices") or []
                 if isinstance(x, dict) and x.get("ordinal") == ordinal), None)
    return ordinal, uuid if isinstance(uuid, str) else None


def order_ranks(dumps: list[Dump]) -> tuple[list[int], list[int], str, list[str]]:
    """(order: indexes of `dumps` in rank order, the rank number of each in that order, what
    decided it, notes)."""
    n = len(dumps)
    for key in ("RANK", "LOCAL_RANK"):
        vals = [_env_int(d.meta, key) for d in dumps]
        if None not in vals and len(set(vals)) == n:
            order = sorted(range(n), key=lambda k: vals[k])
            return order, [vals[k] for k in order], f"env:{key}", []
    devs = [_device(d)[0] for d in dumps]
    if -1 not in devs and len(set(devs)) == n:
        order = sorted(range(n), key=lambda k: devs[k])
        return order, list(range(n)), "device", []
    order = sorted(range(n), key=lambda k: dumps[k].pid or 0)
    return order, list(range(n)), "pid", [
        "the rank processes carry no distinct RANK / LOCAL_RANK and share device ordinals "
        f"({sorted(set(devs))}): ranks are ordered by pid, which need not be the engine's rank order"]


# ------------------------------------------------------------------ step alignment
def site_sequences(a: Analysis) -> dict[int, list[str]]:
    """forward -> its call sites in executed order."""
    t = a.sites.table
    return {int(f): g["site"].astype(str).tolist() for f, g in t.groupby("forward", sort=True)}


def _part(a: list[str], b: list[str]) -> int | None:
    """The first position where two sequences differ, None when equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def pair_forwards(f0: pd.DataFrame, fr: pd.DataFrame) -> dict[int, int]:
    """Rank 0's forward -> the other rank's forward that ran at the same time: mutual nearest start
    (the ranks share the host's monotonic clock and each step starts on every rank together), no
    farther apart than the longer of the two forwards lasted."""
    if not len(f0) or not len(fr):
        return {}
    s0, sr = f0["start_ns"].to_numpy(), fr["start_ns"].to_numpy()
    d0 = (f0["end_ns"] - f0["start_ns"]).to_numpy()
    dr = (fr["end_ns"] - fr["start_ns"]).to_numpy()
    near_r = [int(abs(sr - x).argmin()) for x in s0]
    near_0 = [int(abs(s0 - x).argmin()) for x in sr]
    out = {}
    for k, j in enumerate(near_r):
        if near_0[j] == k and abs(int(sr[j]) - int(s0[k])) <= max(int(d0[k]), int(dr[j]), 1):
            out[int(f0["forward"].iat[k])] = int(fr["forward"].iat[j])
    return out


def _stray(run: "RankRun", lo: int, hi: int) -> list[str]:
    """The symbols of a rank's launches with lo < seq < hi (a stretch no forward of it holds)."""
    L = run.dump.launches
    seq = L["seq"].to_numpy()
    return L["symbol"].astype(str).to_numpy()[(seq > lo) & (seq < hi)].tolist()


def _tokens(a: Analysis) -> dict[int, str]:
    f = a.forwards["forward"]
    return dict(zip(f.tolist(), map(str, a.reference.tokens.reindex(f).tolist())))


def align(runs: list[RankRun]) -> tuple[list[R.StepMismatch], int, list[str]]:
    """Every rank's forwards against rank 0's, paired by time: (mismatches, rank 0's forwards lined
    up on every rank, notes). A rank-0 forward the other rank has no forward for is compared with
    the other rank's launches between its neighbours' forwards, symbol by symbol."""
    a0 = runs[0].analysis
    base, tok0, f0 = site_sequences(a0), _tokens(a0), a0.forwards
    sym0 = {s: s.rsplit(SITE_SEP, 1)[0] for seq in base.values() for s in seq}
    out, notes, good = [], [], set(base)
    for run in runs[1:]:
        ar = run.analysis
        seqs, toks, fr = site_sequences(ar), _tokens(ar), ar.forwards
        pairs = pair_forwards(f0, fr)
        if len(seqs) != len(base):
            notes.append(f"rank {run.rank} ran {len(seqs)} forward(s), rank {runs[0].rank} {len(base)}")
        firsts = dict(zip(fr["forward"], fr["first_seq"]))
        lasts = dict(zip(fr["forward"], fr["last_seq"]))
        listed = 0
        for f in sorted(base):
            a = base[f]
            if f in pairs:
                b = seqs.get(pairs[f], [])
                k = _part(a, b)
                if k is None and tok0.get(f) == toks.get(pairs[f]):
                    continue
                good.discard(f)
                if k is None:
                    notes.append(f"rank {run.rank} forward {pairs[f]}: rank {runs[0].rank}'s forward {f}'s call sites "
                                 f"at {toks.get(pairs[f])} tokens, not {tok0.get(f)}")
                    continue
                got = b[k] if k < len(b) else ""
            else:
                good.discard(f)
                before = [pairs[g] for g in sorted(pairs) if g < f]
                after = [pairs[g] for g in sorted(pairs) if g > f]
                lo = lasts[before[-1]] if before else -1
                hi = firsts[after[0]] if after else 1 << 62
                stray = _stray(run, lo, hi)
                k = _part([sym0[x] for x in a], stray)
                if k is None:
                    notes.append(f"rank {run.rank}: no forward found where rank {runs[0].rank} ran forward {f}, "
                                 f"though its launches there are the same kernels")
                    continue
                got = stray[k] if k < len(stray) else ""
            listed += 1
            if listed <= MAX_MISMATCHES:
                out.append(R.StepMismatch(run.rank, f, k, a[k] if k < len(a) else "", got))
        if listed > MAX_MISMATCHES:
            notes.append(f"rank {run.rank}: {listed} forward(s) differ from rank {runs[0].rank}'s; the first "
                         f"{MAX_MISMATCHES} are listed")
    return out, len(good), notes


# ------------------------------------------------------------------ collectives, shards, peers
def collectives(runs: list[RankRun]) -> list[R.Collective]:
    """Rank 0's collective call sites (by name, or by peer memory), each between its neighbours."""
    a0 = runs[0].analysis
    idx = a0.sites.index.set_index("site")
    peer_sites = set(runs[0].peer_words["site"]) if len(runs[0].peer_words) else set()
    kinds = {}
    for site, sym in zip(idx.index.astype(str), idx["symbol"].astype(str)):
        hit = runs[0].collectives.get(sym)
        if hit is None and site in peer_sites:
            hit = ("peer_memory", "unknown")
        if hit:
            kinds[site] = hit
    if not kinds:
        return []
    have = [set(r.analysis.sites.index["site"].astype(str)) for r in runs]
    where: dict[str, tuple[str, str]] = {}
    for seq in site_sequences(a0).values():
        plain = [k for k, s in enumerate(seq) if s not in kinds]
        for k, s in enumerate(seq):
            if s in kinds and s not in where:
                before = [j for j in plain if j < k]
                after = [j for j in plain if j > k]
                where[s] = (seq[before[-1]] if before else "", seq[after[0]] if after else "")
    pw = runs[0].peer_words
    first = a0.sites.table.groupby("site")["seq"].min()
    out = []
    for site in a0.sites.index["site"].astype(str):
        if site not in kinds:
            continue
        lib, op = kinds[site]
        r = idx.loc[site]
        npeer = int(((pw["site"] == site) & (pw["seq"] == first.get(site, -1))).sum()) if len(pw) else 0
        out.append(R.Collective(site, str(r["symbol"]), lib, op, int(r["layer"]), int(r["pos"]),
                                *where.get(site, ("", "")), int(r["n_forwards"]),
                                sum(site in h for h in have), npeer))
    return out


def _constants(a: Analysis) -> dict[tuple[str, str], int]:
    f = a.fits
    if not len(f):
        return {}
    f = f[f["field"].astype(str).str.match(r"grid_|param")]
    if "as_f32" in f:
        f = f[f["as_f32"].isna()]   # a float's bits are not a size
    out = {}
    for site, fld, vals in zip(f["site"].astype(str), f["field"].astype(str), f["values"]):
        if isinstance(vals, (list, tuple)) and len(vals) == 1:   # one value in every forward it ran
            out[(site, fld)] = int(vals[0])
    return out


def shards(runs: list[RankRun]) -> list[R.ShardField]:
    """Constant fields of sites reading stable memory, per rank, and every constant field ranks disagree on."""
    consts = [_constants(r.analysis) for r in runs]
    p0 = runs[0].analysis.pointers
    # weights by role; a one-layer model's weights read as persistent (no second layer to differ from)
    weight_sites = set(p0.loc[p0["role"].isin(STABLE), "site"].astype(str)) if len(p0) else set()
    order = {s: k for k, s in enumerate(runs[0].analysis.sites.index["site"].astype(str))}
    keys = sorted(set().union(*consts), key=lambda k: (order.get(k[0], len(order)), k[0], k[1]))
    ids = [r.rank for r in runs]
    out = []
    for site, fld in keys:
        vals = [c.get((site, fld)) for c in consts]
        same = len(set(vals)) == 1
        if site not in weight_sites and same:
            continue
        out.append(R.ShardField(site, fld, vals, same, not same and vals == ids))
    return out


def peers(runs: list[RankRun]) -> list[R.PeerWord]:
    counts: Counter = Counter()
    for r in runs:
        if len(r.peer_words):
            counts.update(set(zip(r.peer_words["site"], r.peer_words["i"].astype(int), r.peer_words["at"].astype(int))))
    order = {s: k for k, s in enumerate(runs[0].analysis.sites.index["site"].astype(str))}
    return [R.PeerWord(s, i, at, n) for (s, i, at), n in sorted(counts.items(), key=lambda x: (order.get(x[0][0], 1 << 30), x[0]))]


# ------------------------------------------------------------------ the facade
def _run(rank: int, how: str, d: Dump, a: Analysis) -> RankRun:
    dev, uuid = _device(d)
    peer_iv = RC.peer_intervals(d.source.parent)
    pw = RC.peer_words(d.params, peer_iv)
    sites = a.sites.table[["seq", "site"]].drop_duplicates("seq")
    pw = pw.merge(sites, on="seq", how="inner") if len(pw) else pw.assign(site=pd.Series(dtype=str))
    return RankRun(rank, how, d, a, dev, uuid, RC.collective_symbols(d.launches), pw, peer_iv is not None)


def rank_document(runs: list[RankRun], notes: list[str]) -> R.Ranks:
    mism, lined, align_notes = align(runs)
    notes = list(notes) + align_notes
    notes += [f"rank {r.rank} (pid {r.dump.pid}) has no allocation log: its peer memory is not told apart"
              for r in runs if not r.has_log]
    procs = [R.RankProcess(r.rank, r.rank_from, int(r.dump.pid or 0), r.device, r.uuid, int(len(r.dump.launches)),
                           int(len(r.analysis.forwards)),
                           int(r.dump.launches["symbol"].astype(str).isin(list(r.collectives)).sum())) for r in runs]
    aligned = not mism and not align_notes
    return R.Ranks(R.RANKS_VERSION, procs, aligned, lined, mism, collectives(runs), shards(runs), peers(runs), notes)


def analyze_ranks(folder: Path, cache: bool = True, cache_dir=None, gap_ms: float | None = None,
                  per_forward: int | None = None) -> RanksResult | None:
    """The cross-rank analysis of the dump folder, None when it is not a multi-rank dump (an
    archive is unpacked by the caller: `mining.archive.unpack`)."""
    folders = rank_folders(Path(folder), cache, cache_dir)
    if not folders:
        return None
    dumps = [load_dump(f, cache=cache, cache_dir=cache_dir) for f in folders]
    order, ids, how, notes = order_ranks(dumps)
    runs = [_run(ids[k], how, dumps[j], analyze(dumps[j], gap_ms=gap_ms, per_forward=per_forward))
            for k, j in enumerate(order)]
    return RanksResult(runs, rank_document(runs, notes))


def document_with_ranks(result: RanksResult):
    """Rank 0's analysis document with the `ranks` section (vocab/analysis.py, docs/ranks.md)."""
    doc = document(result.main)
    doc.ranks = result.doc
    return doc


def lines(doc: R.Ranks) -> list[str]:
    """The report's ranks block: one line per rank, the alignment, the collectives by op."""
    out = [f"ranks: {len(doc.ranks)} (ordered by {doc.ranks[0].rank_from if doc.ranks else '-'}); "
           f"{'aligned' if doc.aligned else 'NOT aligned'} over {doc.forwards} forward(s)"]
    for r in doc.ranks:
        out.append(f"  rank {r.rank}: pid {r.pid}, device {r.device}{' ' + r.uuid if r.uuid else ''}, "
                   f"{r.launches:,} launches, {r.forwards} forwards, {r.collectives} collective launches")
    for m in doc.mismatches:
        out.append(f"  rank {m.rank} forward {m.forward} parts from rank 0 at call site {m.position}: "
                   f"{m.got or '(end)'} where rank 0 runs {m.expected or '(end)'}")
    ops = Counter((c.library, c.op) for c in doc.collectives)
    if ops:
        out.append("  collectives: " + ", ".join(f"{n} {op} ({lib})" for (lib, op), n in sorted(ops.items())))
    uneven = [s for s in doc.shards if not s.same and not s.rank_index]
    own = [s for s in doc.shards if s.rank_index]
    out.append(f"  shards: {len(doc.shards)} constant field(s); {len(uneven)} differ between ranks, {len(own)} "
               f"hold the rank's own index; peer words: {len(doc.peers)}")
    out += [f"  note: {n}" for n in doc.notes]
    return out
