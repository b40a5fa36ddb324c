"""K3 generator: structure of the whole prefill manifest, the 8 cut stages and the DCP decode manifest."""

from __future__ import annotations

import json
import re

import pytest

from generators.k3 import config, decode, layout, prefill
from generators.k3.build import UnpinnedKernel, dumps
from manifests.cut import cut, resolve_labels
from manifests.kernels import MissingKernel, load_kernels
from manifests.verify import verify
from paths import ROOT

CFG = config.load()
TABLE = load_kernels(ROOT / "kernels.toml")
LAYER = re.compile(r"^l(\d+)\.")


def layers_of(m, program):
    return sorted({int(LAYER.match(c["label"]).group(1)) for c in m["programs"][program]["calls"]
                   if LAYER.match(c.get("label", ""))})


def stages_for(experts):
    whole = prefill.generate(CFG, TABLE, experts)
    at = resolve_labels(whole, [f"l{a}.res_in" for a, _ in layout.stage_bounds(CFG, 8)[1:]])
    return whole, cut(whole, at)


@pytest.fixture(scope="module")
def p224():
    return stages_for(224)


@pytest.fixture(scope="module")
def d896():
    return decode.generate(CFG, TABLE, 896)


def test_config_pattern():
    assert len(CFG.mla_layers()) == 24 and len(CFG.kda_layers()) == 69
    assert CFG.mla_layers()[:3] == [3, 7, 11] and CFG.mla_layers()[-2:] == [91, 92]
    assert layout.kv_bytes_per_token(CFG) == 1152
    assert layout.kda_line_bytes(CFG) == 6_512_640
    assert layout.kda_line_bytes(CFG, 12) == 814_080
    assert layout.expert_bytes(CFG) == 17_547_264


def test_whole_prefill_structure(p224):
    whole, _ = p224
    assert verify(whole) == []
    assert layers_of(whole, "prefill") == list(range(93))
    kv = [s for s in whole["states"] if s.startswith("kv.")]
    kda = [s for s in whole["states"] if s.startswith("kda.")]
    assert len(kv) == 24 and len(kda) == 69
    assert all(whole["states"][s] == {"bytes_per_token": 1152} for s in kv)
    assert all(whole["states"][s] == {"bytes_per_seq": 6_512_640} for s in kda)


def test_stages_split_and_states(p224):
    _, stages = p224
    assert len(stages) == 8
    counts = []
    for s, st in enumerate(stages):
        assert verify(st) == []
        assert st["cut"]["stage"] == s and st["cut"]["stages"] == 8
        ls = layers_of(st, "prefill")
        counts.append(len(ls))
        assert ls == list(range(12 * s, min(12 * s + 12, 93)))
        kv = sorted(int(k[3:]) for k in st["states"] if k.startswith("kv."))
        kda = sorted(int(k[4:]) for k in st["states"] if k.startswith("kda."))
        assert kv == [i for i in ls if CFG.is_mla(i)] and kda == [i for i in ls if not CFG.is_mla(i)]
        assert sum(v.get("bytes_per_token", 0) for v in st["states"].values()) == 1152 * len(kv)
        assert sum(v.get("bytes_per_seq", 0) for v in st["states"].values()) == 6_512_640 * len(kda)
        assert (len(kv), len(kda)) == ((3, 9) if s < 7 else (3, 6))
    assert counts == [12] * 7 + [9]


def test_stage_boundaries_carry_hidden_and_bank(p224):
    _, stages = p224
    for s, st in enumerate(stages):
        b = st["buffers"]
        arriving = {k for k, v in b.items() if v["kind"] in ("inout", "input") and v.get("export")}
        passed = {k for k, v in b.items() if v["kind"] in ("inout", "output")}
        assert arriving == (set() if s == 0 else {"hidden", "blocks"})
        # a middle stage receives and forwards the stream and the bank (inout); the first emits them
        assert passed == ({"hidden", "blocks", "next_token"} if s == 7 else {"hidden", "blocks"})
        assert b["next_token"]["kind"] == "output" if s == 7 else all(b[k]["kind"] == ("output" if s == 0 else "inout")
                                                                     for k in ("hidden", "blocks"))
        assert ("embed" in b) == (s == 0) and ("out.lm_head" in b) == (s == 7)


def test_decode_sharding(d896):
    m = d896
    assert verify(m) == []
    assert m["topology"] == {"groups": {"tp": 8}}
    assert layers_of(m, "decode") == list(range(93))
    kda = {k: v for k, v in m["states"].items() if k.startswith("kda.")}
    assert len(kda) == 69 and all(v["bytes_per_seq"] == 814_080 for v in kda.values())
    assert all(v["shard"] == {"group": "tp", "by": "heads", "segments": [[1, 6_291_456], [9, 24_576]]}
               for v in kda.values())
    kv = [v for k, v in m["states"].items() if k.startswith("kv.")]
    assert len(kv) == 24 and all(v["shard"] == {"group": "tp", "by": "position"} for v in kv)
    segs = m["buffers"]["l5.w2.raw"]["bind"]
    assert m["buffers"]["l5.w2.raw"]["shape"][0] == 112 and len(segs) == 112
    for j, seg in enumerate(segs):
        names = seg["tensor"]["tensors"]
        assert [int(re.search(r"experts\.(\d+)\.", n).group(1)) for n in names] == [j * 8 + r for r in range(8)]


def test_deterministic_and_versioned():
    a = dumps(decode.generate(CFG, TABLE, 224))
    b = dumps(decode.generate(CFG, TABLE, 224))
    assert a == b
    assert "mine.generators.k3" in json.loads(a)["model"]


class _Without:
    def __init__(self, table, missing):
        self.table, self.missing = table, missing

    def op_launch(self, module, entry):
        if module == self.missing:
            raise MissingKernel(module)
        return self.table.op_launch(module, entry)

    def module_ref(self, module):
        return self.table.module_ref(module)


def test_refuses_unpinned_kernel():
    with pytest.raises(UnpinnedKernel, match="k3_kda_rec"):
        prefill.generate(CFG, _Without(TABLE, "k3_kda_rec"), 224)
    with pytest.raises(UnpinnedKernel, match=r"k3_router_argmax\+EXPERTS=896"):
        decode.generate(CFG, _Without(TABLE, "k3_router_argmax+EXPERTS=896"), 896)


@pytest.mark.slow
def test_all_nine_896(tmp_path):
    """The nine 896-expert manifests are written; their time is measured in docs/benchmarks.md
    ("K3 generation"), not asserted here."""
    from generators.k3.generate import write_decode, write_prefill

    paths = write_prefill(CFG, TABLE, tmp_path, 8, 896, 8192, 16, 262144)
    paths.append(write_decode(CFG, TABLE, tmp_path, 896, 8, 262144))
    assert [p.name for p in paths] == [f"stage{s}.json" for s in range(8)] + ["d.json"]
