"""MetaSchedule on the GPU targets, on this machine's software drivers: ``tune_tir`` of a small
GEMM on OpenCL (PoCL, ``opencl -device=cpu``) and on WebGPU (lavapipe). The tune finishes,
its records are in the database, every measured candidate was checked against the reference
(the runner is given one for each), and ``apply_best`` builds for the target and matches numpy.
Each test skips naming why when the platform / adapter is missing."""
import os
import sys

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import Target
from tilecraft.metaschedule import (Database, LocalRunner, ParallelVectorizeUnroll, SpaceGenerator,
                          apply_best, tune_tir)
from tilecraft.metaschedule.space_generator import (default_mutator_probs, default_postprocs,
                                          default_rules)

from search_testutil import gemm_func

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "targets"))
from opencl_testutil import opencl_device  # noqa: E402
from webgpu_testutil import webgpu_device  # noqa: E402

SEARCH = {"population_size": 8, "genetic_num_iters": 1}
TRIALS, PER_BATCH = 6, 3


class CheckingRunner(LocalRunner):
    """A LocalRunner that remembers, per measured candidate, whether it was given a
    reference to check the outputs against."""

    def __init__(self, **kw):
        super().__init__(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False,
                         **kw)
        self.checked: list[bool] = []

    def run(self, inputs):
        self.checked += [inp.reference is not None for inp in inputs]
        return super().run(inputs)


def gpu_space(target):
    """The default GPU design space (SSSRRSRS tiling, cooperative fetch, thread binding)
    with explicit unrolling capped at 16 steps: lavapipe compiles a fully unrolled 64-step
    GEMM shader (~250 KB of WGSL) for longer than a test may take."""
    t = Target(target)
    rules = [ParallelVectorizeUnroll(max_jobs_per_core=-1, max_vectorize_extent=-1,
                                     unroll_max_steps=(0, 16))
             if isinstance(r, ParallelVectorizeUnroll) else r for r in default_rules(t)]
    return SpaceGenerator(rules, default_postprocs(t), default_mutator_probs(t))


def tune_and_check(target: str, dev, work_dir, timeout_sec: float, trials: int = TRIALS,
                   per_batch: int = PER_BATCH):
    func = gemm_func(64, 64, 64)
    runner = CheckingRunner(timeout_sec=timeout_sec)
    db = tune_tir(func, Target(target), max_trials=trials, work_dir=work_dir,
                  num_trials_per_iter=per_batch, space=gpu_space(target), runner=runner,
                  seed=0, progress=False, search=SEARCH, remeasure=2, remeasure_rounds=2)
    # the records are in the database, also as read back from disk
    recs = Database(work_dir).get_all_tuning_records()
    assert len(db) == trials and len(recs) == trials
    assert all(r.target.startswith(Target(target).kind) for r in recs)
    # every measured candidate was checked, none came out wrong; the re-measurement (its two
    # best, two rounds: small, a GPU build here takes seconds) ran each artifact copy too
    m, = db.get_remeasurements(func, Target(target))
    assert len(m.traces) == 2 and all(len(t) == 2 for t in m.run_secs)
    assert len(runner.checked) == trials + 2 * 2 and all(runner.checked)
    assert not [r.error for r in recs if r.error and "wrong result" in r.error]
    ok = [r for r in recs if r.ok]
    assert ok, [r.error for r in recs]
    # the best schedule builds for the target and computes A @ B
    sch = apply_best(db, func, Target(target))
    assert sch is not None
    mod = targets.build(sch.mod, Target(target))
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, (64, 64)).astype("float32") for _ in range(2))
    A, B = targets.array(a, dev), targets.array(b, dev)
    C = targets.array(np.zeros((64, 64), "float32"), dev)
    mod["main"](A, B, C)
    dev.sync()
    np.testing.assert_allclose(C.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    # and it survives export / load, as the runner measured it
    path = os.path.join(str(work_dir), "best.so")
    mod.export_library(path)
    loaded = targets.load_module(path)
    C2 = targets.array(np.zeros((64, 64), "float32"), dev)
    loaded[loaded.entry_name](A, B, C2)
    dev.sync()
    np.testing.assert_allclose(C2.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    return db


def test_tune_gemm_opencl(tmp_path):
    dev = opencl_device()
    tune_and_check("opencl -device=cpu", dev, tmp_path / "ocl", timeout_sec=20)


def test_tune_gemm_webgpu(tmp_path):
    dev = webgpu_device()
    # some candidates take lavapipe longer than the limit (they fail, "ran past its time
    # limit"); a short limit keeps the test short
    tune_and_check("webgpu", dev, tmp_path / "wgpu", timeout_sec=8, trials=4, per_batch=2)


# -- the measuring path alone (fast): a hand-scheduled GEMM built, run and checked on the device
@pytest.mark.parametrize("target", ["opencl -device=cpu", "webgpu"])
def test_runner_checks_gpu_candidates(target):
    from tilecraft.metaschedule import BuilderInput, LocalBuilder, RunnerInput, args_info, random_inputs
    from webgpu_testutil import gemm_shared
    dev = opencl_device() if target.startswith("opencl") else webgpu_device()
    func = gemm_shared(64, 64, 64)
    infos = args_info(func)
    a, b, _ = random_inputs(infos, seed=3)
    with LocalBuilder(max_workers=1) as builder:
        built, = builder.build([BuilderInput(func, Target(target))])
    assert built.error_msg is None, built.error_msg
    runner = LocalRunner(timeout_sec=30, number=2, repeat=2, min_repeat_ms=0,
                         enable_cpu_cache_flush=False, cleanup=False)
    try:
        good, bad = runner.run([
            RunnerInput(built.artifact_path, Target(target), infos, seed=3, reference=[a @ b]),
            RunnerInput(built.artifact_path, Target(target), infos, seed=3,
                        reference=[a @ b + 1])])
    finally:
        runner.close()
        from tilecraft.metaschedule.builder import remove_artifact
        remove_artifact(built.artifact_path)
    assert good.error_msg is None and len(good.run_secs) == 2, good.error_msg
    assert all(t > 0 for t in good.run_secs)
    assert bad.wrong and "wrong result" in bad.error_msg, bad.error_msg
