"""The SGEMM structures of the GPU design space (issue #7), on the CI's software drivers:
bounded tile sampling (threads and register tiles of the sizes fast SGEMMs use), shared tiles
transposed and padded, vectorized cooperative fetches, and the mutators that explore them.
Every point is built and run against numpy on PoCL (OpenCL) and lavapipe (WebGPU); a tiny tune
seeded with the default schedule is never worse than it. Each device test skips naming why
when the driver is missing."""
import os
import sys

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets import Target
from tilecraft.tensorir import Schedule
from tilecraft.tensorir.transform.pipeline import CompactBufferAllocation, ConvertBlocksToLoops

from tilecraft.metaschedule import Task, apply_best, baseline_record, tune_tasks
from tilecraft.metaschedule.mutator import MutateTileSize
from tilecraft.metaschedule.schedule_rule.base import ANN_SHARED_LAYOUT, SHARED_LAYOUTS
from tilecraft.metaschedule.space_generator import (GPU_TILE_CAPS, default_mutator_probs,
                                          default_postprocs, default_rules, default_space)
from tilecraft.metaschedule import LocalRunner, SpaceGenerator

from search_testutil import gemm_func

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "targets"))
from opencl_testutil import opencl_device  # noqa: E402
from webgpu_testutil import webgpu_device  # noqa: E402

TARGETS = ["opencl -device=cpu", "webgpu"]


def _device(target):
    return opencl_device() if target.startswith("opencl") else webgpu_device()


def _point(target, n, tiles, layouts=(0, 0), vectors=(0, 0), unroll=0):
    """The GEMM point of the default GPU space with these decisions: tiles ``[i, j, k]``
    (sample_tile factors), shared layouts and cooperative-fetch vector lengths (indices) of
    A and B, the unroll depth (index)."""
    func = gemm_func(n, n, n)
    t = Target(target)
    space = default_space(t)
    trace = space.generate(func, t)[0].trace
    cats = [layouts[0], vectors[0], layouts[1], vectors[1], unroll]
    ti = ci = 0
    for idx, inst in enumerate(trace.instructions):
        if inst.kind == "sample_tile":
            trace = trace.with_decision(idx, tiles[ti])
            ti += 1
        elif inst.kind == "sample_categorical":
            trace = trace.with_decision(idx, cats[ci])
            ci += 1
    assert (ti, ci) == (3, 5), (ti, ci)
    return func, space.finish(trace, func, t)


def _run(target, func, sch):
    dev = _device(target)
    n = func.buffers[0].shape[0].value
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype("float32") for _ in range(2))
    mod = targets.build(sch.mod, Target(target))
    A, B = targets.array(a, dev), targets.array(b, dev)
    C = targets.array(np.zeros((n, n), "float32"), dev)
    mod["main"](A, B, C)
    dev.sync()
    np.testing.assert_allclose(C.numpy(), a.astype("float64") @ b, rtol=1e-4, atol=1e-4)
    return mod


# -- sampling ------------------------------------------------------------------------------
def test_bounded_sample_tile_respects_caps_and_replays():
    func = gemm_func(4096, 4096, 4096)
    caps = [None, 1, 32, 2, 8]
    seen = set()
    for seed in range(40):
        sch = Schedule(func, seed=seed)
        i, _, _ = sch.get_loops(sch.get_block("C"))
        inner = sch.sample_tile(i, 5, 64, None, caps)
        f = sch.trace.instructions[-1].decision
        assert np.prod(f) == 4096 and all(x <= c for x, c in zip(f[1:], caps[1:]))
        assert [sch.get(v) for v in inner] == f[1:]
        seen.add(tuple(f[1:]))
    assert len(seen) > 10          # a spread of thread counts and register tiles
    # the default GPU rule draws with the caps; a drawn decision replays on its own
    t = Target("opencl")
    space = default_space(t)
    sch = space.sample(space.generate(func, t)[0], func, t, seed=3)
    tiles = [inst for inst in sch.trace.instructions if inst.kind == "sample_tile"]
    assert [list(x.inputs[4]) for x in tiles] == [list(GPU_TILE_CAPS["S"])] * 2 + \
        [list(GPU_TILE_CAPS["R"])]
    again = space.finish(sch.trace, func, t)
    assert again is not None and str(again.mod["main"]) == str(sch.mod["main"])


