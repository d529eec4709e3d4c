"""relax.tune on the low-precision kernels: an int8 dense (uint8 x int8 -> int32, the
``dense_u8i8`` family) and an int4 weight-only GEMV (``dense_q4``) are tasks like the others;
a few trials of each, then relax.build with the records, bit-exact (int8) / matching the
dequantized weight (int4) against numpy."""

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.metaschedule import (AutoInline, LocalRunner, MultiLevelTiling,
                                    ParallelVectorizeUnroll, ReuseConfig, SpaceGenerator,
                                    apply_best)
from tilecraft.metaschedule.search import trace_key
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, default_schedules, op
from tilecraft.targets.target import host_cpu_flags
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.structural import structural_equal
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


def _int8_conv(c, o, hw, w):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, c, hw, hw), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.conv2d(x, const(w), padding=(1, 1, 1, 1),
                                                     out_dtype="int32")))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("layer", ["dense", "conv"])
def test_tuned_int8_layer_keeps_or_beats_the_default(tmp_path, layer):
    """A short tuning run of an int8 dense / conv layer in the default space (its default
    schedule the baseline, the best records re-measured against it): the tuned build is
    bit-exact, and every task keeps its default unless a record beat it in the re-measurement
    (the decision is checked, not a timing taken here: tests do not assert timings)."""
    rng = np.random.default_rng(3)
    if layer == "dense":
        w = rng.integers(-128, 128, (256, 256)).astype(np.int8)
        mod = _module(lambda x: op.matmul(x, const(w), out_dtype="int32"), (32, 256), "uint8")
        x = rng.integers(0, 256, (32, 256)).astype(np.uint8)
    else:
        w = rng.integers(-128, 128, (32, 32, 3, 3)).astype(np.int8)
        mod = _int8_conv(32, 32, 28, w)
        x = rng.integers(0, 256, (1, 32, 28, 28)).astype(np.uint8)
    x.reshape(-1)[:2] = [0, 255]
    if layer == "dense":
        want = x.astype(np.int64) @ w.astype(np.int64)
    else:
        xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        want = sum(np.einsum("nchw,oc->nohw", xp[:, :, ry:ry + 28, rx:rx + 28],
                             w[:, :, ry, rx].astype(np.int64))
                   for ry in range(3) for rx in range(3))
    # the VNNI kernel (the AMX one: test_tune_amx_dense_then_build)
    target = "llvm -mattr=-amx-int8"
    db = relax.tune(mod, target, max_trials=12, work_dir=tmp_path, num_trials_per_iter=4,
                    search={"population_size": 16, "genetic_num_iters": 1}, seed=0,
                    progress=False, remeasure=2, remeasure_rounds=3)
    tuned = relax.VirtualMachine(relax.build(mod, target, database=db, strict=True), CPU)
    default = relax.VirtualMachine(relax.build(mod, target, strict=True), CPU)
    got = tuned["main"](x).numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(default["main"](x).numpy(), want)
    # "keeps or beats" is the tuner's decision from its own interleaved re-measurement (a
    # timing taken here on a shared machine would make the test flaky): every task has its
    # default schedule re-measured beside the best records, and a record other than the
    # default is selected only where its median beat the default's by the margin
    checked = 0
    for wl in db.workloads:
        for m in db.get_remeasurements(wl, target):
            assert m.baseline is not None, "the default schedule was not re-measured"
            if m.selected != m.baseline:
                med = [float(np.median(r)) for r in (m.run_secs[m.selected],
                                                     m.run_secs[m.baseline])]
                assert med[0] <= med[1] * (1 - m.margin) + 1e-12, (med, m.margin)
            checked += 1
    assert checked, "the tuning run re-measured no task"


def test_amx_kernels_are_tasks_with_a_replayable_baseline():
    """On an AMX target the int8 dense kernel's default schedule ends in ``tensorize`` with the
    AMX block product: extract_tasks keeps it, with that schedule as its baseline, whose trace
    replays to the kernel relax.build compiles without a record."""
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (128, 64)).astype(np.int8)
    mod = _module(lambda x: op.matmul(x, const(w), out_dtype="int32"), (32, 128), "uint8")
    spr = targets.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids")
    task = next(t for t in relax.extract_tasks(mod, spr) if "dense_u8i8" in t.name)
    assert task.baseline is not None
    assert "amx_u8s8s32_32x64x128" in str(task.baseline.trace)
    replayed = Schedule(task.func)
    replayed.replay(task.baseline.trace)
    assert structural_equal(replayed.func, default_schedules.apply(task.func, spr))


@pytest.mark.skipif(not {"amx_int8", "amx_tile"} <= host_cpu_flags(),
                    reason="this CPU has no AMX int8 tiles (cpuinfo lacks amx_int8 / amx_tile)")
def test_tune_amx_dense_then_build(tmp_path):
    """relax.tune on this AMX machine: the int8 dense task is searched in the default space
    (MultiLevelTilingAMX among its rules), its AMX candidates measured, and the tuned build is
    bit-exact."""
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (256, 128)).astype(np.int8)
    w[0] = -128
    mod = _module(lambda x: op.matmul(x, const(w), out_dtype="int32"), (48, 256), "uint8")
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = relax.tune(mod, "llvm", max_trials=6, work_dir=tmp_path, runner=runner,
                    num_trials_per_iter=3, search={"population_size": 6, "genetic_num_iters": 1},
                    seed=0, progress=False, remeasure=0)
    task = next(t for t in relax.extract_tasks(mod, "llvm") if "dense_u8i8" in t.name)
    amx = [r for r in db.get_top_k(task.func, "llvm", 100)
           if r.ok and "amx_u8s8s32_" in str(r.trace)
           and trace_key(r.trace) != trace_key(task.baseline.trace)]
    assert amx, [r.error for r in db.get_all_tuning_records()]
    vm = relax.VirtualMachine(relax.build(mod, "llvm", database=db, strict=True), CPU)
    x = rng.integers(0, 256, (48, 256)).astype(np.uint8)
    x[0] = 255
    np.testing.assert_array_equal(vm["main"](x).numpy(), x.astype(np.int64) @ w.astype(np.int64))
