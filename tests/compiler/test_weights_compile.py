"""`mine compile --weights` (compiler/weight_binds.py): weight buffers bound to a checkpoint by the
capture's snapshot bytes.

Two plantings with known truth. (1) Simulated: weight declarations at addresses of a planted
snapshot (mining/snapshot.py reads it back) whose bytes a small checkpoint written here explains
in every way an engine lays weights out -- fused q|k|v and gate|up, a tied embedding held under two
names, a row slice (a shard), a tensor followed by padding, a norm of ones in each layer, an f32
tensor copied into a bf16 buffer, and a range no tensor holds. (2) Real: the q2e capture (vLLM
eager), compiled, its weight buffers' allocations planted with bytes of a seeded checkpoint of
their sizes, then compiled again with --weights through `compile_dump` and the CLI. Each time the
bind segments are replayed the way kern loads them (tensors as [dim0, product(rest)] matrices,
segments end to end) and must rebuild every buffer's snapshot bytes exactly; the truth's layout
must be what the binds say; the checkpoint is left untouched; our verifier and kern accept the
manifest. Without a snapshot, --weights is one sentence and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from paths import FIXTURES, ROOT

from compiler import weight_binds as WB
from compiler.buffers import Decl
from compiler.errors import CompileError
from generators.safetensors import Tensor, tensors as read_tensors, write as write_st
from mining.snapshot import read_snapshot

ONES = np.full(1, 0x3F80, np.uint16).tobytes()
EL = {"BF16": 2, "F32": 4, "U8": 1}


def _rand(rng, n: int) -> bytes:
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


def _assemble(segs: list[dict], files) -> bytes:
    """A buffer's bytes as kern lays its bind segments out (kern-manifest.md 2.3)."""
    ts = read_tensors(list(files))
    out = []
    for s in segs:
        t = ts[s["tensor"]]
        el = EL[t.dtype]
        with open(t.file, "rb") as f:
            f.seek(t.begin)
            raw = np.frombuffer(f.read(t.end - t.begin), np.uint8)
        # kern's view: [dim0, product(rest)], a 1-D tensor one row of all its elements
        rows = t.shape[0] if len(t.shape) > 1 else 1
        cols = math.prod(t.shape[1:]) if len(t.shape) > 1 else max(1, math.prod(t.shape))
        mat = raw.reshape(rows, cols * el)
        r0, r1 = s.get("rows", [0, rows])
        c0, c1 = s.get("cols", [0, cols])
        out.append(mat[r0:r1, c0 * el:c1 * el].tobytes())
    return b"".join(out)


