"""Fixtures of the rpc tests (helpers in ``rpc_testutil``)."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from capabilities import GCC, LLD, requires
from tilecraft import targets

from rpc_testutil import FAULTY_C, Proc, axpb_func, start_server, start_tracker


@pytest.fixture
def procs():
    """Start processes with ``procs.server(...)`` / ``procs.tracker(...)``; all are killed after."""
    started: list[Proc] = []

    class Starter:
        def server(self, *args, **kw) -> Proc:
            p = start_server(*args, **kw)  # wait=False: call p.ready() before using p.port
            started.append(p)
            return p

        def tracker(self, *args, **kw) -> Proc:
            p = start_tracker(*args, **kw)
            started.append(p)
            return p

    yield Starter()
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def kernel_lib(tmp_path_factory):
    """A host kernel library (``axpb_func``) exported with ld.lld."""
    requires(*LLD)
    path = tmp_path_factory.mktemp("rpc-kernels") / "axpb.so"
    targets.build(axpb_func(), "llvm").export_library(str(path))
    return str(path)


@pytest.fixture(scope="session")
def faulty_lib(tmp_path_factory):
    """A tiny library with the kernel ABI, compiled with gcc: ``ok``, ``crash`` (NULL
    dereference: SIGSEGV) and ``spin`` (loops forever)."""
    requires(*GCC)
    cc = shutil.which("gcc") or shutil.which("cc")
    d = tmp_path_factory.mktemp("rpc-faulty")
    src = d / "faulty.c"
    src.write_text(FAULTY_C)
    out = d / "faulty.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=60)
    return str(out)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
