"""`mine gen qwen3 --max-seqs N`: the batched manifest (issue 17), on three captures.

The captures: the bundled vLLM capture (28 layers, Qwen3-0.6B geometry), the q3x compile fixture
(another geometry and prompt set) and the hand-made simulated capture. What is checked:

- both verifiers accept the batched manifest (ours, kern-llm's CPU verification) and the ABI
  check over the dump's cubins passes;
- **one sequence is the one-sequence manifest**: every call of both programs, instantiated at
  seqs = 1 (and the same rows), launches the same kernels with the same grids, blocks and
  argument values as the `--max-seqs 1` manifest's; the attention's query-block count may be one
  more (the batched form over-launches one block the kernel's guard returns from), nothing else
  differs;
- **n sequences run n rows**: at seqs = n every decode kernel's row dimension is n (n times the
  heads for the head norms), every GEMM's m is n, the attention launches floor(n / BLOCK_Q) + n
  query blocks or one more, and a token-count scalar of a decode kernel follows n as the same
  kernel's does in prefill; the split-KV scratch holds max_seqs rows;
- the inputs are per sequence (`seq_lens[seqs]`, `blocks[seqs, W]`, `cu_seqlens[max_seqs + 1]`);
- a --max-seqs outside 1..--chunk is one sentence and exit code 2.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from generators.qwen3 import config
from generators.qwen3.kernels import FADD_TOKENS, RMS_TOKENS
from generators.qwen3.generate import build_manifest, generate_qwen3
from manifests.abi import check_abi
from manifests.verify import verify
from kern_verdicts import kern_violations
from paths import FIXTURES, ROOT
from qwen3_sim import simulate
from vocab.expr import evaluate, from_wire

CAPTURES = {
    "bundled": (FIXTURES / "vllm" / "vllm-offline.tar.xz", ROOT / "examples/vllm_qwen3/reference/config.json"),
    "q3x": (FIXTURES / "compile" / "q3x.tar.xz", FIXTURES / "compile" / "q3x.config.json"),
    # vLLM serving 1, 8 and 32 requests at once: decode forwards of many sequences, each build's
    # grids and scalars seen at several sequence counts (two reduce_segments builds)
    "q2b": (FIXTURES / "batched" / "q2b.tar.xz", FIXTURES / "batched" / "q2b.config.json"),
}


@lru_cache(maxsize=None)
def _sim(tmp: str):
    from pathlib import Path

    d = Path(tmp) / "sim"
    if not d.exists():
        d.mkdir(parents=True)
        simulate(d, config.load(CAPTURES["bundled"][1]))
    return d, CAPTURES["bundled"][1]


@pytest.fixture(scope="module", params=["bundled", "q3x", "q2b", "sim"])
def capture(request, tmp_path_factory):
    if request.param == "sim":
        return _sim(str(tmp_path_factory.getbasetemp()))
    return CAPTURES[request.param]


@lru_cache(maxsize=None)
def _manifest(dump, cfg, max_seqs):
    return build_manifest(dump, cfg, ROOT / "kernels.toml", 2048, max_seqs=max_seqs)


def _value(a, env):
    """A call or launch argument's value at the var values `env`: buffers by name and offset."""
    if "buf" in a or "state" in a:
        return ("buf" if "buf" in a else "state", a.get("buf") or a.get("state"), a.get("offset", 0))
    if "var" in a:
        return env[a["var"]]
    if "expr" in a:
        return evaluate(from_wire(a["expr"]), env)
    if len(a) == 1 and next(iter(a)) in ("i32", "i64", "u8"):
        return next(iter(a.values()))      # an integer literal is its value (a var may stand for it)
    return a


def _grid(g, env):
    return [evaluate(from_wire(x), env) for x in g]


def _instantiate(m, program, env):
    """Every launch of a program at the var values `env`: (label, entry, grid, block, args)."""
    out = []
    for c in m["programs"][program]["calls"]:
        vals = [_value(a, env) for a in c["args"]]
        op = m["ops"][c["op"]]
        for ln in op["impl"]["launches"]:
            w = ln.get("when")
            if w and not (w.get("min", 1) <= env[w["var"]] <= w.get("max", 1 << 62)):
                continue
            if ln["entry"].startswith("extern:"):
                out.append((c.get("label"), ln["entry"], None, None, vals))
                continue
            args = [vals[a["param"]] if "param" in a else _value(a, env) for a in ln.get("args", [])]
            out.append((c.get("label"), ln["entry"], _grid(ln["grid"], env), ln["block"], args))
    return out


