"""WebGPU kernels against numpy, on whatever adapter wgpu finds (lavapipe in CI)."""
import math

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule, te
from webgpu_testutil import bind_1d, bind_all, gemm_shared, webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def _arrays(dev, *xs):
    return [targets.array(x, dev) for x in xs]


def test_elementwise_math_symbolic_dims(dev, rng):
    n = te.var("n")
    A = te.placeholder((n, 19), "float32", "A")
    B = te.compute((n, 19), lambda i, j: te.exp(A[i, j] * 0.5) + te.tanh(A[i, j] * 30.0)
                   + te.erf(A[i, j]) + te.sigmoid(A[i, j]) + te.pow(A[i, j], 3.0)
                   + te.sqrt(te.abs(A[i, j])) + te.round(A[i, j] * 4.0), "B")
    mod = targets.build(bind_1d(te.create_prim_func([A, B]), "B", 64).mod, "webgpu")
    erf = np.vectorize(math.erf)
    for rows in (1, 7, 100):
        x = rng.standard_normal((rows, 19)).astype("float32") * 2
        a = targets.array(x, dev)
        b = targets.empty((rows, 19), "float32", dev)
        mod["main"](a, b)
        ref = (np.exp(x * 0.5) + np.tanh(x * 30.0) + erf(x) + 1 / (1 + np.exp(-x)) + x ** 3
               + np.sqrt(np.abs(x)) + np.round(x * 4.0))
        np.testing.assert_allclose(b.numpy(), ref, rtol=2e-5, atol=2e-5)


def test_grid_over_65535_workgroups_is_linearized(dev, rng):
    n = 70001
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 3.0 - 1.0, "B")
    mod = targets.build(bind_1d(te.create_prim_func([A, B]), "B", 1).mod, "webgpu")
    assert mod.kernels[0]["linear_grid"]
    x = rng.standard_normal(n).astype("float32")
    a, b = targets.array(x, dev), targets.empty((n,), "float32", dev)
    mod["main"](a, b)
    np.testing.assert_allclose(b.numpy(), x * 3 - 1, rtol=1e-6, atol=1e-6)  # GPUs fuse the FMA


