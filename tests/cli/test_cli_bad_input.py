"""Every `mine` command walked through the bad inputs a new user gives it (issue 20).

Each case asserts what the user sees: exit code 2, exactly one line on stderr that starts with
`mine: error:` and says what is wrong (a phrase of it is checked), no traceback, and nothing in
the user's folder changed or added (every file hashed before and after). Cases run in-process
through `mine.cli.main`, the entry point the installed `mine` calls, so they take milliseconds;
a few run as real subprocesses at the end to prove the same holds outside pytest.

Findings are not bad input: a manifest that parses but breaks a rule is `mine verify`'s exit 1,
checked apart at the end.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mine.cli import main
from paths import ROOT

QWEN3 = ROOT / "manifests" / "qwen3" / "qwen3.json"
K3D = ROOT / "manifests" / "k3" / "224" / "d.json"
CUBINS = ROOT / "manifests" / "qwen3" / "kernels"
DUMP = ROOT / "tests" / "fixtures" / "vllm" / "vllm-offline.tar.xz"
CONFIG = ROOT / "examples" / "vllm_qwen3" / "reference" / "config.json"


def _qwen3(**change) -> str:
    m = json.loads(QWEN3.read_text())
    for k, v in change.items():
        m[k] = v
    return json.dumps(m)


def _big_block() -> str:
    m = json.loads(QWEN3.read_text())
    op = next(iter(m["ops"].values()))
    op["impl"]["launches"][0]["block"] = ["big", 1, 1]
    return json.dumps(m)


def _undeclared_module() -> str:
    m = json.loads(QWEN3.read_text())
    op = next(iter(m["ops"].values()))
    op["impl"]["launches"][0]["module"] = "no_such_module"
    return json.dumps(m)


def _program_calls(value) -> str:
    m = json.loads(QWEN3.read_text())
    m["programs"]["prefill"]["calls"] = value
    return json.dumps(m)


# Files every case finds in its folder (the user's files: none may change).
FILES = {
    "empty.json": "",
    "garbage.json": "nope, not JSON",
    "list.json": "[]",
    "obj.json": "{}",
    "ops_list.json": _qwen3(ops=["a"]),
    "ops_empty.json": _qwen3(ops=[]),
    "modules_list.json": _qwen3(modules=[1]),
    "buffers_int.json": '{"buffers": {"a": 5}}',
    "programs_str.json": _qwen3(programs="x"),
    "calls_int.json": _program_calls(5),
    "big_block.json": _big_block(),
    "undeclared.json": _undeclared_module(),
    "bad.toml": "modules = [",
    "notqwen.json": '{"model_type": "llama", "hidden_size": 8}',
    "plain.txt": "some notes of the user\n",
    "d/user.txt": "the user's own file\n",
    "emptydir/.keep": "",
}
G = ["gen", "qwen3", "--dump", str(DUMP), "--config", str(CONFIG)]

# (command line, phrase the one sentence must hold). `{t}` is the case's folder.
CASES = [
    # mine (the group itself)
    (["nosuch"], "no such command"),
    (["--nosuch"], "no such option"),
    # capture
    (["capture", "-o", "{t}/out"], "put the command after `--`"),
    (["capture", "-o", "{t}/out", "--"], "no command given"),
    (["capture", "-o", "{t}/out", "--", "no-such-program-xyz"], "command not found"),
    (["capture", "--format", "xml", "--", "true"], "'--format'"),
    (["capture", "--writer", "fast", "--", "true"], "'--writer'"),
    (["capture", "--max-launches", "-1", "--", "true"], "'--max-launches'"),
    (["capture", "--host-bytes", "5000", "--", "true"], "'--host-bytes'"),
    (["capture", "-o", "{t}/plain.txt", "--", "true"], "is not a folder"),
    # analyze
    (["analyze", "{t}/missing"], "no such file or folder"),
    (["analyze", "{t}/garbage.json"], "no parsable launch record"),
    (["analyze", "{t}/emptydir"], "{t}/emptydir"),
    (["analyze", str(DUMP), "--json", str(DUMP)], "is the input"),
    (["analyze", "{t}/d", "--json", "{t}/d/launches.jsonl"], "lies inside the input"),
    (["analyze", str(DUMP), "--json", "{t}/plain.txt/a.json"], "is a file, not a folder"),
    (["analyze", str(DUMP), "--json", "{t}/d"], "is a folder"),
    (["analyze", str(DUMP), "--json", "{t}/a.json", "--plot", "{t}/a.json"], "name one file"),
    (["analyze", str(DUMP), "--gap-ms", "soon"], "'--gap-ms'"),
    (["analyze", str(DUMP), "--gap-ms", "-1"], "--gap-ms must be more than 0 ms, got -1"),
    (["analyze", str(DUMP), "--per-forward", "0"], "'--per-forward'"),
    (["analyze", str(DUMP), "--section", "bogus"], "unknown section bogus"),
    (["analyze"], "missing argument"),
    # gen qwen3
    (["gen", "qwen3", "--dump", "{t}/missing", "--config", str(CONFIG), "-o", "{t}/o"], "--dump"),
    (["gen", "qwen3", "--dump", str(DUMP), "--config", "{t}/missing.json", "-o", "{t}/o"], "--config"),
    (["gen", "qwen3", "--dump", str(DUMP), "--config", "{t}/garbage.json", "-o", "{t}/o"], "not valid JSON"),
    (["gen", "qwen3", "--dump", str(DUMP), "--config", "{t}/notqwen.json", "-o", "{t}/o"], "qwen3"),
    (G + ["-o", "{t}/d"], "already exists and is not empty"),
    (G + ["-o", "{t}/plain.txt"], "is a file"),
    (G + ["-o", str(DUMP)], "is a file"),
    (G + ["-o", "{t}/o", "--chunk", "0"], "--chunk"),
    (G + ["-o", "{t}/o", "--analysis", "{t}/garbage.json"], "garbage.json"),
    (G + ["-o", "{t}/o", "--analysis", "{t}/missing.json"], "--analysis"),
    (G + ["-o", "{t}/o", "--kernels-toml", "{t}/bad.toml"], "bad.toml"),
    (G + ["-o", "{t}/o", "--weights", "{t}/d"], "holds no .safetensors"),
    (G + ["-o", "{t}/o", "--weights", "{t}/missing"], "--weights"),
    (["gen", "qwen3", "--config", str(CONFIG), "-o", "{t}/o"], "'--dump'"),
    # gen k3
    (["gen", "k3", "-o", "{t}/o", "--stages", "0"], "'--stages'"),
    (["gen", "k3", "-o", "{t}/o", "--stages", "-1"], "'--stages'"),
    (["gen", "k3", "-o", "{t}/o", "--stages", "200"], "do not split"),
    (["gen", "k3", "-o", "{t}/o", "--tp", "3"], "add --decode"),
    (["gen", "k3", "-o", "{t}/o", "--dcp"], "add --decode"),
    (["gen", "k3", "-o", "{t}/o", "--decode", "--stages", "4"], "--stages"),
    (["gen", "k3", "-o", "{t}/o", "--decode", "--tp", "3"], "--tp 3"),
    (["gen", "k3", "-o", "{t}/o", "--experts", "5"], "'--experts'"),
    (["gen", "k3", "-o", "{t}/o", "--chunk", "0"], "'--chunk'"),
    (["gen", "k3", "-o", "{t}/o", "--max-ctx", "0"], "'--max-ctx'"),
    (["gen", "k3", "-o", "{t}/o", "--config", "{t}/garbage.json"], "garbage.json"),
    (["gen", "k3", "-o", "{t}/o", "--kernels-toml", "{t}/bad.toml"], "bad.toml"),
    (["gen", "k3", "-o", "{t}/o", "--kernels-toml", "{t}/missing.toml"], "missing.toml"),
    (["gen", "k3", "-o", "{t}/d"], "already exists and is not empty"),
    (["gen", "k3", "-o", "{t}/plain.txt"], "is a file"),
    (["gen", "k3"], "'--out'"),
    # k3 memory / binds
    (["k3", "memory", "{t}/missing.json"], "no such file"),
    (["k3", "memory", "{t}/garbage.json"], "not a manifest"),
    (["k3", "memory", "{t}/list.json"], "not a manifest"),
    (["k3", "memory", "{t}/obj.json"], "does not verify"),
    (["k3", "memory", "{t}/buffers_int.json"], "does not verify"),
    (["k3", "memory", str(K3D), "--hbm", "0"], "--hbm"),
    (["k3", "memory", str(K3D), "--reserve", "-1"], "--reserve"),
    (["k3", "memory", str(K3D), "--hbm", "8", "--reserve", "9"], "--reserve"),
    (["k3", "binds", "{t}/obj.json", "{t}/d"], "does not verify"),
    (["k3", "binds", str(K3D), "{t}/missing"], "not a directory"),
    (["k3", "binds", str(K3D), "{t}/d"], "no *.safetensors"),
    # verify (unreadable input; findings are exit 1, below)
    (["verify", "{t}/missing.json"], "no such file"),
    (["verify", "{t}/garbage.json"], "not a manifest"),
    (["verify", "{t}/empty.json"], "is empty"),
    (["verify", "{t}/list.json"], "not a manifest"),
    (["verify", "{t}/d"], "not a regular file"),
    (["verify", str(QWEN3), "{t}/missing.json"], "no such file"),
    (["verify"], "missing argument"),
    # kernels check / build
    (["kernels", "check", "--kernels-toml", "{t}/missing.toml"], "no such kernels.toml"),
    (["kernels", "check", "--kernels-toml", "{t}/bad.toml"], "not valid TOML"),
    (["kernels", "check", "--kernels-toml", "{t}/d"], "is a directory"),
    (["kernels", "check", "--toml", "{t}/bad.toml"], "not valid TOML"),
    (["kernels", "check", "{t}/missing"], "is not a folder"),
    (["kernels", "build", "--kernels-toml", "{t}/bad.toml", "-o", "{t}/o"], "not valid TOML"),
    (["kernels", "build", "-o", "{t}/plain.txt"], "is a file"),
    (["kernels", "build", "-o", "{t}/d"], "already exists and is not empty"),
    # abi
    (["abi", "{t}/obj.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/ops_list.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/ops_empty.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/modules_list.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/big_block.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/undeclared.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/programs_str.json", "--cubins", str(CUBINS)], "does not verify"),
    (["abi", "{t}/list.json", "--cubins", str(CUBINS)], "not a manifest"),
    (["abi", "{t}/garbage.json", "--cubins", str(CUBINS)], "not a manifest"),
    (["abi", "{t}/missing.json", "--cubins", str(CUBINS)], "no such file"),
    (["abi", str(QWEN3), "--cubins", "{t}/missing"], "is not a folder"),
    (["abi", str(QWEN3)], "--cubins"),
    # cut
    (["cut", "{t}/obj.json", "--at", "3", "-o", "{t}/o"], "does not verify"),
    (["cut", "{t}/calls_int.json", "--at", "3", "-o", "{t}/o"], "does not verify"),
    (["cut", "{t}/programs_str.json", "--at", "3", "-o", "{t}/o"], "does not verify"),
    (["cut", "{t}/garbage.json", "--at", "3", "-o", "{t}/o"], "not a manifest"),
    (["cut", "{t}/missing.json", "--at", "3", "-o", "{t}/o"], "no such file"),
    (["cut", str(QWEN3), "--at", "l99.nothing", "-o", "{t}/o"], "no call labelled `l99.nothing`"),
    (["cut", str(QWEN3), "--at", "-5", "-o", "{t}/o"], "negative"),
    (["cut", str(QWEN3), "--at", "0", "-o", "{t}/o"], "at least one call"),
    (["cut", str(QWEN3), "--at", "100000", "-o", "{t}/o"], "100000"),
    (["cut", str(QWEN3), "--at", "200", "--at", "100", "-o", "{t}/o"], "not strictly increasing"),
    (["cut", str(QWEN3), "--at", "100", "-o", "{t}/plain.txt"], "is a file"),
    (["cut", str(QWEN3), "--at", "100", "-o", "{t}/d"], "already exists and is not empty"),
    (["cut", str(QWEN3), "--at", "100"], "'--out'"),
    (["cut", str(K3D), "--at", "1", "-o", "{t}/o"], "topology"),
    # compile: inputs and the output folder refused before the capture is read
    (["compile", "{t}/missing", "-o", "{t}/o"], "cannot be read"),
    (["compile", str(DUMP), "-o", "{t}/o", "--weights", "{t}"], "binding weights by content"),
    (["compile", str(DUMP), "-o", "{t}/d"], "already exists and is not empty"),
    # replay (a GPU command: here the missing GPU or the missing path, either in one sentence)
    (["replay", "{t}/missing"], "mine: error:"),
    (["replay", str(DUMP), "--limit", "0"], "'--limit'"),
    (["replay", str(DUMP), "--io", "{t}/garbage.json"], "not a readable mine-probe-io/1 file"),
    (["replay", str(DUMP), "--io", "{t}/obj.json"], "not a mine-probe-io/1 file"),
    (["replay", str(DUMP), "--seq", "0", "--warm-from", "3"], "--warm-from and --contents-out are read for --in-order"),
    (["replay", str(DUMP), "--seq", "0", "--in-order", "--ceilings"], "--in-order measures data flow only"),
    # compare / reference: refused on the CPU, before any GPU or engine is touched
    (["compare", "{t}/missing", "--weights", "{t}", "--reference", "{t}/obj.json"], "does not exist"),
    (["compare", str(QWEN3), "--weights", "{t}/emptydir", "--reference", "{t}/garbage.json"], "is not JSON"),
    (["compare", str(QWEN3), "--weights", "{t}/emptydir", "--reference", "{t}/obj.json"], "format"),
    (["compare", str(QWEN3), "--weights", "{t}", "--reference", "{t}/obj.json", "--json", "{t}/obj.json"], "--json"),
    (["compare", str(QWEN3), "--weights", "{t}", "--reference", "{t}/obj.json", "--tol-ulps", "-1"], "'--tol-ulps'"),
    (["compare", "{t}/ops_list.json", "--weights", "{t}", "--reference", "{t}/obj.json"], "does not verify"),
    (["reference", "{t}/emptydir", "-o", "{t}/r.json"], "holds no *.safetensors"),
    (["reference", "{t}/emptydir", "-o", "{t}/r.json", "--lengths", "a,b"], "--lengths"),
    (["reference", "{t}/emptydir", "-o", "{t}/r.json", "--mode", "fast"], "--mode"),
    (["reference", "{t}/emptydir", "-o", "{t}/r.json", "--engine", "transformers", "--mode", "default"],
     "transformers records in eager mode only"),
    (["reference", "{t}/emptydir", "-o", "{t}/r.json", "--lengths", "4000", "--new", "200"], "exceed --max-model-len"),
    (["reference", "{t}", "-o", "{t}/r.json"], "lies inside the input"),
]


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def folder(tmp_path):
    for name, text in FILES.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith("mine: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("args,phrase", CASES, ids=[" ".join(a)[:70] for a, _ in CASES])
def test_bad_input(args, phrase, folder, monkeypatch, capsys):
    monkeypatch.chdir(folder)
    args = [a.replace("{t}", str(folder)) for a in args]
    before = _tree(folder)
    committed = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (QWEN3, K3D, DUMP, CONFIG)}
    code, out, err = run_main(args, monkeypatch, capsys)
    line = one_sentence(err)
    assert code == 2, (code, line)
    assert phrase.replace("{t}", str(folder)).lower() in line.lower(), line
    assert _tree(folder) == before, "the command changed the user's folder"
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in committed} == committed


def test_every_command_has_bad_input_cases():
    """No command escapes the walk: every registered command appears in CASES."""
    from mine.cli import app
    from typer.main import get_command

    def leaves(cmd, path=()):
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            yield from leaves(sub, (*path, name))

    covered = {" ".join(a[:2]) for a, _ in CASES} | {a[0] for a, _ in CASES}
    missing = [c for c in leaves(get_command(app)) if c not in covered]
    assert not missing, f"commands without bad-input cases: {missing}"


def test_verify_findings_exit_1_without_traceback(folder, monkeypatch, capsys):
    code, out, err = run_main(["verify", str(folder / "obj.json"), str(folder / "ops_list.json")], monkeypatch, capsys)
    assert code == 1
    assert "rejected" in out and "Traceback" not in out + err


def test_force_replaces_only_what_an_earlier_run_wrote(folder, monkeypatch, capsys):
    """A second cut into one folder: refused without --force; with it, the earlier cut's third stage
    goes, the user's file stays, and the record names what this run wrote."""
    out = folder / "stages"
    code, _, err = run_main(["cut", str(QWEN3), "--at", "100", "--at", "200", "-o", str(out)], monkeypatch, capsys)
    assert code == 0, err
    (out / "notes.txt").write_text("mine\n")
    assert sorted(p.name for p in out.iterdir()) == [".mine-written", "notes.txt", "stage0.json", "stage1.json",
                                                     "stage2.json"]
    code, _, err = run_main(["cut", str(QWEN3), "--at", "100", "-o", str(out)], monkeypatch, capsys)
    assert code == 2 and "--force" in one_sentence(err)
    code, _, err = run_main(["cut", str(QWEN3), "--at", "100", "-o", str(out), "--force"], monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [".mine-written", "notes.txt", "stage0.json", "stage1.json"]
    assert (out / "notes.txt").read_text() == "mine\n"
    assert json.loads((out / ".mine-written").read_text()) == ["stage0.json", "stage1.json"]


def test_force_never_removes_an_input_or_a_file_outside(folder, monkeypatch, capsys):
    """A tampered record naming the input and a path outside the folder removes neither."""
    out = folder / "stages"
    out.mkdir()
    keep = out / "mine.json"
    keep.write_text(QWEN3.read_text())
    (out / ".mine-written").write_text(json.dumps(["mine.json", "../plain.txt", "stage5.json"]))
    (out / "stage5.json").write_text("{}")
    code, _, err = run_main(["cut", str(keep), "--at", "100", "-o", str(out), "--force"], monkeypatch, capsys)
    assert code == 0, err
    assert keep.read_text() == QWEN3.read_text() and (folder / "plain.txt").is_file()
    assert not (out / "stage5.json").exists()


def test_an_empty_out_folder_is_accepted(folder, monkeypatch, capsys):
    (folder / "fresh").mkdir()
    code, out, err = run_main(["cut", str(QWEN3), "--at", "100", "-o", str(folder / "fresh")], monkeypatch, capsys)
    assert code == 0, err
    assert "2 stages written" in out


def test_version_and_short_help(monkeypatch, capsys):
    from mine import __version__

    code, out, _ = run_main(["--version"], monkeypatch, capsys)
    assert code == 0 and out.strip() == f"mine {__version__}"
    code, out, _ = run_main(["gen", "k3", "-h"], monkeypatch, capsys)
    assert code == 0 and "--kernels-toml" in out and "--kernels " not in out  # the old spelling is hidden
    code, out, _ = run_main(["capture", "-h"], monkeypatch, capsys)
    assert "mine capture [OPTIONS] -- CMD [ARGS]..." in out
    assert "<bool>" not in out  # flags are shown without a value


def test_shell_completion_completes_commands(tmp_path):
    import os

    env = dict(os.environ, _MINE_COMPLETE="complete_bash", COMP_WORDS="mine ge", COMP_CWORD="1")
    r = subprocess.run([sys.executable, "-m", "mine.cli"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["gen"], r.stdout + r.stderr


def test_old_spellings_still_work(folder, monkeypatch, capsys):
    code, out, err = run_main(["abi", str(QWEN3), "--kernels", str(CUBINS)], monkeypatch, capsys)
    assert code == 0, err
    assert "every kernel launch fits its cubin" in out


# The same, as a user runs them: the installed entry point in a fresh process.
SUBPROCESS = [
    (["abi", "{t}/ops_list.json", "--cubins", str(CUBINS)], "does not verify"),
    (["gen", "k3", "-o", "{t}/o", "--stages", "0"], "'--stages'"),
    (["k3", "memory", "{t}/buffers_int.json"], "does not verify"),
    (["cut", "{t}/calls_int.json", "--at", "3", "-o", "{t}/o"], "does not verify"),
    (["capture", "--format", "xml", "--", "true"], "'--format'"),
]


@pytest.mark.parametrize("args,phrase", SUBPROCESS, ids=[" ".join(a)[:40] for a, _ in SUBPROCESS])
def test_bad_input_in_a_process(args, phrase, folder):
    args = [a.replace("{t}", str(folder)) for a in args]
    before = _tree(folder)
    r = subprocess.run([sys.executable, "-m", "mine.cli", *args], capture_output=True, text=True, cwd=folder)
    line = one_sentence(r.stderr)
    assert r.returncode == 2 and phrase.lower() in line.lower(), r.stderr
    assert _tree(folder) == before


def test_errors_name_the_archive_not_its_cache(tmp_path):
    """A reader error inside an unpacked archive names the archive the user gave (end to end, with
    and without the cache: tests/mining/test_cache.py)."""
    import tarfile

    from mine.checks import UsageError, archive_named
    from mining.archive import unpack
    from mining.load import DumpError

    arch = tmp_path / "dump.tar.xz"
    with tarfile.open(arch, "w:xz"):
        pass
    inner = unpack(arch, cache_dir=tmp_path / "cache") / "pid7" / "launches.jsonl"
    with pytest.raises(UsageError) as exc:
        with archive_named(arch):
            raise DumpError(f"{inner}: holds no parsable launch record")
    assert str(exc.value) == f"{arch}:pid7/launches.jsonl: holds no parsable launch record"
    with pytest.raises(KeyError):  # a bug stays a bug
        with archive_named(arch):
            raise KeyError("x")
