"""Reads of bytes a left-out launch rewrote between a program's calls: what the manifest passes wrong.

A program leaves out the launches that stage the host's data on the device (compiler.launches,
programs.device_staging); what they write before the program's first use of an address is an
input (compiler.buffers rule 2). An engine may also run such a launch *between* two calls of the
program, over an address an earlier call already used: SGLang's decode turns the sequence length
a call read into the next one (seq_lens + 1) and writes the positions into the block the
slot's int32 copy used a call before. The layout decides one thing per address, so the later
call is passed the earlier call's bytes (a workspace, or an input holding the earlier value):
the compiled program runs, and reads the wrong numbers there.

`find` names every such read on the representative forward the layout is made from: a kept
call at index >= k reads (measured `in` or `inout`, or an input's class) an address that a
left-out launch at position k wrote (its measured direction `out` or `inout` at that word), while
the layout gives the read a declaration that is not the host's input for it (a workspace or
output the program writes, or an input an earlier call also reads: one fill can hold one of the
two values). Each is a record for provenance.json `restaged` and a count in one note. What it
does not do: split the address into a second input (the fills are matched per address, and the
copy log's and the replay's bytes of the two values sit at one address), so the manifest is
unchanged; a host that serves it is warned by the note, and `compare.serving` by nothing yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.buffers import _flow

WRITES = ("out", "inout")
READS = ("in", "inout")


@dataclass(frozen=True)
class Restaged:
    program: str
    call: int            # the kept call that reads the rewritten bytes
    i: int
    at: int
    address: int
    launch: int          # seq of the left-out launch that rewrote them (the representative forward's)
    symbol: str
    before: int          # the earliest kept call that used the address before it (-1: none)
    decl: str            # what the layout passes the read
    kind: str

    def to_json(self) -> dict:
        return {"program": self.program, "call": self.call, "param": self.i, "at": self.at,
                "address": hex(self.address), "rewritten_by": [self.launch, self.symbol],
                "used_before_by_call": self.before, "passed": [self.decl, self.kind]}


def find(progs, layouts: dict, decls: dict, doc) -> list[Restaged]:
    flow = _flow(doc)
    out: dict[tuple, Restaged] = {}
    for p in progs:
        lay = layouts[p.name]
        order = sorted(lay.uses.items())
        first: dict[int, int] = {}
        for (step, _, _), u in order:
            first.setdefault(u.value, step)
        for x in sorted(p.rep.staging, key=lambda x: x.seq):
            for w in x.words:
                f = flow.get((x.site, w.i, w.at))
                if f is None or f.direction not in WRITES:
                    continue
                for (step, i, at), u in order:
                    if step < x.pos or u.value != w.value:
                        continue
                    if (step, i, at) not in lay.where:
                        continue
                    kind, name, _ = lay.where[(step, i, at)]
                    d = decls.get(name)
                    dkind = "state" if kind == "state" else (d.kind if d is not None else "")
                    if u.direction == "out" or dkind == "state":
                        break      # a call writes the address first (or it is a state): the rewrite is dead
                    if not (u.direction in READS or (not u.direction and dkind == "input")):
                        continue
                    earlier = first.get(u.value, step) < x.pos
                    if dkind != "input" or earlier:
                        # the latest rewrite before the read is the one it sees
                        out[(p.name, step, i, at)] = Restaged(p.name, step, i, at, u.value, x.seq, x.symbol,
                                                              first[u.value] if earlier else -1, name, dkind)
                    break
    return sorted(out.values(), key=lambda r: (r.program, r.call, r.i, r.at))


def notes(found: list[Restaged]) -> list[str]:
    by: dict[str, list[Restaged]] = {}
    for r in found:
        by.setdefault(r.program, []).append(r)
    return [f"{p}: {len(rs)} word(s) read bytes a left-out launch rewrote between the program's calls "
            f"({', '.join(f'call {r.call} param {r.i}@{r.at} ({r.decl}), rewritten by launch {r.launch} {r.symbol[:60]}' for r in rs[:4])}); "
            f"the layout passes them "
            f"what {'an earlier call used there' if any(r.before >= 0 for r in rs) else 'the address held before'}, "
            f"not the rewritten value, so the program is not served right there (provenance.json `restaged`)"
            for p, rs in sorted(by.items())]



def across(progs, layouts: dict, decls: dict) -> list[str]:
    """Workspaces that carry bytes from one program to another: program A writes an address and no
    later call of A reads it, while program B's calls read the same address, the address being
    the same in every forward of both programs (a table the engine keeps, not a block its
    allocator hands out again). kern's workspace is dead between runs, so B reads what A never hands
    over (SGLang's request-to-token table: the prefill writes each prompt position's KV slot,
    the decode reads the row). One sentence per such address; the manifest is unchanged (a
    persistent table is a `carry` both programs pass, which the compiler does not write yet)."""
    last: dict[str, dict[int, tuple[str, str]]] = {}      # program -> address -> (last direction, decl)
    reads: dict[str, dict[int, str]] = {}
    for p in progs:
        lay = layouts[p.name]
        seen, rd = {}, {}
        for key, u in sorted(lay.uses.items()):
            if key not in lay.where:
                continue
            kind, name, _ = lay.where[key]
            d = decls.get(name)
            if kind != "buf" or d is None or d.kind != "workspace" or not _fixed(p, key, u.value):
                continue
            seen[u.value] = (u.direction, name)
            if u.direction in READS:
                rd.setdefault(u.value, name)
        last[p.name], reads[p.name] = seen, rd
    out = []
    for a in progs:
        for addr, (direction, name) in sorted(last[a.name].items()):
            if direction != "out":
                continue
            for b in progs:
                if b is a or addr not in reads[b.name]:
                    continue
                out.append(f"{a.name} writes {name} ({hex(addr)}) and none of its later calls reads it, but {b.name} "
                           f"reads the same address as {reads[b.name][addr]}: kern's workspaces are dead between runs, "
                           f"so {b.name} does not see what {a.name} wrote there (a table that persists across "
                           f"programs, which the manifest does not declare as such)")
    return out


def _fixed(p, key: tuple, value: int) -> bool:
    """The word at `key` (step, i, at) holds `value` in every forward of program p."""
    step, i, at = key
    for s in p.samples:
        w = s.steps[step].launch.word(i, at) if step < len(s.steps) else None
        if w is None or w.value != value:
            return False
    return True
