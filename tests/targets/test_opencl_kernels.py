"""Kernels through the OpenCL back end vs numpy: math, integer division, casts, cross-thread
reductions, a shared-memory GEMM, vector loops, two kernels through a global temporary,
in-kernel checks. All functions go into one module (one program: PoCL compiles slowly)."""
import numpy as np
import pytest

from tilecraft import targets
from opencl_testutil import opencl_device
from tilecraft.tensorir import Schedule, te
from tilecraft.tensorir.function import IRModule


def _bind_flat(sch, block, threads=64, vector=None):
    loops = sch.get_loops(block)
    f = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if vector:
        f, v = sch.split(f, [None, vector])
        sch.vectorize(v)
    bx, tx = sch.split(f, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def math_func():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    outs = [te.compute((n,), lambda i: te.exp(A[i]) + te.log(te.abs(A[i]) + 1.0), "o0"),
            te.compute((n,), lambda i: te.tanh(A[i]) * te.sigmoid(A[i]) + te.erf(A[i]), "o1"),
            te.compute((n,), lambda i: te.sqrt(te.abs(A[i])) + te.rsqrt(te.abs(A[i]) + 1.0),
                       "o2"),
            te.compute((n,), lambda i: te.floor(A[i]) + te.ceil(A[i]) * te.round(A[i] * 3.0),
                       "o3"),
            te.compute((n,), lambda i: te.if_then_else(A[i] > 0.0, te.max(A[i], 0.5),
                                                         te.min(A[i], -0.5)), "o4")]
    sch = Schedule(te.create_prim_func([A] + outs))
    for o in outs:
        _bind_flat(sch, sch.get_block(o.name))
    return sch.mod["main"]


def int_func():
    A = te.placeholder((64,), "int32", "A")
    B = te.placeholder((64,), "int32", "B")
    q = te.compute((64,), lambda i: A[i] // B[i], "q")
    r = te.compute((64,), lambda i: A[i] % B[i], "r")
    c = te.compute((64,), lambda i: (A[i] > B[i]).astype("float32") + A[i].astype("float32"),
                   "c")
    sch = Schedule(te.create_prim_func([A, B, q, r, c]))
    for o in (q, r, c):
        _bind_flat(sch, sch.get_block(o.name), 32)
    return sch.mod["main"]


def rowreduce_func():
    n = te.var("n")
    A = te.placeholder((n, 100), "float32", "A")
    k = te.reduce_axis((0, 100), "k")
    k2 = te.reduce_axis((0, 100), "k2")
    M = te.compute((n,), lambda i: te.max(A[i, k], axis=k), "M")
    S = te.compute((n,), lambda i: te.sum(A[i, k2] * A[i, k2], axis=k2), "S")
    sch = Schedule(te.create_prim_func([A, M, S]))
    for name, threads in (("M", 24), ("S", 64)):     # 24: not a power of two
        b = sch.get_block(name)
        i, kk = sch.get_loops(b)
        ko, ki = sch.split(kk, [None, threads])
        sch.reorder(i, ki, ko)
        sch.bind(i, "blockIdx.x")
        sch.bind(ki, "threadIdx.x")
    return sch.mod["main"]


def gemv_func(columns: int = 72):
    """y = x W with the columns on threadIdx.x and the reduction shared by threadIdx.y: one
    tree per column (a shared buffer slot per (column, reducing thread)). ``columns`` not a
    multiple of 24 leaves a tail of threads past the last column."""
    m = te.var("m")
    A = te.placeholder((m, 100), "float32", "A")
    W = te.placeholder((100, columns), "float32", "W")
    k = te.reduce_axis((0, 100), "k")
    C = te.compute((m, columns), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    i, j, kk = sch.get_loops(sch.get_block("C"))
    jo, ji = sch.split(j, [None, 24])
    ko, ki = sch.split(kk, [6, None])           # 6 reducing threads: not a power of two
    sch.reorder(i, jo, ji, ko, ki)
    sch.bind(i, "blockIdx.y")
    sch.bind(jo, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    sch.bind(ko, "threadIdx.y")
    return sch.mod["main"]


def gemm_func():
    n = te.var("n")
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 32), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    b = sch.get_block("C")
    i, j, kk = sch.get_loops(b)
    io, ii = sch.split(i, [None, 4])
    ko, ki = sch.split(kk, [None, 8])
    sch.reorder(io, j, ko, ii, ki)
    sch.bind(io, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    for idx in (0, 1):
        sh = sch.cache_read(b, idx, "shared")
        sch.compute_at(sh, ko)
        fused = sch.fuse(*sch.get_loops(sh)[-2:])
        _, fi = sch.split(fused, [None, 32])
        sch.bind(fi, "threadIdx.x")
    loc = sch.cache_write(b, 0, "local")
    sch.reverse_compute_at(loc, j)
    sch.decompose_reduction(b, ko)
    return sch.mod["main"]


def vector_func():
    A = te.placeholder((4096,), "float32", "A")
    B = te.placeholder((4096,), "float32", "B")
    C = te.compute((4096,), lambda i: A[i] * B[i] + te.exp(A[i]), "C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    _bind_flat(sch, sch.get_block("C"), 128, vector=4)
    return sch.mod["main"]


def two_kernels_func():
    A = te.placeholder((64,), "float32", "A")
    B = te.compute((64,), lambda i: A[i] + 1.0, "B")
    C = te.compute((64,), lambda i: B[63 - i] * 2.0, "C")
    sch = Schedule(te.create_prim_func([A, C]))
    for name in ("B", "C"):
        _bind_flat(sch, sch.get_block(name), 32)
    return sch.mod["main"]


def gather_func():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", "A")
    idx = te.placeholder((m,), "int64", "idx")
    B = te.compute((m,), lambda i: A[idx[i]], "B")
    sch = Schedule(te.create_prim_func([A, idx, B]))
    _bind_flat(sch, sch.get_block("B"), 32)
    return sch.mod["main"]


FUNCS = {"math": math_func, "ints": int_func, "rowreduce": rowreduce_func, "gemm": gemm_func,
         "gemv": gemv_func, "gemv_tail": lambda: gemv_func(70),
         "vector": vector_func, "two_kernels": two_kernels_func, "gather": gather_func}


@pytest.fixture(scope="module")
def dev():
    return opencl_device()


@pytest.fixture(scope="module")
def mod():
    funcs = {}
    for name, make in FUNCS.items():
        f = make()
        funcs[name] = f.replace(attrs={**f.attr_dict, "global_symbol": name})
    return targets.build(IRModule(funcs), "opencl")


def _run(mod, dev, name, inputs, out_shapes, *scalars):
    args = [targets.array(x, dev) for x in inputs]
    outs = [targets.empty(s, d, dev) for s, d in out_shapes]
    mod[name](*args, *outs, *scalars)
    return [o.numpy() for o in outs]


def test_math_intrinsics(mod, dev):
    x = np.random.default_rng(0).standard_normal(203).astype("float32") * 2
    import math
    erf = np.vectorize(math.erf)
    got = _run(mod, dev, "math", [x], [((203,), "float32")] * 5)
    sig = 1 / (1 + np.exp(-x))
    want = [np.exp(x) + np.log(np.abs(x) + 1), np.tanh(x) * sig + erf(x),
            np.sqrt(np.abs(x)) + 1 / np.sqrt(np.abs(x) + 1),
            np.floor(x) + np.ceil(x) * np.round(x * 3),
            np.where(x > 0, np.maximum(x, 0.5), np.minimum(x, -0.5))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_integer_floor_division_and_casts(mod, dev):
    rng = np.random.default_rng(1)
    a = rng.integers(-50, 50, 64).astype("int32")
    b = rng.choice([-7, -3, -1, 1, 2, 5], 64).astype("int32")
    q, r, c = _run(mod, dev, "ints", [a, b], [((64,), "int32")] * 2 + [((64,), "float32")])
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_array_equal(r, a % b)
    np.testing.assert_array_equal(c, (a > b).astype("float32") + a)


@pytest.mark.parametrize("rows", [1, 5])
def test_cross_thread_reductions(mod, dev, rows):
    x = np.random.default_rng(rows).standard_normal((rows, 100)).astype("float32")
    m, s = _run(mod, dev, "rowreduce", [x], [((rows,), "float32")] * 2)
    np.testing.assert_allclose(m, x.max(1), rtol=1e-6)
    np.testing.assert_allclose(s, (x * x).sum(1), rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_cross_thread_reduction_under_thread_bound_columns(mod, dev, rows):
    # each column's threads reduce into their own slots (it used to be one tree for all columns)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 100)).astype("float32")
    w = rng.standard_normal((100, 72)).astype("float32")
    got, = _run(mod, dev, "gemv", [x, w], [((rows, 72), "float32")])
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4)


def test_cross_thread_reduction_with_a_column_tail(mod, dev):
    # 70 columns in blocks of 24: the last block's two spare threads must read nothing
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 100)).astype("float32")
    w = rng.standard_normal((100, 70)).astype("float32")
    got, = _run(mod, dev, "gemv_tail", [x, w], [((3, 70), "float32")])
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 6, 33])
def test_shared_memory_gemm_symbolic_rows(mod, dev, rows):
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 64)).astype("float32")
    w = rng.standard_normal((64, 32)).astype("float32")
    c, = _run(mod, dev, "gemm", [a, w], [((rows, 32), "float32")])
    np.testing.assert_allclose(c, a @ w, rtol=1e-4, atol=1e-4)
    src = mod.get_source()
    assert "__local float A_shared" in src and "barrier(CLK_LOCAL_MEM_FENCE)" in src