def test_bounded_sample_tile_rejects_a_wrong_bound_list():
    from tilecraft.tensorir.schedule import ScheduleError
    sch = Schedule(gemm_func(64, 64, 64))
    i, _, _ = sch.get_loops(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="max_factors needs 3 entries"):
        sch.sample_tile(i, 3, 16, None, [None, 4])


def test_mutators_keep_caps_and_explore_layouts_and_vector_lengths():
    func = gemm_func(256, 256, 256)
    t = Target("opencl")
    space = default_space(t)
    sch = space.sample(space.generate(func, t)[0], func, t, seed=1)
    base = sch.trace.without_postproc()
    rng = np.random.default_rng(0)
    m = MutateTileSize()
    kinds = set()
    for _ in range(200):
        new = m.apply(base, rng)
        assert new is not None
        for a, b in zip(base.instructions, new.instructions):
            if a.decision != b.decision:
                if a.kind == "sample_tile":
                    caps = a.inputs[4]
                    assert all(c is None or f <= c for f, c in zip(b.decision[1:], caps[1:]))
                    kinds.add("tile")
                else:
                    uses = [u.inputs[1] for u in new.instructions if u.kind == "annotate" and
                            a.outputs[0] in str(u.inputs[2])]
                    kinds.update(uses)
    assert {"tile", "meta_schedule.cooperative_fetch", ANN_SHARED_LAYOUT} <= kinds, kinds


# -- compaction keeps a padded stride --------------------------------------------------------
def test_compaction_keeps_the_padding_of_a_shared_tile():
    func, sch = _point("opencl -device=cpu", 128, [[4, 1, 8, 1, 4], [4, 1, 8, 1, 4],
                                                   [16, 8, 1]], layouts=(2, 3))
    low = CompactBufferAllocation(ConvertBlocksToLoops(sch.mod))
    text = str(low["main"])
    # A_shared: a 32 x 8 tile with rows padded to 36 words (32k + 4); B_shared transposed
    # (32 x 8 as well: [j, k]), padded the same way
    assert 'A_shared = T.allocate((32, 8), "float32", strides=(36, 1)' in text, text
    assert 'B_shared = T.allocate((32, 8), "float32", strides=(36, 1)' in text, text


# -- every new space element computes A @ B -------------------------------------------------
POINTS = {
    # the default schedule's tiling: 8 x 16 threads of 16 x 8 accumulators, k-tile 16
    "default 128x128x16": [[1, 1, 8, 1, 16], [1, 1, 16, 1, 8], [8, 16, 1]],
    # 8 x 8 register tiles from S3 x S4 = 2 x 4, a k-tile of 8 x 4
    "8x8 registers, k 32": [[2, 1, 4, 2, 4], [2, 1, 4, 2, 4], [4, 8, 4]],
    # 8 x 4 per thread, 64 x 128 blocks
    "8x4 registers": [[2, 1, 8, 1, 8], [1, 1, 16, 2, 4], [16, 8, 1]],
}


# lavapipe compiles slowly: on WebGPU the transposed padded and the permuted layouts (3, 4)
# cover the others' code paths (PoCL runs all of them)
@pytest.mark.parametrize("target, layout", [(t, k) for t in TARGETS
                                            for k in range(len(SHARED_LAYOUTS))
                                            if t != "webgpu" or k in (3, 4)])
def test_shared_layouts_compute_the_product(target, layout):
    # lavapipe: a smaller tile (it compiles shaders slowly)
    n, tiles = (64, [[2, 1, 4, 2, 4], [2, 1, 8, 1, 4], [4, 8, 2]]) if target != "webgpu" else \
        (32, [[1, 1, 8, 1, 4], [1, 1, 8, 1, 4], [4, 8, 1]])
    func, sch = _point(target, n, tiles, layouts=(layout, layout), vectors=(2, 1))
    assert sch is not None
    text = str(sch.mod["main"])
    name = SHARED_LAYOUTS[layout]
    if name.startswith("transposed"):
        assert "A_shared[v1, v0] = A[v0, v1]" in text, text
    if name == "permuted":
        # B's columns interleaved by the 4 columns each thread owns: B_shared[k, c % 4, c // 4]
        assert f"B_shared = T.alloc_buffer(({n}, 4, {n // 4})" in text, text
    _run(target, func, sch)


