"""Where the tests find the repository and its committed test data, named once.

Why a module: the tests live one folder per stage (tests/capture, tests/mining, ...), so a path
computed from a test file's own location would differ by depth; every test asks here instead.
"""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
CORPUS = TESTS / "manifest_corpus"
GPU_RESULTS = TESTS / "gpu_results"
