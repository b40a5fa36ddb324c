"""`mine compile` on q3v: the q3t case on other prompts, each forward tied to its own step.

tests/fixtures/compile/q3v: vLLM 0.26 eager on the q3s checkpoint (q3s.config.json), captured on one
H200 on 2026-12-02 serving compare.record_vllm's seeded requests of 1, 29, 113, 171 and 9 prompt
tokens (seed 47, 8 new each), with every copy's and host pointee's bytes and a start-up snapshot
(left out here). Its flow and contents are `mine replay --forward 11 --forward 14 --in-order` there
(tests/gpu_results/session11). Two faults it showed, both general:
- a one-element copy equals some value of many steps by chance: forward 15 (step 12) took step 2 by
  a copied `[3]`, and the forwards around it then paired with no step (`_by_order` needs its stretch
  whole), so the replayed decodes had none and `seq_len` went unnamed. Steps are now the heaviest
  chain in which later forwards take later steps (compiler.inputs._tie);
- the block a copy of the prompt's ids (i32) filled held, 512 bytes in, vLLM's logits_indices: its
  first byte lay inside the copy, and it was named a second `token` (compiler.input_fills._matches_at).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from paths import FIXTURES

sys.path.insert(0, str(Path(__file__).parent))
from replayed import check_every_step_tied, check_fills, check_served, compile_replayed, unpack  # noqa: E402


FIX = FIXTURES / "compile"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_replayed("q3v", tmp_path_factory.mktemp("q3v"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return unpack("q3v", tmp_path_factory.mktemp("q3v_files"))


def test_verified_by_both_and_a_one_sequence_host_can_serve_it(compiled):
    check_served(*compiled)


def test_every_fill_is_named_once_with_its_width(compiled):
    check_fills(compiled[0].manifest)


def test_serving_forwards_take_every_step_in_order(files):
    check_every_step_tied("q3v", files)
