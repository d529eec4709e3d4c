"""16-byte storage accesses in WGSL: float32 buffers bound as array<vec4<f32>> (issue 32).

The generated WGSL is checked for the bindings and the vector accesses; every kernel also runs
on the adapter (lavapipe in CI) against numpy.
"""
import re

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import gpu_schedules
from tilecraft.tensorir import IRModule, Schedule, te
from tilecraft.targets.webgpu_backend import runtime, storage
from webgpu_testutil import webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def _bindings(src: str) -> dict:
    """{buffer name: element type} of the storage bindings of a WGSL kernel."""
    return dict(re.findall(r"var<storage, [a-z_]+> (\w+): array<([^;]+)>;", src))


def _default(func, target="webgpu"):
    t = targets.Target(target)
    return targets.build(IRModule({"main": gpu_schedules.apply(func, t)}), t)


def _vec_1d(func, block: str, threads: int = 64, target: str = "webgpu"):
    """Fuse ``block``'s loops, split [blocks, threads, 4], the 4 vectorized."""
    sch = Schedule(func)
    loops = sch.get_loops(sch.get_block(block))
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx, v = sch.split(fused, [None, threads, 4])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    return targets.build(sch.mod, target)


def test_buffer_sizes_are_multiples_of_16():
    assert [storage.buffer_bytes(n) for n in (0, 4, 16, 20, 36, 64)] == [16, 16, 16, 32, 48, 64]


def test_default_elementwise_is_one_vec4_load_and_store(dev, rng):
    shape = (2, 32, 28, 28)
    A = te.placeholder(shape, "float32", "A")
    B = te.compute(shape, lambda *i: te.max(A[i], te.const(0.0, "float32")), "B")
    mod = _default(te.create_prim_func([A, B]))
    src = mod.get_source()
    assert _bindings(src) == {"b_A": "vec4<f32>", "b_B": "vec4<f32>"}
    assert src.count("b_A[") == 1 and src.count("b_B[") == 1   # one load, one store
    assert "& 3i" not in src                                      # no component access
    # the hand-edited shape of the limits probe (benchmarks/gpu_webgpu.py, _vec4_relu)
    assert "] = max(tc_v4_1, vec4<f32>(0.0f));" in src
    x = rng.standard_normal(shape).astype("float32")
    b = targets.empty(shape, "float32", dev)
    mod["main"](targets.array(x, dev), b)
    np.testing.assert_array_equal(b.numpy(), np.maximum(x, 0))


def test_default_broadcast_and_transpose(dev, rng):
    A = te.placeholder((64, 256), "float32", "A")
    bias = te.placeholder((256,), "float32", "bias")
    scale = te.placeholder((64, 1), "float32", "scale")
    C = te.compute((64, 256), lambda i, j: (A[i, j] + bias[j]) * scale[i, 0], "C")
    mod = _default(te.create_prim_func([A, bias, scale, C]))
    binds = _bindings(mod.get_source())
    # the row in aligned runs of 4; the bias (index (4 t + v) % 256) and the scale are read
    # lane by lane (arith.ramp_base does not see the bias's run through the floormod)
    assert binds["b_A"] == binds["b_C"] == "vec4<f32>"
    assert binds["b_bias"] == binds["b_scale"] == "f32"
    x = rng.standard_normal((64, 256)).astype("float32")
    bv = rng.standard_normal(256).astype("float32")
    sv = rng.standard_normal((64, 1)).astype("float32")
    c = targets.empty((64, 256), "float32", dev)
    mod["main"](*(targets.array(v, dev) for v in (x, bv, sv)), c)
    np.testing.assert_allclose(c.numpy(), (x + bv) * sv, rtol=1e-6, atol=1e-6)

    T = te.placeholder((96, 128), "float32", "T")
    U = te.compute((128, 96), lambda i, j: T[j, i], "U")
    mod = _default(te.create_prim_func([T, U]))
    # the output in runs of 4; the input strided (scalars of an array<f32>)
    assert _bindings(mod.get_source()) == {"b_T": "f32", "b_U": "vec4<f32>"}
    t = rng.standard_normal((96, 128)).astype("float32")
    u = targets.empty((128, 96), "float32", dev)
    mod["main"](targets.array(t, dev), u)
    np.testing.assert_array_equal(u.numpy(), t.T)


