"""The analysis on real H200 captures (issues 4 and 7): what the known workload implies, checked.

Workload (examples/vllm_qwen3/): vLLM 0.26.0, eager, TRITON_ATTN, a Qwen3 checkpoint with the 0.6B
geometry (hidden 1024, 28 layers, 16 q / 8 kv heads, head_dim 128); vLLM first runs a memory-
profiling pass at its token budget and two warm-up passes (2048, 1024 tokens), then the four
prompts of prompts.LENGTHS tokens arrive one at a time (50 ms apart), each asking for
prompts.MAX_NEW_TOKENS greedy tokens. The offline fixture ran vLLM in-process; the serve fixture
ran the same prompts through the OpenAI server, whose engine is the child `VLLM::EngineCore`.

Every expectation below is derived from that workload (the model's geometry, the kernels'
signatures, the prompt lengths), and checked against the raw launches as well as the analysis.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from paths import FIXTURES, ROOT
from mining.analyze import analyze
from mining.archive import unpack
from mining.load import load_dump

sys.path.insert(0, str(ROOT / "examples" / "vllm_qwen3"))
from prompts import LENGTHS, MAX_NEW_TOKENS  # noqa: E402

OFFLINE = FIXTURES / "vllm" / "vllm-offline.tar.xz"
SERVE = FIXTURES / "vllm" / "vllm-serve.tar.xz"
LAYERS, Q_HEADS, KV_HEADS = 28, 16, 8
WARMUPS = [2048, 1024]

# Kernels by their role in a Qwen3 layer (mangled names as captured).
REF = "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii"  # 2-D rms_norm
QK_NORM = "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi3ELb1EEEvPT_PKS3_lllllS6_lfii"  # 3-D
ADD_NORM = "fused_add_rms_norm_kernel"
ATTN, CACHE, SEGMENTS = "kernel_unified_attention", "reshape_and_cache_kernel_flash", "reduce_segments"
ARGMAX = "ArgMaxOps"
PREFILL_INPUTS = "_prepare_prefill_inputs_kernel"


@pytest.fixture(scope="module")
def off(offline_analysis):
    return offline_analysis   # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def srv():
    return analyze(load_dump(SERVE))


def per_forward(a, pattern: str) -> np.ndarray:
    """Launches per forward of the kernels whose symbol contains `pattern`."""
    sym = a.dump.launches["symbol"].astype(str).str.contains(pattern, regex=False).to_numpy()
    fw = a.passes.forward
    return np.bincount(fw[sym & (fw >= 0)], minlength=len(a.forwards))


def rows(a, symbol: str):
    L = a.dump.launches
    m = (L["symbol"].astype(str) == symbol).to_numpy()
    return L[m], a.passes.forward[m]


def request_starts(a) -> list[int]:
    """Launch indices where a request begins, from host time alone: the script sleeps 50 ms after
    each request, and vLLM's first work for a new request is staging its state
    (`_apply_write_kernel`). Only after the warm-ups (forward 2 onwards): the start-up has such
    gaps too (Triton compiling the sampler)."""
    L = a.dump.launches
    gaps = np.diff(L["t_ns"].to_numpy())
    name = L["symbol"].astype(str).to_numpy()
    after = int(np.flatnonzero(a.passes.forward == 2)[0])
    return [i + 1 for i in np.flatnonzero(gaps >= 50_000_000)
            if i + 1 > after and name[i + 1] == "_apply_write_kernel"]


def expected_tokens() -> list[int]:
    # vLLM samples the first new token from the prefill forward itself, so a request of
    # MAX_NEW_TOKENS tokens is one prefill + (MAX_NEW_TOKENS - 1) one-token decode forwards; the
    # last sampled token is never fed back. test_each_forward_samples_one_token checks this.
    req = [t for n in LENGTHS for t in [n] + [1] * (MAX_NEW_TOKENS - 1)]
    return WARMUPS + req


# ------------------------------------------------------------------ issue 4: offline capture
def test_forwards_and_tokens(off):
    f = off.forwards
    # the profiling pass runs at vLLM's token budget: 16384 for the in-process LLM class
    assert list(f["tokens"]) == [16384] + expected_tokens()
    assert off.reference.symbol == REF and off.reference.axis == "grid_x"
    # The reference is layer 0's input_layernorm (a 2-D rms_norm, the later layers fuse it with
    # the residual add): it runs once per forward with one block per token row.
    L, fw = rows(off, REF)
    assert np.array_equal(np.sort(fw), np.arange(len(f)))
    assert list(L["grid_x"]) == list(f["tokens"])


def test_request_boundaries_from_host_time(off):
    starts = request_starts(off)
    assert len(starts) == len(LENGTHS)
    f = off.forwards
    # a request's first forward begins with its input staging (mining/steps.py: the launches after
    # the idle gap join the next forward)
    firsts = [int(f[f["first_seq"] >= off.dump.launches["seq"].iat[i]]["forward"].iloc[0]) for i in starts]
    assert list(f["tokens"].iloc[firsts]) == list(LENGTHS)
    # ...and each request holds exactly MAX_NEW_TOKENS forwards up to the next one
    assert np.diff(firsts + [len(f)]).tolist() == [MAX_NEW_TOKENS] * len(LENGTHS)


def test_each_forward_samples_one_token(off):
    """Greedy sampling is one argmax per forward: every request forward, the prefill included,
    yields a token, so MAX_NEW_TOKENS tokens need MAX_NEW_TOKENS forwards. A new request's first
    forward prepares prefill inputs, even the 1-token prompt's, whose attention is decode-shaped."""
    f = off.forwards
    req = f["forward"] >= 3
    assert (per_forward(off, ARGMAX)[req] == 1).all()
    firsts = [3 + MAX_NEW_TOKENS * k for k in range(len(LENGTHS))]
    prep = per_forward(off, PREFILL_INPUTS)
    assert np.flatnonzero(prep[3:]).tolist() == [x - 3 for x in firsts]
    # the split-KV decode path (3-D attention + reduce_segments) runs for every 1-token forward,
    # including the 1-token prompt's prefill, and never for a longer one
    seg = per_forward(off, SEGMENTS)
    one = (f["tokens"] == 1).to_numpy()
    assert (seg[one] == LAYERS).all() and (seg[~one] == 0).all()


