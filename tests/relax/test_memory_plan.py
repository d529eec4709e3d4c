"""StaticPlanBlockMemory: storage sharing, static / upper-bound / pooled sizes, results unchanged."""
import numpy as np
import pytest

from relax import BlockBuilder, TensorStructInfo, Tuple, Var, const
from relax.build import build, vm_codegen
from relax.executable import Executable
from relax.expr import Call
from relax.op.base import Op
from relax.transform.static_plan_block_memory import StaticPlanBlockMemory, plan_summary
from relax.vm import VirtualMachine
import targets
from tensorir import te

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def dense(x, w):
    k = te.reduce_axis((0, x.shape[1]), "k")
    return te.compute((x.shape[0], w.shape[1]),
                      lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), "dense")


def relu(x):
    return te.compute(x.shape, lambda *i: te.max(x[i], 0.0), "relu")


WS = [rand(32, 64), rand(64, 64), rand(64, 64), rand(64, 16)]


def deep_mlp(batch):
    """Four dense layers with relu between them: seven kernels, six intermediates."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, w in enumerate(WS):
                h = bb.emit_te(dense, h, const(w))
                if i < len(WS) - 1:
                    h = bb.emit_te(relu, h)
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def ref(x):
    h = x
    for i, w in enumerate(WS):
        h = h @ w
        if i < len(WS) - 1:
            h = np.maximum(h, 0)
    return h


def _ops(func):
    names = []
    for blk in func.body.blocks:
        for b in blk.bindings:
            if isinstance(b.value, Call) and isinstance(b.value.op, Op):
                names.append(b.value.op.name)
    return names


def _unplanned_exe(mod):
    program, constants = vm_codegen(mod)
    from relax.build import schedule_kernels
    kernels = targets.build(__import__("tensorir").IRModule(
        schedule_kernels(mod, targets.Target("llvm"), None, program["kernels"])), "llvm")
    return Executable(program, constants, kernels, "llvm")


def test_static_mlp_shares_storage_and_results_are_unchanged():
    mod = deep_mlp(8)
    planned = StaticPlanBlockMemory()(mod)
    s = plan_summary(planned)["main"]
    assert s["tensors"] == 6                       # every intermediate is planned, not the output
    assert s["storages"] < s["tensors"]            # ... into fewer storages
    assert s["planned_bytes"] < s["unplanned_bytes"]
    assert s["planned_bytes"] == 2 * 8 * 64 * 4    # two ping-pong buffers of (8, 64) float32
    ops = _ops(planned["main"])
    assert ops.count("relax.call_tir") == 1        # the result is allocated fresh
    assert ops.count("relax.call_tir_dps") == 6
    x = rand(8, 32)
    exe = build(mod, "llvm", pipeline=[])          # unfused, so that every kernel is planned
    vm = VirtualMachine(exe)
    out = vm["main"](x).numpy()
    np.testing.assert_allclose(out, ref(x), rtol=1e-4, atol=1e-4)
    assert vm.memory_stats()["static_storage_bytes"] == s["planned_bytes"]
    unplanned = VirtualMachine(_unplanned_exe(mod))["main"](x).numpy()
    np.testing.assert_array_equal(out, unplanned)
    # results of two calls are independent arrays (outputs are never planned)
    x2 = rand(8, 32)
    a, b = vm["main"](x), vm["main"](x2)
    np.testing.assert_allclose(a.numpy(), ref(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.numpy(), ref(x2), rtol=1e-4, atol=1e-4)


def test_symbolic_shapes_with_upper_bound_are_planned_statically():
    exe = build(deep_mlp("n"), "llvm", pipeline=[], upper_bounds={"n": 64})
    st = exe.stats()["main"]
    assert st["storages"] == 2 and st["static_storage_bytes"] == 2 * 64 * 64 * 4
    vm = VirtualMachine(exe)
    for n in (1, 13, 64):
        x = rand(n, 32)
        np.testing.assert_allclose(vm["main"](x).numpy(), ref(x), rtol=1e-4, atol=1e-4)
    assert vm.memory_stats()["pool_bytes"] == 0
    # beyond the bound the run still works: those tensors come from the pool
    x = rand(70, 32)
    np.testing.assert_allclose(vm["main"](x).numpy(), ref(x), rtol=1e-4, atol=1e-4)
    assert vm.memory_stats()["pool_bytes"] > 0


def test_symbolic_shapes_without_bound_use_the_pool():
    exe = build(deep_mlp("n"), "llvm", pipeline=[])
    planned = plan_summary(StaticPlanBlockMemory()(deep_mlp("n")))["main"]
    assert planned["dynamic_storages"] == 2 and planned["planned_bytes"] == 0
    vm = VirtualMachine(exe)
    x = rand(9, 32)
    np.testing.assert_allclose(vm["main"](x).numpy(), ref(x), rtol=1e-4, atol=1e-4)
    first = vm.memory_stats()["pool_bytes"]
    assert 0 < first <= 2 * 9 * 64 * 4 + 2 * 64
    for _ in range(3):   # the same size again: the pool's buffers are reused
        np.testing.assert_allclose(vm["main"](x).numpy(), ref(x), rtol=1e-4, atol=1e-4)
    assert vm.memory_stats()["pool_bytes"] == first
    x = rand(3, 32)
    np.testing.assert_allclose(vm["main"](x).numpy(), ref(x), rtol=1e-4, atol=1e-4)


def test_values_flowing_to_the_result_are_not_planned():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(relu, x)          # returned inside a tuple: must not be planned
            b = bb.emit_te(relu, a)          # intermediate
            c = bb.emit_te(dense, b, const(rand(8, 8)))
            gv = bb.emit_output(Tuple([a, c]))
        bb.emit_func_output(gv)
    mod = bb.get()
    planned = StaticPlanBlockMemory()(mod)
    assert plan_summary(planned)["main"]["tensors"] == 1
    vm = VirtualMachine(build(mod, "llvm", pipeline=[]))
    v = rand(4, 8)
    r1 = vm["main"](v)
    keep = r1[0].numpy()
    vm["main"](rand(4, 8))
    np.testing.assert_array_equal(r1[0].numpy(), keep)


def test_upper_bounds_are_validated():
    with pytest.raises(ValueError, match="negative"):
        StaticPlanBlockMemory({"n": -1})
