"""Suite-wide fixtures and rules.

* The ``requires`` mark (``capabilities.needs``): a missing driver, tool or library skips the
  test on a developer's machine and fails it under ``CI=true`` (tests/capabilities.py).
* ``tilecraft_wheel``: the wheel built from this tree, once per run (the workers of
  ``pytest -n N`` share it).
* ``arm64_board``: the emulated arm64 board's root file system (built when missing) and the
  wheel installed for it the board's way, numpy being Debian's.
* Under ``pytest -n N`` (pytest-xdist) the workers share the cores: each worker's parallel
  kernel builds and tuning builders take ``$TILECRAFT_JOBS`` = cores / N unless it is set.
* The pre-0.2 top-level names (``import relax``, ``from tensorir import te``) do not import: the
  checkout's root is on sys.path while tests run, so without this such an import would load a
  second copy of a package beside ``tilecraft.relax`` and pass by accident (docs/migration.md).
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.abc
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import capabilities  # tests/ is on sys.path: pytest puts this file's folder there

REPO = capabilities.REPO

OLD_TOP_LEVEL = ("tensorir", "targets", "rpc", "metaschedule", "relax")


class _RefuseOldTopLevel(importlib.abc.MetaPathFinder):
    """Refuse ``import relax`` & co.: the packages are ``tilecraft.relax`` & co. now."""

    def find_spec(self, name, path, target=None):
        if path is None and name in OLD_TOP_LEVEL:
            raise ImportError(f"import {name}: tilecraft's packages live in its namespace since "
                              f"0.2 (from tilecraft import {name}; docs/migration.md)", name=name)
        return None


sys.meta_path.insert(0, _RefuseOldTopLevel())

# What a wheel build must not see: version control, environments and build output at the top,
# caches and compiled files anywhere.
TOP_NOT_BUILT = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", ".device",
                                       ".tune_gpu")
NOT_BUILT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", ".pytest_cache",
                                   ".hypothesis")


def _not_built(folder: str, names: list[str]) -> set[str]:
    top = TOP_NOT_BUILT(folder, names) if os.path.samefile(folder, REPO) else set()
    return set(top) | set(NOT_BUILT(folder, names))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires(what, available, how_to_install): skip (CI=true: fail) when a "
                   "driver, tool or library is missing (tests/capabilities.py)")
    _share_the_cores()


def _share_the_cores() -> None:
    """In a pytest-xdist worker, ``$TILECRAFT_JOBS`` = this machine's cores / the workers
    (unless set): N workers each forking one build process per core would run N x cores
    processes on the cores (targets.parallel, metaschedule.LocalBuilder read it). A setting of
    the worker process, made before any test runs; tests that need another use monkeypatch."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or os.environ.get("TILECRAFT_JOBS"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    os.environ["TILECRAFT_JOBS"] = str(max(1, cores // int(workers)))


def pytest_report_header(config):
    rule = "fails" if capabilities.IN_CI else "is skipped"
    return f"CI={os.environ.get('CI', '')!r}: a test whose driver or tool is missing {rule}"


def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        capabilities.requires(**mark.kwargs)


@contextlib.contextmanager
def exclusive(lock_file: "str | os.PathLike"):
    """Hold an exclusive lock on ``lock_file`` (created if missing): one process at a time, e.g.
    one pytest-xdist worker making what the others then reuse."""
    with open(lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder ``name`` shared by the workers of one ``pytest -n N`` run (their common base
    temporary folder, as pytest-xdist's documentation suggests), or this process's own
    without xdist. Make its contents under ``exclusive(<folder>.lock)``."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    return folder


def build_wheel(dest: str) -> str:
    """Build the wheel of this tree into ``dest`` (``pip wheel --no-deps --no-build-isolation``)
    from a copy of the tree, so that neither the build's ``build/`` and ``*.egg-info`` land in
    the checkout nor a stale ``build/lib`` (files since deleted) lands in the wheel."""
    src = os.path.join(dest, "src")
    shutil.rmtree(src, ignore_errors=True)       # what a failed build left
    shutil.copytree(REPO, src, ignore=_not_built, symlinks=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--wheel-dir", dest, src],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-4000:]}"
    shutil.rmtree(src)
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return os.path.join(dest, wheels[0])


@pytest.fixture(scope="session")
def tilecraft_wheel(tmp_path_factory) -> str:
    """The path of the wheel built from this tree (built by the first worker that asks)."""
    folder = run_shared_dir(tmp_path_factory, "wheel")
    with exclusive(f"{folder}.lock"):
        built = [f for f in os.listdir(folder) if f.endswith(".whl")]
        return os.path.join(folder, built[0]) if built else build_wheel(str(folder))


@dataclass
class EmulatedBoard:
    """An emulated arm64 board's root and the folder holding the tilecraft it runs."""
    root: str
    path: str

    def server_command(self, *server_args: str) -> list[str]:
        """``python -m tilecraft.rpc.server SERVER_ARGS`` on the board."""
        from tilecraft.rpc.board import emulated_board as eb
        return eb.board_command(self.root, "tilecraft.rpc.server", list(server_args))

    def env(self) -> dict:
        from tilecraft.rpc.board import emulated_board as eb
        return eb.board_env(self.path)


@pytest.fixture(scope="session")
def arm64_board(tilecraft_wheel, tmp_path_factory) -> EmulatedBoard:
    """The emulated arm64 board (``requires`` qemu, and mmdebstrap and root when its file system
    must be built first), running tilecraft from the wheel installed the board's way; start
    servers with ``Proc(board.server_command(...), env=board.env(), cwd=board.path)``."""
    from tilecraft.rpc.board import emulated_board as eb
    root = capabilities.arm64_board_root()
    site = run_shared_dir(tmp_path_factory, "arm64-site")
    with exclusive(f"{site}.lock"):
        done = site / ".installed"          # the workers of `pytest -n N` install it once
        if not done.exists():
            eb.install_wheel(tilecraft_wheel, str(site))
            done.write_text(tilecraft_wheel)
    return EmulatedBoard(root, str(site))