def _plant(pid_dir, regions: dict[int, bytes], skipped: dict[int, int] = {}) -> None:
    """snapshot.jsonl + snapshot/<base>.bin as the capture writes them (docs/dump-format.md "Snapshot")."""
    (pid_dir / "snapshot").mkdir(parents=True, exist_ok=True)
    lines = []
    for base in sorted(set(regions) | set(skipped)):
        rec = {"event": "region", "base": hex(base), "id": base & 0xFFFF, "seq_before": 10, "t_ns": 1}
        if base in regions:
            (pid_dir / f"snapshot/{base:x}.bin").write_bytes(regions[base])
            rec.update(size=len(regions[base]), status="ok", file=f"snapshot/{base:x}.bin")
        else:
            rec.update(size=skipped[base], status="skipped", file=None, reason="largest first over the budget")
        lines.append(rec)
    lines.append({"event": "end", "status": "ok", "seq_before": 10, "t_ns": 1, "regions": len(lines)})
    (pid_dir / "snapshot.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


# ---------------------------------------------------------------- (1) simulated


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    rng = np.random.default_rng(5)
    W = 32
    t = {}   # name -> (dtype, shape, bytes)

    def mat(name, rows, cols=W, dtype="BF16"):
        t[name] = (dtype, [rows, cols], _rand(rng, rows * cols * EL[dtype]))
        return t[name][2]

    for L in range(2):
        p = f"model.layers.{L}."
        mat(p + "self_attn.q_proj.weight", 8), mat(p + "self_attn.k_proj.weight", 4)
        mat(p + "self_attn.v_proj.weight", 4), mat(p + "mlp.gate_proj.weight", 12), mat(p + "mlp.up_proj.weight", 12)
        t[p + "input_layernorm.weight"] = ("BF16", [W], ONES * W)
    emb = mat("model.embed_tokens.weight", 16)
    t["lm_head.weight"] = ("BF16", [16, W], emb)            # tied: the same bytes under a second name
    big = mat("model.layers.0.mlp.down_proj.weight", 20)
    scale = mat("model.layers.0.scale", 4, W, "F32")
    ck = root / "ckpt"
    ck.mkdir()
    write_st(ck / "model.safetensors", t)
    B = lambda n: t[n][2]   # noqa: E731
    row = W * 2
    junk = _rand(rng, 96)
    L0, L1 = "model.layers.0.", "model.layers.1."
    layout = [   # (decl name, bytes) in address order, with what the binds must say
        ("w.emb", emb, [{"tensor": "model.embed_tokens.weight"}]),
        ("w.qkv0", B(L0 + "self_attn.q_proj.weight") + B(L0 + "self_attn.k_proj.weight") + B(L0 + "self_attn.v_proj.weight"),
         [{"tensor": L0 + "self_attn.q_proj.weight"}, {"tensor": L0 + "self_attn.k_proj.weight"},
          {"tensor": L0 + "self_attn.v_proj.weight"}]),
        ("w.norm0", ONES * W, [{"tensor": L0 + "input_layernorm.weight"}]),
        ("w.gu0", B(L0 + "mlp.gate_proj.weight") + B(L0 + "mlp.up_proj.weight"),
         [{"tensor": L0 + "mlp.gate_proj.weight"}, {"tensor": L0 + "mlp.up_proj.weight"}]),
        ("w.shard", big[5 * row:15 * row], [{"tensor": L0 + "mlp.down_proj.weight", "rows": [5, 15]}]),
        ("w.padded", B(L1 + "self_attn.q_proj.weight") + junk,
         [{"tensor": L1 + "self_attn.q_proj.weight"}, {"tensor": "mine.extra.w.padded.0"}]),
        ("w.norm1", ONES * W, [{"tensor": L1 + "input_layernorm.weight"}]),
        ("w.gu1", B(L1 + "mlp.gate_proj.weight") + B(L1 + "mlp.up_proj.weight"),
         [{"tensor": L1 + "mlp.gate_proj.weight"}, {"tensor": L1 + "mlp.up_proj.weight"}]),
        ("w.f32", scale + B(L1 + "self_attn.k_proj.weight"),
         [{"tensor": "mine.extra.w.f32.0"}, {"tensor": L1 + "self_attn.k_proj.weight"}]),
        ("w.none", _rand(rng, 640), [{"tensor": "mine.extra.w.none.0"}]),
    ]
    base, at, decls, region, want = 0x7F0000000000, 0, {}, bytearray(), {}
    for name, data, binds in layout:
        at += 512                                # the allocator's gaps between tensors
        region += b"\xee" * (at - len(region))
        decls[name] = Decl(name, "weight", len(data), base, at, "planted", "bf16")
        region += data
        want[name] = (data, binds)
        at += len(data)
    decls["w.lost"] = Decl("w.lost", "weight", 64, 0x7E0000000000, 0, "planted", "bf16")  # in a skipped region
    decls["ws"] = Decl("ws", "workspace", 64, base, 0, "not a weight", "bf16")
    pid = root / "pid1"
    _plant(pid, {base: bytes(region)}, {0x7E0000000000: 1 << 30})
    snap = read_snapshot(pid, [])
    files = sorted(ck.glob("*.safetensors"))
    digest = hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest()
    wb = WB.bind_weights(decls, snap, files)
    extra = root / "extra.safetensors"
    write_st(extra, wb.extras)
    return wb, want, files + [extra], ck, digest


def test_the_binds_say_the_planted_layouts(simulated):
    wb, want, _, _, _ = simulated
    assert {n: wb.binds[n] for n in want} == {n: b for n, (_, b) in want.items()}
    prov = wb.provenance["buffers"]
    assert prov["w.qkv0"]["kind"] == "concat" and prov["w.shard"]["kind"] == "slice"
    assert prov["w.emb"]["kind"] == "exact" and prov["w.none"]["kind"] == "none"
    assert prov["w.padded"]["kind"] == prov["w.f32"]["kind"] == "partial"
    (not_bound,) = [p for p in prov["w.f32"]["pieces"] if "not_bound" in p]
    assert not_bound["equal_to"] == "model.layers.0.scale" and "dtype" in not_bound["not_bound"]
    # a buffer whose allocation the snapshot skipped keeps its capture name, and says why
    assert "w.lost" not in wb.binds and "skipped" in prov["w.lost"]["because"]
    assert "ws" not in prov and any("1 not in the snapshot" in n for n in wb.notes)


def test_equal_content_is_chosen_by_address_neighbours_and_said(simulated):
    wb, _, _, _, _ = simulated
    amb = {a["buffer"]: a for a in wb.provenance["ambiguous"]}
    assert set(amb) == {"w.emb", "w.norm0", "w.norm1"}
    assert amb["w.emb"]["candidates"] == ["lm_head.weight", "model.embed_tokens.weight"]
    for a in amb.values():
        assert a["bound"] == wb.binds[a["buffer"]][0]["tensor"] and "shares" in a["rule"], a
    assert any("equal-content" in n for n in wb.notes)


def test_kern_s_layout_of_the_binds_rebuilds_every_buffer(simulated):
    wb, want, files, ck, digest = simulated
    for name, (data, _) in want.items():
        assert _assemble(wb.binds[name], files) == data, name
    assert hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest() == digest
    assert [p.name for p in ck.iterdir()] == ["model.safetensors"]


def test_segments_of_a_piece_across_rows():
    t = Tensor("x", "BF16", (4, 3, 2), None, 100, 100 + 48)   # kern's view: 4 rows of 6 elements
    assert WB.segments(t, 0, 48) == [{"tensor": "x"}]
    assert WB.segments(t, 12, 24) == [{"tensor": "x", "rows": [1, 3]}]
    assert WB.segments(t, 16, 22) == [{"tensor": "x", "rows": [1, 2], "cols": [2, 6]},
                                      {"tensor": "x", "rows": [2, 3]}, {"tensor": "x", "rows": [3, 4], "cols": [0, 1]}]
    assert WB.segments(t, 2, 4) == [{"tensor": "x", "rows": [0, 1], "cols": [1, 3]}]
    assert WB.segments(t, 1, 4) is None and WB.segments(Tensor("y", "F64", (2,), None, 0, 16), 0, 16) is None


def test_segments_of_a_vector_are_columns_of_its_one_row():
    """kern views a 1-D tensor as one row: a piece of a [256] norm weight is cols of row 0 (kern-llm
    refused rows [0, 64) of such a tensor on the H200: "outside the tensor's 1" rows)."""
    v = Tensor("norm", "BF16", (256,), None, 0, 512)
    assert WB.segments(v, 0, 512) == [{"tensor": "norm"}]
    assert WB.segments(v, 0, 128) == [{"tensor": "norm", "rows": [0, 1], "cols": [0, 64]}]
    assert WB.segments(v, 256, 256) == [{"tensor": "norm", "rows": [0, 1], "cols": [128, 256]}]


# ---------------------------------------------------------------- (2) q2e, a real capture


@pytest.fixture(scope="module")
def q2e(tmp_path_factory):
    """q2e unpacked, its weight allocations planted from a seeded checkpoint (module docstring)."""
    from compiler.compile import compile_capture
    from mining.analyze import analyze, document
    from mining.load import load_dump

    root = tmp_path_factory.mktemp("q2e")
    with tarfile.open(FIXTURES / "suite" / "q2e.tar.xz") as tar:
        tar.extractall(root / "dump", filter="data")
    (pid,) = (root / "dump").glob("pid*")
    dump = load_dump(pid, cache=False)
    plain = compile_capture(dump, document(analyze(dump)), label="q2e")
    decl = plain.provenance["declarations"]
    ws = sorted((n for n, d in decl.items() if d["kind"] == "weight"),
                key=lambda n: (int(decl[n]["alloc_base"], 16), decl[n]["alloc_offset"]))
    assert len(ws) >= 8 and all(plain.manifest["buffers"][n]["dtype"] == "bf16" for n in ws)
    rng = np.random.default_rng(11)
    tens, truth, data = {}, {}, {}
    big = [n for n in ws if decl[n]["bytes"] > 64 << 10]
    small = [n for n in ws if n not in big]
    for j, n in enumerate(big):
        e, p = decl[n]["bytes"] // 2, f"model.layers.{j}."
        w = 64 if e % 64 == 0 and e // 64 >= 4 else 1
        r = e // w
        if j == 0:     # the tied embedding, under two names
            b = _rand(rng, 2 * e)
            tens["model.embed_tokens.weight"] = tens["lm_head.weight"] = ("BF16", [r, w], b)
            truth[n], data[n] = [{"tensor": "model.embed_tokens.weight"}], b
        elif j % 4 == 1:   # fused q|k|v by rows
            q, k = r - 2 * (r // 4), r // 4
            parts = [(p + "q_proj.weight", q), (p + "k_proj.weight", k), (p + "v_proj.weight", k)]
            for nm, rows in parts:
                tens[nm] = ("BF16", [rows, w], _rand(rng, 2 * rows * w))
            truth[n], data[n] = [{"tensor": nm} for nm, _ in parts], b"".join(tens[nm][2] for nm, _ in parts)
        elif j % 4 == 3 and r % 2 == 0:   # fused gate|up
            parts = [(p + "gate_proj.weight", r // 2), (p + "up_proj.weight", r // 2)]
            for nm, rows in parts:
                tens[nm] = ("BF16", [rows, w], _rand(rng, 2 * rows * w))
            truth[n], data[n] = [{"tensor": nm} for nm, _ in parts], b"".join(tens[nm][2] for nm, _ in parts)
        elif j % 4 == 0:   # a shard: rows [r/2, r/2 + r) of a tensor twice as tall
            whole = _rand(rng, 4 * e)
            tens[p + "down_proj.weight"] = ("BF16", [2 * r, w], whole)
            lo = (r // 2) * w * 2
            truth[n], data[n] = [{"tensor": p + "down_proj.weight", "rows": [r // 2, r // 2 + r]}], whole[lo:lo + 2 * e]
        elif j == 2:       # a tensor, then bytes of none (the allocator's padding)
            b = _rand(rng, 2 * e - 512)
            tens[p + "o_proj.weight"] = ("BF16", [len(b) // 2], b)
            truth[n], data[n] = [{"tensor": p + "o_proj.weight"}, {"tensor": f"mine.extra.{n}.0"}], b + _rand(rng, 512)
        else:
            b = _rand(rng, 2 * e)
            tens[p + "o_proj.weight"] = ("BF16", [r, w], b)
            truth[n], data[n] = [{"tensor": p + "o_proj.weight"}], b
    for k, n in enumerate(small):
        e = decl[n]["bytes"] // 2
        if k == len(small) - 1:   # a range no tensor explains
            truth[n], data[n] = [{"tensor": f"mine.extra.{n}.0"}], _rand(rng, 2 * e)
            continue
        nm = f"model.layers.{k}.norm.weight"
        tens[nm] = ("BF16", [e], _rand(rng, 2 * e))
        truth[n], data[n] = [{"tensor": nm}], tens[nm][2]
    ck = root / "ckpt"
    ck.mkdir()
    write_st(ck / "model.safetensors", tens)
    regions: dict[int, bytearray] = {}
    for n in ws:
        base, lo = int(decl[n]["alloc_base"], 16), decl[n]["alloc_offset"]
        reg = regions.setdefault(base, bytearray())
        end = lo + len(data[n])
        if len(reg) < end:
            reg += _rand(rng, end - len(reg) + 4096)
        reg[lo:end] = data[n]
    _plant(pid, {b: bytes(r) for b, r in regions.items()}, {0x7E0000000000: 100 << 30})
    return pid, ck, truth, data, hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest()


def test_q2e_compiles_with_its_weights_bound_by_content(q2e, tmp_path):
    from compiler.compile import compile_dump
    from manifests.verify import verify

    pid, ck, truth, data, digest = q2e
    res = compile_dump(pid, tmp_path / "out", cache=False, weights=ck)
    m = res.manifest
    assert verify(m) == []
    got = {n: m["buffers"][n]["bind"] for n in truth}
    assert got == truth
    extra = tmp_path / "out" / WB.EXTRA_FILE
    files = sorted(ck.glob("*.safetensors")) + [extra]
    for n in truth:
        assert _assemble(got[n], files) == data[n], n
    assert not [b for b in m["buffers"].values() if any(s["tensor"].startswith("capture.") for s in b.get("bind", []))]
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())["weights"]
    assert prov["extra"] == WB.EXTRA_FILE and set(prov["buffers"]) == set(truth)
    assert [a["candidates"] for a in prov["ambiguous"]] == [["lm_head.weight", "model.embed_tokens.weight"]]
    assert any(line.startswith("note: weights by content:") for line in res.lines())
    assert hashlib.sha256((ck / "model.safetensors").read_bytes()).hexdigest() == digest
    assert [p.name for p in ck.iterdir()] == ["model.safetensors"]
    _kern_takes(tmp_path / "out", files)


def _kern_takes(out, files):
    """kern's CPU verification passes (then, with no GPU here, loading stops at the driver)."""
    import kern
    from manifests.kern_oracle import quiet_stderr

    with quiet_stderr():
        try:
            kern.Runtime(str(out / "manifest.json"), str(out / "kernels"), [str(f) for f in files], 0)
        except ValueError as exc:
            raise AssertionError(f"kern rejects the manifest: {exc}") from None
        except BaseException:   # noqa: BLE001 - accepted, then no GPU (a pyo3 PanicException)
            pass


def _mine(*args):
    return subprocess.run([sys.executable, "-c", "from mine.cli import main; main()", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_cli_binds_and_refuses_a_capture_without_snapshot(q2e, tmp_path):
    pid, ck, truth, _, _ = q2e
    r = _mine("compile", str(pid), "-o", str(tmp_path / "a"), "--weights", str(ck), "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "weights by content" in r.stdout and (tmp_path / "a" / WB.EXTRA_FILE).is_file()
    r = _mine("compile", str(FIXTURES / "suite" / "q1e.tar.xz"), "-o", str(tmp_path / "b"), "--weights", str(ck))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no snapshot" in r.stderr and "MINE_CAPTURE_SNAPSHOT_AT" in r.stderr
    r = _mine("compile", str(pid), "-o", str(tmp_path / "c"), "--weights", str(tmp_path))
    assert r.returncode == 2 and "holds no *.safetensors" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_compile_capture_refuses_weights_without_a_snapshot():
    from compiler.compile import compile_capture

    class NoSnapshot:
        snapshot = None

    with pytest.raises(CompileError, match="holds no snapshot"):
        compile_capture(NoSnapshot(), None, weights=[])
