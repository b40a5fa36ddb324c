"""`mine compare` on the CPU: the verdict rules, the reference format, what a one-sequence host
reads from a manifest, every refusal before the GPU, and the committed H200 reports judged again.

The GPU half (kern running the manifests) is tests/generators/test_qwen3_gpu.py; its reports,
with the logits kern produced at every reference top-k id, are committed in
tests/gpu_results/compare/, so the judgement of real runs is re-checked here without a GPU.
"""

from __future__ import annotations

import copy
import json
import lzma
import sys

import pytest
from paths import FIXTURES, GPU_RESULTS, ROOT

import fake_ckpt
from compare import checkpoint, reference, run, serving, verdict
from compare.reference import ReferenceError
from compare.serving import ManifestError

QWEN3 = ROOT / "manifests/qwen3"
REF06 = ROOT / "examples/vllm_qwen3/reference/compare-ref.json.xz"
REPORTS = GPU_RESULTS / "compare"


def _json_xz(p):
    return json.loads(lzma.decompress(p.read_bytes()))


# -- verdicts --------------------------------------------------------------------------------

def test_bf16_step():
    assert verdict.bf16_step(1.0) == 2 ** -7
    assert verdict.bf16_step(3.9) == 2 ** -6
    assert verdict.bf16_step(-0.3) == 2 ** -9
    assert verdict.bf16_step(0.0) > 0


B = verdict.Bounds(tol_ulps=8)


def test_match_flip_wrong_off():
    ids, lp = (7, 3, 9), (-1.0, -1.01, -1.5)
    # kern agrees exactly with the reference's differences
    r = verdict.judge(0, 0, 5, 7, ids, lp, [2.0, 1.99, 1.5], 7, B)
    assert r.verdict == "match" and r.error == pytest.approx(0.0, abs=1e-9)
    # kern prefers 3, where the reference's margin is 0.01 (within 8 bf16 steps at |z| ~ 2)
    r = verdict.judge(0, 0, 5, 7, ids, lp, [2.0, 2.01, 1.5], 3, B)
    assert r.verdict == "flip" and r.margin == pytest.approx(0.01)
    # kern prefers 9, which the reference put 0.5 below its choice: not noise
    r = verdict.judge(0, 0, 5, 7, ids, lp, [2.0, 1.99, 2.1], 9, B)
    assert r.verdict == "wrong" and r.margin == pytest.approx(0.5)
    # kern's top-1 is outside the reference's top-k
    r = verdict.judge(0, 0, 5, 7, ids, lp, [2.0, 1.99, 1.5], 42, B)
    assert r.verdict == "wrong" and r.margin is None
    # same top-1, but the differences are off by far more than bf16 noise
    r = verdict.judge(0, 0, 5, 7, ids, lp, [2.0, 1.2, 0.1], 7, B)
    assert r.verdict == "off" and r.error == pytest.approx(1.9 - 0.5)


def test_bound_scales_with_the_logits_and_has_a_floor():
    small = verdict.judge(0, 0, 0, 1, (1, 2), (-1.0, -1.2), [0.3, 0.1], 1, B)
    large = verdict.judge(0, 0, 0, 1, (1, 2), (-1.0, -1.2), [30.0, 29.8], 1, B)
    assert large.bound == 64 * small.bound
    floor = verdict.judge(0, 0, 0, 1, (1, 2), (-1.0, -1.2), [0.3, 0.1], 1, verdict.Bounds(tol_ulps=0, tol=0.05))
    assert floor.bound == 0.05


def test_summary_names_the_first_failure_in_order():
    steps = [verdict.judge(q, j, j, 1, (1, 2), (-1.0, -2.0), z, got, B)
             for q, j, z, got in [(0, 0, [1.0, 0.0], 1), (0, 1, [1.0, 0.0], 2), (1, 0, [1.0, 0.9], 1)]]
    s = verdict.summarize(steps)
    assert not s.passed and (s.first_failure.request, s.first_failure.step) == (0, 1)
    assert s.counts == {"match": 1, "flip": 0, "wrong": 1, "off": 1}
    assert verdict.summarize(steps[:1]).passed and not verdict.summarize([]).passed


def test_agreement():
    assert verdict.agreement([1, 2, 3], [1, 2, 4]) == 2
    assert verdict.agreement([1, 2], [1, 2]) == 2 and verdict.agreement([5], [6]) == 0


# -- the committed H200 reports, judged again ------------------------------------------------

REPORT_REFS = {"q06": REF06, **{n: FIXTURES / f"compare/ref_{n}.json.xz" for n in ("q1e", "q2e", "q4e", "q12e", "q36e")}}


