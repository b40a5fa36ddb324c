"""Read the launch facts of every kernel in a cubin: parameter layout, registers, shared memory.

Contract: `read_cubin(path_or_bytes) -> Cubin` parses the ELF with pyelftools and decodes the
`.nv.info` (module-wide) and `.nv.info.<entry>` (per kernel) attribute streams. A record is a
format byte, an attribute id, then a value whose length the format decides: no value (2 bytes of
padding), a byte or half-word (2 bytes), or a 2-byte length followed by that many bytes.
The layouts below were worked out from cubins built here with nvcc 13 (sm_80, sm_90a, sm_100a)
whose parameter lists are known from their source (see kernels/src/abi_probe.cu):

  KPARAM_INFO (0x17), 12 bytes: word0 index (0), word1 = offset << 16 | ordinal,
                     word2 bits 18..31 = size in bytes (a CUtensorMap reads 128, a struct its sizeof)
  PARAM_CBANK (0x0a): word0 symbol, word1 = total param bytes << 16 | constant-bank offset of param 0
  CBANK_PARAM_SIZE (0x19): total param bytes
  REGCOUNT (0x2f, in .nv.info): word0 symbol index, word1 registers
  MAX_THREADS (0x05): the launch bound as x, y, z
Static shared memory is the size of `.nv.shared.<entry>`; nvcc counts the 1 KiB the driver reserves
on sm_90 and later inside it, so it is reported as the bytes a block occupies, not what the source
declared. The SM number is bits 8..15 of the ELF `e_flags`.

Not decoded: everything else (exit offsets, barriers, CUDA API version); an attribute id this module
does not know is skipped, never an error. A file that is not an ELF or has no kernels raises
`CubinError` (a ValueError) naming the file.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from vocab.errors import MineError

EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_REGCOUNT = 0x2F

_FMT_NVAL, _FMT_BVAL, _FMT_HVAL, _FMT_SVAL = 1, 2, 3, 4


class CubinError(MineError, ValueError):
    """A file handed to the ABI reader is not a readable cubin."""


@dataclass(frozen=True)
class KParam:
    ordinal: int
    offset: int
    size: int


@dataclass
class Kernel:
    name: str
    params: list[KParam] = field(default_factory=list)
    param_bytes: int | None = None
    cbank_offset: int | None = None
    registers: int | None = None
    static_shared: int = 0
    max_threads: tuple[int, int, int] | None = None


@dataclass
class Cubin:
    sm: int
    kernels: dict[str, Kernel]


def _records(data: bytes):
    """Yield (attribute id, raw value) for one attribute stream."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _FMT_SVAL:
            (n,) = struct.unpack_from("<H", data, i + 2)
            yield attr, data[i + 4 : i + 4 + n]
            i += 4 + n
        elif fmt in (_FMT_HVAL, _FMT_BVAL, _FMT_NVAL):
            yield attr, data[i + 2 : i + 4]
            i += 4
        else:  # unknown format: the rest of the stream cannot be framed
            return


def _words(raw: bytes) -> list[int]:
    return [struct.unpack_from("<I", raw, k)[0] for k in range(0, len(raw) - len(raw) % 4, 4)]


def _kernel_from_info(name: str, data: bytes) -> Kernel:
    k = Kernel(name)
    for attr, raw in _records(data):
        w = _words(raw)
        if attr == EIATTR_KPARAM_INFO and len(w) >= 3:
            k.params.append(KParam(w[1] & 0xFFFF, w[1] >> 16, (w[2] >> 18) & 0x3FFF))
        elif attr == EIATTR_PARAM_CBANK and len(w) >= 2:
            k.cbank_offset, k.param_bytes = w[1] & 0xFFFF, w[1] >> 16
        elif attr == EIATTR_CBANK_PARAM_SIZE and k.param_bytes is None:
            k.param_bytes = struct.unpack("<H", raw[:2])[0]
        elif attr == EIATTR_MAX_THREADS and len(w) >= 3:
            k.max_threads = (w[0], w[1], w[2])
    k.params.sort(key=lambda p: p.ordinal)
    return k


def read_cubin(src: str | Path | bytes) -> Cubin:
    label = "<bytes>" if isinstance(src, bytes) else str(src)
    try:
        blob = src if isinstance(src, bytes) else Path(src).read_bytes()
        elf = ELFFile(io.BytesIO(blob))
        sections = list(elf.iter_sections())
    except (ELFError, struct.error) as exc:
        raise CubinError(f"{label} is not a readable cubin ({exc})") from None
    symtab = elf.get_section_by_name(".symtab")
    kernels: dict[str, Kernel] = {}
    for sec in sections:
        if sec.name.startswith(".nv.info."):
            name = sec.name[len(".nv.info.") :]
            kernels[name] = _kernel_from_info(name, sec.data())
    for sec in sections:
        if sec.name.startswith(".nv.shared.") and sec.name[len(".nv.shared.") :] in kernels:
            kernels[sec.name[len(".nv.shared.") :]].static_shared = sec["sh_size"]
    module_info = elf.get_section_by_name(".nv.info")
    if module_info is not None and symtab is not None:
        for attr, raw in _records(module_info.data()):
            w = _words(raw)
            if attr == EIATTR_REGCOUNT and len(w) >= 2:
                sym = symtab.get_symbol(w[0])
                if sym is not None and sym.name in kernels:
                    kernels[sym.name].registers = w[1]
    for name, k in kernels.items():  # older cubins keep registers in the text section's sh_info
        text = elf.get_section_by_name(f".text.{name}")
        if k.registers is None and text is not None and text["sh_info"] >> 24:
            k.registers = text["sh_info"] >> 24
    if not kernels:
        raise CubinError(f"{label} holds no kernels (.nv.info.<entry> sections)")
    return Cubin(sm=(elf.header["e_flags"] >> 8) & 0xFF, kernels=kernels)
