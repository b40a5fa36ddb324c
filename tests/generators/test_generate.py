"""The generators' library functions, called as a library caller would (a plain output path, no
CLI): `generate_k3` and `generate_qwen3` write the committed manifests byte for byte, and refuse
bad options with a UsageError before any work."""

from __future__ import annotations

import pytest

from generators.k3.generate import check_options, generate_k3
from generators.qwen3.generate import check_inputs, generate_qwen3
from paths import FIXTURES, ROOT
from vocab.errors import UsageError

K3 = ROOT / "manifests" / "k3" / "224"


def test_generate_k3_decode_into_a_plain_path(tmp_path):
    paths = generate_k3(tmp_path / "new", decode=True, dcp=True, experts=224)
    assert paths == [tmp_path / "new" / "d.json"]
    assert paths[0].read_bytes() == (K3 / "d.json").read_bytes()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["d.json"]  # nothing recorded


def test_generate_k3_prefill_stages(tmp_path):
    paths = generate_k3(tmp_path, stages=8, experts=224)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [f"p/stage{s}.json" for s in range(8)]
    assert all(p.read_bytes() == (K3 / "p" / p.name).read_bytes() for p in paths)


@pytest.mark.parametrize("kw, phrase", [
    (dict(decode=True, stages=4), "--stages is for the prefill stages"),
    (dict(tp=4), "--tp applies to the decode manifest"),
    (dict(dcp=True), "--dcp applies to the decode manifest"),
])
def test_k3_options_that_do_not_go_together(kw, phrase, tmp_path):
    with pytest.raises(UsageError, match=phrase):
        check_options(kw.pop("decode", False), **kw)
    with pytest.raises(UsageError, match=phrase):  # the library function refuses them before any work
        generate_k3(tmp_path / "o", **dict(kw, decode="stages" in kw))
    assert not (tmp_path / "o").exists()


def test_k3_defaults():
    assert check_options(False) == (8, 8) and check_options(True, tp=4, dcp=True) == (8, 4)


def test_generate_qwen3_into_a_plain_path(tmp_path, offline_analysis_json):
    dump = FIXTURES / "vllm" / "vllm-offline.tar.xz"
    config = ROOT / "examples" / "vllm_qwen3" / "reference" / "config.json"
    # the session's analysis of the capture (tests/conftest.py): this test is about the output folder
    result = generate_qwen3(dump, config, tmp_path / "q", cache=False, analysis=offline_analysis_json)
    assert result.path == tmp_path / "q" / "qwen3.json"
    assert result.path.read_bytes() == (ROOT / "manifests" / "qwen3" / "qwen3.json").read_bytes()
    assert result.abi_complete and result.notes == []
    assert result.lines()[0].startswith(f"{result.path}: 18 forwards mined")
    assert (tmp_path / "q" / "qwen3-bindings.safetensors").is_file()
    assert not (tmp_path / "q" / ".mine-written").exists()  # a plain folder: nothing recorded


def test_qwen3_inputs_are_checked_first(tmp_path):
    with pytest.raises(UsageError, match="--chunk must be at least 1") as exc:
        check_inputs(tmp_path, tmp_path, chunk=0)
    assert (exc.value.value, exc.value.limit) == (0, 1)
    with pytest.raises(FileNotFoundError, match="--config"):
        check_inputs(tmp_path, tmp_path / "missing.json")
    with pytest.raises(UsageError, match="holds no .safetensors"):
        check_inputs(tmp_path, tmp_path, weights=tmp_path)
