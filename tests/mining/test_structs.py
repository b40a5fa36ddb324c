"""Struct parameters word by word (mining/structs.py): planted structs come back, real ones agree.

Simulated: the dump simulator's decoder (tests/helpers/dumpsim.py) with three struct-heavy kernels
added to every layer, shaped like the ABIs engines pass by value -- a 52 B elementwise struct
(three pointers, a u64 element count, two int32 fields in one word, a double, a 4-byte tail), two
16 B tensor structs {pointer, int32, int32}, and a 1152 B attention struct (pointers into the KV
pool, a tile count, two int32 fields, a double, the rest zero): every planted word's kind, role
and expression is asserted. Real: the capture probe's by-value `Pack` (JSON and binary record
forms), and vLLM captures' ATen and cuBLASLt structs, where every pointer word inside a struct
must agree with the pointer table and every fitted size must reproduce the bytes it was fitted to.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

import dumpsim
from dumpsim import INPUTS, KV, KV_HALF, LAYER_STRIDE, WEIGHTS, _p, ceil_div
from mining import structs as ST
from mining.analyze import analyze, to_json
from mining.fit import evaluate, parse
from mining.load import load_dump
from mining.report import render
from paths import FIXTURES
from vocab.analysis import from_json


class StructForward(dumpsim._Forward):
    """The simulator's forward plus three struct-parameter kernels in every layer, after its qkv GEMM."""

    def gemm(self, layer: int, slot: int, n: int):
        super().gemm(layer, slot, n)
        if slot == 1:
            self.struct_kernels(layer)

    def struct_kernels(self, layer: int):
        t = self.t
        out, inp = self.ws[0] + self.buf(), self.ws[0] + self.buf()
        w = WEIGHTS[0] + layer * LAYER_STRIDE + 0x100000
        raw = struct.pack("<QQQQiidi", out, inp, w, t * 1024, t, 1024, 0.5, 7)
        self.k("ew_struct_kernel", [ceil_div(t * 1024, 512), 1, 1], [512, 1, 1],
               [_p(0, 52, raw=raw, inner=[(0, out, self.ws), (8, inp, self.ws), (16, w, WEIGHTS)])])
        pos = INPUTS[0] + 0x10000
        kv_k = KV[0] + layer * 2 * KV_HALF
        self.k("tensor16_kernel", [t, 1, 1], [128, 1, 1],
               [_p(0, 16, raw=struct.pack("<Qii", pos, t, 128), inner=[(0, pos, INPUTS)]),
                _p(1, 16, raw=struct.pack("<Qii", kv_k, 1, 256), inner=[(0, kv_k, KV)])])
        q, o = self.ws[0] + self.buf(), self.ws[0] + self.buf()
        big = bytearray(1152)
        struct.pack_into("<QQQQ", big, 0, q, kv_k, kv_k + KV_HALF, o)
        struct.pack_into("<Qii", big, 512, ceil_div(t, 16), t, 16)
        struct.pack_into("<d", big, 1144, 0.0625)
        self.k("attn_struct_kernel", [ceil_div(t, 16), 16, 1], [128, 1, 1],
               [_p(0, 1152, raw=bytes(big), inner=[(0, q, self.ws), (8, kv_k, KV), (16, kv_k + KV_HALF, KV),
                                                   (24, o, self.ws)])])


# (kernel, param, at) -> (kind, role or expr or const value / lanes); every non-zero planted word
PLANTED = {
    ("ew_struct_kernel", 0, 0): ("pointer", "workspace"),
    ("ew_struct_kernel", 0, 8): ("pointer", "workspace"),
    ("ew_struct_kernel", 0, 16): ("pointer", "weight"),
    ("ew_struct_kernel", 0, 24): ("size", "mul(tokens, 1024)"),
    ("ew_struct_kernel", 0, 32): ("lanes", [("size", "tokens"), ("const", 1024)]),
    ("ew_struct_kernel", 0, 40): ("const", struct.unpack("<q", struct.pack("<d", 0.5))[0]),
    ("ew_struct_kernel", 0, 48): ("const", 7),
    ("tensor16_kernel", 0, 0): ("pointer", "input"),
    ("tensor16_kernel", 0, 8): ("lanes", [("size", "tokens"), ("const", 128)]),
    ("tensor16_kernel", 1, 0): ("pointer", "kv_pool"),
    ("tensor16_kernel", 1, 8): ("const", 1 + (256 << 32)),
    ("attn_struct_kernel", 0, 0): ("pointer", "workspace"),
    ("attn_struct_kernel", 0, 8): ("pointer", "kv_pool"),
    ("attn_struct_kernel", 0, 16): ("pointer", "kv_pool"),
    ("attn_struct_kernel", 0, 24): ("pointer", "workspace"),
    ("attn_struct_kernel", 0, 512): ("size", "ceil_div(tokens, 16)"),
    ("attn_struct_kernel", 0, 520): ("lanes", [("size", "tokens"), ("const", 16)]),
    ("attn_struct_kernel", 0, 1144): ("const", struct.unpack("<q", struct.pack("<d", 0.0625))[0]),
}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("structsim")
    mp = pytest.MonkeyPatch()
    mp.setattr(dumpsim, "_Forward", StructForward)
    try:
        dumpsim.simulate(root)
    finally:
        mp.undo()
    return analyze(load_dump(root, cache=False))


