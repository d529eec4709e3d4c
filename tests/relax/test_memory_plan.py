"""StaticPlanBlockMemory: storage sharing, static / upper-bound / pooled sizes, results unchanged."""
import numpy as np
import pytest

from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const
from tilecraft.relax.build import build, vm_codegen
from tilecraft.relax.executable import Executable
from tilecraft.relax.expr import Call
from tilecraft.relax.op.base import Op
from tilecraft.relax.transform.static_plan_block_memory import StaticPlanBlockMemory, plan_summary
from tilecraft.relax.vm import VirtualMachine
from tilecraft import targets
from tilecraft.tensorir import IRModule, te

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
    from tilecraft.relax.build import schedule_kernels
    kernels = targets.build(IRModule(
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



def _chain(batch):
    """Three relu kernels on (batch, 64) float32: two intermediates of batch * 256 bytes."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(3):
                h = bb.emit_te(relu, h)
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def _storage_sizes(mod):
    out = []
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            if isinstance(b.value, Call) and getattr(b.value.op, "name", "") == \
                    "relax.memory.alloc_storage":
                out.append(b.value.args[0].values[0].value)
    return out


def test_storages_stay_within_the_limit():
    limit = 8 * 64 * 4                                   # exactly one (8, 64) float32 tensor
    planned = StaticPlanBlockMemory(max_storage_bytes=limit)(deep_mlp(8))
    sizes = _storage_sizes(planned)
    assert sizes and all(s <= limit for s in sizes)
    assert plan_summary(planned)["main"]["tensors"] == 6
    with pytest.raises(ValueError, match="positive"):
        StaticPlanBlockMemory(max_storage_bytes=0)


def test_tensor_over_the_limit_is_a_build_error_naming_it():
    """A (32, 96) float32 intermediate (12 KiB) under a 10 KiB limit."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((32, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit_te(dense, x, const(rand(64, 96)))
            gv = bb.emit_output(bb.emit_te(dense, wide, const(rand(96, 8))))
        bb.emit_func_output(gv)
    mod = bb.get()
    with pytest.raises(Exception, match=rf"main: tensor {wide.name_hint} of shape \(32, 96\) "
                                        r"float32 needs 12288 bytes, over the device's buffer "
                                        r"limit of 10240 bytes"):
        StaticPlanBlockMemory(max_storage_bytes=10 * 1024)(mod)
    assert plan_summary(StaticPlanBlockMemory(max_storage_bytes=12288)(mod))["main"][
        "planned_bytes"] == 12288


def test_bounded_size_over_the_limit_is_left_to_the_pool():
    planned = StaticPlanBlockMemory({"n": 64}, max_storage_bytes=4096)(_chain("n"))
    s = plan_summary(planned)["main"]
    # 64 * 256 bytes = 16 KiB at the bound: over 4 KiB, so sized at run time, never an error
    assert s["planned_bytes"] == 0 and s["dynamic_storages"] >= 1
    planned = StaticPlanBlockMemory({"n": 8}, max_storage_bytes=4096)(_chain("n"))
    assert plan_summary(planned)["main"]["planned_bytes"] == 2 * 8 * 256


def _cast_chain():
    """float32 -> int8 -> float32 * 2 -> relu on (16, 64): an int8 and a float32 intermediate,
    both live at the second kernel."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(lambda t: te.compute(t.shape, lambda *i: t[i].astype("int8"),
                                                "to_i8"), x)
            b = bb.emit_te(lambda t: te.compute(t.shape, lambda *i: a_f32(t, i), "back"), a)
            gv = bb.emit_output(bb.emit_te(relu, b))
        bb.emit_func_output(gv)
    return bb.get()


def a_f32(t, i):
    return t[i].astype("float32") * 2.0


def test_webgpu_sizes_are_device_bytes():
    """On WebGPU an int8 element takes a 32-bit word and int64 is narrowed to one: the plan
    counts device bytes, so a planned int8 tensor fits its storage (and the storage of n bytes
    is n bytes on the device, not a widened uint8 array of 4n)."""
    from tilecraft.relax.transform.static_plan_block_memory import device_storage
    itemsize, limit = device_storage(targets.Target("webgpu"))
    assert (itemsize("int8"), itemsize("int64"), itemsize("float32"), itemsize("float16")) == \
        (4, 4, 4, 2)
    assert limit == 128 * 1024 * 1024
    assert device_storage(targets.Target("opencl"))[1] is None
    host = plan_summary(StaticPlanBlockMemory()(_cast_chain()))["main"]
    dev = plan_summary(StaticPlanBlockMemory(target=targets.Target("webgpu"))(_cast_chain()))
    assert host["planned_bytes"] == 16 * 64 * (1 + 4)
    assert dev["main"]["planned_bytes"] == 16 * 64 * (4 + 4)


def test_webgpu_tensor_over_the_binding_limit_is_a_build_error():
    """A (524289, 64) float32 intermediate (134217984 bytes) is over WebGPU's 128 MiB."""
    big = _chain(524289)
    with pytest.raises(Exception, match=r"shape \(524289, 64\) float32 needs 134217984 bytes, "
                                        r"over the device's buffer limit of 134217728"):
        StaticPlanBlockMemory(target=targets.Target("webgpu"))(big)
    StaticPlanBlockMemory(target=targets.Target("opencl"))(big)    # no build-time limit there


def test_webgpu_binding_limit_is_the_targets():
    """A target that declares the adapter's larger bindings plans a tensor over the spec's
    128 MiB (GPT-2's 154 MB embedding); one that declares less refuses a smaller one."""
    big = _chain(524289)                 # (524289, 64) float32: 134217984 bytes
    wide = targets.Target("webgpu -max-storage-buffer-binding-size=2147483644 "
                          "-max-buffer-size=2147483648")
    from tilecraft.relax.transform.static_plan_block_memory import device_storage
    assert device_storage(wide)[1] == 2147483644
    StaticPlanBlockMemory(target=wide)(big)
    narrow = targets.Target("webgpu -max-storage-buffer-binding-size=1048576")
    with pytest.raises(Exception, match=r"shape \(4097, 64\) float32 needs 1048832 bytes, "
                                        r"over the device's buffer limit of 1048576"):
        StaticPlanBlockMemory(target=narrow)(_chain(4097))
