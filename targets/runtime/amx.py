"""The Linux permission to use Intel AMX tiles, requested before a module that uses them runs.

Linux keeps AMX's 8 KiB of tile data out of a process's register state until the process asks
for it: ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` (x86-64 syscall 158, Linux
5.16 and newer). A tile instruction run before that faults (SIGILL). A module whose functions
carry ``uses_amx`` in their metadata (the int8 dense kernels of an ``+amx-int8`` target,
``targets.llvm.amx``) calls ``request_amx`` when it is loaded (``Module._prepare_cpu``): in the
building process and in the RPC server's loader alike. A refused request raises ``AMXError``
naming how to build without AMX.

Needs only ctypes (the board side of ``rpc`` imports it; Python 3.9).

Examples
--------
>>> request_amx()           # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from tilecraft.errors import TilecraftError

__all__ = ["AMXError", "request_amx", "amx_permitted"]

SYS_ARCH_PRCTL = 158            # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

_GRANTED = False

HOW_TO_AVOID = ("build the model for a target without AMX, e.g. "
                "relax.build(mod, \"llvm -mattr=-amx-int8\"), to use the AVX-512 VNNI kernels")


class AMXError(TilecraftError, RuntimeError):
    """This process cannot use Intel AMX (the OS refused, or it is not x86-64 Linux)."""


def amx_permitted() -> bool:
    """Whether ``request_amx`` succeeded in this process."""
    return _GRANTED


def request_amx() -> None:
    """Ask Linux for the AMX tile data state (once per process; a no-op once granted).

    Raises
    ------
    AMXError
        Not x86-64 Linux, or the kernel refused (older than 5.16, or AMX disabled), with the
        reason and how to build without AMX.
    """
    global _GRANTED
    if _GRANTED:
        return
    machine = platform.machine().lower()
    if not platform.system() == "Linux" or machine not in ("x86_64", "amd64"):
        raise AMXError(f"this module uses Intel AMX tiles, which need x86-64 Linux (this is "
                       f"{platform.system()} on {machine}); {HOW_TO_AVOID}")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                      ctypes.c_ulong(XFEATURE_XTILEDATA))
    if rc != 0:
        err = ctypes.get_errno()
        raise AMXError(f"this module uses Intel AMX tiles, but Linux refused the AMX state "
                       f"(arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: "
                       f"{os.strerror(err)}; Linux 5.16 or newer with AMX enabled is needed); "
                       f"{HOW_TO_AVOID}")
    _GRANTED = True