@pytest.mark.parametrize("name", sorted(p.name.split(".")[0][len("compare_"):] for p in REPORTS.glob("compare_*.json.xz")))
def test_committed_reports_judge_the_same(name):
    doc = _json_xz(REPORTS / f"compare_{name}.json.xz")
    ref = reference.read(REPORT_REFS["q06" if name.startswith("broken") else name])
    again = run.rejudge(doc, ref, verdict.Bounds(**doc["bounds"]))
    assert [r.verdict for r in again] == [s["verdict"] for s in doc["steps"]]
    s = verdict.summarize(again)
    assert s.passed == doc["passed"] == (not name.startswith("broken"))
    assert len(again) == sum(len(r.output) for r in ref.requests)
    if not s.passed:
        f = doc["summary"]["first_failure"]
        assert (s.first_failure.request, s.first_failure.step) == (f["request"], f["step"])


def test_correct_manifests_flip_only_within_noise_and_broken_ones_fail_early():
    for name in REPORT_REFS:
        doc = _json_xz(REPORTS / f"compare_{name}.json.xz")
        flips = [s for s in doc["steps"] if s["verdict"] == "flip"]
        assert all(s["margin"] <= s["bound"] for s in flips)
        assert doc["summary"]["max_error"] <= doc["summary"]["max_bound"]
    for brk in ("wrong_weight", "swapped_stride", "swapped_dims"):
        doc = _json_xz(REPORTS / f"compare_broken_{brk}.json.xz")
        f = doc["summary"]["first_failure"]
        assert f["step"] == 0  # caught at the first generated token of the first request it affects
        bad = sum(doc["summary"]["counts"][v] for v in ("wrong", "off"))
        assert bad > doc["summary"]["steps"] // 2


# -- the reference format ----------------------------------------------------------------------

def _doc():
    return json.loads(lzma.decompress(REF06.read_bytes()))


def test_reference_round_trip(tmp_path):
    ref = reference.read(REF06)
    assert ref.vocab == 151936 and len(ref.requests) == 4 and ref.top_k == 20
    assert max(len(r.prompt) for r in ref.requests) > 2048  # longer than one prefill chunk
    reference.write(ref, tmp_path / "r.json")
    assert reference.read(tmp_path / "r.json") == ref