def test_odd_sizes_stay_scalar(dev, rng):
    # 3 * 5 * 7 elements: the default schedule has no vector loop
    shape = (3, 5, 7)
    A = te.placeholder(shape, "float32", "A")
    B = te.compute(shape, lambda *i: te.tanh(A[i]), "B")
    mod = _default(te.create_prim_func([A, B]))
    assert set(_bindings(mod.get_source()).values()) == {"f32"}
    x = rng.standard_normal(shape).astype("float32")
    b = targets.empty(shape, "float32", dev)
    mod["main"](targets.array(x, dev), b)
    np.testing.assert_allclose(b.numpy(), np.tanh(x), rtol=2e-6, atol=2e-6)
    # a vector loop whose lanes have different tail tests (1030 = 4 * 257 + 2): scalar lanes
    A = te.placeholder((1030,), "float32", "A")
    B = te.compute((1030,), lambda i: A[i] * 2.0 + 1.0, "B")
    mod = _vec_1d(te.create_prim_func([A, B]), "B")
    assert set(_bindings(mod.get_source()).values()) == {"f32"}
    x = rng.standard_normal(1030).astype("float32")
    b = targets.empty((1030,), "float32", dev)
    mod["main"](targets.array(x, dev), b)
    np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6, atol=1e-6)


def test_symbolic_rows_vec4_under_one_tail_test(dev, rng):
    n = te.var("n")
    A = te.placeholder((n, 12), "float32", "A")
    B = te.compute((n, 12), lambda i, j: te.exp(A[i, j]) * 2.0, "B")
    mod = _vec_1d(te.create_prim_func([A, B]), "B")
    src = mod.get_source()
    # the split's tail test (4 t + v < 12 n) is the same for the four lanes: one test, outside
    assert _bindings(src) == {"b_A": "vec4<f32>", "b_B": "vec4<f32>"}
    assert src.count("if (") == 2                  # the grid's early return and the tail test
    for rows in (1, 3, 37):
        x = rng.standard_normal((rows, 12)).astype("float32")
        b = targets.empty((rows, 12), "float32", dev)
        mod["main"](targets.array(x, dev), b)
        np.testing.assert_allclose(b.numpy(), np.exp(x) * 2, rtol=2e-6, atol=2e-6)


def test_aligned_and_unaligned_accesses_of_one_buffer(dev, rng):
    # A[i] is one vec4 per thread, A[i + 1] components of the same array<vec4<f32>> (at lanes
    # the analyzer proves constant: 4 t + 1 .. 4 t + 4 are lanes 1, 2, 3 of vector t and lane 0
    # of vector t + 1, no `& 3i`); A has 4 k + 1 elements, so its last element sits in the
    # 16-byte padding of the allocation
    A = te.placeholder((1025,), "float32", "A")
    B = te.compute((1024,), lambda i: A[i] + A[i + 1], "B")
    mod = _vec_1d(te.create_prim_func([A, B]), "B")
    src = mod.get_source()
    assert _bindings(src) == {"b_A": "vec4<f32>", "b_B": "vec4<f32>"}
    assert "let tc_v4_1: vec4<f32> = b_A[" in src and "& 3i]" not in src
    assert all(f"][{c}i]" in src for c in range(4))
    x = rng.standard_normal(1025).astype("float32")
    b = targets.empty((1024,), "float32", dev)
    mod["main"](targets.array(x, dev), b)
    np.testing.assert_array_equal(b.numpy(), x[:-1] + x[1:])


