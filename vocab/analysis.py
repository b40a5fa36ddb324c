"""The analysis contract: what `mine analyze` hands every generator, as typed records.

Why: a generator that re-mines the dump with rules of its own would never see a better analysis;
this is the one result the stages after mining read (`mine gen qwen3 --analysis FILE`, the
notebook), so it is declared here once, as dataclasses, with a strict JSON round trip:
`AnalysisDoc.to_json()` gives plain JSON types (no NaN: a missing number is null) and
`from_json(obj)` (`read_analysis(path)` for a file) rebuilds the same records, refusing a
schema_version it does not know, an unknown or missing key and a value of the wrong type with one
`AnalysisError` that names the JSON path. docs/analysis-json.md documents every field;
`mining/analyze.py` builds the document from the frames (`document(analysis)`).

This module imports nothing but the standard library and `vocab.errors`, so a later stage can
read an analysis without pandas. Not checked here: cross-references (a fit's site existing in
`sites`), which the builder guarantees and the tests assert.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field

from vocab.errors import MineError
from vocab.ranks import RANKS_VERSION, Ranks  # noqa: F401  (the `ranks` section)
from vocab.structs import STRUCTS_VERSION, Structs  # noqa: F401  (the `structs` section)

ANALYSIS_SCHEMA_VERSION = 3
SITE_SEP = "#"             # a call site is named symbol + SITE_SEP + occurrence in its forward


def site_name(symbol: str, occ: int) -> str:
    """The name of the `occ`-th launch of `symbol` in a forward (0-based), as `sites` lists it."""
    return f"{symbol}{SITE_SEP}{occ}"


class AnalysisError(MineError, ValueError):
    """An analysis JSON this reader cannot take: names the JSON path and what is wrong there."""


@dataclass
class Source:
    launches_file: str
    pid: int | None
    launches: int          # launch records in the dump (the chosen process)
    executed: int          # kernel executions on the timeline (eager launches + replayed kernels)
    replays: int           # graph launches expanded


@dataclass
class Forward:
    forward: int
    window: int            # request window
    phase: str             # startup | serve
    tokens: int | None     # the reference's value (null where it did not run)
    tokens_from: str       # launch | graph (the size its CUDA graph was captured at) | none
    n_launches: int
    n_kernels: int
    first_seq: int
    last_seq: int
    start_ns: int
    end_ns: int
    replayed: int          # of n_launches, kernels run from CUDA-graph replays
    graph_execs: int       # distinct graph replays in the forward
    layers: int
    pattern: str           # block kinds of its layer stack, e.g. "A×2 B×3"
    cut_by: str            # what decided its start boundary (docs/analysis-json.md)
    confidence: float | None
    seqs: list[list[int]]  # its executions in order, as runs [first seq, count] of consecutive seqs

    def executed(self) -> list[int]:
        """Its launch seqs in the order they ran (`seqs` expanded; a CUDA graph's kernels once per
        replay, with their capture's seqs)."""
        return [s for first, n in self.seqs for s in range(first, first + n)]


@dataclass
class Capture:
    capture_id: int
    graph: str
    exec: str
    launches: int
    first_seq: int
    last_seq: int


@dataclass
class BlockKind:
    kind: str              # A, B, ... (A is the main block)
    period: int            # kernels per layer block
    runs: int              # stacks holding it
    reps: int              # modal layers per run
    kernels: list[str]     # one block's kernels by identity name, in order


@dataclass
class Passes:
    method: str            # layer_stacks | core_kernel
    gap_ns: int
    core: str
    core_per_forward: int
    windows: int
    forwards: list[Forward]
    captures: list[Capture]
    blocks: list[BlockKind]


@dataclass
class Candidate:
    symbol: str
    axis: str
    failures: int
    distinct: int
    dropped: int
    max: int


@dataclass
class Reference:
    symbol: str | None
    axis: str | None
    candidates: list[Candidate]
    variables: list[str]
    holdout_tokens: int | None


@dataclass
class KindCount:
    kind: str
    count: int
    sites_per_layer: int


@dataclass
class Shape:
    forwards: int
    example_forward: int
    pattern: str
    layers: int
    sites_per_layer: int
    kinds: list[KindCount]
    launches: int


@dataclass
class Stride:
    symbol: str
    pos: int
    i: int
    at: int
    role: str
    layers: int
    stride: int | None


@dataclass
class Layers:
    layers: int
    sites_per_layer: int
    pattern: str
    shapes: list[Shape]
    strides: list[Stride]


@dataclass
class Site:
    site: str
    symbol: str
    occ: int
    n_forwards: int
    builds: int            # distinct kernel builds (module sha256) the site ran
    sha256: list[str]      # those builds' modules: the site's kernel identity with its symbol
    layer: int
    pos: int


@dataclass
class Partial:
    symbol: str
    modal_count: int
    forwards_present: int
    forwards_kept: int
    counts: list[int]


@dataclass
class Pointer:
    site: str
    symbol: str
    layer: int
    pos: int
    i: int
    at: int
    role: str
    forwards: int
    ptr_forwards: int
    addresses: int
    buffer_id: int
    buffers: int
    alloc_base: str
    alloc_size: int
    offset: int
    value: str


@dataclass
class Buffer:
    buffer_id: int
    offset: int
    alloc_base: str
    alloc_size: int
    role: str
    sites: int
    offsets_in_alloc: int


@dataclass
class ViewMember:
    site: str
    i: int
    at: int
    delta: int             # bytes from the view's lowest member, the same in every forward
    anchor: bool           # the view's forwards are exactly this word's


@dataclass
class View:
    view: int
    forwards: int          # forwards its members ran in (the same for all of them)
    members: list[ViewMember]


@dataclass
class FlowWord:
    site: str
    i: int
    at: int
    direction: str         # in | out | inout | unused (| in? / out? where reads were not judged)
    written_bytes: int     # bytes of its span the launch wrote
    read_by: str           # output | fault | "" (how the read showed)
    shared: bool           # other words point into its region at other offsets
    seq: int               # the launch record that was replayed for this site
    span_bytes: int        # bytes of the word's span (its private region from its offset, in order)
    context: str           # alone (synthetic fills) | in-order (memory rebuilt, replay/forward.py)


def kern_directions(direction: str, written_bytes: int, span_bytes: int, persistent: bool) -> frozenset[str] | None:
    """The kern manifest directions (in | out | inout) that declare exactly what was measured,
    within kern's vocabulary; None where reads were not judged. Two rules bridge the vocabularies:
    kern has no `unused`, so a pointer the launch neither reads nor writes may be declared `in` or
    `out` (each claims one access that does not happen; which one a manifest needs is kern's
    dataflow rule, a read of a buffer nothing wrote being refused), never `inout` (claims both); a
    launch that writes only part of a persistent state (a KV cache at the step's slots) leaves the
    rest as it was, so the state after it depends on the state before it: `inout`, whatever the
    launch read."""
    if direction.endswith("?"):
        return None
    if direction == "unused":
        return frozenset({"in", "out"})
    if direction == "out" and persistent and written_bytes < span_bytes:
        return frozenset({"inout"})
    return frozenset({direction})


@dataclass
class Fit:
    site: str
    symbol: str
    occ: int
    layer: int
    pos: int
    field: str
    status: str
    expr: str | None
    points: int
    alternatives: list[str]
    note: str
    holdout: str
    values: list[int]
    as_f32: float | None


@dataclass
class FieldRef:
    site: str
    field: str             # grid_x|y|z or param<i>, as `fits[]` names it


@dataclass
class VarSource:
    var: str               # seqs | ctx
    rule: str              # how the capture shows it (docs/analysis-json.md `forward_vars`)
    fields: list[FieldRef]  # the call-site fields that hold it (none for ctx)
    kernels: int           # distinct kernels among those fields
    note: str


@dataclass
class StepVars:
    forward: int
    tokens: int | None
    seqs: int | None       # sequences of the step; null where not measured
    ctx: int | None        # one sequence's context; null where not measured


@dataclass
class ForwardVars:
    names: list[str]       # the variables the fits use, `tokens` first
    sources: list[VarSource]
    forwards: list[StepVars]


@dataclass
class SkippedRange:
    start: int             # byte offsets in the file as read, end exclusive
    end: int
    reason: str
    records: int | None    # records lost in the range; null where nothing tells how many


@dataclass
class FileDamage:
    file: str
    read: int              # records read
    skipped: int           # records lost to damage
    ranges: list[SkippedRange]
    ranges_left_out: int   # ranges not listed (at most 64 are)


@dataclass
class NoLayout:
    symbol: str
    launches: int
    packing: str | None


@dataclass
class AnalysisDoc:
    schema_version: int
    source: Source
    notes: list[str]
    passes: Passes
    reference: Reference
    layers: Layers
    sites: list[Site]
    partial: list[Partial]
    pointers: list[Pointer]
    buffers: list[Buffer]
    views: list[View]
    fits: list[Fit]
    no_layout: list[NoLayout] = field(default_factory=list)
    damage: list[FileDamage] = field(default_factory=list)   # per dump file read (mining/damage.py)
    flow: list[FlowWord] = field(default_factory=list)       # measured by `mine replay` (replay/sites.py)
    # multi-rank dumps only (mining/ranks.py); absent from the JSON otherwise, so a one-process
    # analysis is what it was before the section existed
    ranks: Ranks | None = field(default=None, metadata={"absent_when_none": True})
    # by-value struct parameters word by word (mining/structs.py); absent when the dump has none
    structs: Structs | None = field(default=None, metadata={"absent_when_none": True})
    # every forward's variables beyond tokens and how the capture shows them (mining/fwdvars.py);
    # absent when tokens is the only one
    forward_vars: ForwardVars | None = field(default=None, metadata={"absent_when_none": True})

    def to_json(self) -> dict:
        return _dump(self)

    def serve_forwards(self) -> list[Forward]:
        return [f for f in self.passes.forwards if f.phase == "serve"]

    def relation(self) -> "Relations":
        """The views as a lookup of how two pointer words relate (`Relations.distance`)."""
        return Relations(self.views)


class Relations:
    """Pointer-word relations of an analysis' views: `distance(a, b)` is b's byte distance from
    a over the forwards both ran in -- 0 for the same address -- or None when the analysis shows
    no constant one. A word is (site, param, word offset)."""

    def __init__(self, views: list[View]):
        self._in: dict[tuple, list[tuple[int, int, bool]]] = {}
        for v in views:
            for m in v.members:
                self._in.setdefault((m.site, m.i, m.at), []).append((v.view, m.delta, m.anchor))

    def distance(self, a: tuple, b: tuple) -> int | None:
        mine = {v: (d, anc) for v, d, anc in self._in.get(a, [])}
        for v, d, anc in self._in.get(b, []):
            if v in mine and (anc or mine[v][1]):
                return d - mine[v][0]
        return None

    def views(self, a: tuple) -> int:
        """How many views hold word `a`."""
        return len(self._in.get(a, []))


def _absent(f, v) -> bool:
    """A field left out of the JSON: one marked absent_when_none, holding None."""
    return v is None and f.metadata.get("absent_when_none", False)


def _dump(v):
    if dataclasses.is_dataclass(v):
        return {f.name: _dump(getattr(v, f.name)) for f in dataclasses.fields(v) if not _absent(f, getattr(v, f.name))}
    if isinstance(v, list):
        return [_dump(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


_HINTS: dict[type, dict] = {}


def field_types(cls) -> dict:
    """A contract dataclass's resolved field types (cached: resolving them is slow)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _load(tp, v, path: str):
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise AnalysisError(f"{path}: expected an object, got {type(v).__name__}")
        hints = field_types(tp)
        names = [f.name for f in dataclasses.fields(tp)]
        unknown = sorted(set(v) - set(names))
        if unknown:
            raise AnalysisError(f"{path}: unknown key(s) {unknown}")
        optional = {f.name for f in dataclasses.fields(tp) if f.metadata.get("absent_when_none")}
        missing = [n for n in names if n not in v and n not in optional]
        if missing:
            raise AnalysisError(f"{path}: missing key(s) {missing}")
        return tp(**{n: _load(hints[n], v[n], f"{path}.{n}") for n in names if n in v})
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if v is None else _load(args[0], v, path)
    if origin is list:
        if not isinstance(v, list):
            raise AnalysisError(f"{path}: expected a list, got {type(v).__name__}")
        (arg,) = typing.get_args(tp)
        return [_load(arg, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise AnalysisError(f"{path}: expected an integer, got {v!r:.40}")
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise AnalysisError(f"{path}: expected a finite number, got {v!r:.40}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise AnalysisError(f"{path}: expected a string, got {v!r:.40}")
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise AnalysisError(f"{path}: expected true or false, got {v!r:.40}")
        return v
    raise TypeError(f"contract type {tp!r} at {path} has no reader")  # a bug in this module


def from_json(obj) -> AnalysisDoc:
    """The AnalysisDoc in `obj` (parsed JSON); AnalysisError names what is wrong and where."""
    if not isinstance(obj, dict):
        raise AnalysisError("analysis: expected a JSON object")
    ver = obj.get("schema_version")
    if ver != ANALYSIS_SCHEMA_VERSION:
        raise AnalysisError(f"analysis: schema_version {ver!r} is not the supported "
                            f"{ANALYSIS_SCHEMA_VERSION} (re-run `mine analyze` to refresh it)")
    return _load(AnalysisDoc, obj, "analysis")


def read_analysis(path) -> AnalysisDoc:
    """The AnalysisDoc in the file `path` (as `mine analyze --json` wrote it); AnalysisError, one
    sentence naming the file, when it cannot be read, is not JSON or is not an analysis."""
    import json
    from pathlib import Path

    try:
        obj = json.loads(Path(path).read_text())
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise AnalysisError(f"{path}: not valid JSON ({exc})") from None
    try:
        return from_json(obj)
    except AnalysisError as exc:
        raise AnalysisError(f"{path}: {exc}") from None
