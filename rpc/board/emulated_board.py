"""An emulated arm64 board: Debian's Python and numpy for aarch64, run on this machine by qemu.

It is a real board as far as RPC is concerned: an aarch64 ``python3`` with ``numpy`` runs
``python -m tilecraft.rpc.server`` from this project, loads aarch64 kernel libraries cross-compiled here
(``targets.build(func, "raspberry-pi/4b-aarch64").export_library(...)``) and runs them, all under
``qemu-aarch64-static`` (user-mode emulation: no virtual machine, no kernel, no disk image).

Build the root file system once (a few minutes; needs root, ``mmdebstrap`` and network access to
a Debian mirror), then start boards from it::

    sudo python rpc/board/emulated_board.py --build-only   # ~/.cache/tilecraft/arm64-root
    python rpc/board/emulated_board.py -- --port 9091 --key emulated-arm64 --tracker 127.0.0.1:9190

Everything after ``--`` goes to ``rpc.server``. What it does:

1. ``mmdebstrap --variant=extract --architectures=arm64 --include=python3,python3-numpy
   bookworm ROOT``: unpack the packages (and their dependencies) without running any of their
   scripts, so no emulation is needed to build the root.
2. Link ``libblas.so.3`` and ``liblapack.so.3`` from their ``blas/`` and ``lapack/`` folders:
   Debian's alternatives system would make those links in a maintainer script, and numpy
   needs them.
3. Run ``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3 -m tilecraft.rpc.server ...`` with this project on
   ``PYTHONPATH``. ``-L`` makes the emulated program see ROOT's dynamic loader and libraries.

The root is cached in ``--root`` (default ``$TILECRAFT_ARM64_ROOT`` or
``~/.cache/tilecraft/arm64-root``) and reused: the tests that need a board run when it exists and
are marked ``slow`` when it must be built first.

The emulated Python cannot ``exec`` another aarch64 program (that would need binfmt_misc
registrations): the RPC server only forks, so it does not need to.

This script uses the standard library only; it is not imported by the board side of ``rpc``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy")
MARKER = ".tilecraft-arm64-root"
LIBDIR = "usr/lib/aarch64-linux-gnu"
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def ensure_root(root: str | None = None, log=print) -> str:
    """The root at ``root``, built first if it is not there yet."""
    root = os.path.abspath(root or default_root())
    if not root_ready(root):
        build_root(root, log=log)
    return root


def board_command(root: str, module: str = "tilecraft.rpc.server", args=()) -> list[str]:
    """The command that runs ``python3 -m module args`` on the emulated board."""
    q = qemu()
    if q is None:
        raise RuntimeError("qemu-aarch64-static is not installed (apt-get install "
                           "qemu-user-static)")
    return [q, "-L", root, os.path.join(root, "usr", "bin", "python3"), "-m", module, *args]


def board_env(project: str = PROJECT) -> dict:
    """The environment of the board's Python: this project on its path, nothing of the host's
    Python (no virtual environment, no PYTHONHOME)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "LD_LIBRARY_PATH",
                                                       "LD_PRELOAD")}
    env["PYTHONPATH"] = project
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # OpenBLAS under emulation: one thread, and no core-type probing surprises
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def start_board(server_args=(), root: str | None = None, project: str = PROJECT,
                **popen_kwargs) -> subprocess.Popen:
    """Start ``rpc.server`` on an emulated board; returns the process (stdout is the server's).

    Examples
    --------
    >>> proc = start_board(["--port", "0", "--key", "emulated-arm64"], stdout=subprocess.PIPE,
    ...                    text=True)                                  # doctest: +SKIP
    >>> proc.stdout.readline()                                         # doctest: +SKIP
    'rpc server listening on 127.0.0.1:40123 key=emulated-arm64\\n'
    """
    root = os.path.abspath(root or default_root())
    if not root_ready(root):
        raise RuntimeError(f"no arm64 root at {root}: build it with `python "
                           f"rpc/board/emulated_board.py --build-only --root {root}` (as root)")
    return subprocess.Popen(board_command(root, "tilecraft.rpc.server", list(server_args)),
                            env=board_env(project), cwd=project, **popen_kwargs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python rpc/board/emulated_board.py",
                                description="Run the RPC server on an emulated arm64 board.",
                                epilog="Arguments after -- go to rpc.server (default: --host "
                                       "127.0.0.1 --port 9090 --key emulated-arm64).")
    p.add_argument("--root", default=default_root(), help=f"the arm64 root (default "
                                                          f"{default_root()})")
    p.add_argument("--build-only", action="store_true", help="build the root and exit")
    p.add_argument("--rebuild", action="store_true", help="build the root again")
    p.add_argument("--mirror", help="Debian mirror for mmdebstrap")
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
    except RuntimeError as err:
        print(f"emulated_board: {err}", file=sys.stderr)
        return 1
    if args.build_only:
        return 0
    server_args = server_args or ["--host", "127.0.0.1", "--port", "9090", "--key",
                                  "emulated-arm64"]
    cmd = board_command(root, "tilecraft.rpc.server", server_args)
    os.chdir(PROJECT)
    os.execvpe(cmd[0], cmd, board_env())


if __name__ == "__main__":
    sys.exit(main())
