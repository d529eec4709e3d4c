"""Read an ELF file's header with ``struct`` (no ``readelf`` needed).

Used to tell, before ``dlopen``, that a library was built for another machine, and by tests
to check what a cross-compiler produced.

Examples
--------
>>> info = read_elf_header(open("/bin/ls", "rb").read(64))   # doctest: +SKIP
>>> info.machine_name, info.bits                            # doctest: +SKIP
('x86_64', 64)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tilecraft.errors import TilecraftError

from ..target import ELF_MACHINE

ELF_MAGIC = b"\x7fELF"
MACHINE_NAMES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}
ET_REL, ET_EXEC, ET_DYN = 1, 2, 3

# e_flags bits we care about
EF_ARM_ABI_FLOAT_HARD = 0x400
EF_RISCV_RVC = 0x1
EF_RISCV_FLOAT_ABI_MASK = 0x6
EF_RISCV_FLOAT_ABI_DOUBLE = 0x4


class NotELFError(TilecraftError, ValueError):
    """The bytes are not an ELF file."""


@dataclass(frozen=True)
class ELFHeader:
    bits: int            # 32 or 64
    little_endian: bool
    type: int            # ET_REL (object), ET_DYN (shared library), ...
    machine: int         # e_machine
    flags: int           # e_flags

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"machine {self.machine}")

    def arch_matches(self, arch: str) -> bool:
        """Whether this file is for ``arch`` (a ``targets.target.arch_of_triple`` name)."""
        return ELF_MACHINE.get(arch) == self.machine and (self.bits == 64) == arch.endswith("64")


def read_elf_header(data: bytes) -> ELFHeader:
    """Parse the first 52 (32-bit) or 64 (64-bit) bytes of an ELF file."""
    if len(data) < 52 or data[:4] != ELF_MAGIC:
        raise NotELFError("not an ELF file (bad magic number)")
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise NotELFError(f"not a valid ELF header (class {ei_class}, data {ei_data})")
    endian = "<" if ei_data == 1 else ">"
    e_type, e_machine = struct.unpack_from(endian + "HH", data, 16)
    flags_offset = 48 if ei_class == 2 else 36
    if len(data) < flags_offset + 4:
        raise NotELFError("truncated ELF header")
    (e_flags,) = struct.unpack_from(endian + "I", data, flags_offset)
    return ELFHeader(bits=64 if ei_class == 2 else 32, little_endian=ei_data == 1, type=e_type,
                     machine=e_machine, flags=e_flags)


def read_elf_file_header(path: str) -> ELFHeader:
    with open(path, "rb") as f:
        return read_elf_header(f.read(64))