def _block_q(cfg_path):
    return config.load(cfg_path).block_q


@pytest.mark.parametrize("max_seqs", [2, 64])
def test_batched_manifest_verifies(capture, max_seqs, tmp_path):
    dump, cfgp = capture
    _, mm, _, m = _manifest(dump, cfgp, max_seqs)
    assert verify(m) == []
    assert kern_violations(m, tmp_path, tmp_path) == []
    assert m["vars"]["seqs"] == {"max": max_seqs, "axis": "groups"}
    assert m["programs"]["decode"]["batch"] == {"groups": max_seqs, "rows": 1}
    assert m["programs"]["prefill"]["batch"] == {"groups": max_seqs, "rows": "rows"}
    b = m["buffers"]
    assert b["seq_lens"]["shape"] == ["seqs"] and b["blocks"]["shape"][0] == "seqs"
    assert b["cu_seqlens"]["shape"] == [max_seqs + 1] and b["logits"]["shape"][0] == "seqs"


def test_batched_abi_on_the_bundled_cubins(tmp_path):
    dump, cfgp = CAPTURES["bundled"]
    r = generate_qwen3(dump, cfgp, tmp_path / "q", max_seqs=16)
    assert r.manifest["vars"]["seqs"]["max"] == 16
    assert [d for d in check_abi(r.manifest, tmp_path / "q" / "kernels") if d.rule != "abi.module-file"] == []


@pytest.mark.parametrize("program, rows", [("decode", 1), ("prefill", 1), ("prefill", 37), ("prefill", 2048)])
def test_one_sequence_is_the_one_sequence_manifest(capture, program, rows):
    dump, cfgp = capture
    one = _manifest(dump, cfgp, 1)[3]
    many = _manifest(dump, cfgp, 64)[3]
    a = _instantiate(one, program, {"rows": rows, "seqs": 1})
    b = _instantiate(many, program, {"rows": rows, "seqs": 1})
    assert len(a) == len(b) and [x[:2] for x in a] == [x[:2] for x in b]
    # a decode argument may differ only where it takes the same kernel's prefill value (a row
    # stride a one-row capture cannot pin), and at one row such a stride is never used
    pre = {(x[0].split(".", 1)[-1], x[1]): x[4] for x in _instantiate(many, "prefill", {"rows": 2, "seqs": 1})}
    over = strides = 0
    for x, y in zip(a, b):
        if x[2] != y[2]:
            assert "unified_attention" in x[1] and y[2][0] == x[2][0] + 1 and y[2][1:] == x[2][1:], (x[0], x[2], y[2])
            over += 1
        assert x[3] == y[3], x[0]
        for i, (u, w) in enumerate(zip(x[4], y[4])):
            if u != w:
                assert program == "decode" and pre[(x[0].split(".", 1)[-1], x[1])][i] == w, (x[0], i, u, w)
                strides += 1
    assert program == "decode" or strides == 0
    layers = config.load(cfgp).layers
    assert over <= layers  # only attention calls, at most one per layer


