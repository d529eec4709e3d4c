"""An emulated arm64 board: Debian's Python and numpy for aarch64, run on this machine by qemu.

It is a real board as far as RPC is concerned: an aarch64 ``python3`` with ``numpy`` runs
``python -m tilecraft.rpc.server``, loads aarch64 kernel libraries cross-compiled here
(``targets.build(func, "raspberry-pi/4b-aarch64").export_library(...)``) and runs them, all under
``qemu-aarch64-static`` (user-mode emulation: no virtual machine, no kernel, no disk image).

Build the root file system once (under a minute; needs root, ``mmdebstrap`` and a Debian mirror),
then start boards from it::

    sudo python -m tilecraft.rpc.board.emulated_board --build-only   # ~/.cache/tilecraft/arm64-root
    python -m tilecraft.rpc.board.emulated_board -- --port 9091 --key emulated-arm64 \
        --tracker 127.0.0.1:9190
    python -m tilecraft.rpc.board.emulated_board --wheel tilecraft-0.2.0-py3-none-any.whl -- ...

Everything after ``--`` goes to ``rpc.server``. What it does:

1. ``mmdebstrap --variant=extract --architectures=arm64 --include=python3,python3-numpy
   bookworm ROOT``: unpack the packages (and their dependencies) without running any of their
   scripts, so no emulation is needed to build the root.
2. Link ``libblas.so.3`` and ``liblapack.so.3`` from their ``blas/`` and ``lapack/`` folders:
   Debian's alternatives system would make those links in a maintainer script, and numpy
   needs them.
3. Compile the root's Python files to bytecode with this interpreter when it is the root's
   Python version (a maintainer script would, with ``py3compile``): the emulated Python then
   starts in seconds instead of compiling the standard library and numpy under qemu each time.
4. Run ``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3 -m tilecraft.rpc.server ...`` with
   tilecraft on ``PYTHONPATH``: this checkout, the installed package (through a folder holding
   only a link to it: the host's site-packages has x86 numpy), or with ``--wheel`` a wheel
   installed the board's way (``pip install --no-deps --target``: tilecraft alone, numpy is
   Debian's). ``-L`` makes the emulated program see ROOT's dynamic loader and libraries.

The root is cached in ``--root`` (default ``$TILECRAFT_ARM64_ROOT`` or
``~/.cache/tilecraft/arm64-root``) and reused; the tests build it when it is missing
(tests/capabilities.py).

The emulated Python cannot ``exec`` another aarch64 program (that would need binfmt_misc
registrations): the RPC server only forks, so it does not need to.

This script uses the standard library only (and ``tilecraft/__init__.py``, which does too); it
is not imported by the board side of ``rpc``.
"""
from __future__ import annotations

import argparse
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import tilecraft

SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy")
MARKER = ".tilecraft-arm64-root"
BYTECODE_MARKER = ".tilecraft-bytecode"
LIBDIR = "usr/lib/aarch64-linux-gnu"
# the folder holding the tilecraft package: the checkout, or site-packages
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(tilecraft.__file__)))


def default_root() -> str:
    """``$TILECRAFT_ARM64_ROOT``, else ``~/.cache/tilecraft/arm64-root``."""
    return os.environ.get("TILECRAFT_ARM64_ROOT") or \
        os.path.join(os.path.expanduser("~"), ".cache", "tilecraft", "arm64-root")


def qemu() -> str | None:
    return shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


def root_ready(root: str | None = None) -> bool:
    """Whether a finished root is at ``root`` (its marker file and its python3 exist)."""
    root = root or default_root()
    return os.path.isfile(os.path.join(root, MARKER)) and \
        os.path.lexists(os.path.join(root, "usr", "bin", "python3"))


def missing_tools(build: bool) -> list[str]:
    """What is missing to run a board (and, with ``build``, to build its root)."""
    missing = []
    if qemu() is None:
        missing.append("qemu-aarch64-static (Debian: apt-get install qemu-user-static)")
    if build:
        if shutil.which("mmdebstrap") is None:
            missing.append("mmdebstrap (Debian: apt-get install mmdebstrap)")
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            missing.append("root privileges (mmdebstrap builds the root as root)")
    return missing


def link_blas(root: str) -> None:
    """Make the ``libblas.so.3`` / ``liblapack.so.3`` links that update-alternatives would."""
    libdir = os.path.join(root, LIBDIR)
    for lib, sub in (("libblas.so.3", "blas"), ("liblapack.so.3", "lapack")):
        target = os.path.join(libdir, sub, lib)
        link = os.path.join(libdir, lib)
        if not os.path.exists(target):
            raise RuntimeError(f"{target} is missing: the root has no {sub} library")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.join(sub, lib), link)