def test_request_windows(off):
    """Each request's forwards share one window of their own (passes.py step 4: idle gaps
    outside model sections; first-use compile stalls inside a forward do not cut)."""
    f = off.forwards.set_index("forward")
    firsts = [3 + MAX_NEW_TOKENS * k for k in range(len(LENGTHS))]
    wins = [set(f["window"].loc[s:s + MAX_NEW_TOKENS - 1]) for s in firsts]
    assert all(len(w) == 1 for w in wins)                         # a request is one window
    assert len(set.union(*wins)) == len(LENGTHS)                    # distinct per request
    assert not set(f["window"].loc[:2]) & set.union(*wins)         # start-up is not a request


def test_kernels_per_layer(off):
    """Per forward: q_norm + k_norm (3-D rms_norm) and attention once per layer; the fused
    add+norm twice per layer (post-attention norm, then the next layer's input norm or the final
    norm). The profiling pass runs without a KV cache: no cache write, no attention."""
    assert (per_forward(off, QK_NORM) == 2 * LAYERS).all()
    assert (per_forward(off, ADD_NORM) == 2 * LAYERS).all()
    for k in (ATTN, CACHE):
        c = per_forward(off, k)
        assert c[0] == 0 and (c[1:] == LAYERS).all()
    main = max(off.layers, key=lambda b: b["forwards"])
    assert main["layers"] == LAYERS
    assert all(b["layers"] == LAYERS for b in off.layers)  # every forward shape finds 28
    assert sorted(set(off.sites.index["layer"]) - {-1}) == list(range(LAYERS))


