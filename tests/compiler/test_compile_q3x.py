"""`mine compile` on q3x: another checkpoint (4 layers, hidden 512, 8 heads, 4 KV heads, vocabulary
16384: q3x.config.json) on other prompts, the capture whose compiled manifest kern ran within
`mine compare`'s margins on an H100 (tests/gpu_results/session12: 40 of 40 steps, full-row
prefill, largest error 0.0234, as `mine gen qwen3`'s manifest of it).

tests/fixtures/compile/q3x: vLLM 0.26 eager serving compare.record_vllm's seeded requests of 1, 37,
95, 150 and 12 prompt tokens (seed 61, 8 new each), with every copy's and host pointee's bytes; its
flow and contents are `mine replay --forward 11 --forward 14 --in-order` there. The fault it showed
first: a norm weight (1 KB) sits in one allocator block with the step's input buffers, and its
4 KB content records reached into vLLM's logits_indices, which change every step; the weight was
taken for an unfilled input, so kern ran that layer's norm on zeros (off by 0.46 from step 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from replayed import check_fills, check_served, compile_replayed  # noqa: E402


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_replayed("q3x", tmp_path_factory.mktemp("q3x"))


def test_verified_by_both_and_a_one_sequence_host_can_serve_it(compiled):
    check_served(*compiled)


def test_every_fill_is_named_once_with_its_width(compiled):
    check_fills(compiled[0].manifest)


def test_no_norm_reads_an_input(compiled):
    """Every buffer a norm kernel takes is the forward's own (workspace) or a weight: the model's
    inputs are ids and positions, never a norm's scale."""
    m = compiled[0].manifest
    kinds = {k: b["kind"] for k, b in m["buffers"].items()}
    seen = 0
    for prog in m["programs"].values():
        for c in prog["calls"]:
            if "rms_norm" not in c["op"]:
                continue
            seen += 1
            bufs = [a["buf"] for a in c["args"] if isinstance(a, dict) and "buf" in a]
            assert not [b for b in bufs if kinds.get(b) == "input"], (c["label"], bufs)
            assert any(kinds.get(b) == "weight" for b in bufs), c["label"]
    assert seen >= 2 * 4 * 2      # two norms a layer, four layers, both programs
