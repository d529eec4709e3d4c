"""Parallel kernel compilation (targets.parallel, targets.build(jobs=...)): the same module as a
serial build, the serial build's errors and warnings, a clear error when a worker dies."""
import os
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import KernelSpec, build_kernels, parallel
from tilecraft.tensorir import IRModule, Schedule, te
from tilecraft.tensorir.expr import TIRError

needs_fork = pytest.mark.skipif(not parallel.can_fork(), reason="forked workers need Linux")


def _funcs(count: int, seed: int = 0):
    """Kernels of different sizes and shapes (some with parallel loops)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k in range(count):
        m, n = int(rng.integers(3, 40)), int(rng.integers(3, 40))
        A = te.placeholder((m, n), "float32", "A")
        B = te.placeholder((n,), "float32", "B")
        r = te.reduce_axis((0, n), "r")
        C = te.compute((m,), lambda i: te.sum(A[i, r] * B[r] + float(k), axis=r), "C")
        func = te.create_prim_func([A, B, C])
        if k % 2:
            sch = Schedule(func)
            (i, _) = sch.get_loops(sch.get_block("C"))
            sch.parallel(i)
            func = sch.func
        out[f"k{k}"] = func.with_attr("global_symbol", f"k{k}")
    return out


def _check(mod, funcs, seed=1):
    rng = np.random.default_rng(seed)
    for name, func in funcs.items():
        m, n = (d.value for d in func.buffers[0].shape)
        a = rng.standard_normal((m, n)).astype("float32")
        b = rng.standard_normal(n).astype("float32")
        c = np.empty(m, "float32")
        mod[name](a, b, c)
        k = int(name[1:])
        np.testing.assert_allclose(c, (a * b + k).sum(axis=1), rtol=1e-4, atol=1e-3)


@needs_fork
def test_parallel_build_is_the_serial_build():
    funcs = _funcs(7)
    serial = targets.build(IRModule(funcs), "llvm", jobs=1, cache=False)
    par = targets.build(IRModule(funcs), "llvm", jobs=3, cache=False)
    assert par.build_stats.jobs == 3 and serial.build_stats.jobs == 1
    assert par.objects() == serial.objects()
    assert par.metadata == serial.metadata
    _check(par, funcs)
    _check(serial, funcs)
    # and for another triple, where nothing runs here
    cross = "llvm -mtriple=aarch64-linux-gnu -num-cores=4"
    assert targets.build(IRModule(funcs), cross, jobs=2, cache=False).objects() == \
        targets.build(IRModule(funcs), cross, jobs=1, cache=False).objects()


def _bad_funcs():
    """Two good kernels around one the LLVM back end rejects (a GPU thread binding)."""
    funcs = _funcs(2)
    A = te.placeholder((64,), "float32", "A")
    B = te.compute((64,), lambda i: A[i] + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    (i,) = sch.get_loops(sch.get_block("B"))
    sch.bind(i, "threadIdx.x")
    funcs["bad"] = sch.mod["main"].with_attr("global_symbol", "bad")
    return funcs


@needs_fork
def test_an_error_in_a_worker_is_the_serial_builds_error():
    funcs = _bad_funcs()
    with pytest.raises(TIRError) as serial:
        targets.build(IRModule(funcs), "llvm", jobs=1, cache=False)
    with pytest.raises(TIRError) as par:
        targets.build(IRModule(funcs), "llvm", jobs=3, cache=False)
    assert str(par.value) == str(serial.value) and "bad" in str(par.value)


def _warns():
    warnings.warn("first", UserWarning)
    return 1


def _warns_late():
    warnings.warn("second", RuntimeWarning)
    return 2


@needs_fork
def test_workers_warnings_are_issued_here_in_task_order():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert parallel.run_tasks([_warns_late, _warns, lambda: 3], jobs=3) == [2, 1, 3]
    assert [(str(w.message), w.category) for w in caught] == [("second", RuntimeWarning),
                                                               ("first", UserWarning)]


@needs_fork
def test_a_dying_worker_is_a_clear_error():
    def die():
        os._exit(3)
    with pytest.raises(RuntimeError, match="worker process died.*crash"):
        parallel.run_tasks([lambda: 1, die, lambda: 2], jobs=2, names=["a", "die", "b"])


def test_jobs_are_checked(monkeypatch):
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(ValueError, match="jobs must be a positive integer"):
            parallel.resolve_jobs(bad)
    monkeypatch.setenv(parallel.ENV_JOBS, "3")
    assert parallel.resolve_jobs(None) == 3
    monkeypatch.setenv(parallel.ENV_JOBS, "many")
    with pytest.raises(ValueError, match="TILECRAFT_JOBS"):
        parallel.resolve_jobs(None)
    assert parallel.run_tasks([lambda: 5], jobs=4) == [5]


def _double_extent(func):
    """A 'schedule' for KernelSpec: vectorize the inner loop."""
    sch = Schedule(func)
    (i, j) = sch.get_loops(sch.get_block("B"))
    sch.vectorize(j)
    return sch.func


@needs_fork
def test_kernel_specs_schedule_where_they_compile(tmp_path):
    A = te.placeholder((16, 8), "float32", "A")
    B = te.compute((16, 8), lambda i, j: A[i, j] * 3.0, "B")
    func = te.create_prim_func([A, B])
    specs = [KernelSpec(f"s{k}", func.with_attr("global_symbol", f"s{k}"), _double_extent,
                        "test.vectorize") for k in range(3)]
    cold = build_kernels(specs, "llvm", jobs=2, cache=str(tmp_path))
    assert cold.build_stats.compiled == 3 and cold.build_stats.kernel_phases["schedule"] > 0
    warm = build_kernels(specs, "llvm", jobs=2, cache=str(tmp_path))
    assert warm.build_stats.cache_hits == 3 and warm.objects() == cold.objects()
    # a schedule without an id cannot be cached: it is compiled every time
    anonymous = [KernelSpec(s.name, s.func, _double_extent) for s in specs]
    assert build_kernels(anonymous, "llvm", cache=str(tmp_path)).build_stats.compiled == 3
    a = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    b = np.empty_like(a)
    warm["s1"](a, b)
    np.testing.assert_allclose(b, a * 3.0, rtol=1e-6)
    assert "x float>" in warm.get_source("ll-raw")


class _Finalized:
    """In a reference cycle; its destructor records the process that ran it."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def _collect_and_pid():
    import gc
    gc.collect()
    return os.getpid()


@pytest.mark.skipif(not parallel.can_fork(), reason="needs fork (Linux)")
def test_workers_never_collect_this_processs_garbage(tmp_path):
    """A destructor of this process's garbage (a library object in a reference cycle: a WebGPU
    buffer hung a worker so) never runs in a forked worker."""
    import gc
    log = tmp_path / "finalized"
    gc.disable()
    try:
        _Finalized(str(log))          # garbage in a cycle, not collected yet
        pids = parallel.run_tasks([_collect_and_pid] * 2, jobs=2)
    finally:
        gc.enable()
    gc.collect()
    ran = log.read_text().split() if log.exists() else []
    assert ran == [str(os.getpid())], (ran, pids)
