"""LocalBuilder and LocalRunner: parallel builds, isolated measurements, and the faults a tuner
meets — build errors and timeouts, a crashing build process, kernels that segfault, abort or
never return, corrupt artifacts, wrong results — each a failed trial, never a dead tuner."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from tilecraft.metaschedule import TuneError  # noqa: F401  (the package imports)
from tilecraft.metaschedule.arg_info import ArgInfo, args_info, reference_outputs
from tilecraft.metaschedule.builder import BuilderInput, BuilderResult, LocalBuilder, remove_artifact
from tilecraft.metaschedule.popen_worker import PopenWorker, WorkerDied, WorkerError, WorkerTimeout
from tilecraft.metaschedule.runner import (LocalRunner, RunnerInput, cache_flush_bytes, compare_outputs,
                                 default_tolerance)
from tilecraft.tensorir import Schedule, te

from capabilities import needs_lld
from measure_testutil import ELEMWISE_INFOS, build_faulty_libraries


def gemm(n=48):
    A = te.placeholder((n, 32), "float32", "A")
    B = te.placeholder((32, n), "float32", "B")
    k = te.reduce_axis((0, 32), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def split_gemm(factor, parallel=False):
    sch = Schedule(gemm())
    i, j, k = sch.get_loops(sch.get_block("C"))
    io, ii = sch.split(i, [None, factor])
    if parallel:
        sch.parallel(io)
    return sch.mod


def spin_func():
    """A PrimFunc that never returns in practice: a reduction over 2**62 iterations."""
    A = te.placeholder((1,), "float32", "A")
    k = te.reduce_axis((0, 1 << 62), "k")
    B = te.compute((1,), lambda i: te.sum(A[i] * 1.0001, axis=k), "B")
    return te.create_prim_func([A, B])


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return build_faulty_libraries(tmp_path_factory.mktemp("faulty"))


@pytest.fixture(scope="module")
def builder():
    b = LocalBuilder(timeout_sec=120)
    yield b
    b.close()


@pytest.fixture(scope="module")
def runner():
    r = LocalRunner(timeout_sec=2, number=2, repeat=2, min_repeat_ms=0, cleanup=False)
    yield r
    r.close()


def _ref(func, seed=0):
    infos = args_info(func)
    return infos, reference_outputs(func, infos, seed)


# -- the worker process ----------------------------------------------------------------------------
def test_popen_worker_returns_raises_times_out_and_survives_crashes():
    w = PopenWorker()
    try:
        assert w.call(divmod, 7, 2, timeout=60) == (3, 1)
        pid = w.pid
        with pytest.raises(WorkerError, match="ValueError: invalid literal") as info:
            w.call(int, "x", timeout=60)
        assert info.value.remote_type == "ValueError" and "Traceback" in info.value.remote_traceback
        assert w.pid == pid                       # an exception does not cost the worker
        with pytest.raises(WorkerTimeout, match="time limit of 0.5 s"):
            w.call(time.sleep, 30, timeout=0.5)
        assert not w.alive
        with pytest.raises(WorkerDied, match=r"signal 9 \(SIGKILL"):
            w.call(os.kill, 0, signal.SIGKILL, timeout=60)   # the worker's own process group
        assert w.call(divmod, 9, 4, timeout=60) == (2, 1)   # started again
        assert w.restarts == 2
    finally:
        w.close()


# -- the builder ----------------------------------------------------------------------------------
def test_builds_in_parallel_and_reports_errors_per_candidate(builder, tmp_path):
    bad = Schedule(gemm())
    i, _, _ = bad.get_loops(bad.get_block("C"))
    bad.bind(i, "threadIdx.x")                       # legal TIR, but not for a CPU target
    inputs = [BuilderInput(split_gemm(4), "llvm"), BuilderInput(bad.mod, "llvm"),
              BuilderInput(split_gemm(8, parallel=True), "llvm"),
              BuilderInput(gemm(), "no-such-target"), BuilderInput("not IR", "llvm")]
    results = builder.build(inputs)
    assert [r.error_msg is None for r in results] == [True, False, True, False, False]
    assert "threadIdx.x" in results[1].error_msg and "not the CPU target" in results[1].error_msg
    assert "no-such-target" in results[3].error_msg
    assert "IRModule or a PrimFunc" in results[4].error_msg
    for r in (results[0], results[2]):
        assert os.path.isfile(r.artifact_path) and r.build_secs > 0
        assert os.path.basename(os.path.dirname(r.artifact_path)).startswith("tilecraft-build-")
    assert builder.build([]) == []
    for r in results:
        remove_artifact(r.artifact_path)
        assert r.artifact_path is None or not os.path.exists(os.path.dirname(r.artifact_path))


def test_a_relative_work_dir_is_the_callers(tmp_path, monkeypatch):
    """The workers run in another directory: a relative work_dir is resolved where the builder
    is made, and every artifact lands under it."""
    monkeypatch.chdir(tmp_path)
    with LocalBuilder(max_workers=1, work_dir="rel/artifacts") as b:
        assert b.work_dir == str(tmp_path / "rel" / "artifacts")
        res, = b.build([BuilderInput(split_gemm(8), "llvm")])
    assert res.error_msg is None, res.error_msg
    assert os.path.isabs(res.artifact_path) and os.path.isfile(res.artifact_path)
    assert res.artifact_path.startswith(str(tmp_path / "rel" / "artifacts") + os.sep)
    remove_artifact(res.artifact_path)
    assert os.listdir(tmp_path / "rel" / "artifacts") == []


def test_a_build_past_its_time_limit_fails_and_the_pool_goes_on():
    b = LocalBuilder(max_workers=1, timeout_sec=0.05)
    try:
        res, = b.build([BuilderInput(split_gemm(4), "llvm")])
        assert res.artifact_path is None and "time limit of 0.05 s" in res.error_msg
        b.timeout_sec = 120
        res, = b.build([BuilderInput(split_gemm(4), "llvm")])
        assert res.error_msg is None
        remove_artifact(res.artifact_path)
    finally:
        b.close()


def _worker_pids():
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me and b"tilecraft.metaschedule.popen_worker" in cmd:
            pids.append(int(entry))
    return pids


def test_a_build_process_that_dies_is_a_failed_build():
    b = LocalBuilder(max_workers=1, timeout_sec=120)
    try:
        b.build([BuilderInput(split_gemm(2), "llvm")])   # the worker is up
        before = set(_worker_pids())

        def kill_soon():
            time.sleep(0.1)
            for pid in set(_worker_pids()) & before:
                os.kill(pid, signal.SIGKILL)

        t = threading.Thread(target=kill_soon)
        t.start()
        start = time.monotonic()
        res, = b.build([BuilderInput(gemm(n=96), "llvm")])
        t.join()
        if res.error_msg is None:   # the build beat the kill: nothing to check
            pytest.skip(f"the build finished in {time.monotonic() - start:.2f} s, before the kill")
        assert "the build crashed" in res.error_msg and "SIGKILL" in res.error_msg
        res, = b.build([BuilderInput(split_gemm(4), "llvm")])
        assert res.error_msg is None
    finally:
        b.close()


# -- the runner -----------------------------------------------------------------------------------
def test_measures_correct_candidates_and_flags_wrong_ones(builder, runner):
    func = gemm()
    infos, ref = _ref(func, seed=5)
    built = builder.build([BuilderInput(split_gemm(4), "llvm"),
                           BuilderInput(split_gemm(16, parallel=True), "llvm")])
    ins = [RunnerInput(b.artifact_path, "llvm", infos, {}, 5, ref) for b in built]
    # the same kernel checked against the reference of other inputs: a wrong result
    ins.append(RunnerInput(built[0].artifact_path, "llvm", infos, {}, 6, ref))
    res = runner.run(ins)
    for r in res[:2]:
        assert r.error_msg is None and not r.wrong and r.checked
        assert len(r.run_secs) == 2 and all(0 < t < 1 for t in r.run_secs)
    assert res[2].wrong and res[2].run_secs is None
    assert res[2].error_msg.startswith("wrong result: output C differs from the reference: "
                                       "max abs error")
    # no reference: measured without a check, and the result says so
    r, = runner.run([RunnerInput(built[0].artifact_path, "llvm", infos, {}, 5, None)])
    assert r.error_msg is None and r.run_secs and not r.checked
    for b in built:
        remove_artifact(b.artifact_path)


def test_a_slightly_wrong_kernel_is_caught(builder, runner):
    """C = A @ B + 1e-2 against the reference of A @ B."""
    func = gemm()
    n = 48
    A2 = te.placeholder((n, 32), "float32", "A")
    B2 = te.placeholder((32, n), "float32", "B")
    k = te.reduce_axis((0, 32), "k")
    S = te.compute((n, n), lambda i, j: te.sum(A2[i, k] * B2[k, j], axis=k), "S")
    C2 = te.compute((n, n), lambda i, j: S[i, j] + 1e-2, "C")
    off = te.create_prim_func([A2, B2, C2])
    infos, ref = _ref(func, seed=1)
    built, = builder.build([BuilderInput(off, "llvm")])
    r, = runner.run([RunnerInput(built.artifact_path, "llvm", infos, {}, 1, ref)])
    assert r.wrong and "max abs error 0.01" in r.error_msg
    remove_artifact(built.artifact_path)


def test_segfaults_aborts_and_hangs_are_failed_trials_and_the_run_goes_on(faulty, builder,
                                                                          runner):
    func = gemm()
    infos, ref = _ref(func)
    good, spin = builder.build([BuilderInput(split_gemm(8), "llvm"),
                                BuilderInput(spin_func(), "llvm")])
    worker_pid = None
    ins = [RunnerInput(faulty["crash"], "llvm", ELEMWISE_INFOS),
           RunnerInput(good.artifact_path, "llvm", infos, {}, 0, ref),
           RunnerInput(faulty["abort"], "llvm", ELEMWISE_INFOS),
           RunnerInput(faulty["spin"], "llvm", ELEMWISE_INFOS),
           RunnerInput(spin.artifact_path, "llvm", args_info(spin_func())),
           RunnerInput(good.artifact_path, "llvm", infos, {}, 0, ref)]
    start = time.monotonic()
    res = runner.run(ins)
    elapsed = time.monotonic() - start
    assert "killed by signal 11 (SIGSEGV, segmentation fault)" in res[0].error_msg
    assert "the candidate crashed the measuring process" in res[0].error_msg
    assert "SIGABRT" in res[2].error_msg
    assert "ran past its time limit of 2 s" in res[3].error_msg
    assert "ran past its time limit of 2 s" in res[4].error_msg
    for r in (res[1], res[5]):
        assert r.error_msg is None and r.run_secs
    assert all(r.run_secs is None and not r.wrong for r in (res[0], res[2], res[3], res[4]))
    assert elapsed < 20
    # the crashes were the children's: the worker process itself was never restarted
    assert runner._worker.restarts == 0
    for b in (good, spin):
        remove_artifact(b.artifact_path)


def test_corrupt_and_foreign_artifacts_are_failed_trials(tmp_path, builder, runner):
    func = gemm()
    infos, ref = _ref(func)
    good, = builder.build([BuilderInput(split_gemm(4), "llvm")])
    junk = tmp_path / "junk.so"
    junk.write_bytes(os.urandom(4096))
    half = tmp_path / "half.so"
    half.write_bytes(open(good.artifact_path, "rb").read()[:3000])
    res = runner.run([RunnerInput(str(junk), "llvm", infos, {}, 0, ref),
                      RunnerInput(str(half), "llvm", infos, {}, 0, ref),
                      RunnerInput(str(tmp_path / "missing.so"), "llvm", infos, {}, 0, ref),
                      RunnerInput(None, "llvm", infos),
                      RunnerInput(good.artifact_path, "llvm", infos[:2], {}, 0, ref),
                      RunnerInput(good.artifact_path, "llvm",
                                  [ArgInfo((47, 32), "float32")] + infos[1:], {}, 0, ref)])
    assert "cannot load kernel library" in res[0].error_msg
    # the dynamic loader may read past the end of a truncated library: a SIGBUS in the child
    assert ("cannot load kernel library" in res[1].error_msg or
            "SIGBUS" in res[1].error_msg), res[1].error_msg
    assert "FileNotFoundError" in res[2].error_msg
    assert "the build failed" in res[3].error_msg
    assert "takes 3 arguments" in res[4].error_msg
    assert "ValueError" in res[5].error_msg and "dimension 0" in res[5].error_msg
    assert all(r.run_secs is None for r in res)
    remove_artifact(good.artifact_path)


@needs_lld
def test_an_artifact_for_another_machine_is_a_clear_failure(builder, runner):
    func = gemm()
    infos, ref = _ref(func)
    arm, = builder.build([BuilderInput(split_gemm(4), "raspberry-pi/4b-aarch64")])
    assert arm.error_msg is None
    with open(arm.artifact_path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    r, = runner.run([RunnerInput(arm.artifact_path, "raspberry-pi/4b-aarch64", infos, {}, 0,
                                 ref)])
    assert "aarch64" in r.error_msg and "cannot run on this machine" in r.error_msg
    remove_artifact(arm.artifact_path)


def test_the_runner_restarts_a_worker_that_was_killed(builder):
    func = gemm()
    infos, ref = _ref(func)
    r = LocalRunner(timeout_sec=5, min_repeat_ms=0, enable_cpu_cache_flush=False)
    try:
        b1, b2 = builder.build([BuilderInput(split_gemm(4), "llvm")] * 2)
        assert r.run([RunnerInput(b1.artifact_path, "llvm", infos, {}, 0, ref)])[0].run_secs
        assert not os.path.exists(b1.artifact_path)          # cleanup=True removes it
        os.kill(r._worker.pid, signal.SIGKILL)
        r._worker._proc.wait(timeout=10)
        res, = r.run([RunnerInput(b2.artifact_path, "llvm", infos, {}, 0, ref)])
        assert res.run_secs, res.error_msg
        assert r._worker.restarts == 1
    finally:
        r.close()


def test_symbolic_kernels_and_scalars_run_at_given_shapes(builder, runner):
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 8), "float32", "A")
    B = te.compute((n, 8), lambda i, j: te.exp(A[i, j]) * c, "B")
    func = te.create_prim_func([A, B, c])
    built, = builder.build([BuilderInput(func, "llvm")])
    for rows in (1, 7, 64):
        infos = args_info(func, {"n": rows})
        ref = reference_outputs(func, infos, seed=rows)
        r, = runner.run([RunnerInput(built.artifact_path, "llvm", infos, {"n": rows}, rows,
                                     ref)])
        assert r.error_msg is None, r.error_msg
    remove_artifact(built.artifact_path)


# -- pieces ---------------------------------------------------------------------------------------
def test_cache_flush_size_and_tolerances():
    size = cache_flush_bytes()
    assert 8 << 20 <= size <= 512 << 20
    assert default_tolerance("int32") == (0.0, 0.0)
    assert compare_outputs([np.array([1, 2], "int32")], [np.array([1, 3], "int32")],
                           ["I"]).startswith("output I differs")
    big = np.full(4, 1000.0, "float32")
    assert compare_outputs([big + 0.05], [big]) is None           # within rtol of 1e-3
    nan = np.array([np.nan, 1.0], "float32")
    assert compare_outputs([nan.copy()], [nan]) is None
    assert "differs" in compare_outputs([np.array([1.0, 1.0], "float32")], [nan])
    assert "shape" in compare_outputs([np.zeros(3, "float32")], [np.zeros(4, "float32")])
    assert "dtype" in compare_outputs([np.zeros(3, "float64")], [np.zeros(3, "float32")])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="timeout_sec"):
        LocalRunner(timeout_sec=0)
    with pytest.raises(ValueError, match="number and repeat"):
        LocalRunner(number=0)
    with pytest.raises(ValueError, match="max_workers"):
        LocalBuilder(max_workers=0)
