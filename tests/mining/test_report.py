"""The terminal report of the main job's capture reads at 80 and at 200 columns (issue 20).

Rendered from the bundled vLLM dump: the default fits one screen at 80 columns, no line is wider
than the console, strides are integers or "varies" (never nan or floats), counts carry thousands
separators, and `full=True` / `sections=` print what they name.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from mining import report
from paths import FIXTURES

DUMP = FIXTURES / "vllm" / "vllm-offline.tar.xz"


@pytest.fixture(scope="module")
def analysis(offline_analysis):
    return offline_analysis   # the session's (tests/conftest.py)


def text(a, width: int, **kw) -> list[str]:
    buf = io.StringIO()
    report.render(a, Console(file=buf, width=width, color_system=None, legacy_windows=False), **kw)
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 200])
def test_default_is_one_screen(analysis, width):
    lines = text(analysis, width, label="tests/fixtures/vllm/vllm-offline.tar.xz")
    assert len(lines) <= 50, len(lines)
    assert max(len(x) for x in lines) <= width
    body = "\n".join(lines)
    assert lines[0].startswith("mine analyze tests/fixtures/vllm/vllm-offline.tar.xz (pid600/launches.jsonl)")
    assert "7,937 launches" in body and "pid 600" in body
    assert "Forward passes, grouped by shape" in body and "Call sites of layer 0" in body
    assert "4-6,8-10,12-14,16,18" in body  # the eleven steady decode forwards as one row
    assert "nvjet ×6" in body  # GEMM variants at one call position counted, not listed
    assert "hold-out: n/a 6,382, ok 3,472" in re.sub(r"\s+", " ", body)  # not a Python dict
    assert "more: --section" in body
    assert "nan" not in body and "None" not in body


@pytest.mark.parametrize("width", [80, 200])
def test_full_report_fits_the_width(analysis, width):
    lines = text(analysis, width, full=True)
    assert max(len(x) for x in lines) <= width
    body = "\n".join(lines)
    for title in ("Forward passes", "Per-layer address strides", "Pointer roles", "Fitted expressions of layer 0",
                  "Not fitted", "Kernels with partial coverage", "Names"):
        assert title in body
    assert "more: --section" not in body
    assert not re.search(r"\bnan\b", body)
    strides = body[body.index("Per-layer address strides"):body.index("Pointer roles")].splitlines()[2:]
    for row in strides:
        value = row.split()[-3]
        assert value == "varies" or re.fullmatch(r"-?\d{1,3}(,\d{3})*", value), row


def test_sections_pick_tables(analysis):
    body = "\n".join(text(analysis, 80, sections=("strides", "names")))
    assert "Per-layer address strides" in body and "Names (short name" in body
    assert "Call sites of layer 0" not in body and "Forward passes" not in body


def test_section_names_are_checked():
    assert report.parse_sections("fits, layers") == ("fits", "layers")
    assert report.parse_sections(None) == report.DEFAULT
    with pytest.raises(ValueError, match="unknown section bogus; choose from forwards"):
        report.parse_sections("fits,bogus")


@pytest.mark.parametrize("sym,name,short", [
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "nvjet"),
    ("_ZN4vllm15rms_norm_kernelI", "void vllm::rms_norm_kernel<c10::BFloat16, 8, 3, true>(c10::BFloat16*, long)",
     "rms_norm_kernel"),
    ("_Zx", "std::enable_if<(((8)>(0))), void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(int)",
     "fused_add_rms_norm_kernel"),
    ("_ZN4vllm15rms_norm_kernelIN3c108BFloat16EEEvPT_", "", "rms_norm_kernel"),
    ("reduce_segments", "", "reduce_segments"),
])
def test_short_names(sym, name, short):
    assert report.short_name(sym, name) == short
