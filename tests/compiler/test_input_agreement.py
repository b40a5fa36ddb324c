"""An input named by agreement over forwards (compiler.input_fills): a one-token decode's token id
or position is a `weak` match in any one forward (one small integer may equal anything), but the
same buffer following the steps' changing values over several forwards is named. Unit cases on
hand-made arrays (the fill matchers themselves are tests/compiler/test_inputs.py's) and the
replayed-bytes source on a real capture."""

from __future__ import annotations

import numpy as np
import pytest

from compiler import fills
from compiler.buffers import Decl
from compiler.input_fills import AGREE, _agreed, assign
from compiler.inputs import Array, ForwardInputs, Reader


class _S:
    def __init__(self, forward):
        self.forward = forward


class _P:
    def __init__(self, forwards):
        self.samples = [_S(f) for f in forwards]


def _fwds(values, fill="token", sure="weak", source="replay", addr=0x1000):
    out = []
    for k, v in enumerate(values):
        fi = ForwardInputs(k, "serve", 1, 100 * k, 100 * k + 50)
        a = Array(source, 100 * k, addr, 8, "embed param 1@0", np.int64(v).tobytes(), [Reader(100 * k, "embed", 1, 0, 0)])
        a.matches = [fills.Match(fill, "i64", sure, "planted", 1, True)]
        fi.arrays.append(a)
        out.append(fi)
    return out


def _decl(addr=0x1000):
    return {"in.0": Decl("in.0", "input", 8, addr, 0, "planted")}


@pytest.mark.parametrize("values,named", [
    ([5, 9, 13, 2], True),                 # one fill, changing values, four forwards
    ([5] * 4, False),                      # the same value every forward: nothing follows
    ([5, 9][: AGREE - 1], False),          # too few forwards
])
def test_weak_matches_agreeing_over_forwards_name_the_input(values, named):
    decls = _decl()
    out = assign(decls, [_P(range(len(values)))], _fwds(values))
    assert (out[0].fill == "token") == named and (decls["in.0"].fill == "token") == named


def test_two_weak_fills_name_nothing():
    fw = _fwds([5, 9, 13, 2])
    fw[1].arrays[0].matches = [fills.Match("position", "i64", "weak", "planted", 1, True)]
    decls = _decl()
    assert assign(decls, [_P(range(4))], fw)[0].fill is None


def test_agreement_needs_one_unambiguous_fill():
    assert _agreed({("token", "i64"): {0: b"a", 1: b"b", 2: b"c"}}) == (("token", "i64"), 3, 3)
    assert _agreed({("token", "i64"): {0: b"a", 1: b"b"}}) is None
    assert _agreed({("token", "i64"): {0: b"a", 1: b"b", 2: b"c"}, ("position", "i64"): {3: b"d"}}) is None


def test_replayed_bytes_join_the_forward_that_reads_them():
    """vocab.contents words become `replay` arrays of the forward holding their launch, at the
    word's captured address, with its allocation (q2r: a real capture)."""
    from compiler import inputs
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from paths import FIXTURES
    from vocab.contents import Contents, Word

    d = load_dump(FIXTURES / "replay" / "q2r.tar.xz", cache=False)
    doc = document(analyze(d))
    fwds = inputs.collect(d, doc)
    f = next(fi for fi in fwds if fi.tokens == 1 and fi.phase == "serve")
    P = d.params
    w = P[(P["seq"] == f.first) & P["is_ptr"] & (P["buffer_id"] >= 0)].iloc[0]
    before = len(f.arrays)
    inputs.add_replayed(d, fwds, Contents(len(d.launches), (f.first, f.last), 64,
                                          [Word(f.first, f.first, int(w["i"]), int(w["at"]), int(w["value"]), b"\x01" * 8),
                                           Word(0, 10 ** 9, 0, 0, 0x10, b"\x02")]))   # no forward holds it: dropped
    got = f.arrays[before:]
    assert len(got) == 1 and got[0].source == "replay" and got[0].dst == int(w["value"])
    assert got[0].alloc == (int(w["alloc_base"]), int(w["value"]) - int(w["alloc_base"]))
    assert got[0].readers[0].seq == f.first


def test_a_truth_of_sequential_requests_is_one_request_per_group():
    """examples/vllm_qwen3/run_suite.py without --batches sends its requests one after the other and
    writes `{"requests": [...]}`: no step of the hypothesis mixes two of them (q2r's truth)."""
    import json

    from compiler.requests import read_requests
    from paths import FIXTURES

    path = FIXTURES / "replay" / "q2r.truth.json"
    reqs = read_requests(path)
    truth = json.loads(path.read_text())["requests"]
    assert all(len(s.runs) == 1 for s in reqs.steps)
    assert len(reqs.steps) == sum(len(r["output"]) for r in truth)     # a prefill, then one step per later token
    assert [s.tokens for s in reqs.steps if s.prefill] == [len(r["prompt"]) for r in truth]


def test_a_padded_offsets_array_is_cu_seqlens():
    """An engine's fixed-capacity query offsets (vLLM pads query_start_loc with its last value)."""
    from compiler.requests import Run, Step

    two = Step(0, (Run(0, 0, (5, 6, 7)), Run(1, 0, (8, 9, 10, 11, 12))))
    m = fills.match(np.array([0, 3, 8, 8, 8, 8], np.int32).tobytes(), two)
    assert m and m[0].fill == "cu_seqlens" and m[0].sure == "exact" and m[0].dtype == "i32"
    one = Step(1, (Run(0, 3, (7,)),))
    m = fills.match(np.array([0, 1, 1, 1], np.int32).tobytes(), one)
    assert m and m[0].fill == "cu_seqlens" and m[0].sure == "weak"     # an arange any one-token step has
    assert not any(x.fill == "cu_seqlens" for x in fills.match(np.array([0, 3, 8, 9], np.int32).tobytes(), two))


