"""q3z: vLLM 0.26 in its default mode (V2 model runner, torch.compile, FULL_AND_PIECEWISE CUDA graphs)
on the q3x checkpoint (4 layers, hidden 512), prompts of 1, 29, 88, 163 and 7 tokens, captured on an
H100 with its graph-order replay measured there (forwards 113 and 116: 141 of 141 targets, no fault;
tests/gpu_results/session14). The V2 runner computes each step's slot mapping on the device
(`_compute_slot_mappings_kernel`) from tables its host copied in once at start-up (the block
tables' addresses, strides and page sizes); with those tables counted as host data
(`compiler.programs.start_tables`), the kernel is staging, left out of the decode program, and
the slot mapping it writes is the program's `slot` input. Not yet named (issue 22): the
attention's gathered block table and the logits gather's index (taken for `blocks`): a
one-sequence decode's single entries read alike."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kern_verdicts import accepted_by_both


sys.path.insert(0, str(Path(__file__).parent))
from replayed import compile_replayed  # noqa: E402


@pytest.fixture(scope="module")
def q3z(tmp_path_factory):
    return compile_replayed("q3z", tmp_path_factory.mktemp("q3z"))


def _entries(m: dict, prog: str) -> list[str]:
    return [ln.get("entry", "") for c in m["programs"][prog]["calls"]
            for ln in m["ops"][c["op"]]["impl"].get("launches", [])]


def test_both_verifiers_accept_the_graph_decode(q3z):
    res, out = q3z
    accepted_by_both(res, out)
    assert res.manifest["programs"]["decode"].get("graph") is True


def test_the_device_staging_of_the_slot_mapping_is_left_out_and_its_output_is_the_slot_input(q3z):
    res, _ = q3z
    m = res.manifest
    entries = _entries(m, "decode")
    assert not [e for e in entries if "compute_slot_mappings" in e or "prepare_pos_seq_lens" in e]
    assert any("reshape_and_cache" in e for e in entries) and any("unified_attention" in e for e in entries)
    fills = {b["fill"]: b for b in m["buffers"].values() if b["kind"] == "input" and b.get("fill")}
    assert fills["slot"]["dtype"] == "i64" and fills["token"]["dtype"] == "i32"
    # position and sequence length are staged too, and read only inside the graph replay: named
    # from the bytes the last staging record left before the replay ran (compiler.inputs.add_replayed)
    assert {"position", "seq_len"} <= set(fills)
    rope = [c for c in m["programs"]["decode"]["calls"] if any(a.get("buf") == next(
        n for n, b in m["buffers"].items() if b.get("fill") == "position") for a in c["args"] if isinstance(a, dict))]
    assert rope and all(c["label"].split(".", 1)[1].startswith("triton_") for c in rope)
    # the slot input is what the KV write reads
    slot = next(n for n, b in m["buffers"].items() if b.get("fill") == "slot")
    kv = [c for c in m["programs"]["decode"]["calls"] if "reshape_and_cache" in c["label"]]
    assert kv and all(any(a.get("buf") == slot for a in c["args"] if isinstance(a, dict)) for c in kv)
