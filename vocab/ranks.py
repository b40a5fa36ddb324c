"""The `ranks` section of the analysis contract: a multi-rank dump's processes lined up.

Why apart from vocab/analysis.py: the section exists only for dumps of several rank processes (a
tensor-parallel engine's workers, mining/ranks.py builds it) and has a version of its own,
`RANKS_VERSION`, so it can grow without touching the one-process contract; `AnalysisDoc.ranks`
holds it and the JSON leaves the key out when there is none (a one-process analysis stays byte for
byte what it was). docs/ranks.md documents every field. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

RANKS_VERSION = 1          # of the `ranks` section (docs/ranks.md); present only for multi-rank dumps


@dataclass
class RankProcess:
    rank: int
    rank_from: str         # env:RANK | env:LOCAL_RANK | device | pid (what ordered the ranks)
    pid: int
    device: int            # the device ordinal its launches ran on (-1 unknown)
    uuid: str | None       # that device's UUID as meta.json lists it (null when not listed)
    launches: int
    forwards: int
    collectives: int       # collective launches


@dataclass
class StepMismatch:
    rank: int
    forward: int
    position: int          # index in the forward's call-site sequence where they part
    expected: str          # rank 0's call site there ("" past its end)
    got: str               # this rank's ("" past its end; a bare symbol where it has no forward there)


@dataclass
class Collective:
    site: str
    symbol: str
    library: str           # nccl | vllm_custom | torch_symm_mem | flashinfer | peer_memory
    op: str                # all_reduce | all_gather | reduce_scatter | broadcast | reduce | send_recv | all_to_all | unknown
    layer: int
    pos: int
    after: str             # the call site before it in the forward ("" at the start)
    before: str            # the call site after it ("" at the end)
    forwards: int          # rank 0's forwards it ran in
    ranks: int             # ranks that have this call site
    peer_words: int        # its pointer words into peer memory (rank 0's first launch)


@dataclass
class ShardField:
    site: str
    field: str             # as fits[].field
    values: list[int | None]  # per rank, the constant it fits there (null: not a constant)
    same: bool
    rank_index: bool       # the value is the rank's own index on every rank


@dataclass
class PeerWord:
    site: str
    i: int
    at: int
    ranks: int             # ranks where the word pointed into another process's memory


@dataclass
class Ranks:
    version: int
    ranks: list[RankProcess]
    aligned: bool          # every rank ran the same forwards with the same call sites
    forwards: int          # forwards lined up on every rank
    mismatches: list[StepMismatch]
    collectives: list[Collective]
    shards: list[ShardField]
    peers: list[PeerWord]
    notes: list[str]