def test_decode_forwards_take_their_steps_by_order():
    """q2r: the prompt forwards are tied to their steps by exact copies; the decode forwards between
    them, which no array ties to a step, take the steps between in order (token counts equal)."""
    from compiler import inputs
    from compiler.requests import read_requests
    from mining.analyze import analyze, document
    from mining.load import load_dump
    from paths import FIXTURES

    d = load_dump(FIXTURES / "replay" / "q2r.tar.xz", cache=False)
    fwds = inputs.collect(d, document(analyze(d)))
    reqs = read_requests(FIXTURES / "replay" / "q2r.truth.json")
    inputs.name(fwds, reqs)
    serve = [fi for fi in fwds if fi.phase == "serve"]
    assert [fi.step.index for fi in serve] == list(range(len(reqs.steps)))
    assert all(fi.step.tokens == fi.tokens for fi in serve)
    # a one-token step (a decode, or a one-token prompt) is tied by order or by its position and
    # length agreeing, one value each; a longer prompt by its exact arrays
    assert [("by order" in fi.step_because or "one-value arrays" in fi.step_because) for fi in serve] == \
        [s.tokens == 1 for s in reqs.steps]
    assert any("by order" in fi.step_because for fi in serve)


def _decode_forward(k, arrays):
    fi = ForwardInputs(100 + k, "serve", 1, 1000 * k, 1000 * k + 99)
    for j, vals in enumerate(arrays):
        data = np.array(vals, np.int64).tobytes()
        fi.arrays.append(Array("replay", 1000 * k + j, 0x5000 + 0x100 * j, len(data), f"k param {j}@0", data))
    return fi


@pytest.mark.parametrize("ctx", [5, 40, 163, 1000])
def test_one_sequence_decodes_tie_by_position_and_length_together(ctx):
    """A one-sequence decode's position and length are one value each (weak alone: any buffer's
    first word may equal one); a forward showing both, in different arrays, takes their step, and
    a forward showing one of them only takes none from its own arrays."""
    from compiler import inputs
    from compiler.requests import Request, steps

    reqs = [Request(tuple(range(1, ctx + 1)), (7, 8, 9, 10))]
    st = steps(reqs)                      # prefill, then 3 decodes at positions ctx .. ctx + 2
    both = [_decode_forward(k, [[ctx + k, 0, 0], [ctx + k + 1, 0, 0]]) for k in range(3)]
    inputs.tie(both, st)
    assert [fi.step.index for fi in both] == [1, 2, 3]
    assert all("one-value arrays" in fi.step_because for fi in both)
    alone = [_decode_forward(k, [[ctx + k, 0, 0]]) for k in range(3)]
    inputs.tie(alone, st)
    assert all(fi.step is None for fi in alone)
    # the same value twice (two copies of one position) is one fill, not two
    twice = [_decode_forward(0, [[ctx, 0, 0], [ctx, 0, 0]])]
    inputs.tie(twice, st)
    assert twice[0].step is None


def _copy_forward(k, tokens, arrays, source="copy"):
    fi = ForwardInputs(200 + k, "serve", tokens, 1000 * k, 1000 * k + 99)
    for j, (dtype, vals) in enumerate(arrays):
        data = np.array(vals, dtype).tobytes()
        fi.arrays.append(Array(source, 1000 * k + j, 0x9000 + 0x1000 * j, len(data), "before", data))
    return fi


@pytest.mark.parametrize("long,short", [(163, 5), (40, 3), (700, 12)])
def test_an_array_equal_to_two_steps_tells_neither_and_the_stretch_pairs_by_order(long, short):
    """Two one-sequence requests, prompts of `long` and `short` tokens, 4 new tokens each. A decode's
    4-byte length copy equals the next step's position (one value for two steps); a decode whose
    replayed position buffer still holds the long prompt's arange holds the short prompt's
    positions as its prefix. Neither may tie a forward (q3zd: both did, to the wrong steps); the
    prompts' token copies tie the prefills, and the decodes between pair by order."""
    from compiler import inputs
    from compiler.requests import Request, steps

    a, b = tuple(range(1, long + 1)), tuple(range(1000, 1000 + short))
    st = steps([Request(a, (7, 8, 9, 10), 0), Request(b, (11, 12, 13, 14), 1)])   # 0: prefill, 1-3, 4: prefill, 5-7
    fw = [_copy_forward(0, long, [(np.int32, a)])]
    for k in range(3):                                    # request a's decodes: length after step k
        fw.append(_copy_forward(1 + k, 1, [(np.int32, [long + k + 1])]))
    fw[1].arrays += _copy_forward(0, 1, [(np.int64, list(range(long)))], source="replay").arrays
    fw.append(_copy_forward(4, short, [(np.int32, b)]))
    for k in range(3):
        fw.append(_copy_forward(5 + k, 1, [(np.int32, [short + k + 1])]))
    assert inputs._telling(fw[1].arrays[0], st) is None            # step 1's length is step 2's position
    assert inputs._telling(fw[1].arrays[1], st)[0].index == 0         # the stale arange is the long prompt's
    inputs.tie(fw, st)
    assert [fi.step.index for fi in fw] == list(range(8))
    assert all(fw[k].step_because.startswith("by order") for k in (1, 2))
    assert not any(fw[k].step_because.startswith("by order") for k in (0, 4))