def _set(path, value):
    def f(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        return d
    return f


BAD_REFS = [
    (_set(["format"], "other/1"), "format"),
    (_set(["model", "vocab_size"], 0), "vocab_size"),
    (_set(["checkpoint", "fingerprint"], "md5:1"), "fingerprint"),
    (_set(["top_k"], True), "top_k"),
    (_set(["requests"], []), "requests"),
    (_set(["requests", 0, "prompt"], [1, -2]), "prompt[1]"),
    (_set(["requests", 0, "output"], [1.5]), "output[0]"),
    (_set(["requests", 1, "top"], [[[1, -0.5]]]), "top-k for 1 positions"),
    (_set(["requests", 0, "top", 0], [[1, 0.5]]), "log-probability"),
    (_set(["requests", 0, "top", 0], [[1, -0.5], [1, -0.7]]), "twice"),
    (_set(["requests", 0, "top", 0, 0], [999999999, -0.1]), "token id"),
    (lambda d: d["requests"][0].pop("top") and d, "'top'"),
]


@pytest.mark.parametrize("mutate,phrase", BAD_REFS, ids=[p for _, p in BAD_REFS])
def test_bad_reference_is_one_sentence(mutate, phrase, tmp_path):
    p = tmp_path / "ref.json"
    p.write_text(json.dumps(mutate(_doc())))
    with pytest.raises(ReferenceError) as e:
        reference.read(p)
    assert phrase in str(e.value) and "\n" not in str(e.value)


def test_output_must_be_in_its_top_k(tmp_path):
    d = _doc()
    tok = d["requests"][0]["output"][0]
    d["requests"][0]["top"][0] = [p for p in d["requests"][0]["top"][0] if p[0] != tok]
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(ReferenceError, match="not among that position's top-k"):
        reference.read(tmp_path / "r.json")


# -- what the host reads from a manifest ------------------------------------------------------

def _qwen3():
    return json.loads((QWEN3 / "qwen3.json").read_text())


def test_serving_of_the_committed_manifest():
    s = serving.serving(_qwen3())
    assert (s.prefill, s.decode, s.logits, s.next_token) == ("prefill", "decode", "logits", "next_token")
    assert (s.vocab, s.chunk, s.max_len, s.block_size) == (151936, 2048, 4096, 16)
    assert set(s.inputs) == {"token", "position", "slot", "seq_len", "cu_seqlens", "blocks"}


def test_serving_refuses_what_a_host_cannot_serve():
    k3 = json.loads((ROOT / "manifests/k3/224/p/stage0.json").read_text())
    with pytest.raises(ManifestError):
        serving.serving(k3)
    m = _qwen3()
    m["buffers"]["logits"]["shape"] = [1, 100]
    with pytest.raises(ManifestError, match="no logits output"):
        serving.serving(m)
    m = _qwen3()
    m["buffers"]["tokens"]["fill"] = None
    with pytest.raises(ManifestError, match="no input with fill 'token'"):
        serving.serving(m)
    m = _qwen3()
    m["buffers"]["logits2"] = copy.deepcopy(m["buffers"]["logits"])
    # one per program (a compiled manifest's decode.out and prefill.out): the decode program's
    assert serving.serving(m).logits == "logits"
    m["programs"]["decode"]["calls"][-1]["args"].append({"buf": "logits2"})
    with pytest.raises(ManifestError, match="--logits"):
        serving.serving(m)
    assert serving.serving(m, logits="logits2").logits == "logits2"


# -- refusals before the GPU, through the command line ----------------------------------------

CFG = json.loads((ROOT / "examples/vllm_qwen3/reference/config.json").read_text())


@pytest.fixture
def ckpt(tmp_path):
    fake_ckpt.write(_qwen3(), tmp_path / "ck", CFG)
    return tmp_path / "ck"


def _ref_for(ck, tmp_path, **change):
    ref = reference.read(REF06)
    ref = reference.Reference(ref.engine, ref.mode, dict(ref.model), checkpoint.fingerprint(ck), ref.top_k,
                              ref.requests, {})
    for k, v in change.items():
        ref = __import__("dataclasses").replace(ref, **{k: v})
    p = tmp_path / "ref.json"
    reference.write(ref, p)
    return p


def _mine(args, monkeypatch, capsys):
    from mine.cli import main

    monkeypatch.setattr(sys, "argv", ["mine", *args])
    with pytest.raises(SystemExit) as e:
        main(args)
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("mine: error: "), err
    return lines[0]


def test_prepare_accepts_a_matching_setup(ckpt, tmp_path):
    s = run.prepare(QWEN3, ckpt, _ref_for(ckpt, tmp_path))
    assert s.manifest_path.name == "qwen3.json" and len(s.weight_files) == 2


def test_prefill_rows_cap_each_prefill_call_or_feed_the_decode_program(ckpt, tmp_path, monkeypatch, capsys):
    s = run.prepare(QWEN3, ckpt, _ref_for(ckpt, tmp_path))
    assert s.serving.prefill and s.serving.chunk > 1
    one = run.with_prefill_rows(s, 1)
    assert (one.serving.prefill, one.serving.chunk) == (s.serving.prefill, 1) and s.serving.chunk > 1
    none = run.with_prefill_rows(s, 0)
    assert none.serving.prefill is None and none.serving.decode == s.serving.decode
    with pytest.raises(run.ManifestError, match="takes at most"):
        run.with_prefill_rows(s, s.serving.chunk + 1)
    with pytest.raises(run.ManifestError, match="no prefill program"):
        run.with_prefill_rows(none, 4)
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference", str(_ref_for(ckpt, tmp_path)),
                 "--prefill-rows", str(s.serving.chunk + 1)], monkeypatch, capsys)
    assert f"takes at most {s.serving.chunk} rows" in err


def test_reference_of_another_vocabulary(ckpt, monkeypatch, capsys):
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference",
                 str(FIXTURES / "compare/ref_q36e.json.xz")], monkeypatch, capsys)
    assert "vocabulary of 16384 tokens; the manifest's is 151936" in err


def test_reference_of_another_checkpoint(ckpt, tmp_path, monkeypatch, capsys):
    ref = _ref_for(ckpt, tmp_path)
    fake_ckpt.write(_qwen3(), tmp_path / "other", CFG, stamp=b"another seed")
    err = _mine(["compare", str(QWEN3), "--weights", str(tmp_path / "other"), "--reference", str(ref)],
                monkeypatch, capsys)
    assert "recorded on another checkpoint" in err


def test_reference_of_another_geometry(ckpt, tmp_path, monkeypatch, capsys):
    ref = _ref_for(ckpt, tmp_path, model=dict(reference.read(REF06).model, num_hidden_layers=12))
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference", str(ref)], monkeypatch, capsys)
    assert "num_hidden_layers 12" in err and "has 28" in err


def test_missing_checkpoint_tensor(tmp_path, monkeypatch, capsys):
    fake_ckpt.write(_qwen3(), tmp_path / "ck", CFG, skip=("model.layers.7.mlp.up_proj.weight",))
    ref = _ref_for(tmp_path / "ck", tmp_path)
    err = _mine(["compare", str(QWEN3), "--weights", str(tmp_path / "ck"), "--reference", str(ref)],
                monkeypatch, capsys)
    assert "no tensor 'model.layers.7.mlp.up_proj.weight'" in err and "'l7.gate_up'" in err