@pytest.mark.parametrize("n", [2, 7, 8, 9, 31, 64])
def test_n_sequences_run_n_rows(capture, n):
    dump, cfgp = capture
    cfg = config.load(cfgp)
    _, mm, _, m = _manifest(dump, cfgp, 64)
    env = {"rows": n, "seqs": n}
    heads = {"q_norm": cfg.heads, "k_norm": cfg.kv_heads}
    for label, entry, grid, block, args in _instantiate(m, "decode", env):
        role = label.split(".", 1)[-1]
        if entry.startswith("extern:"):
            assert args[3] == n, label          # the GEMM's m: one row a sequence
        elif "unified_attention" in entry:
            assert grid[0] in (n // cfg.block_q + n, n // cfg.block_q + n + 1), (label, grid)
        elif "reduce_segments" in entry:
            assert grid[0] == n, label
        else:
            assert grid[0] == n * heads.get(role, 1), (label, grid)
    # a decode norm's token-count scalar follows the sequences as its prefill build's follows the rows
    pre = _instantiate(m, "prefill", {"rows": n, "seqs": 1})
    dec = _instantiate(m, "decode", env)
    pre_by = {(x[0], x[1]): x[4] for x in pre}
    checked = 0
    for label, entry, _, _, args in dec:
        at = RMS_TOKENS if "rms_norm_kernel" in entry and "fused_add" not in entry else \
            FADD_TOKENS if "fused_add_rms_norm" in entry else None
        if at is not None and (label, entry) in pre_by:
            assert args[at] == pre_by[(label, entry)][at] == n * heads.get(label.split(".", 1)[-1], 1), label
            checked += 1
    assert checked >= 3 * cfg.layers
    # the split-KV scratch: as the one-sequence manifest's where the pair serves one sequence only,
    # a row of segments per sequence where the capture ran it for several
    one = _manifest(dump, cfgp, 1)[3]["ops"]["d.attn"]["impl"]["scratch"]
    rows = 64 if _split_kv_batched(m) else 1
    assert m["ops"]["d.attn"]["impl"]["scratch"] == {k: {**v, "shape": [v["shape"][0] * rows]} for k, v in one.items()}


def _split_kv_batched(m) -> bool:
    """Whether the batched decode runs the captured split-KV pair past one sequence (a capture of
    concurrent requests) rather than the prefill's one-pass build."""
    return any(len(ln["params"]) > 28 and "when" not in ln for ln in m["ops"]["d.attn"]["impl"]["launches"])


def test_decode_attention_past_one_sequence(capture):
    """A single-sequence capture: vLLM's split-KV decode builds are compiled for one sequence (Triton
    folds an integer equal to 1 into the build: reduce_segments' sequence count), so the batched
    decode runs them at seqs 1 only and the prefill's one-pass build (its sequence count a parameter)
    from 2 on. A capture of concurrent requests (q2b) shows the pair at several sequences: the 3D
    attention serves every count and reduce_segments' two builds split at 2, the general one taking
    the sequence count as its parameter 5. Either way the ranges partition 1.. and each launch is
    the module and entry of the build it names."""
    dump, cfgp = capture
    m = _manifest(dump, cfgp, 64)[3]
    dec = m["ops"]["d.attn"]["impl"]["launches"]
    pre = m["ops"]["p.attn"]["impl"]["launches"]
    seen_many = any(x.seqs > 1 for x in _manifest(dump, cfgp, 64)[1].instances[("d", "reduce")][-1].launches)
    assert _split_kv_batched(m) == seen_many
    if seen_many:
        assert [ln.get("when") for ln in dec] == [None, {"var": "seqs", "min": 1, "max": 1}, {"var": "seqs", "min": 2}]
        assert [len(ln["params"]) for ln in dec[1:]] == [12, 13] and dec[1]["entry"] == dec[2]["entry"]
        assert dec[2]["args"][5] == {"param": next(i for i, p in enumerate(m["ops"]["d.attn"]["params"]) if p == "i32"
                                                   and dec[0]["args"][25] == {"param": i})}
        return
    assert [ln["when"] for ln in dec] == [{"var": "seqs", "min": 1, "max": 1}] * 2 + [{"var": "seqs", "min": 2}]
    assert (dec[2]["module"], dec[2]["entry"], dec[2]["block"]) == (pre[0]["module"], pre[0]["entry"], pre[0]["block"])
    assert "reduce_segments" in dec[1]["entry"] and len(dec[0]["params"]) == len(dec[2]["params"]) + 3


def test_a_batched_capture_shows_the_one_sequence_specialisation():
    """The fact the rule above rests on, read from a capture of concurrent requests (q2b, vLLM eager
    serving 1, 8 and 32 requests at once): reduce_segments runs one build at one sequence and
    another, with one parameter more (the sequence count), at several."""
    from mining.load import load_dump
    from generators.qwen3.mined import _launches

    xs = [x for x in _launches(load_dump(FIXTURES / "batched" / "q2b.tar.xz", cache=False)) if x.tag == "reduce"]
    by_build = {}
    for x in xs:
        by_build.setdefault((x.sha256, len(x.sizes)), set()).add(x.grid[0])   # grid x: one block a sequence
    assert len(by_build) == 2
    (one, n1), (many, n2) = sorted(by_build.items(), key=lambda kv: min(kv[1]))
    assert n1 == {1} and min(n2) > 1 and many[1] == one[1] + 1


@pytest.mark.parametrize("bad", ["0", "4096"])
def test_max_seqs_out_of_range_is_one_sentence(bad, tmp_path, capsys):
    from mine.cli import main

    dump, cfgp = CAPTURES["bundled"]
    with pytest.raises(SystemExit) as exc:
        main(["gen", "qwen3", "--dump", str(dump), "--config", str(cfgp), "-o", str(tmp_path / "o"),
              "--max-seqs", bad])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--max-seqs must be between 1 and --chunk (2048)" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
