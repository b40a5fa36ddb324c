"""q3zd: q3z's engine and checkpoint again (vLLM 0.26 default mode, 4 layers, hidden 512; prompts of
163 and 5 tokens), captured on an H100 on 2026-12-06 with device-to-device copies and memsets
logged (copies.jsonl `op`) and each captured graph's nodes by type (tests/gpu_results/session16).

What q3z could not show: vLLM's decode graph ends with a copy of the last hidden states into a
static output buffer, which the eager logits gather after the replay reads. Unrecorded (q3z), the
gather read an input nobody fills (zeros on kern: token 0 at every step). Recorded, every node of
every replayed graph is accounted for, and the compile aliases the copy away: the gather reads
the graph's own workspace, written by the final norm."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kern_verdicts import accepted_by_both


sys.path.insert(0, str(Path(__file__).parent))
from replayed import FIX, check_every_step_tied, compile_replayed, unpack  # noqa: E402


@pytest.fixture(scope="module")
def q3zd(tmp_path_factory):
    return compile_replayed("q3zd", tmp_path_factory.mktemp("q3zd"))


def _bufs(m: dict, call: dict, *dirs: str) -> list[str]:
    """The buffers a call passes to parameters of the given directions (in, out, inout)."""
    params = m["ops"][call["op"]]["params"]
    return [a["buf"] for a, p in zip(call["args"], params) if isinstance(a, dict) and "buf" in a
            and str(p.get("type", p) if isinstance(p, dict) else p).split()[0] in dirs]


def test_both_verifiers_accept(q3zd):
    res, out = q3zd
    accepted_by_both(res, out)


def test_every_node_of_every_replayed_graph_is_recorded_and_the_copies_are_placed(q3zd):
    res, _ = q3zd
    assert not [n for n in res.notes if "does not record" in n], res.notes
    assert any("device-to-device copies" in n and "read the copies' sources" in n and not n.startswith(
        "decode forwards: 1 device-to-device copies: 0") for n in res.notes if n.startswith("decode"))


def test_the_logits_gather_reads_what_the_graph_wrote_not_an_unfilled_input(q3zd):
    res, _ = q3zd
    m = res.manifest
    calls = m["programs"]["decode"]["calls"]
    gemm = calls[-1]                       # the logits (the program ends at the vocabulary GEMM)
    assert gemm["label"].endswith(".gemm")
    gather = calls[-2]
    bufs = m["buffers"]
    hidden = [b for b in _bufs(m, gather, "in", "inout") if bufs[b]["kind"] == "workspace"]
    assert hidden, _bufs(m, gather, "in", "inout")
    earlier = set().union(*(_bufs(m, c, "out", "inout") for c in calls[:-2]))
    assert set(hidden) <= earlier
    # no bf16 input as large as a hidden-state buffer is left for kern to fill with zeros
    big = [n for n, b in bufs.items() if b["kind"] == "input" and not b.get("fill") and b["dtype"] == "bf16"
           and b["shape"][0] * 2 >= 512 * 1024]
    assert big == []


def test_the_fixture_holds_device_copies_inside_graphs():
    from mining.load import load_dump
    d = load_dump(FIX / "q3zd.tar.xz", cache=False)
    ops = d.device_ops
    assert set(d.copies["op"]) == {"htod"}
    assert (ops["op"] == "dtod").any() and (ops["op"] == "memset").any()
    assert (ops["in_graph"] & (ops["op"] == "dtod")).sum() >= 1 and not ops["has_bytes"].any()


def test_every_serving_forward_takes_its_step(tmp_path):
    """Two one-sequence requests (prompts of 163 and 5 tokens, 8 new tokens each): 16 steps. A
    decode's 4-byte length copy is also the next step's position, and the first decode's replayed
    position buffer still holds the 163-token prompt's arange; before they counted for neither
    step they tied forwards 106, 112 and 113 to steps 8, 9 and 14."""
    check_every_step_tied("q3zd", unpack("q3zd", tmp_path))
