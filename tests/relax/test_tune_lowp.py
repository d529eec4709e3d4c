"""relax.tune on the low-precision kernels: an int8 dense (uint8 x int8 -> int32, the
``dense_u8i8`` family) and an int4 weight-only GEMV (``dense_q4``) are tasks like the others;
a few trials of each, then relax.build with the records, bit-exact (int8) / matching the
dequantized weight (int4) against numpy."""
import numpy as np

from tilecraft import relax, targets
from tilecraft.metaschedule import (AutoInline, LocalRunner, MultiLevelTiling,
                                    ParallelVectorizeUnroll, ReuseConfig, SpaceGenerator,
                                    apply_best)
from tilecraft.metaschedule.search import trace_key
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.transform.quantize_int4 import dequantize_int4, quantize_weight_int4

CPU = targets.cpu(0)


def small_space():
    """Short unrolling and small tiles: candidates build fast."""
    return SpaceGenerator(rules=[
        AutoInline(),
        MultiLevelTiling("SSRSRS", max_innermost_factor=16,
                         reuse_write=ReuseConfig("may", (1, 2), "local")),
        ParallelVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=16,
                                unroll_max_steps=(0, 16)),
    ])


def _module(make, shape, dtype):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(make(x)))
        bb.emit_func_output(gv)
    return bb.get()


def _tune(mod, kernel, tmp_path):
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = relax.tune(mod, "llvm", max_trials=8, work_dir=tmp_path, runner=runner,
                    num_trials_per_iter=2, space=small_space(),
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False, remeasure=0)
    tasks = relax.extract_tasks(mod, "llvm")
    main = next(t for t in tasks if kernel in t.name)
    for t in tasks:
        assert apply_best(db, t.func, "llvm") is not None, t.name
    # the kernel's searched candidates (not only its default schedule) built, ran and matched
    searched = [r for r in db.get_top_k(main.func, "llvm", 100)
                if r.ok and trace_key(r.trace) != trace_key(main.baseline.trace)]
    assert searched, [r.error for r in db.get_all_tuning_records()]
    return relax.VirtualMachine(relax.build(mod, "llvm", database=db, strict=True), CPU)


def test_tune_int8_dense_then_build(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (40, 24)).astype(np.int8)
    w[0] = -128
    mod = _module(lambda x: op.matmul(x, const(w), out_dtype="int32"), (3, 40), "uint8")
    names = [t.name for t in relax.extract_tasks(mod, "llvm")]
    assert any("dense_u8i8" in n for n in names), names
    vm = _tune(mod, "dense_u8i8", tmp_path)
    x = rng.integers(0, 256, (3, 40)).astype(np.uint8)
    x[0] = 255
    np.testing.assert_array_equal(vm["main"](x).numpy(), x.astype(np.int64) @ w.astype(np.int64))


def test_tune_int4_gemv_then_build(tmp_path):
    rng = np.random.default_rng(1)
    k, n, group = 128, 48, 32
    wf = rng.normal(0, 0.5, (k, n)).astype(np.float32)
    codes, scale, offset = quantize_weight_int4(wf, group, True, "float32")
    mod = _module(lambda x: op.dense_q4(x, const(codes), const(scale), const(offset), group),
                  (1, k), "float32")
    names = [t.name for t in relax.extract_tasks(mod, "llvm")]
    assert any("dense_q4" in n for n in names), names
    vm = _tune(mod, "dense_q4", tmp_path)
    x = rng.normal(size=(1, k)).astype(np.float32)
    want = x.astype(np.float64) @ dequantize_int4(codes, scale, offset, k, group)
    np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=1e-4, atol=1e-4)
