"""Dump archives: a whole dump packed as one `.tar.xz` (how fixtures are committed) reads like the
folder it came from.

`unpack(path)` returns `path` unchanged unless it is a tar archive; an archive is extracted once
into `.mine-cache/<name>-<size>-<mtime>/` beside it (the key changes when the archive does) and that
folder is returned. Members that would land outside the folder (absolute paths, `..`, links) are
refused, so an archive from elsewhere cannot write anywhere else. Not handled: archives of archives.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from vocab.errors import MineError

SUFFIXES = (".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst")


class ArchiveError(MineError, ValueError):
    """The archive cannot be read or holds a member that would escape its folder."""


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


def unpack(path: str | Path) -> Path:
    p = Path(path)
    if not is_archive(p):
        return p
    st = p.stat()
    dest = p.parent / ".mine-cache" / f"{p.name}-{st.st_size}-{st.st_mtime_ns}"
    if (dest / ".complete").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with _open(p) as tar:
            for m in tar.getmembers():
                target = (tmp / m.name).resolve()
                if not (m.isfile() or m.isdir()) or not target.is_relative_to(tmp.resolve()):
                    raise ArchiveError(f"{p}: member {m.name!r} is not a plain file inside the archive's folder")
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArchiveError(f"{p}: not a readable dump archive ({exc})") from None
    except ArchiveError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / ".complete").write_text("")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _open(p: Path) -> tarfile.TarFile:
    if p.name.endswith(".tar.zst"):
        import pyarrow as pa  # zstd through pyarrow, already a dependency

        data = pa.input_stream(str(p), compression="zstd").read()
        import io

        return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    return tarfile.open(p, mode="r:*")