def test_row_reductions_sum_and_max(dev, rng):
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    S = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "S")
    k2 = te.reduce_axis((0, m), "k2")
    M = te.compute((n,), lambda i: te.max(A[i, k2], axis=k2), "M")
    sch = Schedule(te.create_prim_func([A, S, M]))
    for name in ("S", "M"):
        i, _ = sch.get_loops(sch.get_block(name))
        bx, tx = sch.split(i, [None, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    mod = targets.build(sch.mod, "webgpu")
    assert len(mod.kernels) == 2
    x = rng.standard_normal((45, 33)).astype("float32")
    a = targets.array(x, dev)
    s, mx = targets.empty((45,), "float32", dev), targets.empty((45,), "float32", dev)
    mod["main"](a, s, mx)
    np.testing.assert_allclose(s.numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx.numpy(), x.max(1))


def test_gemm_with_shared_memory_tiles(dev, rng):
    m = te.var("m")
    mod = targets.build(gemm_shared(m, 64, 48), "webgpu")
    src = mod.get_source()
    assert "var<workgroup>" in src and "workgroupBarrier();" in src
    for rows in (32, 70):
        x = rng.standard_normal((rows, 48)).astype("float32")
        w = rng.standard_normal((48, 64)).astype("float32")
        a, b = _arrays(dev, x, w)
        c = targets.empty((rows, 64), "float32", dev)
        mod["main"](a, b, c)
        np.testing.assert_allclose(c.numpy(), x @ w, rtol=1e-4, atol=1e-4)


def test_narrow_integers_wrap_and_bool(dev, rng):
    n = te.var("n")
    A = te.placeholder((n,), "int8", "A")
    B = te.placeholder((n,), "int8", "B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i], "C")
    U = te.compute((n,), lambda i: (A[i].astype("uint8") + B[i].astype("uint8")), "U")
    G = te.compute((n,), lambda i: A[i] > B[i], "G")
    W = te.compute((n,), lambda i: A[i].astype("int64") * 1000 + G[i].astype("int64"), "W")
    mod = targets.build(bind_all(te.create_prim_func([A, B, C, U, G, W])).mod, "webgpu")
    x = rng.integers(-128, 128, 300).astype("int8")
    y = rng.integers(-128, 128, 300).astype("int8")
    a, b = _arrays(dev, x, y)
    c = targets.empty((300,), "int8", dev)
    u = targets.empty((300,), "uint8", dev)
    g = targets.empty((300,), "bool", dev)
    w = targets.empty((300,), "int64", dev)
    mod["main"](a, b, c, u, g, w)
    np.testing.assert_array_equal(c.numpy(), x * y + x)          # wraps like numpy int8
    np.testing.assert_array_equal(u.numpy(), x.astype("uint8") + y.astype("uint8"))
    np.testing.assert_array_equal(g.numpy(), x > y)
    np.testing.assert_array_equal(w.numpy(), x.astype("int64") * 1000 + (x > y))


def test_scalar_parameters_and_two_kernels_with_a_temporary(dev, rng):
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * c, "B")
    C = te.compute((n,), lambda i: B[n - 1 - i] + 1.0, "C")
    mod = targets.build(bind_all(te.create_prim_func([A, C, c])).mod, "webgpu")
    assert len(mod.kernels) == 2
    x = rng.standard_normal(77).astype("float32")
    a, out = targets.array(x, dev), targets.empty((77,), "float32", dev)
    mod["main"](a, out, 2.5)
    np.testing.assert_allclose(out.numpy(), x[::-1] * 2.5 + 1.0, rtol=1e-6)


def test_more_than_eight_buffers_are_packed(dev, rng):
    n = te.var("n")
    ins = [te.placeholder((n,), "float32", f"X{i}") for i in range(10)]
    idx = te.placeholder((n,), "int32", "I")
    out = te.compute((n,), lambda i: sum((x[i] * float(k + 1) for k, x in enumerate(ins)),
                                         idx[i].astype("float32")), "Y")
    mod = targets.build(bind_1d(te.create_prim_func([*ins, idx, out]), "Y").mod, "webgpu")
    k, = mod.kernels
    assert len(k["bindings"]) <= 8 and any(b["packed"] for b in k["bindings"])
    xs = [rng.standard_normal(50).astype("float32") for _ in range(10)]
    ii = rng.integers(-5, 5, 50).astype("int32")
    arrs = _arrays(dev, *xs, ii)
    y = targets.empty((50,), "float32", dev)
    mod["main"](*arrs, y)
    ref = sum(x * (k + 1) for k, x in enumerate(xs)) + ii
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_float16_with_shader_f16(dev, rng):
    from tilecraft.targets.webgpu_backend import runtime
    if "shader-f16" not in runtime.adapter_features(dev.index):
        pytest.skip("the adapter has no shader-f16")
    A = te.placeholder((64,), "float16", "A")
    B = te.compute((64,), lambda i: A[i] * A[i] + te.exp(A[i]), "B")
    func = bind_1d(te.create_prim_func([A, B]), "B").mod
    with pytest.raises(ValueError, match="shader-f16"):
        targets.build(func, "webgpu")
    mod = targets.build(func, "webgpu -supports-float16=1")
    assert "enable f16;" in mod.get_source()
    x = rng.standard_normal(64).astype("float16")
    runtime.close_device(dev.index)   # reopen: the device now asks for shader-f16
    a, b = targets.array(x, dev), targets.empty((64,), "float16", dev)
    mod["main"](a, b)
    xf = x.astype("float32")
    ref = (xf * xf).astype("float16").astype("float32") + np.exp(xf)
    np.testing.assert_allclose(b.numpy().astype("float32"), ref, rtol=3e-3, atol=1e-3)
