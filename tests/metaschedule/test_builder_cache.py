"""LocalBuilder through the kernel cache: a candidate built before comes from the cache (the
entry is read, not written again), the artifact runs the same, and ``cache=False`` leaves
the cache alone."""
import ctypes
import os

import numpy as np
import pytest

from tilecraft.metaschedule.builder import BuilderInput, LocalBuilder, remove_artifact
from tilecraft.targets import kernel_cache
from tilecraft.targets.kernel_cache import KernelCache
from tilecraft.targets.llvm import compiler
from tilecraft.tensorir import Schedule, te
from tilecraft import targets


def _candidate(factor):
    A = te.placeholder((64, 24), "float32", "A")
    B = te.compute((64, 24), lambda i, j: A[i, j] * 3.0 + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, _ = sch.get_loops(sch.get_block("B"))
    sch.split(i, [None, factor])
    return sch.mod


def _entries(directory):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(directory) for f in files
                  if not f.startswith("."))


def _runtime_library_entries(directory):
    """The paths of the cache entries of the thread-pool library that a host build loads once
    per process: its object and the shared library linked from it."""
    config = compiler.MachineConfig(targets.Target("llvm"))
    cache = KernelCache(str(directory))
    obj_key = kernel_cache.cache_key("llvm-runtime-shared", compiler._KERNEL_FORMAT,
                                     compiler.machine_key(config))
    obj = cache.get(obj_key)
    keys = [obj_key] + ([compiler._library_key([obj], config.needed_libraries(True))]
                        if obj is not None else [])
    return [cache._path(k) for k in keys]


def _check_artifact(path, rng):
    mod = targets.load_module(path)
    a = rng.standard_normal((64, 24)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, a * 3.0 + 1.0, rtol=1e-6)


def test_builder_uses_the_kernel_cache(tmp_path):
    rng = np.random.default_rng(0)
    cache = tmp_path / "kernels"
    with LocalBuilder(max_workers=1, timeout_sec=120, cache=str(cache)) as builder:
        first, = builder.build([BuilderInput(_candidate(8), "llvm")])
        assert first.error_msg is None, first.error_msg
        entries = _entries(cache)
        assert entries, "the build stored nothing in the cache"
        # an entry read (a hit) gets a fresh modification time; nothing new is written
        for path in entries:
            os.utime(path, (1_000_000, 1_000_000))
        again, = builder.build([BuilderInput(_candidate(8), "llvm")])
        assert again.error_msg is None, again.error_msg
    assert _entries(cache) == entries
    # the process-wide thread-pool library (its object and its linked library) is read once
    # per process, and the builder's worker is the same process: those two may stay old
    once = set(_runtime_library_entries(cache))
    assert all(os.stat(p).st_mtime > 1_000_000 for p in entries if p not in once)
    for res in (first, again):
        _check_artifact(res.artifact_path, rng)
        remove_artifact(res.artifact_path)
    assert KernelCache(str(cache)).info().entries == len(entries)


def test_builder_without_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECRAFT_CACHE_DIR", str(tmp_path / "default"))
    with LocalBuilder(max_workers=1, timeout_sec=120, cache=False) as builder:
        res, = builder.build([BuilderInput(_candidate(4), "llvm")])
    assert res.error_msg is None, res.error_msg
    _check_artifact(res.artifact_path, np.random.default_rng(1))
    remove_artifact(res.artifact_path)
    assert not _entries(tmp_path / "default")


def test_builder_refuses_a_bad_cache_argument():
    with pytest.raises(TypeError, match="cache must be None, a bool or a directory"):
        LocalBuilder(cache=3)
