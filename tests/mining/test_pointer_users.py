"""The KV pool's two users (mining/pointers.py): two kernels of a layer in one forward.

Why: a library that picks a GEMM kernel per token count (cuBLASLt's nvjet builds), or a CUDA
graph captured per batch size, reads one weight from a different kernel in different forwards;
counted over the whole capture those builds looked like a writer and a reader sharing a region,
and the weight was called kv_pool. A planted pointer table with known truth (a weight read by two
builds in two forwards, a KV region written and read by two kernels in one forward, both per layer
and large), then the real captures: no GEMM weight operand the compiler binds is kv_pool, and the
roles of the other kernels' words are what the truth checks of tests/mining/test_sglang_truth.py
and test_truth_suite.py hold (KV at one stride in every layer).
"""

from __future__ import annotations

import pandas as pd
import pytest
from paths import FIXTURES

from mining.pointers import classify

MiB = 1 << 20


def _rows(forward: int, layer: int, site: str, symbol: str, i: int, value: int, seq: int) -> dict:
    return {"seq": seq, "i": i, "at": 0, "is_ptr": True, "value": value, "buffer_id": 10 + layer,
            "alloc_base": value, "alloc_size": 64 * MiB, "ptr_off": 0, "forward": forward, "site": site,
            "symbol": symbol}


def _planted(layers: int = 3):
    """Per layer: a GEMM weight read by build A in forward 0 and build B in forward 1 (one call
    site per build), and a KV region written by `store` and read by `attn` in both forwards."""
    rows, index, seq = [], [], 0
    for layer in range(layers):
        w, kv = (1 << 40) + layer * 256 * MiB, (1 << 41) + layer * 256 * MiB
        for site, sym, pos in ((f"gemm_a#{layer}", "gemm_a", 0), (f"gemm_b#{layer}", "gemm_b", 0),
                               (f"store#{layer}", "store", 1), (f"attn#{layer}", "attn", 2)):
            index.append({"site": site, "layer": layer, "pos": pos, "first_seq": 100 * layer + pos})
        for f in (0, 1):
            seq += 1
            gemm = "gemm_a" if f == 0 else "gemm_b"
            rows.append(_rows(f, layer, f"{gemm}#{layer}", gemm, 1, w, seq))
            rows.append(_rows(f, layer, f"store#{layer}", "store", 2, kv, seq + 1000))
            rows.append(_rows(f, layer, f"attn#{layer}", "attn", 1, kv, seq + 2000))
    return pd.DataFrame(rows), pd.DataFrame(index)


def test_two_builds_of_one_gemm_in_two_forwards_read_a_weight():
    p, index = _planted()
    ptrs, strides = classify(p, index)
    role = {(s, int(i)): r for s, i, r in zip(ptrs["site"], ptrs["i"], ptrs["role"])}
    for layer in range(3):
        assert role[(f"store#{layer}", 2)] == role[(f"attn#{layer}", 1)] == "kv_pool"
    # gemm_a ran in forward 0 only and gemm_b in forward 1 only: a site of one forward is no
    # pointer in the other, so the forward count the role reads is per site
    assert {role[(f"gemm_{b}#{layer}", 1)] for b in "ab" for layer in range(3)} == {"weight"}
    kv = strides[strides["role"] == "kv_pool"]
    assert set(kv["stride"]) == {256 * MiB} and (kv["layers"] == 3).all()


def test_two_kernels_of_one_forward_sharing_a_weight_sized_region_stay_kv_pool():
    """The rule counts kernels inside one forward: the same two GEMM builds reading one address in
    the *same* forward are two users (what the capture shows cannot tell them from a writer and a
    reader), so the per-forward count is what changed, not a rule about GEMMs."""
    p, index = _planted()
    both = p[p["symbol"] == "gemm_b"].assign(forward=0, seq=lambda d: d["seq"] + 5000)
    ptrs, _ = classify(pd.concat([p, both], ignore_index=True), index)
    role = {(s, int(i)): r for s, i, r in zip(ptrs["site"], ptrs["i"], ptrs["role"])}
    assert role[("gemm_a#0", 1)] == "kv_pool"


@pytest.mark.parametrize("case", [("sglang", "sglang_eager"), ("sglang", "sglang_graph"), ("vllm", "vllm-offline")])
def test_no_gemm_weight_operand_is_kv_pool_on_real_captures(case):
    from compiler.compile import compile_capture
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(FIXTURES / case[0] / f"{case[1]}.tar.xz")
    a = analyze(dump)
    res = compile_capture(dump, document(a))
    pt = a.pointers
    weights = set()
    for prog, p in res.provenance["programs"].items():
        for c in p["calls"]:
            if c["gemm"] is not None:
                weights |= {(c["site"], w["param"], w["at"]) for w in c["words"] if w["to"][1].startswith("w.")}
    assert weights
    got = {(s, int(i), int(at)): r for s, i, at, r in zip(pt["site"], pt["i"], pt["at"], pt["role"])}
    roles = {got[k] for k in weights if k in got}
    assert "kv_pool" not in roles and "weight" in roles
