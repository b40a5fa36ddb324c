"""kern-llm's verdict on a manifest dict, for tests that compare it with ours (test_abi, test_cut).

Why a helper: test modules do not import one another (pytest imports them by path, so two stages
may each hold a test file of the same name); what several of them share lives here.
"""

from __future__ import annotations

import json

import pytest

from manifests import kern_oracle
from manifests.verify import verify


def kern_violations(manifest: dict, kernels_dir, tmp_path) -> list[str]:
    """kern-llm's verdict: [] when it accepts (it then fails on the absent driver), else its lines."""
    pytest.importorskip("kern")
    path = tmp_path / "oracle.json"
    path.write_text(json.dumps(manifest))
    v = kern_oracle.verdict(path, kernels_dir)
    if v.accepted and v.exc is not None and "cuda" not in str(v.exc).lower():
        raise v.exc
    return v.violations


def accepted_by_both(res, out, what: str = "") -> None:
    """A compile result: our verifier finds nothing in its manifest and kern-llm accepts the file it wrote."""
    assert verify(res.manifest) == [], what
    with kern_oracle.quiet_stderr():
        v = kern_oracle.verdict(out / "manifest.json")
    assert v.accepted, (what, v.violations[:3])
