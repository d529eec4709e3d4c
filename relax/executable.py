"""``Executable``: what ``relax.build`` produces — the VM program, its constants and one kernel
library — and its one-file container (``export_library`` / ``load_executable``).

The container is a zip archive (stored, not compressed) with

* ``executable.json`` — metadata: format and ABI versions, the target, the triple, the
  functions, the kernels, the constants' dtypes and shapes;
* ``program.json`` — the VM program (instruction lists, see ``relax.vm``);
* ``kernels.so`` — the shared library of every kernel (``targets``' ``export_library``,
  linked with ``ld.lld``; absent when the program has no kernel);
* ``constants/<i>.bin`` — each constant's raw bytes, little-endian, C order (no pickle).

It is written atomically (a temporary file, then ``os.replace``). Loading needs only numpy and
ctypes: the library is extracted to a private temporary directory, loaded with
``targets.load_module`` and the directory is removed at once (the mapping stays). An executable
cross-compiled for another machine loads anywhere for inspection; a ``VirtualMachine`` on it
raises ``RuntimeError`` saying where it can run.

Examples
--------
>>> exe = relax.build(mod, "raspberry-pi/4b-aarch64")        # doctest: +SKIP
>>> exe.export_library("model.tcx")                         # doctest: +SKIP
>>> # on the board, with numpy only:
>>> exe = relax.load_executable("model.tcx")                # doctest: +SKIP
>>> vm = relax.VirtualMachine(exe, targets.cpu(0))          # doctest: +SKIP
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from typing import Any

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.targets.runtime import abi
from tilecraft.targets.runtime.elf import NotELFError, read_elf_header
from tilecraft.targets.fileio import atomic_write
from tilecraft.targets.runtime.module import Module, host_arch, load_module
from tilecraft.targets.runtime.ndarray import aligned_empty

FORMAT = "tilecraft-relax-executable"
FORMAT_VERSION = 1
PROGRAM_VERSION = 1
METADATA_NAME = "executable.json"
PROGRAM_NAME = "program.json"
LIBRARY_NAME = "kernels.so"


class Executable:
    """A built Relax program: run it with ``relax.VirtualMachine(exe, device)``.

    Attributes
    ----------
    program : dict
        The VM program (plain JSON data): ``functions`` by name, each with its parameters,
        register count and instruction list; ``kernels``, the kernel names.
    constants : list[numpy.ndarray]
        Read-only constant tensors the program refers to by index.
    kernel_module : targets.Module | None
        The compiled kernels (one module); None when there are none or they cannot be loaded here.
    target : str
        The target the kernels were compiled for.
    build_stats : targets.BuildStats | None
        Where ``relax.build``'s time went, phase by phase, and how many kernels came from the
        kernel cache (None for a loaded executable).
    """

    def __init__(self, program: dict, constants: list, kernel_module: Module | None,
                 target: str, *, library_bytes: bytes | None = None,
                 unavailable: str | None = None, triple: str | None = None):
        self.program = program
        self.constants = [_frozen(c) for c in constants]
        self.kernel_module = kernel_module
        self.target = str(target)
        self.triple = triple or (getattr(kernel_module, "triple", None) if kernel_module else None)
        self._library_bytes = library_bytes
        self._unavailable = unavailable
        self.build_stats = None

    # -- inspection -------------------------------------------------------------------------
    @property
    def function_names(self) -> list[str]:
        return list(self.program["functions"])

    @property
    def kernel_names(self) -> list[str]:
        return list(self.program.get("kernels", []))

    def unavailable_reason(self) -> str | None:
        """None if the program can run in this process, else why not."""
        if self._unavailable:
            return self._unavailable
        mod = self.kernel_module
        if mod is not None:
            reason = mod._unavailable_reason()
            if reason:
                return reason
        return None

    def stats(self) -> dict[str, Any]:
        """Counts per function: instructions, kernel calls, planned storages and their bytes."""
        out = {}
        for name, fn in self.program["functions"].items():
            counts: dict[str, int] = {}
            static_bytes = 0
            for ins in _walk(fn["code"]):
                counts[ins[0]] = counts.get(ins[0], 0) + 1
                if ins[0] == "alloc_storage" and isinstance(ins[2], int):
                    static_bytes += ins[2]
            out[name] = {"instructions": sum(counts.values()),
                         "kernel_calls": counts.get("call_kernel", 0),
                         "storages": counts.get("alloc_storage", 0),
                         "static_storage_bytes": static_bytes,
                         "fresh_allocations": counts.get("alloc", 0)}
        return out

    def as_text(self) -> str:
        """The VM program, one instruction per line."""
        lines = []
        for name, fn in self.program["functions"].items():
            lines.append(f"function {name}({', '.join(fn['params'])}): {fn['num_regs']} registers")
            _format_code(fn["code"], lines, "  ")
            lines.append(f"  return {_fmt_reg(fn['ret'])}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"<relax.Executable target={self.target!r} functions={self.function_names} "
                f"kernels={len(self.kernel_names)}>")

    # -- export -----------------------------------------------------------------------------
    def library_bytes(self) -> bytes | None:
        """The kernel library as linked for the target (links it on first use)."""
        if self._library_bytes is None and self.kernel_module is not None:
            with tempfile.TemporaryDirectory(prefix="tilecraft-exe-") as tmp:
                path = os.path.join(tmp, LIBRARY_NAME)
                self.kernel_module.export_library(path)
                with open(path, "rb") as f:
                    self._library_bytes = f.read()
        return self._library_bytes

    def export_library(self, path: str) -> str:
        """Write the executable to ``path`` as one file (atomically).

        Raises ``targets.ToolchainError`` when ``ld.lld`` (needed to link the kernels) is
        missing.

        Examples
        --------
        >>> exe.export_library("/tmp/mlp.tcx")                  # doctest: +SKIP
        '/tmp/mlp.tcx'
        """
        path = os.fspath(path)
        lib = self.library_bytes()
        consts_meta = []
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
            for i, c in enumerate(self.constants):
                name = f"constants/{i}.bin"
                le = c.astype(c.dtype.newbyteorder("<"), copy=False)
                zf.writestr(name, np.require(le, requirements="C").tobytes())
                consts_meta.append({"file": name, "dtype": c.dtype.name, "shape": list(c.shape)})
            meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "program_version": PROGRAM_VERSION, "abi_version": abi.ABI_VERSION,
                    "target": self.target, "triple": self.triple,
                    "functions": self.function_names, "kernels": self.kernel_names,
                    "library": LIBRARY_NAME if lib is not None else None,
                    "constants": consts_meta, "byteorder": "little"}
            zf.writestr(METADATA_NAME, json.dumps(meta, indent=1))
            zf.writestr(PROGRAM_NAME, json.dumps(self.program, separators=(",", ":")))
            if lib is not None:
                zf.writestr(LIBRARY_NAME, lib)
        atomic_write(path, buf.getvalue())
        return path


def _frozen(c) -> np.ndarray:
    arr = np.require(c, requirements="C")
    if arr.flags.writeable or arr.base is not None:
        out = aligned_empty(arr.shape, arr.dtype)
        np.copyto(out, arr)
        arr = out
    arr.setflags(write=False)
    return arr


def _walk(code):
    for ins in code:
        yield ins
        if ins[0] == "if":
            yield from _walk(ins[3])
            yield from _walk(ins[5])


def _fmt_reg(r):
    return f"%{r}" if isinstance(r, int) else str(r)


def _format_code(code, lines, indent):
    for ins in code:
        if ins[0] == "if":
            lines.append(f"{indent}%{ins[1]} = if %{ins[2]}:")
            _format_code(ins[3], lines, indent + "    ")
            lines.append(f"{indent}    -> %{ins[4]}")
            lines.append(f"{indent}  else:")
            _format_code(ins[5], lines, indent + "    ")
            lines.append(f"{indent}    -> %{ins[6]}")
        else:
            lines.append(f"{indent}{ins[0]} " + " ".join(json.dumps(a) for a in ins[1:]))


class ExecutableFormatError(TilecraftError, ValueError):
    """The file is not a tilecraft executable, or one of a version this runtime cannot read."""


def load_executable(path: str) -> Executable:
    """Load an executable written by ``Executable.export_library``.

    Needs only numpy and ctypes (no LLVM, no compiler): this is what runs on a board.

    Examples
    --------
    >>> exe = load_executable("/tmp/mlp.tcx")                 # doctest: +SKIP
    >>> vm = VirtualMachine(exe, targets.cpu(0))              # doctest: +SKIP
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no executable at {path}")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ExecutableFormatError(f"{path} is not a tilecraft executable (not a zip "
                                    f"container)") from None
    with zf:
        names = set(zf.namelist())
        if METADATA_NAME not in names or PROGRAM_NAME not in names:
            raise ExecutableFormatError(f"{path} is not a tilecraft executable (no "
                                        f"{METADATA_NAME} / {PROGRAM_NAME})")
        meta = json.loads(zf.read(METADATA_NAME))
        if meta.get("format") != FORMAT:
            raise ExecutableFormatError(f"{path}: unknown format {meta.get('format')!r}")
        if meta.get("format_version") != FORMAT_VERSION or \
                meta.get("program_version") != PROGRAM_VERSION:
            raise ExecutableFormatError(
                f"{path}: executable format {meta.get('format_version')} / program "
                f"{meta.get('program_version')}; this runtime reads {FORMAT_VERSION} / "
                f"{PROGRAM_VERSION}: rebuild it with this version of tilecraft")
        if meta.get("abi_version") != abi.ABI_VERSION:
            raise ExecutableFormatError(f"{path}: kernel ABI version {meta.get('abi_version')}; "
                                        f"this runtime speaks {abi.ABI_VERSION}")
        program = json.loads(zf.read(PROGRAM_NAME))
        constants = []
        for c in meta["constants"]:
            raw = zf.read(c["file"])
            dtype = np.dtype(c["dtype"])
            arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
            constants.append(arr.reshape(tuple(c["shape"])))
        lib = zf.read(meta["library"]) if meta.get("library") else None
    module, reason = None, None
    if lib is not None:
        module, reason = _load_library(lib, path)
    return Executable(program, constants, module, meta.get("target", ""), library_bytes=lib,
                      unavailable=reason, triple=meta.get("triple"))


def _load_library(lib: bytes, path: str):
    """dlopen the kernel library from a private temporary directory, or say why it cannot run
    here."""
    try:
        header = read_elf_header(lib[:64])
    except NotELFError:
        header = None
    if header is not None:
        host = host_arch()
        if not header.arch_matches(host):
            return None, (f"{path} holds kernels for a {header.bits}-bit {header.machine_name} "
                          f"machine; this one is {host}. Copy the file to its board and load it "
                          f"there (relax.load_executable needs only numpy)")
    tmp = tempfile.mkdtemp(prefix="tilecraft-exe-")
    try:
        lib_path = os.path.join(tmp, LIBRARY_NAME)
        with open(lib_path, "wb") as f:
            f.write(lib)
        os.chmod(lib_path, 0o700)
        module = load_module(lib_path)
    finally:
        # the dynamic loader keeps its mapping: the file is no longer needed
        shutil.rmtree(tmp, ignore_errors=True)
    return module, None


__all__ = ["Executable", "ExecutableFormatError", "load_executable"]