def test_norm_grids_from_first_principles(off):
    """vLLM's rms_norm runs one block per normalised row: a row is a token for the [tokens, 1024]
    norms and a (token, head) pair for q_norm ([tokens, 16, 128]) and k_norm ([tokens, 8, 128])."""
    tok = off.reference.tokens
    L, fw = rows(off, QK_NORM)
    per_row = L["grid_x"].to_numpy() / tok.reindex(fw).to_numpy()
    occ = np.arange(len(fw)) % 2            # q_norm then k_norm, in every layer
    assert set(per_row[occ == 0]) == {Q_HEADS} and set(per_row[occ == 1]) == {KV_HEADS}
    fits = off.fits.set_index(["site", "field"])
    assert fits.loc[(f"{QK_NORM}#0", "grid_x"), "expr"] == f"mul(tokens, {Q_HEADS})"
    assert fits.loc[(f"{QK_NORM}#1", "grid_x"), "expr"] == f"mul(tokens, {KV_HEADS})"
    assert fits.loc[(f"{REF}#0", "grid_x"), "expr"] == "tokens"
    layer0 = off.fits[(off.fits["layer"] == 0) & (off.fits["field"] == "grid_x")]
    by_kernel = {s.split("#")[0]: (st, e, h) for s, st, e, h in
                 layer0[["site", "status", "expr", "holdout"]].itertuples(index=False)}
    for k, st_e_h in by_kernel.items():   # rows of [tokens, ...]: one block per token
        if any(x in k for x in ("fused_add_rms_norm", "rotary_embedding", "act_and_mul", CACHE)):
            assert st_e_h == ("fit", "tokens", "ok"), (k, st_e_h)


