"""Where mine keeps its caches (mining/cache.py, mining/archive.py; issue 20).

One folder per user (`--cache-dir`, else $MINE_CACHE_DIR, else $XDG_CACHE_HOME/mine, else
~/.cache/mine); nothing is ever written beside a dump or an archive, so one in a read-only folder
reads like any other; `cache=False` (`--no-cache`) writes nothing anywhere and removes the
temporary folder an archive was unpacked into; errors name the archive the user gave, never the
folder it was unpacked into. The CLI side runs `mine analyze` in fresh processes, since the
temporary folder is removed when the process ends.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mining import archive
from mining.cache import ENV, cache_root
from mining.load import DumpError, load_dump
from paths import FIXTURES, ROOT

PROBE = FIXTURES / "capture" / "probe.tar.xz"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def read_only(tmp_path):
    """probe.tar.xz alone in a folder without write permission (restored afterwards)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    shutil.copy2(PROBE, folder / PROBE.name)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    yield folder / PROBE.name
    folder.chmod(stat.S_IRWXU)


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "mine"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert cache_root() == tmp_path / "home" / ".cache" / "mine"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "mine"
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "given") == tmp_path / "given"


def test_read_only_archive_is_read_and_nothing_is_written_beside_it(read_only, tmp_path):
    """(As root the folder's mode does not stop a write; the listing check holds either way.)"""
    before = _files(read_only.parent)
    cache = tmp_path / "cache"
    d = load_dump(read_only, cache_dir=cache)
    assert len(d.launches) > 0
    assert _files(read_only.parent) == before
    assert d.source.is_relative_to(cache / "archives")
    assert list((cache / "frames").rglob("*.parquet"))
    again = load_dump(read_only, cache_dir=cache)   # from the cache: the same frames
    assert again.launches.equals(d.launches)


def test_a_changed_archive_replaces_its_entry(tmp_path):
    arch = tmp_path / PROBE.name
    shutil.copy2(PROBE, arch)
    cache = tmp_path / "cache"
    load_dump(arch, cache_dir=cache)
    os.utime(arch, ns=(1, 2))
    load_dump(arch, cache_dir=cache)
    assert len(list((cache / "archives").iterdir())) == 1   # one copy per archive, never a second
    assert (next((cache / "archives").iterdir()) / archive.STAMP).read_text().endswith(" 2")


def test_unpacks_at_the_same_time_share_one_entry(tmp_path):
    import threading

    arch = tmp_path / PROBE.name
    shutil.copy2(PROBE, arch)
    cache = tmp_path / "cache"
    got = []
    threads = [threading.Thread(target=lambda: got.append(archive.unpack(arch, cache_dir=cache))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and [p.name for p in (cache / "archives").iterdir()] == [got[0].name]
    assert (got[0] / archive.STAMP).is_file() and load_dump(got[0]).launches.shape[0] > 0


def test_no_cache_reads_and_writes_no_cache(tmp_path):
    cache = tmp_path / "cache"
    d = load_dump(PROBE, cache=False, cache_dir=cache)
    assert len(d.launches) > 0 and not cache.exists()


def test_an_unwritable_cache_is_not_used(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")   # a cache folder under a file cannot be made, not even by root
    d = load_dump(PROBE, cache_dir=blocker / "cache")
    assert len(d.launches) > 0 and blocker.read_text() == ""


def _broken_archive(folder: Path) -> Path:
    """A dump archive whose only launch file holds no parsable record."""
    arch = folder / "broken.tar.xz"
    with tarfile.open(arch, "w:xz") as tar:
        data = b"this is not a launch record\n"
        info = tarfile.TarInfo("pid7/launches.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return arch


def test_library_errors_name_the_archive(tmp_path):
    arch = _broken_archive(tmp_path)
    with pytest.raises(DumpError) as exc:
        load_dump(arch, cache_dir=tmp_path / "cache")
    assert archive.user_path(str(exc.value)).startswith(f"{arch}:pid7/launches.jsonl")


def _mine(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "XDG_CACHE_HOME")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "mine.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_cli_no_cache_leaves_no_file_anywhere(read_only, tmp_path):
    home, tmp, cache = tmp_path / "home", tmp_path / "tmp", tmp_path / "cache"
    home.mkdir()
    tmp.mkdir()
    before = _files(read_only.parent)
    r = _mine(["analyze", str(read_only), "--no-cache"],
              {"HOME": str(home), "TMPDIR": str(tmp), ENV: str(cache)}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert _files(read_only.parent) == before
    assert _files(tmp) == [] and not cache.exists() and _files(home) == []


def test_cli_cache_dir_option_and_environment_are_honoured(read_only, tmp_path):
    home, chosen, env_dir = tmp_path / "home", tmp_path / "chosen", tmp_path / "env"
    home.mkdir()
    r = _mine(["analyze", str(read_only), "--cache-dir", str(chosen)], {"HOME": str(home), ENV: str(env_dir)},
              tmp_path)
    assert r.returncode == 0, r.stderr
    assert list((chosen / "archives").iterdir()) and list((chosen / "frames").rglob("*.parquet"))
    assert not env_dir.exists() and _files(home) == []   # the option wins over the variable
    r = _mine(["analyze", str(read_only)], {"HOME": str(home), ENV: str(env_dir)}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert list((env_dir / "archives").iterdir()) and _files(home) == []
    r = _mine(["analyze", str(read_only)], {"HOME": str(home)}, tmp_path)   # the default: per user
    assert r.returncode == 0, r.stderr
    assert list((home / ".cache" / "mine" / "archives").iterdir())


@pytest.mark.parametrize("flags", [[], ["--no-cache"]])
def test_cli_errors_name_the_archive_not_its_cache(tmp_path, flags):
    arch = _broken_archive(tmp_path)
    r = _mine(["analyze", str(arch), *flags], {ENV: str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}, ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{arch}:pid7/launches.jsonl" in r.stderr, r.stderr
    assert "archives" not in r.stderr and "mine-unpack" not in r.stderr, r.stderr