def _gemm(m, k, n):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def test_gemm_rule_with_vectorized_fetch_reads_vec4(dev, rng):
    """The GEMM rule as scheduled for OpenCL (register fragments, a float4 global -> shared
    fetch) built for WebGPU: the fetch is one vec4 load per run of 4 (the WebGPU schedule
    itself fetches by element: relax/backend/gpu/gemm.py)."""
    m, k, n = 256, 128, 384
    sch = gpu_schedules.apply(_gemm(m, k, n), targets.Target("opencl"))
    target = targets.Target("webgpu -max-shared-memory-per-block=32768")
    mod = targets.build(IRModule({"main": sch}), target)
    # the device opened by earlier tests has the spec's 16 KiB of workgroup storage
    runtime.note_target(target)
    runtime.close_device(dev.index)
    src = mod.get_source()
    binds = _bindings(src)
    if binds["b_A"] != "vec4<f32>":
        pytest.skip("the OpenCL GEMM schedule of this shape has no vectorized fetch")
    assert binds["b_B"] == "vec4<f32>"
    assert re.search(r"let tc_v4_\d+: vec4<f32> = b_A\[", src)
    a = rng.standard_normal((m, k)).astype("float32")
    w = rng.standard_normal((k, n)).astype("float32")
    c = targets.empty((m, n), "float32", dev)
    mod["main"](targets.array(a, dev), targets.array(w, dev), c)
    np.testing.assert_allclose(c.numpy(), a.astype("float64") @ w, rtol=1e-4, atol=1e-4)


def test_webgpu_gemm_default_schedule_still_runs(dev, rng):
    m, k, n = 128, 64, 96
    mod = _default(_gemm(m, k, n))
    a = rng.standard_normal((m, k)).astype("float32")
    w = rng.standard_normal((k, n)).astype("float32")
    c = targets.empty((m, n), "float32", dev)
    mod["main"](targets.array(a, dev), targets.array(w, dev), c)
    np.testing.assert_allclose(c.numpy(), a.astype("float64") @ w, rtol=1e-4, atol=1e-4)


def test_float16_vec4_bindings(dev, rng):
    if "shader-f16" not in runtime.adapter_features(dev.index):
        pytest.skip("the adapter has no shader-f16")
    A = te.placeholder((1024,), "float16", "A")
    B = te.compute((1024,), lambda i: A[i] * te.const(0.5, "float16") + A[i], "B")
    mod = _vec_1d(te.create_prim_func([A, B]), "B", target="webgpu -supports-float16=1")
    src = mod.get_source()
    assert _bindings(src) == {"b_A": "vec4<f16>", "b_B": "vec4<f16>"}
    x = rng.standard_normal(1024).astype("float16")
    runtime.close_device(dev.index)   # reopen: the device now asks for shader-f16
    b = targets.empty((1024,), "float16", dev)
    mod["main"](targets.array(x, dev), b)
    ref = (x.astype("float32") * 0.5 + x.astype("float32"))
    np.testing.assert_allclose(b.numpy().astype("float32"), ref, rtol=2e-3, atol=2e-3)



# At these sizes the default schedules fuse every elementwise op into a convolution or a GEMM
# kernel, whose global fetch the WebGPU schedules do not vectorize (relax/backend/gpu): the
# models check that the 16-byte allocation and generation leave whole layers right.

def test_resnet_bottleneck_static_shape(dev):
    from tilecraft import relax
    from tilecraft.models.resnet import resnet_bottleneck
    from tilecraft.relax import VirtualMachine
    model = resnet_bottleneck(channels=64, width=16, height=16, batch=1, seed=3)
    exe = relax.build(model.mod, "webgpu")
    x, = model.make_inputs(np.random.default_rng(2), batch=1)
    y = VirtualMachine(exe, dev)["main"](x)
    ref = model.reference(x)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_bert_layer_static_shape(dev):
    from tilecraft import relax
    from tilecraft.models import bert_encoder_layer
    from tilecraft.relax import VirtualMachine
    model = bert_encoder_layer(hidden=128, heads=2, ffn=256, seed=4, batch=1, seq_len=32)
    exe = relax.build(model.mod, "webgpu")
    x, = model.make_inputs(np.random.default_rng(3), batch=1, seq_len=32)
    y = VirtualMachine(exe, dev)["main"](x)
    ref = model.reference(x)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
