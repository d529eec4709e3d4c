"""relax.default_schedules: every rule keeps the kernel's results (interpreter and compiled),
on small odd and symbolic sizes."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import default_schedules as ds
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.interpret import interpret

TARGET = Target("llvm")


def _check(func, make_arrays, ref, sizes, compiled=True):
    """Schedule ``func``; for each size dict, interpret and run compiled against ``ref``."""
    g = ds.apply(func, TARGET)
    assert ds.is_scheduled(g) or g is func
    mod = targets.build(g, "llvm") if compiled else None
    for kw in sizes:
        rng = np.random.default_rng(sum(kw.values()))
        ins, out_shape = make_arrays(rng, **kw)
        want = ref(*ins)
        out = np.zeros(out_shape, "float32")
        interpret(g, *ins, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        if mod is not None:
            out2 = np.zeros(out_shape, "float32")
            mod["main"](*ins, out2)
            np.testing.assert_allclose(out2, want, rtol=1e-4, atol=1e-4)
    return g


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


def test_elementwise_symbolic():
    n = te.var("n")
    A = te.placeholder((n, 37), "float32", "A")
    B = te.compute((n, 37), lambda i, j: te.max(A[i, j] * 2.0, 0.0), "B")
    _check(te.create_prim_func([A, B]), lambda r, n: ([_f32(r, n, 37)], (n, 37)),
           lambda a: np.maximum(a * 2, 0), [{"n": 1}, {"n": 5}, {"n": 130}])


@pytest.mark.parametrize("m", [40, 64])
def test_matmul_bias_relu_symbolic_rows(m):
    n = te.var("n")
    A = te.placeholder((n, 19), "float32", "A")
    W = te.placeholder((19, m), "float32", "W")
    bias = te.placeholder((m,), "float32", "bias")
    k = te.reduce_axis((0, 19), "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    D = te.compute((n, m), lambda i, j: te.max(C[i, j] + bias[j], 0.0), "D")
    g = _check(te.create_prim_func([A, W, bias, D]),
               lambda r, n: ([_f32(r, n, 19), _f32(r, 19, m), _f32(r, m)], (n, m)),
               lambda a, w, b: np.maximum(a @ w + b, 0),
               [{"n": 1}, {"n": 5}, {"n": 6}, {"n": 13}, {"n": 64}])
    assert "parallel" in g.script() and "vectorized" in g.script()


def test_matmul_static_odd():
    A = te.placeholder((7, 9), "float32", "A")
    W = te.placeholder((9, 35), "float32", "W")
    k = te.reduce_axis((0, 9), "k")
    C = te.compute((7, 35), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    _check(te.create_prim_func([A, W, C]), lambda r: ([_f32(r, 7, 9), _f32(r, 9, 35)], (7, 35)),
           lambda a, w: a @ w, [{}])


def test_batch_matmul_symbolic_seq():
    s = te.var("s")
    Q = te.placeholder((3, s, 16), "float32", "Q")
    K = te.placeholder((3, 16, s), "float32", "K")
    k = te.reduce_axis((0, 16), "k")
    S = te.compute((3, s, s), lambda b, i, j: te.sum(Q[b, i, k] * K[b, k, j], axis=k), "S")
    _check(te.create_prim_func([Q, K, S]),
           lambda r, s: ([_f32(r, 3, s, 16), _f32(r, 3, 16, s)], (3, s, s)),
           lambda q, kk: q @ kk, [{"s": 1}, {"s": 7}, {"s": 33}])


def test_row_reduction_symbolic():
    n = te.var("n")
    A = te.placeholder((n, 23), "float32", "A")
    k = te.reduce_axis((0, 23), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    _check(te.create_prim_func([A, B]), lambda r, n: ([_f32(r, n, 23)], (n,)),
           lambda a: a.sum(1), [{"n": 1}, {"n": 9}])


def _conv_ref(x, w, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow), "float32")
    for r in range(kh):
        for q in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, r:r + oh, q:q + ow], w[:, :, r, q])
    return out


@pytest.mark.parametrize("pad", [0, 1])
def test_conv2d_relu_symbolic_batch(pad):
    b = te.var("b")
    C, H, W_, O, K = 3, 6, 5, 10, 3
    X = te.placeholder((b, C, H, W_), "float32", "X")
    Wt = te.placeholder((O, C, K, K), "float32", "W")
    P = te.compute((b, C, H + 2 * pad, W_ + 2 * pad),
                   lambda n, c, h, w: te.if_then_else(
                       te.all(h >= pad, h < H + pad, w >= pad, w < W_ + pad),
                       X[n, c, h - pad, w - pad], 0.0), "pad")
    OH, OW = H + 2 * pad - K + 1, W_ + 2 * pad - K + 1
    rc = te.reduce_axis((0, C), "rc")
    rh = te.reduce_axis((0, K), "rh")
    rw = te.reduce_axis((0, K), "rw")
    Y = te.compute((b, O, OH, OW), lambda n, o, h, w: te.sum(
        P[n, rc, h + rh, w + rw] * Wt[o, rc, rh, rw], axis=[rc, rh, rw]), "conv")
    R = te.compute((b, O, OH, OW), lambda n, o, h, w: te.max(Y[n, o, h, w], 0.0), "relu")
    _check(te.create_prim_func([X, Wt, R]),
           lambda r, b: ([_f32(r, b, C, H, W_), _f32(r, O, C, K, K)], (b, O, OH, OW)),
           lambda x, w: np.maximum(_conv_ref(x, w, pad), 0), [{"b": 1}, {"b": 2}])


@pytest.mark.parametrize("m", [64, 35])
def test_matmul_symbolic_rows_small_and_tails(m):
    """Symbolic rows: the row-vector version (few rows) and the register tile with its tails."""
    n = te.var("n")
    A = te.placeholder((n, 33), "float32", "A")
    W = te.placeholder((33, m), "float32", "W")
    bias = te.placeholder((m,), "float32", "bias")
    k = te.reduce_axis((0, 33), "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    D = te.compute((n, m), lambda i, j: te.max(C[i, j] + bias[j], 0.0), "D")
    g = _check(te.create_prim_func([A, W, bias, D]),
               lambda r, n: ([_f32(r, n, 33), _f32(r, 33, m), _f32(r, m)], (n, m)),
               lambda a, w, b: np.maximum(a @ w + b, 0),
               [{"n": v} for v in (1, 2, 5, 6, 7, 13, 64)])
    # 64 columns split into two 32-wide strips: a row-vector version for n <= GEMV_MAX_ROWS
    assert (f"if n <= {ds.GEMV_MAX_ROWS}" in g.script()) == (m == 64)


def test_matmul_1024_symbolic_rows_versions():
    """The MLP's layer shape: both versions are register-tiled and correct at 1 and 7 rows."""
    n = te.var("n")
    A = te.placeholder((n, 1024), "float32", "A")
    W = te.placeholder((1024, 1024), "float32", "W")
    k = te.reduce_axis((0, 1024), "k")
    C = te.compute((n, 1024), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    g = ds.apply(te.create_prim_func([A, W, C]), TARGET)
    text = g.script()
    assert f"if n <= {ds.GEMV_MAX_ROWS}" in text and "T.where" in text
    mod = targets.build(g, "llvm")
    for rows in (1, 7):
        rng = np.random.default_rng(rows)
        a, w = _f32(rng, rows, 1024), _f32(rng, 1024, 1024)
        out = np.zeros((rows, 1024), "float32")
        mod["main"](a, w, out)
        np.testing.assert_allclose(out, a @ w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("width", [32, 128, 768])
@pytest.mark.parametrize("reduce", ["min", "max"])
def test_row_min_max_partial_vectors(width, reduce):
    """int8-dynamic's per-row ranges (``_schedule_row_min_max``): one or four vectors of
    partial results, the four first reduced to one a vector at a time; equal to numpy's over
    symbolic rows, with infinities, signed zeros and a NaN (which the row's result keeps)."""
    n = te.var("n")
    x = te.placeholder((n, width), "float32", "x")
    k = te.reduce_axis((0, width), "k")
    fn = te.min if reduce == "min" else te.max
    y = te.compute((n,), lambda i: fn(x[i, k], axis=k), "y")
    g = ds.apply(te.create_prim_func([x, y]), TARGET)
    script = g.script()
    assert script.count("_rf") >= 2 and "vectorized" in script
    if width >= 128:                            # four vectors, then one
        assert "y_rf_1" in script
    mod = targets.build(g, "llvm")
    ref = np.min if reduce == "min" else np.max
    for rows in (1, 3, 37):
        xv = np.random.default_rng(rows).standard_normal((rows, width)).astype("float32")
        xv[0, -1] = np.inf
        xv[-1, :] = np.where(np.arange(width) % 2, np.float32(0.0), np.float32(-0.0))
        if rows > 2:
            xv[1, width // 2] = np.nan
        out = np.zeros(rows, "float32")
        mod["main"](xv, out)
        np.testing.assert_array_equal(out, ref(xv, axis=1))
