"""K3 decode at TP8/EP8 without decode-context parallelism (`mine gen k3 --decode --tp 8`, no --dcp).

The plain form needs one kernel kernels.toml does not pin (`k3_mla_vup_gate`: W_UV + output gate for
a member's heads from its own, complete attention output), so with the real table the generator
stops and names it. Everything else about the form is pinned here through `StandIn`, a test-only
wrapper that answers for that one module with a placeholder launch and an all-zero sha256; it is
not a pin, nothing it produces is written to manifests/, and it goes once kernels.toml has the entry.

Also pinned: the DCP form is byte-identical to its output before the plain form was added.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest

from generators.k3 import config, decode, layout
from generators.k3.build import UnpinnedKernel, dumps
from generators.k3.memory import rank_memory
from manifests.verify import verify
from manifests.kernels import load_kernels
from paths import ROOT

CFG = config.load()
TABLE = load_kernels(ROOT / "kernels.toml")
LAYER = re.compile(r"^l(\d+)\.")
MISSING = "k3_mla_vup_gate"
# sha256 of decode.generate(CFG, TABLE, E) (the DCP form) at the commit before the plain form existed,
# taken again when the all-reduces became kern's four-argument [send, recv, count, rank] call
DCP_SHA = {224: "2fb68a65207f7a05034165a47f4540332b6829b0c570630f6ceb2873278bd0d5",
           896: "5a30874f6d8f5749e025319dd11681ad399de16487b69e6a797db1666ecd7ce6"}


class StandIn:
    """The real kernel table, plus a placeholder for the one unpinned module (tests only)."""

    def __init__(self, table):
        self.table = table

    def op_launch(self, module, entry):
        if module == MISSING:
            return {"module": module, "entry": entry, "block": [256, 1, 1], "grid": ["rows", 12, 1],
                    "params": ["in buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32"]}
        return self.table.op_launch(module, entry)

    def module_ref(self, module):
        if module == MISSING:
            return {"source": f"{MISSING}.cubin", "sha256": "0" * 64}
        return self.table.module_ref(module)


@pytest.fixture(scope="module", params=[224, 896])
def pair(request):
    e = request.param
    return e, decode.generate(CFG, StandIn(TABLE), e, dcp=False), decode.generate(CFG, TABLE, e)


def test_plain_form_stops_naming_the_unpinned_kernel(tmp_path):
    with pytest.raises(UnpinnedKernel, match=rf"`{MISSING}` \(entry `mla_vup_gate`\)"):
        decode.generate(CFG, TABLE, 896, dcp=False)
    r = subprocess.run([sys.executable, "-m", "mine.cli", "gen", "k3", "--decode", "--tp", "8", "--experts", "224",
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and MISSING in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d.json").exists()


@pytest.mark.parametrize("experts", [224, 896])
def test_dcp_form_unchanged(experts):
    text = dumps(decode.generate(CFG, TABLE, experts))
    assert hashlib.sha256(text.encode()).hexdigest() == DCP_SHA[experts]
    if experts == 224:
        assert text == (ROOT / "manifests" / "k3" / "224" / "d.json").read_text()


def test_plain_structure(pair):
    e, m, dcp = pair
    assert verify(m) == []
    assert m["topology"] == {"groups": {"tp": 8}} and "-dcp" not in m["model"]
    calls = m["programs"]["decode"]["calls"]
    assert sorted({int(LAYER.match(c["label"]).group(1)) for c in calls if LAYER.match(c["label"])}) == list(range(93))
    kv = {k: v for k, v in m["states"].items() if k.startswith("kv.")}
    kda = {k: v for k, v in m["states"].items() if k.startswith("kda.")}
    assert len(kv) == 24 and len(kda) == 69 and len(m["states"]) == 93
    # MLA latent: every member holds every token (1,152 B per token per MLA layer), not dealt by position
    assert all(v == {"bytes_per_token": 1152} for v in kv.values())
    assert all(v == {"bytes_per_token": 1152, "shard": {"group": "tp", "by": "position"}}
               for k, v in dcp["states"].items() if k.startswith("kv."))
    # KDA: the same 12-head line as DCP
    assert kda == {k: v for k, v in dcp["states"].items() if k.startswith("kda.")}
    assert all(v["bytes_per_seq"] == 814_080 == layout.kda_line_bytes(CFG, 12) for v in kda.values())
    # the page table spans the whole context (DCP: the member's eighth of it)
    assert m["buffers"]["block_table"]["shape"] == ["seqs", 262144 // 64]
    assert dcp["buffers"]["block_table"]["shape"] == ["seqs", 262144 // 8 // 64]
    assert m["buffers"]["seq_lens"]["domain"]["min"] == 1
    # experts dealt round-robin: member r holds r, r+8, ...
    segs = m["buffers"]["l5.w2.raw"]["bind"]
    assert m["buffers"]["l5.w2.raw"]["shape"][0] == e // 8 == len(segs)
    for j, seg in enumerate(segs):
        ids = [int(re.search(r"experts\.(\d+)\.", n).group(1)) for n in seg["tensor"]["tensors"]]
        assert ids == [j * 8 + r for r in range(8)]
    assert m["buffers"] == {**{k: v for k, v in dcp["buffers"].items() if k != "mla.parts"},
                            "block_table": m["buffers"]["block_table"], "seq_lens": m["buffers"]["seq_lens"]}


def test_plain_mla_calls(pair):
    _, m, dcp = pair
    ops = {c["op"] for c in m["programs"]["decode"]["calls"]}
    assert "allgather" not in ops and "dcp_merge" not in ops and "vup_gate" in ops
    assert "allgather" not in m["ops"] and "dcp_merge" not in m["ops"] and "mla.parts" not in m["buffers"]
    plain = [c["label"] for c in m["programs"]["decode"]["calls"]]
    # the same call list as DCP but for the exchange: gather + merge -> the member's own W_UV + gate
    swapped = []
    for c in dcp["programs"]["decode"]["calls"]:
        if c["label"].endswith(".dcp_gather"):
            continue
        swapped.append(c["label"].replace(".dcp_merge", ".vup_gate"))
    assert plain == swapped
    for i in CFG.mla_layers():
        seq = [c for c in m["programs"]["decode"]["calls"] if c["label"].startswith(f"l{i}.")]
        steps = [c["label"].split(".", 1)[1] for c in seq]
        at = steps.index("attn")
        assert steps[at:at + 4] == ["attn", "vup_gate", "o_proj", "ar_attn"]
        assert seq[at]["args"][1] == {"state": f"kv.{i}"}
    assert m["programs"]["load"] == dcp["programs"]["load"] and m["programs"]["derive"] == dcp["programs"]["derive"]


def test_plain_memory(pair):
    e, m, dcp = pair
    r, rd = rank_memory(m), rank_memory(dcp)
    # per rank: 24 MLA layers x 1,152 B for every token of the batch; DCP holds an eighth of the positions
    assert r["state_bytes_per_token"] == 24 * 1152 == rd["state_bytes_per_token"]
    assert r["position_group"] == 1 and rd["position_group"] == 8
    per_layer = {"plain": layout.kv_bytes_per_token(CFG) // r["position_group"],
                 "dcp": layout.kv_bytes_per_token(CFG) // rd["position_group"]}  # per group token, per rank
    assert per_layer == {"plain": 1152, "dcp": 144}
    assert r["kv_tokens_per_group"] == r["kv_tokens_per_rank"]
    assert r["state_bytes_per_seq"] == 69 * 814_080 and r["seq_slots"] == 66
    for kind in ("weight", "carry", "source"):
        assert r["by_kind"][kind] == rd["by_kind"][kind]
    parts = 8 * 64 * 96 * (512 + 1) * 4  # DCP's gathered partials [tp, tokens, heads*(latent+lse)] f32
    assert rd["by_kind"]["workspace"] - r["by_kind"]["workspace"] == parts
    assert r["kv_tokens_per_rank"] == (r["hbm"] - r["reserve"] - r["held"]) // (24 * 1152)
    # a plain rank fits a few more tokens (no partials workspace), but a group holds ~1/8 of DCP's
    assert r["kv_tokens_per_rank"] >= rd["kv_tokens_per_rank"] and rd["kv_tokens_per_group"] == 8 * rd["kv_tokens_per_rank"]
    assert 7 * r["kv_tokens_per_group"] < rd["kv_tokens_per_group"] < 8 * r["kv_tokens_per_group"]
    if e == 896:
        assert 2_000_000 < r["kv_tokens_per_rank"] < 3_000_000  # ~66 GiB free / 27,648 B at 274.2 GiB HBM


@pytest.mark.slow
@pytest.mark.parametrize("experts", [224, 896])
def test_kern_llm_accepts_plain_structure(experts, tmp_path):
    pytest.importorskip("kern")
    p = tmp_path / "d.json"
    p.write_text(dumps(decode.generate(CFG, StandIn(TABLE), experts, dcp=False)))
    r = subprocess.run([sys.executable, "-m", "manifests.kern_oracle", str(p)], capture_output=True, text=True,
                       cwd=ROOT)
    # checked as rank 0 of its topology (manifests/kern_oracle.py), it passes every check and
    # stops only at loading libcuda
    assert r.stdout.startswith("ACCEPTED") and "cuda" in r.stdout, r.stdout[:500]
