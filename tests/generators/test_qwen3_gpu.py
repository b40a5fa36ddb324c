"""On a GPU: kern runs the committed Qwen3 manifest and its greedy tokens equal vLLM's.

The reference tokens are vLLM 0.26.0's for the same seeded checkpoint and prompts
(examples/vllm_qwen3/reference/vllm-offline-captured.json); the checkpoint is rebuilt with
make_checkpoint.py (torch + transformers). Marked `gpu`: skipped where no NVIDIA driver exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

EX = ROOT / "examples/vllm_qwen3"


@pytest.mark.gpu
def test_kern_tokens_equal_vllm(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("kern")
    subprocess.run([sys.executable, str(EX / "make_checkpoint.py"), str(tmp_path / "ckpt")], check=True)
    out = tmp_path / "kern.json"
    subprocess.run([sys.executable, str(EX / "run_kern.py"), str(ROOT / "manifests/qwen3"), str(tmp_path / "ckpt"),
                    str(out), "--reference", str(EX / "reference/vllm-offline-captured.json")], check=True)
    report = json.loads(out.read_text())
    assert report["equal_to_vllm"] == [True, True, True, True]
