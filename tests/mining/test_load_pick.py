"""Which process a dump folder reads as by default: the one that launched most, judged by its launch
file's used bytes. The mmap writer grants file space ahead; a process that ends by _exit (no exit
handler cuts the file) leaves zeros behind, which must not count (tests/fixtures/capture/probe_io:
the probe's early-forked child launched once and ended by _exit with a 1 MiB launches.bin)."""

from __future__ import annotations

from mining.load import load_dump
from paths import FIXTURES


def test_the_process_that_launched_most_is_read_not_the_largest_file():
    d = load_dump(FIXTURES / "capture" / "probe_io.tar.xz", cache=False)
    assert d.source.parent.name == "pid575"
    assert len(d.launches) == 210
    child = load_dump(FIXTURES / "capture" / "probe_io.tar.xz", pid=576, cache=False)
    assert len(child.launches) == 1 and child.source.stat().st_size == 1 << 20
