"""`mine compile` on SGLang's captures (issue 21): eager and CUDA-graph mode, struct-heavy ABIs.

The fixtures are SGLang 0.5.17 serving a seeded Qwen3 of the q3d geometry on an H200, without and
with CUDA graphs (tests/gpu_results/sglang/README.txt). What is checked, against the capture and
its truth file rather than against remembered outputs:

- both compile; our verifier and kern-llm's CPU verification accept the manifests; the offline ABI
  check over the dump's cubins finds nothing (modules held by hash only aside);
- graph mode's decode is a `graph: true` program at one row whose every value is a constant, built
  from the replays of one CUDA graph; provenance `graphs` says the other decode batch sizes'
  graphs (the truth's `cuda_graph_config`) were never replayed, so no program holds them;
- the decode program's calls are the kernels of the engine's decode forwards in launch order
  (read from the analysis' forwards and the dump's launch records: a cuBLASLt launch and its
  split-K reduction are one GEMM), with the grids of the forward it was laid out from;
- every pointer field of a by-value struct lands on a buffer of its class: the KV pool's words
  (analysis role kv_pool) on states, weights' words on weight buffers, a GEMM's activation
  operand never on a weight; the GEMMs' weight operands are the checkpoint geometry's
  projections (from the truth's geometry) on weight buffers;
- small by-value params (FillFunctor<BFloat16>'s 2-byte fill value, not kept as hex by the
  frames) pack their record's bytes, on the real graph capture and on a simulated dump with a
  planted 2-byte param.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from paths import FIXTURES

from compiler.compile import compile_capture, write
from compiler.launches import read_launches
from manifests.abi import check_abi
from manifests.kern_oracle import quiet_stderr, verdict
from manifests.verify import verify
from kern_verdicts import kern_violations

SG = FIXTURES / "sglang"
MODES = ["sglang_eager", "sglang_graph"]


@lru_cache(maxsize=None)
def _analysed(name: str):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(SG / f"{name}.tar.xz")
    a = analyze(dump)
    return dump, a, document(a)


@lru_cache(maxsize=None)
def _compiled(name: str):
    dump, _, doc = _analysed(name)
    return compile_capture(dump, doc, label="test")


def _truth(name: str) -> dict:
    return json.loads((SG / f"{name}.truth.json").read_text())


def _entry(m: dict, call: dict) -> str:
    ln = m["ops"][call["op"]]["impl"]["launches"][0]
    return "gemm" if ln["entry"].startswith("extern:") else ln["entry"]


def _kind(m: dict, arg: dict) -> str:
    return "state" if "state" in arg else m["buffers"][arg["buf"]]["kind"]


@pytest.mark.parametrize("name", MODES)
def test_compiles_and_both_verifiers_and_the_abi_check_accept(name, tmp_path):
    res = _compiled(name)
    m = res.manifest
    if name == "sglang_graph":
        # the breakable graphs' prefill runs at 48, 96 and 176 padded rows while its KV store
        # launches a block per real token (34, 85, 175): no form of the rows gives that, so the
        # prefill is left out with the sentence and decode serves alone
        assert set(m["programs"]) == {"decode"}
        why = [n for n in res.notes if n.startswith("prefill: left out of the manifest")]
        assert len(why) == 1 and "store_kvcache" in why[0] and "[34, 85, 175]" in why[0]
    else:
        assert set(m["programs"]) == {"decode", "prefill"}
    assert verify(m) == []
    write(res, tmp_path / "out", _analysed(name)[0])     # copies the cubins, raises on an ABI finding
    with quiet_stderr():
        v = verdict(tmp_path / "out" / "manifest.json", tmp_path / "out" / "kernels")
    assert v.accepted, v.violations[:3]
    problems = [d for d in check_abi(m, tmp_path / "out" / "kernels") if d.rule != "abi.module-file"]
    assert problems == []
    # the ABI check did look at cubins: most modules are in the dump
    assert len(list((tmp_path / "out" / "kernels").glob("*.cubin"))) > len(m["modules"]) // 2
    assert m["programs"]["decode"]["graph"] is True and m["programs"]["decode"]["batch"]["rows"] == 1


def test_graph_decode_is_one_replayed_graph_with_constant_values():
    name = "sglang_graph"
    res, truth = _compiled(name), _truth(name)
    m, prov = res.manifest, res.provenance
    dec = m["programs"]["decode"]
    ops = [m["ops"][c["op"]] for c in dec["calls"]]
    text = json.dumps([dec["calls"], ops])
    assert '"expr"' not in text and '"var"' not in text and '"when"' not in text
    held = [e for e in prov["graphs"] if "decode" in e["programs"]]
    assert len(held) == 1 and held[0]["tokens"] == [1]
    # every forward the decode program was built from replayed that graph
    replaying = {r["forward"] for r in held[0]["forwards"]}
    assert {f for f, _ in prov["programs"]["decode"]["forwards"]} <= replaying
    # the engine captured one decode graph per batch size (truth); the others were never replayed
    sizes = truth["cuda_graph_config"]["decode"]["bs"]
    same = [e for e in prov["graphs"] if e["launches"] == held[0]["launches"]]
    assert len(same) == len(sizes) > 1
    assert sorted(e["status"] for e in same) == ["not replayed"] * (len(sizes) - 1) + ["program"]
    assert any("never replayed" in n for n in res.notes)


def _forward_kernels(dump, f) -> list[tuple]:
    """(entry or 'gemm', grid) of a forward's launch records in order; a cuBLASLt GEMM and its
    split-K reduction are one call."""
    L = dump.launches.set_index("seq")
    out = []
    for first, n in f.seqs:
        for s in range(first, first + n):
            r = L.loc[s]
            sym = str(r["symbol"])
            if "splitKreduce" in sym and out and out[-1][0] == "gemm":
                continue
            grid = [int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])]
            out.append(("gemm", None) if sym.startswith("nvjet_") else (sym, grid))
    return out


@pytest.mark.parametrize("name", MODES)
def test_decode_calls_are_the_engine_forward_kernels_in_order(name):
    dump, _, doc = _analysed(name)
    res, truth = _compiled(name), _truth(name)
    m, prov = res.manifest, res.provenance
    calls = m["programs"]["decode"]["calls"]
    got = [(_entry(m, c), None if _entry(m, c) == "gemm" else m["ops"][c["op"]]["impl"]["launches"][0]["grid"])
           for c in calls]
    fwd = {f.forward: f for f in doc.passes.forwards}
    built = [f for f, _ in prov["programs"]["decode"]["forwards"]]
    w = truth["window"]
    in_window = [f for f in built if w["start_ns"] <= fwd[f].start_ns and fwd[f].end_ns <= w["end_ns"]]
    assert in_window, "the decode program holds none of the client's decode steps"
    for f in built:         # the same kernels, in order, in every forward the program holds
        assert [k for k, _ in _forward_kernels(dump, fwd[f])] == [k for k, _ in got], f
    # and the grids of the forward the buffers were laid out from
    assert _forward_kernels(dump, fwd[prov["programs"]["decode"]["laid_out_from"]]) == got
    gemms = sum(k == "gemm" for k, _ in got)
    assert gemms == 4 * truth["geometry"]["num_hidden_layers"] + 1     # projections + lm_head


def _struct_fields(m: dict, prov: dict, prog: str):
    """(site, param i, byte at, class of the buffer it lands on) of every struct pointer field."""
    out = []
    for k, c in enumerate(m["programs"][prog]["calls"]):
        if c["op"] == "gemm":
            continue
        site = prov["programs"][prog]["calls"][k]["site"]
        for ln in m["ops"][c["op"]]["impl"]["launches"]:
            for i, a in enumerate(ln["args"]):
                for fld in a.get("pack", {}).get("fields", []):
                    if "param" in fld:
                        out.append((site, i, fld["at"], _kind(m, c["args"][fld["param"]])))
    return out


@pytest.mark.parametrize("name", MODES)
def test_struct_pointer_fields_land_on_buffers_of_their_class(name):
    _, a, _ = _analysed(name)
    res = _compiled(name)
    m, prov = res.manifest, res.provenance
    st = a.structs
    st = st[(st["scope"] == "site") & st["kind"].isin(["pointer", "maybe_pointer"])]
    role = {(s, int(i), int(at)): r for s, i, at, r in zip(st["site"], st["i"], st["at"], st["role"])}
    gemm = {p: [c for c in m["programs"][p]["calls"] if c["op"] == "gemm"] for p in m["programs"]}
    activation = {json.dumps(c["args"][j], sort_keys=True) for cs in gemm.values() for c in cs for j in (0, 2)}
    seen = {"kv_pool": 0, "weight": 0, "": 0}
    for prog in m["programs"]:
        fields = _struct_fields(m, prov, prog)
        assert fields
        for site, i, at, kind in fields:
            # the analysis' role of the word (sites it kept; "" for a launch outside its forwards' sites)
            r = role.get((site, i, at), "")
            if r == "kv_pool":
                assert kind == "state", (prog, site, at)
                seen[r] += 1
            else:
                seen[""] += not r
            if r != "kv_pool" and kind == "state":
                raise AssertionError(f"{prog} {site} +{at}: a {r} word on a KV state")
        # weights: a word the analysis calls weight lands on a weight buffer unless a GEMM of the
        # program reads that address as its activation operand; no word of another role does
        for k, c in enumerate(m["programs"][prog]["calls"]):
            if c["op"] == "gemm":
                continue
            site = prov["programs"][prog]["calls"][k]["site"]
            for ln in m["ops"][c["op"]]["impl"]["launches"]:
                for i, arg in enumerate(ln["args"]):
                    for fld in arg.get("pack", {}).get("fields", []):
                        if "param" not in fld:
                            continue
                        target = c["args"][fld["param"]]
                        r, kind = role.get((site, i, fld["at"]), ""), _kind(m, target)
                        if json.dumps(target, sort_keys=True) in activation:
                            assert kind != "weight", (prog, site, fld["at"])
                        elif r == "weight":
                            assert kind == "weight", (prog, site, fld["at"])
                            seen[r] += 1
                        if kind == "weight":
                            assert r in ("weight", "persistent"), (prog, site, fld["at"], r)
    assert seen["kv_pool"] and seen["weight"] and seen[""] < seen["kv_pool"] + seen["weight"]
    # the GEMMs: weight operands on weight buffers, x and C never; (n, k) the geometry's projections
    g = _truth(name)["geometry"]
    hd, h, kv, inter = g["head_dim"], g["hidden_size"], g["num_key_value_heads"], g["intermediate_size"]
    want = {((g["num_attention_heads"] + 2 * kv) * hd, h), (h, g["num_attention_heads"] * hd), (2 * inter, h),
            (h, inter), (g["vocab_size"], h)}
    for prog, cs in gemm.items():
        # a prefill program ends at its last KV access (programs.end_at_state): no LM head there
        assert {(c["args"][4]["i32"], c["args"][5]["i32"]) for c in cs} == (
            want if prog == "decode" else want - {(g["vocab_size"], h)}), prog
        for c in cs:
            assert _kind(m, c["args"][1]) == "weight"
            assert _kind(m, c["args"][0]) != "weight" and _kind(m, c["args"][2]) != "weight"


def _pack_bytes(pack: dict) -> bytes:
    b = bytearray(pack["size"])
    for f in pack["fields"]:
        assert "u8" in f, f        # a short by-value param holds literals only
        b[f["at"]] = f["u8"]
    return bytes(b)


def test_small_by_value_params_of_the_real_graph_capture():
    """The graph capture's prefill fills a bf16 tensor (FillFunctor<BFloat16>: a 2-byte by-value
    param): the frames hold its bytes in `value` only, and read_launches gives them as `raw`, the
    bytes a compiled pack is made of."""
    dump, _, _ = _analysed("sglang_graph")
    p = dump.params
    small = p[~p["word"] & p["size"].isin([2, 3, 5, 6, 7])]
    assert len(small)
    got = read_launches(dump, small["seq"].unique().tolist())
    for seq, i, size, value in zip(small["seq"], small["i"], small["size"], small["value"]):
        raw = got[int(seq)].params[int(i)].raw
        assert raw == int(value).to_bytes(8, "little")[:int(size)]
    # the FillFunctor launch is in the graph capture's prefill, which the compile now leaves out
    # (test_compiles_and_both_verifiers_and_the_abi_check_accept); its pack is the frames' bytes,
    # as read_launches gives them above, and compiler.launches packs exactly `raw`
    res = _compiled("sglang_graph")
    assert "prefill" not in res.manifest["programs"]
    fills = [x for x in got.values() if "FillFunctor" in x.symbol and any(q.size == 2 for q in x.params)]
    assert fills


def _sim_with_fill(tmp: Path, fill) -> Path:
    """The simulator's dump with a 2-byte by-value param (`fill(forward_tokens)`, a bf16 bit
    pattern) appended to every silu_and_mul launch, and its random sampling seed pinned."""
    from dumpsim import SimConfig, simulate

    out = tmp / "sim"
    shutil.rmtree(out, ignore_errors=True)
    pid, _ = simulate(out, SimConfig(extra_pid=False, profile_tokens=1024))
    recs = [json.loads(ln) for ln in (pid / "launches.jsonl").read_text().splitlines()]
    for r in recs:
        if r["name"] == "argmax_sample_kernel":
            r["params"][2]["hex"] = (12345).to_bytes(8, "little").hex()
            r["params"][2].pop("ptrs", None)
        if r["name"] == "silu_and_mul_kernel":
            last = r["params"][-1]
            r["params"].append({"i": len(r["params"]), "off": last["off"] + last["size"], "size": 2,
                                "hex": fill(r["grid"][0]).to_bytes(2, "little").hex()})
    (pid / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return pid


def _silu_packs(m: dict) -> list[dict]:
    return [a["pack"] for op in m["ops"].values() for ln in op["impl"]["launches"] if "silu_and_mul" in ln["entry"]
            for t, a in zip(ln["params"], ln["args"]) if t == "bytes<2>"]


@pytest.mark.parametrize("fill", [0x3F80, 0xBF00])     # bf16 1.0; -0.5 (both bytes non-zero)
def test_small_by_value_param_simulated(fill, tmp_path):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(_sim_with_fill(tmp_path, lambda rows: fill), cache=False)
    res = compile_capture(dump, document(analyze(dump)))
    m = res.manifest
    assert verify(m) == []
    assert kern_violations(m, ".", tmp_path) == []
    packs = _silu_packs(m)
    assert packs and all(_pack_bytes(pk) == fill.to_bytes(2, "little") for pk in packs)


def test_small_by_value_param_that_varies_is_noted(tmp_path):
    from mining.analyze import analyze, document
    from mining.load import load_dump

    dump = load_dump(_sim_with_fill(tmp_path, lambda rows: 0x3F00 + rows % 7), cache=False)
    res = compile_capture(dump, document(analyze(dump)))
    assert any("by-value byte that differs between forwards" in n for n in res.notes)
    assert _silu_packs(res.manifest)
