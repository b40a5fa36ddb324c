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
import sys
from pathlib import Path

import pytest
from kern_verdicts import accepted_by_both
from paths import FIXTURES

sys.path.insert(0, str(Path(__file__).parent))
from replayed import FILLS, compile_replayed  # noqa: E402

from compiler.compile import compile_dump  # noqa: E402

FIX = FIXTURES / "compile"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_replayed("q3t", tmp_path_factory.mktemp("q3t"))


def test_verified_by_both(compiled):
    res, out = compiled
    accepted_by_both(res, out)


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


def test_every_measured_prefill_write_fits_its_buffer_at_the_largest_rows(compiled):
    """The k-norm output of vLLM's 190-row prefill sat 512 bytes below a block the allocator gave
    a later layer's tensor, so its span was 512 bytes; kern then ran 22-row prefills past it and
    only 1- and 2-row prefills were right (tests/gpu_results/compile_q3t/diag_prefill_variants.json).
    Each call's output must hold what the replay measured it writing, scaled to the largest rows."""
    import json

    res, _ = compiled
    m = res.manifest
    rows = m["vars"]["rows"]["max"]
    doc = json.loads(lzma.decompress((FIX / "q3t.flow.json.xz").read_bytes()))
    fw = [f for f in doc["passes"]["forwards"] if f.get("n_launches")]
    at = {}                       # launch seq -> the rows of the forward it ran in
    for f in fw:
        for s in range(f["first_seq"], f["last_seq"] + 1):
            at.setdefault(s, f.get("tokens") or 0)
    measured = {(w["site"], w["i"]): w for w in doc["flow"]
                if w["context"] == "in-order" and w["written_bytes"] and at.get(w["seq"], 0) > 1}
    cfg = json.loads((FIX / "q3s.config.json").read_text())
    k_row = cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    calls = m["programs"]["prefill"]["calls"]
    prov = res.provenance["programs"]["prefill"]["calls"]
    checked = 0
    for c, p in zip(calls, prov):
        if c["op"] == "gemm":
            continue
        for w in p["words"]:
            kind, name, off = w["to"][0], w["to"][1], (w["to"][2] if len(w["to"]) > 2 else 0)
            f = measured.get((p["site"], w["param"]))
            if kind != "buf" or f is None or m["buffers"][name]["kind"] != "workspace":
                continue
            b = m["buffers"][name]
            size = 2 * b["shape"][0] if b["dtype"] == "bf16" else b["shape"][0]
            assert size - off >= f["written_bytes"] * rows // at[f["seq"]], (p["site"], w["param"], name)
            checked += 1
    assert checked >= 10
    knorm = [c for c in calls if "rms_norm" in c["op"] and
             m["ops"][c["op"]]["impl"]["launches"][0]["grid"][0] == {"mul": ["rows", cfg["num_key_value_heads"]]}]
    for c in knorm:
        out = m["buffers"][c["args"][0]["buf"]]
        assert 2 * out["shape"][0] - c["args"][0].get("offset", 0) >= rows * k_row


def test_without_measured_flow_the_short_extents_are_named(tmp_path):
    """The same capture without its flow: the k-norm output's extent rests on the span to another
    time's tensor, which nothing measured corrects; the compile says so per program."""
    res = compile_dump(FIX / "q3t.tar.xz", tmp_path / "o", config=FIX / "q3s.config.json", cache=False)
    short = [n for n in res.notes if "take their extent from the span to an address the forward uses at another time" in n]
    assert any(n.startswith("prefill:") for n in short), res.notes[:5]
