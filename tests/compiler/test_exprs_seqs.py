"""The compiler and the sequences variable (compiler/exprs.py): a field the analysis fits with the
step's sequences is refused with one sentence naming both variables; the manifest this compiler
writes declares `rows` (the tokens) only.

Why: q2b (vLLM serving batches) used to be refused for a form of the tokens the capture did not
pin; the analysis now says that field follows the sequences, which a `rows`-only manifest cannot
express. A capture without a `seqs` variable compiles as before (test_compile.py).
"""

from __future__ import annotations

import pytest

from compiler.compile import compile_dump
from compiler.errors import CompileError
from dumpsim_batched import BATCHED, SINGLE, simulate
from paths import FIXTURES


def test_q2b_refusal_names_tokens_and_sequences():
    with pytest.raises(CompileError) as exc:
        compile_dump(FIXTURES / "batched" / "q2b.tar.xz", cache=False)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "seqs" in msg and "tokens" in msg and "no var for the sequences" in msg, msg


def test_simulated_batch_is_refused_on_a_sequence_field(tmp_path):
    """Planted: the staging kernel's grid is seqs + 1, the first field that varies."""
    simulate(tmp_path / "b", BATCHED)
    with pytest.raises(CompileError, match="stage_kernel.*follows the sequences.*add\\(seqs, 1\\)"):
        compile_dump(tmp_path / "b", cache=False)


def test_one_sequence_sim_never_mentions_sequences(tmp_path):
    """No seqs variable: whatever the compiler says, it is not about sequences."""
    simulate(tmp_path / "s", SINGLE)
    try:
        compile_dump(tmp_path / "s", cache=False)
    except CompileError as exc:
        assert "sequences" not in str(exc)