def test_vector_loop_uses_vload(mod, dev):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4096)).astype("float32")
    c, = _run(mod, dev, "vector", [a, b], [((4096,), "float32")])
    np.testing.assert_allclose(c, a * b + np.exp(a), rtol=1e-5, atol=1e-6)
    src = mod.get_source()
    # float4 accesses: vload4 / vstore4, or aligned pointer accesses where the offset is a
    # provable multiple of 4 (buffers are whole device allocations)
    assert "vload4" in src or "(__global const float4*)" in src
    assert "vstore4" in src or "*((__global float4*)" in src


def test_two_kernels_through_a_device_temporary(mod, dev):
    x = np.arange(64, dtype="float32")
    c, = _run(mod, dev, "two_kernels", [x], [((64,), "float32")])
    np.testing.assert_allclose(c, (x[::-1] + 1) * 2)


def test_in_kernel_bounds_check_raises(mod, dev):
    from tilecraft.targets.runtime.device_module import DeviceKernelError
    a = np.arange(10, dtype="float32")
    idx = np.array([0, 3, 9, 2], "int64")
    b, = _run(mod, dev, "gather", [a, idx], [((4,), "float32")])
    np.testing.assert_array_equal(b, a[idx])
    with pytest.raises(DeviceKernelError, match="out of bounds"):
        _run(mod, dev, "gather", [a, np.array([0, 10], "int64")], [((2,), "float32")])
