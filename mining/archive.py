"""Dump archives: a whole dump packed as one `.tar.xz` (how fixtures are committed) reads like the
folder it came from.

`unpack(path)` returns `path` unchanged unless it is a tar archive. An archive is extracted once
into the user's cache (`mining/cache.py`: `<cache>/archives/<name>-<hash of its path>/`) and that
folder is returned; the entry records the archive's size and mtime, and a changed archive replaces
it (one copy per archive, never a second). With `cache=False`, or when the cache cannot be written,
the archive is extracted into a temporary folder that is removed when the process ends: nothing is
ever written beside the archive, so an archive in a read-only folder reads like any other.

Members that would land outside the folder (absolute paths, `..`, links) are refused, so an archive
from elsewhere cannot write anywhere else. `user_path(text)` rewrites the folders this process
unpacked into the archive path the user gave (`<archive>:pid600/launches.jsonl`), so that a reader
error names what the user typed. Two processes unpacking one archive at once each extract into a
temporary folder beside the entry; the first to finish installs it and the other uses that copy.
Not handled: archives of archives; a process reading an entry while another replaces it because
the archive changed in between; temporary folders of a process killed while extracting (inside
the cache, removed with it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from mining.cache import cache_root, entry_name
from vocab.errors import MineError

SUFFIXES = (".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst")
STAMP = ".complete"   # holds "<size> <mtime_ns>" of the archive the folder was unpacked from

_UNPACKED: dict[str, str] = {}   # folder unpacked into -> the archive path as the user gave it


class ArchiveError(MineError, ValueError):
    """The archive cannot be read or holds a member that would escape its folder."""


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


def unpack(path: str | os.PathLike, cache: bool = True, cache_dir: str | os.PathLike | None = None) -> Path:
    p = Path(path)
    if not is_archive(p):
        return p
    st = p.stat()
    stamp = f"{st.st_size} {st.st_mtime_ns}"
    dest = cache_root(cache_dir) / "archives" / entry_name(p) if cache else None
    if dest is not None and _stamp(dest) == stamp:
        return _named(dest, p)
    if dest is not None:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        except OSError:   # a cache that cannot be written is not used
            dest = None
    if dest is None:
        tmp = Path(tempfile.mkdtemp(prefix="mine-unpack-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        _extract(p, tmp)
        return _named(tmp, p)
    try:
        _extract(p, tmp)
        (tmp / STAMP).write_text(stamp)
        _install(tmp, dest, stamp)
    except OSError:   # the cache could not take it: unpack without the cache
        shutil.rmtree(tmp, ignore_errors=True)
        return unpack(p, cache=False)
    return _named(dest, p)


def _install(tmp: Path, dest: Path, stamp: str) -> None:
    """`tmp` becomes `dest`, unless `dest` already is this archive's complete copy (a process that
    unpacked it at the same time): a complete copy another process may be reading is never moved.
    A stale copy (of an archive since changed) is moved aside and removed."""
    for _ in range(3):
        try:
            tmp.rename(dest)   # refused while dest exists (a directory that is not empty)
            return
        except OSError:
            if _stamp(dest) == stamp:
                shutil.rmtree(tmp, ignore_errors=True)
                return
        old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
        try:
            dest.rename(old)
        except FileNotFoundError:
            continue
        shutil.rmtree(old, ignore_errors=True)
    raise OSError(f"{dest}: could not be replaced")


def user_path(text: str) -> str:
    """`text` with every folder this process unpacked an archive into named as that archive
    (`<archive>:pid600/launches.jsonl`, or `<archive>` for the folder itself)."""
    for folder, archive in _UNPACKED.items():
        text = text.replace(folder + os.sep, f"{archive}:").replace(folder, archive)
    return text


def _named(folder: Path, archive: Path) -> Path:
    _UNPACKED[str(folder)] = str(archive)
    return folder


def _stamp(folder: Path) -> str | None:
    try:
        return (folder / STAMP).read_text()
    except OSError:
        return None


def _extract(p: Path, into: Path) -> None:
    try:
        with _open(p) as tar:
            for m in tar.getmembers():
                target = (into / m.name).resolve()
                if not (m.isfile() or m.isdir()) or not target.is_relative_to(into.resolve()):
                    raise ArchiveError(f"{p}: member {m.name!r} is not a plain file inside the archive's folder")
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        shutil.rmtree(into, ignore_errors=True)
        raise ArchiveError(f"{p}: not a readable dump archive ({exc})") from None
    except ArchiveError:
        shutil.rmtree(into, ignore_errors=True)
        raise


def _open(p: Path) -> tarfile.TarFile:
    if p.name.endswith(".tar.zst"):
        import io

        import pyarrow as pa  # zstd through pyarrow, already a dependency

        data = pa.input_stream(str(p), compression="zstd").read()
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    return tarfile.open(p, mode="r:*")
