"""`mine compile` on q3t: every kern fill named from what an in-order replay found on the H200.

tests/fixtures/compile/q3t: vLLM 0.26 eager serving compare.record_vllm's five seeded requests (1, 23,
77, 190 and 6 prompt tokens, 8 new each) on the q3s checkpoint (seeded 3-layer Qwen3, hidden 256,
vocab 8192; q3s.config.json), captured on one H200 on 2026-12-02 with every copy's and host
pointee's bytes and a start-up snapshot (left out here: the weights' bytes). Its flow and contents
are `mine replay --forward 11 --forward 14 --in-order` of the same capture there, with the
re-record rule (each word recorded again when its bytes change inside the forward). On the device
this manifest, with --weights binding the snapshot, ran on kern: the one-token request's 8 decode
steps match vLLM's logits (largest error 5e-7); tests/gpu_results/compile_q3t/README.txt says what
did not.
"""

from __future__ import annotations

import lzma

import pytest
from paths import FIXTURES

from compiler.compile import compile_dump
from manifests.kern_oracle import quiet_stderr, verdict
from manifests.verify import verify

FIX = FIXTURES / "compile"
FILLS = {"token": "i64", "position": "i64", "slot": "i64", "seq_len": "i64", "cu_seqlens": "i32", "blocks": "i32"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("q3t")
    for name in ("flow", "contents", "ref"):
        (tmp / f"{name}.json").write_bytes(lzma.decompress((FIX / f"q3t.{name}.json.xz").read_bytes()))
    res = compile_dump(FIX / "q3t.tar.xz", tmp / "out", analysis=tmp / "flow.json", contents=tmp / "contents.json",
                       requests=tmp / "ref.json", config=FIX / "q3s.config.json", cache=False)
    return res, tmp / "out"


def test_verified_by_both(compiled):
    res, out = compiled
    assert verify(res.manifest) == []
    with quiet_stderr():
        v = verdict(out / "manifest.json")
    assert v.accepted, v.violations[:3]


def test_every_fill_a_one_sequence_host_writes_is_named_with_its_width(compiled):
    m = compiled[0].manifest
    named = {b["fill"]: (n, b) for n, b in m["buffers"].items() if b["kind"] == "input" and b.get("fill")}
    assert {f: b["dtype"] for f, (_, b) in named.items()} == FILLS
    rows = m["vars"]["rows"]["max"]
    for f in ("token", "position", "slot"):       # one element per row fed: room for the largest prefill
        assert named[f][1]["shape"][0] >= rows, f
    assert named["blocks"][1]["domain"]["stride"] == 16       # vLLM's page: slot // 16 indexes the table


def test_the_only_unnamed_input_is_no_kern_fill(compiled):
    """What stays unnamed is the decode's logits-gather index (vLLM's logits_indices: each
    sequence's last row), which kern has no fill for; the manifest says why."""
    res, _ = compiled
    m, prov = res.manifest, res.provenance
    unnamed = [n for n, b in m["buffers"].items() if b["kind"] == "input" and not b.get("fill")]
    assert len(unnamed) == 1
    users = [c for c in m["programs"]["decode"]["calls"] if any(a.get("buf") == unnamed[0] for a in c["args"])]
    assert len(users) == 1 and "index" in users[0]["op"]
    assert prov["inputs"]["manifest"][unnamed[0]]["because"]


def test_forwards_take_their_own_steps_not_the_stale_bytes_of_the_previous(compiled):
    """A staging kernel rewrites a forward's inputs inside the forward, so the bytes at an address
    only staging reads are the previous step's: they must not tie the forward to that step."""
    steps = compiled[0].provenance["inputs"]["steps"]
    tied = [s for s in steps.values() if s["step"] is not None]
    assert len(tied) >= 20
    # a decode forward right after a prefill found the prompt's token ids still in the buffer its
    # staging kernel rewrites; before the rule it took the prefill's step (23 tokens for 1)
    assert not [s["because"] for s in tied if "the analysis counts" in s["because"]]


def test_prefill_ends_at_its_last_kv_access(compiled):
    res = compiled[0]
    m = res.manifest
    assert m["buffers"]["decode.out"]["shape"] == [1, 8192]
    assert any("state" in a for a in m["programs"]["prefill"]["calls"][-1]["args"])
    assert any(n.startswith("prefill: each forward ends at its last state access") for n in res.notes)
