"""External tools the LLVM back end needs for shared libraries: the ``ld.lld`` linker.

``Module.export_library`` links, and so does building for this machine: a host module is
linked into a shared library and loaded in-process (``targets.llvm.compiler``). Exports, for any
triple, are linked with ``ld.lld``; a library for this process with the system's GNU linker
(``ld.bfd``) where it is installed (``find_host_linker``). Nothing here imports LLVM.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from tilecraft.errors import TilecraftError


class ToolchainError(TilecraftError, RuntimeError):
    """A tool the build needs (``ld.lld``) is missing or failed."""


def find_lld() -> str:
    """The path of ``ld.lld`` (or the newest ``ld.lld-NN`` on PATH); ToolchainError if none."""
    found = shutil.which("ld.lld")
    if found:
        return found
    best, best_version = None, -1
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"ld\.lld-(\d+)", name)
            path = os.path.join(directory, name)
            if m and int(m.group(1)) > best_version and os.access(path, os.X_OK):
                best, best_version = path, int(m.group(1))
    if best is None:
        raise ToolchainError("ld.lld was not found on PATH; it links the shared libraries that "
                             "building for this machine loads and export_library writes. Install lld (Debian/Ubuntu: apt-get install lld; "
                             "macOS: brew install lld) or put ld.lld-NN on PATH.")
    return best


def find_host_linker() -> str:
    """The linker for libraries this process loads: GNU ``ld.bfd`` when it is on PATH, else
    ``ld.lld`` (``find_lld``); ToolchainError if neither.

    Both link the same objects into an equivalent library; the GNU linker starts in about
    2 ms where ``ld.lld`` (loading ``libLLVM``) takes about 20 ms, and a build for this
    machine links every time it is not served by the cache. A plain ``ld.bfd`` is the native
    linker (cross linkers carry a triple prefix), so it is only used for this machine.
    """
    return shutil.which("ld.bfd") or find_lld()


def link_shared(objects: list[bytes], output: str, needed: tuple[str, ...] = (),
                stub_object: bytes | None = None, linker: str | None = None) -> None:
    """Link object files (bytes) into the shared library ``output``, written atomically.

    Undefined symbols (``pthread_create``, ``snprintf``, ``expf``, ...) are left to the dynamic
    loader. ``needed`` lists libraries to record as ``DT_NEEDED`` (``libm.so.6``) so that the
    loader brings them in; no copy of them is needed here: each is stood in for by an empty
    library with that soname, linked from ``stub_object`` (an empty object for the target).
    ``-Bsymbolic`` makes the library use its own globals even if another library exports the
    same names. ``linker``: the linker's path (default: ``find_lld()``); GNU ``ld.bfd`` takes
    the same options.
    """
    lld = linker or find_lld()
    output = os.path.abspath(os.fspath(output))
    directory = os.path.dirname(output)
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tilecraft-link-") as tmp:
        paths = _write_objects(tmp, objects)
        stubs = []
        if needed:
            stub_o = os.path.join(tmp, "stub.o")
            with open(stub_o, "wb") as f:
                f.write(stub_object)
            for name in needed:
                stub = os.path.join(tmp, name)
                _run([lld, "-shared", "-soname", name, "-o", stub, stub_o])
                stubs.append(stub)
        fd, partial = tempfile.mkstemp(prefix=".tmp-", suffix=".so", dir=directory)
        os.close(fd)
        cmd = [lld, "-shared", "-Bsymbolic", "-z", "noexecstack", "--build-id=sha1",
               "--hash-style=both", "-soname", os.path.basename(output), "-o", partial, *paths,
               *stubs]
        try:
            _run(cmd)
            os.chmod(partial, 0o755)
            os.replace(partial, output)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)


def _write_objects(folder: str, objects: list[bytes]) -> list[str]:
    """Each object file (bytes) written into ``folder``; their paths, in order."""
    paths = []
    for i, data in enumerate(objects):
        path = os.path.join(folder, f"obj{i}.o")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


def link_relocatable(objects: list[bytes]) -> bytes:
    """Merge object files (bytes) into one relocatable object (``ld.lld -r``)."""
    if len(objects) == 1:
        return objects[0]
    lld = find_lld()
    with tempfile.TemporaryDirectory(prefix="tilecraft-link-") as tmp:
        paths = _write_objects(tmp, objects)
        out = os.path.join(tmp, "merged.o")
        _run([lld, "-r", "-o", out, *paths])
        with open(out, "rb") as f:
            return f.read()


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"{os.path.basename(cmd[0])} failed ({' '.join(cmd)}):\n"
                             f"{proc.stderr.strip()}")