def test_attention_grid(off):
    """Triton unified attention: grid (q_blocks, kv_heads, segments). q_blocks = tokens // BLOCK_Q
    + num_seqs with BLOCK_Q = 16 / (16 q heads per 8 kv heads) = 8, num_seqs its parameter 25
    (1 for the requests, 1024 in the warm-ups): a second variable, so grid_x has no tokens-only fit.
    Decode splits the KV into 16 segments (reduced by reduce_segments)."""
    L, fw = rows(off, ATTN)
    tok = off.reference.tokens.reindex(fw).to_numpy()
    p = off.dump.params
    nseq = p[(p["i"] == 25) & ~p["word"]].set_index("seq")["value"].reindex(L["seq"]).to_numpy()
    assert set(nseq[fw >= 3]) == {1} and set(nseq[fw < 3]) == {1024}
    assert np.array_equal(L["grid_x"].to_numpy(), tok // 8 + nseq)
    assert set(L["grid_y"]) == {KV_HEADS}
    assert np.array_equal(L["grid_z"].to_numpy(), np.where(tok == 1, 16, 1))
    fit = off.fits.set_index(["site", "field"])
    assert fit.loc[(f"{ATTN}#0", "grid_x"), "status"] == "no_fit"
    assert fit.loc[(f"{ATTN}#0", "grid_z"), "expr"] == "piecewise(tokens==1: 16; tokens>1: 1)"


def test_pointer_roles(off):
    P = off.pointers
    # norm weights: the `weight` argument (rms_norm: i=7; fused_add_rms_norm: i=3), one fixed
    # address per layer, all different
    for site_sym, i in ((QK_NORM, 7), ("_ZN4vllm25fused_add_rms_norm", 3)):
        w = P[P["symbol"].str.startswith(site_sym) & (P["i"] == i) & (P["layer"] >= 0)]
        for pos, g in w.groupby("pos"):
            assert set(g["role"]) == {"weight"} and (g["addresses"] == 1).all()
            assert len(g) == LAYERS and g["value"].nunique() == LAYERS
    # KV cache: attention's key_cache / value_cache (i=2, 3) are the cache write's (same i), one
    # ~1.5 GB allocation per layer, classified kv_pool
    kv = P[(P["symbol"] == ATTN) & P["i"].isin([2, 3]) & (P["layer"] >= 0)]
    assert set(kv["role"]) == {"kv_pool"} and len(kv) == 2 * LAYERS
    assert kv.groupby("i")["value"].nunique().tolist() == [LAYERS, LAYERS]
    assert (kv["alloc_size"] > 1 << 30).all() and kv["alloc_base"].nunique() == LAYERS
    # the KV scales (attention i=7, 8) are shared with the cache write too, but each layer's is a
    # few bytes in a shared 2 MiB arena: weights, not pools
    sc = P[(P["symbol"] == ATTN) & P["i"].isin([7, 8]) & (P["layer"] >= 0)]
    assert set(sc["role"]) == {"weight"} and (sc["alloc_size"] <= 2 << 20).all()
    wr = P[(P["symbol"] == CACHE) & P["i"].isin([2, 3]) & (P["layer"] >= 0)]
    pairs = lambda d: set(zip(d["layer"], d["i"], d["value"]))  # noqa: E731
    assert pairs(kv) == pairs(wr)


def test_every_kernel_has_a_layout(off):
    assert off.no_layout.empty
    assert not (off.dump.launches["layout"].astype(str).isin(["", "none"])).any()


def _doc_names(text: str, heading: str) -> set[str]:
    """Backticked names in the first column of the table that follows `heading`'s line."""
    lines = text[text.index(heading):].splitlines()[1:]
    out, seen = set(), False
    for ln in lines:
        if ln.startswith("|"):
            seen = True
            out |= set(re.findall(r"^\|\s*`([^`]+)`", ln))
        elif seen:
            break
    return out


def test_json_matches_schema_doc(off):
    """What `mine analyze --json` writes (`to_json`; the command itself: tests/cli/test_mining_cli.py)
    has exactly the keys docs/analysis-json.md names."""
    from mining.analyze import to_json

    doc = (ROOT / "docs" / "analysis-json.md").read_text()
    version = int(re.search(r"\*\*schema_version: (\d+)\*\*", doc).group(1))
    j = json.loads(json.dumps(to_json(off)))
    assert j["schema_version"] == version
    # sections a document holds only for some dumps (`ranks`: several rank processes) may be absent
    import dataclasses

    from vocab.analysis import AnalysisDoc

    optional = {f.name for f in dataclasses.fields(AnalysisDoc) if f.metadata.get("absent_when_none")}
    documented = _doc_names(doc, "| key | type | meaning |")
    assert set(j) <= documented and documented - set(j) <= optional
    fw_keys = re.search(r"`passes\.forwards\[\]`:(.*?)\n\n", doc, re.S).group(1)
    assert set(j["passes"]["forwards"][0]) == set(re.findall(r"`(\w+)`", fw_keys))
    ptr_keys = re.search(r"`pointers\[\]`:(.*?)`role` is one of", doc, re.S).group(1)
    assert set(j["pointers"][0]) == set(re.findall(r"`(\w+)`", ptr_keys))
    roles = _doc_names(doc, "| role | rule |")
    statuses = _doc_names(doc, "| status | meaning |")
    assert {p["role"] for p in j["pointers"]} <= roles
    assert {f["status"] for f in j["fits"]} <= statuses
    assert [f["tokens"] for f in j["passes"]["forwards"]] == [16384] + expected_tokens()
    assert j["layers"]["layers"] == LAYERS and j["source"]["launches"] == len(off.dump.launches)


# ------------------------------------------------------------------ issue 7: the server's engine
def test_serve_pid_folder_is_the_engine(srv):
    folder = unpack(SERVE)
    pids = sorted(p.name for p in folder.glob("pid*"))
    # only the engine initialised CUDA: the API server process and the client script never did,
    # and a process that never records leaves no folder (docs/dump-format.md)
    assert pids == [f"pid{srv.dump.pid}"]
    meta = srv.dump.meta
    assert meta["argv"][0] == "VLLM::EngineCore"        # setproctitle's name for the engine
    assert meta["ppid"] != meta["pid"]
    # killed at shutdown: no exit counters, no end_ns; its last record still parsed whole
    assert "counters" not in meta and "end_ns" not in meta
    assert not [w for w in srv.dump.warnings if "truncated" in w or "unparsable" in w or "NUL" in w]
    assert srv.dump.source.parent == folder / pids[0]


def _keys(a, lo=0, hi=None):
    L = a.dump.launches.iloc[lo:hi]
    return list(zip(L["symbol"].astype(str), L["grid_x"], L["grid_y"], L["grid_z"], L["block_x"],
                    L["smem"]))


def test_serve_requests_match_offline(off, srv):
    """From the 2048-token warm-up on, the two engines launched the same kernels with the same
    grids, launch for launch; so the (symbol, grid) multisets of every request forward agree."""
    assert request_starts(srv) == request_starts(off)
    all_o, all_s = _keys(off), _keys(srv)
    for k in range(3, len(off.forwards)):
        ko = collections.Counter(all_o[i] for i in np.flatnonzero(off.passes.forward == k))
        ks = collections.Counter(all_s[i] for i in np.flatnonzero(srv.passes.forward == k))
        assert ko == ks and sum(ko.values()) > 300, k
    start = int(np.flatnonzero(off.passes.forward == 1)[0])   # the 2048 warm-up
    assert int(np.flatnonzero(srv.passes.forward == 1)[0]) == start
    assert _keys(off, start) == _keys(srv, start)


def test_serve_startup_differs_only_by_token_budget(off, srv):
    """The only differences are before the warm-ups: the profiling pass runs at the server's
    token budget (8192) instead of the LLM class's (16384), so grids sized by it differ, cuBLAS
    picks other GEMM kernels for two of each layer's GEMMs, and a few buffer fills sized by the
    budget or by the memory left for the KV cache differ in length."""
    tok_o = off.reference.tokens
    L, fw = rows(srv, REF)
    tok_s = dict(zip(fw, L["grid_x"]))
    assert tok_o[0] == 16384 and tok_s[0] == 8192
    ko, ks = _keys(off), _keys(srv)
    assert len(ko) == len(ks)
    diff = [i for i in range(len(ko)) if ko[i] != ks[i]]
    start = int(np.flatnonzero(off.passes.forward == 1)[0])
    assert diff and max(diff) < start
    other_symbol = [i for i in diff if ko[i][0] != ks[i][0]]
    assert all("nvjet" in ko[i][0] and "nvjet" in ks[i][0] for i in other_symbol)
    assert len(other_symbol) == 2 * LAYERS
    assert set(off.passes.forward[other_symbol]) == {0}


def test_serve_tokens_reference(srv):
    """The reference is a kernel of every forward (the per-forward rms_norm), not one that only
    runs when a request starts (`_prepare_prefill_inputs_kernel`), whose missing forwards would
    simply drop out of the fits."""
    assert srv.reference.symbol == REF
    assert list(srv.forwards["tokens"]) == [8192] + expected_tokens()


# ------------------------------------------------------------------ capture fixtures
@pytest.mark.parametrize("name", ["probe", "torch", "probe_bin", "torch_bin"])
def test_capture_fixtures_analyze(name, tmp_path):
    out = subprocess.run([sys.executable, "-m", "mine.cli", "analyze",
                          str(FIXTURES / "capture" / f"{name}.tar.xz"), "--json", str(tmp_path / "a.json")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads((tmp_path / "a.json").read_text())["source"]["launches"] > 0


# ------------------------------------------------------------------ the binary form, real
OFFLINE_BIN = FIXTURES / "vllm" / "vllm-offline-bin.tar.xz"


@pytest.fixture(scope="module")
def offb(offline_bin_analysis):
    return offline_bin_analysis   # the session's (tests/conftest.py)


def test_binary_capture_is_the_json_capture(off, offb):
    """The same workload captured again with `mine capture --format bin --writer mmap` (launches.bin,
    pointers classified offline from allocs.jsonl): launch for launch the same kernels, grids,
    blocks and shared memory, the same forwards and token counts, the same pointer roles. Where the
    start-up passes end is host timing (the first capture ran with cold JIT caches, forward 0 took
    5.7 s against 0.2 s), so forward membership and layer blocks are compared from the first
    request on."""
    assert offb.dump.meta["options"]["format"] == "bin"
    assert [w for w in offb.dump.warnings if "no cubin" not in w] == []   # the fixture keeps 33 cubins
    assert _keys(offb) == _keys(off)
    assert list(offb.forwards["tokens"]) == list(off.forwards["tokens"])
    first = int(np.flatnonzero(off.passes.forward == 3)[0])
    assert (offb.passes.forward[first:] == off.passes.forward[first:]).all()
    assert [b for b in offb.layers if b["example_forward"] >= 3] == [b for b in off.layers if b["example_forward"] >= 3]
    # the roles of the layer kernels' pointers (weights, KV pools, activations), each with its layer
    key = ["symbol", "i", "layer", "role"]

    def roles(a):
        P = a.pointers[key].astype(str)
        mine = P["symbol"].str.contains("|".join([QK_NORM, ADD_NORM, ATTN, CACHE, REF]), regex=True)
        return P[mine].drop_duplicates().sort_values(key).reset_index(drop=True)
    assert len(roles(off)) > 100 and roles(offb).equals(roles(off))
