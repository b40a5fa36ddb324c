"""The command layer stays thin (issue 16): tests reach the stages through their library functions,
never through a `mine.cmd_*` module; no command reads `sys.argv` (so `mine.cli.main(argv)` is the
installed `mine`); no command finds a compiler or hashes artifacts itself (the stages' work:
`manifests.kernels.find_nvcc` / `build_module`)."""

from __future__ import annotations

import ast

from paths import ROOT, TESTS

COMMANDS = sorted((ROOT / "mine").glob("cmd_*.py"))


def _imports(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_no_test_imports_a_command_module():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in sorted(TESTS.rglob("*.py"))
           for m in _imports(p) if m.startswith("mine.cmd_")]
    assert not bad, bad


def test_commands_read_no_sys_argv_and_build_nothing():
    assert len(COMMANDS) >= 9
    bad = []
    for p in COMMANDS:
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    (node.value.id, node.attr) in {("sys", "argv"), ("hashlib", "sha256"), ("shutil", "which")}:
                bad.append(f"{p.name}:{node.lineno}: {node.value.id}.{node.attr}")
        bad += [f"{p.name}: imports {m}" for m in _imports(p) if m == "hashlib"]
    assert not bad, bad