def build_root(root: str | None = None, suite: str = SUITE, mirror: str | None = None,
               log=print) -> str:
    """Build the arm64 root at ``root`` (atomically: a half-built root is never left there).

    Examples
    --------
    >>> build_root("/tmp/arm64-root")      # doctest: +SKIP
    '/tmp/arm64-root'
    """
    root = os.path.abspath(root or default_root())
    missing = missing_tools(build=True)
    if missing:
        raise RuntimeError("cannot build the arm64 root: missing " + "; ".join(missing))
    partial = f"{root}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(root), exist_ok=True)
    cmd = ["mmdebstrap", "--variant=extract", "--architectures=arm64",
           "--include=" + ",".join(PACKAGES), suite, partial]
    if mirror:
        cmd.append(mirror)
    log(f"building the arm64 root: {' '.join(cmd)}")
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"mmdebstrap failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}")
        link_blas(partial)
        with open(os.path.join(partial, MARKER), "w") as f:
            f.write(f"suite={suite} packages={','.join(PACKAGES)}\n")
        if os.path.exists(root):
            shutil.rmtree(root)
        os.rename(partial, root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"arm64 root ready in {root} ({time.monotonic() - start:.0f} s)")
    return root


def root_python(root: str) -> tuple[int, int] | None:
    """The (major, minor) version of the root's Python (``usr/lib/python3.X/os.py``)."""
    for d in sorted(glob.glob(os.path.join(root, "usr", "lib", "python3.*"))):
        name = os.path.basename(d)[len("python"):]
        if os.path.isfile(os.path.join(d, "os.py")) and name.replace(".", "").isdigit():
            major, minor = name.split(".")
            return int(major), int(minor)
    return None


def precompile(root: str, log=print) -> bool:
    """Compile the root's standard library and ``dist-packages`` to bytecode with this
    interpreter, when it is the root's Python version (bytecode depends on the minor version
    only); returns whether the root has it. Done once per root (a marker file)."""
    marker = os.path.join(root, BYTECODE_MARKER)
    if os.path.exists(marker):
        return True
    version = root_python(root)
    if version != tuple(sys.version_info[:2]):
        log(f"not precompiling the arm64 root: it has Python {version}, this is "
            f"{sys.version_info[0]}.{sys.version_info[1]} (the board starts slower)")
        return False
    dirs = [os.path.join(root, "usr", "lib", f"python{version[0]}.{version[1]}"),
            os.path.join(root, "usr", "lib", "python3", "dist-packages")]
    start = time.monotonic()
    # -x: test suites are never imported by a board; their bad-syntax fixtures fail to compile
    proc = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "-s", root,
                           "-p", "/", "-x", r"[/\\](tests?|idle_test|lib2to3)[/\\]", *dirs],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        log(f"precompiling the arm64 root failed (the board starts slower):\n"
            f"{proc.stdout[-2000:]}")
        return False
    with open(marker, "w") as f:
        f.write(f"python={version[0]}.{version[1]}\n")
    log(f"arm64 root precompiled ({time.monotonic() - start:.0f} s)")
    return True


