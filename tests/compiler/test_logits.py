"""`mine compile --config`: a forward ends at its logits; the inputs get kern domains.

On real captures of vLLM 0.26 eager (the truth suite's q2e and q4e, the in-order replay's q2r,
their checkpoints' configs in the truth files): with the config's vocabulary the decode and
prefill programs end at the GEMM of `vocab_size` columns, whose output is the program's [m, vocab]
output, and what came after (sampling, log-probabilities) is left out; without a config nothing
changes. A bad config is one sentence, exit 2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from paths import FIXTURES, ROOT

from compiler import facts
from compiler.compile import compile_capture
from compiler.errors import CompileError
from compiler.programs import cut_at_logits
from manifests.verify import verify

CAPTURES = {"q2e": FIXTURES / "suite" / "q2e", "q4e": FIXTURES / "suite" / "q4e",
            "q2r": FIXTURES / "replay" / "q2r"}


def _load(name):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    base = CAPTURES[name]
    dump = load_dump(base.with_name(base.name + ".tar.xz"))
    truth = json.loads(base.with_name(base.name + ".truth.json").read_text())
    return dump, document(analyze(dump)), truth["config"]


@pytest.fixture(scope="module", params=sorted(CAPTURES))
def both(request, tmp_path_factory):
    dump, doc, cfg = _load(request.param)
    p = tmp_path_factory.mktemp("cfg") / "config.json"
    p.write_text(json.dumps(cfg))
    try:
        plain = compile_capture(dump, doc, label="t")
    except CompileError as exc:          # q2r: a sampling launch's field its two prefill sizes leave open
        plain = exc
    cut = compile_capture(dump, doc, label="t", model=facts.read(p))
    return request.param, cfg, plain, cut


def _gemm_n(res, prog, call):
    g = res.provenance["programs"][prog]["calls"][call]["gemm"]
    return None if g is None else g["n"]


def test_programs_end_at_the_vocabulary_gemm(both):
    name, cfg, plain, cut = both
    V = cfg["vocab_size"]
    assert verify(cut.manifest) == []
    for prog, p in cut.manifest["programs"].items():
        calls = p["calls"]
        if prog == "prefill":
            # a prefill ends at its last KV access (programs.end_at_state): the serving loop takes
            # the prompt's last logits from decode
            assert any(n.startswith("prefill: each forward ends at its last state access") for n in cut.notes)
            assert any("state" in a for a in calls[-1]["args"]), (name, calls[-1]["label"])
            assert not any(_gemm_n(cut, prog, k) == V for k in range(len(calls))), name
            continue
        assert _gemm_n(cut, prog, len(calls) - 1) == V, (name, prog)
        # the output is that GEMM's [rows, vocab] product
        out = cut.manifest["buffers"][f"{prog}.out"]
        assert out["shape"][-1] == V and out["dtype"] == "bf16"
        if isinstance(plain, CompileError):
            # the uncut compile refused at a call after the logits: the cut is what lets it compile
            want = re.match(r"(\w+) call (\d+) ", str(plain))
            assert want and (want[1] != prog or int(want[2]) >= len(calls)), str(plain)
            continue
        # nothing the cut kept differs from the uncut program's calls before it
        assert [c["label"] for c in calls] == [c["label"] for c in plain.manifest["programs"][prog]["calls"][:len(calls)]]
        assert len(plain.manifest["programs"][prog]["calls"]) > len(calls)     # vLLM samples after the logits
    assert any("the engine's sampling" in n for n in cut.notes)


def test_named_token_inputs_are_bounded_by_the_vocabulary(both):
    name, cfg, _, cut = both
    for b in cut.manifest["buffers"].values():
        if b.get("fill") == "token":
            assert b["domain"] == {"min": 0, "max": cfg["vocab_size"] - 1}
        if b.get("fill") == "position":
            assert b["domain"]["max"] == cfg["max_position_embeddings"] - 1
        if b.get("fill") in ("slot", "blocks"):
            assert b["domain"]["index_into"] in cut.manifest["states"]


def test_without_a_vocabulary_gemm_nothing_is_cut():
    class G:
        def __init__(self, n):
            self.n = n

    class S:
        def __init__(self, n=None):
            self.gemm = None if n is None else G(n)

    steps = [S(), S(64), S(), S(1000), S(), S()]
    assert cut_at_logits(steps, None) == (steps, [])
    assert cut_at_logits(steps, 999) == (steps, [])
    kept, tail = cut_at_logits(steps, 1000)
    assert kept == steps[:4] and tail == steps[4:]
    steps.append(S(1000))                      # the last such GEMM ends the forward
    assert cut_at_logits(steps, 1000) == (steps, [])


@pytest.mark.parametrize("text,say", [
    ("{", "not a readable JSON file"),
    ("[1, 2]", "not a JSON object"),
    ('{"hidden_size": 8}', "no positive integer vocab_size"),
    ('{"vocab_size": 0}', "no positive integer vocab_size"),
    ('{"vocab_size": 10, "max_position_embeddings": true}', "max_position_embeddings"),
])
def test_bad_configs_are_one_sentence(tmp_path, text, say):
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(CompileError, match=say):
        facts.read(p)
    r = subprocess.run([sys.executable, "-m", "mine.cli", "compile", str(FIXTURES / "suite" / "tri_dense.tar.xz"),
                        "-o", str(tmp_path / "o"), "--config", str(p)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and say in r.stderr and "Traceback" not in r.stderr


def test_config_facts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 77, "max_position_embeddings": 9}}))
    f = facts.read(tmp_path)
    assert (f.vocab, f.positions) == (77, 9)
    assert facts.read(None) is None
    empty = tmp_path / "e"
    empty.mkdir()
    assert facts.read(empty) is None           # a checkpoint folder without config.json: no facts