def test_manifest_without_logits(ckpt, tmp_path, monkeypatch, capsys):
    """The committed manifest less its LM head: it verifies, and has nothing to compare."""
    import shutil

    m = _qwen3()
    for p in m["programs"].values():
        p["calls"] = [c for c in p["calls"] if c["label"] not in ("lm_head", "argmax")]
    for name in ("logits", "next_token"):
        del m["buffers"][name]
    del m["ops"]["d.argmax"], m["modules"]["mine_argmax"]
    shutil.copytree(QWEN3, tmp_path / "m")
    (tmp_path / "m/qwen3.json").write_text(json.dumps(m))
    err = _mine(["compare", str(tmp_path / "m"), "--weights", str(ckpt), "--reference",
                 str(_ref_for(ckpt, tmp_path))], monkeypatch, capsys)
    assert "no logits output to compare" in err


def test_manifest_that_cannot_be_fed_a_sequence(ckpt, tmp_path, monkeypatch, capsys):
    err = _mine(["compare", str(ROOT / "manifests/k3/224/p/stage0.json"), "--weights", str(ckpt), "--reference",
                 str(_ref_for(ckpt, tmp_path))], monkeypatch, capsys)
    assert "cannot be fed a sequence" in err


def test_context_longer_than_the_manifest(ckpt, tmp_path, monkeypatch, capsys):
    ref = reference.read(_ref_for(ckpt, tmp_path))
    r0 = ref.requests[0]
    long = reference.Request(tuple([5] * 4090), r0.output, r0.steps)
    p = tmp_path / "long.json"
    reference.write(__import__("dataclasses").replace(ref, requests=(long,)), p)
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference", str(p)], monkeypatch, capsys)
    assert "needs a context of 4153 positions; the manifest serves at most 4096" in err


def test_report_may_not_overwrite_an_input(ckpt, tmp_path, monkeypatch, capsys):
    ref = _ref_for(ckpt, tmp_path)
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference", str(ref), "--json", str(ref)],
                monkeypatch, capsys)
    assert "--json" in err


def test_missing_checkpoint_folder(tmp_path, monkeypatch, capsys):
    err = _mine(["compare", str(QWEN3), "--weights", str(tmp_path / "nope"), "--reference", str(REF06)],
                monkeypatch, capsys)
    assert "nope" in err


def test_report_reads_at_80_columns_and_names_the_first_failure():
    from rich.console import Console

    from compare import show

    for name, want in (("broken_swapped_stride", "FAILED at request 1, step 0 (position 36)"), ("q06", "passed: 256 steps")):
        con = Console(width=80, record=True)
        show.report(_json_xz(REPORTS / f"compare_{name}.json.xz"), con)
        text = con.export_text()
        assert want in " ".join(text.split())
        assert max(len(line) for line in text.splitlines()) <= 80


def test_every_reference_is_what_compare_refs_says():
    """examples/vllm_qwen3/compare_refs.txt is how the committed references were recorded: each
    row's reference exists, with that row's prompt lengths, seed and new-token count."""
    rows = [r.split("|") for r in (ROOT / "examples/vllm_qwen3/compare_refs.txt").read_text().splitlines()
            if r and not r.startswith("#")]
    assert {r[0] for r in rows} == set(REPORT_REFS)
    for name, _, flags in rows:
        f = flags.split()
        ref = reference.read(REPORT_REFS[name])
        assert ref.made["prompts"] == {"lengths": f[f.index("--lengths") + 1], "seed": int(f[f.index("--seed") + 1])}
        assert [len(r.prompt) for r in ref.requests] == [int(x) for x in f[f.index("--lengths") + 1].split(",")]
        assert {len(r.output) for r in ref.requests} == {int(f[f.index("--new") + 1])}


def test_batch_beyond_the_decode_groups_is_one_sentence(ckpt, tmp_path, monkeypatch, capsys):
    """--batch N asks the decode program for N sequences a call: the one-sequence manifest refuses
    N > 1 before any GPU work; a batched manifest (its decode's groups raised) accepts up to them."""
    ref = _ref_for(ckpt, tmp_path)
    err = _mine(["compare", str(QWEN3), "--weights", str(ckpt), "--reference", str(ref), "--batch", "4"],
                monkeypatch, capsys)
    assert "--batch 4: the decode program 'decode' runs at most 1 sequence(s) a call" in err
    s = run.prepare(QWEN3, ckpt, ref)
    m = copy.deepcopy(s.m)
    m["programs"]["decode"]["batch"]["groups"] = 8
    wide = __import__("dataclasses").replace(s, m=m)
    run.check_batch(wide, 8)
    with pytest.raises(run.ManifestError, match="runs at most 8"):
        run.check_batch(wide, 9)