def words_of(a, kernel: str) -> pd.DataFrame:
    w = a.structs
    return w[w["symbol"].str.contains(kernel)]


def test_every_planted_word_comes_back(sim):
    layers = max(b["layers"] for b in sim.layers)
    for (kernel, i, at), (kind, what) in PLANTED.items():
        w = words_of(sim, kernel)
        rows = w[(w["i"] == i) & (w["at"] == at) & (w["layer"] >= 0)]
        assert len(rows) == layers, (kernel, i, at)          # one site per layer, all of them
        for r in rows.itertuples():
            assert r.scope == "site" and r.kind == kind, (kernel, i, at, r.kind, r.status, r.note)
            if kind == "pointer":
                assert r.role == what and r.ptr_samples == r.samples, (kernel, i, at, r.role)
            elif kind == "size":
                assert r.expr == what and r.status == "fit" and r.holdout == "ok", (kernel, at, r.expr)
            elif kind == "lanes":
                assert [(ln["kind"], ln["expr"] if ln["kind"] == "size" else ln["value"]) for ln in r.lanes] == what
            else:
                assert r.value == what
    # the words nobody planted are the zeros of the big struct: constant, and nothing else is
    planted = {(k, i, at) for k, i, at in PLANTED}
    name = dict(zip(sim.dump.launches["symbol"].astype(str), sim.dump.launches["name"].astype(str)))
    w = sim.structs[sim.structs["symbol"].map(name).isin({k for k, _, _ in PLANTED})]
    rest = w[[(name[s], i, at) not in planted for s, i, at in zip(w["symbol"], w["i"], w["at"])]]
    assert len(rest) and (rest["kind"] == "const").all() and (rest["value"] == 0).all()


def test_struct_words_cover_every_byte(sim):
    """Each struct parameter is read whole: its words tile its bytes, a short tail as one word."""
    for (site, i), g in sim.structs.groupby(["site", "i"]):
        g = g.sort_values("at")
        assert g["at"].tolist() == list(range(0, 8 * len(g), 8))
        assert int(g["wsize"].sum()) == int(g["psize"].iloc[0])


def test_notes_say_how_a_constant_reads(sim):
    w = words_of(sim, "ew_struct_kernel")
    assert set(w.loc[w["at"] == 40, "note"]) == {"reads as double 0.5"}
    w = words_of(sim, "tensor16_kernel")
    assert set(w.loc[(w["i"] == 1) & (w["at"] == 8), "note"]) == {"as two 4-byte fields: 1, 256"}


def test_struct_parameters_table_and_report(sim):
    t = ST.param_table(sim.structs)
    ew = t[t["symbol"].str.contains("ew_struct_kernel")]
    assert (ew[["pointer", "size", "lanes", "const"]].to_numpy() == [3, 1, 1, 2]).all()
    rows = ST.report_rows(sim.structs, {})
    line = rows[rows["kernel"].str.contains("ew_struct_kernel")]["words"].iloc[0]
    assert line == "@0 ptr workspace, @8 ptr workspace, @16 ptr weight, @24=mul(tokens, 1024), @32=[tokens | 1024]"
    c = Console(width=200, record=True)
    render(sim, console=c, sections=("structs",))
    out = c.export_text()
    assert "Struct parameters word by word" in out and "@512=ceil_div(tokens, 16)" in out
    c = Console(width=100, record=True)
    render(sim, console=c)
    assert "struct parameters: " in c.export_text()


def test_json_section_round_trips(sim):
    doc = json.loads(json.dumps(to_json(sim), allow_nan=False))
    sec = doc["structs"]
    assert sec["version"] == 1
    p = next(x for x in sec["params"] if "attn_struct_kernel" in x["symbol"] and x["layer"] == 0)
    assert p["size"] == 1152 and p["const_words"] == 144 - 6
    assert [w["at"] for w in p["words"]] == [0, 8, 16, 24, 512, 520]
    assert sum(n for _, n in p["const_runs"]) == p["const_words"] and p["const_runs"][0] == [32, 60]
    assert from_json(doc).to_json() == doc
    # a document without the section (an older file, or a dump with no struct) reads as None
    del doc["structs"]
    assert from_json(doc).structs is None
    assert ST.document(ST.classify(ST.struct_words(sim.dump.params.iloc[:0]), sim.dump.params.iloc[:0],
                                   sim.dump.launches, sim.sites.table, sim.sites.index, sim.pointers)) is None


