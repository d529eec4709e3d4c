"""relax.extract_tasks and relax.tune on a small MLP with a symbolic batch: identical kernels
become one weighted task, a tiny tune covers every task, and relax.build with the database
matches numpy for several batch sizes."""
import numpy as np
import pytest

import relax
import targets
from relax import BlockBuilder, TensorStructInfo, Var, const, op
from relax.build import schedule_kernels
from relax.tune import _prepare
from metaschedule import (AutoInline, LocalRunner, MultiLevelTiling, ParallelVectorizeUnroll,
                          ReuseConfig, SpaceGenerator, TuneError, apply_best)
from tensorir import structural_equal

SIZES = [32, 64, 64, 64, 16]        # layers 2 and 3 are the same kernel


def small_space():
    """Short unrolling and small tiles: candidates build fast, the test takes seconds."""
    return SpaceGenerator(rules=[
        AutoInline(),
        MultiLevelTiling("SSRSRS", max_innermost_factor=16,
                         reuse_write=ReuseConfig("may", (1, 2), "local")),
        ParallelVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=16,
                                unroll_max_steps=(0, 16)),
    ])


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    ws = [(rng.uniform(-0.3, 0.3, (a, b)).astype("float32"),
           rng.uniform(-0.3, 0.3, (b,)).astype("float32"))
          for a, b in zip(SIZES[:-1], SIZES[1:])]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", SIZES[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, (w, b) in enumerate(ws):
                h = bb.emit(op.add(bb.emit(op.matmul(h, const(w))), const(b)))
                if i != len(ws) - 1:
                    h = bb.emit(op.nn.relu(h))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)

    def reference(xv):
        h = xv.astype(np.float64)
        for i, (w, b) in enumerate(ws):
            h = h @ w + b
            if i != len(ws) - 1:
                h = np.maximum(h, 0)
        return h
    return bb.get(), reference


def test_extract_tasks_dedupes_and_weights(mlp):
    mod, _ = mlp
    tasks = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16})
    assert [t.weight for t in tasks] == [1, 2, 1]
    assert all(t.shape_hints == {"batch": 16} for t in tasks)
    assert tasks[1].flop == pytest.approx(2 * 16 * 64 * 64 + 2 * 16 * 64, rel=0.01)
    hinted = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16},
                                 shape_hints={"batch": 4})
    assert all(t.shape_hints == {"batch": 4} for t in hinted)
    default = relax.extract_tasks(mod, "llvm")
    assert all(t.shape_hints == {"batch": 64} for t in default)
    with pytest.raises(TypeError, match="IRModule"):
        relax.extract_tasks("not a module", "llvm")


def test_tune_then_build_with_database(mlp, tmp_path):
    mod, reference = mlp
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = relax.tune(mod, "llvm", max_trials=6, work_dir=tmp_path, runner=runner,
                    upper_bounds={"batch": 16}, num_trials_per_iter=2, space=small_space(),
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False)
    tasks = relax.extract_tasks(mod, "llvm", upper_bounds={"batch": 16})
    assert len(db) == 6
    for t in tasks:                       # the warm-up round gave every task its trials
        assert apply_best(db, t.func, "llvm") is not None, t.name
    # relax.build asks the database for each kernel and gets the tuned schedule
    prepared = _prepare(mod, targets.Target("llvm"), {"batch": 16}, None)
    scheduled = schedule_kernels(prepared, targets.Target("llvm"), db)
    for t in tasks:
        name = next(n for n, f in scheduled.items() if structural_equal(
            prepared[n], t.func, map_free_vars=True))
        assert structural_equal(scheduled[name], apply_best(db, t.func, "llvm").func,
                                map_free_vars=True)
    exe = relax.build(mod, "llvm", database=db, upper_bounds={"batch": 16})
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    rng = np.random.default_rng(1)
    for batch in (1, 7, 16):
        xv = rng.uniform(-1, 1, (batch, SIZES[0])).astype("float32")
        out = vm["main"](xv).numpy()
        np.testing.assert_allclose(out, reference(xv), rtol=1e-4, atol=1e-4)


def test_tune_without_kernels_is_an_error(tmp_path):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    with pytest.raises(TuneError, match="no kernel"):
        relax.tune(bb.get(), "llvm", max_trials=4, work_dir=tmp_path, progress=False)