@pytest.mark.parametrize("name", list(POINTS))
def test_sgemm_tilings_compute_the_product_opencl(name):
    target = "opencl -device=cpu"
    func, sch = _point(target, 128, POINTS[name], layouts=(1, 0), vectors=(2, 2), unroll=4)
    assert sch is not None, name
    assert "T.vectorized(4)" in str(sch.mod["main"])   # float4 cooperative fetches
    _run(target, func, sch)


@pytest.mark.parametrize("size, tiles", [
    # fast: 4 x 4 registers per thread
    (32, [[1, 1, 8, 1, 4], [1, 1, 8, 1, 4], [4, 8, 1]]),
    # 8 x 8 registers (lavapipe takes minutes to compile it)
    pytest.param(64, [[1, 1, 8, 2, 4], [1, 1, 8, 2, 4], [8, 4, 2]], marks=pytest.mark.slow)])
def test_sgemm_tiling_computes_the_product_webgpu(size, tiles):
    # vec4<f32> fetches, A transposed
    target = "webgpu"
    func, sch = _point(target, size, tiles, layouts=(1, 0), vectors=(2, 2), unroll=0)
    assert sch is not None
    assert "T.vectorized(4)" in str(sch.mod["main"])   # vec4<f32> cooperative fetches
    _run(target, func, sch)


# -- a tiny tune seeded with the default schedule is never worse than it ---------------------
def _small_space(target):
    """The default space with the unroll depths capped at 16 (lavapipe compiles long
    unrolled shaders slowly)."""
    from tilecraft.metaschedule import ParallelVectorizeUnroll
    t = Target(target)
    rules = [ParallelVectorizeUnroll(max_jobs_per_core=-1, max_vectorize_extent=-1,
                                     unroll_max_steps=(0, 16))
             if isinstance(r, ParallelVectorizeUnroll) else r for r in default_rules(t)]
    return SpaceGenerator(rules, default_postprocs(t), default_mutator_probs(t))


@pytest.mark.parametrize("target", TARGETS)
def test_tiny_tune_is_never_worse_than_the_default(target, tmp_path):
    from tilecraft.relax import gpu_schedules
    dev = _device(target)
    t = Target(target)
    n = 64 if target.startswith("opencl") else 32     # lavapipe compiles slowly
    func = gemm_func(n, n, n)
    base = Schedule(func)
    strategies = getattr(gpu_schedules, "_STRATEGIES", None) or (gpu_schedules._schedule_best,)
    strategies[0](base, t)
    task = Task("gemm", func, baseline=base, reference=lambda a, b, c: [a @ b])
    runner = LocalRunner(timeout_sec=20, number=2, repeat=1, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    trials = 3
    db = tune_tasks([task], t, max_trials=trials, work_dir=str(tmp_path), num_trials_per_iter=2,
                    space=_small_space(target), runner=runner, seed=0, progress=False,
                    search={"population_size": 8, "genetic_num_iters": 1})
    base_rec = baseline_record(db, task, t)
    assert base_rec is not None and base_rec.ok
    # what a build uses: the baseline, or a record that beat it when both were re-measured
    # side by side (the raw fastest record may be a lucky draw, slower than the baseline)
    chosen = db.query_tuning_record(func, t)
    assert chosen is not None and chosen.mean_secs <= base_rec.mean_secs
    sch = apply_best(db, func, t)
    mod = targets.build(sch.mod, t)
    rng = np.random.default_rng(2)
    a, b = (rng.uniform(-1, 1, (n, n)).astype("float32") for _ in range(2))
    A, B = targets.array(a, dev), targets.array(b, dev)
    C = targets.array(np.zeros((n, n), "float32"), dev)
    mod["main"](A, B, C)
    dev.sync()
    np.testing.assert_allclose(C.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_task_reference_must_match_the_outputs(tmp_path):
    from tilecraft.metaschedule import TuneError
    func = gemm_func(16, 16, 16)
    task = Task("gemm", func, reference=lambda a, b, c: [a @ b, a])
    with pytest.raises(TuneError, match="reference gave 2 output"):
        tune_tasks([task], Target("llvm"), max_trials=1, work_dir=str(tmp_path),
                   progress=False)