@pytest.mark.parametrize("name", ["probe.tar.xz", "probe_bin.tar.xz"])
def test_probe_pack_struct(name):
    """The probe's `Pack {float *x, *y; int n, pad; double scale; const float *z}` passed by value,
    recorded by the capture (JSON form) or classified offline from the allocation log (binary form);
    the probe has no forwards, so it is a kernel-scope parameter."""
    a = analyze(load_dump(FIXTURES / "capture" / name, cache=False))
    w = words_of(a, "k_struct").sort_values("at")
    assert (w["scope"] == "kernel").all() and w["psize"].iloc[0] == 40
    assert w["kind"].tolist() == ["pointer", "pointer", "const", "const", "pointer"]
    assert w["value"].iloc[2] == 777 and w["note"].iloc[3] == "reads as double 0.125"
    x, y, z = (w[w["at"] == at].iloc[0] for at in (0, 8, 32))
    assert x["buffer_id"] != y["buffer_id"] and z["offset"] == 64 and x["offset"] == 0
    assert (w["role"] == "").all()            # no forwards: no roles
    doc = from_json(json.loads(json.dumps(to_json(a))))
    p = next(p for p in doc.structs.params if "k_struct" in p.symbol)
    assert p.scope == "kernel" and p.const_runs == [[16, 2]] and [x.at for x in p.words] == [0, 8, 32]


@lru_cache(maxsize=None)
def real(name: str):
    return analyze(load_dump(name, cache=False))


REAL = [FIXTURES / "vllm" / "vllm-offline.tar.xz", FIXTURES / "suite" / "q2e.tar.xz"]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_struct_pointers_agree_with_the_pointer_table(path):
    a = real(path)
    w = a.structs
    sp = w[(w["scope"] == "site") & w["kind"].isin(["pointer", "maybe_pointer"])]
    assert len(sp) > 100
    m = sp.merge(a.pointers[["site", "i", "at", "role"]], on=["site", "i", "at"], suffixes=("", "_p"))
    assert len(m) == len(sp) and (m["role"] == m["role_p"]).all()
    # and every pointer the capture found inside a struct parameter is a pointer word here
    p = a.dump.params
    wide = p.loc[~p["word"], ["seq", "i", "size"]]
    inner = p.loc[p["is_ptr"], ["seq", "i", "at"]].merge(wide[wide["size"] > 8], on=["seq", "i"])
    kept = a.sites.table.loc[a.sites.table["kept"], ["seq", "site"]].astype({"site": str})
    inner = inner.merge(kept, on="seq")[["site", "i", "at"]].drop_duplicates()
    got = set(map(tuple, sp[["site", "i", "at"]].to_numpy().tolist()))
    assert set(map(tuple, inner.astype({"i": int, "at": int}).to_numpy().tolist())) <= got


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_struct_sizes_reproduce_their_bytes(path):
    """Every word (or lane) the analysis says follows the token count, evaluated at each forward's
    tokens, equals the bytes the capture recorded there."""
    a = real(path)
    w = a.structs
    tok = a.reference.tokens
    kept = a.sites.table[a.sites.table["kept"]].astype({"site": str})
    prm = a.dump.params.loc[~a.dump.params["word"], ["seq", "i", "hex"]]
    checked = 0
    for r in w[(w["scope"] == "site") & w["kind"].isin(["size", "lanes"])].itertuples():
        lanes = [(ln["lane"], ln["expr"]) for ln in r.lanes if ln["kind"] == "size"] if r.kind == "lanes" \
            else [(None, r.expr)]
        if not lanes or any(("ctx" in e) for _, e in lanes):
            continue
        rows = kept[kept["site"] == r.site].merge(prm[prm["i"] == r.i], on="seq")
        rows = rows[rows["forward"].isin(tok.index)]
        raw = [bytes.fromhex(h)[r.at:r.at + r.wsize] for h in rows["hex"]]
        x = tok.reindex(rows["forward"]).to_numpy()
        for lane, expr in lanes:
            if lane is None:
                got = np.array([int.from_bytes(b, "little", signed=True) for b in raw])
            else:
                got = np.array([int.from_bytes(b[4 * lane:4 * lane + 4], "little", signed=True) for b in raw])
            want = evaluate(parse(expr) if not expr.startswith("piecewise") else _pw(expr), {"tokens": x})
            assert (got == want).all(), (r.site, r.at, lane, expr)
            checked += 1
    assert checked >= 2


def _pw(text: str):
    """A piecewise verdict's text back to its tuple (fit.parse reads the closed set only)."""
    head, rest = text[len("piecewise("):-1].split("; ", 1)
    var, dec = head.split("==1: ")
    return ("piecewise", var, parse(dec), parse(rest.split(">1: ", 1)[1]))