def ensure_root(root: str | None = None, log=print) -> str:
    """The root at ``root``, built first if it is not there yet (and precompiled).

    Concurrent callers (the workers of ``pytest -n N``, two boards started at once) take turns
    on ``<root>.lock``: one builds, the others find the root ready. Without the lock each would
    build its own and the last one's rename would replace a root the others already run from.
    """
    root = os.path.abspath(root or default_root())
    if root_ready(root) and os.path.exists(os.path.join(root, BYTECODE_MARKER)):
        return root
    os.makedirs(os.path.dirname(root), exist_ok=True)
    with open(f"{root}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not root_ready(root):
                build_root(root, log=log)
            precompile(root, log=log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root


def install_wheel(wheel: str, dest: str) -> str:
    """Install the tilecraft wheel into the folder ``dest`` the board's way: ``pip install
    --no-deps`` (tilecraft alone; the board's numpy is Debian's). Returns ``dest``, the folder
    to give ``board_env`` / ``start_board`` as ``path``.

    Examples
    --------
    >>> site = install_wheel("tilecraft-0.2.0-py3-none-any.whl", "/tmp/site")  # doctest: +SKIP
    >>> start_board(["--port", "0"], path=site)                                 # doctest: +SKIP
    """
    if os.path.exists(dest):
        shutil.rmtree(dest)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-index", "--target", dest, wheel],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install {wheel} into {dest}:\n{proc.stdout[-4000:]}")
    return dest


def tilecraft_path() -> str:
    """The folder to put on the board's ``PYTHONPATH`` for the tilecraft running this script:
    its checkout, or for an installed tilecraft a folder holding only a link to the package
    (the host's site-packages must not be on the board's path: its numpy is for x86)."""
    if tilecraft.IN_CHECKOUT:
        return PACKAGE_PARENT
    folder = os.path.join(tempfile.gettempdir(), f"tilecraft-board-path-{os.getuid()}")
    link = os.path.join(folder, "tilecraft")
    target = os.path.join(PACKAGE_PARENT, "tilecraft")
    os.makedirs(folder, exist_ok=True)
    if os.path.realpath(link) != os.path.realpath(target):
        tmp = f"{link}.{os.getpid()}"
        os.symlink(target, tmp)
        os.replace(tmp, link)
    return folder


def board_command(root: str, module: str = "tilecraft.rpc.server", args=()) -> list[str]:
    """The command that runs ``python3 -m module args`` on the emulated board."""
    q = qemu()
    if q is None:
        raise RuntimeError("qemu-aarch64-static is not installed (apt-get install "
                           "qemu-user-static)")
    return [q, "-L", root, os.path.join(root, "usr", "bin", "python3"), "-m", module, *args]


def board_env(path: str | None = None) -> dict:
    """The environment of the board's Python: ``path`` (the folder holding the ``tilecraft``
    package: ``tilecraft_path()`` by default, or one from ``install_wheel``) on its path, nothing
    of the host's Python (no virtual environment, no PYTHONHOME). Run it with ``cwd=path``:
    ``python -m`` puts the working directory first on ``sys.path``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "LD_LIBRARY_PATH",
                                                       "LD_PRELOAD")}
    env["PYTHONPATH"] = path or tilecraft_path()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # OpenBLAS under emulation: one thread, and no core-type probing surprises
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def start_board(server_args=(), root: str | None = None, path: str | None = None,
                **popen_kwargs) -> subprocess.Popen:
    """Start ``rpc.server`` on an emulated board; returns the process (stdout is the server's).
    ``path`` is the folder holding the ``tilecraft`` it runs (``board_env``).

    Examples
    --------
    >>> proc = start_board(["--port", "0", "--key", "emulated-arm64"], stdout=subprocess.PIPE,
    ...                    text=True)                                  # doctest: +SKIP
    >>> proc.stdout.readline()                                         # doctest: +SKIP
    'rpc server listening on 127.0.0.1:40123 key=emulated-arm64\\n'
    """
    root = os.path.abspath(root or default_root())
    if not root_ready(root):
        raise RuntimeError(f"no arm64 root at {root}: build it with `python -m "
                           f"tilecraft.rpc.board.emulated_board --build-only --root {root}` "
                           f"(as root)")
    path = path or tilecraft_path()
    return subprocess.Popen(board_command(root, "tilecraft.rpc.server", list(server_args)),
                            env=board_env(path), cwd=path, **popen_kwargs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m tilecraft.rpc.board.emulated_board",
                                description="Run the RPC server on an emulated arm64 board.",
                                epilog="Arguments after -- go to rpc.server (default: --host "
                                       "127.0.0.1 --port 9090 --key emulated-arm64 --insecure-local).")
    p.add_argument("--root", default=default_root(), help=f"the arm64 root (default "
                                                          f"{default_root()})")
    p.add_argument("--build-only", action="store_true", help="build the root and exit")
    p.add_argument("--rebuild", action="store_true", help="build the root again")
    p.add_argument("--mirror", help="Debian mirror for mmdebstrap")
    p.add_argument("--wheel", help="run tilecraft from this wheel, installed the board's way "
                                   "(pip install --no-deps) next to the root, instead of "
                                   "from this installation")
    p.add_argument("--check", action="store_true",
                   help="say whether the root and the tools are there, and exit")
    args = p.parse_args(argv)
    root = os.path.abspath(args.root)
    if args.check:
        print(f"root {root}: {'ready' if root_ready(root) else 'not built'}")
        for m in missing_tools(build=not root_ready(root)):
            print(f"missing: {m}")
        return 0 if root_ready(root) and qemu() else 1
    try:
        if args.rebuild or not root_ready(root):
            build_root(root, mirror=args.mirror)
        precompile(root)
        path = install_wheel(args.wheel, root + "-site") if args.wheel else tilecraft_path()
    except RuntimeError as err:
        print(f"emulated_board: {err}", file=sys.stderr)
        return 1
    if args.build_only:
        return 0
    server_args = server_args or ["--host", "127.0.0.1", "--port", "9090", "--key",
                                  "emulated-arm64", "--insecure-local"]
    cmd = board_command(root, "tilecraft.rpc.server", server_args)
    os.chdir(path)
    os.execvpe(cmd[0], cmd, board_env(path))


if __name__ == "__main__":
    sys.exit(main())
