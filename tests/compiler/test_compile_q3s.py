"""`mine compile` on q3s with the data flow and contents an in-order replay measured on the H200.

tests/fixtures/compile/q3s: vLLM 0.26 eager serving compare.record_vllm's five seeded requests (1, 23,
77, 190 and 6 prompt tokens, 8 new each) on a seeded 3-layer Qwen3 (hidden 256, vocab 8192),
captured on the H200 (2026-12-01) with every copy's and host pointee's bytes and a start-up
snapshot (left out of the fixture: the weights' bytes). Every cubin but cuBLAS's is in it, so the
offline ABI check covers every kernel the manifest launches. tests/gpu_results/compile_q3s holds what
`mine replay --forward 14 --in-order` measured there (flow of decode forward 14, contents of
forwards 10-14) and kern running `mine gen qwen3`'s manifest of the same capture (40 of 40 steps
within the margins).
"""

from __future__ import annotations

import json
import lzma
import re

import pytest
from kern_verdicts import accepted_by_both
from paths import FIXTURES, ROOT

from compiler.compile import compile_dump

FIX = FIXTURES / "compile"
RES = ROOT / "tests" / "gpu_results" / "compile_q3s"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("q3s")
    for name, src in (("flow.json", RES / "flow14.json.xz"), ("contents.json", RES / "contents.json.xz"),
                      ("ref.json", FIX / "q3s.ref.json.xz")):
        (tmp / name).write_bytes(lzma.decompress(src.read_bytes()))
    res = compile_dump(FIX / "q3s.tar.xz", tmp / "out", analysis=tmp / "flow.json", contents=tmp / "contents.json",
                       requests=tmp / "ref.json", config=FIX / "q3s.config.json", cache=False)
    return res, tmp / "out"


def test_verified_by_both_and_the_abi_check_covers_every_kernel(compiled):
    res, out = compiled
    m = res.manifest
    accepted_by_both(res, out)
    # compile_dump ran the offline ABI check over every cubin in kernels/ (it raises on a finding); the
    # modules it could not check are the two ATen fatbins (10 and 19 MB) the device's packing left
    # out, and the notes say how many
    launched = {ln["module"] for op in m["ops"].values() for ln in op["impl"].get("launches", []) if "module" in ln}
    absent = {k for k in launched if not (out / "kernels" / m["modules"][k]["source"]).is_file()}
    assert len(launched) >= 8 and len(absent) <= 2
    assert any(f"{len(absent)} of {len(m['modules'])} modules have no cubin" in n for n in res.notes) or not absent


def test_an_unaligned_8_byte_param_is_a_byte_pack(tmp_path):
    """ATen's TrivialOffsetCalculator: 8 bytes at offset 28 of the copy kernel; as an i64 kern would
    put it at 32 (the ABI check found that on this capture). Without the measured flow the copy
    kernel stays in the programs (it casts the staged token ids), so this compile launches it."""
    m = compile_dump(FIX / "q3s.tar.xz", tmp_path / "o", config=FIX / "q3s.config.json", cache=False).manifest
    seen = 0
    for op in m["ops"].values():
        for ln in op["impl"].get("launches", []):
            if "direct_copy_kernel_cuda" in ln.get("entry", "") and len(ln["params"]) > 5:
                seen += 1
                assert ln["params"][5] == "bytes<8>"
    assert seen


def test_the_engines_device_staging_is_left_out_and_its_outputs_are_inputs(compiled):
    res, _ = compiled
    m, prov = res.manifest, res.provenance
    assert any("stage inputs on the device" in n for n in res.notes)
    for prog in ("decode", "prefill"):
        sites = [c["site"] for c in prov["programs"][prog]["calls"]]
        assert not [s for s in sites if re.match(r"_(prepare_pos_seq_lens|compute_slot_mappings)_kernel", s)]
        staged = {s for _, s in prov["programs"][prog]["staging"]}
        assert {"_prepare_pos_seq_lens_kernel", "_compute_slot_mappings_kernel"} <= staged
    # the staging kernels' outputs are the programs' inputs now: the rotary kernel's positions and
    # the KV writer's slots. This contents file is of the first in-order replay, which recorded a
    # word once per forward, at the first launch passing it: before the forward's staging wrote
    # it, so it holds the previous step's values. With each forward tied to its own step (the
    # chain of compiler.inputs._tie) those bytes contradict it, and neither input may carry a fill
    # from them; q3t's and q3v's files (a record again where a launch finds the bytes changed) name
    # both (test_compile_q3t, test_compile_q3v). Before the chain, decode forward 12 took the
    # prefill's step by its stale bytes, which named them by chance.
    for prog in ("decode", "prefill"):
        calls = prov["programs"][prog]["calls"]
        rot = next(c for c in calls if "rotary_embedding_kernel" in c["site"])
        kv = next(c for c in calls if c["site"].startswith("reshape_and_cache"))
        pos = next(w["to"][1] for w in rot["words"] if w["param"] == 0)
        slot = next(w["to"][1] for w in kv["words"] if w["param"] == 4)
        for name, fill in ((pos, "position"), (slot, "slot")):
            assert m["buffers"][name]["kind"] == "input", name
            assert m["buffers"][name].get("fill") in (None, fill), name


def test_decode_ends_at_its_logits_and_prefill_at_its_last_kv_access(compiled):
    m = compiled[0].manifest
    assert m["buffers"]["decode.out"]["shape"] == [1, 8192]
    assert m["programs"]["decode"]["calls"][-1]["op"] == "gemm"
    assert any("state" in a for a in m["programs"]["prefill"]["calls"][-1]["args"])


def test_the_block_table_is_an_input_once_its_bytes_change(compiled):
    """vLLM's block table is written through a pointer its staging kernel loads from memory, so no
    launch of the programs shows the write and the class rule took it for a weight. The replay
    saw its bytes change within the window (a new request's pages): it is an input now."""
    res, _ = compiled
    m, prov = res.manifest, res.provenance
    for prog in ("decode", "prefill"):
        att = next(c for c in prov["programs"][prog]["calls"] if c["site"].startswith("kernel_unified_attention"))
        bt = next(w["to"][1] for w in att["words"] if w["param"] == 4)
        assert m["buffers"][bt]["kind"] == "input", bt
        assert "bind" not in m["buffers"][bt]


def test_contents_changing_addresses():
    from vocab.contents import Contents, Word

    c = Contents(10, (0, 9), 8, [Word(0, 1, 0, 0, 0x100, b"\x01\x02"), Word(5, 6, 0, 0, 0x100, b"\x01\x02\x03"),
                                 Word(0, 2, 0, 0, 0x200, b"\x07"), Word(5, 7, 0, 0, 0x200, b"\x08")])
    assert c.changing() == {0x200}          # a longer record agreeing over the common bytes is no change
    # a record reaching into the next address a launch passed: the change there is not this one's
    c = Contents(10, (0, 9), 8, [Word(0, 1, 0, 0, 0x100, b"\x01\x02\x03\x04"), Word(0, 1, 1, 0, 0x102, b"\x03\x04"),
                                 Word(5, 6, 0, 0, 0x100, b"\x01\x02\x09\x09"), Word(5, 6, 1, 0, 0x102, b"\x09\x09")])
    assert c.changing() == {0x102}
